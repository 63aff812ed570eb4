"""DANE on quadratics against closed forms: one Newton step, the paper's rates, the exact local solve."""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse.linalg
import torch

from dane.comm import LocalCommunicator
from dane.dane import DANEConfig
from dane.problems import RidgeSyntheticConfig
from dane.problems.ridge import generate, ridge_optimum
from dane.problems.stacked import StackedRidge
from helpers import ridge_shards, simulate, simulate_stacked


def test_identical_shards_eta1_mu0_reach_the_optimum_in_one_round():
    # With H_i = H for all i, the local solve is w_t - H^{-1} g: one exact Newton step.  The 4 workers' identical
    # shards stacked (one computation for all 4, `helpers.simulate_stacked`): the identity is the point here.
    X, y = generate(800, 40, "decay", 1.0, 3)
    lam = 0.005
    w_star = ridge_optimum(X, y, lam)
    problem = StackedRidge(X.expand(4, -1, -1), y.expand(4, -1), lam, scale=1 / 800, w_star=w_star)
    for safeguard in (False, True):
        (algo, records, _), *_ = simulate_stacked(DANEConfig(eta=1.0, mu=0.0, safeguard=safeguard), problem, rounds=1)
        assert records[0]["suboptimality"] > 1.0
        assert records[1]["suboptimality"] <= 1e-10
        torch.testing.assert_close(algo.iterate, w_star, rtol=0, atol=1e-10)


@pytest.fixture(scope="module")
def ridge_n18000_m2():
    """The two shards of ridge_synthetic at N = 18000, d = 500 (iso), built once (their rows and local Hessians
    cost more than the runs) for the tests that run on them; a run leaves only its factor caches in them."""
    return ridge_shards(2, RidgeSyntheticConfig(n_samples=18000, dim=500, covariance="iso"))


@pytest.mark.parametrize("safeguard", [False, True])
def test_synthetic_ridge_n18000_m2_reaches_1e10_within_10_rounds(safeguard, ridge_n18000_m2):
    (_, records, _), _ = simulate(DANEConfig(safeguard=safeguard), ridge_n18000_m2, rounds=10, tol=1e-10)
    assert records[-1]["suboptimality"] <= 1e-10
    assert records[-1]["round"] <= 10
    # Two grouped allreduces per round, the metrics riding in the first: nothing extra.
    assert records[-1]["comm_rounds"] == 2 * records[-1]["round"]


def test_the_final_evaluations_record_repeats_none_of_danes_own_keys():
    """docs/results.md: the record of round ``rounds`` (the final evaluation, after the last round) has the metrics
    and counters and none of DANE's ``mu``, ``spread``, ``accepted`` (here the safeguard keeps the last trial: no
    ``accepted: false``), where GD's repeats its ``lr``; round 0's record has no ``spread``, the others all three."""
    from dane.baselines import GDConfig

    problems = ridge_shards(2, RidgeSyntheticConfig(n_samples=400, dim=10))
    (algo, records, _), _ = simulate(DANEConfig(), problems, rounds=3)
    own = {"mu", "spread", "accepted"}
    assert [sorted(own & set(r)) for r in records] == \
        [["accepted", "mu"], sorted(own), sorted(own), []]
    assert {"objective", "grad_norm", "suboptimality", "bytes_sent", "comm_rounds"} <= set(records[-1])
    assert algo.comm.calls == records[-1]["comm_rounds"] + 1 == 2 * 3 + 1  # the final evaluation's: in no record
    (_, gd, _), _ = simulate(GDConfig(lr=0.1), problems, rounds=2)
    assert [r["lr"] for r in gd] == [0.1] * 3


def test_suboptimality_identity_matches_objective_difference():
    problem = RidgeSyntheticConfig(n_samples=900, dim=30, seed=5).build_stacked(3)  # 3 equal shards, stacked
    (_, records, _), *_ = simulate_stacked(DANEConfig(mu=0.1), problem, rounds=3)
    X, y = generate(900, 30, "iso", 1.0, 5)
    w_star = problem.w_star
    optimum = float(((X @ w_star - y) ** 2).mean() + 0.005 * w_star @ w_star)
    for record in records:
        assert math.isclose(record["objective"] - optimum, record["suboptimality"], rel_tol=1e-9, abs_tol=1e-9)


def test_closed_form_local_solve_equals_conjugate_gradient_on_the_subproblem():
    config = RidgeSyntheticConfig(n_samples=600, dim=40, covariance="decay", seed=2)
    problem = config.build(1, 3)
    gen = torch.Generator().manual_seed(0)
    anchor, linear = torch.randn(40, generator=gen, dtype=torch.float64), torch.randn(40, generator=gen, dtype=torch.float64)
    mu = 0.3
    w = problem.prox_solve(anchor, linear, mu)
    # CG on the stationarity condition (H_i + mu I) w = b_i + linear + mu * anchor, built from the raw rows.
    X, y = generate(600, 40, "decay", 1.0, 2)
    from dane.data.sharding import iid_shards
    idx = iid_shards(600, 3, 2)[1]
    Xi, yi = X[idx].numpy(), y[idx].numpy()
    H = 2 * 3 / 600 * Xi.T @ Xi + (2 * 0.005 + mu) * np.eye(40)
    rhs = 2 * 3 / 600 * Xi.T @ yi + linear.numpy() + mu * anchor.numpy()
    w_cg, info = scipy.sparse.linalg.cg(H, rhs, rtol=1e-14, atol=0, maxiter=10_000)
    assert info == 0
    np.testing.assert_allclose(w.numpy(), w_cg, rtol=0, atol=1e-9)
    # and DANE's form of the same solve: w_t - eta (H_i + mu I)^{-1} g
    g = torch.randn(40, generator=gen, dtype=torch.float64)
    w_t = torch.randn(40, generator=gen, dtype=torch.float64)
    w_dane = problem.prox_solve(w_t, problem.grad(w_t) - 0.7 * g, mu)
    np.testing.assert_allclose(w_dane.numpy(), w_t.numpy() - 0.7 * np.linalg.solve(H, g.numpy()), rtol=0, atol=1e-10)
    # as DANE calls it, with the anchor's gradient it already has
    w_given = problem.prox_solve(w_t, problem.grad(w_t) - 0.7 * g, mu, anchor_grad=problem.grad(w_t))
    np.testing.assert_allclose(w_given.numpy(), w_dane.numpy(), rtol=0, atol=1e-13)


def test_safeguard_converges_where_plain_dane_diverges():
    # docs/design.md, "DANE without damping": mu=0 diverges once n_i <= ~3d; N=6000, m=8 gives n_i=750 = 1.5 d.
    problems = ridge_shards(8, RidgeSyntheticConfig(n_samples=6000, dim=500, covariance="iso"))
    (_, plain, _), *_ = simulate(DANEConfig(mu=0.0, safeguard=False), problems, rounds=30)
    assert plain[-1]["suboptimality"] > 1e3 * plain[0]["suboptimality"] or not math.isfinite(plain[-1]["objective"])
    (_, guarded, _), *_ = simulate(DANEConfig(mu=0.0, safeguard=True), problems, rounds=40, tol=1e-10)
    assert guarded[-1]["suboptimality"] <= 1e-10
    objectives = [r["objective"] for r in guarded]
    assert all(b <= a + 1e-12 * abs(a) for a, b in zip(objectives, objectives[1:]))  # never an ascent
    assert any(r.get("accepted") is False for r in guarded)  # the guard did act
    assert guarded[-1]["mu"] > 0


@pytest.mark.parametrize("n_samples,m,cov", [(10000, 16, "iso"), (8000, 32, "decay"), (3000, 12, "iso")])
def test_safeguard_objective_is_monotone_and_converges(n_samples, m, cov):
    problems = ridge_shards(m, RidgeSyntheticConfig(n_samples=n_samples, dim=200, covariance=cov, seed=7))
    (_, records, _), *_ = simulate(DANEConfig(), problems, rounds=80, tol=1e-9)
    assert records[-1]["suboptimality"] <= 1e-9
    objectives = [r["objective"] for r in records]
    assert all(b <= a + 1e-12 * abs(a) for a, b in zip(objectives, objectives[1:]))


@pytest.mark.parametrize("cov", ["iso", "decay"])
def test_spread_estimate_is_the_rms_hessian_deviation_along_the_step(cov):
    # delta^2 = mean_i ||(H_i - H) s||^2 / ||s||^2 and kappa = s^T H s / ||s||^2, measured from
    # gradients alone; the guard keeps delta * min(1, delta / kappa).
    config = RidgeSyntheticConfig(n_samples=400, dim=20, seed=1, covariance=cov)
    problems = ridge_shards(4, config)  # for the closed form; the run stacks the same 4 shards (batched path)
    (algo, records, iterates), *_ = simulate_stacked(DANEConfig(mu=0.5), config.build_stacked(4), rounds=2)
    s = iterates[1] - iterates[0]
    H = sum(p.A for p in problems) / 4 + 2 * 0.005 * torch.eye(20, dtype=torch.float64)
    delta = math.sqrt(sum(float(((p.A + 2 * 0.005 * torch.eye(20, dtype=torch.float64) - H) @ s).square().sum())
                          for p in problems) / 4 / float(s @ s))
    kappa = float(s @ H @ s) / float(s @ s)
    assert math.isclose(algo.guard.spread, delta * min(1.0, delta / kappa), rel_tol=1e-8)


@pytest.mark.parametrize("key,value", [("eta", 0), ("eta", -1.0), ("mu", -1), ("eta", "abc")])
def test_invalid_hyperparameters_name_key_and_value(key, value):
    from dane.errors import ConfigError
    with pytest.raises(ConfigError, match=rf"algorithm\.{key} must be"):
        DANEConfig(**{key: value})


def assert_within_1_5x_of_the_best_fixed_mu(problems):
    def rounds_to_1e10(config, cap=150):
        (_, records, _), *_ = simulate(config, problems, rounds=cap, tol=1e-10)
        return (records[-1]["round"] if records[-1]["suboptimality"] <= 1e-10 else math.inf), records

    auto, records = rounds_to_1e10(DANEConfig())
    # each fixed μ, nearest the auto run's last μ first, runs to the best count so far at most (150 at first): one
    # not at 1e-10 by then is not the best, so the grid's minimum is exact
    last = max([r["mu"] for r in records if "mu" in r][-1], 1e-12)
    fixed: dict = {}
    for mu in sorted((0.01, 0.03, 0.1, 0.3, 1, 3), key=lambda mu: abs(math.log(mu / last))):
        fixed[mu] = rounds_to_1e10(DANEConfig(mu=mu, safeguard=False), min([150, *fixed.values()]))[0]
    assert min(fixed.values()) < math.inf
    assert auto <= 1.5 * min(fixed.values()), (auto, fixed)


# m=32 decay costs 12-16 s (7 runs of up to 150 rounds at 32 workers): slow, like the full grid, which has
# decay cells at m=16, 32 and 64; m=8 iso keeps the property in the fast suite
@pytest.mark.parametrize("n_samples,m,cov", [(2400, 8, "iso"), pytest.param(2400, 32, "decay", marks=pytest.mark.slow)])
def test_safeguard_is_within_1_5x_of_the_best_fixed_mu(n_samples, m, cov):
    assert_within_1_5x_of_the_best_fixed_mu(
        ridge_shards(m, RidgeSyntheticConfig(n_samples=n_samples, dim=200, covariance=cov, seed=11)))


#: the issue's (N, m) grid at d=500, both covariances, and the three points off it where
#: the rule came closest to the bound when it was tuned (1.36x, 1.30x, 1.30x)
ISSUE_GRID = [(n, m, cov) for cov in ("iso", "decay") for n in (6000, 10000, 14000, 18000) for m in (2, 4, 8, 16, 64)]
ISSUE_GRID += [(3000, 12, "decay"), (25000, 32, "iso"), (4000, 40, "decay")]


@pytest.mark.slow
@pytest.mark.parametrize("n_samples,m,cov", ISSUE_GRID)
def test_safeguard_is_within_1_5x_of_the_best_fixed_mu_on_the_full_grid(n_samples, m, cov):
    assert_within_1_5x_of_the_best_fixed_mu(ridge_shards(m, RidgeSyntheticConfig(n_samples=n_samples, covariance=cov)))


MU_GRID = (0, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 0.3, 1, 3)  # issue 23's grid of fixed μ


def rounds_to_relative(problem, workers: int, config, *, tol: float = 1e-8, rounds: int = 150, stop: bool = False):
    """Rounds of ``config`` until suboptimality <= tol |O*| (inf if never), and the records; ``stop``: the run ends
    there (the fit's ``tol``), where only the count and the records up to it are read."""
    import dane

    records = dane.fit(problem, config, workers=workers, rounds=rounds, tol=tol if stop else None).records
    optimum = records[0]["objective"] - records[0]["suboptimality"]
    hit = [r["round"] for r in records if r["suboptimality"] <= tol * abs(optimum)]
    return (hit[0] if hit else math.inf), records


def rare_value_ridge(lam: float):
    import dane
    from dane.synthetic.defaults_data import rare_onehot

    X, y, intercept = rare_onehot("squared", n=2000, rare=3, seed=0)
    return dane.problems.Ridge(X, y, lam=lam, fit_intercept=intercept, optimum="auto")


@pytest.mark.parametrize("lam", [1e-3, 1e-5])
def test_safeguard_is_near_the_best_fixed_mu_on_a_rare_value_and_moves_mu_both_ways(lam):
    # A one-hot value in 3 of 2000 rows: some of 8 shards hold none of it.  At lam=1e-3 plain
    # DANE is safe and the old never-decreasing rule took 3-10x its rounds; at 1e-5 mu=0 diverges.
    problem = rare_value_ridge(lam)
    # the grid around the best mu; the rest of MU_GRID takes 18 to >150 rounds here (make bench, section defaults).
    # Each run stops at the target; after mu = 0 (run to 40: whether it diverges is asserted below), each fixed mu
    # runs to the best count so far at most: one not there by then is not the best, so the minimum is exact
    fixed: dict = {}
    for mu in (0, 1e-3, 1e-4, 1e-2):
        cap = min([40, *fixed.values()])
        fixed[mu] = rounds_to_relative(problem, 8, DANEConfig(mu=mu, safeguard=False), rounds=cap, stop=True)[0]
    auto, records = rounds_to_relative(problem, 8, DANEConfig(), rounds=40)
    best = min(fixed.values())
    # The best fixed mu is a sharp minimum here (at 1e-3: 4-5 rounds, against 18 at 1e-4 and 35 at 1e-2).  The
    # never-decreasing rule took 26-49 rounds; the first evidence rule 9 at both lam (was asserted <= 2.5x).
    # At lam=1e-5 plain DANE's first step is rejected, and mu jumps to shortening_mu (0.00164), read off that
    # step, not to the larger delta rule (0.00276, which cost two more rounds).
    assert best < math.inf and auto <= 1.5 * best, (auto, fixed)
    objectives = [r["objective"] for r in records]
    assert all(b <= a + 1e-12 * abs(a) for a, b in zip(objectives, objectives[1:]))  # never an ascent
    mus = [r["mu"] for r in records[:auto]]
    # few distinct mu: an exact local solver refactorizes at most this often.  Was <= 3; at lam=1e-5 mu goes
    # 0 -> 0.00164 (rejected step) -> 0.00082 (undershoot) -> 0.00116 (overshoot: between the two), which
    # brackets the sharp best 1e-3 for one more factorization of a d=21 matrix.
    assert len(set(mus)) <= 4
    if fixed[0] == math.inf:  # mu=0 diverges: the rule went up, and came back down towards the best mu
        assert any(b < a for a, b in zip(mus, mus[1:])) and any(b > a for a, b in zip(mus, mus[1:]))


def test_safeguard_jumps_on_a_settled_overshoot_and_is_within_1_5x_of_the_grid():
    # Gaussian features, 250 rows per shard (make bench's large_targets family, ridge lam=1e-5, m=8): plain
    # DANE overshoots every round by a ratio that settles near 0.16, under the 0.25 of an unsettled step, so
    # the old rule kept mu=0 (7 rounds against the grid's best 4, 1.75x).  Jumping once the rate has
    # settled (two ratios within 10%) costs one new mu and lands near the best.
    import dane
    from dane.synthetic.defaults_data import large_targets

    X, y, intercept = large_targets("squared")
    problem = dane.problems.Ridge(X, y, lam=1e-5, fit_intercept=intercept, optimum="auto")
    auto, records = rounds_to_relative(problem, 8, DANEConfig(), rounds=60, stop=True)
    # a fixed mu is run to the auto run's count (and the best fixed count so far) only, and stops at the target:
    # one that has not reached it by then takes more rounds than auto or the best (inf here), so it cannot fail
    # the 1.5x bound; one that has gives its count as 60 rounds do
    fixed: dict = {}
    for mu in (0.0, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 0.3, 1.0, 3.0):  # issue 23's grid
        cap = min([auto if auto < math.inf else 60, *fixed.values()])
        fixed[mu] = rounds_to_relative(problem, 8, DANEConfig(mu=mu, safeguard=False), rounds=cap, stop=True)[0]
    assert auto <= 1.5 * min(fixed.values()), (auto, fixed)
    assert len({r["mu"] for r in records[:auto]}) == 2  # mu = 0, then one jump: one new factorization


@pytest.mark.parametrize("kappa, kappa_i, mu", [(1.0, 0.7, 0.6), (0.0015, 0.0005, 0.0014), (2.0, 1.9, 5.0)])
def test_undamp_takes_a_settled_undershooting_mode_to_the_mu_where_it_is_exact(kappa, kappa_i, mu):
    # One mode: global curvature kappa, local kappa_i, damped by mu, contracts by rho = 1 - kappa/(kappa_i + mu)
    # per round (an undershoot).  The mu that makes the local model exact along it is kappa - kappa_i.
    from dane.safeguard import snap, undamp

    rho = 1.0 - kappa / (kappa_i + mu)
    assert 0 < rho < 1
    assert undamp(mu, rho, kappa, 0.0) == snap(kappa - kappa_i)  # floor 0, as MuSafeguard(0.0) has


@pytest.mark.slow  # 26 s; the fast suite keeps the safeguard's grid tests on synthetic data
def test_safeguard_beats_every_fixed_mu_on_logistic_breast_cancer():
    # Logistic Hessians move with w, so no single mu suits the whole run: none on the grid reaches
    # relative 1e-8 in 150 rounds here, while the evidence rule does (measured 51 rounds).
    from sklearn.datasets import load_breast_cancer

    import dane

    X, y = load_breast_cancer(return_X_y=True)
    problem = dane.problems.LogReg((X - X.mean(0)) / X.std(0), y, lam=1e-3, fit_intercept=True, optimum="auto")
    auto, records = rounds_to_relative(problem, 4, DANEConfig())
    assert auto <= 80
    for mu in (1e-3, 1e-2, 0.1):
        assert rounds_to_relative(problem, 4, DANEConfig(mu=mu, safeguard=False), rounds=auto)[0] == math.inf
    accepted = [r["objective"] for r in records[:auto] if r["accepted"]]
    assert all(b <= a + 1e-12 * abs(a) for a, b in zip(accepted, accepted[1:]))


def test_safeguard_learns_nothing_from_steps_at_round_off(ridge_n18000_m2):
    # Run on past the optimum (tol=None): once the steps are round-off, the y_i are noise, and
    # a spread learnt from them raised mu (and refactorized) round after round.  mu must stay put.
    (algo, records, iterates), _ = simulate(DANEConfig(), ridge_n18000_m2, rounds=60)
    converged = next(r["round"] for r in records if r["suboptimality"] <= 1e-20)
    norm = torch.linalg.vector_norm
    steps = [float(norm(b - a) / norm(a)) for a, b in zip(iterates, iterates[1:])]
    assert max(steps[converged + 2:]) < 1e-13  # the run is at round-off from here on
    mus = [r["mu"] for r in records[converged:-1]]  # the last record is the final evaluation: no step, no mu
    assert len(set(mus)) == 1, mus


@pytest.mark.parametrize("r", [1e-3, 0.16, 0.4, 1.0, 30.0])
def test_balanced_damping_makes_the_extreme_modes_contract_equally_and_faster_than_removing_the_worst(r):
    # The one-dimensional model of MuSafeguard's jump from mu = 0: local curvatures between kappa/(1 + r)
    # (the mode that overshot by r) and kappa (no overshoot); with mu = u kappa the errors are 1 - 1/(a + u)
    # and 1 - 1/(1 + u), a = 1/(1 + r).  balanced_damping makes them equal and opposite.
    from dane.dane import balanced_damping

    u, a = balanced_damping(r), 1 / (1 + r)
    worst, least = 1 - 1 / (a + u), 1 - 1 / (1 + u)
    assert worst == pytest.approx(-least, rel=1e-12)
    assert 0 < least < r / (1 + 2 * r)  # removing the worst mode exactly (u = r/(1+r)) leaves r/(1+2r)
    # neither extreme can do better: any other u makes one of the two errors larger
    for other in (0.9 * u, 1.1 * u):
        assert max(abs(1 - 1 / (a + other)), abs(1 - 1 / (1 + other))) > abs(least)


def test_safeguard_lands_near_the_best_fixed_mu_in_one_jump_on_two_iid_shards():
    # Two i.i.d. shards of 4.5 d rows: plain DANE overshoots in every mode; the balanced jump from mu = 0
    # lands within a factor 2 of the best fixed mu of the grid (0.3 here), so the run is within 1.5x of it.
    problems = ridge_shards(2, RidgeSyntheticConfig(n_samples=1800, dim=200, covariance="iso"))
    rounds = {mu: rounds_to_1e8(DANEConfig(mu=mu, safeguard=False), problems) for mu in (0.1, 0.2, 0.3, 0.5, 1.0)}
    best = min(rounds, key=rounds.get)
    (_, records, _), _ = simulate(DANEConfig(), problems, rounds=40, tol=1e-8)
    jumped = next(r["mu"] for r in records if r["mu"] > 0)
    assert best / 2 <= jumped <= 2 * best, (jumped, rounds)
    assert records[-1]["round"] <= 1.5 * rounds[best], (records[-1]["round"], rounds)


def rounds_to_1e8(config: DANEConfig, problems) -> int:
    (_, records, _), _ = simulate(config, problems, rounds=40, tol=1e-8)
    return records[-1]["round"]


@pytest.mark.slow
def test_safeguard_factors_twice_on_the_strong_scaling_ridge():
    # The instance of make bench's strong scaling (N=18000, d=2000, m=2): plain DANE overshoots, and the
    # balanced jump lands on the best fixed mu of a fine grid (removing the worst mode exactly landed on twice
    # it, and a third mu followed), so the run factors H_i + mu I for two mu only: 0 and the jump.
    problems = ridge_shards(2, RidgeSyntheticConfig(n_samples=18000, dim=2000, covariance="iso"))
    grid = (0.15, 0.21, 0.3, 0.42, 0.6)
    rounds = {mu: rounds_to_1e8(DANEConfig(mu=mu, safeguard=False), problems) for mu in grid}
    best = min(rounds, key=rounds.get)
    (_, records, _), _ = simulate(DANEConfig(), problems, rounds=40, tol=1e-8)
    mus = sorted({r["mu"] for r in records})
    assert len(mus) == 2 and mus[0] == 0.0, mus
    assert best / 1.2 <= mus[1] <= best * 1.2, (mus, rounds)


@pytest.mark.parametrize("k, mu, h", [(0.1, 0.0, 1.0), (0.02, 0.01, 3.0), (1e-4, 0.0, 5.0)])
def test_shortening_mu_gives_a_one_dimensional_quadratic_its_newton_step(k, mu, h):
    # One dimension: the local curvature k + mu made the step s = -g/(k + mu) too long for the global
    # curvature h (the objective rose).  The quadratic model along s is exact here, so the mu it asks for
    # makes the local curvature equal h: the next step is the exact minimizer, -g/h.
    from dane.dane import shortening_mu, snap

    g, before = 2.0, 1.0
    s = -g / (k + mu)
    after = before + g * s + 0.5 * h * s * s
    assert after > before  # rejected
    assert shortening_mu(mu, g * s, s * s, before, after) == snap(mu + (h - k - mu))
    assert shortening_mu(mu, g * s, s * s, before, before - 1e-3) == 0.0  # no rise: nothing to shorten
    assert shortening_mu(mu, g * s, s * s, before, math.inf) == 0.0  # no model from inf or nan
    assert shortening_mu(mu, g * s, s * s, before, math.nan) == 0.0


def test_the_safeguards_moves_of_mu_are_the_summarys_adaptations():
    """Each round whose μ differs from the last round's carries the move as its ``adapted`` event, and the summary
    lists exactly those (round, from, to) with a trigger; without the safeguard the run applied no package rule."""
    import dane

    rng = np.random.default_rng(0)
    X = rng.standard_normal((400, 8)) * np.logspace(-1, 1, 8)
    problem = dane.problems.LogReg(X, np.where(rng.standard_normal(400) > 0, 1.0, -1.0), lam=1e-3,
                                   local_solver="cholesky")  # given: local_solver=auto's choice is a rule applied
    result = dane.fit(problem, "dane", workers=8, rounds=12)
    mus = [r["mu"] for r in result.records[:-1]]  # each round's μ (the last record is the final evaluation)
    moves = [(t, mus[t - 1], mus[t]) for t in range(1, len(mus)) if mus[t] != mus[t - 1]]
    events = result.summary["adaptations"]
    assert len(moves) >= 2 and [(e["round"], e["from"], e["to"]) for e in events] == moves
    assert {e["key"] for e in events} == {"algorithm.mu"} and all(e["trigger"] for e in events)
    assert result.summary["adaptations_attached"] == ["safeguard"] and result.summary["package_rules_applied"]
    plain = dane.fit(problem, "dane", workers=8, rounds=3, safeguard=False)
    assert plain.summary["adaptations"] == [] and plain.summary["package_rules_applied"] is False


def _diverged_run(tmp_path, algorithm: str, rounds: int, problem: dict, **algorithm_keys):
    """A small ridge_synthetic run to its end through `dane.loop.launch.execute` (the command line's path, in
    process): its DivergenceError's line, its records and its summary."""
    from dane.api import algorithm_config
    from dane.errors import DivergenceError
    from dane.loop.launch import execute
    from dane.loop.spec import Communication, RunControl, RunSpec
    from dane.loop.stopping import StopRule
    from dane.records.results import read_rounds, read_summary

    spec = RunSpec(problem=RidgeSyntheticConfig(n_samples=200, dim=10, **problem),
                   algorithm=algorithm_config(algorithm, **algorithm_keys), comm=Communication(workers=2),
                   control=RunControl(stop=StopRule(rounds=rounds), quiet=True))
    with pytest.raises(DivergenceError) as diverged:
        execute(spec, str(tmp_path))
    return str(diverged.value), read_rounds(tmp_path), read_summary(tmp_path)


def test_a_local_solve_that_diverges_at_mu_0_ends_the_run_diverged_naming_its_step(tmp_path):
    """SVRG's given step 1 on ridge_synthetic (L_max far above 1) returns a nan trial.  The safeguard rejects it, and
    at μ = 0 with nothing measured has no scale to raise μ by (`gives_up`): the run ends at round 1 with the
    divergence line (exit 3 on the command line), its records and summary kept, the key named.  It took μ to nan,
    and ran nan trials to the round cap (exit 0); InexactDANE's passes=auto raised ValueError at the next solve."""
    line, records, summary = _diverged_run(tmp_path, "dane", 8, {"local_solver": "svrg", "svrg_lr": 1.0})
    assert line == (f"dane diverged at round 1 (objective {records[0]['objective']:.3g}); results so far are in "
                    f"{tmp_path}; set problem.svrg_lr below 1 (SVRG's given step diverges), or null (1/L_max)")
    assert [(r["round"], r["accepted"], r["mu"]) for r in records] == [(0, True, 0.0), (1, False, 0.0)]
    assert records[1]["objective"] == records[0]["objective"]  # the last accepted iterate's record
    assert summary["status"] == "diverged"
    assert summary["stopped_by"].startswith(
        "the trial at mu = 0 not finite (a local solve diverged or overflowed); nothing measured to raise mu by: "
        "set problem.svrg_lr below 1 (SVRG's given step diverges), or null (1/L_max)")
    assert summary["remedy"] == "set problem.svrg_lr below 1 (SVRG's given step diverges), or null (1/L_max)"


def test_trials_that_stay_nan_as_mu_rises_end_the_run_after_five(tmp_path):
    """From a μ floor of 1 each nan trial is rejected and μ goes up by the rejection's Rprop move, x4 on the grid
    (finite: the shortening μ and the curvature scale read nothing from it); SVRG's given step only gets less stable
    as μ grows, and after `NON_FINITE_TRIALS` = 5 in a row the run ends diverged, naming InexactDANE's own key.
    It ran rejected rounds to the cap (exit 0)."""
    line, records, summary = _diverged_run(tmp_path, "inexact_dane", 12, {}, lr=1.0, mu=1.0)
    assert line == (f"inexact_dane diverged at round 5 (objective {records[0]['objective']:.3g}); results so far are in "
                    f"{tmp_path}; set algorithm.lr below 1 (SVRG's given step diverges), or null (1/L_max)")
    assert [r["mu"] for r in records] == [1.0, 4.0, 16.0, 64.0, 256.0, 1024.0]
    assert [r["accepted"] for r in records] == [True] + [False] * 5
    assert summary["stopped_by"].startswith(
        "5 trials in a row, the last at mu = 256 not finite (a local solve diverged or overflowed); raising mu (to "
        "1.02e+03) does not bring them back: set algorithm.lr below 1 (SVRG's given step diverges), or null (1/L_max)")
    assert summary["remedy"] == "set algorithm.lr below 1 (SVRG's given step diverges), or null (1/L_max)"


def test_an_eta_that_overflows_the_step_names_algorithm_eta(tmp_path):
    """η = 1e300 with the exact (Cholesky) solve: a step of ~1e300 whose objective overflows to inf.  It took μ to
    nan and stopped with "the local Hessian plus nan I is not positive definite on this shard; use mu > 0"."""
    line, records, summary = _diverged_run(tmp_path, "dane", 8, {}, eta=1e300)
    assert line.endswith(f"{tmp_path}; set algorithm.eta below 1e+300 (the paper's is 1)")
    assert [(r["round"], r["accepted"], r["mu"]) for r in records] == [(0, True, 0.0), (1, False, 0.0)]
    assert summary["stopped_by"].startswith("the trial at mu = 0 not finite (a local solve diverged or overflowed); "
                                            "nothing measured to raise mu by: set algorithm.eta below 1e+300")
    assert summary["remedy"] == "set algorithm.eta below 1e+300 (the paper's is 1)"


@pytest.mark.parametrize("eta, remedy", [
    (1.0, "set algorithm.mu > 0 (a floor on mu: the local models may be singular at mu = 0)"),  # the paper's η
    (1.5, "set algorithm.eta below 1.5 (the paper's is 1)"),
])
def test_the_remedy_names_eta_only_above_the_papers_1(eta, remedy):
    """`DANE.remedy` on an exact solve: η = 1 is the paper's, nothing to lower; the μ floor is what is left."""
    (shard,) = ridge_shards(1, RidgeSyntheticConfig(n_samples=60, dim=4))
    assert DANEConfig(eta=eta).build(shard, LocalCommunicator()).remedy() == remedy
