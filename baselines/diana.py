r"""DIANA: gradient descent on compressed gradient differences (Mishchenko, Gorbunov, Takáč & Richtárik 2019).

Worker i keeps a shift h_i, the server h = mean_i h_i (all zero at the start).  Round k, one allreduce:

.. math::
    \Delta_i &= Q(\nabla O_i(x_k) - h_i), \qquad h_i \leftarrow h_i + \alpha\,\Delta_i
        &&\text{(worker: sends } \Delta_i\text{)}\\
    \hat g &= h + \tfrac1m\textstyle\sum_i \Delta_i, \qquad h \leftarrow h + \alpha\,\tfrac1m\textstyle\sum_i\Delta_i,
        \qquad x_{k+1} = x_k - \gamma\,\hat g &&\text{(server)}

Q = ``compressor`` (`dane.compress.make`), unbiased with variance ω (E‖Q(x) − x‖² ≤ ω‖x‖²): RandK, natural,
dithering, or ``none`` (ω = 0, where ĝ is the mean gradient and DIANA is GD at step γ, to round-off).  TopK and
rank-R are biased, for which the theory does not hold: refused (algorithm=ef21 takes them).

*Defaults* (nulls resolved by the config's ``build`` before the class exists, `baselines.defaults`, listed in the
run's first lines and the summary's ``defaults``):

- α = ``alpha`` null: 1/(ω + 1) (`baselines.defaults.diana_shift_step`); a larger α is refused;
- γ = ``lr`` null: min(α/(2μ̲), 2/((L + μ̲)(1 + 6ω/m))) (`baselines.defaults.diana_step`, Horváth et al. 2019),
  L = max_i L_i, μ̲ = `baselines.defaults.strong_convexity_bound` (max(ℓ2 weight, mean_i λ_min(H_i)) on a quadratic
  whose Lanczos ran d products: ``power_iters`` ≥ d, or d ≤ 2000, `baselines.defaults.lanczos_iters`; else the ℓ2
  weight), from GD's local Lanczos (`baselines.gd`) and one allreduce
  before round 0 (`baselines.measure.smoothness_moments`, counted in round 0's ``comm_rounds`` and ``bytes_sent``;
  ``uplink_bits`` and ``downlink_bits`` count the method's rounds, from round 0 on).

*Messages and bits.*  DIANA owns its compressor (``compressed_messages``), not ``comm.compress``, which it refuses:
each worker draws Q itself, because h_i ← h_i + αΔ_i needs the Δ_i the server decodes, and sends the decoded Δ_i
through the backend's dense allreduce (the iterates of a server that decodes each worker's message and averages,
identical on every backend).  The communicator counts it as ``comm.compress`` counts a compressed message
(`dane.comm.compression.MessageCompression` with ``precompressed=True``: counted at `Compressor.bits`, not
compressed again): per worker a round, ``uplink_bits`` += bits(Q on d entries) (RandK: 64 K, its indices drawn
from the worker's seeded stream, which the server knows; natural: 12 d), ``downlink_bits`` += 64 d (the server's
ĝ goes down dense): the paper's Δ_i and ĝ alone.  The logged metrics ride the same allreduce, in ``bytes_sent`` and
not in the bits (`dane.comm.compression.METRICS`: the run's measurement, not DIANA's message).  Q draws from the
worker's generator of that counter (`dane.comm.compression.compression_seed`: the run's seed and the rank),
checkpointed with the algorithm.
The logged ``grad_norm`` is ‖ĝ‖, the estimate DIANA steps with (as under ``comm.compress``).  On the batched
simulator (``sim.batched``, `dane.comm.batched`) the round runs on the stacked rows, each worker's Q drawn from a
generator seeded as that worker's (`worker_streams`, each checkpointed: `streams_state`), and the communicator
counts rank 0's message: the per-worker path's records to round-off (tests/test_compressed_methods.py).

Departures: none in the round; the step rule's L is a Lanczos estimate of max_i λ_max(H_i) at w_0 (for the
logistic loss, at its curvature majorant), μ̲ a lower bound of μ.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dane import checks
from dane.algorithm import Algorithm, AlgorithmConfig
from dane.comm import Communicator
from dane.comm.batched import stacked
from dane.comm.compression import METRICS, MessageCompression, compression_seed
from dane.compress import Compressor, make
from dane.errors import ConfigError
from dane.problems import Problem

from .defaults import (Resolution, diana_shift_step, diana_step, lanczos_is_exact, lanczos_iters,
                       strong_convexity_bound)
from .measure import smoothness_moments

#: the kind of the message a method compresses itself (`dane.comm.compression`, ``precompressed``)
SENT = "compressed"


def own_compression(comm: Communicator, compressor: Compressor, *, seed: int, precompressed: bool = True,
                    error_feedback: bool = False) -> MessageCompression:
    """Install on ``comm`` the counter of the messages of kind `SENT` a method compresses itself (DIANA, MARINA) or
    has compressed with error feedback (EF21), and return it; its generator is the worker's stream of draws."""
    counter = MessageCompression(compressor, (SENT,), error_feedback=error_feedback, seed=seed, rank=comm.rank,
                                 precompressed=precompressed)
    comm.use_compression(counter)
    return counter


def worker_streams(comm: Communicator, counter: MessageCompression, seed: int) -> list[torch.Generator]:
    """The compression generators of the workers ``comm`` holds: the counter's own (this worker's, checkpointed with
    it), or on the batched simulator one per worker, seeded as that worker's would be (`dane.comm.batched`)."""
    if not stacked(comm):
        return [counter.generator]
    return [torch.Generator().manual_seed(compression_seed(seed, rank)) for rank in range(comm.size)]


def streams_state(comm: Communicator, generators: list[torch.Generator]) -> dict:
    """The checkpoint entry of `worker_streams`'s generators: on the batched simulator each worker's state (what the
    resumed run draws next), on a worker's own path none (its stream is the counter's, in `Algorithm.state_dict`)."""
    return {"streams": [generator.get_state() for generator in generators]} if stacked(comm) else {}


def load_streams(generators: list[torch.Generator], state: dict) -> None:
    """Set ``generators`` to the states `streams_state` saved in ``state`` (none saved: none set)."""
    for generator, saved in zip(generators, state["streams"], strict=True) if "streams" in state else ():
        generator.set_state(saved)


def compress_each(compressor: Compressor, x: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
    """Q of this worker's message, or of each worker's row of a stacked one, each from that worker's generator."""
    if x.dim() == 1:
        return compressor(x, generators[0])
    return torch.stack([compressor(row, generator) for row, generator in zip(x, generators)])


def unbiased_compressor(spec: str, method: str) -> Compressor:
    """``spec`` built (`dane.compress.make`), refused in one line unless it is an unbiased compressor of vectors."""
    compressor = make(spec, "algorithm.compressor")
    if compressor.matrices or not compressor.unbiased:
        raise ConfigError(f"algorithm={method} needs an unbiased compressor of vectors (randk:K, natural, dither:S, "
                          f"none), got algorithm.compressor={spec}; a biased one (topk:K) is algorithm=ef21's")
    return compressor


class DIANA(Algorithm):
    name = "diana"
    label = "DIANA"
    compressed_messages = True  # its own Q, its bits counted in the communicator (module docstring)
    synchronous_because = "DIANA's server averages every worker's compressed difference at the same iterate"
    batchable = True  # its round reads the same on stacked tensors, each worker's Q from its own stream
    stacked_needs = "gradients"  # gradients at the iterate (and the defaults' Hessian products): any rows stack

    def __init__(self, problem: Problem, comm: Communicator, *, compressor: str = "none", lr: float, alpha: float,
                 seed: int = 0, defaults: tuple[dict, ...] = ()):
        super().__init__(problem, comm)
        self.compressor = unbiased_compressor(compressor, self.name)
        self.lr, self.alpha, self.defaults = lr, alpha, tuple(defaults)
        self.h_i = torch.zeros_like(self.w)  # this worker's shift
        self.h = torch.zeros_like(self.w)    # the server's, mean_i h_i
        self.counter = own_compression(comm, self.compressor, seed=seed)
        self.generators = worker_streams(comm, self.counter, seed)

    def step(self) -> dict[str, float]:
        grad, metrics = self.problem.evaluate(self.w)
        delta = compress_each(self.compressor, grad - self.h_i, self.generators)  # Δ_i = Q(∇O_i(x) − h_i)
        self.h_i = self.h_i + self.alpha * delta
        mean_delta, metrics = self.comm.allreduce_mean([delta, metrics], kinds=(SENT, METRICS))
        g = self.h + mean_delta                                                    # ĝ = h + mean Δ_i
        self.h = self.h + self.alpha * mean_delta
        self.w = self.w - self.lr * g
        return {**self.metrics(g, metrics), "lr": self.lr}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "h_i": self.h_i.clone(), "h": self.h.clone(),
                **streams_state(self.comm, self.generators)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.h_i, self.h = state["h_i"].clone(), state["h"].clone()
        load_streams(self.generators, state)


@dataclass(frozen=True)
class CompressedKeys:
    """The ``algorithm.*`` keys the compressed first-order methods share (DIANA, MARINA, EF21)."""

    compressor: str = "randk:0.1"
    lr: float | None = None
    power_iters: int = 20
    seed: int = 0

    def compressor_built(self) -> Compressor:
        """The compressor ``algorithm.compressor`` names, a bad spec refused in one line naming that key
        (`dane.compress.make`)."""
        return make(self.compressor, "algorithm.compressor")

    def check_keys(self) -> None:
        self.compressor_built()
        if self.lr is not None:
            checks.positive("algorithm.lr", self.lr)
        checks.positive_int("algorithm.power_iters", self.power_iters)
        checks.seed("algorithm.seed", self.seed)

    def moments(self, problem: Problem, comm: Communicator) -> dict[str, float]:
        """`baselines.measure.smoothness_moments` (one allreduce before round 0), with μ̲ (`strong_convexity_bound`)."""
        iters = lanczos_iters(problem, self.power_iters)
        found = smoothness_moments(problem, comm, iters=iters, seed=self.seed)
        l2 = float(problem.strong_convexity or 0.0)
        exact = lanczos_is_exact(problem, iters)
        mu_low = strong_convexity_bound(l2, found["mean_lowest"], exact=exact)
        return {**found, "mu_low": max(0.0, mu_low), "lanczos_exact": exact}


@dataclass(frozen=True)
class DIANAConfig(AlgorithmConfig, CompressedKeys):
    alpha: float | None = None
    name: str = "diana"
    algorithm = DIANA

    def __post_init__(self) -> None:
        self.check_keys()
        unbiased_compressor(self.compressor, self.name)
        if self.alpha is not None:
            checks.positive("algorithm.alpha", self.alpha)

    def build(self, problem: Problem, comm: Communicator) -> DIANA:
        """The nulls resolved (`baselines.defaults`): α from ω, γ from max_i L_i, μ̲, ω and m."""
        resolution, omega = Resolution(), self.compressor_built().omega(problem.dim)
        bound = diana_shift_step(omega)
        if self.alpha is not None and self.alpha > bound * (1 + 1e-12):
            raise ConfigError(f"algorithm.alpha must be <= 1/(omega + 1) = {bound:.4g} for {self.compressor} on "
                              f"d = {problem.dim} (DIANA's shift step), got {self.alpha}; leave it null for that bound")
        alpha = self.alpha if self.alpha is not None else resolution.add("alpha", bound, "diana_shift_step",
                                                                         omega=omega)
        lr = self.lr
        if lr is None:
            found = self.moments(problem, comm)
            lr = resolution.add("lr", diana_step(found["max"], found["mu_low"], omega, comm.size, alpha), "diana_step",
                                smoothness=found["max"], mu_low=found["mu_low"], lanczos_exact=found["lanczos_exact"],
                                omega=omega, workers=comm.size, alpha=alpha)
        return DIANA(problem, comm, compressor=self.compressor, lr=lr, alpha=alpha, seed=self.seed,
                     defaults=resolution.entries)
