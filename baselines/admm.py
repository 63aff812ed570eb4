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
:math:`\underline\mu = \frac1m\sum_i \lambda_{\min}(H_i|_{\mathcal R}) \le \lambda_{\min}(H|_{\mathcal R})`
in place of L and μ (a heuristic transfer to the consensus splitting: ``make bench``,
section ``defaults``, measures it against a grid of fixed ρ).  For the logistic loss H_i is
the curvature majorant c_f X_iᵀX_i/n_i + λI.

*Over the range* :math:`\mathcal R = \mathrm{range}(A)` of the data Hessian A = mean_i A_i
(H_i = A_i + cI, c the regulariser's curvature).  Started at 0, ADMM never leaves it: the
local solve moves x_i from z − u_i by −∇f_i(x_i)/ρ ∈ range(X_iᵀ) ⊆ 𝓡, and the z- and
u-steps combine such vectors, so a direction every shard's data ignores (null(A) =
∩_i null(A_i)) is never visited and its curvature c sets no rate.  Such directions are
common: a categorical column one-hot encoded with every value beside an intercept (the CSV
path's encoding) makes A singular on every shard alike, and the whole-space λ_min(H_i) = c
= λ gives a ρ far too small.  A direction only some shards
ignore (a rare value absent from a shard) is in 𝓡 and stays: on such a shard
λ_min(H_i|𝓡) = c.  For d ≤ ``EXACT_DIM`` each worker forms A_i
from d local Hessian-vector products, and one allreduce of A_i (d² numbers), of
λ⁺_min(A_i) in slot rank(A_i) of a (d+1)-vector, and of λ_max(H_i) gives A, hence rank(A),
and μ̲ = c + (1/m) Σ_{rank A_i = rank A} λ⁺_min(A_i) (equal ranks: range(A_i) = 𝓡) and L̄
(`range_bounds`).  Ranks count eigenvalues above sqrt(eps) λ_max (eps of the problem's
dtype: rounding in X_iᵀ(X_i v) leaves a null eigenvalue near eps λ_max).  For larger d
each worker takes its two extreme Ritz values over the whole space from ``power_iters``
products (Lanczos, `baselines.spectral`), one allreduce of the two scalars: there μ̲ is
c again wherever A is singular (a bound, as before, but a loose one).  Either way the
allreduce is counted in round 0's ``comm_rounds``, and μ̲ is floored at 1e-6 L̄ (an
objective that is not strongly convex has no rate to balance; the floor keeps ρ > 0).  A
problem without Hessian-vector products (a network) starts from ρ = 1 with residual
balancing instead.

*Refreshed* (a non-quadratic loss, ρ estimated).  The logistic majorant c_f X_iᵀX_i/n_i is
the Hessian at w = 0 and overstates the curvature near the optimum where the data are
nearly separable: ρ came out an order of magnitude too large, and the run stalled at its
cap (breast_cancer λ = 1e-5; the collinear table of `tests/test_admm_penalty.py` with
labels y > median).  At rounds 8, 16, 32, … (`baselines.adaptive.refresh_due`, doubling: re-estimates
logarithmic in the run's length, so ρ changes ever more rarely, as ADMM's convergence
proof wants it fixed) ρ is estimated again as above from the local Hessians at z_t
(`hessian_vector` at z), one more allreduce each, counted, and the scaled duals are
rescaled u_i ← u_i ρ_old/ρ_new as in residual balancing.  A heuristic, like the estimate
itself: ``make bench``, section ``defaults``, measures it.  A quadratic (ridge) has one
Hessian and is never refreshed.  This refresh is the package's adaptation ``rho_refresh``
(`baselines.adaptive.RHO_REFRESH`): ``algorithm.adapt=[]`` or ``algorithm.paper=true`` keeps the
estimate of round 0 for the whole run.

``adaptive_rho`` is residual balancing (Boyd's eq. 3.13): ρ ← τρ when r > μ s, ρ ← ρ/τ
when s > μ r, and the scaled duals u_i ← u_i ρ_old/ρ_new.  Departure from Boyd: the
residuals of z_t arrive in round t's allreduce, after x^{t+1} was solved with the old
ρ, so the change applies from round t+1 (one round later than in the book).

What a null resolved to (ρ with μ̲ and L̄, ``adaptive_rho``) is in the summary's ``defaults``; every change of ρ
during the run (a refresh, a rebalance) is its round's ``adapted`` event (``trigger``: "refresh" or
"residual balance"), which the summary lists as ``adaptations``, and ``adaptations_attached`` names what watched:
``rho_refresh`` and, with ``adaptive_rho``, ``residual_balance`` (Boyd's method, kept under ``algorithm.paper=true``;
``adaptive_rho=false`` turns it off).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch

from dane import checks
from dane.algorithm import Algorithm, AlgorithmConfig, Column
from dane.comm import Communicator
from dane.errors import ConfigError, NotPositiveDefinite
from dane.problems import Problem
from dane.records.results import adaptation
from dane.work import count

from .adaptive import RESIDUAL_BALANCE, RHO_REFRESH, AdaptKeys, refresh_due
from .defaults import NETWORK_PENALTY, Resolution, admm_penalty, residual_balancing
from .metrics import global_metrics, local_payload, logs_gradient, payload_kinds
from .spectral import local_spectrum, require_hessian_vector

#: Largest dimension whose local data Hessians are formed (d products) and averaged (d² numbers) for ρ;
#: beyond it, the extreme Ritz values of ``power_iters`` products
EXACT_DIM = 256


def spectral_penalty(problem: Problem, comm: Communicator, *, iters: int, seed: int,
                     at: torch.Tensor | None = None) -> tuple[float, dict]:
    """ρ = sqrt(μ̲ L̄) from each worker's local spectrum (its Hessian at ``at``; None: the majorant): one allreduce.
    Returns ρ and the statistics it read (μ̲, L̄ and whether they are over range(A), `range_bounds`)."""
    exact = problem.dim <= EXACT_DIM
    if not exact:
        lo, hi = local_spectrum(problem, iters=iters, seed=seed, key="algorithm.rho", at=at)
        (means,) = comm.allreduce_mean([problem.initial_point().new_tensor([lo, hi])])  # (μ̲, L̄)
        mu_low, L_bar = float(means[0]), float(means[1])
    else:
        mu_low, L_bar = range_bounds(problem, comm, at=at)
    return admm_penalty(mu_low, L_bar), {"mu_low": mu_low, "L_bar": L_bar, "over_range": exact}


def range_bounds(problem: Problem, comm: Communicator, at: torch.Tensor | None = None) -> tuple[float, float]:
    """(μ̲, L̄) over range(A), A = mean_i A_i the data Hessians: one allreduce of A_i, a rank slot and λ_max(H_i).

    H_i = A_i + cI (c: the regulariser's curvature).  range(A_i) ⊆ range(A), so over
    range(A) the smallest eigenvalue of H_i is c + λ⁺_min(A_i) when rank A_i = rank A
    (the two ranges coincide) and c otherwise (a direction of range(A) this shard does
    not see).  Worker i sends λ⁺_min(A_i) in slot rank(A_i) of a (d+1)-vector; after the
    mean, slot rank(A) holds (1/m) Σ over the shards whose range is range(A).
    """
    require_hessian_vector(problem, "algorithm.rho")
    d = problem.dim
    eye = torch.eye(d, dtype=problem.dtype)
    hv = problem.hessian_vector if at is None else partial(problem.hessian_vector, at=at)
    A_i = torch.stack([hv(e, with_reg=False) for e in eye], 1).double()
    c = float(hv(eye[0], with_reg=True)[0]) - float(A_i[0, 0])  # H_i e_0 - A_i e_0 = c e_0
    A_i = (A_i + A_i.T) / 2
    eig = torch.linalg.eigvalsh(A_i)
    count("local_factorizations")  # the client's eigendecomposition (the mean's below is the server's)
    rank = numerical_rank(eig, problem.dtype)
    slots = A_i.new_zeros(d + 1)
    slots[rank] = float(eig[-rank]) if rank else 0.0  # λ⁺_min(A_i): the smallest of the rank nonzero eigenvalues
    A, slots, L_bar = comm.allreduce_mean([A_i, slots, A_i.new_tensor([float(eig[-1]) + c])])
    rank_A = numerical_rank(torch.linalg.eigvalsh((A + A.T) / 2), problem.dtype)
    return c + float(slots[rank_A]), float(L_bar)


def numerical_rank(eig: torch.Tensor, dtype: torch.dtype) -> int:
    """Eigenvalues above sqrt(eps) of the largest (eps of the problem's dtype): the rounding of X^T(Xv) is far below."""
    top = float(eig[-1])
    return int((eig > math.sqrt(torch.finfo(dtype).eps) * top).sum()) if top > 0 else 0


def residual_balance(rho: float, primal: float, dual: float, *, mu: float = 10.0, tau: float = 2.0) -> float:
    """Boyd et al. (2011) eq. 3.13: the next ρ from the primal and dual residuals."""
    if primal > mu * dual:
        return rho * tau
    if dual > mu * primal:
        return rho / tau
    return rho


class ADMM(Algorithm):
    name = "admm"
    label = "ADMM"
    singular_remedy = ""  # its x-update's line names algorithm.rho itself (`local_solve`): problem.lam is not in it
    synchronous_because = "ADMM's consensus step needs every worker's x_i + u_i of the same round"
    columns = (Column("rho", "{:>8.3g}"), Column("primal_residual", "{:>15.3e}", shown_with="rho"),
               Column("dual_residual", "{:>13.3e}", shown_with="rho"))

    def __init__(self, problem: Problem, comm: Communicator, *, rho: float = 1.0, adaptive_rho: bool = False,
                 balance_mu: float = 10.0, balance_tau: float = 2.0,
                 refresh: Callable[..., tuple[float, dict]] | None = None, w0: torch.Tensor | None = None,
                 defaults: tuple[dict, ...] = ()):
        super().__init__(problem, comm, w0)  # self.w is z, the consensus iterate
        if problem.prox_regularizer is None:
            raise ConfigError(f"algorithm=admm needs {type(problem).__name__}.prox_regularizer; use another algorithm")
        self.rho, self.adaptive_rho = rho, adaptive_rho
        self.balance_mu, self.balance_tau = balance_mu, balance_tau
        self.refresh, self.t = refresh, 0
        self.defaults = tuple(defaults)  # ρ's and adaptive_rho's nulls as resolved; ρ's changes are ``adapted``
        self.adaptations = (RHO_REFRESH,) * (refresh is not None) + (RESIDUAL_BALANCE,) * bool(adaptive_rho)
        self.u = torch.zeros_like(self.w)
        self.with_grad = logs_gradient(problem)
        self._zero = torch.zeros_like(self.w)
        # residuals of the current z, pending until the next allreduce: ||x_i - z||^2 (local) and s
        self._primal_sq: torch.Tensor | None = None
        self._dual: float | None = None

    def step(self) -> dict[str, float]:
        if self.refresh is not None and refresh_due(self.t):  # ``rho_refresh``: 8, 16, 32, ...
            # one allreduce: ρ from the local Hessians at z.  Spent inside the rounds, so counted as their work and
            # traffic are (the measurement before round 0 is set-up: `dane.work`)
            rho, _ = self.refresh(at=self.w)
            adapted = [adaptation("algorithm.rho", self.rho, rho, "refresh")]
            self.u, self.rho = self.u * (self.rho / rho), rho
        else:
            adapted = []
        self.t += 1
        z, u, rho = self.w, self.u, self.rho
        x = self.local_solve(z - u, rho)                                                      # x-update (local solve)
        payload = local_payload(self.problem, z, with_grad=self.with_grad)  # the residual is ADMM's, the rest measured
        v, primal_sq, *reduced = self.comm.allreduce_mean([x + u, self._pending_primal_sq(), *payload],  # the one
                                                          kinds=(None, None, *payload_kinds(payload)))  # allreduce
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
            if self.rho != rho:
                adapted.append(adaptation("algorithm.rho", rho, self.rho, "residual balance"))
        return {**record, "adapted": adapted} if adapted else record

    def evaluate(self) -> dict[str, float]:
        payload = local_payload(self.problem, self.w, with_grad=self.with_grad)
        primal_sq, *reduced = self.comm.allreduce_mean([self._pending_primal_sq(), *payload],
                                                       kinds=(None, *payload_kinds(payload)))
        return {**global_metrics(self, reduced), "rho": self.rho, **self._residuals(primal_sq)}

    def diagnosis(self, records: list[dict]) -> str | None:
        """A fixed ρ whose last residuals are out of balance by more than ``balance_mu`` (the test of
        residual balancing): the side it errs on, and ρ·sqrt(r/s), the ρ that would equalise r and s if
        they scaled as 1/ρ and ρ (Boyd section 3.4.1's reasoning)."""
        last = records[-1]
        primal, dual = last.get("primal_residual"), last.get("dual_residual")
        if self.adaptive_rho or not primal or not dual or max(primal / dual, dual / primal) <= self.balance_mu:
            return None
        side, ratio = ("dual", dual / primal) if dual > primal else ("primal", primal / dual)
        suggested = float(f"{self.rho * math.sqrt(primal / dual):.1g}")
        return (f"the {side} residual is {ratio:.3g}x the other: rho = {self.rho:.3g} looks too "
                f"{'large' if side == 'dual' else 'small'} (try algorithm.adaptive_rho=true, "
                f"or algorithm.rho={suggested:g})")

    def state_dict(self) -> dict:
        return {**super().state_dict(), "u": self.u.clone(), "rho": self.rho, "t": self.t,
                "primal_sq": self._primal_sq, "dual": self._dual}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.u, self.rho, self.t = state["u"].clone(), state["rho"], state.get("t", 0)  # "t": since ρ refreshes
        self._primal_sq, self._dual = state["primal_sq"], state["dual"]

    def local_solve(self, v: torch.Tensor, rho: float) -> torch.Tensor:
        """argmin_x f_i(x) + (ρ/2)‖x − v‖².  f_i has no regulariser (the z-update holds it), so where f_i's Hessian is
        singular (fewer rows than features) only ρ shifts it: the line names algorithm.rho, not the problem's
        problem.lam, which is not in this system."""
        try:
            return self.problem.prox_solve(v, self._zero, rho, with_reg=False)
        except NotPositiveDefinite:
            raise NotPositiveDefinite(f"the local Hessian without the regulariser (ADMM's z-update holds it) plus {rho:g} "
                                      f"I is not positive definite on this shard; use a larger algorithm.rho") from None

    def _pending_primal_sq(self) -> torch.Tensor:
        return self._primal_sq if self._primal_sq is not None else torch.zeros(1, dtype=self.w.dtype)

    def _residuals(self, primal_sq_mean: torch.Tensor) -> dict[str, float]:
        if self._dual is None:
            return {}
        primal = math.sqrt(max(float(primal_sq_mean) * self.comm.size, 0.0))  # sqrt(Σ_i ||x_i - z||^2)
        return {"primal_residual": primal, "dual_residual": self._dual}


@dataclass(frozen=True)
class ADMMConfig(AlgorithmConfig, AdaptKeys):
    rho: float | None = None   # None: sqrt(μ̲ L̄) from the local Hessians' spectra (module docstring)
    adaptive_rho: bool | None = None  # None: residual balancing of a given ρ only (an estimated one stays fixed)
    balance_mu: float = 10.0   # Boyd's μ: rebalance when one residual exceeds μ times the other
    balance_tau: float = 2.0   # Boyd's τ: the factor ρ changes by
    power_iters: int = 20      # rho=None and dim > EXACT_DIM: Lanczos products per worker
    seed: int = 0              # start vector of those products
    name: str = "admm"
    algorithm = ADMM
    adaptation_names = (RHO_REFRESH.name,)  # residual balancing: ``adaptive_rho``

    def __post_init__(self) -> None:
        if self.rho is not None:
            checks.positive("algorithm.rho", self.rho)
        if self.adaptive_rho is not None:
            checks.boolean("algorithm.adaptive_rho", self.adaptive_rho)
        checks.positive_int("algorithm.power_iters", self.power_iters)
        checks.seed("algorithm.seed", self.seed)
        for key in ("balance_mu", "balance_tau"):
            if not checks.positive(f"algorithm.{key}", getattr(self, key)) > 1:
                raise ConfigError(f"algorithm.{key} must be > 1, got {getattr(self, key)}")
        self.check_policy()

    def build(self, problem: Problem, comm: Communicator) -> "ADMM":
        """ρ null: `spectral_penalty` (one allreduce), or 1 for a problem without Hessian-vector products (a network);
        ``adaptive_rho`` null: residual balancing of a given ρ (or a network's 1), none of an estimated one; each
        null noted in the summary's ``defaults``.  An estimated ρ of a non-quadratic loss is refreshed where
        ``rho_refresh`` may act (`baselines.adaptive.AdaptKeys.allows`)."""
        resolution = Resolution()
        given = self.rho is not None or problem.hessian_vector is None  # a network: ρ = 1, balanced
        estimate = partial(spectral_penalty, problem, comm, iters=self.power_iters, seed=self.seed)
        if self.rho is not None:
            rho = self.rho
        elif given:
            rho = resolution.add("rho", NETWORK_PENALTY, "NETWORK_PENALTY")
        else:
            rho, stats = estimate()
            rho = resolution.add("rho", rho, "admm_penalty", **stats)
        adaptive = self.adaptive_rho
        if adaptive is None:
            adaptive = resolution.add("adaptive_rho", residual_balancing(given), "residual_balancing", given=given)
        return ADMM(problem, comm, rho=rho, adaptive_rho=adaptive, balance_mu=self.balance_mu,
                    balance_tau=self.balance_tau,
                    refresh=None if given or problem.quadratic or not self.allows(RHO_REFRESH.name) else estimate,
                    defaults=resolution.entries)
