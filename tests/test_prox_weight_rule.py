"""A default proximal weight doubles when the objective cycles or climbs (`baselines.adaptive.CyclingObjective`).

The rule on scripted objectives (the rounds it doubles at, computed by hand from its definition), and end to end:
on shards smaller than the dimension, where the default weight of S-DANE and Acc-S-DANE is far below the
dissimilarity the iterates meet, the fixed default diverges and the default with the rule reaches the optimum;
where the objective falls every round, the default's records are those of the fixed weight, bit for bit.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import dane
from dane.baselines.feddane import FedDANEConfig
from dane.baselines.adaptive import CYCLE_ROUNDS, CyclingObjective
from dane.baselines.fedred import FedRedConfig
from dane.baselines.sdane import SDANEConfig
from helpers import straight_and_resumed


def weights(objectives, active=True, ceiling=np.inf, rule=None):
    rule = rule or CyclingObjective(active, ceiling=ceiling)
    weight, out = 1.0, []
    for f in objectives:
        out.append(weight)
        weight = rule.next_weight(weight, f)
    return out + [weight]


def doublings(ws):
    return [t for t in range(1, len(ws)) if ws[t] > ws[t - 1]]  # t: the round whose objective doubled it, plus 1


def test_a_falling_objective_never_moves_the_weight():
    assert set(weights(0.5 + 0.9 ** np.arange(300))) == {1.0}


def test_bumps_small_against_the_descent_do_not_move_it():
    f = 0.5 + 0.9 ** np.arange(200) * (1 + 0.05 * (np.arange(200) % 2))  # a 5% bump every other round
    assert set(weights(f)) == {1.0}


def test_a_limit_cycle_doubles_the_weight_every_window_up_to_the_ceiling():
    # 1.0, then the cycle 0.6, 0.7, 0.65, 0.62: never above round 0, so only the window acts.  At round 10 the window
    # holds rounds 1-10 and the best before it is round 0's 1.0: progress 0.4 against a swing of 0.1.  At round 11 the
    # best before it is 0.6, the window's least: no progress, and the swing doubles the weight; the window then starts
    # afresh and the same happens 10 rounds later.
    f = [1.0] + [0.6, 0.7, 0.65, 0.62] * 10
    ws = weights(f, ceiling=5.0)
    assert [t - 1 for t in doublings(ws)] == [11, 21, 31]
    assert ws[-1] == 5.0                                       # 1, 2, 4, then the ceiling
    assert CYCLE_ROUNDS == 10


def test_climbing_above_every_objective_since_the_last_change_doubles_at_once():
    f = [1.0, 0.8, 1.5, 3.0, 2.0, 1.2, 0.9, 0.7, 0.6]
    ws = weights(f)
    assert [t - 1 for t in doublings(ws)] == [2, 3]            # 1.5 > 1.0; 3.0 > 1.5; 2.0 < 3.0 leaves it
    assert ws[-1] == 4.0


def test_round_off_at_the_optimum_is_not_a_cycle():
    f = np.r_[0.5 + 0.5 ** np.arange(60), 0.5 * (1 + 1e-15 * np.resize([1, -1, 2, 0], 40))]
    assert set(weights(f)) == {1.0}


def test_inactive_never_moves_and_the_state_carries_over_a_resume():
    f = [1.0] + [0.6, 0.7, 0.65, 0.62] * 10
    assert set(weights(f, active=False)) == {1.0}
    rule, weight = CyclingObjective(True, ceiling=5.0), 1.0
    for value in f[:15]:
        weight = rule.next_weight(weight, value)
    resumed = CyclingObjective()
    resumed.load_state_dict(rule.state_dict())
    rest_a, rest_b, wa, wb = [], [], weight, weight
    for value in f[15:]:
        wa, wb = rule.next_weight(wa, value), resumed.next_weight(wb, value)
        rest_a.append(wa)
        rest_b.append(wb)
    assert rest_a == rest_b and max(rest_a) == 5.0


def one_hot_logreg(seed=1, n=400, groups=8, levels=6):
    """Categorical rows one-hot encoded (d = 49 with the intercept), labels from a planted model: over 16 clients
    each holds 25 rows, fewer than the dimension, as LIBSVM's mushrooms over 80 clients."""
    rng = np.random.default_rng(seed)
    cats = rng.integers(0, levels, size=(n, groups))
    X = np.zeros((n, groups * levels))
    X[np.arange(n)[:, None], cats + levels * np.arange(groups)] = 1
    z = X @ (3 * rng.standard_normal(groups * levels))
    y = np.where(z + 0.3 * rng.standard_normal(n) > np.median(z), 1.0, -1.0)
    return dane.problems.LogReg(X, y, lam=1e-3, fit_intercept=True, optimum="auto")


def dissimilarity_weight(problem, workers: int, divisor: float) -> float:
    """The δ_A-based default, δ_A·max(1/512, (δ_A/‖H‖)²/divisor) (`prox_per_dissimilarity`: the Lanczos path's)."""
    from dane.baselines.defaults import prox_per_dissimilarity
    from dane.numerics.similarity import measure

    shards = [problem.build(rank, workers, torch.float64) for rank in range(workers)]
    found = measure(shards, shards[0].initial_point())
    delta_a = found["delta_mean_square"]
    return delta_a * prox_per_dissimilarity(delta_a, found["hessian_norm"], divisor)


@pytest.mark.parametrize("method, divisor", [pytest.param("sdane", 16, marks=pytest.mark.slow),
                                             pytest.param("acc_sdane", 4, marks=pytest.mark.slow)])  # 6 to 12 s each
def test_on_shards_smaller_than_the_dimension_the_default_converges_where_the_dissimilarity_weight_diverges(
        method, divisor):
    """The δ_A-based weight (the Lanczos path's default) diverges on these shards; the default (the balanced gap at
    d ≤ 512, with the doubling rule) reaches the optimum, its weight moving up by at most 2x a round."""
    problem = one_hot_logreg()
    default = dane.fit(problem, method, workers=16, rounds=150, tol=1e-8)
    fixed = dane.fit(problem, method, workers=16, rounds=150, tol=1e-8,
                     lam=dissimilarity_weight(problem, 16, divisor))
    assert fixed.status == "diverged"
    assert default.status == "converged" and default.summary["final_relative_suboptimality"] <= 1e-8
    lams = [r["lam"] for r in default.records[:-1]]
    assert all(b == a or a < b <= 2 * a for a, b in zip(lams, lams[1:]))


def test_where_the_objective_falls_every_round_the_default_is_its_fixed_weight_bit_for_bit():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((400, 8)) * np.linspace(1.5, 0.3, 8)
    y = np.where(X @ rng.standard_normal(8) + 0.8 * rng.standard_normal(400) > 0, 1.0, -1.0)
    problem = dane.problems.LogReg(X, y, lam=1e-2)
    default = dane.fit(problem, "sdane", workers=4, rounds=8)
    fixed = dane.fit(problem, "sdane", workers=4, rounds=8, lam=default.records[0]["lam"])
    objectives = [r["objective"] for r in default.records]
    assert all(b < a for a, b in zip(objectives, objectives[1:]))
    assert objectives == [r["objective"] for r in fixed.records]
    assert np.array_equal(default.w.numpy(), fixed.w.numpy())


@pytest.mark.parametrize("config", [SDANEConfig(), FedDANEConfig(), FedRedConfig(local_solver="problem")],
                         ids=lambda c: c.name)  # each keeps its own weight in its state (Acc-S-DANE is S-DANE's class)
def test_a_run_resumed_after_its_weight_doubled_continues_exactly(config, monkeypatch):
    """The default weight starts at 1/64 of the balanced gap's (the δ_A-based weight's size on these shards), so that
    the doubling rule acts within the 6 rounds; resumed after 3, records and iterates equal the straight run's (each
    method's weight doubles twice in the resumed rounds, after the state was taken; S-DANE's and FedDANE's also once
    before it)."""
    import dane.baselines.federated as federated

    balanced = federated.balanced_prox_weight
    monkeypatch.setattr(federated, "balanced_prox_weight", lambda *args: balanced(*args) / 64)
    problem = one_hot_logreg()
    shards = [problem.build(rank, 16, torch.float64) for rank in range(16)]
    runs = straight_and_resumed(config, shards, rounds=3)
    for straight, again, w1, w2 in runs:
        assert straight == again and torch.equal(w1, w2)
    first = dane.fit(problem, config, workers=16, rounds=1).records[0]
    initial = first.get("lam", first.get("mu"))
    weights = [r.get("lam", r.get("mu")) for r in runs[0][0]]  # rounds 3 to 5
    assert weights[-1] >= 2 * initial  # the rule acted within the 6 rounds, before or after the state was taken
    assert weights[-1] > weights[0]  # and in the resumed rounds


def test_alternating_slow_steps_double_the_weight_after_the_set_number_of_rounds():
    """Iterates x_t = (−0.95)^t e: from the third point on every step turns back (cosine −1) and shrinks by 0.95 >
    `ALTERNATING_RATIO`; the `ALTERNATING_ROUNDS`-th such step doubles the weight, the count starts again, and a
    falling objective alone would have left it.  Steps that keep their sign (x_t = 0.95^t e) never move it."""
    from dane.baselines.adaptive import ALTERNATING_RATIO, ALTERNATING_ROUNDS

    assert ALTERNATING_RATIO < 0.95
    e = torch.tensor([1.0, 2.0], dtype=torch.float64)
    for base, doubles_at in ((-0.95, [1 + ALTERNATING_ROUNDS, 1 + 2 * ALTERNATING_ROUNDS]), (0.95, [])):
        rule, weight, moved = CyclingObjective(True), 1.0, []
        for t in range(2 + 2 * ALTERNATING_ROUNDS):
            new = rule.next_weight(weight, 10.0 - t, base ** t * e)  # the objective falls every round
            if new != weight:
                moved.append(t)
            weight = new
        assert moved == doubles_at and weight == 2.0 ** len(doubles_at)


@pytest.mark.parametrize("balance, gap_scale", [(0.5, 3e-3), (0.5, 0.7), (1.0, 1e-6)])
def test_balanced_weight_is_the_crossing_of_the_gap_and_the_flat_rate(balance, gap_scale):
    """With μ = 0 the flat rate is 1, and a gap C/λ crosses it where balance·C/λ = 1: λ = balance·C, exact under the
    rule's log interpolation (log of the gap is linear in log λ).  With μ > 0 and gap C/λ, the crossing solves
    λ² = balance·C·(μ + λ); the octave interpolation lands within 2% of it.  A gap above the flat rate at the largest
    weight gives None, one below it everywhere the smallest weight."""
    from dane.baselines.defaults import balanced_prox_weight

    weights = [2.0 ** -k for k in range(41)]
    gaps = [gap_scale / lam for lam in weights]
    assert balanced_prox_weight(weights, gaps, 0.0, balance) == pytest.approx(balance * gap_scale, rel=1e-12)
    mu = 0.01
    bc = balance * gap_scale
    exact = (bc + np.sqrt(bc * bc + 4 * bc * mu)) / 2
    assert balanced_prox_weight(weights, gaps, mu, balance) == pytest.approx(exact, rel=0.02)
    assert balanced_prox_weight(weights, [10.0 / balance] * 41, 0.0, balance) is None
    assert balanced_prox_weight(weights, [0.0] * 41, mu, balance) == weights[-1]


def test_preconditioner_gap_is_the_norm_of_the_local_preconditioners_departure():
    """φ(λ) = ‖(I + A)⁻¹A²‖ with A = K^{-1/2} D K^{-1/2}, K = diag(c) + λI, from explicit inverses; and inf once a
    shifted curvature is not positive."""
    from dane.numerics.similarity import preconditioner_gap

    rng = np.random.default_rng(5)
    B = rng.standard_normal((6, 6))
    D = 0.1 * (B + B.T)
    c = np.linspace(0.5, 3.0, 6)
    for lam, phi in zip((1.0, 0.1), preconditioner_gap(torch.tensor(D), torch.tensor(c), [1.0, 0.1])):
        root = np.diag((c + lam) ** -0.5)
        A = root @ D @ root
        assert np.all(np.linalg.eigvalsh(A) > -1)
        assert phi == pytest.approx(np.linalg.norm(np.linalg.inv(np.eye(6) + A) @ A @ A, 2), rel=1e-10)
    assert preconditioner_gap(torch.tensor(D), torch.tensor(c - 1.0), [0.2]) == [np.inf]


def test_acc_sdane_at_its_default_restarts_its_extrapolation_when_the_objective_rises():
    """After a round whose starting objective rose above the last round's, or whose λ doubled, A = 0, B = 1 and v = x
    (O'Donoghue & Candès' function-value restart); on the one-hot shards it happens, and every other round grows A."""
    from dane.baselines.sdane import AccSDANEConfig
    from dane.comm import ThreadGroup

    problem = one_hot_logreg()

    def run(comm):
        algorithm = AccSDANEConfig().build(problem.build(comm.rank, 16, torch.float64), comm)
        rows, last = [], None
        for _ in range(10):  # rounds 3-6 restart here; 0-2 and 7-9 grow A
            A, lam = algorithm.A, algorithm.lam
            record = algorithm.step()
            restarted = (last is not None and record["objective"] > last) or algorithm.lam != lam
            rows.append((restarted, algorithm.A, algorithm.B, torch.equal(algorithm.v, algorithm.w), A))
            last = record["objective"]
        return rows

    rows = ThreadGroup(16).run(run)[0]
    assert any(r[0] for r in rows)
    for restarted, A, B, at_x, A_before in rows:
        if restarted:
            assert A == 0.0 and B == 1.0 and at_x
        else:
            assert A > A_before
