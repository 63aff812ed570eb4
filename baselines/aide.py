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
JMLR 2018) picks its extra proximal weight for an incremental inner method on n terms as
κ = L/(n + 1) − λ, balancing the inner method's gradient evaluations against the outer
loop's factor √((λ + κ)/λ).  AIDE counts communication rounds instead, and each outer step
is one InexactDANE round: what τ must buy is that this one round solves the τ-augmented
problem well, and anything more only slows the outer loop.  Catalyst's rule buys more (κ/λ in the
thousands at λ = 1e-5): on the rare one-hot logistic cell of ``make bench`` section ``defaults`` AIDE
with it missed the target where τ = 0 reached it.  A DANE round
on a quadratic contracts the error by I − (H_i + τI)⁻¹(H + τI) (Shamir et al. 2014); on
the diagonal, by |D_k − D_ik| / (D_ik + λ + τ) per column k.  Here worker i measures its column curvature
D_ik = weight · c_f · Σ_j x_jk² (the diagonal of its curvature bound, `column_curvature`),
the mean D rides in round 0's first allreduce, and the worker proposes the least τ that
shrinks every column's error by ρ = `COLUMN_CONTRACTION` = 0.7,

.. math:: \tau_i = \max\Big(0,\ \max_k \big(|D_k - D_{ik}|/\rho - D_{ik}\big) - \lambda\Big)

(`spread_tau`).  It is 0 where the shards agree (DANE converges alone, so AIDE is InexactDANE
there) and of the order of a rare feature's curvature where a shard lacks it.  The workers
agree on τ = mean τ_i by one scalar allreduce in round 0 (round 0 has three allreduces,
every later round two), so that every subproblem uses the same τ.  The rule reads the
diagonal only: it is blind to the off-diagonal disagreement of correlated columns and to
the directions a shard with n_i < d rows does not span (MNIST at n_i = 500 < d), where it
proposes too small a τ, and it overshoots on heavy-tailed columns with few rows per shard.
So this τ is only the first; the rounds then correct it, from the objective that allreduce 1
already measures (no extra communication):

* *momentum restart* where O rose (O(w_t) > O(w_{t−1})): y_t = w_t and α = √q, the
  function-value restart of accelerated methods (O'Donoghue & Candès, "Adaptive restart for
  accelerated gradient schemes", 2015);
* *τ growth* where the last round failed its subproblem (`failed_subproblem`): O rose and
  either that round started from a restart, where y = w and an exact minimizer of the
  augmented problem cannot raise O (O(w⁺) + τ/2‖w⁺ − w‖² ≤ O(w)), or O is no lower than at the
  last restart (no progress since).  Then τ ← `baselines.adaptive.TAU_GROWTH` · max(τ, λ) = 4 max(τ, λ) (the mean
  column curvature when both are 0; `baselines.adaptive.grown_tau`), with the momentum restarted: Catalyst's adaptive
  smoothing, which raises its proximal weight when the inner method misses its stopping test
  (4WD-Catalyst-Automatic, Paquette, Lin, Drusvyatskiy, Mairal & Harchaoui, AISTATS 2018).

Hence ρ = 0.7, less conservative than 1/2: a τ too small costs a few rounds until it grows,
one too large is never lowered.  τ only grows, so it settles after a few rounds.

*The inexact solve* (``passes=auto``, `inner_contraction`).  Catalyst's outer rate 1 − √q holds
only when each subproblem is solved to an accuracy ε_k that shrinks geometrically with the
outer step k (Lin, Mairal & Harchaoui 2015, Sec. 3); a solve that stops short moves the flat
directions only part of the way, and the outer loop then runs at a fraction of that rate
however τ is chosen.  Our choice, in that spirit: AIDE's SVRG takes c = ln(1/q)
(at least InexactDANE's c₀ = 1) times the `svrg_passes` steps: its error along the augmented
problem's flattest direction (curvature λ + τ + μ) shrinks by e^{-c} = q per solve.  τ = 0
(q = 1) gives InexactDANE's passes; λ = 0 with τ > 0 (q = 0, c = ∞) the cap P_max, as `svrg_passes` takes where
λ + μ = 0.

Both are this package's adaptations, ``tau_growth`` and ``momentum_restart`` (`baselines.adaptive`), each
switchable on its own (``algorithm.adapt``; without ``momentum_restart`` a growth still restarts the momentum, its
q being new) and both off under ``algorithm.paper=true``, where round 0's τ holds for the whole run.
Round 0's τ is the summary's resolved ``algorithm.tau`` (``defaults``); each growth (``algorithm.tau``) and each
restart that drops an extrapolation (``algorithm.zeta``: the ζ that made y_t, to 0; none where it was 0, as at
τ = 0) is its round's ``adapted`` event, which the summary lists as ``adaptations``, and ``adaptations_attached``
names those watching.  Resumed runs keep τ, q, α, ζ and the restart evidence (they are in the state).  The rule reads
the worker's rows: set τ by hand on problems without them.  A number (``tau=0.1``) is used
as given, with neither restarts nor growth (the paper's method); τ = 0 is InexactDANE.  The
defaults benchmark (scripts/bench_defaults.py) measures the rule against the grid
τ ∈ {0, 1e-3, 1e-2, 0.1}, scripts/bench_convex.py on breast_cancer and MNIST.  Departure from
the paper: Reddi et al. take τ as an input, fixed, and solve with 3 SVRG passes.

Departure from the MATLAB reference: it starts the recursion from α_{-1} = 1; here
α_0 = √q, the Catalyst choice for a strongly convex objective, which keeps α_t = √q and
ζ_t = (1 − √q)/(1 + √q) constant.  With λ = 0 (q = 0) α_0 = 1, so that ζ_0 = 0 and
α_1 = (√5 − 1)/2, the reference's first α.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import torch

from dane import checks
from dane.algorithm import Algorithm, AlgorithmConfig, Column, metrics_message, metrics_received
from dane.dane import solver_arg
from dane.comm import Communicator
from dane.errors import ConfigError
from dane.numerics.local_solvers import LocalSolver, refuse_oversized_svrg
from dane.numerics.svrg import AUTO_PASSES_CONTRACTION, PASSES_AUTO, load_svrg, row_shard
from dane.problems import Problem
from dane.records.results import adaptation

from .adaptive import GROW_TAU, MOMENTUM_RESTART, AdaptKeys, grown_tau
from .defaults import COLUMN_CONTRACTION, Resolution, spread_tau
from .inexact_dane import InexactSolverKeys, noted_solve, require_convex_shard, solve_nulls


TAU_AUTO = "auto"


def column_curvature(problem: Problem) -> torch.Tensor:
    """D_i = weight · c_f · Σ_j x_jk² per column k: the diagonal of the curvature bound c_f · weight · X_iᵀX_i
    (the Hessian's diagonal for squared loss; logistic and softmax at margin 0, where their curvature peaks)."""
    rows = row_shard(problem)
    if rows.svrg_rows is None:
        raise ConfigError(f"algorithm.tau=auto needs the worker's rows (the rule compares their column curvature), "
                          f"and {type(problem).__name__} keeps none; set algorithm.tau to a number >= 0")
    r = rows.svrg_rows()
    if r.X is not None:
        sq = np.einsum("ij,ij->j", r.X, r.X)
    else:  # CSR: Σ_j x_jk² by column index
        sq = np.zeros(rows.X.shape[1])
        np.add.at(sq, r.indices, r.data * r.data)
    return torch.from_numpy(r.weight * rows.loss.curvature * sq).to(torch.float64)


def catalyst_q(strong_convexity: float, tau: float) -> float:
    """q = λ / (λ + τ); 1 when λ + τ = 0 (no acceleration to do)."""
    return 1.0 if strong_convexity + tau == 0 else strong_convexity / (strong_convexity + tau)


def inner_contraction(q: float) -> float:
    """c = max(c_0, ln(1/q)) of passes=auto (c_0 = `AUTO_PASSES_CONTRACTION`, InexactDANE's): the SVRG solve of the
    τ-augmented subproblem shrinks its error along the flattest direction (curvature λ + τ + μ) by e^{-c} = q.
    q = 0 (λ = 0, τ > 0) asks for an exact solve, c = ∞: `svrg_passes` then runs its cap P_max, as where the
    curvature is 0."""
    if q <= 0:
        return math.inf
    return AUTO_PASSES_CONTRACTION if q >= 1 else max(AUTO_PASSES_CONTRACTION, math.log(1 / q))


def failed_subproblem(objective: float, previous: float, at_restart: float, restarted: bool) -> bool:
    """Whether the last round failed to solve its τ-augmented subproblem: O rose, and either that round started
    from a restart (y = w_t, where an exact solve cannot raise O) or O is no lower than at the last restart."""
    return objective > previous and (restarted or objective >= at_restart)


def catalyst_alpha0(q: float) -> float:
    """α_0 = √q, Catalyst's start (and restart) for a strongly convex objective; 1 when q = 0."""
    return math.sqrt(q) if q > 0 else 1.0


def catalyst_alpha(alpha: float, q: float) -> float:
    """The root in (0, 1] of a² = (1 − a) α² + q a (Catalyst's step 4)."""
    b = alpha * alpha - q
    return 0.5 * (-b + math.sqrt(b * b + 4 * alpha * alpha))


def catalyst_zeta(alpha: float, alpha_next: float) -> float:
    """ζ = α (1 − α) / (α² + α_next), the extrapolation weight."""
    return alpha * (1 - alpha) / (alpha * alpha + alpha_next)


class AIDE(Algorithm):
    name = "aide"
    label = "AIDE"
    synchronous_because = "DANE's local solve needs the global gradient of the same iterate"
    singular_remedy = " or algorithm.mu > 0"  # μ + τ shifts the local Hessian of the solve
    columns = (Column("tau", "{:>8.3g}"), Column("zeta", "{:>8.3g}"))

    def __init__(self, problem: Problem, comm: Communicator, *, tau: float | str = TAU_AUTO, eta: float = 1.0,
                 mu: float = 0.0, local_solver: LocalSolver | None = None, w0: torch.Tensor | None = None,
                 grows: bool = True, restarts: bool = True):
        require_convex_shard(problem, self.name)
        refuse_oversized_svrg("algorithm.batch_size", local_solver, problem.n_local)  # before any collective
        super().__init__(problem, comm, w0)
        self.eta, self.mu = eta, mu
        self.local_solver = local_solver  # None: the problem's own
        load_svrg(problem, local_solver)  # numba's start-up in the set-up, not in round 0
        self.tau: float | None = None  # auto: agreed in round 0's second allreduce
        self.adaptive = tau == TAU_AUTO  # τ agreed in round 0; then, where attached, grown and the momentum restarted
        self.grows, self.restarts = self.adaptive and grows, self.adaptive and restarts
        self.adaptations = (GROW_TAU,) * self.grows + (MOMENTUM_RESTART,) * self.restarts
        if not self.adaptive:
            self._set_tau(float(tau))
        else:  # this worker's column curvature, from its own rows (no communication)
            self.local_curvature = column_curvature(problem)
        self.y, self.zeta = self.w.clone(), 0.0  # ζ: the extrapolation weight that made y
        # τ=auto's evidence: O at the last round's start, O at the last restart, whether the last round restarted
        self.previous, self.at_restart, self.restarted = math.inf, math.inf, True
        self.defaults = None if self.adaptive else self.resolved()  # τ=auto: known in round 0 (`resolved`)
        self.pending_defaults = {"algorithm.tau": "spread_tau", **solve_nulls(local_solver)} if self.adaptive else {}

    def _set_tau(self, tau: float) -> None:
        """τ, q, α anew (α_0 = √q: the momentum starts over) and the local solver for this τ."""
        self.tau = tau
        self.q = catalyst_q(self.problem.strong_convexity, tau)
        self.alpha = catalyst_alpha0(self.q)
        self.solver = self.solver_at(self.q)

    def solver_at(self, q: float):
        """The local solver for Catalyst's q: an SVRG solve with passes=auto contracting by ``inner_contraction(q)``,
        else as given (a fixed count of passes reads no contraction)."""
        if isinstance(self.local_solver, LocalSolver) and self.local_solver.method == "svrg" \
                and self.local_solver.passes == PASSES_AUTO:
            return replace(self.local_solver, contraction=inner_contraction(q))
        return self.local_solver

    def resolved(self) -> tuple[dict, ...]:
        """The summary's ``defaults``: τ=auto's first τ (`spread_tau`, agreed in round 0) and ``passes=auto``'s passes
        at the first τ with SVRG's null step (`baselines.inexact_dane.noted_solve`: proximal weight μ + τ, contraction
        ln(1/q))."""
        resolution = Resolution()
        tau = self.first_tau if self.adaptive else self.tau
        if self.adaptive:
            resolution.add("tau", tau, "spread_tau",
                           column_contraction=COLUMN_CONTRACTION, strong_convexity=self.problem.strong_convexity)
        solver = self.solver_at(catalyst_q(self.problem.strong_convexity, tau))
        if isinstance(solver, LocalSolver):
            resolution.entries += noted_solve(self.problem, solver, self.mu + tau, self.comm)
        return tuple(resolution.entries)

    def _adapt(self, objective: float, w: torch.Tensor) -> tuple[list[dict], bool]:
        """τ=auto, from round 1 on: grow τ where the last round failed its subproblem (``tau_growth``,
        `failed_subproblem`, `baselines.adaptive.grown_tau`; the momentum restarts with it) and restart the momentum
        where O rose (``momentum_restart``: α back to α_0, y = w_t).  The record's ``adapted`` events (a restart's
        where it dropped an extrapolation, ζ ≠ 0), and whether the momentum restarted."""
        rose, events, tau = objective > self.previous, [], self.tau
        grow = self.grows and failed_subproblem(objective, self.previous, self.at_restart, self.restarted)
        restart = grow or (self.restarts and rose)
        if grow:
            self._set_tau(grown_tau(tau, self.problem.strong_convexity, float(self.mean_curvature.max())))
            events.append(adaptation("algorithm.tau", tau, self.tau, "failed subproblem"))
        elif restart:
            self.alpha = catalyst_alpha0(self.q)
        if restart:
            self.y = w.clone()
            self.at_restart = objective
            if self.zeta != 0.0:  # y_t = w_t + ζ (w_t − w_{t−1}) becomes w_t
                events.append(adaptation("algorithm.zeta", self.zeta, 0.0, "objective rose"))
        self.previous, self.restarted = objective, restart
        return events, restart

    def step(self) -> dict[str, float]:
        w = self.w
        local_grad, local_metrics = self.problem.evaluate(w)
        reads = self.grows or self.restarts  # τ's growth and the momentum restart read O(w_t): AIDE's message
        parts, kinds = metrics_message(local_metrics, reads_objective=reads)
        if self.tau is None:  # tau=auto, round 0: the column curvature D = mean D_i rides with g
            curvature = self.local_curvature.to(local_grad.dtype)
            g, mean_curvature, *means = self.comm.allreduce_mean([local_grad, curvature, *parts],  # 1. g, D
                                                                 kinds=(None, None, *kinds))
            metrics, _ = metrics_received(means, reads_objective=reads)
            local_tau = spread_tau(curvature, mean_curvature, self.problem.strong_convexity)  # this worker's τ_i
            (tau,) = self.comm.allreduce_mean([torch.tensor([local_tau], dtype=local_grad.dtype)])  # round 0 only
            self._set_tau(float(tau))  # every worker's subproblem takes the same τ = mean τ_i
            self.mean_curvature = mean_curvature
            self.previous = self.at_restart = float(metrics[0])  # "objective" first (Problem)
            self.first_tau = self.tau
            self.defaults = self.resolved()
            restart, adapted = True, []  # y_0 = w_0
        else:
            g, *means = self.comm.allreduce_mean([local_grad, *parts], kinds=(None, *kinds))  # 1. g = mean ∇O_i(w_t)
            metrics, _ = metrics_received(means, reads_objective=reads)
            adapted, restart = self._adapt(float(metrics[0]), w) if self.adaptive else ([], False)
        g_aug = g + self.tau * (w - self.y)                                       # g̃ = ∇Õ(w_t)
        w_local = self.problem.prox_solve(w, local_grad - self.eta * g_aug, self.mu + self.tau,  # 2. local solve
                                          anchor_grad=local_grad, **solver_arg(self.solver))
        (w_next,) = self.comm.allreduce_mean([w_local])                          # 3. w_{t+1} = mean w_i
        alpha_next = catalyst_alpha(self.alpha, self.q)
        zeta = catalyst_zeta(self.alpha, alpha_next)
        self.y = w_next + zeta * (w_next - w)                                     # Catalyst extrapolation
        self.w, self.alpha, self.zeta = w_next, alpha_next, zeta
        return {**self.metrics(g, metrics), "tau": self.tau, "zeta": zeta, "restart": float(restart),
                **({"adapted": adapted} if adapted else {})}

    def state_dict(self) -> dict:
        state = {**super().state_dict(), "y": self.y.detach().clone()}
        if self.tau is not None:
            state.update(tau=self.tau, alpha=self.alpha, zeta=self.zeta, previous=self.previous,
                         at_restart=self.at_restart, restarted=self.restarted)
            if self.adaptive:
                state.update(mean_curvature=self.mean_curvature, first_tau=self.first_tau)
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.y = state["y"].clone()
        if "tau" in state:
            self._set_tau(state["tau"])
            self.alpha, self.zeta = state["alpha"], state.get("zeta", 0.0)  # "zeta": since restarts record it
            self.previous, self.at_restart, self.restarted = state["previous"], state["at_restart"], state["restarted"]
            if "mean_curvature" in state:
                self.mean_curvature = state["mean_curvature"]
                self.first_tau = state.get("first_tau", state["tau"])  # a checkpoint before first_tau: its τ
                self.defaults = self.resolved()


@dataclass(frozen=True)
class AIDEConfig(InexactSolverKeys, AlgorithmConfig, AdaptKeys):
    tau: float | str = TAU_AUTO
    eta: float = 1.0
    mu: float = 0.0
    name: str = "aide"
    algorithm = AIDE
    adaptation_names = (GROW_TAU.name, MOMENTUM_RESTART.name)
    mu_role = "damping"

    def __post_init__(self) -> None:
        if self.tau != TAU_AUTO:
            if isinstance(self.tau, str):
                raise ConfigError(f"algorithm.tau must be a number >= 0 or auto, got {self.tau!r}")
            checks.nonnegative("algorithm.tau", self.tau)
        checks.positive("algorithm.eta", self.eta)
        checks.nonnegative("algorithm.mu", self.mu)
        self.solver()  # validates the local-solver keys now
        self.check_policy()

    def build(self, problem: Problem, comm: Communicator) -> "AIDE":
        return AIDE(problem, comm, tau=self.tau, eta=self.eta, mu=self.mu, local_solver=self.solver(),
                    grows=self.allows(GROW_TAU.name), restarts=self.allows(MOMENTUM_RESTART.name))
