r"""Distributed gradient descent: one allreduce per round.

.. math:: w_{t+1} = w_t - \text{lr}\cdot\frac1m\sum_i \nabla O_i(w_t)

With ``lr=None`` the step is ``lr_factor`` / L̄ (default 1.5 / L̄), where
L̄ = (1/m) Σ_i L_i and L_i ≈ λ_max(H_i) is each worker's own largest Hessian eigenvalue,
from ``power_iters`` local Hessian-vector products (Lanczos, `baselines.spectral`; no
communication).  Since H = (1/m) Σ_i H_i and λ_max is convex on symmetric matrices,

.. math:: L = \lambda_{\max}(H) \le \frac1m \sum_i \lambda_{\max}(H_i) = \bar L,

L_i rides in round 0's gradient allreduce, so the estimate costs no communication round
(the global λ_max by distributed Lanczos costs one allreduce per product: 20 rounds before
the first step).  Any step in (0, 2/L) decreases O every round and converges (the descent
lemma; Nesterov, *Introductory Lectures on Convex Optimization*, 2004, Theorem 2.1.14);
lr_factor ∈ (0, 2) with L̄ ≥ L keeps the step there, with room for a Lanczos L_i that
falls short of λ_max(H_i).  Why 1.5 and not the textbook 1/L: 1/L̄ pays the bound's
looseness L̄/L ≥ 1 in full, and on the logistic loss the curvature along the path falls
below the start's, where longer steps pay.  The factor was chosen on the defaults
benchmark (``make bench``, section ``defaults``), which measures it against the grid
lr = c / L, c ∈ {1, 1.5, 1.9}, with the exact L.  Records carry ``lr`` and, when
estimated, ``L_est`` = L̄.  Hessians are taken at the start (for the logistic loss, the
problem's curvature majorant, `dane.problems.glm`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dane import checks
from dane.algorithm import Algorithm
from dane.comm import Communicator
from dane.errors import ConfigError
from dane.problems import Problem

from .spectral import local_smoothness


@dataclass(frozen=True)
class GDConfig:
    lr: float | None = None
    lr_factor: float = 1.5  # lr=None: lr = lr_factor / L̄, in (0, 2)
    power_iters: int = 20
    seed: int = 0
    name: str = "gd"

    def __post_init__(self) -> None:
        if self.lr is not None:
            checks.positive("algorithm.lr", self.lr)
        if not 0 < checks.positive("algorithm.lr_factor", self.lr_factor) < 2:
            raise ConfigError(f"algorithm.lr_factor must be in (0, 2) (a step of 2/L or more can diverge), "
                              f"got {self.lr_factor}")
        checks.positive_int("algorithm.power_iters", self.power_iters)
        checks.integer("algorithm.seed", self.seed)

    def build(self, problem: Problem, comm: Communicator) -> "GD":
        return GD(problem, comm, lr=self.lr, lr_factor=self.lr_factor, power_iters=self.power_iters, seed=self.seed)


class GD(Algorithm):
    name = "gd"

    def __init__(self, problem: Problem, comm: Communicator, *, lr: float | None = None, lr_factor: float = 1.5,
                 power_iters: int = 20, seed: int = 0, w0: torch.Tensor | None = None):
        super().__init__(problem, comm, w0)
        self.lr, self.lr_factor = lr, lr_factor
        self.L_est: float | None = None  # L̄, known after round 0's allreduce when lr is None
        self.L_local = None if lr is not None else local_smoothness(problem, iters=power_iters, seed=seed)

    def step(self) -> dict[str, float]:
        local_grad, local_metrics = self.problem.evaluate(self.w)
        pending = self.lr is None  # round 0 of lr=None: L_i rides along with the gradient
        payload = [local_grad, local_metrics] + ([self.w.new_tensor([self.L_local])] if pending else [])
        g, metrics, *L_mean = self.comm.allreduce_mean(payload)  # g = mean ∇O_i(w_t) (and L̄ = mean L_i)
        if pending:
            self.L_est = float(L_mean[0])
            self.lr = self.lr_factor / self.L_est
        self.w = self.w - self.lr * g
        return {**self.metrics(g, metrics), **self.extra()}

    def evaluate(self) -> dict[str, float]:
        return {**super().evaluate(), **self.extra()}

    def extra(self) -> dict[str, float]:
        return ({"lr": self.lr} if self.lr is not None else {}) | ({"L_est": self.L_est} if self.L_est is not None else {})

    def state_dict(self) -> dict:
        return {**super().state_dict(), "lr": self.lr, "L_est": self.L_est}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.lr, self.L_est = state.get("lr", self.lr), state.get("L_est", self.L_est)
