r"""A FedProx-like method written outside the package, as a user would write one: this file and
``conf/algorithm/my_fedprox.yaml`` (found with ``--config-dir tests/outside/conf``; its ``_target_`` names
`MyFedProxConfig`, importable from this folder on PYTHONPATH).  It uses only ``dane``'s public names.

Round t on worker i of m, with proximal weight μ > 0:

.. math::
    w_i &= \arg\min_w\; O_i(w) + \frac{\mu}{2}\|w - w_t\|^2   &&\text{(exact local solve)} \\
    w_{t+1} &= \frac1m \sum_i w_i                             &&\text{(one allreduce; } w_t\text{'s metrics ride along)}

On a quadratic O_i(w) = ½ wᵀA_i w − b_iᵀw + c_i + λ‖w‖² the local solve is
w_i = (A_i + (2λ + μ) I)⁻¹ (b_i + μ w_t), the closed form tests/test_extension.py checks.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

import dane


class MyFedProx(dane.Algorithm):
    name = "my_fedprox"
    synchronous_because = "my_fedprox averages local solves that all start from w_t"
    columns = (dane.Column("mu", "{:>8.3g}"),)

    def __init__(self, problem: dane.Problem, comm: dane.Communicator, *, mu: float):
        super().__init__(problem, comm)
        self.mu = mu

    def step(self) -> dict[str, float]:
        local_grad, local_metrics = self.problem.evaluate(self.w)  # w_t's metrics, to ride in the allreduce
        w_local = self.problem.prox_solve(self.w, torch.zeros_like(self.w), self.mu)  # argmin O_i + (mu/2)||w - w_t||^2
        self.w, g, metrics = self.comm.allreduce_mean([w_local, local_grad, local_metrics])  # w_{t+1} = mean w_i
        return {**self.metrics(g, metrics), "mu": self.mu}


@dataclass(frozen=True)
class MyFedProxConfig(dane.AlgorithmConfig):
    mu: float = 1.0
    name: str = "my_fedprox"
    algorithm = MyFedProx

    def __post_init__(self) -> None:
        if isinstance(self.mu, bool) or not isinstance(self.mu, (int, float)) or not self.mu > 0:
            raise dane.ConfigError(f"algorithm.mu must be a number > 0, got {self.mu!r}")

    def build(self, problem: dane.Problem, comm: dane.Communicator) -> MyFedProx:
        return MyFedProx(problem, comm, mu=float(self.mu))
