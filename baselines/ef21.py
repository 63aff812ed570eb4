r"""EF21 as a method of its own (Richtárik, Sokolov & Fatkhullin 2021): GD on error-feedback gradient estimates.

Worker i keeps g_i, the server g = mean_i g_i (zero at the start).  Round k, one allreduce:

.. math::
    c_i = C(\nabla O_i(x_k) - g_i),\quad g_i \leftarrow g_i + c_i \quad\text{(worker: sends } c_i\text{)},\qquad
    g \leftarrow g + \tfrac1m\textstyle\sum_i c_i,\quad x_{k+1} = x_k - \gamma\, g \quad\text{(server)}

C = ``compressor``, contractive (‖C(x) − x‖² ≤ (1 − δ)‖x‖²): TopK (δ = K/d), or an unbiased one used as C/(ω + 1)
(δ = 1/(ω + 1)).  g_i starts at 0, so round 0 sends C(∇O_i(x_0)): the paper's g_i⁰ = C(∇O_i(x⁰)).

*The method and the option.*  This is distributed GD (`baselines.gd`) whose gradient message goes through the
package's EF21 option, ``comm.compress=C comm.error_feedback=true`` (`dane.compress.ErrorFeedback` in
`dane.comm.compression`): the same g_i, the same dense allreduce of the decoded estimates (whose mean is the
server's g to round-off), the same bit count.  So `EF21` is `baselines.gd.GD` with that counter installed by the
method itself, on the gradient (``compressor`` its own key; ``comm.compress`` refused, as it would compress twice),
and ``algorithm=ef21 algorithm.compressor=C algorithm.lr=γ`` gives the records of ``algorithm=gd algorithm.lr=γ
comm.compress=C comm.error_feedback=true`` (tests/test_compressed_methods.py).  What the method adds is its step rule:

- γ = ``lr`` null: 1/(L̄ + L̃ sqrt(β/θ)), θ = 1 − sqrt(1 − δ), β = (1 − δ)/(1 − sqrt(1 − δ))
  (`baselines.defaults.ef21_step`, their Theorem 1), L̄ = mean_i L_i ≥ L (GD's bound) and L̃ = sqrt(mean_i L_i²),
  from GD's local Lanczos and one allreduce before round 0 (`baselines.measure.smoothness_moments`), resolved by the
  config's ``build`` and listed in the summary's ``defaults``.  With ``none`` (δ = 1) it is 1/L̄.

Bits per worker a round: bits(C on d entries) up (TopK: K (64 + ⌈log₂ d⌉)), 64 d down; the logged metrics ride
along uncounted (`dane.comm.compression.METRICS`).
The logged ``grad_norm`` is ‖g‖, the estimate EF21 steps with.
"""
from __future__ import annotations

from dataclasses import dataclass

from dane.algorithm import AlgorithmConfig
from dane.comm import Communicator
from dane.comm.compression import MessageCompression
from dane.compress import make
from dane.errors import ConfigError
from dane.problems import Problem

from .defaults import Resolution, ef21_step
from .diana import CompressedKeys
from .gd import GD


class EF21(GD):
    name = "ef21"
    label = "EF21"
    elastic = False  # its g_i live on the workers: a reset would lose them
    compressed_messages = True  # GD's gradient through its own EF21 counter (module docstring)
    compressible = ()  # comm.compress is refused: the gradient is compressed by the method
    batchable = False  # the batched communicator runs no message compression: the per-worker path, as comm.compress

    def __init__(self, problem: Problem, comm: Communicator, *, compressor: str = "topk:0.1", lr: float,
                 seed: int = 0, defaults: tuple[dict, ...] = ()):
        compressor_ = make(compressor, "algorithm.compressor")
        # before GD's first allreduce: its "gradient" message goes through EF21 from round 0 on
        comm.use_compression(MessageCompression(compressor_, ("gradient",), error_feedback=True, seed=seed,
                                                rank=comm.rank))
        super().__init__(problem, comm, lr=lr, seed=seed)
        self.compressor, self.defaults = compressor_, tuple(defaults)


@dataclass(frozen=True)
class EF21Config(AlgorithmConfig, CompressedKeys):
    compressor: str = "topk:0.1"
    name: str = "ef21"
    algorithm = EF21

    def __post_init__(self) -> None:
        self.check_keys()
        if make(self.compressor).matrices:
            raise ConfigError(f"algorithm.compressor={self.compressor} compresses d×d matrices; EF21 sends vectors: "
                              f"topk:K, randk:K, natural, dither:S or none")

    def build(self, problem: Problem, comm: Communicator) -> EF21:
        """``lr`` null resolved (`baselines.defaults.ef21_step`) from δ of the compressor on d entries, L̄ and L̃."""
        resolution, lr = Resolution(), self.lr
        if lr is None:
            delta = self.compressor_built().delta(problem.dim)
            found = self.moments(problem, comm)
            lr = resolution.add("lr", ef21_step(found["mean"], found["rms"], delta), "ef21_step",
                                smoothness=found["mean"], smoothness_rms=found["rms"], delta=delta)
        return EF21(problem, comm, compressor=self.compressor, lr=lr, seed=self.seed, defaults=resolution.entries)
