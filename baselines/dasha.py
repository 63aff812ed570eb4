r"""DASHA: compressed gradient differences with momentum on the shifts (Tyurin & Richtárik 2023, "DASHA: Distributed
nonconvex optimization with communication compression and optimal oracle complexity", Algorithm 1, the gradient
setting).

Worker i keeps its estimate g_i and the gradient it last saw h_i, the server g = mean_i g_i.  Round 0 sends the full
gradients: g_i = h_i = ∇O_i(x_0), g_0 = mean_i ∇O_i(x_0) (the paper's initialization of its theorem).  Round k ≥ 1,
one allreduce, every message compressed:

.. math::
    m_i = Q\big(\nabla O_i(x_k) - h_i - a\,(g_i - h_i)\big),\quad g_i \leftarrow g_i + m_i,\quad
        h_i \leftarrow \nabla O_i(x_k) \quad\text{(worker: sends } m_i\text{)}\\
    g_k = g_{k-1} + \tfrac1m\textstyle\sum_i m_i \qquad x_{k+1} = x_k - \gamma\, g_k \quad\text{(server)}

(the paper's x^{t+1} = x^t − γg^t, then h_i^{t+1} = ∇f_i(x^{t+1}) and g^{t+1}, written one round on).  Q =
``compressor``, unbiased with variance ω (RandK, natural, dithering, ``none``; TopK is refused, as in DIANA,
`baselines.diana`).  With ``none`` (ω = 0, a = 1) m_i = ∇O_i(x_k) − g_i and g_k is the mean gradient: GD at step
γ, to round-off.  Unlike MARINA (`baselines.marina`) no round after the first sends a full gradient.

*Defaults* (`baselines.defaults`, resolved by the config's ``build``, in the summary's ``defaults``):

- a = ``momentum`` null: 1/(2ω + 1) (`baselines.defaults.dasha_momentum`, their Theorem 6.1);
- γ = ``lr`` null: 1/(L̄ + sqrt(16ω(2ω + 1)/m) L̂) (`baselines.defaults.dasha_step`, Theorem 6.1), L̄ = mean_i L_i ≥ L
  (GD's bound) and L̂ = sqrt(mean_i L_i²), from the local Lanczos and one allreduce before round 0
  (`baselines.measure.smoothness_moments`).

*Messages and bits* as MARINA's: DASHA draws Q itself (its own compressor, ``comm.compress`` refused) and the
communicator counts the message (`dane.comm.compression`, ``precompressed``): round 0 64 d per worker, every later
round bits(Q); the downlink, g_k, dense, 64 d (the logged metrics ride along uncounted:
`dane.comm.compression.METRICS`).  The logged ``grad_norm`` is ‖g_k‖.  It runs on
the batched simulator as DIANA does.

Departure: the theorem is for non-convex f (DASHA's setting); the package runs it on every problem with
Hessian-vector products for the step rule, or with a given ``lr`` on any.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dane import checks
from dane.algorithm import Algorithm, AlgorithmConfig
from dane.comm import Communicator
from dane.comm.compression import METRICS
from dane.problems import Problem

from .defaults import Resolution, dasha_momentum, dasha_step
from .diana import (SENT, CompressedKeys, compress_each, load_streams, own_compression, streams_state,
                    unbiased_compressor, worker_streams)


class DASHA(Algorithm):
    name = "dasha"
    label = "DASHA"
    compressed_messages = True  # its own Q, its bits counted in the communicator (module docstring)
    synchronous_because = "DASHA's server averages every worker's compressed message at the same iterate"
    batchable = True  # its round reads the same on stacked tensors, each worker's Q from its own stream
    stacked_needs = "gradients"  # gradients at the iterate (and the defaults' Hessian products): any rows stack

    def __init__(self, problem: Problem, comm: Communicator, *, compressor: str = "none", lr: float,
                 momentum: float, seed: int = 0, defaults: tuple[dict, ...] = ()):
        super().__init__(problem, comm)
        self.compressor = unbiased_compressor(compressor, self.name)
        self.lr, self.momentum, self.defaults = lr, momentum, tuple(defaults)
        self.counter = own_compression(comm, self.compressor, seed=seed)
        self.generators = worker_streams(comm, self.counter, seed)
        self.g: torch.Tensor | None = None    # the server's g_{k-1}, every worker's copy
        self.g_i: torch.Tensor | None = None  # this worker's estimate
        self.h_i: torch.Tensor | None = None  # ∇O_i(x_{k-1})

    def step(self) -> dict[str, float]:
        grad, metrics = self.problem.evaluate(self.w)
        if self.g is None:                                           # round 0: g_i = h_i = ∇O_i(x_0), sent whole
            self.g_i = grad
            mean, metrics = self.comm.allreduce_mean([grad, metrics], kinds=(None, METRICS))
            self.g = mean
        else:
            sent = compress_each(self.compressor, grad - self.h_i - self.momentum * (self.g_i - self.h_i),
                                 self.generators)
            self.g_i = self.g_i + sent
            mean, metrics = self.comm.allreduce_mean([sent, metrics], kinds=(SENT, METRICS))
            self.g = self.g + mean
        self.h_i = grad
        self.w = self.w - self.lr * self.g
        return {**self.metrics(self.g, metrics), "lr": self.lr}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "g": self.g, "g_i": self.g_i, "h_i": self.h_i,
                **streams_state(self.comm, self.generators)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.g, self.g_i, self.h_i = state["g"], state["g_i"], state["h_i"]
        load_streams(self.generators, state)


@dataclass(frozen=True)
class DASHAConfig(AlgorithmConfig, CompressedKeys):
    momentum: float | None = None
    name: str = "dasha"
    algorithm = DASHA

    def __post_init__(self) -> None:
        self.check_keys()
        unbiased_compressor(self.compressor, self.name)
        if self.momentum is not None:
            checks.fraction("algorithm.momentum", self.momentum, "DASHA's a")

    def build(self, problem: Problem, comm: Communicator) -> DASHA:
        """The nulls resolved (`baselines.defaults`): a from ω, γ from L̄, L̂, ω and m."""
        resolution, omega = Resolution(), self.compressor_built().omega(problem.dim)
        momentum = self.momentum
        if momentum is None:
            momentum = resolution.add("momentum", dasha_momentum(omega), "dasha_momentum", omega=omega)
        lr = self.lr
        if lr is None:
            found = self.moments(problem, comm)
            lr = resolution.add("lr", dasha_step(found["mean"], found["rms"], omega, comm.size), "dasha_step",
                                smoothness=found["mean"], smoothness_rms=found["rms"], omega=omega,
                                workers=comm.size)
        return DASHA(problem, comm, compressor=self.compressor, lr=lr, momentum=momentum, seed=self.seed,
                     defaults=resolution.entries)
