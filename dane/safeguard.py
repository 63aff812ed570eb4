r"""DANE's μ safeguard: small rules over scalars, and `MuSafeguard`, which holds their state.

Each rule is a plain function of the numbers one round measures (`dane.safeguard_rules`, whose
names are still imported from here), with its source in its docstring and a closed-form test in
tests/test_safeguard_rules.py.  `MuSafeguard`
holds the memory they need between rounds and applies them in the order of
`MuSafeguard.review`.

*Guard.* An averaged iterate is accepted only if the global objective did not increase
(up to ``rtol``; nan and inf are rejected: `accepts`).  On a rejection the worker returns
to the last accepted iterate, whose gradients it kept, and redoes the local solve with a
larger μ.  With a convex objective and exact local solves a large enough μ makes the step
a descent step, so the objective never rises (a run ends diverged only on trials that are not finite, below).

*Trials that are not finite* (a step, gradient change or objective of nan or inf: a local solve that diverged or
overflowed, `finite_trial`) are rejected and measure nothing: μ moves up by the rejection's rules alone (its
shortening μ and curvature scale are 0 there).  Where μ then has no scale to go up by (0), or after
`NON_FINITE_TRIALS` such trials in a row, μ is not what fails (`gives_up`): the safeguard says why in ``gave_up``
and DANE ends the run as diverged, its records kept, the line naming the key to change (the local solver's step,
η; `dane.dane.DANE`).

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

from .records.results import adaptation
from .safeguard_rules import (FAST, NON_FINITE_TRIALS, OVERSHOOT, ROUND_OFF_STEP, UNDERSHOOT, UNRESOLVED, accepts,
                              after_rejection, balanced_damping, curvature_scale_mu, delta_rule, finite_trial,
                              gives_up, halfway_mu, mode, model_curvature, moved_mu, next_boost, remembered_spread,
                              round_off_sq, rprop_octaves, settled, shortening_mu, slow_ratio, snap,
                              spread_along_step, step_ratio_and_cosine, to_floor, undamp)

__all__ = ["MuSafeguard", "ROUND_OFF_STEP", "NON_FINITE_TRIALS", "FAST", "OVERSHOOT", "UNDERSHOOT", "UNRESOLVED",
           "snap", "round_off_sq", "model_curvature", "to_floor", "finite_trial", "accepts", "spread_along_step",
           "remembered_spread", "delta_rule", "next_boost", "step_ratio_and_cosine", "settled", "slow_ratio", "mode",
           "balanced_damping", "undamp", "halfway_mu", "rprop_octaves", "moved_mu", "shortening_mu",
           "after_rejection", "curvature_scale_mu", "gives_up"]


# ---------------------------------------------------------------- the state and the order
class MuSafeguard:
    r"""Choose μ from evidence about the steps, and never accept an ascent (the module docstring: the rules).

    The state: the last accepted iterate with its gradients and objective (``accepted``), the
    spread and ``boost`` of the δ rule, the lowest accepted objective (``best``, non-convex),
    and for the convex rule the last accepted step and its μ, the largest rejected μ, the last
    step ratio and the Rprop move (``octaves``, ``last_move``).  `review` applies the rules in
    this order:

    1. spread: δ along the step (`spread_along_step`), kept by `remembered_spread`; not from a
       step at round-off, unless the spread forgets, nor from a trial that is not finite (`finite_trial`);
    2. guard: `finite_trial` and `accepts` (non-convex: against the lowest accepted objective, with ``slack``);
    3. boost: `next_boost`;
    4. μ, convex: a rejection moves up (`moved_mu`) and then `after_rejection` with
       `shortening_mu`; an acceptance reads the two last steps at one μ (`mode`) and moves up,
       down (`undamp` when settled) or halfway to the δ rule.  Non-convex: the δ rule, not
       below the floor;
    5. a rejection that left μ = 0: `curvature_scale_mu`;
    6. trials not finite: `gives_up` sets ``gave_up`` (why), and the run stops.

    A round whose μ differs from the last round's carries the change as its ``adapted`` event (key ``algorithm.mu``,
    from, to, and the trigger in words: the rejection, the steps' reading, or the δ rule), which the summary lists
    with every other method's adaptations (`dane.loop.callbacks.Policy`).

    ``forget`` (default: not convex; DANE sets it for every non-quadratic problem) makes the
    spread decay and the memory of rejected μ fade, as the Hessians move with w.
    """

    #: its name in the summary's ``adaptations_attached``
    name = "safeguard"

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
        self.reading = UNRESOLVED  # the last two steps' reading (`mode`) where the convex rule read one
        self.non_finite = 0  # trials in a row that were not finite (`finite_trial`)
        self.gave_up: str | None = None  # why the rules cannot go on (`gives_up`): the run stops (`dane.dane.DANE`)

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
        grad_change_sq = float(torch.linalg.vector_norm(grad_change).square())
        objective, best = float(metrics[0]), float(metrics0[0])
        finite = finite_trial(step_sq, grad_change_sq, objective)  # else it measures nothing, and is rejected
        round_off = round_off_sq(w0)
        # 1. spread
        if finite and step_sq > (0.0 if self.forget else round_off):  # a forgetting spread keeps no noise for long
            curvature = float(step @ grad_change) / step_sq
            delta = spread_along_step(float(stats[0]), grad_change_sq, step_sq, curvature)
            if delta is not None:
                self.spread = remembered_spread(self.spread, delta, self.decay if self.forget else 1.0)
        # 2. guard
        if not self.convex:
            self.best = min(self.best, best)
        accepted = finite and self.would_accept(objective)
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
                short = shortening_mu(mu_used, float(g0 @ step), step_sq, best, objective) if finite else 0.0
                self.mu = after_rejection(self.mu, mu_used, short)
        else:
            self.mu = max(self.mu_floor, self._rule())
        # 5. no spread measured yet: start from the curvature scale
        if not accepted and self.mu == 0.0:
            self.mu = curvature_scale_mu(self.scale, math.sqrt(grad_change_sq), step_sq)
        # 6. trials that are not finite: give up where μ cannot bring them back
        self.non_finite = 0 if finite else self.non_finite + 1
        if gives_up(self.mu, self.non_finite):
            trials = "the trial" if self.non_finite == 1 else f"{self.non_finite} trials in a row, the last"
            self.gave_up = (f"{trials} at mu = {mu_used:.3g} not finite (a local solve diverged or overflowed); " +
                            ("nothing measured to raise mu by" if self.mu == 0 else
                             f"raising mu (to {self.mu:.3g}) does not bring them back" if self.mu > mu_used else
                             "mu does not bring them back"))
        extra = {"accepted": accepted, "spread": self.spread}
        if self.mu != mu_used:
            extra["adapted"] = [adaptation("algorithm.mu", mu_used, self.mu, self.trigger(accepted))]
        return (*self.accepted, extra)

    def trigger(self, accepted: bool) -> str:
        """Why μ moved this round, in words (the ``adapted`` event's trigger)."""
        if not accepted:
            return "trial not finite (round redone)" if self.non_finite else "objective rose (round redone)"
        if not self.convex:
            return "delta rule"
        return {OVERSHOOT: "steps overshoot", UNDERSHOOT: "steps undershoot"}.get(self.reading,
                                                                                  "slow, no dominant direction")

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
        reading = self.reading = mode(ratio, cosine, slow=slow, turn=self.turn)
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
                "octaves": self.octaves, "last_move": self.last_move, "last_ratio": self.last_ratio,
                "non_finite": self.non_finite}

    def load_state_dict(self, state: dict) -> None:
        self.mu, self.boost, self.spread = state["mu"], state["boost"], state["spread"]
        self.best = state.get("best", math.inf)  # absent from checkpoints written before it existed
        self.last_step, self.rejected_mu = state.get("last_step"), state.get("rejected_mu", -1.0)
        self.last_step_mu = state.get("last_step_mu", math.nan)
        self.octaves, self.last_move = state.get("octaves", 2.0), state.get("last_move", 0)
        self.last_ratio = state.get("last_ratio")
        self.non_finite = state.get("non_finite", 0)
        self.accepted = None if state["accepted"] is None else tuple(state["accepted"])
