r"""AIDE (Reddi, Konečný, Richtárik, Póczós & Smola 2016): Catalyst acceleration around InexactDANE.

AIDE keeps an extrapolated point y_t (y_0 = w_0).  Round t runs one InexactDANE round
on the augmented objective :math:`\tilde O(w) = O(w) + \frac\tau2\|w - y_t\|^2` from
w_t, then extrapolates with the Catalyst momentum of Lin, Mairal & Harchaoui (2015):

.. math::
    g_t &= \frac1m \sum_i \nabla O_i(w_t)                         &&\text{(allreduce 1)} \\
    \tilde g_t &= g_t + \tau (w_t - y_t)                          &&(= \nabla\tilde O(w_t)) \\
    w_i &\approx \arg\min_w\; O_i(w) - \langle \nabla O_i(w_t) - \eta\,\tilde g_t, w\rangle
           + \frac{\tau + \mu}{2}\|w - w_t\|^2                    &&\text{(local solve)} \\
    w_{t+1} &= \frac1m \sum_i w_i                                 &&\text{(allreduce 2)} \\
    \alpha_{t+1}^2 &= (1 - \alpha_{t+1})\,\alpha_t^2 + q\,\alpha_{t+1},\quad q = \frac{\lambda}{\lambda + \tau} \\
    \zeta_t &= \frac{\alpha_t (1 - \alpha_t)}{\alpha_t^2 + \alpha_{t+1}},\qquad
    y_{t+1} = w_{t+1} + \zeta_t (w_{t+1} - w_t)

with λ = ``problem.strong_convexity`` and α_0 = √q.  Each record reports O (not Õ) at
w_t, measured in allreduce 1, with ``tau`` and ``zeta`` (ζ_t).

*The local subproblem.*  InexactDANE on :math:`\tilde O_i(w) = O_i(w) + \frac\tau2\|w - y\|^2`
(whose mean is :math:`\tilde O`) asks worker i for

.. math:: \arg\min_w\; O_i(w) + \frac\tau2\|w - y\|^2
          - \langle \nabla\tilde O_i(w_t) - \eta\,\tilde g, w\rangle + \frac\mu2\|w - w_t\|^2,

:math:`\nabla\tilde O_i(w_t) = \nabla O_i(w_t) + \tau(w_t - y)`.  The two quadratics
combine into one: around :math:`c = (\tau y + \mu w_t)/(\tau + \mu)` they are
:math:`\frac{\tau+\mu}2\|w - c\|^2` + const; here they are expanded around w_t instead,
:math:`\frac\tau2\|w - y\|^2 = \frac\tau2\|w - w_t\|^2 + \tau\langle w_t - y, w\rangle` + const,
and the linear term :math:`\tau\langle w_t - y, w\rangle` cancels the τ part of
:math:`\nabla\tilde O_i(w_t)`.  What is left is DANE's subproblem with g replaced by
:math:`\tilde g` and μ by τ + μ, one ``prox_solve(w_t, ∇O_i(w_t) − η g̃, τ + μ)``: the
same minimizer as the form around c, but anchored at w_t, so that SVRG starts at w_t as
the method prescribes, the Newton path reuses ∇O_i(w_t), and τ = 0 makes the very same
call as InexactDANE (the iterates agree to the last bit).

*Choosing τ* (``tau="auto"``, the default).  Catalyst (Lin, Mairal & Harchaoui, NIPS 2015;
JMLR 2018, "Catalyst acceleration for first-order convex optimization: from theory to
practice") picks the extra proximal weight κ for an incremental inner method (SVRG, SAG,
SAGA, MISO) on n terms, each L-smooth, whose sum is μ-strongly convex, as

.. math:: \kappa = \frac{L}{n + 1} - \mu \quad(\kappa = 0,\ \text{no acceleration, when } L/(n+1) \le \mu),

the weight past which the inner method's cost per subproblem, of order
n + (L + κ)/(μ + κ), stops falling while the outer loop's factor √((μ + κ)/μ) keeps
growing.  AIDE (Reddi et al. 2016) is Catalyst with InexactDANE inside, whose local solve
is SVRG on the worker's n_i rows; the paper's MATLAB reference takes τ (``kappa``) as an
input.  Here worker i proposes Catalyst's choice for its SVRG,

.. math:: \tau_i = \max\Big(0,\ \frac{L_i}{n_i + 1} - \lambda\Big),\qquad
          L_i = n_i \max_{j \in S_i} \text{weight}\; c_f \|x_j\|^2

(L_i the smoothness of one row's term of D_i = (1/n_i) Σ_j n_i·weight·f_j, the same L_max
that sets SVRG's step; λ = ``problem.strong_convexity``), and the workers use the
mean of the τ_i, which rides in round 0's first allreduce (one more scalar in that round,
no extra communication round).  Resumed runs keep the agreed τ (it is in the state).  The
rule is SVRG's: with ``local_solver="cg"`` set τ by hand.  A number (``tau=0.1``) is used
as given; τ = 0 is InexactDANE.  How many rounds each choice takes on the benchmark
problems is in ``results/bench.json`` (``svrg_local_solver``, scripts/bench_svrg.py).

Departure from the MATLAB reference: it starts the recursion from α_{-1} = 1; here
α_0 = √q, the Catalyst choice for a strongly convex objective, which keeps α_t = √q and
ζ_t = (1 − √q)/(1 + √q) constant.  With λ = 0 (q = 0) α_0 = 1, so that ζ_0 = 0 and
α_1 = (√5 − 1)/2, the reference's first α.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dane import checks
from dane.algorithm import Algorithm
from dane.dane import solver_arg
from dane.comm import Communicator
from dane.errors import ConfigError
from dane.local_solvers import LocalSolver
from dane.problems import Problem

from .inexact_dane import InexactSolverKeys, require_convex_shard


TAU_AUTO = "auto"


def catalyst_tau(row_smoothness: float, n_local: int, strong_convexity: float) -> float:
    """Catalyst's τ_i = max(0, L_i/(n_i + 1) − λ), L_i = n_i · (one row's smoothness); see the module docstring."""
    if n_local == 0:
        return 0.0
    return max(0.0, n_local * row_smoothness / (n_local + 1) - strong_convexity)


def local_row_smoothness(problem: Problem) -> float:
    """max_j weight c_f ||x_j||² over the worker's rows (ridge_synthetic keeps their linear-model view in ``rows``)."""
    rows = getattr(problem, "rows", problem)
    if not hasattr(rows, "row_smoothness"):
        raise ConfigError(f"algorithm.tau=auto needs the worker's rows (Catalyst's choice uses their smoothness), and "
                          f"{type(problem).__name__} keeps none; set algorithm.tau to a number >= 0")
    return rows.row_smoothness()


def catalyst_q(strong_convexity: float, tau: float) -> float:
    """q = λ / (λ + τ); 1 when λ + τ = 0 (no acceleration to do)."""
    return 1.0 if strong_convexity + tau == 0 else strong_convexity / (strong_convexity + tau)


def catalyst_alpha(alpha: float, q: float) -> float:
    """The root in (0, 1] of a² = (1 − a) α² + q a (Catalyst's step 4)."""
    b = alpha * alpha - q
    return 0.5 * (-b + math.sqrt(b * b + 4 * alpha * alpha))


def catalyst_zeta(alpha: float, alpha_next: float) -> float:
    """ζ = α (1 − α) / (α² + α_next), the extrapolation weight."""
    return alpha * (1 - alpha) / (alpha * alpha + alpha_next)


@dataclass(frozen=True)
class AIDEConfig(InexactSolverKeys):
    tau: float | str = TAU_AUTO
    eta: float = 1.0
    mu: float = 0.0
    name: str = "aide"

    def __post_init__(self) -> None:
        if self.tau != TAU_AUTO:
            if isinstance(self.tau, str):
                raise ConfigError(f"algorithm.tau must be a number >= 0 or auto, got {self.tau!r}")
            checks.nonnegative("algorithm.tau", self.tau)
        checks.positive("algorithm.eta", self.eta)
        checks.nonnegative("algorithm.mu", self.mu)
        self.solver()  # validates the local-solver keys now

    def build(self, problem: Problem, comm: Communicator) -> "AIDE":
        return AIDE(problem, comm, tau=self.tau, eta=self.eta, mu=self.mu, local_solver=self.solver())


class AIDE(Algorithm):
    name = "aide"

    def __init__(self, problem: Problem, comm: Communicator, *, tau: float | str = TAU_AUTO, eta: float = 1.0,
                 mu: float = 0.0, local_solver: LocalSolver | None = None, w0: torch.Tensor | None = None):
        require_convex_shard(problem, self.name)
        super().__init__(problem, comm, w0)
        self.eta, self.mu = eta, mu
        self.local_solver = local_solver  # None: the problem's own
        self.tau: float | None = None  # auto: agreed in round 0's first allreduce
        if tau != TAU_AUTO:
            self._set_tau(float(tau))
        else:  # this worker's proposal, from its own rows (no communication)
            self.local_tau = catalyst_tau(local_row_smoothness(problem), problem.n_local, problem.strong_convexity)
        self.y = self.w.clone()

    def _set_tau(self, tau: float) -> None:
        self.tau = tau
        self.q = catalyst_q(self.problem.strong_convexity, tau)
        self.alpha = math.sqrt(self.q) if self.q > 0 else 1.0

    def step(self) -> dict[str, float]:
        w = self.w
        local_grad, local_metrics = self.problem.evaluate(w)
        if self.tau is None:  # tau=auto: the workers' Catalyst τ_i, averaged in the same allreduce
            g, metrics, tau = self.comm.allreduce_mean([local_grad, local_metrics,  # 1. g (and τ = mean τ_i)
                                                        torch.tensor([self.local_tau], dtype=local_grad.dtype)])
            self._set_tau(float(tau))
        else:
            g, metrics = self.comm.allreduce_mean([local_grad, local_metrics])   # 1. g = mean ∇O_i(w_t)
        g_aug = g + self.tau * (w - self.y)                                       # g̃ = ∇Õ(w_t)
        w_local = self.problem.prox_solve(w, local_grad - self.eta * g_aug, self.mu + self.tau,  # 2. local solve
                                          anchor_grad=local_grad, **solver_arg(self.local_solver))
        (w_next,) = self.comm.allreduce_mean([w_local])                          # 3. w_{t+1} = mean w_i
        alpha_next = catalyst_alpha(self.alpha, self.q)
        zeta = catalyst_zeta(self.alpha, alpha_next)
        self.y = w_next + zeta * (w_next - w)                                     # Catalyst extrapolation
        self.w, self.alpha = w_next, alpha_next
        return {**self.metrics(g, metrics), "tau": self.tau, "zeta": zeta}

    def state_dict(self) -> dict:
        state = {**super().state_dict(), "y": self.y.detach().clone()}
        if self.tau is not None:
            state.update(tau=self.tau, alpha=self.alpha)
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.y = state["y"].clone()
        if "tau" in state:
            self._set_tau(state["tau"])
            self.alpha = state["alpha"]
