r"""The μ safeguard's rules (`dane.safeguard`): small functions of the numbers one round measures, each with its
source in its docstring and a closed-form test in tests/test_safeguard_rules.py.  `dane.safeguard.MuSafeguard`
holds their state and applies them in order; its module docstring tells what each is for.
"""
from __future__ import annotations

import math

import torch

ROUND_OFF_STEP = 1e4  # ulps of the iterate: a quadratic's step at most this long does not measure δ

#: `mode`'s readings of two consecutive steps at one μ
FAST, OVERSHOOT, UNDERSHOOT, UNRESOLVED = "fast", "overshoot", "undershoot", "unresolved"


# ---------------------------------------------------------------- the grid and the scales
def snap(mu: float, steps_per_octave: int = 4) -> float:
    """The nearest 2^(k/steps_per_octave) to μ, in log scale (0 stays 0).

    On this grid (within 9% of any μ) the local solver reuses its factorization whenever
    μ returns to a value it had.  Nearest rather than upward rounding: rounding up cost
    extra rounds on the synthetic grid (tests/test_dane.py's full-grid test).
    """
    if mu <= 0 or not math.isfinite(mu):
        return mu
    return 2.0 ** (round(steps_per_octave * math.log2(mu)) / steps_per_octave)


def round_off_sq(w: torch.Tensor) -> float:
    """‖s‖² at or below which a step s from w is round-off (`ROUND_OFF_STEP` ulps of w): its y_i are noise.

    Source: the unit round-off of floating point, eps‖w‖ (Higham, *Accuracy and Stability*, section 2.2)."""
    return (ROUND_OFF_STEP * torch.finfo(w.dtype).eps) ** 2 * float(torch.linalg.vector_norm(w).square())


def model_curvature(slope: float, step_sq: float) -> float:
    """κ = -gᵀs/‖s‖² (``slope`` = gᵀs): the curvature along s of the model A that gave the step s = -A⁻¹g.

    Source: the Rayleigh quotient sᵀAs/‖s‖² with As = -g.  GIANT reads its local models' curvature
    along p = -s the same way (gᵀp/‖p‖²)."""
    return -slope / step_sq


def to_floor(mu: float, negligible: float, floor: float = 0.0) -> float:
    """``floor`` once μ is below ``negligible`` (a scale's small fraction), else μ: the method is itself again.

    Source: the package's (DANE: 1e-3 of the curvature along the step; GIANT: 1e-6 of its first μ)."""
    return floor if mu < negligible else mu


# ---------------------------------------------------------------- the guard and the δ rule
def finite_trial(step_sq: float, grad_change_sq: float, objective: float) -> bool:
    """Whether a trial measured anything: its step ‖s‖², gradient change ‖g_{t+1} - g_t‖² and objective all finite.

    A trial that is not (a local solve that diverged or overflowed) is rejected, and none of its numbers enters a
    rule: a nan compares false and an inf divides to 0 or nan, so each rule would read it as something it is not
    (a μ of nan, a spread or curvature of 0).  Source: the package's."""
    return math.isfinite(step_sq) and math.isfinite(grad_change_sq) and math.isfinite(objective)


def accepts(objective: float, reference: float, tol: float) -> bool:
    """Whether O(w_{t+1}) ≤ reference + tol·|reference| (False for nan and inf).

    Source: a trust region's acceptance test with threshold 0 (Nocedal & Wright, *Numerical
    Optimization*, Algorithm 4.1); non-convex, the reference is the lowest accepted objective."""
    return objective <= reference + tol * abs(reference)


def spread_along_step(local_sq: float, global_sq: float, step_sq: float, curvature: float) -> float | None:
    """δ·min(1, δ/κ) with δ² = (mean_i ‖y_i‖² − ‖y‖²)/‖s‖² (``local_sq``, ``global_sq``), κ = ``curvature``.

    Source: the package's (the variance of the y_i about their mean, module docstring, *Spread*).
    None when the difference of the two is not finite (nothing measured)."""
    spread_sq = local_sq - global_sq
    if not math.isfinite(spread_sq):
        return None
    delta = math.sqrt(max(spread_sq, 0.0) / step_sq)
    if curvature > 0:  # a deviation small against the curvature needs only δ²/κ
        delta *= min(1.0, delta / curvature)
    return delta


def remembered_spread(spread: float, delta: float, decay: float = 1.0) -> float:
    """max(decay·spread, δ): the largest δ seen (decay 1, convex) or a decaying maximum (non-convex).

    Source: the package's."""
    return max(decay * spread, delta)


def delta_rule(spread: float, *, boost: float, scale: float) -> float:
    """The δ rule's μ, on the grid: snap(boost · scale · spread).  Source: the package's (module docstring)."""
    return snap(boost * scale * spread)


def next_boost(boost: float, *, accepted: bool, rule_failed: bool, grow: float, shrink: float | None) -> float:
    """``boost`` × ``grow`` when the δ rule's own μ was rejected; ÷ ``shrink`` down to 1 on an acceptance
    (``shrink`` None: kept).  Source: a trust region's radius update (Nocedal & Wright, Algorithm 4.1)."""
    if accepted:
        return boost if shrink is None else max(1.0, boost / shrink)
    return boost * grow if rule_failed else boost


# ---------------------------------------------------------------- the convex rule's readings of the steps
def step_ratio_and_cosine(step: torch.Tensor, previous: torch.Tensor, step_sq: float) -> tuple[float, float]:
    """(‖s_t‖/‖s_{t-1}‖, cos(s_t, s_{t-1})), ``step_sq`` = ‖s_t‖².  Source: the power method's reading of
    the dominant eigenvalue of I - M from consecutive iterates (Golub & Van Loan, section 7.3)."""
    norm = float(torch.linalg.vector_norm(previous))
    return math.sqrt(step_sq) / norm, float(step @ previous) / (math.sqrt(step_sq) * norm)


def settled(ratio: float, previous: float | None, settle: float) -> bool:
    """Whether a contraction ``ratio`` < 1 and the one before it at the same μ agree within ``settle`` (relative).

    Source: the package's (a power iteration has converged once its ratio stops moving)."""
    return previous is not None and ratio < 1.0 and abs(ratio / previous - 1.0) <= settle


def slow_ratio(is_settled: bool, mu: float, cosine: float, *, contraction: float, settled_contraction: float,
               turn: float) -> float:
    """The step ratio above which a step is slow: ``settled_contraction`` for a settled ratio at μ = 0 or on an
    undershoot (cosine > ``turn``), else ``contraction``.

    The ratio rises while the slowest mode emerges from the others, so an unsettled one understates it and a
    jump on it lands low and needs another μ (another factorization); a settled one is that mode's own rate.
    A settled overshoot at μ > 0 is left alone: after the balanced jump both extreme modes are meant to
    contract at that rate.  Source: the package's."""
    return settled_contraction if is_settled and (mu <= 0 or cosine > turn) else contraction


def mode(ratio: float, cosine: float, *, slow: float, turn: float) -> str:
    """How two consecutive steps read: `FAST` (ratio ≤ ``slow``, or nan), `OVERSHOOT` (cosine < -``turn``),
    `UNDERSHOOT` (cosine > ``turn``), `UNRESOLVED` (ratio > 0.5 with no dominant mode), else `FAST`.

    Source: sign-based step-size adaptation (Jacobs' delta-bar-delta, 1988; Rprop): the sign of consecutive
    steps of e_{t+1} = (I - M)e_t is the sign of the dominant eigenvalue of I - M."""
    if not ratio > slow:  # contracting fast enough (nan too: keep what works)
        return FAST
    if cosine < -turn:
        return OVERSHOOT
    if cosine > turn:
        return UNDERSHOOT
    if ratio > 0.5 and abs(cosine) <= turn:
        return UNRESOLVED
    return FAST


def balanced_damping(r: float) -> float:
    r"""μ/κ that balances the slowest overshooting and undershooting modes after plain DANE overshot by r.

    At μ = 0, M = (1/m)Σ_i (H_i + μI)⁻¹H = I + (1/m)Σ_i (H⁻¹E_i)² + O(E³) with
    E_i = H_i - H (their mean is 0), and each (H⁻¹E_i)² is similar to a positive
    semidefinite matrix, so to second order every mode overshoots, by amounts from about 0
    to the measured r.  In a one-dimensional model of a mode with global curvature κ and
    local curvature κ_i ∈ [κ/(1 + r), κ], μ = uκ turns its eigenvalue κ/(κ_i + μ) of M
    into an error 1 - κ/(κ_i + μ); the extremes are equal and opposite when

    .. math:: u^2 + a u - \tfrac{1 - a}{2} = 0, \qquad a = \frac{1}{1 + r},

    and both then contract by u/(1 + u) per round.  Removing the worst mode exactly,
    u = r/(1 + r), would leave the least overshooting mode at r/(1 + 2r), more than that.
    Source: the package's (the minimax damping of Chebyshev's two-point problem).
    """
    a = 1.0 / (1.0 + r)
    return 0.5 * (math.sqrt(a * a + 2.0 * (1.0 - a)) - a)


def undamp(mu: float, ratio: float, curvature: float, floor: float) -> float:
    """μ that ends a settled undershoot: the slowest mode's eigenvalue κ/(κ_i + μ) of M is 1 - ρ (ρ = ``ratio``,
    κ = ``curvature`` along the step), so μ' = μ - κρ/(1 - ρ) makes it 1; on the grid, not below ``floor``.

    Source: the package's (one mode of the linear iteration, module docstring)."""
    return max(floor, snap(mu - max(curvature, 0.0) * ratio / (1.0 - ratio)))


def halfway_mu(mu: float, rule: float, floor: float) -> float:
    """Halfway in log scale from μ to the δ rule's ``rule`` (the rule itself from μ = 0), not below ``floor``.

    Source: the package's."""
    if mu > 0 and rule > 0:
        return max(floor, snap(math.sqrt(mu * rule)))
    return max(floor, rule)


def rprop_octaves(octaves: float, direction: int, last_move: int) -> float:
    """The next move of log2 μ: halved on a reversal (down to a quarter octave), doubled on two moves the same
    way (up to 2 octaves).  Source: Rprop (Riedmiller & Braun, 1993), whose step halves on a sign change."""
    if direction == -last_move:
        return max(0.25, octaves / 2)
    if direction == last_move:  # the same way again: back towards the full move
        return min(2.0, octaves * 2)
    return octaves


def moved_mu(mu: float, direction: int, octaves: float, *, start: float, floor: float) -> float:
    """μ·2^(direction·octaves) on the grid, not below ``floor``; from μ ≤ 0 (plain DANE) up: ``start``, the first
    scale measured.  Source: Rprop's multiplicative step (Riedmiller & Braun, 1993)."""
    if mu <= 0:
        return max(floor, start)
    return max(floor, snap(mu * 2.0 ** (direction * octaves)))


def shortening_mu(mu: float, slope: float, step_sq: float, before: float, after: float) -> float:
    r"""The μ that shortens a rejected step s to the best length of a quadratic model along it.

    The quadratic through φ(0) = O(w), φ'(0) = gᵀs and φ(1) = O(w + s) has its minimum at
    α* = -φ'(0) / (2(φ(1) - φ(0) - φ'(0))) (the interpolation step of a line search,
    Nocedal & Wright, Numerical Optimization, section 3.5).  The step came from a local
    system s = -A⁻¹g with A ≈ H_i + μI; along s its curvature is κ = -gᵀs/‖s‖²
    (`model_curvature`), and μ' scales the step along s by κ/(κ + μ' - μ), so the step of
    length α*‖s‖ needs

    .. math:: μ' = μ + κ (1/α^* - 1).

    0 when the model says nothing (no descent slope, an objective that did not rise, nan or
    inf): the ×4 rule then acts alone.
    """
    rise = after - before - slope
    if not (slope < 0 and after > before and step_sq > 0 and math.isfinite(after)):
        return 0.0
    alpha = -slope / (2.0 * rise)  # below 1/2: the objective rose
    return snap(mu + model_curvature(slope, step_sq) * (1.0 / alpha - 1.0))


def after_rejection(mu: float, mu_used: float, short: float) -> float:
    """μ after a rejected step taken with ``mu_used``: the shortening μ ``short`` alone from μ = 0 when the model
    gives one (read off the step that failed, where the δ rule only scales the shards' spread by a constant),
    else the larger of the rule's μ ``mu`` and it.  Source: the package's."""
    return short if mu_used <= 0 < short else max(mu, short)


def curvature_scale_mu(scale: float, grad_change_norm: float, step_sq: float) -> float:
    """snap(scale·‖g_{t+1} - g_t‖/‖s‖): a first μ on the scale of the curvature along the step, when nothing
    else has measured one; 0 where the secant is not a finite number (a step that is 0 or not finite, a gradient
    change that is not finite: no scale measured, `gives_up`).  Source: the secant estimate of the curvature
    (Nocedal & Wright, section 6.1)."""
    if not (0 < step_sq < math.inf and math.isfinite(grad_change_norm)):
        return 0.0
    return snap(scale * grad_change_norm / math.sqrt(step_sq))


#: `gives_up`: non-finite trials in a row after which the safeguard stops the run
NON_FINITE_TRIALS = 5


def gives_up(mu: float, non_finite: int, limit: int = NON_FINITE_TRIALS) -> bool:
    """Whether the safeguard stops the run after ``non_finite`` trials in a row that were not finite (`finite_trial`),
    μ being what the rules made of the last one: a μ of 0 (nothing measured to scale it by: the next trial, from
    the same point with the same μ, is this one again, up to an SVRG solve's draws) or not finite, or ``limit``
    such trials in a row.  Each raised μ where the convex rule moves it (`moved_mu`: up to 2 octaves a move); a
    local solve that still fails that far up is not the proximal weight's to fix: the local solver's own step or
    DANE's η is (a larger μ makes a given SVRG step γ less stable: its factor 1 - γ(λ + μ) on the iterate falls
    below -1 once γ(λ + μ) > 2).  Source: the package's."""
    return non_finite > 0 and (not 0 < mu < math.inf or non_finite >= limit)
