r"""DANE's μ safeguard: small rules over scalars, and `MuSafeguard`, which holds their state.

Each rule below is a plain function of the numbers one round measures, with its source
in its docstring and a closed-form test in tests/test_safeguard_rules.py.  `MuSafeguard`
holds the memory they need between rounds and applies them in the order of
`MuSafeguard.review`.

*Guard.* An averaged iterate is accepted only if the global objective did not increase
(up to ``rtol``; nan and inf are rejected: `accepts`).  On a rejection the worker returns
to the last accepted iterate, whose gradients it kept, and redoes the local solve with a
larger μ.  With a convex objective and exact local solves a large enough μ makes the step
a descent step, so the run cannot diverge.

*Spread.* Along the step s = w_{t+1} - w_t each worker knows
y_i = ∇O_i(w_{t+1}) - ∇O_i(w_t) ≈ H_i s, and the mean of the y_i is the global
y = g_{t+1} - g_t.  The root-mean-square deviation of the local curvatures along s,

.. math:: \delta^2 = \frac{\tfrac1m\sum_i \|y_i\|^2 - \|y\|^2}{\|s\|^2}
          = \frac{\tfrac1m \sum_i \|(H_i - H)s\|^2}{\|s\|^2},

costs one scalar that rides in the round's first allreduce; a deviation small against the
curvature κ = sᵀy/‖s‖² counts as δ²/κ (`spread_along_step`).  The δ rule is
μ = snap(boost · scale · spread), spread = max_t δ_t (`delta_rule`; scale 0.4, on a grid
of four values per octave, `snap`).

*Convex problems: μ moves both ways, on evidence* (a trust region's radius, read off the
steps).  μ starts at the configured floor (0: plain DANE) and changes only when the steps
say so, by factors of 2 to 4 on the grid, so it revisits few values and an exact local
solver reuses its factorizations:

- a rejected step: μ up (`moved_mu`), or to `shortening_mu` when that is larger, the μ that
  shortens the step to the best length of a quadratic model along it; from μ = 0 the
  shortening μ alone (`after_rejection`).  μ never again comes down to a rejected value
  (on a non-quadratic that memory fades, ÷4 per accepted round);
- an accepted step that contracts slowly (`slow_ratio`) is read by the cosine of
  consecutive steps (`step_ratio_and_cosine`, `mode`).  On a quadratic the error obeys
  e_{t+1} = (I - M)e_t with M = (1/m)Σ_i η(H_i + μI)⁻¹H, and the slowest mode dominates
  the steps: an overshoot (an eigenvalue of M above 1) moves μ up, from 0 to
  `balanced_damping`; an undershoot moves it down (`undamp` once the ratio has `settled`,
  `to_floor` when negligible); slow with no dominant mode, halfway to the δ rule
  (`halfway_mu`).  The moves are Rprop's (`rprop_octaves`): a reversal halves the move, so
  μ settles between the values it bounced off;
- a step that contracts fast, or a step at round-off (`round_off_sq`, where the y_i are
  noise), leaves μ alone.

Sources: the accept/reject step is the classic trust-region (Levenberg–Marquardt)
safeguard; reading over- and undershoot from the sign of consecutive steps is the idea of
sign-based step-size adaptation (Jacobs' delta-bar-delta, 1988; Rprop).  How far it stays
from the best fixed μ is measured by ``make bench`` (section ``defaults``) and asserted on
small instances in tests/test_dane.py.

*Non-convex problems* (``convex=False``, from the problem's ``convex`` attribute: networks
other than the logistic model) keep the δ rule, made to follow the current landscape:
an iterate is accepted if its objective is at most ``(1 + slack)`` times the lowest
accepted one (slack = 0.25: the loss of a network trained by an inexact, minibatch local
solver rises now and then and comes back down; nan and inf are still rejected);
``boost`` is divided by ``shrink`` (2) after an accepted round, down to 1 (`next_boost`);
the spread decays by ``decay`` (0.5) a round (`remembered_spread`).  This is a trust region
that keeps the objective bounded, not a descent method; tests/test_neural.py compares test
accuracy with the safeguard on and off.

*Shared with GIANT* (`baselines.giant`): `model_curvature`, the local models' curvature
along a step read from its slope, and `to_floor`, a μ negligible against its scale going
back to the floor.  GIANT's other moves (×4 up, ÷2 down, per worker) are a trust region's
radius updates without a grid: its local solver is CG, with no factorization to reuse, and
it tests each step by a line search, not by one accept/reject.  ADMM's penalty updates
(`baselines.admm`) share none of these rules: ρ needs no safeguard (ADMM converges for
every ρ > 0), residual balancing equalises two residuals rather than testing a step, and
its refresh is a spectral estimate, not evidence from the steps.
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
    else has measured one.  Source: the secant estimate of the curvature (Nocedal & Wright, section 6.1)."""
    return snap(scale * grad_change_norm / math.sqrt(step_sq))


# ---------------------------------------------------------------- the state and the order
class MuSafeguard:
    r"""Choose μ from evidence about the steps, and never accept an ascent (the module docstring: the rules).

    The state: the last accepted iterate with its gradients and objective (``accepted``), the
    spread and ``boost`` of the δ rule, the lowest accepted objective (``best``, non-convex),
    and for the convex rule the last accepted step and its μ, the largest rejected μ, the last
    step ratio and the Rprop move (``octaves``, ``last_move``).  `review` applies the rules in
    this order:

    1. spread: δ along the step (`spread_along_step`), kept by `remembered_spread`; not from a
       step at round-off, unless the spread forgets;
    2. guard: `accepts` (non-convex: against the lowest accepted objective, with ``slack``);
    3. boost: `next_boost`;
    4. μ, convex: a rejection moves up (`moved_mu`) and then `after_rejection` with
       `shortening_mu`; an acceptance reads the two last steps at one μ (`mode`) and moves up,
       down (`undamp` when settled) or halfway to the δ rule.  Non-convex: the δ rule, not
       below the floor;
    5. a rejection that left μ = 0: `curvature_scale_mu`.

    ``forget`` (default: not convex; DANE sets it for every non-quadratic problem) makes the
    spread decay and the memory of rejected μ fade, as the Hessians move with w.
    """

    def __init__(self, mu: float, *, scale: float = 0.4, grow: float = 4.0, rtol: float = 1e-12,
                 convex: bool = True, forget: bool | None = None, slack: float = 0.25, shrink: float = 2.0,
                 decay: float = 0.5, contraction: float = 0.25, settled_contraction: float = 0.1,
                 settle: float = 0.1, turn: float = 0.3, negligible: float = 1e-3):
        self.contraction, self.turn, self.negligible = contraction, turn, negligible
        self.settled_contraction, self.settle = settled_contraction, settle
        self.mu_floor = self.mu = mu
        self.scale, self.grow, self.rtol = scale, grow, rtol
        self.convex, self.slack, self.shrink, self.decay = convex, slack, shrink, decay
        self.forget = (not convex) if forget is None else forget
        self.boost = 1.0
        self.spread = 0.0  # max_t δ_t (convex); a decaying max (non-convex)
        self.best = math.inf  # lowest accepted objective (non-convex only)
        self.accepted: tuple | None = None  # (w, ∇O_i(w), g, metrics) of the last accepted iterate
        self.last_step: torch.Tensor | None = None  # s_{t-1}, the last accepted step (convex rule)
        self.last_step_mu = math.nan  # the μ that step was taken with
        self.rejected_mu = -1.0  # the largest μ whose step was rejected (convex rule: μ stays above it)
        self.octaves, self.last_move = 2.0, 0  # the convex rule's next move of log2 μ, and the last one's sign
        self.last_ratio: float | None = None  # ‖s_{t-1}‖/‖s_{t-2}‖, both at the last μ (convex rule: has the rate settled?)

    def local_stats(self, w: torch.Tensor, local_grad: torch.Tensor) -> torch.Tensor:
        """‖∇O_i(w) - ∇O_i(w_accepted)‖², this worker's share of δ²; fused into allreduce 1."""
        if self.accepted is None:  # over the trailing axis: one per worker, also for stacked workers (dane.comm.batched)
            return local_grad.new_zeros(local_grad.shape[:-1] + (1,))
        return torch.linalg.vector_norm(local_grad - self.accepted[1], dim=-1).square().unsqueeze(-1)

    def review(self, w, local_grad, g, metrics, stats):
        """Returns the point to solve from (the new iterate, or the last accepted one) and log extras."""
        if self.accepted is None:
            self.accepted = (w, local_grad, g, metrics)
            return w, local_grad, g, metrics, {"accepted": True}
        w0, _, g0, metrics0 = self.accepted
        step, grad_change = w - w0, g - g0
        step_sq = float(torch.linalg.vector_norm(step).square())
        round_off = round_off_sq(w0)
        # 1. spread
        if step_sq > (0.0 if self.forget else round_off):  # a forgetting spread keeps no noise for long
            curvature = float(step @ grad_change) / step_sq
            delta = spread_along_step(float(stats[0]), float(torch.linalg.vector_norm(grad_change).square()),
                                      step_sq, curvature)
            if delta is not None:
                self.spread = remembered_spread(self.spread, delta, self.decay if self.forget else 1.0)
        # 2. guard
        objective, best = float(metrics[0]), float(metrics0[0])
        if not self.convex:
            self.best = min(self.best, best)
        accepted = self.would_accept(objective)
        mu_used = self.mu
        if accepted:
            self.accepted = (w, local_grad, g, metrics)
        # 3. boost: the rule's own μ failed (compared on the grid: a μ rounded down is still the rule's);
        # a rejected μ below it is explained by δ.  Either way the next μ is larger.
        self.boost = next_boost(self.boost, accepted=accepted, rule_failed=mu_used >= self._rule(), grow=self.grow,
                                shrink=self.shrink if self.forget and not self.convex else None)
        # 4. μ
        if self.convex:
            self.mu = self._convex_mu(accepted, mu_used, step, grad_change, step_sq, round_off)
            if not accepted:  # the step was too long: at least the μ that shortens it to the model's best length
                short = shortening_mu(mu_used, float(g0 @ step), step_sq, best, objective)
                self.mu = after_rejection(self.mu, mu_used, short)
        else:
            self.mu = max(self.mu_floor, self._rule())
        # 5. no spread measured yet: start from the curvature scale
        if not accepted and self.mu == 0.0:
            self.mu = curvature_scale_mu(self.scale, float(torch.linalg.vector_norm(grad_change)), step_sq)
        return (*self.accepted, {"accepted": accepted, "spread": self.spread})

    def would_accept(self, objective: float) -> bool:
        """The guard's verdict (`accepts`) on an iterate with global objective ``objective``, state unchanged:
        convex, against the last accepted objective; non-convex, against the lowest accepted one with ``slack``.
        True before any iterate was accepted.  `review` applies it; a run's final evaluation asks it too
        (`dane.dane.DANE.evaluate`), so that a run never ends on a trial the next round would reject."""
        if self.accepted is None:
            return True
        best = float(self.accepted[3][0])
        if self.convex:
            return accepts(objective, best, self.rtol)
        return accepts(objective, min(self.best, best), max(self.rtol, self.slack))

    def _convex_mu(self, accepted: bool, mu_used: float, step: torch.Tensor, grad_change: torch.Tensor,
                   step_sq: float, round_off_sq: float) -> float:
        """The convex rule: μ moves only on evidence, up on a rejection or an overshoot, down on an undershoot."""
        if not accepted:
            self.rejected_mu = max(self.rejected_mu, mu_used)
            return self._move(mu_used, +1, start=self._rule())
        previous, previous_mu = self.last_step, self.last_step_mu
        self.last_step, self.last_step_mu = step, mu_used
        if self.forget:  # the Hessians move with w: a rejection far from here says less and less
            self.rejected_mu /= self.grow
        if previous is None or previous_mu != mu_used or step_sq <= round_off_sq:
            self.last_ratio = None
            return mu_used  # evidence needs two steps with this μ (a change of μ leaves a transient); none at round-off
        ratio, cosine = step_ratio_and_cosine(step, previous, step_sq)
        is_settled, self.last_ratio = settled(ratio, self.last_ratio, self.settle), ratio
        slow = slow_ratio(is_settled, mu_used, cosine, contraction=self.contraction,
                          settled_contraction=self.settled_contraction, turn=self.turn)
        reading = mode(ratio, cosine, slow=slow, turn=self.turn)
        if reading == FAST:
            return mu_used
        curvature = float(step @ grad_change) / step_sq
        if reading == OVERSHOOT:  # overshoot along the slowest direction: more damping
            return self._move(mu_used, +1, start=snap(balanced_damping(ratio) * max(curvature, 0.0)))
        if reading == UNDERSHOOT:  # less damping, not down to a rejected μ
            if mu_used <= self.mu_floor:
                return mu_used
            lower = self._undamp(mu_used, ratio, curvature) if is_settled else self._move(mu_used, -1)
            return mu_used if lower <= self.rejected_mu else to_floor(lower, self.negligible * curvature, self.mu_floor)
        return halfway_mu(mu_used, self._rule(), self.mu_floor)  # slow, and no single slow direction

    def _undamp(self, mu: float, ratio: float, curvature: float) -> float:
        """`undamp` from ``mu``; a move down."""
        self.last_move = -1
        return undamp(mu, ratio, curvature, self.mu_floor)

    def _move(self, mu: float, direction: int, start: float = 0.0) -> float:
        """`moved_mu` by the next Rprop move (`rprop_octaves`); from μ = 0 up, ``start`` or else the δ rule."""
        self.octaves = rprop_octaves(self.octaves, direction, self.last_move)
        self.last_move = direction
        return moved_mu(mu, direction, self.octaves, start=start if start > 0 else self._rule(), floor=self.mu_floor)

    def _rule(self) -> float:
        """The δ rule's μ at the current spread and boost (`delta_rule`)."""
        return delta_rule(self.spread, boost=self.boost, scale=self.scale)

    def rebase(self, problem) -> None:
        """After the shards were dealt anew for another world size m (Horovod elastic, `dane.loop.elastic`).

        The last accepted point w, its global gradient g and its global objective are
        properties of O, which is the same whatever m (every row is still in exactly one
        shard), so the acceptance test goes on unchanged.  Only this worker's local
        gradient at w belonged to the old shard: it is recomputed on the new one (local
        work, no communication), so the next δ measures the new shards' spread.  μ, the
        spread and ``boost`` are kept: the spread is a maximum over the old shards, which
        with fewer workers (larger shards) overstates the new one, so μ errs on the safe,
        slower side and never below what was needed; with more workers the next rounds
        measure the larger spread and raise μ, and an ascent is still rejected.
        """
        if self.accepted is not None:
            w, _, g, metrics = self.accepted
            local_grad, _ = problem.evaluate(w)
            self.accepted = (w, local_grad, g, metrics)

    def state_dict(self) -> dict:
        return {"mu": self.mu, "boost": self.boost, "spread": self.spread, "best": self.best, "accepted": self.accepted,
                "last_step": self.last_step, "last_step_mu": self.last_step_mu, "rejected_mu": self.rejected_mu,
                "octaves": self.octaves, "last_move": self.last_move, "last_ratio": self.last_ratio}

    def load_state_dict(self, state: dict) -> None:
        self.mu, self.boost, self.spread = state["mu"], state["boost"], state["spread"]
        self.best = state.get("best", math.inf)  # absent from checkpoints written before it existed
        self.last_step, self.rejected_mu = state.get("last_step"), state.get("rejected_mu", -1.0)
        self.last_step_mu = state.get("last_step_mu", math.nan)
        self.octaves, self.last_move = state.get("octaves", 2.0), state.get("last_move", 0)
        self.last_ratio = state.get("last_ratio")
        self.accepted = None if state["accepted"] is None else tuple(state["accepted"])
