r"""GIANT: Globally Improved Approximate NewTon (Wang, Roosta, Xu & Mahoney, NeurIPS 2018).

Round t on worker i of m, three allreduces:

.. math::
    g_t &= \frac1m \sum_i \nabla O_i(w_t)                              &&\text{(allreduce 1)} \\
    p_i &\approx H_i^{-1} g_t,\quad H_i = \nabla^2 O_i(w_t)             &&\text{(local CG)} \\
    p_t &= \frac1m \sum_i p_i                                          &&\text{(allreduce 2)} \\
    \phi_k &= \frac1m \sum_i O_i(w_t - \alpha_k p_t),\quad
              \alpha_k = \text{backtrack}^k,\ k = 0, \dots, K-1          &&\text{(allreduce 3)} \\
    w_{t+1} &= w_t - \alpha_{k^*} p_t,\quad
              k^* = \min\{k : \phi_k \le O(w_t) - \text{armijo}\cdot\alpha_k\, g_t^\top p_t\}

with K = ``line_search_steps``.  The local Newton system is solved by conjugate gradient
on Hessian-vector products (`dane.numerics.linalg.cg`) to relative residual ``cg_tol`` or
``cg_max_iter`` products, so no d x d matrix is formed and sparse X stays sparse.  Each
:math:`H_i` is positive definite when O_i is strongly convex, so
:math:`g_t^\top p_t = \frac1m\sum_i g_t^\top H_i^{-1} g_t > 0`: p_t is a descent direction.

On a quadratic, with α = 1 accepted, :math:`w_{t+1} = w_t - \frac1m\sum_i H_i^{-1} g_t`,
which is DANE's closed-form round with η = 1 and μ = 0 (docs/design.md, "Counting rounds"): the same
iterates, at three allreduces per round instead of two.

With unequal shards :math:`H_i = \nabla^2 O_i` carries its shard's weight m n_i / N (`dane.problems.base`), not
the local sample mean (1/n_i) X_i^T D X_i + λI of the paper, whose shards are equal (where the two agree).

*Monotone globalization* (a departure from the paper, whose method takes some step
whatever happens: the smallest candidate where none meets the Armijo condition, which ``safeguard=false`` runs,
with every μ_i at 0 and no round rejected).  When no candidate meets the Armijo condition, the round is rejected:
w_{t+1} = w_t, and the next rounds solve the Levenberg-Marquardt systems
:math:`(H_i + \mu_i I) p_i = g_t`, one shift per worker.  A rejection is the case of a shard
whose Hessian misjudges the global one in some direction (a rare feature absent from the
shard): the averaged Newton direction is then far too long there, and the paper's method
diverges.  Which shard it is shows in allreduce 3, which carries beside the objective values
every worker's curvature :math:`c_i = u^\top H_i u` along u = p_t/‖p_t‖ (one Hessian-vector
product per worker), and so their mean :math:`\kappa = u^\top \nabla^2 O(w_t)\, u`, the
objective's.  The worker whose local model is flatter than O along p_t is the one that
made p_t too long there, and only it is shifted:

.. math::
    \mu_i \leftarrow \max(4\mu_i,\ \kappa - c_i) \quad\text{for every } i \text{ with } c_i < \kappa,

so that :math:`u^\top (H_i + \mu_i I) u \ge \kappa`: that local model is no longer
flatter than O along u (this per-worker rule is the package's, not the paper's).  The
others keep their μ_i, so where one shard lacks a feature the rest still take their own
Newton steps, where one shared shift large enough for that shard would damp every worker
along the near-null directions of an ill-conditioned H (tests/test_giant_stall.py measures
both on such a ridge).  A second rejection in a row (or one where every c_i is alike)
raises every μ_i to

.. math::
    \max\Big(4\mu_i,\ \frac{g_t^\top p_t}{\|p_t\|^2},\ \kappa,\
             \frac{\|g_t\|}{\text{backtrack}^K \|p_t\|}\Big),

the last a trust-region bound (Nocedal & Wright, *Numerical Optimization*, 2nd ed.,
Theorem 4.1: the trust-region step solves (B + μI)p = -g, a larger μ for a smaller radius).
Every step down to α_min‖p_t‖ = backtrack^(K-1)‖p_t‖ failed, so the trust radius is below
that; as :math:`\|(H_i + \mu I)^{-1} g\| \le \|g\|/\mu` for :math:`H_i \succeq 0` (and CG's
iterates from 0 grow in norm towards the solution's), the next direction is no longer than
backtrack·α_min‖p_t‖, the next rung of the ladder: repeated rejections shrink p by
backtrack^K per round at least, towards a short gradient step, which Armijo accepts.  (The
old rule, max(4μ, gᵀp/‖p‖²), took dozens of rejected rounds where a shard's H_i is nearly
singular along a rare feature, gᵀp/‖p‖² being then about λ, and never moved at λ = 0.)
Terms that are not finite are left out: at λ = 0 the local CG on a shard's singular,
inconsistent system returns nan or overflows; u is then the limit of p/‖p‖ (the signs of
the infinite entries), or g/‖g‖ when p is nan throughout.

With m > 1 workers an accepted step shorter than the full one also raises μ (the step is
kept: the averaged local models misjudge the global one, as a trust region shrinks on a
poor ratio): the workers with c_i < κ as above, or, when every c_i is alike, all of them to
max(4μ_i, g_tᵀp_t/‖p_t‖²).  A full step halves every μ_i (to 0 once below 1e-6 of the
first μ raised), so GIANT is itself wherever its full steps are safe.  Up by 4 and down by
2 are the trust-region radius updates of Nocedal & Wright (Algorithm 4.1), μ playing the
inverse radius: a slower way down keeps μ from oscillating between a value that cuts the
step and one a quarter of it, and keeping μ where a middle cut (backtrack or backtrack²)
left it would stall at steps of 1/2 along a direction that stays too long.  ``make bench``
(section ``defaults``) measures the rule against the grid of ``backtrack``.  On one worker
the local model is the global one (c_0 = κ) and a cut is the objective's own nonlinearity
(damped Newton's first phase), so there only rejected rounds and steps of ``backtrack^3``
or shorter raise μ: GIANT on one worker is Newton with a backtracking line search.  Every
worker holds the whole list μ_1..μ_m (the same everywhere, as elastic training needs); a new
world size starts every worker from the largest.  Near the optimum, where the predicted
decrease gᵀp is below the round-off of O, the full step is taken if it does not raise O
beyond that round-off.

Records carry ``step_size`` (α_{k*}; 0 on a rejected round), ``accepted``, ``mu`` (the
largest μ_i of the round), ``armijo_met``, ``cg_iters`` (the mean over workers of the local
CG products; it rides in allreduce 2) and ``p_norm``; a round that changes any μ_i also carries
``adapted`` ({"key": "algorithm.mu", "from", "to": the largest μ_i before and after, "trigger": "full step",
"flatter than objective", "step cut back" or "rejected", the cases above, "workers": [i, from, to] for each μ_i that
moved}), which the summary lists as ``adaptations``.

The curvature gᵀp/‖p‖² and the return to μ = 0 are DANE's safeguard's rules
(`dane.safeguard.model_curvature`, `dane.safeguard.to_floor`), GIANT's direction p being
DANE's step -s.

Other departures: the global objective O(w_t) the Armijo test compares with is the
logged metric that rides in allreduce 1 (no extra round); CG stops at a relative
residual rather than after a fixed number of iterations.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from dane import checks
from dane.algorithm import Algorithm, AlgorithmConfig, Column, metrics_message, metrics_received
from dane.comm import Communicator
from dane.errors import ConfigError
from dane.numerics.linalg import cg
from dane.numerics.local_solvers import FLAT_SLOPE, cg_products
from dane.problems import Problem
from dane.records.results import adaptation
from dane.safeguard_rules import model_curvature, to_floor

from .defaults import Resolution


SHORT_STEP = 3  # on one worker, an accepted step of backtrack^3 (1/8) or shorter raises μ as a rejection does
#: the monotone globalization's per-worker shifts, as the summary's ``adaptations_attached`` names them
SHIFTS = SimpleNamespace(name="shifts")


def armijo_step(objective: float, slope: float, steps: torch.Tensor, values: torch.Tensor,
                *, armijo: float) -> tuple[int, bool]:
    """Index of the first (largest) step with values[k] <= objective - armijo * steps[k] * slope.

    Returns (k, True), or (len(steps) - 1, False) when no step qualifies (nan and inf never do).
    """
    ok = values <= objective - armijo * steps * slope
    if bool(ok.any()):
        return int(ok.nonzero()[0]), True
    return len(steps) - 1, False


def unit(v: torch.Tensor) -> torch.Tensor:
    """v / ‖v‖, computed so that a v whose norm overflows still has one: its limit when v has infinite entries
    (their signs, the rest 0; nan counts as 0), else v scaled by max |v_j| first.  0 for v = 0."""
    v = torch.where(v.isinf(), v.sign(), 0.0) if bool(v.isinf().any()) else v.nan_to_num(nan=0.0)
    scale = v.abs().max()
    if not scale > 0:
        return torch.zeros_like(v)
    v = v / scale
    return v / torch.linalg.vector_norm(v)


def rejected_mu(mu: float, *, slope: float, g_norm: float, p_norm: float, curvature: float, shortest: float) -> float:
    """A worker's shift after a second rejected round in a row (or one where every local model is alike).

    The largest of 4μ; gᵀp/‖p‖², the local models' curvature along p; ``curvature`` = uᵀ∇²O u, the
    objective's along u = p/‖p‖; and ‖g‖ / (``shortest`` ‖p‖), which holds the next direction
    (‖(H_i + μI)⁻¹ g‖ ≤ ‖g‖/μ for H_i ⪰ 0) to ``shortest`` ‖p‖, a step shorter than every one that failed.
    A term that is not finite (p overflowed) is left out.
    """
    terms = [4 * mu, curvature]
    if p_norm > 0:
        terms += [model_curvature(-slope, p_norm ** 2), g_norm / (shortest * p_norm)]
    return max((t for t in terms if math.isfinite(t)), default=4 * mu)


class GIANT(Algorithm):
    name = "giant"
    label = "GIANT"
    elastic = True  # μ_i are rescaled to the new world size (`load_elastic_state`)
    synchronous_because = "GIANT averages Newton directions and line-searches at the same iterate"
    columns = (Column("mu", "{:>8.3g}"), Column("step_size", "{:>9.3g}"), Column("cg_iters", "{:>8.1f}"))

    def __init__(self, problem: Problem, comm: Communicator, *, cg_tol: float = 1e-10, cg_max_iter: int | None = None,
                 line_search_steps: int = 10, backtrack: float = 0.5, armijo: float = 1e-4, safeguard: bool = True,
                 w0: torch.Tensor | None = None, defaults: tuple[dict, ...] = ()):
        super().__init__(problem, comm, w0)
        for method, offered in (("hessian_vector", problem.hessian_vector), ("objective", problem.objective)):
            if offered is None:
                raise ConfigError(f"algorithm=giant needs {type(problem).__name__}.{method}; use another algorithm")
        self.cg_tol, self.cg_max_iter = cg_tol, cg_max_iter
        self.armijo, self.backtrack = armijo, backtrack
        self.steps = backtrack ** torch.arange(line_search_steps, dtype=torch.float64)  # α_k = backtrack^k
        self.mus = [0.0] * comm.size  # every worker's Levenberg-Marquardt shift μ_i (module docstring), on every worker
        self.mu_floor = 0.0           # below it, μ_i returns to 0: 1e-6 of the first μ raised
        self.rejected = False         # whether the last round was rejected
        self.defaults = tuple(defaults)  # the nulls resolved; the summary lists the shifts' changes (``adapted``)
        self.safeguard = safeguard     # False: the paper's round (module docstring), no shift and no rejection
        self.adaptations = (SHIFTS,) if safeguard else ()

    def step(self) -> dict[str, float]:
        w, m = self.w, self.comm.size
        if len(self.mus) != m:  # a new world size (elastic reset): every worker starts from the largest shift
            self.mus = [max(self.mus)] * m
        local_grad, local_metrics = self.problem.evaluate(w)
        parts, kinds = metrics_message(local_metrics, reads_objective=True)  # the line search starts from O(w_t)
        g, *means = self.comm.allreduce_mean([local_grad, *parts], kinds=(None, *kinds))  # 1. g = mean ∇O_i(w_t)
        metrics, _ = metrics_received(means, reads_objective=True)
        mu = self.mus[self.comm.rank]
        local = cg(lambda v: self.problem.hessian_vector(v, at=w) + mu * v, g,         # local: (H_i + μ_i I) p_i = g
                   rtol=self.cg_tol, max_iter=self.cg_max_iter)
        p, cg_iters = self.comm.allreduce_mean([local.x, g.new_tensor([local.iters])])  # 2. p = mean p_i
        steps = self.steps.to(w.dtype)
        u = unit(p)  # p/‖p‖, even when p overflowed
        if not bool(u.any()):  # p is nan throughout (CG on a singular system at μ = 0): the curvature along g
            u = unit(g)
        own = torch.zeros(m if self.safeguard else 0, dtype=w.dtype)  # the paper's round reads no curvature
        if self.safeguard:
            own[self.comm.rank] = u @ self.problem.hessian_vector(u, at=w)  # uᵀH_i u, in this worker's slot
        local_values = torch.cat([torch.stack([self.problem.objective(w - alpha * p) for alpha in steps]), own])
        (values,) = self.comm.allreduce_mean([local_values])          # 3. O(w - α_k p), every k; every uᵀH_i u
        values, curvatures = values[:len(steps)], (values[len(steps):] * m).tolist()
        objective, slope = float(metrics[0]), float(g @ p)
        k, met = armijo_step(objective, slope, steps, values, armijo=self.armijo)
        flat = abs(slope) <= FLAT_SLOPE * max(1.0, abs(objective))  # gᵀp below O's round-off: Armijo cannot tell
        accepted = met or (flat and float(values[0]) <= objective + FLAT_SLOPE * max(1.0, abs(objective)))
        if not self.safeguard:  # the paper's round: the first candidate that meets Armijo, else the smallest
            accepted = True
        elif accepted:
            k = k if met else 0
        if accepted:
            self.w = w - steps[k] * p
        before = list(self.mus)
        used = max(before)
        trigger = self.update_mus(accepted, k, curvatures, slope=slope, p=p, g=g) if self.safeguard else None
        moved = [[i, a, b] for i, (a, b) in enumerate(zip(before, self.mus)) if a != b]  # [worker, from, to]
        adapted = [adaptation("algorithm.mu", used, max(self.mus), trigger, workers=moved)] * bool(moved)
        return {**self.metrics(g, metrics), "step_size": float(steps[k]) if accepted else 0.0, "accepted": accepted,
                "mu": used, "armijo_met": met, "cg_iters": float(cg_iters),
                "p_norm": float(torch.linalg.vector_norm(p)), **({"adapted": adapted} if adapted else {})}

    def update_mus(self, accepted: bool, k: int, curvatures: list[float], *, slope: float, p: torch.Tensor,
                   g: torch.Tensor) -> str:
        """Every worker's next μ_i from the round's outcome (module docstring, *Monotone globalization*); returns
        which case it was, the trigger the record's ``adapted`` names where a μ_i changed."""
        kappa = sum(curvatures) / len(curvatures)               # uᵀ∇²O(w_t)u, the objective's curvature along p
        deficits = [kappa - c for c in curvatures]              # how much flatter than O each local model is along p
        lacking = any(d > 1e-12 * abs(kappa) for d in deficits)
        short = 1 if len(self.mus) > 1 else SHORT_STEP  # m > 1: any cut says the local models misjudge O
        if accepted and k == 0:  # the full step: the local models were right, regularize less
            self.mus, trigger = [to_floor(mu / 2, self.mu_floor) for mu in self.mus], "full step"
        elif accepted and k < short:  # a middle cut on one worker: the objective's own nonlinearity
            trigger = "short cut"
        elif lacking and not (self.rejected and not accepted):  # shift the local models flatter than O along p
            self.mus = [max(4 * mu, d) if d > 1e-12 * abs(kappa) else mu for mu, d in zip(self.mus, deficits)]
            trigger = "flatter than objective"
        elif accepted:  # cut back, every local model alike: regularize more
            p_sq = float(p @ p)
            self.mus = [max(4 * mu, model_curvature(-slope, p_sq)) if p_sq > 0 else 4 * mu for mu in self.mus]
            trigger = "step cut back"
        else:  # a second rejection in a row, or alike models: shorter than every step that failed
            p_norm, g_norm = float(torch.linalg.vector_norm(p)), float(torch.linalg.vector_norm(g))
            shortest = float(self.steps[-1]) * self.backtrack
            self.mus = [rejected_mu(mu, slope=slope, g_norm=g_norm, p_norm=p_norm, curvature=kappa, shortest=shortest)
                        for mu in self.mus]
            trigger = "rejected"
        if max(self.mus) > 0:
            self.mu_floor = self.mu_floor or 1e-6 * max(self.mus)
        self.rejected = not accepted
        return trigger

    def state_dict(self) -> dict:
        return {**super().state_dict(), "mus": list(self.mus), "mu_floor": self.mu_floor, "rejected": self.rejected}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.mus = list(state.get("mus", [state.get("mu", 0.0)] * self.comm.size))  # "mu": a checkpoint before μ_i
        self.mu_floor, self.rejected = state.get("mu_floor", 0.0), state.get("rejected", False)


@dataclass(frozen=True)
class GIANTConfig(AlgorithmConfig):
    cg_tol: float = 1e-10
    cg_max_iter: int | None = None
    line_search_steps: int = 10
    backtrack: float = 0.5
    armijo: float = 1e-4
    safeguard: bool = True
    name: str = "giant"
    algorithm = GIANT

    def __post_init__(self) -> None:
        checks.relative_tolerance("algorithm.cg_tol", self.cg_tol)
        if self.cg_max_iter is not None:
            checks.positive_int("algorithm.cg_max_iter", self.cg_max_iter)
        checks.positive_int("algorithm.line_search_steps", self.line_search_steps)
        if not 0 < checks.positive("algorithm.backtrack", self.backtrack) < 1:
            raise ConfigError(f"algorithm.backtrack must be in (0, 1), got {self.backtrack}")
        if not 0 < checks.positive("algorithm.armijo", self.armijo) < 1:
            raise ConfigError(f"algorithm.armijo must be in (0, 1), got {self.armijo}")
        checks.boolean("algorithm.safeguard", self.safeguard)

    def build(self, problem: Problem, comm: Communicator) -> "GIANT":
        """``cg_max_iter`` null: the package's CG cap, 10 d products (`cg_products`), noted in the summary."""
        resolution, cap = Resolution(), self.cg_max_iter
        if cap is None:
            cap = resolution.add("cg_max_iter", cg_products(problem), "cg_products", dim=problem.dim)
        return GIANT(problem, comm, cg_tol=self.cg_tol, cg_max_iter=cap, line_search_steps=self.line_search_steps,
                     backtrack=self.backtrack, armijo=self.armijo, safeguard=self.safeguard,
                     defaults=resolution.entries)
