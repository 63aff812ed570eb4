r"""EF21-P with an EF21 uplink, bidirectional EF21 (Gruntkowska, Tyurin & Richtárik 2023; Richtárik, Sokolov &
Fatkhullin 2021): error feedback on the workers' gradients up and on the server's model down.

The server keeps the model x; the workers keep w, the model as the server's compressed messages built it, and
compute their gradients there; worker i keeps g_i, the server g = mean_i g_i (zero at the start), x_0 = w_0.
Round k, one allreduce:

.. math::
    c_i &= C(\nabla O_i(w_k) - g_i),\quad g_i \leftarrow g_i + c_i &&\text{(worker: sends } c_i\text{)}\\
    g &\leftarrow g + \tfrac1m\textstyle\sum_i c_i,\quad x_{k+1} = x_k - \gamma\, g,\quad
        s_k = C_P(x_{k+1} - w_k) &&\text{(server: sends } s_k\text{)}\\
    w_{k+1} &= w_k + s_k &&\text{(every worker, and the server)}

C = ``compressor`` and C_P = ``compressor_down``, contractive (E‖C(x) − x‖² ≤ (1 − δ)‖x‖²: TopK, δ = K/d), or unbiased
and used as C/(ω + 1) (δ = 1/(ω + 1)), as in `baselines.ef21`; δ_P is C_P's, the paper's α.  With ``none`` for both,
g_i = ∇O_i(w_k) and w = x: the method is GD at step γ (to round-off); with ``compressor_down=none`` it is
`baselines.ef21` (w = x).

*The paper's method and this one.*  The downlink is the paper's EF21-P (Gruntkowska, Tyurin & Richtárik 2023, ICML:
their (5) and lines 11-16 of their Algorithm 1): x_{t+1} = x_t − γg^t, w_{t+1} = w_t + C_P(x_{t+1} − w_t), w_0 = x_0,
the workers' gradients taken at w_t.  With an exact uplink (``compressor=none``) this module is their EF21-P (5) on
f = mean_i O_i, exactly.  The uplink is where it departs: the paper pairs EF21-P with DIANA (their Algorithm 1:
m_i = C_i^D(∇f_i(w_t) − h_i) with C_i^D unbiased, h_i ← h_i + βm_i, and the server steps with g^t = h^t + mean_i m_i)
and with DCGD (their Algorithm 2: β = 0, h = 0); this module uses EF21's (`dane.compress.ErrorFeedback`): c_i =
C(∇O_i(w_k) − g_i) with C contractive, and the server steps with g = mean_i g_i after the update.  For an unbiased Q
used as C = Q/(ω + 1) the g_i are DIANA's h_i at β = 1/(ω + 1), but the step is taken with the shift h^{t+1} =
h^t + mean_i m_i/(ω + 1), not with the unbiased h^t + mean_i m_i.  No theorem of the paper covers this pairing.

*Messages.*  The uplink goes through the package's EF21 counter (as `baselines.ef21`: ``comm.compress=C
comm.error_feedback=true`` installed by the method), the downlink is drawn here from the server's generator of that
counter (`dane.comm.compression.downlink_seed`: the run's seed alone, so every worker computes the same s_k from
the same g).  Bits per worker a round: up bits(C on d), down bits(C_P on d) (TopK: K (64 + ⌈log₂ d⌉)); the logged
metrics ride along uncounted (`dane.comm.compression.METRICS`, in ``bytes_sent``); the α-β cost model charges each
direction at its size (`dane.comm.cost`).

*Default.*  γ = ``lr`` null: `baselines.defaults.ef21p_step`, min(1/(L̄ + L̃ sqrt(β/θ)), δ_P/(16 L̄)) with
θ = 1 − sqrt(1 − δ), β = (1 − δ)/θ: EF21's Theorem 1 step for the uplink and the paper's Theorem D.1 step α/(16L)
for EF21-P (`baselines.defaults.ef21p_primal_step`); EF21's alone at δ_P = 1.  L̄ = mean_i L_i ≥ L and
L̃ = sqrt(mean_i L_i²) (`baselines.measure.smoothness_moments`, one allreduce before round 0); the value and its
statistics are listed in the summary's ``defaults``.  At an exact uplink it is Theorem D.1's step, at an exact
downlink EF21's; the minimum where both directions are compressed is this package's rule (the paper's Theorem 5.1,
γ ≤ min(n/(160ωL_max), α/(100L), 1/((ω + 1)μ)) with β = 1/(ω + 1), is for its DIANA uplink).

Departures: the uplink (above); g_i start at 0, so round 0 sends C(∇O_i(w_0)) (EF21's g_i⁰); the records' objective
and ``grad_norm`` are those at w_k, where the workers compute (``grad_norm`` is ‖g‖, the estimate the server steps
with), where the paper's theorems measure x_T; the last iterate (``iterate.pt``) is w.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dane.algorithm import AlgorithmConfig
from dane.comm import Communicator
from dane.comm.compression import METRICS, MessageCompression
from dane.compress import ErrorFeedback, make
from dane.errors import ConfigError
from dane.problems import Problem

from .defaults import Resolution, ef21p_step
from .diana import CompressedKeys
from .gd import GD


class EF21P(GD):
    name = "ef21p"
    label = "EF21-P"
    elastic = False  # its g_i and w live on the workers: a reset would lose them
    compressed_messages = True  # both directions compressed by the method (module docstring)
    compressible = ()  # comm.compress is refused
    batchable = False  # the per-worker path, as EF21

    def __init__(self, problem: Problem, comm: Communicator, *, compressor: str = "topk:0.1",
                 compressor_down: str = "topk:0.1", lr: float, seed: int = 0, defaults: tuple[dict, ...] = ()):
        self.compressor = make(compressor, "algorithm.compressor")
        self.compressor_down = make(compressor_down, "algorithm.compressor_down")
        self.counter = MessageCompression(self.compressor, ("gradient",), error_feedback=True, seed=seed,
                                          rank=comm.rank, downlink=self.compressor_down, own_downlink=True)
        comm.use_compression(self.counter)  # before GD's first allreduce
        super().__init__(problem, comm, lr=lr, seed=seed)
        self.defaults = tuple(defaults)
        self.x = self.w.clone()                          # the server's model, x_0 = w_0
        self.primal = ErrorFeedback(self.compressor_down)  # w ← w + C_P(x − w): EF21 on the model
        self.primal.g = self.w.clone()

    def step(self) -> dict[str, float]:
        local_grad, local_metrics = self.problem.evaluate(self.w)                     # at w_k
        g, metrics = self.comm.allreduce_mean([local_grad, local_metrics], kinds=("gradient", METRICS))  # g = mean g_i
        self.x = self.x - self.lr * g                                                  # server: x_{k+1}
        self.w = self.primal(self.x, self.counter.server_generator).clone()            # w_{k+1} = w_k + C_P(x − w)
        return {**self.metrics(g, metrics), "lr": self.lr}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "x": self.x.clone(), "primal": self.primal.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.x = state["x"].clone()
        self.primal.load_state_dict(state["primal"])


@dataclass(frozen=True)
class EF21PConfig(AlgorithmConfig, CompressedKeys):
    compressor: str = "topk:0.1"
    compressor_down: str = "topk:0.1"
    name: str = "ef21p"
    algorithm = EF21P

    def __post_init__(self) -> None:
        self.check_keys()
        for key, spec in (("compressor", self.compressor), ("compressor_down", self.compressor_down)):
            compressor = make(spec, f"algorithm.{key}")
            if compressor.matrices:
                raise ConfigError(f"algorithm.{key}={spec} compresses d×d matrices; EF21-P sends vectors: "
                                  f"topk:K, randk:K, natural, dither:S or none")

    def build(self, problem: Problem, comm: Communicator) -> EF21P:
        """``lr`` null resolved (`baselines.defaults.ef21p_step`: EF21's step at δ, the paper's α/(16L) at δ_P) from δ
        and δ_P on d entries, L̄ and L̃."""
        resolution, lr = Resolution(), self.lr
        if lr is None:
            delta = self.compressor_built().delta(problem.dim)
            delta_down = make(self.compressor_down, "algorithm.compressor_down").delta(problem.dim)
            found = self.moments(problem, comm)
            lr = resolution.add("lr", ef21p_step(found["mean"], found["rms"], delta, delta_down), "ef21p_step",
                                smoothness=found["mean"], smoothness_rms=found["rms"], delta=delta,
                                delta_down=delta_down)
        return EF21P(problem, comm, compressor=self.compressor, compressor_down=self.compressor_down, lr=lr,
                     seed=self.seed, defaults=resolution.entries)
