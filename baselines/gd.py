r"""Distributed gradient descent: one allreduce per round.

.. math:: w_{t+1} = w_t - \text{lr}\cdot\frac1m\sum_i \nabla O_i(w_t)

With ``lr=None`` the step is

.. math:: \text{lr} = \min\Big(\frac{2}{\bar L + \underline\mu},\ \frac{\text{lr\_factor}}{\bar L}\Big),
    \qquad \bar L = \frac1m\sum_i \lambda_{\max}(H_i) \ge L,
    \quad \underline\mu = \max\Big(\frac1m\sum_i \lambda_{\min}(H_i),\ 0\Big) \le \mu,

L and μ the extreme eigenvalues of H = (1/m) Σ_i H_i (λ_max is convex and λ_min concave
on symmetric matrices).  Each worker takes its two extreme Ritz values from
``power_iters`` local Hessian-vector products (Lanczos, `baselines.spectral`; no
communication), and the pair rides in round 0's gradient allreduce: the estimate costs no
communication round (the global λ_max by distributed Lanczos costs one allreduce per
product, 20 rounds before the first step).  2/(L + μ) is the fixed step with the best
linear rate, (L − μ)/(L + μ), on a μ-strongly convex L-smooth function, and bounds
μ̲ ≤ μ, L̄ ≥ L would keep that guarantee with them in its place (Nesterov, *Introductory
Lectures on Convex Optimization*, 2004, Theorem 2.1.15).  Ritz values lie inside
[λ_min(H_i), λ_max(H_i)], so the estimates err the other way: a μ̲ above μ only shortens the
step, and an L_i short of λ_max(H_i) is why ``lr_factor`` / L̄ (``lr_factor`` ∈ (0, 2), 1.9 by
default) caps it, which also governs where μ̲ ≪ L̄ makes the first term near 2/L̄: any step
below 2/L decreases O every round (Theorem 2.1.14).  The textbook 1/L would pay the looseness L̄/L ≥ 1 in full, and
on the logistic loss, whose curvature along the path falls below the start's, longer
steps pay; ``make bench`` (section ``defaults``) measures the rule against the grid
lr = c / L, c ∈ {1, 1.5, 1.9}, with the exact L.  Records carry ``lr`` and, when
estimated, ``L_est`` = L̄ and ``mu_est`` = μ̲; the summary's ``defaults`` holds the resolved lr with
them (resolved in round 0, so the run's first lines cannot show it).  Hessians are taken at the start (for the
logistic loss, the problem's curvature majorant, `dane.problems.glm`, whose μ̲ only
shortens the step).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dane import checks
from dane.algorithm import Algorithm, AlgorithmConfig, Column
from dane.comm import Communicator
from dane.comm.compression import METRICS
from dane.errors import ConfigError
from dane.problems import Problem

from .defaults import LANCZOS_STEP_FACTOR, Resolution, gd_step
from .spectral_stacked import local_spectra


class GD(Algorithm):
    name = "gd"
    label = "GD"
    elastic = True  # its state is the iterate and the step size
    synchronous_because = ("distributed GD averages exact gradients of the same iterate (its asynchronous form is "
                           "algorithm=sync_sgd)")
    columns = (Column("L_est", "{:>8.4g}"),)
    compressible = ("gradient",)  # a compressed mean gradient is a (biased or unbiased) gradient step
    batchable = True  # its step reads the same on stacked tensors; the spectra are stacked by `local_spectra`
    stacked_needs = "gradients"  # gradients, and lr null's Lanczos (the majorant's Hessian products): any rows stack

    def __init__(self, problem: Problem, comm: Communicator, *, lr: float | None = None,
                 lr_factor: float = LANCZOS_STEP_FACTOR, power_iters: int = 20, seed: int = 0,
                 w0: torch.Tensor | None = None):
        super().__init__(problem, comm, w0)
        self.lr, self.lr_factor = lr, lr_factor
        self.L_est: float | None = None  # L̄, known after round 0's allreduce when lr is None
        self.mu_est: float | None = None  # μ̲, likewise
        self.spectrum = None if lr is not None else local_spectra(problem, iters=power_iters, seed=seed,
                                                                  key="algorithm.lr")  # (μ_i, L_i), stacked: (m, 2)
        self.defaults = () if lr is not None else None  # lr=None: known after round 0 (`resolved`)
        self.pending_defaults = {} if lr is not None else {"algorithm.lr": "gd_step"}

    def step(self) -> dict[str, float]:
        local_grad, local_metrics = self.problem.evaluate(self.w)
        pending = self.lr is None  # round 0 of lr=None: (μ_i, L_i) ride along with the gradient
        spectrum = [torch.as_tensor(self.spectrum, dtype=self.w.dtype)] if pending else []  # (2,), or (m, 2) stacked
        payload = [local_grad, local_metrics] + spectrum
        # g = mean ∇O_i(w_t) (and (μ̲, L̄)); the metrics only logged
        g, metrics, *spectrum = self.comm.allreduce_mean(payload, kinds=("gradient", METRICS))
        if pending:
            self.mu_est, self.L_est = max(float(spectrum[0][0]), 0.0), float(spectrum[0][1])
            self.lr = gd_step(self.L_est, self.mu_est, self.lr_factor)
            self.defaults = self.resolved()
        self.w = self.w - self.lr * g
        return {**self.metrics(g, metrics), **self.extra()}

    def evaluate(self) -> dict[str, float]:
        return {**super().evaluate(), **self.extra()}

    def resolved(self) -> tuple[dict, ...]:
        """The summary's ``defaults`` once round 0 resolved lr (module docstring)."""
        resolution = Resolution()
        resolution.add("lr", self.lr, "gd_step", L_bar=self.L_est, mu_low=self.mu_est, lr_factor=self.lr_factor)
        return tuple(resolution.entries)

    def extra(self) -> dict[str, float]:
        estimates = {"L_est": self.L_est, "mu_est": self.mu_est} if self.L_est is not None else {}
        return ({"lr": self.lr} if self.lr is not None else {}) | estimates

    def state_dict(self) -> dict:
        return {**super().state_dict(), "lr": self.lr, "L_est": self.L_est, "mu_est": self.mu_est}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.lr, self.L_est, self.mu_est = (state.get(k, getattr(self, k)) for k in ("lr", "L_est", "mu_est"))
        if self.L_est is not None:  # a resumed run's summary as the uninterrupted one's
            self.defaults = self.resolved()


@dataclass(frozen=True)
class GDConfig(AlgorithmConfig):
    lr: float | None = None
    lr_factor: float = LANCZOS_STEP_FACTOR  # lr=None: lr = min(2 / (L̄ + μ̲), lr_factor / L̄), lr_factor in (0, 2)
    power_iters: int = 20
    seed: int = 0
    name: str = "gd"
    algorithm = GD

    def __post_init__(self) -> None:
        if self.lr is not None:
            checks.positive("algorithm.lr", self.lr)
        if not 0 < checks.positive("algorithm.lr_factor", self.lr_factor) < 2:
            raise ConfigError(f"algorithm.lr_factor must be in (0, 2) (a step of 2/L or more can diverge), "
                              f"got {self.lr_factor}")
        checks.positive_int("algorithm.power_iters", self.power_iters)
        checks.seed("algorithm.seed", self.seed)

    def build(self, problem: Problem, comm: Communicator) -> "GD":
        return GD(problem, comm, lr=self.lr, lr_factor=self.lr_factor, power_iters=self.power_iters, seed=self.seed)
