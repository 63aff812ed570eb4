r"""DANE: Distributed Approximate NEwton (Shamir, Srebro & Zhang, ICML 2014).

Round t on worker i of m, with step size η > 0 and proximal weight μ ≥ 0:

.. math::
    g_t &= \frac1m \sum_{i} \nabla O_i(w_t)  &&\text{(allreduce 1)} \\
    w_i &= \arg\min_w\; O_i(w) - \langle \nabla O_i(w_t) - \eta\, g_t, w\rangle
           + \frac{\mu}{2}\|w - w_t\|^2           &&\text{(local solve)} \\
    w_{t+1} &= \frac1m \sum_i w_i                 &&\text{(allreduce 2)}

For a quadratic the local solve is :math:`w_i = w_t - \eta (H_i + \mu I)^{-1} g_t`.

Departure from the paper: with ``safeguard=True`` (the default) μ is adapted so that
the method cannot diverge (on a non-convex problem: so that the objective stays bounded
and μ comes back down; see `MuSafeguard`).  The check needs the global objective of
w_{t+1}, which rides in the next round's first allreduce, so an accepted round costs
no extra communication; a rejected one costs the round it undoes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .algorithm import Algorithm, AlgorithmConfig, Column
from .comm import Communicator
from . import checks
from .problems import Problem


class DANE(Algorithm):
    name = "dane"
    elastic = True  # μ and the safeguard's memory follow a change of workers (`load_elastic_state`)
    synchronous_because = "DANE's local solve needs the global gradient of the same iterate"
    columns = (Column("mu", "{:>8.3g}"),)

    def __init__(self, problem: Problem, comm: Communicator, *, eta: float = 1.0, mu: float = 0.0,
                 safeguard: bool = True, local_solver=None, w0: torch.Tensor | None = None):
        super().__init__(problem, comm, w0)
        self.eta = eta
        self.mu = mu
        self.local_solver = local_solver  # a dane.local_solvers.LocalSolver, or None: the problem's own
        convex = problem.convex
        self.guard = MuSafeguard(mu, convex=convex, forget=not (convex and problem.quadratic)) if safeguard else None

    def step(self) -> dict[str, float]:
        w = self.w
        local_grad, local_metrics = self.problem.evaluate(w)
        stats = self.guard.local_stats(w, local_grad) if self.guard else local_grad.new_zeros(0)
        g, fused = self.comm.allreduce_mean([local_grad, torch.cat([local_metrics, stats])])  # 1. g = mean ∇O_i(w_t)
        metrics, stats = fused[: local_metrics.numel()], fused[local_metrics.numel():]
        extra = {}
        if self.guard is not None:
            w, local_grad, g, metrics, extra = self.guard.review(w, local_grad, g, metrics, stats)
            self.mu = self.guard.mu
        w_local = self.problem.prox_solve(w, local_grad - self.eta * g, self.mu,    # 2. local solve
                                          anchor_grad=local_grad, **solver_arg(self.local_solver))
        (self.w,) = self.comm.allreduce_mean([w_local])                              # 3. w_{t+1} = mean w_i
        return {**self.metrics(g, metrics), "mu": self.mu, **extra}

    def state_dict(self) -> dict:
        state = {**super().state_dict(), "mu": self.mu}
        if self.guard is not None:
            state["guard"] = self.guard.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.mu = state["mu"]
        if self.guard is not None:
            self.guard.load_state_dict(state["guard"])

    def load_elastic_state(self, state: dict) -> None:
        """μ and the safeguard's memory carry over a change of world size; see `MuSafeguard.rebase`."""
        super().load_elastic_state(state)
        if self.guard is not None:
            self.guard.rebase(self.problem)


@dataclass(frozen=True)
class DANEConfig(AlgorithmConfig):
    eta: float = 1.0
    mu: float = 0.0
    safeguard: bool = True
    name: str = "dane"
    algorithm = DANE

    def __post_init__(self) -> None:
        checks.positive("algorithm.eta", self.eta)
        checks.nonnegative("algorithm.mu", self.mu)

    def build(self, problem: Problem, comm: Communicator) -> "DANE":
        return DANE(problem, comm, eta=self.eta, mu=self.mu, safeguard=self.safeguard)


def solver_arg(local_solver) -> dict:
    """``prox_solve``'s keyword for a chosen local solver; none for the problem's own (networks take none)."""
    return {} if local_solver is None else {"solver": local_solver}


ROUND_OFF_STEP = 1e4  # ulps of the iterate: a quadratic's step at most this long does not measure δ (MuSafeguard)


def round_off_sq(w: torch.Tensor) -> float:
    """‖s‖² at or below which a step s from w is round-off (`ROUND_OFF_STEP` ulps of w): its y_i are noise."""
    return (ROUND_OFF_STEP * torch.finfo(w.dtype).eps) ** 2 * float(torch.linalg.vector_norm(w).square())


def snap(mu: float, steps_per_octave: int = 4) -> float:
    """The nearest 2^(k/steps_per_octave) to μ, in log scale (0 stays 0).

    On this grid (within 9% of any μ) the local solver reuses its factorization whenever
    μ returns to a value it had.  Nearest rather than upward rounding: rounding up cost
    extra rounds on the synthetic grid (tests/test_dane.py's full-grid test).
    """
    if mu <= 0 or not math.isfinite(mu):
        return mu
    return 2.0 ** (round(steps_per_octave * math.log2(mu)) / steps_per_octave)


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
    """
    a = 1.0 / (1.0 + r)
    return 0.5 * (math.sqrt(a * a + 2.0 * (1.0 - a)) - a)


def shortening_mu(mu: float, slope: float, step_sq: float, before: float, after: float) -> float:
    r"""The μ that shortens a rejected step s to the best length of a quadratic model along it.

    The quadratic through φ(0) = O(w), φ'(0) = gᵀs and φ(1) = O(w + s) has its minimum at
    α* = -φ'(0) / (2(φ(1) - φ(0) - φ'(0))) (the interpolation step of a line search,
    Nocedal & Wright, Numerical Optimization, section 3.5).  The step came from a local
    system s = -A⁻¹g with A ≈ H_i + μI; along s its curvature is κ = -gᵀs/‖s‖², and μ'
    scales the step along s by κ/(κ + μ' - μ), so the step of length α*‖s‖ needs

    .. math:: μ' = μ + κ (1/α^* - 1).

    0 when the model says nothing (no descent slope, an objective that did not rise, nan or
    inf): the ×4 rule then acts alone.
    """
    rise = after - before - slope
    if not (slope < 0 and after > before and step_sq > 0 and math.isfinite(after)):
        return 0.0
    alpha = -slope / (2.0 * rise)  # below 1/2: the objective rose
    return snap(mu + (-slope / step_sq) * (1.0 / alpha - 1.0))


class MuSafeguard:
    r"""Choose μ from evidence about the steps, and never accept an ascent.

    *Guard.* An averaged iterate is accepted only if the global objective did not
    increase (up to ``rtol``; nan and inf are rejected).  On a rejection the worker
    returns to the last accepted iterate, whose gradients it kept, and redoes the local
    solve with a larger μ.  With a convex objective and exact local solves a large enough
    μ makes the step a descent step, so the run cannot diverge.

    *Spread.* Along the step s = w_{t+1} - w_t each worker knows
    y_i = ∇O_i(w_{t+1}) - ∇O_i(w_t) ≈ H_i s, and the mean of the y_i is the global
    y = g_{t+1} - g_t.  The root-mean-square deviation of the local curvatures along s,

    .. math:: \delta^2 = \frac{\tfrac1m\sum_i \|y_i\|^2 - \|y\|^2}{\|s\|^2}
              = \frac{\tfrac1m \sum_i \|(H_i - H)s\|^2}{\|s\|^2},

    costs one scalar that rides in the round's first allreduce; a deviation small against
    the curvature κ = sᵀy/‖s‖² counts as δ²/κ.  The δ rule is
    μ = snap(boost · scale · spread), spread = max_t δ_t (scale 0.4, on a grid of four
    values per octave).

    *Convex problems: μ moves both ways, on evidence* (a trust region's radius, read off
    the steps).  μ starts at the configured floor (0: plain DANE) and changes only when
    the steps say so, by a factor of 2 or 4, so it revisits few values and an exact local
    solver reuses its factorizations:

    - a rejected step: μ ← 4μ, or `shortening_mu` when that is larger (the μ that
      shortens the step to the best length of a quadratic through the two objectives and
      the slope: on a problem whose first steps overshoot far, one rejection instead of
      several).  From μ = 0 (plain DANE rejected) the shortening μ alone, read off the step
      that failed, where the δ rule only scales the shards' spread by a constant; the δ
      rule when the model says nothing.  μ never again comes down to a rejected value (on
      a non-quadratic that memory fades, ÷4 per accepted round);
    - an accepted step that contracts slowly, ‖s_t‖ > 0.25‖s_{t-1}‖, is read by the
      cosine c of consecutive steps.  On a quadratic the error obeys e_{t+1} = (I - M)e_t
      with M = (1/m)Σ_i η(H_i + μI)⁻¹H, and the slowest mode dominates the steps: c < 0
      means an eigenvalue of M above 1 (overshoot, μ too small), c > 0 one below 1
      (undershoot, μ too large).  c < -0.3: μ up (from 0: to `balanced_damping`(r)·κ,
      r = ‖s_t‖/‖s_{t-1}‖, which balances the modes that overshoot by r and by 0 at
      μ = 0); c > 0.3:
      μ ← μ/4 (to the floor once below 1e-3 κ).  A ratio above 0.1 already counts as
      slow once it has settled (two ratios in a row at one μ within 10%), at μ = 0 or on an
      undershoot: the ratio rises while the slowest mode emerges from the others, so an
      unsettled one understates r and a jump on it lands low and needs another μ (another
      factorization), while a settled one is that mode's own rate.  A settled undershoot ρ
      is the mode's eigenvalue κ/(κ_i + μ) = 1 - ρ of M, so μ goes straight to
      μ - κρ/(1 - ρ) (`_undamp`), where it is 1.  A settled overshoot at μ > 0 is left
      alone: after the balanced jump both extreme modes are meant to contract at that rate.
      Slow with no dominant mode (ratio > 0.5, |c| ≤ 0.3): μ moves halfway (in log scale)
      to the δ rule;
    - a step that contracts fast, or a step at round-off (‖s‖ ≤ `ROUND_OFF_STEP` ulps of
      the iterate, where the y_i are noise), leaves μ alone.

    This replaces a never-decreasing δ rule that could not come back down when one
    unrepresentative shard had inflated the spread early.  Sources: the accept/reject
    step is the classic trust-region (Levenberg–Marquardt) safeguard; reading over- and
    undershoot from the sign of consecutive steps is the idea of sign-based step-size
    adaptation (Jacobs' delta-bar-delta, 1988; Rprop).  How far it stays from the best
    fixed μ is measured by ``make bench`` (section ``defaults``) and asserted on small
    instances in tests/test_dane.py.

    *Non-convex problems* (``convex=False``, from the problem's ``convex`` attribute:
    networks other than the logistic model) keep the δ rule, made to follow the current
    landscape instead of the worst one seen:

    - an iterate is accepted if its objective is at most ``(1 + slack)`` times the lowest
      accepted objective so far (slack = 0.25), not only if it went down: the loss of a
      network trained by an inexact, minibatch local solver rises now and then and comes
      back down the next round; rejecting those rises wastes rounds and raises μ for
      nothing.  nan or inf is still rejected;
    - after an accepted round ``boost`` is divided by ``shrink`` (2), down to 1, so a
      rejection (x4) is undone by two accepted rounds;
    - the spread forgets: ``spread = max(δ_t, decay * spread)`` (decay = 0.5).

    On a non-convex loss this is a trust region that keeps the objective bounded, not a
    descent method, and a rejected round may just have drawn unlucky minibatches.
    tests/test_neural.py compares test accuracy with the safeguard on and off.
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
        if self.accepted is None:
            return local_grad.new_zeros(1)
        return torch.linalg.vector_norm(local_grad - self.accepted[1]).square().reshape(1)

    def review(self, w, local_grad, g, metrics, stats):
        """Returns the point to solve from (the new iterate, or the last accepted one) and log extras."""
        if self.accepted is None:
            self.accepted = (w, local_grad, g, metrics)
            return w, local_grad, g, metrics, {"accepted": True}
        w0, _, g0, metrics0 = self.accepted
        step_sq = float(torch.linalg.vector_norm(w - w0).square())
        round_off = round_off_sq(w0)
        if step_sq > (0.0 if self.forget else round_off):  # a forgetting spread keeps no noise for long
            spread_sq = float(stats[0]) - float(torch.linalg.vector_norm(g - g0).square())
            curvature = float((w - w0) @ (g - g0)) / step_sq
            if math.isfinite(spread_sq):
                delta = math.sqrt(max(spread_sq, 0.0) / step_sq)
                if curvature > 0:  # a deviation small against the curvature needs only δ²/κ
                    delta *= min(1.0, delta / curvature)
                self.spread = max(self.decay * self.spread if self.forget else self.spread, delta)
        objective, best = float(metrics[0]), float(metrics0[0])
        if self.convex:
            accepted = objective <= best + self.rtol * abs(best)  # False for nan and inf too
        else:
            self.best = min(self.best, best)
            accepted = objective <= self.best + max(self.rtol, self.slack) * abs(self.best)
        mu_used = self.mu
        if accepted:
            self.accepted = (w, local_grad, g, metrics)
            if self.forget and not self.convex:
                self.boost = max(1.0, self.boost / self.shrink)
        elif mu_used >= self._rule():
            # the rule's own μ failed (compared on the grid: a μ rounded down is still the rule's);
            # a rejected μ below it is explained by δ.  Either way the next μ is larger.
            self.boost *= self.grow
        if self.convex:
            self.mu = self._convex_mu(accepted, mu_used, w - w0, g - g0, step_sq, round_off)
            if not accepted:  # the step was too long: at least the μ that shortens it to the model's best length
                short = shortening_mu(mu_used, float(g0 @ (w - w0)), step_sq, best, objective)
                self.mu = short if mu_used <= 0 < short else max(self.mu, short)
        else:
            self.mu = max(self.mu_floor, self._rule())
        if not accepted and self.mu == 0.0:  # no spread measured yet: start from the curvature scale
            self.mu = snap(self.scale * float(torch.linalg.vector_norm(g - g0)) / math.sqrt(step_sq))
        return (*self.accepted, {"accepted": accepted, "spread": self.spread})

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
        norm = torch.linalg.vector_norm
        ratio = math.sqrt(step_sq) / float(norm(previous))
        cosine = float(step @ previous) / (math.sqrt(step_sq) * float(norm(previous)))
        settled = self._settled(ratio)
        slow = self.settled_contraction if settled and (mu_used <= 0 or cosine > self.turn) else self.contraction
        if not ratio > slow:  # contracting fast enough (nan too: keep what works)
            return mu_used
        curvature = float(step @ grad_change) / step_sq
        if cosine < -self.turn:  # overshoot along the slowest direction: more damping
            return self._move(mu_used, +1, start=snap(balanced_damping(ratio) * max(curvature, 0.0)))
        if cosine > self.turn and mu_used > self.mu_floor:  # undershoot: less damping, not down to a rejected μ
            lower = self._undamp(mu_used, ratio, curvature) if settled else self._move(mu_used, -1)
            if lower <= self.rejected_mu:
                return mu_used
            return self.mu_floor if lower < self.negligible * curvature else lower
        if ratio > 0.5 and abs(cosine) <= self.turn:  # slow, and no single slow direction: halfway to the δ rule
            rule = self._rule()
            if mu_used > 0 and rule > 0:
                return max(self.mu_floor, snap(math.sqrt(mu_used * rule)))
            return max(self.mu_floor, rule)
        return mu_used

    def _settled(self, ratio: float) -> bool:
        """Whether this step ratio and the last one at the same μ agree within ``settle`` (relative)."""
        previous, self.last_ratio = self.last_ratio, ratio
        return previous is not None and ratio < 1.0 and abs(ratio / previous - 1.0) <= self.settle

    def _undamp(self, mu: float, ratio: float, curvature: float) -> float:
        """μ that ends a settled undershoot: the slowest mode's eigenvalue κ/(κ_i + μ) of M is 1 - ρ (ρ = ``ratio``,
        κ = ``curvature`` along the step), so μ' = μ - κρ/(1 - ρ) makes it 1; on the grid, and a move down."""
        self.last_move = -1
        return max(self.mu_floor, snap(mu - max(curvature, 0.0) * ratio / (1.0 - ratio)))

    def _move(self, mu: float, direction: int, start: float = 0.0) -> float:
        """μ up (+1) or down (-1) by 2^octaves; a reversal halves the octaves (down to the grid's quarter octave),
        as Rprop halves a step whose gradient changed sign, so μ settles between the values it bounced off; two moves
        the same way double them again (up to 2 octaves)."""
        if direction == -self.last_move:
            self.octaves = max(0.25, self.octaves / 2)
        elif direction == self.last_move:  # the same way again: back towards the full move
            self.octaves = min(2.0, self.octaves * 2)
        self.last_move = direction
        if mu <= 0:  # from μ = 0 (plain DANE) up: the first scale measured
            return max(self.mu_floor, start if start > 0 else self._rule())
        return max(self.mu_floor, snap(mu * 2.0 ** (direction * self.octaves)))

    def _rule(self) -> float:
        """The rule's μ, on the grid: snap(boost * scale * spread)."""
        return snap(self.boost * self.scale * self.spread)

    def rebase(self, problem) -> None:
        """After the shards were dealt anew for another world size m (Horovod elastic, `dane.elastic`).

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
                "last_step": self.last_step, "last_step_mu": self.last_step_mu, "rejected_mu": self.rejected_mu, "octaves": self.octaves,
                "last_move": self.last_move, "last_ratio": self.last_ratio}

    def load_state_dict(self, state: dict) -> None:
        self.mu, self.boost, self.spread = state["mu"], state["boost"], state["spread"]
        self.best = state.get("best", math.inf)  # absent from checkpoints written before it existed
        self.last_step, self.rejected_mu = state.get("last_step"), state.get("rejected_mu", -1.0)
        self.last_step_mu = state.get("last_step_mu", math.nan)
        self.octaves, self.last_move = state.get("octaves", 2.0), state.get("last_move", 0)
        self.last_ratio = state.get("last_ratio")
        self.accepted = None if state["accepted"] is None else tuple(state["accepted"])
