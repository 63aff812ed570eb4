r"""DiSCO: Distributed Self-Concordant Optimization (Zhang & Xiao, ICML 2015), an inexact damped Newton method.

Round t on worker i of m:

.. math::
    g_t &= \frac1m \sum_i \nabla O_i(w_t)                         &&\text{(allreduce)} \\
    v_t &\approx H^{-1} g_t,\quad H = \frac1m\sum_i \nabla^2 O_i(w_t),\quad
          \|H v_t - g_t\| \le \varepsilon_t                        &&\text{(distributed PCG)} \\
    \delta_t &= \sqrt{v_t^\top H v_t},\qquad
    w_{t+1} = w_t - \frac{v_t}{1 + M\delta_t}

The Newton system is solved by preconditioned conjugate gradient (`distributed_pcg`) run
identically on every worker.  Each PCG iteration needs the product :math:`H u`, one
allreduce of :math:`\nabla^2 O_i(w_t) u`, and the preconditioned residual
:math:`s = P^{-1} r` with :math:`P = \nabla^2 O_0(w_t) + \mu I` known to worker 0 only,
which solves it (its problem's own Cholesky or CG, `solve_hessian`) and broadcasts s.
δ_t comes from :math:`H v_t`, which PCG accumulates from the products it has already
made, so it costs no round.

Rounds: a round with k PCG iterations costs 2k + 1 communication rounds: the gradient
allreduce, the broadcast of :math:`P^{-1} g_t` that starts PCG, then per iteration one
allreduce of :math:`H u` and (except after the last) one broadcast of :math:`P^{-1} r`.
The paper's master-worker implementation counts a broadcast of u and the reduce of
:math:`H_i u` as one round; here each collective is one round, as docs/design.md ("Counting rounds")
asks, so DiSCO's rounds are about twice the paper's.

PCG stops once :math:`\|r\| \le \varepsilon_t = \text{pcg\_tol}\cdot\|g_t\|\cdot\min(1, \|g_t\|/\|g_0\|)`
or after ``pcg_max_iter`` iterations.  The paper's PCG has no cap: it runs until
:math:`\|r\| \le \varepsilon_t`.  The cap is a backstop where round-off stalls PCG; null takes
the package's CG cap, 10 d products (`dane.numerics.local_solvers.cg_products`).  Exact-arithmetic
PCG ends within d iterations (Hestenes & Stiefel 1952), but on an ill-conditioned
:math:`P^{-1}H` floating-point PCG loses conjugacy and needs more, and a cap of d would stop it
short of :math:`\varepsilon_t`.  The rule of the paper's analysis is
:math:`\varepsilon_t = \beta\sqrt{\lambda/L}\,\|g_t\|`, β = 1/20: a fixed relative residual,
which leaves the method linearly convergent near the optimum.  ``pcg_tol`` plays
β√(λ/L) (L is not known here), and the factor min(1, ‖g_t‖) makes the forcing term vanish
with the gradient, the condition for quadratic local convergence of an inexact Newton
method (Dembo, Eisenstat & Steihaug 1982; Nocedal & Wright, Theorem 7.2).  The factor is
relative to the first round's gradient g_0, so the rounds do not change when the
objective is scaled (targets in other units, say).

Records carry ``pcg_iters``, ``pcg_residual`` (‖r‖/‖g_t‖ at exit), ``delta`` (δ_t) and
``step_size`` (1/(1 + M δ_t)).  Record t's ``pcg_iters`` is round t's PCG, from w_t; its products and
collectives are in record t+1's ``local_hvps`` and ``comm_rounds`` (a record's counters are what reaching its
iterate cost), so the PCG of the round whose record stops the run, which moved past the iterate returned, is in
no record.

M (``self_concordance``): the paper's damped step 1/(1 + δ) is for a standard
self-concordant objective; a function self-concordant with constant M takes
1/(1 + M δ / 2) up to the paper's scaling.  The default (null) takes M = 1, the paper's
step, on a non-quadratic problem and M = 0 on a quadratic (``problem.quadratic``), which
is self-concordant with constant 0: the plain Newton step.  Departure from the paper: with
the damped step on ridge regression of unscaled targets δ_0 is large (it grows with the
targets' scale) and the damped phase lasts many rounds.

μ: the paper takes μ of the order of ‖∇²O_0 − H‖ (about L·sqrt(d/n_0)), so that P⁻¹H is
well conditioned; μ = 0 preconditions with worker 0's Hessian itself, which needs O_0
strongly convex (ℓ2 weight > 0).  Departures from the paper: the objective is used as
given (the paper rescales a loss to make it standard self-concordant, which changes δ_t
and so the damping); the PCG tolerance is the rule above; with unequal shards ∇²O_i carries its shard's weight
m n_i / N (`dane.problems.base`), so P is worker 0's weighted Hessian, not its local sample mean (the paper's
shards are equal, where the two agree).  On a quadratic the default M = 0 takes the plain Newton step;
``self_concordance=1`` damps it by 1/(1 + δ_t) all the same, and far from the optimum (δ_t ≫ 1) then spends
rounds that GIANT and DANE do not.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from dane import checks
from dane.algorithm import Algorithm, AlgorithmConfig, Column
from dane.comm import Communicator
from dane.comm.compression import METRICS
from dane.errors import ConfigError
from dane.numerics.local_solvers import cg_products
from dane.problems import Problem
from dane.work import count

from .defaults import Resolution, self_concordance

MatVec = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class PCGResult:
    v: torch.Tensor          # ≈ H⁻¹ g
    Hv: torch.Tensor         # H v, accumulated from the products PCG made
    iters: int               # products with H
    residual: float          # ‖g − H v‖ (by the recurrence)


def distributed_pcg(hessian_vector: MatVec, precondition: MatVec, g: torch.Tensor, *, eps: float,
                    max_iter: int) -> PCGResult:
    r"""Preconditioned CG on H v = g from v = 0, until ‖g − H v‖ <= eps or ``max_iter`` products.

    Zhang & Xiao (2015), Algorithm 2.  ``hessian_vector`` and ``precondition`` may each
    communicate; ``precondition`` is not called after the last product (its result would
    be unused), and neither is called when ‖g‖ <= eps.  H v is kept up to date from the
    products, so vᵀHv costs nothing more.
    """
    v, Hv, r = torch.zeros_like(g), torch.zeros_like(g), g.clone()
    res = float(torch.linalg.vector_norm(r))
    iters = 0
    if res <= eps:
        return PCGResult(v, Hv, iters, res)
    s = precondition(r)
    u = s.clone()
    rs = float(r @ s)
    while True:
        Hu = hessian_vector(u)
        iters += 1
        count("local_solver_iters")  # every worker's product of this iteration is counted as a Hessian-vector product
        uHu = float(u @ Hu)
        if not uHu > 0:  # not positive definite along u (round-off at convergence): keep v as is
            break
        alpha = rs / uHu
        v, Hv, r = v + alpha * u, Hv + alpha * Hu, r - alpha * Hu
        res = float(torch.linalg.vector_norm(r))
        if res <= eps or iters >= max_iter:
            break
        s = precondition(r)
        rs_next = float(r @ s)
        u = s + (rs_next / rs) * u
        rs = rs_next
    return PCGResult(v, Hv, iters, res)


def forcing_tolerance(grad_norm: float, pcg_tol: float, first_grad_norm: float) -> float:
    """ε_t = pcg_tol · ‖g_t‖ · min(1, ‖g_t‖ / ‖g_0‖) (see the module docstring)."""
    return pcg_tol * grad_norm * (min(1.0, grad_norm / first_grad_norm) if first_grad_norm > 0 else 1.0)


class DiSCO(Algorithm):
    name = "disco"
    label = "DiSCO"
    singular_remedy = " or algorithm.mu > 0"  # μ shifts worker 0's Hessian in the preconditioner P = ∇²O_0 + μI
    elastic = True  # its state is the iterate and ‖g_0‖
    synchronous_because = "DiSCO's distributed CG needs Hessian-vector products at the same iterate"
    columns = (Column("step_size", "{:>9.3g}"), Column("pcg_iters", "{:>9.0f}"), Column("delta", "{:>9.3g}"))

    def __init__(self, problem: Problem, comm: Communicator, *, mu: float = 0.0, pcg_tol: float = 0.05,
                 pcg_max_iter: int | None = None, self_concordance: float = 1.0, w0: torch.Tensor | None = None,
                 defaults: tuple[dict, ...] = ()):
        super().__init__(problem, comm, w0)
        for method, offered in (("hessian_vector", problem.hessian_vector), ("solve_hessian", problem.solve_hessian)):
            if offered is None:
                raise ConfigError(f"algorithm=disco needs {type(problem).__name__}.{method}; use another algorithm")
        self.mu, self.pcg_tol, self.self_concordance = mu, pcg_tol, self_concordance
        self.pcg_max_iter = cg_products(problem) if pcg_max_iter is None else pcg_max_iter
        self.defaults = tuple(defaults)
        self.first_grad_norm: float | None = None  # ‖g_0‖, the forcing term's unit

    def step(self) -> dict[str, float]:
        w = self.w
        local_grad, local_metrics = self.problem.evaluate(w)
        g, metrics = self.comm.allreduce_mean([local_grad, local_metrics], kinds=(None, METRICS))  # g = mean ∇O_i
        grad_norm = float(torch.linalg.vector_norm(g))
        if self.first_grad_norm is None:
            self.first_grad_norm = grad_norm
        pcg = distributed_pcg(lambda u: self.global_hessian_vector(u, w), lambda r: self.precondition(r, w), g,
                              eps=forcing_tolerance(grad_norm, self.pcg_tol, self.first_grad_norm),
                              max_iter=self.pcg_max_iter)
        delta = math.sqrt(max(float(pcg.v @ pcg.Hv), 0.0))                  # δ = sqrt(vᵀHv), no round
        step_size = 1.0 / (1.0 + self.self_concordance * delta)
        self.w = w - step_size * pcg.v                                      # damped Newton step
        return {**self.metrics(g, metrics), "pcg_iters": pcg.iters, "delta": delta, "step_size": step_size,
                "pcg_residual": pcg.residual / grad_norm if grad_norm > 0 else 0.0}

    def global_hessian_vector(self, u: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        (Hu,) = self.comm.allreduce_mean([self.problem.hessian_vector(u, at=w)])  # H u = mean ∇²O_i(w) u
        return Hu

    def precondition(self, r: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """P⁻¹ r, P = ∇²O_0(w) + μI: solved on worker 0, broadcast to all (one round)."""
        if self.comm.rank == 0:
            s = self.problem.solve_hessian(r, at=w, shift=self.mu, with_reg=True)
        else:
            s = torch.zeros_like(r)  # the buffer the broadcast fills
        (s,) = self.comm.broadcast([s], root=0)
        return s

    def state_dict(self) -> dict:
        return {**super().state_dict(), "first_grad_norm": self.first_grad_norm}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.first_grad_norm = state.get("first_grad_norm")


@dataclass(frozen=True)
class DiSCOConfig(AlgorithmConfig):
    mu: float = 0.0
    pcg_tol: float = 0.05
    pcg_max_iter: int | None = None
    self_concordance: float | None = None  # M of the damped step 1/(1 + M δ); null: 0 on a quadratic, else 1
    name: str = "disco"
    algorithm = DiSCO
    mu_role = "damping"

    def __post_init__(self) -> None:
        checks.nonnegative("algorithm.mu", self.mu)
        checks.relative_tolerance("algorithm.pcg_tol", self.pcg_tol)
        if self.pcg_max_iter is not None:
            checks.positive_int("algorithm.pcg_max_iter", self.pcg_max_iter)
        if self.self_concordance is not None:
            checks.nonnegative("algorithm.self_concordance", self.self_concordance)

    def build(self, problem: Problem, comm: Communicator) -> "DiSCO":
        """The nulls, noted in the summary's ``defaults``: M 0 on a quadratic, else the paper's 1 (module
        docstring); ``pcg_max_iter`` the package's CG cap, 10 d (`cg_products`; the paper's PCG has none)."""
        resolution, M, cap = Resolution(), self.self_concordance, self.pcg_max_iter
        if M is None:
            M = resolution.add("self_concordance", self_concordance(problem.quadratic), "self_concordance",
                               quadratic=problem.quadratic)
        if cap is None:
            cap = resolution.add("pcg_max_iter", cg_products(problem), "cg_products", dim=problem.dim)
        return DiSCO(problem, comm, mu=self.mu, pcg_tol=self.pcg_tol, pcg_max_iter=cap, self_concordance=M,
                     defaults=resolution.entries)
