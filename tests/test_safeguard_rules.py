"""DANE's μ safeguard one rule at a time (dane/safeguard.py), each against a closed form."""
from __future__ import annotations

import math

import pytest
import torch

from dane import safeguard as sg
from dane.safeguard import MuSafeguard, snap


def test_snap_is_the_nearest_quarter_octave_in_log_scale():
    for k in range(-12, 13):
        assert snap(2.0 ** (k / 4)) == 2.0 ** (k / 4)
    assert snap(1.1) == 2.0 ** 0.25  # log2(1.1) = 0.1375: nearer 1/4 octave than 0
    assert snap(1.0) == 1.0 and snap(3.0) == 2.0 ** 1.5  # log2(3) = 1.585: nearest 1.5
    for mu in (0.0, -1.0, math.inf):
        assert snap(mu) == mu  # 0 stays 0; what is not on a log scale is left alone
    assert math.isnan(snap(math.nan))


def test_round_off_is_round_off_step_ulps_of_the_iterate():
    w = torch.tensor([3.0, 4.0], dtype=torch.float64)  # ‖w‖ = 5
    assert sg.round_off_sq(w) == (sg.ROUND_OFF_STEP * 2.0 ** -52) ** 2 * 25.0
    assert sg.round_off_sq(w.float()) == (sg.ROUND_OFF_STEP * 2.0 ** -23) ** 2 * 25.0


def test_model_curvature_is_the_rayleigh_quotient_of_the_model_that_gave_the_step():
    A = torch.diag(torch.tensor([1.0, 4.0, 9.0], dtype=torch.float64))
    g = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    s = -torch.linalg.solve(A, g)
    assert sg.model_curvature(float(g @ s), float(s @ s)) == pytest.approx(float(s @ A @ s / (s @ s)), rel=1e-14)
    # GIANT's form: its direction p = -s, and gᵀp/‖p‖² is the same number
    p = -s
    assert sg.model_curvature(-float(g @ p), float(p @ p)) == float(g @ p) / float(p @ p)


def test_to_floor_returns_a_negligible_mu_to_the_floor():
    assert sg.to_floor(1e-4, 1e-3) == 0.0
    assert sg.to_floor(1e-3, 1e-3) == 1e-3  # at the threshold it is kept
    assert sg.to_floor(1e-4, 1e-3, floor=0.05) == 0.05


def test_accepts_no_ascent_beyond_tol_and_never_nan_or_inf():
    assert sg.accepts(1.0, 1.0, 0.0)  # no change is not an ascent
    assert sg.accepts(2.0 * (1 + 1e-13), 2.0, 1e-12) and not sg.accepts(2.0 * (1 + 1e-11), 2.0, 1e-12)
    assert sg.accepts(-2.0 * (1 - 1e-13), -2.0, 1e-12)  # |reference|: a negative objective too
    assert sg.accepts(1.25, 1.0, 0.25) and not sg.accepts(1.2501, 1.0, 0.25)  # non-convex: (1 + slack) × lowest
    for bad in (math.nan, math.inf):
        assert not sg.accepts(bad, 1.0, 0.25)


def test_spread_is_the_rms_deviation_of_local_curvatures_along_the_step():
    # Two one-dimensional shards with curvatures h1, h2 and a step s: y_i = h_i s, y = (h1 + h2)/2 s, so
    # δ = |h1 - h2|/2 and κ = (h1 + h2)/2; the rule keeps δ·min(1, δ/κ).
    s = 0.3
    for h1, h2 in ((1.0, 3.0), (1.0, 1.1), (0.5, 8.0)):
        local_sq = (h1 ** 2 + h2 ** 2) / 2 * s * s
        global_sq = ((h1 + h2) / 2 * s) ** 2
        delta, kappa = abs(h1 - h2) / 2, (h1 + h2) / 2
        got = sg.spread_along_step(local_sq, global_sq, s * s, kappa)
        assert got == pytest.approx(delta * min(1.0, delta / kappa), rel=1e-12)
    # d dimensions, four shards: mean_i ‖(H_i - H)s‖² / ‖s‖² from the gradients' squares alone
    gen = torch.Generator().manual_seed(0)
    H = [torch.diag(torch.rand(5, generator=gen, dtype=torch.float64) + 0.5) for _ in range(4)]
    step = torch.randn(5, generator=gen, dtype=torch.float64)
    Hbar, ys = sum(H) / 4, [h @ step for h in H]
    local_sq, global_sq, step_sq = sum(float(y @ y) for y in ys) / 4, float((Hbar @ step).square().sum()), float(step @ step)
    delta = math.sqrt(sum(float(((h - Hbar) @ step).square().sum()) for h in H) / 4 / step_sq)
    assert sg.spread_along_step(local_sq, global_sq, step_sq, 0.0) == pytest.approx(delta, rel=1e-10)  # κ ≤ 0: δ itself
    assert sg.spread_along_step(1.0, 1.0 + 2.0 ** -52, 1.0, 1.0) == 0.0  # round-off below 0 is no spread
    assert sg.spread_along_step(math.inf, 1.0, 1.0, 1.0) is None
    assert sg.spread_along_step(math.nan, 1.0, 1.0, 1.0) is None


def test_remembered_spread_keeps_the_maximum_or_a_decaying_one():
    assert sg.remembered_spread(2.0, 1.0) == 2.0 and sg.remembered_spread(2.0, 3.0) == 3.0
    assert sg.remembered_spread(2.0, 0.9, decay=0.5) == 1.0 and sg.remembered_spread(2.0, 1.5, decay=0.5) == 1.5


def test_delta_rule_is_boost_scale_spread_on_the_grid():
    assert sg.delta_rule(5.0, boost=4.0, scale=0.4) == 8.0
    assert sg.delta_rule(1.0, boost=1.0, scale=0.4) == snap(0.4) == 2.0 ** -1.25
    assert sg.delta_rule(0.0, boost=16.0, scale=0.4) == 0.0


def test_boost_grows_on_a_failed_rule_and_two_acceptances_undo_one_rejection():
    boost = sg.next_boost(1.0, accepted=False, rule_failed=True, grow=4.0, shrink=2.0)
    assert boost == 4.0
    assert sg.next_boost(boost, accepted=False, rule_failed=False, grow=4.0, shrink=2.0) == 4.0  # δ explains it
    for _ in range(2):
        boost = sg.next_boost(boost, accepted=True, rule_failed=False, grow=4.0, shrink=2.0)
    assert boost == 1.0
    assert sg.next_boost(1.0, accepted=True, rule_failed=False, grow=4.0, shrink=2.0) == 1.0  # not below 1
    assert sg.next_boost(4.0, accepted=True, rule_failed=False, grow=4.0, shrink=None) == 4.0  # convex: kept


def linear_iteration_steps(contraction: torch.Tensor, e0: torch.Tensor, rounds: int) -> list[torch.Tensor]:
    """Steps s_t = e_{t+1} - e_t of e_{t+1} = (I - M) e_t with I - M = diag(contraction)."""
    errors = [e0]
    for _ in range(rounds):
        errors.append(contraction * errors[-1])
    return [b - a for a, b in zip(errors, errors[1:])]


@pytest.mark.parametrize("rho", [-0.6, 0.6])
def test_ratio_and_cosine_of_one_mode_are_its_eigenvalue_and_its_sign(rho):
    # One mode of I - M with eigenvalue rho: each step is rho times the last (an overshoot when rho < 0).
    s = linear_iteration_steps(torch.tensor([rho], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64), 3)
    ratio, cosine = sg.step_ratio_and_cosine(s[2], s[1], float(s[2] @ s[2]))
    assert ratio == pytest.approx(abs(rho), rel=1e-14) and cosine == pytest.approx(math.copysign(1.0, rho), rel=1e-14)


def test_mode_reads_over_and_undershoot_from_the_dominant_mode_and_none_from_two_equal_ones():
    def read(contraction, e0, rounds=30):
        s = linear_iteration_steps(torch.tensor(contraction, dtype=torch.float64),
                                   torch.tensor(e0, dtype=torch.float64), rounds)
        ratio, cosine = sg.step_ratio_and_cosine(s[-1], s[-2], float(s[-1] @ s[-1]))
        return sg.mode(ratio, cosine, slow=0.25, turn=0.3)

    assert read([-0.8, 0.3], [1.0, 1.0]) == sg.OVERSHOOT   # eigenvalue of M above 1 dominates
    assert read([0.8, -0.3], [1.0, 1.0]) == sg.UNDERSHOOT  # below 1 dominates
    assert read([0.2, -0.1], [1.0, 1.0]) == sg.FAST
    # modes 0.8 and -0.8 with equal steps (M e0 = (1, 1)): cos(s_t, s_{t-1}) = 0, ratio 0.8
    assert read([0.8, -0.8], [1 / 0.2, 1 / 1.8]) == sg.UNRESOLVED
    assert sg.mode(0.4, 0.0, slow=0.25, turn=0.3) == sg.FAST  # slow-ish but no mode and not slow enough to move
    assert sg.mode(math.nan, -1.0, slow=0.25, turn=0.3) == sg.FAST
    assert sg.mode(0.9, math.nan, slow=0.25, turn=0.3) == sg.FAST


def test_settled_and_slow_ratio():
    assert sg.settled(0.5, 0.52, 0.1) and not sg.settled(0.5, 0.6, 0.1)
    assert not sg.settled(0.5, None, 0.1) and not sg.settled(1.0, 1.0, 0.1)  # no history; not contracting
    kw = dict(contraction=0.25, settled_contraction=0.1, turn=0.3)
    assert sg.slow_ratio(True, 0.0, -1.0, **kw) == 0.1  # settled at μ = 0
    assert sg.slow_ratio(True, 1.0, 0.9, **kw) == 0.1  # settled undershoot
    assert sg.slow_ratio(True, 1.0, -0.9, **kw) == 0.25  # a settled overshoot at μ > 0 is left alone
    assert sg.slow_ratio(False, 0.0, 0.9, **kw) == 0.25


def test_balanced_damping_solves_its_quadratic():
    assert sg.balanced_damping(1.0) == pytest.approx((math.sqrt(5) - 1) / 4, rel=1e-15)  # u² + u/2 - 1/4 = 0
    for r in (1e-3, 0.5, 30.0):
        u, a = sg.balanced_damping(r), 1 / (1 + r)
        assert u * u + a * u - (1 - a) / 2 == pytest.approx(0.0, abs=1e-15)


def test_undamp_makes_a_settled_undershooting_mode_exact():
    kappa, kappa_i, mu = 1.0, 0.7, 0.6
    rho = 1 - kappa / (kappa_i + mu)  # the mode contracts by rho per round
    assert sg.undamp(mu, rho, kappa, 0.0) == snap(kappa - kappa_i)
    assert sg.undamp(mu, rho, kappa, 0.5) == 0.5  # not below the floor
    assert sg.undamp(mu, rho, -1.0, 0.0) == snap(mu)  # no curvature measured: no move


def test_halfway_mu_is_the_geometric_mean_on_the_grid():
    assert sg.halfway_mu(1.0, 4.0, 0.0) == 2.0 and sg.halfway_mu(4.0, 1.0, 0.0) == 2.0
    assert sg.halfway_mu(0.0, 4.0, 0.0) == 4.0 and sg.halfway_mu(1.0, 0.0, 0.0) == 0.0
    assert sg.halfway_mu(1.0, 4.0, 3.0) == 3.0


def test_rprop_halves_on_a_reversal_and_doubles_on_a_repeat():
    octaves, last, seen = 2.0, 0, []
    for direction in (+1, +1, -1, +1, -1, -1, -1, -1, -1):
        octaves, last = sg.rprop_octaves(octaves, direction, last), direction
        seen.append(octaves)
    assert seen == [2.0, 2.0, 1.0, 0.5, 0.25, 0.5, 1.0, 2.0, 2.0]


def test_moved_mu_scales_by_two_to_the_octaves_on_the_grid():
    assert sg.moved_mu(1.0, +1, 2.0, start=0.0, floor=0.0) == 4.0
    assert sg.moved_mu(1.0, -1, 0.25, start=0.0, floor=0.0) == 2.0 ** -0.25
    assert sg.moved_mu(0.0, +1, 2.0, start=0.3, floor=0.0) == 0.3  # from plain DANE: the first scale measured
    assert sg.moved_mu(1.0, -1, 2.0, start=0.0, floor=0.5) == 0.5


@pytest.mark.parametrize("k, mu, h", [(0.1, 0.0, 1.0), (0.5, 0.25, 2.0)])
def test_shortening_mu_makes_a_one_dimensional_model_exact(k, mu, h):
    # Local curvature k + mu gave s = -g/(k + mu), too long for the global curvature h: the quadratic through
    # the two objectives and the slope is exact here, and the μ it asks for gives k + μ' = h.
    g, before = 2.0, 1.0
    s = -g / (k + mu)
    after = before + g * s + 0.5 * h * s * s
    assert sg.shortening_mu(mu, g * s, s * s, before, after) == snap(mu + (h - k - mu))
    assert sg.shortening_mu(mu, -g * s, s * s, before, after) == 0.0  # an ascent slope: no model


def test_after_rejection_takes_the_shortening_mu_alone_from_plain_dane():
    assert sg.after_rejection(0.5, 0.0, 0.01) == 0.01  # from μ = 0: the step's own model
    assert sg.after_rejection(0.5, 0.0, 0.0) == 0.5  # the model says nothing: the rule's
    assert sg.after_rejection(0.5, 0.1, 0.01) == 0.5 and sg.after_rejection(0.5, 0.1, 2.0) == 2.0


def test_curvature_scale_is_the_secant_curvature_times_scale():
    h, s = 3.0, 0.01  # one dimension: g_{t+1} - g_t = h s
    assert sg.curvature_scale_mu(0.4, h * s, s * s) == snap(0.4 * h)


@pytest.mark.parametrize("grad_change_norm, step_sq", [(math.nan, math.nan), (math.nan, 1.0), (math.inf, 1.0),
                                                       (1.0, math.inf), (math.inf, math.inf), (1.0, math.nan),
                                                       (1.0, 0.0)])
def test_curvature_scale_of_a_trial_that_measured_nothing_is_0(grad_change_norm, step_sq):
    # a secant of nan, inf or 0/0 gave μ = nan (or 0 from 1/inf, or ZeroDivisionError): no scale is 0, finite
    assert sg.curvature_scale_mu(0.4, grad_change_norm, step_sq) == 0.0


def test_a_trial_is_finite_when_its_step_gradient_change_and_objective_are():
    assert sg.finite_trial(1.0, 2.0, -3.0) and sg.finite_trial(0.0, 0.0, 0.0)
    for bad in (math.nan, math.inf, -math.inf):
        assert not sg.finite_trial(bad, 1.0, 1.0) and not sg.finite_trial(1.0, bad, 1.0)
        assert not sg.finite_trial(1.0, 1.0, bad)


def test_gives_up_at_mu_0_or_after_the_limit_of_non_finite_trials_in_a_row():
    assert sg.NON_FINITE_TRIALS == 5
    assert not sg.gives_up(0.0, 0) and not sg.gives_up(4.0, 0)  # a finite trial: never
    assert sg.gives_up(0.0, 1)  # nothing to scale μ by: the next trial would be this one
    assert sg.gives_up(math.inf, 1) and sg.gives_up(math.nan, 1)
    assert [sg.gives_up(4.0 ** k, k) for k in range(1, 7)] == [False] * 4 + [True, True]
    assert not sg.gives_up(1.0, 2, limit=3) and sg.gives_up(1.0, 3, limit=3)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_review_of_a_non_finite_trial_rejects_it_and_keeps_mu_finite(bad):
    # A local solve that diverged: its iterate, gradient and objective are nan (or inf).  From μ = 0 with no spread
    # measured the rules have no scale: μ stays 0 and the guard gives up (μ was nan).  From μ = 1 it goes up by the
    # rejection's Rprop move, x4, five times, the spread untouched, and gives up at the fifth; a finite trial between
    # starts the count again.
    def trial(value):
        x = torch.full((2,), value, dtype=torch.float64)
        return x, x.clone(), x.clone(), torch.tensor([value], dtype=torch.float64)

    def start(mu):
        guard = MuSafeguard(mu)
        w0, grad0, g0, m0 = trial(0.0)
        guard.review(w0, grad0, g0 + 1.0, m0 + 1.0, guard.local_stats(w0, grad0))
        return guard

    guard = start(0.0)
    w, grad, g, metrics = trial(bad)
    *back, extras = guard.review(w, grad, g, metrics, guard.local_stats(w, grad))
    assert (guard.mu, guard.spread, guard.non_finite, extras["accepted"]) == (0.0, 0.0, 1, False)
    assert float(back[0].abs().sum()) == 0.0  # the worker solves again from the last accepted point
    assert guard.gave_up == "the trial at mu = 0 not finite (a local solve diverged or overflowed); nothing measured " \
                           "to raise mu by"

    guard, mus = start(1.0), []
    for _ in range(5):
        assert guard.gave_up is None
        *_, extras = guard.review(w, grad, g, metrics, guard.local_stats(w, grad))
        mus.append(guard.mu)
        assert extras["adapted"][0]["trigger"] == "trial not finite (round redone)"
    assert mus == [4.0, 16.0, 64.0, 256.0, 1024.0] and guard.spread == 0.0 and guard.non_finite == 5
    assert guard.gave_up == "5 trials in a row, the last at mu = 256 not finite (a local solve diverged or " \
                           "overflowed); raising mu (to 1.02e+03) does not bring them back"
    assert guard.state_dict()["non_finite"] == 5

    guard = start(1.0)
    for _ in range(4):
        guard.review(w, grad, g, metrics, guard.local_stats(w, grad))
    near = trial(0.0)  # a finite trial (an ascent: rejected) ends the run of non-finite ones
    guard.review(near[0], near[1], near[2] + 1.0, near[3] + 2.0, guard.local_stats(near[0], near[1]))
    assert guard.non_finite == 0 and guard.gave_up is None and math.isfinite(guard.mu)


def test_review_applies_the_rules_in_order_on_a_rejected_plain_dane_step():
    # One dimension, O(w) = h w²/2 - b w seen through a local model of curvature k < h/2: the step from w0 = 0 is
    # -g/k, the objective rises, the step is rejected, and μ jumps to the shortening μ h - k alone (step 4).
    h, k, b = 2.0, 0.5, 1.0
    guard = MuSafeguard(0.0)

    def at(w):
        x = torch.tensor([w], dtype=torch.float64)
        grad = torch.tensor([h * w - b], dtype=torch.float64)
        return x, grad, grad.clone(), torch.tensor([h * w * w / 2 - b * w], dtype=torch.float64)

    w0, grad0, g0, metrics0 = at(0.0)
    assert guard.review(w0, grad0, g0, metrics0, guard.local_stats(w0, grad0))[-1] == {"accepted": True}
    w1, grad1, g1, metrics1 = at(-float(g0[0]) / k)
    *back, extras = guard.review(w1, grad1, g1, metrics1, guard.local_stats(w1, grad1))
    assert guard.mu == snap(h - k) and guard.rejected_mu == 0.0
    assert extras == {"accepted": False, "spread": 0.0,  # one worker: no spread; μ's move is the round's event
                      "adapted": [{"key": "algorithm.mu", "from": 0.0, "to": guard.mu, "trigger": "objective rose (round redone)"}]}
    assert back[0] is w0  # the worker solves again from the last accepted point
    # the next step, at μ = h - k, is the exact minimizer and accepted
    w2, grad2, g2, metrics2 = at(-float(g0[0]) / (k + guard.mu))
    assert guard.review(w2, grad2, g2, metrics2, guard.local_stats(w2, grad2))[-1]["accepted"]


def test_state_dict_keeps_the_checkpoint_keys():
    # checkpoints written before dane.safeguard existed load: the same keys, the same meaning
    assert set(MuSafeguard(0.0).state_dict()) == {"mu", "boost", "spread", "best", "accepted", "last_step",
                                                  "last_step_mu", "rejected_mu", "octaves", "last_move", "last_ratio",
                                                  "non_finite"}
    old = {"mu": 0.5, "boost": 4.0, "spread": 1.0, "accepted": None}  # the oldest keys only
    guard = MuSafeguard(0.0)
    guard.load_state_dict(old)
    assert (guard.mu, guard.boost, guard.best, guard.rejected_mu, guard.octaves) == (0.5, 4.0, math.inf, -1.0, 2.0)
    assert guard.non_finite == 0


def review_at(guard: MuSafeguard, w: float, objective: float, *, g: float = 0.0, local_sq: float = 0.0) -> bool:
    """One round of one dimension: iterate w, global (= local) gradient g, objective, and ``local_sq`` as the
    allreduced mean_i ‖y_i‖² (`MuSafeguard.local_stats`), given by hand; whether the guard accepted it."""
    x, grad = torch.tensor([w], dtype=torch.float64), torch.tensor([g], dtype=torch.float64)
    *_, extras = guard.review(x, grad, grad.clone(), torch.tensor([objective], dtype=torch.float64),
                              torch.tensor([local_sq], dtype=torch.float64))
    return extras["accepted"]


@pytest.mark.parametrize("forget", [True, False])
def test_a_rejected_mu_fades_by_grow_each_accepted_round_only_where_the_rules_forget(forget):
    # O(w) = (w - 10)²/2 from w0 = 0.  A step to w = 30 at μ = 1 rises and is rejected: μ moves up 2 octaves to 4
    # (its shortening μ, snap(1 + (1/3)(3 - 1)) = 2^0.75, is smaller).  Then steps of ratio 0.9 towards 10 undershoot;
    # μ moves down by the Rprop move (a reversal: 1 octave, to 2; the same way again: 2 octaves, to 1/2) once two
    # steps at one μ read it.  Forgetting, the rejected μ is 1/4^k after k accepted rounds, and μ comes down to 1/2,
    # below the μ = 1 that failed; otherwise μ never comes down to a rejected value again and stays at 2.
    guard = MuSafeguard(0.0, forget=forget)
    assert review_at(guard, 0.0, 50.0, g=-10.0)
    guard.mu = 1.0
    assert not review_at(guard, 30.0, 200.0, g=20.0)
    assert guard.rejected_mu == 1.0 and guard.mu == 4.0
    w, step, mus = 0.0, 1.0, []
    for k in range(1, 5):
        w += step
        assert review_at(guard, w, (w - 10) ** 2 / 2, g=w - 10)
        assert guard.rejected_mu == (1.0 / guard.grow ** k if forget else 1.0)
        mus.append(guard.mu)
        step *= 0.9
    assert mus == ([4.0, 2.0, 2.0, 0.5] if forget else [4.0, 2.0, 2.0, 2.0])


@pytest.mark.parametrize("convex, spreads", [(False, [2.0, 1.0, 0.5]), (True, [2.0, 2.0, 2.0])])
def test_a_forgetting_spread_decays_by_decay_a_round_and_a_convex_one_keeps_its_maximum(convex, spreads):
    # Steps of 1 with no global gradient change (curvature 0: δ² = mean_i ‖y_i‖²/‖s‖², undamped), local spreads
    # δ = 2, 1/2, 0: the non-convex spread is max(0.5 · spread, δ), the convex one max(spread, δ); μ (non-convex)
    # follows the δ rule, snap(0.4 · spread).
    guard = MuSafeguard(0.0, convex=convex)
    review_at(guard, 0.0, 1.0)
    seen = []
    for t, delta in enumerate([2.0, 0.5, 0.0], start=1):
        assert review_at(guard, float(t), 1.0 - 0.1 * t, local_sq=delta ** 2)
        seen.append(guard.spread)
        if not convex:
            assert guard.mu == snap(0.4 * guard.spread)
    assert seen == spreads


def test_a_rejection_at_the_delta_rules_own_mu_grows_boost_and_the_retry_takes_a_larger_mu():
    # Non-convex: a spread of 2 makes μ = snap(0.4 · 2) = 2^-0.25 (the rule's μ, on the grid).  The trial at that
    # μ rises past 1.25 x the best objective and measures δ = 2 again, so the rule still gives 2^-0.25 = the μ used:
    # the rule failed, boost goes x4 and the retry's μ is snap(4 · 0.8) = 2^1.75, not the μ that just failed.
    guard = MuSafeguard(0.0, convex=False)
    review_at(guard, 0.0, 1.0)
    assert review_at(guard, 1.0, 0.9, local_sq=4.0)
    assert guard.mu == snap(0.8) == 2.0 ** -0.25 and guard.boost == 1.0
    assert not review_at(guard, 2.0, 5.0, local_sq=4.0)
    assert guard.spread == 2.0 and guard.boost == guard.grow == 4.0 and guard.mu == 2.0 ** 1.75


def test_the_non_convex_guard_compares_with_the_lowest_accepted_objective_not_the_last():
    # Objectives 1.0 then 1.2 are accepted (1.2 <= 1.25 x 1.0); 1.3 is within 1.25 x the last (1.5) but not of the
    # lowest (1.25): rejected, while 1.25 itself is accepted.
    guard = MuSafeguard(0.0, convex=False)
    review_at(guard, 0.0, 1.0)
    assert review_at(guard, 1.0, 1.2)
    assert not guard.would_accept(1.3) and guard.would_accept(1.25)
    assert not review_at(guard, 2.0, 1.3)


def test_a_settled_undershoot_does_not_come_down_onto_a_rejected_mu():
    # O(w) = 6(w - 1.25)² from w0 = 0.  A step away from the minimum at μ = 1 is rejected (no descent slope: no
    # shortening μ), and μ moves up 2 octaves to 4.  Steps of ratio 0.2 at μ = 4: the first ratio is fast (below
    # 0.25), the second settled (slow above 0.1) and undershooting, and `undamp` gives snap(4 - 12 · 0.2/0.8) = 1,
    # the rejected μ itself: μ stays at 4.
    guard = MuSafeguard(0.0)
    assert review_at(guard, 0.0, 9.375, g=-15.0)
    guard.mu = 1.0
    assert not review_at(guard, -1.0, 6 * 2.25 ** 2, g=-27.0)
    assert (guard.rejected_mu, guard.mu) == (1.0, 4.0)
    mus = []
    for w in (1.0, 1.2, 1.24):
        assert review_at(guard, w, 6 * (w - 1.25) ** 2, g=12 * (w - 1.25))
        mus.append(guard.mu)
    assert sg.undamp(4.0, 0.2, 12.0, 0.0) == 1.0 and guard.reading == sg.UNDERSHOOT and mus == [4.0, 4.0, 4.0]


def test_an_overshoot_along_negative_curvature_starts_mu_from_the_delta_rule():
    # Plain DANE (μ = 0) overshoots: steps +1 then -0.5 (ratio 0.5, cosine -1), the second along a curvature of -2
    # (the gradient rose as w fell).  Balanced damping has no scale there (max(κ, 0) = 0), so μ starts from the δ
    # rule: spread 4 (δ² = (5 - 1)/0.25, no δ/κ factor at κ < 0), snap(0.4 · 4) = 2^0.75.
    guard = MuSafeguard(0.0)
    assert review_at(guard, 0.0, 1.0, g=0.0)
    assert review_at(guard, 1.0, 0.9, g=0.0)
    assert review_at(guard, 0.5, 0.8, g=1.0, local_sq=5.0)
    assert guard.reading == sg.OVERSHOOT and guard.spread == 4.0 and guard.mu == snap(1.6) == 2.0 ** 0.75
