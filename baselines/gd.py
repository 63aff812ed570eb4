r"""Distributed gradient descent: one allreduce per round.

.. math:: w_{t+1} = w_t - \text{lr}\cdot\frac1m\sum_i \nabla O_i(w_t)

With ``lr=None`` the step is 1/L_est, where L_est estimates λ_max of the global Hessian
from ``power_iters`` distributed Hessian-vector products (one allreduce each, done once
when the algorithm is built and counted in ``bytes_sent`` and ``comm_rounds`` of round 0);
see `baselines.spectral`.  Records carry ``lr`` and, when estimated, ``L_est``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dane import checks
from dane.algorithm import Algorithm
from dane.comm import Communicator
from dane.problems import Problem

from .spectral import global_smoothness


@dataclass(frozen=True)
class GDConfig:
    lr: float | None = None
    power_iters: int = 20
    seed: int = 0
    name: str = "gd"

    def __post_init__(self) -> None:
        if self.lr is not None:
            checks.positive("algorithm.lr", self.lr)
        checks.positive_int("algorithm.power_iters", self.power_iters)
        checks.integer("algorithm.seed", self.seed)

    def build(self, problem: Problem, comm: Communicator) -> "GD":
        return GD(problem, comm, lr=self.lr, power_iters=self.power_iters, seed=self.seed)


class GD(Algorithm):
    name = "gd"

    def __init__(self, problem: Problem, comm: Communicator, *, lr: float | None = None, power_iters: int = 20,
                 seed: int = 0, w0: torch.Tensor | None = None):
        super().__init__(problem, comm, w0)
        self.L_est = None if lr is not None else global_smoothness(problem, comm, iters=power_iters, seed=seed)
        self.lr = lr if lr is not None else 1.0 / self.L_est

    def step(self) -> dict[str, float]:
        local_grad, local_metrics = self.problem.evaluate(self.w)
        g, metrics = self.comm.allreduce_mean([local_grad, local_metrics])  # g = mean ∇O_i(w_t)
        self.w = self.w - self.lr * g
        return {**self.metrics(g, metrics), **self.extra()}

    def evaluate(self) -> dict[str, float]:
        return {**super().evaluate(), **self.extra()}

    def extra(self) -> dict[str, float]:
        return {"lr": self.lr} | ({"L_est": self.L_est} if self.L_est is not None else {})
