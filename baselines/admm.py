r"""Consensus ADMM in scaled form (Boyd et al. 2011, sections 7.1.1 and 3.4.1): one allreduce per round.

Write the global objective as :math:`O(w) = \frac1m\sum_i f_i(w) + r(w)`, where f_i is
O_i without the shared regulariser r (for ridge, :math:`r(w) = \lambda\|w\|^2`).  ADMM
solves the equivalent consensus problem :math:`\min \sum_i f_i(x_i) + m\,r(z)` subject to
x_i = z (O scaled by m, so ρ is the penalty of each f_i as in Boyd's section 7.1.1):

.. math::
    x_i^{t+1} &= \arg\min_x f_i(x) + \tfrac{\rho}{2}\|x - z_t + u_i^t\|^2      &&\text{(local solve)} \\
    v &= \tfrac1m \textstyle\sum_i (x_i^{t+1} + u_i^t)                        &&\text{(allreduce)} \\
    z_{t+1} &= \arg\min_z m\,r(z) + \tfrac{m\rho}{2}\|z - v\|^2
             = \mathrm{prox}_{r/\rho}(v) = \frac{\rho}{\rho + 2\lambda}\, v      &&\text{(ridge)} \\
    u_i^{t+1} &= u_i^t + x_i^{t+1} - z_{t+1}

The logged iterate is z.  Residuals of z_t:
primal :math:`r_t = \sqrt{\sum_i\|x_i^t - z_t\|^2}`, dual :math:`s_t = \rho\sqrt m\,\|z_t - z_{t-1}\|`.
Worker i knows :math:`\|x_i^t - z_t\|^2` only after round t-1's allreduce, so the scalar
rides in round t's allreduce, beside z_t's metrics: the record of z_t carries both
residuals at no extra communication round (round 0, with no x yet, carries neither).

*The default penalty* (``rho=None``) is :math:`\rho = \sqrt{\underline\mu\,\bar L}`, the
penalty that minimises the linear rate bound of Douglas-Rachford splitting and ADMM for
a μ-strongly convex, L-smooth objective (Giselsson & Boyd, "Linear convergence and metric
selection for Douglas-Rachford splitting and ADMM", IEEE TAC 2017; Ghadimi et al. 2015 for
quadratics), here with the local Hessians' bounds
:math:`\bar L = \frac1m\sum_i \lambda_{\max}(H_i) \ge \lambda_{\max}(H)` and
:math:`\underline\mu = \frac1m\sum_i \lambda_{\min}(H_i) \le \lambda_{\min}(H)` in
place of L and μ (a heuristic transfer to the consensus splitting: ``make bench``,
section ``defaults``, measures it against a grid of fixed ρ).  Each worker takes its two
extreme Ritz values from ``power_iters`` local Hessian-vector products at the start
(Lanczos, `baselines.spectral`; for the logistic loss the curvature majorant), and one
allreduce of the two scalars, counted in round 0's ``comm_rounds``, gives the means.  μ̲
is floored at 1e-6 L̄ (an objective that is not strongly convex has no rate to balance;
the floor keeps ρ > 0).  A problem without Hessian-vector products (a network) starts
from ρ = 1 with residual balancing instead.

``adaptive_rho`` is residual balancing (Boyd's eq. 3.13): ρ ← τρ when r > μ s, ρ ← ρ/τ
when s > μ r, and the scaled duals u_i ← u_i ρ_old/ρ_new.  Departure from Boyd: the
residuals of z_t arrive in round t's allreduce, after x^{t+1} was solved with the old
ρ, so the change applies from round t+1 (one round later than in the book).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dane import checks
from dane.algorithm import Algorithm
from dane.comm import Communicator
from dane.errors import ConfigError
from dane.problems import Problem

from .metrics import global_metrics, local_payload, logs_gradient
from .spectral import local_spectrum


@dataclass(frozen=True)
class ADMMConfig:
    rho: float | None = None   # None: sqrt(μ̲ L̄) from the local Hessians' spectra (module docstring)
    adaptive_rho: bool | None = None  # None: residual balancing of a given ρ only (an estimated one stays fixed)
    balance_mu: float = 10.0   # Boyd's μ: rebalance when one residual exceeds μ times the other
    balance_tau: float = 2.0   # Boyd's τ: the factor ρ changes by
    power_iters: int = 20      # local Hessian-vector products per worker for rho=None
    seed: int = 0              # start vector of those products
    name: str = "admm"

    def __post_init__(self) -> None:
        if self.rho is not None:
            checks.positive("algorithm.rho", self.rho)
        if self.adaptive_rho is not None:
            checks.boolean("algorithm.adaptive_rho", self.adaptive_rho)
        checks.positive_int("algorithm.power_iters", self.power_iters)
        checks.integer("algorithm.seed", self.seed)
        for key in ("balance_mu", "balance_tau"):
            if not checks.positive(f"algorithm.{key}", getattr(self, key)) > 1:
                raise ConfigError(f"algorithm.{key} must be > 1, got {getattr(self, key)}")

    def build(self, problem: Problem, comm: Communicator) -> "ADMM":
        given = self.rho is not None or not hasattr(problem, "hessian_vector")  # a network: ρ = 1, balanced
        rho = (self.rho or 1.0) if given else spectral_penalty(problem, comm, iters=self.power_iters, seed=self.seed)
        adaptive = self.adaptive_rho if self.adaptive_rho is not None else given
        return ADMM(problem, comm, rho=rho, adaptive_rho=adaptive, balance_mu=self.balance_mu,
                    balance_tau=self.balance_tau)


def spectral_penalty(problem: Problem, comm: Communicator, *, iters: int, seed: int) -> float:
    """ρ = sqrt(μ̲ L̄) from each worker's extreme local Ritz values: one allreduce of two scalars."""
    lo, hi = local_spectrum(problem, iters=iters, seed=seed, key="algorithm.rho")
    (means,) = comm.allreduce_mean([problem.initial_point().new_tensor([lo, hi])])  # (μ̲, L̄)
    mu_low, L_bar = float(means[0]), float(means[1])
    return math.sqrt(max(mu_low, 1e-6 * L_bar) * L_bar)


def residual_balance(rho: float, primal: float, dual: float, *, mu: float = 10.0, tau: float = 2.0) -> float:
    """Boyd et al. (2011) eq. 3.13: the next ρ from the primal and dual residuals."""
    if primal > mu * dual:
        return rho * tau
    if dual > mu * primal:
        return rho / tau
    return rho


class ADMM(Algorithm):
    name = "admm"

    def __init__(self, problem: Problem, comm: Communicator, *, rho: float = 1.0, adaptive_rho: bool = False,
                 balance_mu: float = 10.0, balance_tau: float = 2.0, w0: torch.Tensor | None = None):
        super().__init__(problem, comm, w0)  # self.w is z, the consensus iterate
        for method in ("prox_solve", "prox_regularizer"):
            if not hasattr(problem, method):
                raise ConfigError(f"algorithm=admm needs {type(problem).__name__}.{method}; use another algorithm")
        self.rho, self.adaptive_rho = rho, adaptive_rho
        self.balance_mu, self.balance_tau = balance_mu, balance_tau
        self.u = torch.zeros_like(self.w)
        self.with_grad = logs_gradient(problem)
        self._zero = torch.zeros_like(self.w)
        # residuals of the current z, pending until the next allreduce: ||x_i - z||^2 (local) and s
        self._primal_sq: torch.Tensor | None = None
        self._dual: float | None = None

    def step(self) -> dict[str, float]:
        z, u, rho = self.w, self.u, self.rho
        x = self.problem.prox_solve(z - u, self._zero, rho, with_reg=False)                  # x-update (local solve)
        payload = [self._pending_primal_sq(), *local_payload(self.problem, z, with_grad=self.with_grad)]
        v, primal_sq, *reduced = self.comm.allreduce_mean([x + u, *payload])                  # the one allreduce
        z_next = self.problem.prox_regularizer(v, rho)                                        # z-update
        self.u = u + x - z_next                                                                # u-update
        record = {**global_metrics(self, reduced), "rho": rho, **self._residuals(primal_sq)}
        self._primal_sq = torch.linalg.vector_norm(x - z_next).square().reshape(1)
        self._dual = rho * math.sqrt(self.comm.size) * float(torch.linalg.vector_norm(z_next - z))
        self.w = z_next
        if self.adaptive_rho and "primal_residual" in record:
            self.rho = residual_balance(rho, record["primal_residual"], record["dual_residual"],
                                        mu=self.balance_mu, tau=self.balance_tau)
            self.u = self.u * (rho / self.rho)
        return record

    def evaluate(self) -> dict[str, float]:
        primal_sq, *reduced = self.comm.allreduce_mean(
            [self._pending_primal_sq(), *local_payload(self.problem, self.w, with_grad=self.with_grad)])
        return {**global_metrics(self, reduced), "rho": self.rho, **self._residuals(primal_sq)}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "u": self.u.clone(), "rho": self.rho,
                "primal_sq": self._primal_sq, "dual": self._dual}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.u, self.rho = state["u"].clone(), state["rho"]
        self._primal_sq, self._dual = state["primal_sq"], state["dual"]

    def _pending_primal_sq(self) -> torch.Tensor:
        return self._primal_sq if self._primal_sq is not None else torch.zeros(1, dtype=self.w.dtype)

    def _residuals(self, primal_sq_mean: torch.Tensor) -> dict[str, float]:
        if self._dual is None:
            return {}
        primal = math.sqrt(max(float(primal_sq_mean) * self.comm.size, 0.0))  # sqrt(Σ_i ||x_i - z||^2)
        return {"primal_residual": primal, "dual_residual": self._dual}
