r"""Every method's default rules: small pure functions of measured statistics, resolved before a method is built
(or, where the statistics ride in round 0's allreduce, in round 0: GD, AIDE, synchronous SGD).

A federated method (`baselines.federated`) takes numbers, as a torch optimizer does.  A key left ``null`` in its
config is filled in by its config's ``build`` before the algorithm exists: the statistics a rule reads are measured
first (`baselines.measure`: δ_A, ‖H‖ and the preconditioner gap, max_i L_i, a lower bound μ̲ of the strong
convexity; their communication is counted as the run's, before round 0), then the rule below turns them into the
number, and `Resolution` keeps (key, value, rule, statistics) for the run's first lines and ``summary.json``.

Each rule's docstring names its source: a paper, or "this package's rule" and the ``make bench`` section whose
measurements chose it (scripts/bench_defaults.py: section ``defaults``; scripts/bench_federated.py: ``federated``;
scripts/bench_sampled_lambda.py: ``sampled``).  The module-level constants are those rules' tuning constants; no
algorithm class holds one.  They are this package's heuristics, not the papers' numbers: each was chosen on the
cells of the section it names (the values tried there and how they failed are said beside it), not swept across
problem families, or is a round number no benchmark varied ("not swept").  Section ``defaults`` runs every default
beside the best setting of its own grid on every cell, so a constant that is wrong for a family shows there as a
ratio.  What adapts during a run (λ doubling, Acc-S-DANE's restart, the stops) is `baselines.adaptive`'s.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

# rules of the layers below, named here so that every rule a summary names is found in this module: InexactDANE's and
# AIDE's SVRG step, passes=auto and CG cap (the local solver's), the problem.* solver nulls a run's local solves used
# (local_solver=auto's choice, the CG and L-BFGS caps, SVRG's step and passes: `SolverNotes`; ridge_synthetic's
# factorization=auto; a network's inner_steps and inner_batch_size), split learning's cut=null (the smallest valid
# bottom); svrg_passes_at: what passes=auto ran, which `tighter` doubles
from dane.numerics.inner import one_pass_steps, whole_shard
from dane.numerics.local_solvers import LBFGS_MAX_ITER, LocalSolver, auto_local_solver, cg_products, svrg_passes_at
from dane.numerics.svrg import PASSES_AUTO, svrg_passes, svrg_step
from dane.problems.quadratic import auto_factorization
from dane.split.cut import cut_model

#: below 2 (a fixed step below 2/L decreases an L-smooth f): room for a Lanczos L short of λ_max, as GD's lr_factor
LANCZOS_STEP_FACTOR = 1.9
#: `lanczos_iters`: a quadratic up to this d runs its Lanczos to d products (exact); the dense local solves' limit
EXACT_SPECTRUM_MAX_DIM = 2000
#: `dissimilarity`: δ_A at least this times ‖H‖ (identical shards: δ_A = 0, and λ = 0 is no regularizer)
DISSIMILARITY_FLOOR = 1e-6
#: `balanced_prox_weight`'s balance for S-DANE, FedDANE (``make bench`` section ``defaults``: at 1/2, nearer the
#: spectral radius' minimizer at w_0, the default climbed on logistic cells whose Hessians move on the way)
GAP_BALANCE = 1.0
#: ... for Acc-S-DANE, whose extrapolation climbed at S-DANE's balance on the rare one-hot logistic cells (``defaults``)
ACC_GAP_BALANCE = 2.0
#: `prox_per_dissimilarity`'s floor of λ/δ_A, below the theory's λ = δ_A: the rounds at δ_A, δ_A/8, δ_A/32 and this
#: floor are the prox-weight table of paper_figs/evidence/federated_quadratic.json (docs/benchmarks.md), and the
#: default's against multiples of its own λ the federated line's defaults table (``defaults``)
PROX_PER_DISSIMILARITY = 1 / 512
#: `prox_per_dissimilarity`'s heterogeneity divisor for S-DANE, FedDANE, FedRed (``federated``: label skew over many
#: small clients, δ_A ≈ ‖H‖, diverged at δ_A/128 and δ_A/32)
HETEROGENEITY_DIVISOR = 16
#: ... for Acc-S-DANE, which diverged at S-DANE's on the Dirichlet cells of ``federated``
ACC_HETEROGENEITY_DIVISOR = 4
#: `sampled_prox_weight`'s factor for S-DANE, FedDANE, FedRed's DANE+ (``sampled``)
SAMPLED_PROX_PER_CURVATURE = 0.5
#: ... for Acc-S-DANE, whose extrapolation carries more of the sampled gradient's noise (``sampled --acc``)
ACC_SAMPLED_PROX_PER_CURVATURE = 1.0
#: `scaffold_server_step`'s η_g for an even K at the rule's local step
SERVER_STEP = 1.5
#: `fedred_local_steps`: K under full participation and the least under sampling (not swept) ...
FEDRED_LOCAL_STEPS = 10
#: ... and the most under sampling, a bound on a round's local work (1/(γλ_S) grows as 1/q without bound as s nears m;
#: not swept)
FEDRED_MAX_SAMPLED_STEPS = 100
#: ADIANA's θ₂, the weight of w^k in x^k (Li, Kovalev, Qian & Richtárik 2020: θ₂ = 1/2 in their theorems)
ADIANA_THETA2 = 0.5
#: AIDE's τ=auto (`spread_tau`): its first τ asks one DANE round on the augmented problem to shrink each column's error
#: by this factor (not swept)
COLUMN_CONTRACTION = 0.7
#: max_z |∂³f(z, y)/∂z³| of a linear model's loss (`cubic_constant`): the logistic loss's σ(1 − σ)(1 − 2σ) peaks at
#: 1/(6√3); the squared loss has a constant Hessian
THIRD_DERIVATIVE_BOUND = {"logistic": 1 / (6 * math.sqrt(3)), "squared": 0.0}


@dataclass
class Resolution:
    """The defaults a run resolved: one entry per ``null`` key, in the order resolved."""

    entries: list[dict[str, Any]] = field(default_factory=list)

    def add(self, key: str, value, rule: str, **stats) -> Any:
        """Note that ``algorithm.<key>`` was ``null`` (or ``auto``) and ``rule`` (the name of a function or constant of
        this module, `svrg_step`, `svrg_passes`, `cg_products` and `cut_model` among them, or "the problem's") set it
        to ``value`` from ``stats``; returns ``value``."""
        self.entries.append({"key": f"algorithm.{key}", "value": value, "rule": rule,
                             "stats": {k: v for k, v in stats.items() if v is not None}})
        return value


# --------------------------------------------------------------------------------------------- proximal weights
def dissimilarity(delta_mean_square: float, hessian_norm: float, floor: float = DISSIMILARITY_FLOOR) -> float:
    """δ_A = max(sqrt(mean_i ‖H_i − H‖₂²), ``floor``·‖H‖).  Source: the DANE line's theory (Jiang, Rodomanov &
    Stich 2024) takes λ = δ_A; the floor is this package's, so that identical shards still get a proximal term."""
    return max(delta_mean_square, floor * hessian_norm)


def prox_per_dissimilarity(delta_a: float, hessian_norm: float, divisor: float = HETEROGENEITY_DIVISOR) -> float:
    """λ/δ_A = max(`PROX_PER_DISSIMILARITY`, (δ_A/‖H‖)²/``divisor``).

    This package's rule (``make bench`` sections ``defaults`` and ``federated``), between two regimes: near the
    theory's δ_A/``divisor`` where the shards' Hessians differ as much as the global one is large (label skew),
    the floor where they differ little (iid shards, where λ = δ_A is a loose worst case)."""
    return max(PROX_PER_DISSIMILARITY, (delta_a / hessian_norm) ** 2 / divisor)


def balanced_prox_weight(weights: list[float], gaps: list[float], mu: float,
                         balance: float = GAP_BALANCE) -> float | None:
    r"""The λ where ``balance``·mean_i φ_i(λ) = λ/(μ + λ), interpolated in log λ between the octaves ``weights``
    (descending) where the two change side; the smallest weight if the gap stays below, None if it is above at the
    largest.  φ_i: `dane.numerics.similarity.preconditioner_gap`.

    This package's rule (``make bench`` section ``defaults``).  With exact local solves a round of S-DANE maps the
    error e to (I − M H)e near the optimum, M = mean_i (H_i + (r + λ)I)⁻¹; in the metric of K = H + (r + λ)I,
    M = K⁻¹ + K^{-1/2} G K^{-1/2} with ‖G‖ ≤ mean_i φ_i.  A stiff direction is left with about G, a flat one
    contracts by λ/(μ + λ) at worst: the first grows as λ falls, the second shrinks, and the rounds are fewest near
    where they meet."""
    flat = [lam / (mu + lam) if mu + lam > 0 else 1.0 for lam in weights]
    excess = [balance * g / f if f > 0 else math.inf for g, f in zip(gaps, flat)]  # ≤ 1: λ large enough
    if not excess[0] <= 1.0:
        return None
    for k in range(1, len(weights)):
        if excess[k] > 1.0:
            if not math.isfinite(excess[k]):
                return weights[k - 1]
            t = math.log(excess[k - 1]) / (math.log(excess[k - 1]) - math.log(excess[k])) if excess[k - 1] > 0 else 0.0
            return math.exp(math.log(weights[k - 1]) + t * (math.log(weights[k]) - math.log(weights[k - 1])))
    return weights[-1]


def sampling_variance_factor(s: int, m: int) -> float:
    """q = (m − s)/(s(m − 1)): E‖mean_S z_i − mean_i z_i‖² = q · mean_i ‖z_i − mean_j z_j‖² for s of m vectors drawn
    uniformly without replacement (0 at s = m, 1 at s = 1).  Source: sampling without replacement (textbook)."""
    return (m - s) / (s * (m - 1)) if m > 1 else 0.0


def sampled_prox_weight(lam: float, delta_a: float, hessian_norm: float, s: int, m: int,
                        per_curvature: float = SAMPLED_PROX_PER_CURVATURE) -> float:
    r"""max(λ, ``per_curvature``·q·(‖H‖ + 2δ_A)), q = `sampling_variance_factor`; λ itself at s = m.

    This package's rule (``make bench`` section ``sampled``).  Near w* a sampled round with exact solves is
    w⁺ − w* = (H + λI)⁻¹(λ(w − w*) − ξ), E‖ξ‖² = q ζ², so the objective's floor is at most q ζ²/(4λ): it falls as
    1/λ once λ exceeds the curvatures that carry the noise (the S-DANE paper's λ under partial participation grows
    with the sampling variance the same way).  ζ² is unknown before the run; the rule puts λ on the scale of the
    local problems' curvature ‖H‖ + 2δ_A, times q."""
    if s >= m:
        return lam
    return max(lam, per_curvature * sampling_variance_factor(s, m) * (hessian_norm + 2.0 * delta_a))


def prox_weight(delta_a: float, hessian_norm: float, *, balanced: float | None = None, s: int = 1, m: int = 1,
                divisor: float = HETEROGENEITY_DIVISOR,
                per_curvature: float = SAMPLED_PROX_PER_CURVATURE) -> float:
    """The default proximal weight (S-DANE's and Acc-S-DANE's λ, FedDANE's μ, DANE+'s λ): δ_A·`prox_per_dissimilarity`,
    the ``balanced`` weight (`balanced_prox_weight`, d ≤ 512) where that is smaller, then `sampled_prox_weight`.

    This package's rule (``make bench`` sections ``defaults`` and ``federated``): the balanced weight is far below
    the δ_A rule's on ill-conditioned iid shards, and the δ_A rule's goes further where label skew over many clients
    makes δ_A ≈ ‖H‖."""
    lam = delta_a * prox_per_dissimilarity(delta_a, hessian_norm, divisor)
    if balanced is not None:
        lam = min(balanced, lam)
    return sampled_prox_weight(lam, delta_a, hessian_norm, s, m, per_curvature)


# --------------------------------------------------------------------------------------------- local steps
def local_step(smoothness: float, shift: float = 0.0) -> float:
    """1/(L + shift): the gradient step on an (L + shift)-smooth local objective (O_i + (shift/2)‖·‖²,
    L = max_i L_i), which cannot increase it (Nesterov, *Introductory Lectures on Convex Optimization*, 2004,
    Theorem 2.1.14).  FedProx's and FedAvg's local steps, FedRed's γ, Scaffnew's γ, S-DANE's and FedDANE's
    ``local_solver=steps``."""
    return 1.0 / (smoothness + shift)


def strong_convexity_bound(l2: float, mean_lowest: float | None, *, exact: bool) -> float:
    """μ̲ ≤ μ: where ``mean_lowest`` is the mean of the H_i's exact smallest eigenvalues (``exact``: a quadratic's
    Hessians, their Lanczos run to d products, `lanczos_is_exact`), max(the ℓ2 weight, it) (λ_min is concave on
    symmetric matrices; source: Weyl); otherwise the ℓ2 weight alone.

    Neither other estimate bounds μ from below: a shorter Lanczos's smallest Ritz value lies above λ_min(H_i), and a
    non-quadratic problem's H_i here is its curvature majorant (`dane.problems.glm`: (m/N) c_f X_iᵀX_i + λI), whose
    λ_min bounds the curvature from above (the logistic loss's curvature falls towards 0 away from the data, so λ is
    the only strong convexity every point shares)."""
    return max(l2, mean_lowest) if exact else l2


def lanczos_is_exact(problem, iters: int) -> bool:
    """Whether ``iters`` Lanczos products give a quadratic's H_i's exact extreme eigenvalues: ``iters`` ≥ d (the
    Krylov space is then the whole space; `baselines.spectral.lanczos_extremes` reorthogonalizes fully)."""
    return bool(problem.quadratic) and iters >= problem.dim


def lanczos_iters(problem, power_iters: int) -> int:
    """The local Lanczos products a default's statistics take: ``power_iters``, or d on a quadratic of d ≤
    `EXACT_SPECTRUM_MAX_DIM`, whose extreme eigenvalues are then exact (`lanczos_is_exact`) and its μ̲ the mean
    λ_min(H_i), not the ℓ2 weight alone (`strong_convexity_bound`).  This package's rule: d local products, no
    communication, before round 0."""
    if problem.quadratic and power_iters < problem.dim <= EXACT_SPECTRUM_MAX_DIM:
        return int(problem.dim)
    return power_iters


def scaffold_local_step(smoothness: float, mu_low: float, local_steps: int, lr_factor: float) -> float:
    r"""SCAFFOLD's η_l = min(2/(L + μ̲), ``lr_factor``/L, 1/(K μ̲)) (no third bound at μ̲ = 0).

    This package's rule (``make bench`` section ``defaults``, rows ``scaffold*``): 2/(L + μ) is the fixed gradient
    step with the best rate on a μ-strongly convex L-smooth function (Nesterov 2004, Theorem 2.1.15), lr_factor/L
    keeps it below 2/L with room for a Lanczos L_i short of λ_max(H_i), and 1/(Kμ̲) keeps option II's K steps short
    of settling (where its control variate learns Kη_l L_i times more slowly).  The paper tunes η_l."""
    lr = gd_step(smoothness, mu_low, lr_factor)
    return min(lr, 1.0 / (local_steps * mu_low)) if mu_low > 0 else lr


def scaffold_server_step(local_steps: int, rule_step: bool) -> float:
    """SCAFFOLD's η_g: `SERVER_STEP` for an even K with `scaffold_local_step`'s η_l (``rule_step``), else the
    paper's 1.

    This package's rule (``make bench`` sections ``defaults`` and ``federated``), within the paper's theory (η_g ≥ 1):
    the K steps cover φ = 1 − (1 − η_l s)^K of a direction of curvature s, and the round contracts it by |1 − η_g φ|;
    for even K, φ ≤ 1 at every stable step, so η_g = 1.5 still halves the settled directions and moves the slow ones
    1.5 times as far.  For odd K the last step can overshoot (φ > 1) and η_g stays 1."""
    return SERVER_STEP if rule_step and local_steps % 2 == 0 else 1.0


def fedred_local_steps(step: float, sampled_weight: float, sampled: bool) -> int:
    """FedRed's K: `FEDRED_LOCAL_STEPS` under full participation; under sampling ⌈1/(γ λ_S)⌉ held between it and
    `FEDRED_MAX_SAMPLED_STEPS` (λ_S: `prox_weight` with the sampled floor).

    This package's rule (``make bench`` section ``sampled``, ``--fedred``): K steps of γ act on the slow directions as
    a proximal term of weight 1/(Kγ), so K = 1/(γλ_S) puts that weight where S-DANE's sampled default puts its λ."""
    if not sampled:
        return FEDRED_LOCAL_STEPS
    return min(FEDRED_MAX_SAMPLED_STEPS, max(FEDRED_LOCAL_STEPS, math.ceil(1.0 / (step * sampled_weight))))


def fedred_cv_weight(step: float | None, local_steps: int, p: float | None, lam: float) -> float:
    """FedRed's type-2 weight c: p/γ with gradient steps (p = 1/K for a fixed K), λ with a prox solver (``step``
    None).  Source: the FedRed paper's (Jiang, Rodomanov & Stich, ICML 2024) Scaffnew-like choice."""
    if step is None:
        return lam
    return (p if p is not None else 1.0 / local_steps) / step


def scaffnew_probability(mu_low: float, smoothness: float) -> float:
    """p = min(1, sqrt(μ/L)), which gives O(sqrt(L/μ) log 1/ε) communications (Mishchenko, Malinovsky, Stich &
    Richtárik 2022, Theorem 3.6), with μ̲ (`strong_convexity_bound`) for μ."""
    return min(1.0, math.sqrt(mu_low / smoothness))


def tighter(solver: LocalSolver, passes: int | None = None) -> LocalSolver:
    """The same local solver asked for more, for S-DANE's re-solve after a failed accuracy test: SVRG twice the passes
    the failed solve ran, ``passes`` (for ``passes=auto`` what it resolved to on the caller's shard at its weight,
    `dane.numerics.local_solvers.svrg_passes_at`; None: ``solver.passes``, a number), with no cap; a fixed count
    (CG or L-BFGS at ``tol=0``) twice its products per CG system or its iterations (null: `LBFGS_MAX_ITER`); else a
    100 times smaller tolerance.  This package's rule: the paper's test asks for an accuracy, not for a solver's
    settings; `baselines.adaptive.LocalRetry` applies it and records each round where it did."""
    if solver.method == "svrg":
        ran = solver.passes if passes is None else passes
        if ran == PASSES_AUTO:
            raise ValueError("tighter: an SVRG solve at passes=auto needs the passes it ran (svrg_passes_at)")
        return replace(solver, passes=2 * int(ran))
    if solver.tol == 0 and solver.method in ("cg", "lbfgs"):
        return replace(solver, max_iter=2 * (solver.max_iter or LBFGS_MAX_ITER))
    return replace(solver, tol=solver.tol / 100)


# --------------------------------------------------------------------------------------------- compressed first-order
def diana_shift_step(omega: float) -> float:
    """DIANA's shift step α = 1/(ω + 1), the largest its theory allows (α ≤ 1/(ω + 1)).  Source: Mishchenko,
    Gorbunov, Takáč & Richtárik 2019, and Horváth, Kovalev, Mishchenko, Stich & Richtárik 2019 (arXiv:1904.05115),
    whose DIANA theorem for μ-strongly convex, L-smooth f_i takes this α."""
    return 1.0 / (omega + 1.0)


def diana_step(smoothness: float, mu_low: float, omega: float, workers: int, alpha: float) -> float:
    r"""DIANA's γ = min(α/(2μ), 2/((L + μ)(1 + 6ω/m))) (no first bound at μ = 0), L = max_i L_i (the theorem takes
    every f_i L-smooth), μ = μ̲ (`strong_convexity_bound`).  Source: Horváth et al. 2019 (arXiv:1904.05115), the
    DIANA step for μ-strongly convex L-smooth f_i with full local gradients (σ = 0), the rule the FedNL paper's
    public code (Rustem-Islamov/FedNL-Public, ``diana``) runs DIANA with.  At ω = 0 it is 2/(L + μ), GD's best fixed
    step (Nesterov 2004, Theorem 2.1.15), which an L short of the true one (a Lanczos estimate is) would carry past
    2/L: as `baselines.gd`'s, the step is held at `LANCZOS_STEP_FACTOR`/L."""
    step = min(2.0 / ((smoothness + mu_low) * (1.0 + 6.0 * omega / workers)), LANCZOS_STEP_FACTOR / smoothness)
    return min(alpha / (2.0 * mu_low), step) if mu_low > 0 else step


def marina_probability(density: int, dim: int) -> float:
    """MARINA's p = ζ_Q/d, ζ_Q the compressor's expected number of nonzeros of a d-vector (K for RandK; d for a
    dense quantizer, where p = 1 makes MARINA GD).  Source: Gorbunov, Burlachenko, Li & Richtárik 2021, the p of
    their Corollary 2.1 (a full round then costs, in expectation, what a compressed one does)."""
    return density / dim


def marina_step(smoothness: float, smoothness_rms: float, omega: float, p: float, workers: int) -> float:
    r"""MARINA's γ = 1/(L₋ + L₊ sqrt((1 − p)ω/(p m))), L₋ the smoothness of f (here L̄ = mean_i L_i ≥ L₋, GD's bound)
    and L₊ = sqrt(mean_i L_i²).  Source: Gorbunov et al. 2021, Theorem 2.1 (its largest step)."""
    return 1.0 / (smoothness + smoothness_rms * math.sqrt((1.0 - p) * omega / (p * workers)))


def pp_marina_probability(density: int, dim: int, clients: int, workers: int) -> float:
    """PP-MARINA's p = ζ_Q r/(d m), r of the m clients sampled a compressed round (``clients_per_round``).  Source:
    Gorbunov, Burlachenko, Li & Richtárik 2021, the p of their Corollary 4.1 (a full round, m dense gradients, then
    costs in expectation what a compressed one does, r messages of ζ_Q entries)."""
    return density * clients / (dim * workers)


def pp_marina_step(smoothness: float, smoothness_rms: float, omega: float, p: float, clients: int) -> float:
    r"""PP-MARINA's γ = 1/(L₋ + L₊ sqrt((1 − p)(1 + ω)/(p r))), L₋ ≤ L̄ = mean_i L_i and L₊ = sqrt(mean_i L_i²) as in
    `marina_step`, r clients drawn uniformly with replacement.  Source: Gorbunov et al. 2021, Theorem 4.1 (its
    largest step); (1 + ω)/r in place of MARINA's ω/m bounds the variance of the mean of r i.i.d. draws of Q(Δ_i), each
    draw its own client and its own Q (`baselines.marina`: a client drawn twice sends two independent Q)."""
    return 1.0 / (smoothness + smoothness_rms * math.sqrt((1.0 - p) * (1.0 + omega) / (p * clients)))


def ef21_step(smoothness: float, smoothness_rms: float, delta: float) -> float:
    r"""EF21's γ = 1/(L + L̃ sqrt(β/θ)), θ = 1 − sqrt(1 − α), β = (1 − α)/(1 − sqrt(1 − α)), α = δ the contraction of
    the compressor (1/(ω + 1) for an unbiased one, used as C/(ω + 1)), L ≤ L̄ = mean_i L_i, L̃ = sqrt(mean_i L_i²).
    Source: Richtárik, Sokolov & Fatkhullin 2021, Theorem 1 (its largest step).  At δ = 1 (no compression) it is
    1/L̄."""
    root = math.sqrt(1.0 - delta)
    if root == 0.0:
        return 1.0 / smoothness
    theta, beta = 1.0 - root, (1.0 - delta) / (1.0 - root)
    return 1.0 / (smoothness + smoothness_rms * math.sqrt(beta / theta))


def ef21p_primal_step(smoothness: float, delta_down: float) -> float:
    r"""EF21-P's γ = α/(16L), α = δ_P the contraction of the model's compressor C_P (E‖C_P(x) − x‖² ≤ (1 − α)‖x‖²,
    their Definition 1.5), L ≤ L̄ = mean_i L_i the smoothness of f.  Source: Gruntkowska, Tyurin & Richtárik 2023
    (ICML), Theorem D.1, EF21-P with exact gradients at the compressed model (x ← x − γ∇f(w), w ← w + C_P(x − w),
    their (5)) on μ-strongly convex L-smooth f, its largest step."""
    return delta_down / (16.0 * smoothness)


def ef21p_step(smoothness: float, smoothness_rms: float, delta: float, delta_down: float) -> float:
    r"""EF21-P with an EF21 uplink (`baselines.ef21p`): min(`ef21_step` at δ, `ef21p_primal_step` at δ_P), δ of the
    uplink's compressor and δ_P of the model's; `ef21_step` alone where the downlink is exact (δ_P = 1: w = x, the
    method is EF21).  Each half is its paper's: at δ = 1 (an exact uplink, the paper's EF21-P of its (5)) it is their
    Theorem D.1's α/(16L), at δ_P = 1 EF21's Theorem 1 step.  The minimum of the two where both are compressed is this
    package's rule: Gruntkowska, Tyurin & Richtárik 2023 state their bidirectional theorems for DIANA (Theorem 5.1,
    γ ≤ min(n/(160ωL_max), α/(100L), 1/((ω+1)μ))) and DCGD uplinks, none for EF21's.  At δ = δ_P = 1 it is 1/L̄."""
    step = ef21_step(smoothness, smoothness_rms, delta)
    return step if delta_down >= 1.0 else min(step, ef21p_primal_step(smoothness, delta_down))


def hessian_learning_rate(omega: float | None) -> float:
    r"""FedNL's α, the clients' Hessian learning rate (H_i ← H_i + α C(∇²O_i − H_i)): 1/(ω + 1) for an unbiased C,
    1 for a contractive one (``omega`` None).  Source: Safaryan et al. 2022, FedNL's α options; in FedNL-Public's
    ``methods.py`` α = 1 for a contractive C is ``upd_rule=2``, the one its example notebook runs (its default,
    ``upd_rule=1``, is 1 − sqrt(1 − δ): `baselines.fednl.theoretical_alpha`).  Departure: FedNL-Public's FedNL-LS
    takes 0.5/(ω + 1) for an unbiased C; this rule is 1/(ω + 1) for every variant."""
    return 1.0 if omega is None else 1.0 / (omega + 1.0)


def model_learning_rate(omega: float | None) -> float:
    r"""FedNL-BC's η, the step of the clients' model toward the server's compressed shift (w ← w + η C_M(x − w)):
    1 for a contractive C_M (``omega`` None), 1/(ω + 1) for an unbiased one.  Source: Safaryan et al. 2022, FedNL-BC
    (FedNL-Public's ``iter_upd_rule`` 2 and 3; its rule 1, 1 − sqrt(1 − δ), is as small as FedNL's α of that form).
    The same numbers as FedNL's α (`hessian_learning_rate`), named apart as the summary records each rule."""
    return hessian_learning_rate(omega)


def adiana_probability(omega: float, workers: int) -> float:
    r"""ADIANA's p = min(1, max(1, sqrt(n/(32ω)) − 1)/(2(1 + ω))), the probability of w^{k+1} = y^k (1 at ω = 0).
    Source: Li, Kovalev, Qian & Richtárik 2020 (arXiv:2002.11364), the parameters of their strongly convex ADIANA
    theorem, as the FedNL paper's public code (Rustem-Islamov/FedNL-Public, ``adiana``) sets them:
    min(1, max(α/2, (α/2)(sqrt(n/(32ω)) − 1))), α = 1/(ω + 1)."""
    if omega == 0:
        return 1.0
    return min(1.0, max(1.0, math.sqrt(workers / (32.0 * omega)) - 1.0) / (2.0 * (1.0 + omega)))


def adiana_step(smoothness: float, omega: float, workers: int, p: float) -> float:
    r"""ADIANA's η = min(1/(2L), n/(64 ω L (2p(ω + 1) + 1)²)) (1/(2L) at ω = 0), L = max_i L_i (the theorem takes
    every f_i L-smooth).  Source: as `adiana_probability` (the same theorem; FedNL-Public's ``adiana``)."""
    step = 0.5 / smoothness
    if omega == 0:
        return step
    return min(step, workers / (64.0 * omega * smoothness * (2.0 * p * (omega + 1.0) + 1.0) ** 2))


def adiana_theta1(lr: float, mu: float, p: float) -> float:
    """ADIANA's θ₁ = min(1/4, sqrt(ημ/p)), the weight of z in x^k (θ₂ = `ADIANA_THETA2` that of w).  Source: as
    `adiana_probability` (the same theorem, which holds for μ > 0)."""
    return min(0.25, math.sqrt(lr * mu / p))


def adiana_gamma(lr: float, mu: float, theta1: float) -> float:
    """ADIANA's γ = η/(2(θ₁ + ημ)), the step of z.  Source: as `adiana_probability`."""
    return lr / (2.0 * (theta1 + lr * mu))


def adiana_beta(gamma: float, mu: float) -> float:
    """ADIANA's β = 1 − γμ, the weight of z^k in z^{k+1}.  Source: as `adiana_probability`."""
    return 1.0 - gamma * mu


def dasha_momentum(omega: float) -> float:
    """DASHA's a = 1/(2ω + 1) (1 at ω = 0, where DASHA is GD).  Source: Tyurin & Richtárik 2023 (DASHA,
    arXiv:2202.01268), Theorem 6.1, the gradient setting."""
    return 1.0 / (2.0 * omega + 1.0)


def dasha_step(smoothness: float, smoothness_rms: float, omega: float, workers: int) -> float:
    r"""DASHA's γ = 1/(L + sqrt(16ω(2ω + 1)/n) L̂), L the smoothness of f (here L̄ = mean_i L_i ≥ L, GD's bound) and
    L̂ = sqrt(mean_i L_i²).  Source: Tyurin & Richtárik 2023, Theorem 6.1 (the gradient setting, a = 1/(2ω + 1),
    g_i⁰ = h_i⁰ = ∇f_i(x⁰)), its largest step.  At ω = 0 it is 1/L̄."""
    return 1.0 / (smoothness + math.sqrt(16.0 * omega * (2.0 * omega + 1.0) / workers) * smoothness_rms)


def cubic_constant(third: float, mean_row_cubes: float) -> float:
    r"""FedNL-CR's cubic weight M = L_*, the Lipschitz constant of ∇²O for O(x) = (1/N)Σ_j f(a_jᵀx) + (λ/2)‖x‖²:
    ‖∇²O(x) − ∇²O(y)‖ ≤ (max|f⁽³⁾| / N) Σ_j ‖a_j‖³ ‖x − y‖, so M = ``third`` · ``mean_row_cubes``, ``third`` from
    `THIRD_DERIVATIVE_BOUND`.  Source: Safaryan, Islamov, Qian & Richtárik 2022 (FedNL-CR's model takes L_*), and
    FedNL-Public's ``FedNL_CR.get_M``, the same bound (c = 1/(6√3), the mean over nodes of each node's mean ‖a‖³:
    the mean over rows on equal shards)."""
    return third * mean_row_cubes


def nl1_step(k: int, rows: int) -> float:
    """NL1's coefficient step η_i = 1/(ω + 1) = K/n_i for RandK on a client's n_i coefficients (ω = n_i/K − 1), the
    largest NL1's theory takes for an unbiased compressor; at it a kept coefficient becomes α_j(x_k) exactly.  A K
    above n_i keeps all n_i (ω = 0, η_i = 1), as the round draws them.  Source: Islamov, Qian & Richtárik 2021 (NL1,
    η ≤ 1/(ω + 1)), and FedNL-Public's ``NL1`` (``eta = k/m``)."""
    return min(k, rows) / rows


# --------------------------------------------------------------------- the Newton-type family, ADMM, GD and SGD
def gd_step(smoothness: float, mu_low: float, lr_factor: float) -> float:
    """GD's lr = min(2/(L̄ + μ̲), ``lr_factor``/L̄), L̄ and μ̲ the mean local extreme Ritz values.  Source: 2/(L + μ) is
    the fixed step with the best linear rate on a μ-strongly convex L-smooth function (Nesterov 2004, Theorem
    2.1.15); the cap below 2/L̄ is this package's (`LANCZOS_STEP_FACTOR`; `baselines.gd` says why)."""
    return min(2.0 / (smoothness + mu_low), lr_factor / smoothness)


#: ADMM's ρ on a problem without Hessian-vector products (a network), where no spectrum can be read
NETWORK_PENALTY = 1.0


def admm_penalty(mu_low: float, L_bar: float) -> float:
    """ADMM's ρ = sqrt(μ̲ L̄), μ̲ floored at 1e-6 L̄ (a convex, not strongly convex, shard).  Source: Giselsson & Boyd
    2017 (the penalty that minimizes their linear-rate bound is sqrt(μ L)); the floor is this package's."""
    return math.sqrt(max(mu_low, 1e-6 * L_bar) * L_bar)


def residual_balancing(given: bool) -> bool:
    """ADMM's ``adaptive_rho``: residual balancing (Boyd et al. 2011, section 3.4.1) of a ρ the user gave (or
    `NETWORK_PENALTY`), none of `admm_penalty`'s, which is already the rate bound's minimizer."""
    return given


def self_concordance(quadratic: bool) -> float:
    """DiSCO's M: 0 on a quadratic (self-concordant with constant 0: the damped step is the Newton step), else the
    paper's 1 (Zhang & Xiao 2015, the standard self-concordant losses' constant after scaling)."""
    return 0.0 if quadratic else 1.0


def fednl_option(variant: str) -> int:
    """FedNL's step option: 1 (the projected Hessian [H]_μ) for FedNL-LS, whose line search is the paper's with it;
    otherwise 2 (H + l I, l the learned Hessians' error), this package's choice, because option 1 far from x* can
    take a long step along a direction the compressor left short (`baselines.fednl.FedNLConfig.recovery`)."""
    return 1 if variant == "ls" else 2


def spread_tau(local, mean, strong_convexity: float) -> float:
    """AIDE's τ_i = max(0, max_k (|D_k − D_ik| / ρ − D_ik) − λ), ρ = `COLUMN_CONTRACTION`, D_i worker i's column curvatures
    (tensors; D their mean): the least τ with |D_k − D_ik| ≤ ρ (D_ik + λ + τ) on every column, i.e. a DANE round on
    O + (τ/2)‖w − y‖² shrinking each coordinate's error by ρ.  This package's rule (`baselines.aide` says why; the
    paper tunes τ)."""
    if not local.numel():
        return 0.0
    need = ((mean - local).abs() / COLUMN_CONTRACTION - local).max()
    return max(0.0, float(need) - strong_convexity)


def sgd_steps_per_round(mean_rows: float, batch_size: int) -> int:
    """Synchronous SGD's steps a round: one pass over the mean shard, mean n_i // ``batch_size`` (at least 1), agreed
    by every worker (a worker's own n_i would leave the allreduces unpaired on unequal shards)."""
    return max(1, int(mean_rows // batch_size))
