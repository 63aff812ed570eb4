r"""MARINA: compressed gradient differences, a shared coin for full rounds (Gorbunov, Burlachenko, Li & Richtárik 2021).

The server steps with an estimate g_k of ∇O(x_k); every worker knows it.  Round 0 sends the full gradients,
g_0 = mean_i ∇O_i(x_0); round k ≥ 1, one allreduce, with c_k ~ Bernoulli(p) drawn alike on every worker:

.. math::
    g_k = \begin{cases} \tfrac1m\sum_i \nabla O_i(x_k) & c_k = 1 \text{ (each worker sends its gradient)}\\
        g_{k-1} + \tfrac1m\sum_i Q\big(\nabla O_i(x_k) - \nabla O_i(x_{k-1})\big) & c_k = 0\end{cases}
    \qquad x_{k+1} = x_k - \gamma\, g_k

(the paper's x^{k+1} = x^k − γg^k, then g^{k+1} from c_k, written one round on).  Q = ``compressor``, unbiased
with variance ω (RandK, natural, dithering, ``none``; TopK is refused, as in DIANA, `baselines.diana`).  With
p = 1 every round is full and MARINA is GD at step γ, bit for bit.  The coin draws from a generator seeded by
the run's seed alone (`COIN_STREAM`), so every rank (and the simulator's workers) flips the same coins; records
carry ``full_round`` (1 where c_k = 1 or k = 0).

*Defaults* (`baselines.defaults`, resolved by the config's ``build``, in the summary's ``defaults``):

- p = ``p`` null: ζ_Q/d (`baselines.defaults.marina_probability`), ζ_Q the compressor's nonzeros of a d-vector
  (K for RandK; d for a dense quantizer, where p = 1: set ``p`` to run its compressed rounds);
- γ = ``lr`` null: 1/(L̄ + L₊ sqrt((1 − p)ω/(pm))) (`baselines.defaults.marina_step`, their Theorem 2.1), L̄ = mean_i
  L_i ≥ L₋ (GD's bound, `baselines.gd`) and L₊ = sqrt(mean_i L_i²), from the local Lanczos and one allreduce
  before round 0 (`baselines.measure.smoothness_moments`).

*Messages and bits* as DIANA's: MARINA draws Q itself (its own compressor, ``comm.compress`` refused) and the
communicator counts the message (`dane.comm.compression`, ``precompressed``): a compressed round bits(Q) + 64 per
metric per worker, a full round 64 (d + metrics); the downlink, g_k, dense.  The logged ``grad_norm`` is ‖g_k‖.
It runs on the batched simulator as DIANA does.

Departure: the theorem is for non-convex f (MARINA's main setting); the package runs it on every problem with
Hessian-vector products for the step rule, or with a given ``lr`` on any.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dane import checks
from dane.algorithm import Algorithm, AlgorithmConfig, Column
from dane.comm import Communicator
from dane.compress import Compressor, Sparsifier, make
from dane.errors import ConfigError
from dane.problems import Problem

from .defaults import Resolution, marina_probability, marina_step
from .diana import SENT, CompressedKeys, compress_each, own_compression, unbiased_compressor, worker_streams

COIN_STREAM = 13  # seed stream of the shared coin (`dane.comm.compression` uses 11 for the workers' draws)


def coin_generator(seed: int) -> np.random.Generator:
    """The coin's generator: the run's seed alone, alike on every rank."""
    return np.random.default_rng(np.random.SeedSequence([seed, COIN_STREAM]))


def density(compressor: Compressor, dim: int) -> int:
    """ζ_Q: the nonzeros of Q(x) for a d-vector, at most (K for a sparsifier, else d)."""
    return compressor.k_of(dim) if isinstance(compressor, Sparsifier) else dim


class MARINA(Algorithm):
    name = "marina"
    label = "MARINA"
    compressed_messages = True  # its own Q, its bits counted in the communicator (module docstring)
    synchronous_because = "MARINA's server averages every worker's message at the same iterate"
    columns = (Column("full_round", "{:>5.0f}"),)
    batchable = True  # its round reads the same on stacked tensors, each worker's Q from its own stream

    def __init__(self, problem: Problem, comm: Communicator, *, compressor: str = "none", lr: float, p: float,
                 seed: int = 0, defaults: tuple[dict, ...] = ()):
        super().__init__(problem, comm)
        self.compressor = unbiased_compressor(compressor, self.name)
        self.lr, self.p, self.defaults = lr, p, tuple(defaults)
        self.coin = coin_generator(seed)
        self.counter = own_compression(comm, self.compressor, seed=seed)
        self.generators = worker_streams(comm, self.counter, seed)
        self.g: torch.Tensor | None = None           # g_{k-1}, every worker's copy
        self.last_grad: torch.Tensor | None = None   # ∇O_i(x_{k-1})

    def step(self) -> dict[str, float]:
        grad, metrics = self.problem.evaluate(self.w)
        full = self.g is None or bool(self.coin.random() < self.p)   # round 0, or c_k = 1
        if full:
            sent, kinds = grad, (None,)                               # the whole gradient, counted dense
        else:
            sent, kinds = compress_each(self.compressor, grad - self.last_grad, self.generators), (SENT,)
        self.last_grad = grad
        mean, metrics = self.comm.allreduce_mean([sent, metrics], kinds=kinds)
        self.g = mean if full else self.g + mean
        self.w = self.w - self.lr * self.g
        return {**self.metrics(self.g, metrics), "lr": self.lr, "full_round": float(full)}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "g": self.g, "last_grad": self.last_grad,
                "coin": self.coin.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.g, self.last_grad = state["g"], state["last_grad"]
        self.coin.bit_generator.state = state["coin"]


@dataclass(frozen=True)
class MARINAConfig(AlgorithmConfig, CompressedKeys):
    p: float | None = None
    name: str = "marina"
    algorithm = MARINA

    def __post_init__(self) -> None:
        self.check_keys()
        unbiased_compressor(self.compressor, self.name)
        if self.p is not None and not 0 < checks.positive("algorithm.p", self.p) <= 1:
            raise ConfigError(f"algorithm.p must be in (0, 1] (the probability of a full round), got {self.p}")

    def build(self, problem: Problem, comm: Communicator) -> MARINA:
        """The nulls resolved (`baselines.defaults`): p from the compressor's density, γ from L̄, L₊, ω, p and m."""
        resolution, compressor, d = Resolution(), make(self.compressor), problem.dim
        omega = compressor.omega(d)
        p = self.p
        if p is None:
            zeta = density(compressor, d)
            p = resolution.add("p", marina_probability(zeta, d), "marina_probability", density=zeta, dim=d)
        lr = self.lr
        if lr is None:
            found = self.moments(problem, comm)
            lr = resolution.add("lr", marina_step(found["mean"], found["rms"], omega, p, comm.size), "marina_step",
                                smoothness=found["mean"], smoothness_rms=found["rms"], omega=omega, p=p,
                                workers=comm.size)
        return MARINA(problem, comm, compressor=self.compressor, lr=lr, p=p, seed=self.seed,
                      defaults=resolution.entries)
