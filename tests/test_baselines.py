"""The convex baselines against closed forms, run by the in-process simulator and the Hydra entry point.

Small ridge problems (N=2000, d=50, λ=0.005) keep every test well under a second.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

import dane
from dane.baselines import (ADMM, ADMMConfig, GDConfig, LocalSGDConfig, OSAConfig, lanczos_max_eig, local_steps,
                       residual_balance)
from dane.comm import ThreadGroup, ring_allreduce_bytes
from dane.errors import ConfigError
from dane.loop.launch import execute
from dane.problems import QuadraticProblem, RidgeSyntheticConfig
from dane.problems.ridge import generate, quadratic_shard
from dane.records.results import read_rounds, read_summary
from dane.loop.runner import run
from dane.loop.stopping import StopRule
from dane.synthetic.defaults_data import rare_onehot
from dane.experiments.config import run_spec
import helpers
from helpers import composed, simulate, simulate_stacked

RIDGE = RidgeSyntheticConfig(n_samples=2000, dim=50)
M = 4


def ridge_shards(m: int = M, config: RidgeSyntheticConfig = RIDGE):
    return helpers.ridge_shards(m, config)


def global_hessian(problems) -> torch.Tensor:
    return sum(p.A + 2 * p.lam * torch.eye(p.dim, dtype=p.dtype) for p in problems) / len(problems)


def local_optimum(p: QuadraticProblem) -> torch.Tensor:
    return torch.linalg.solve(p.A + 2 * p.lam * torch.eye(p.dim, dtype=p.dtype), p.b)


# --- ADMM -------------------------------------------------------------------------------------------

def test_admm_converges_to_the_ridge_optimum_and_its_primal_residual_vanishes():
    problems = ridge_shards()
    (algo, records, _), *_ = simulate(ADMMConfig(rho=1.0, adaptive_rho=False), problems, rounds=60)
    w_star = problems[0].w_star
    assert records[-1]["suboptimality"] <= 1e-8
    assert torch.allclose(algo.iterate, w_star, rtol=0, atol=1e-7)
    primal = [r["primal_residual"] for r in records[1:]]
    assert primal[-1] < 1e-6 and primal[-1] < 1e-6 * primal[0]
    assert records[-1]["dual_residual"] < 1e-6
    assert "primal_residual" not in records[0]  # no x before the first round
    # one allreduce per round: the residual scalar rides in the next round's call
    assert [r["comm_rounds"] for r in records] == list(range(len(records)))


def test_admm_fixed_point_is_the_regularised_optimum_on_one_worker():
    # m=1: x = argmin f + ρ/2||x - z + u||², z = ρ v/(ρ+2λ); at convergence z solves the full ridge problem.
    (problem,) = ridge_shards(1)
    (algo, records, _), = simulate(ADMMConfig(rho=2.0, adaptive_rho=False), [problem], rounds=80)
    assert records[-1]["suboptimality"] <= 1e-10
    assert torch.allclose(algo.iterate, problem.w_star, rtol=0, atol=1e-8)


def test_admm_primal_residual_matches_its_definition():
    problems = ridge_shards()
    results = simulate(ADMMConfig(rho=0.5, adaptive_rho=False), problems, rounds=3)
    # the record of z_1 carries sqrt(Σ_i ||x_i^1 - z_1||²); recompute x_i^1 = argmin f_i + ρ/2||x - z_0||²
    z0, z1 = results[0][2][0], results[0][2][1]
    x1 = [torch.linalg.solve(p.A + 0.5 * torch.eye(p.dim, dtype=p.dtype), p.b + 0.5 * z0) for p in problems]
    expected = math.sqrt(sum(float((x - z1).square().sum()) for x in x1))
    assert results[0][1][1]["primal_residual"] == pytest.approx(expected, rel=1e-10)
    assert results[0][1][1]["dual_residual"] == pytest.approx(0.5 * 2 * float((z1 - z0).norm()), rel=1e-12)


def test_admm_default_rho_is_sqrt_of_the_mean_extreme_local_eigenvalues_and_stays_fixed():
    problems = ridge_shards()
    spectra = [torch.linalg.eigvalsh(p.A + 2 * p.lam * torch.eye(p.dim, dtype=p.dtype)) for p in problems]
    mu_low, L_bar = (sum(float(e[k]) for e in spectra) / M for k in (0, -1))
    assert mu_low <= float(torch.linalg.eigvalsh(global_hessian(problems))[0])  # λ_min is concave: a lower bound
    results = simulate(ADMMConfig(power_iters=50), problems, rounds=40)  # 50 products >= dim: the Ritz values are exact
    records = results[0][1]
    assert records[0]["rho"] == pytest.approx(math.sqrt(mu_low * L_bar), rel=1e-10)
    assert {r["rho"] for r in records} == {records[0]["rho"]}  # an estimated ρ is not rebalanced (adaptive_rho=None)
    assert [r["comm_rounds"] for r in records[:3]] == [1, 2, 3]  # the two scalars' allreduce, then one a round
    assert all(a.rho == records[0]["rho"] for a, _, _ in results)  # every worker agrees


@pytest.mark.slow  # 7 s; make bench's defaults table holds ADMM's default against its grid on every cell
def test_admm_default_rho_is_within_2x_of_the_best_fixed_rho_on_a_rare_value_instance():
    """The defaults benchmark's rare-value logistic cell (lam=1e-3, m=4), where adaptive ρ from 1 took 321 allreduces
    against 39 at the best fixed ρ (0.01): the grid around the best, capped at 120 rounds (its ends need 256-343)."""
    X, y, _ = rare_onehot("logistic")
    problem = dane.problems.LogReg(X, y, lam=1e-3, optimum="auto")

    def allreduces(**keys) -> float:
        result = dane.fit(problem, "admm", workers=4, rounds=120, tol=1e-8, **keys)
        return result.records[-1]["comm_rounds"] if result.status == "converged" else math.inf

    default = allreduces()
    best = min(allreduces(rho=rho, adaptive_rho=False) for rho in (1e-3, 1e-2, 0.1))
    assert best < math.inf and default <= 2 * best, (default, best)


@pytest.mark.parametrize("rho", [0.01, 100.0])
def test_admm_adaptive_rho_rescues_a_bad_penalty(rho):
    problems = ridge_shards()
    fixed = simulate(ADMMConfig(rho=rho, adaptive_rho=False), problems, rounds=60)[0][1]
    adaptive = simulate(ADMMConfig(rho=rho, adaptive_rho=True), problems, rounds=60, tol=1e-8)[0][1]
    assert fixed[-1]["suboptimality"] > 1e-5
    assert adaptive[-1]["suboptimality"] <= 1e-8 and len(adaptive) <= 40
    assert adaptive[-1]["rho"] != rho


def numpy_admm(problems, rho: float, rounds: int, *, balance: bool = False, refresh_to: float | None = None):
    """Scaled consensus ADMM on ridge shards in NumPy, as the module docstring states it (Boyd et al. 2011, 7.1.1 and
    3.4.1): x_i = (A_i + ρI)⁻¹(b_i + ρ(z - u_i)), z' = ρ/(ρ+2λ) mean_i(x_i + u_i), u_i += x_i - z'.  The record of z_t
    carries the residuals of z_t (r = sqrt(Σ_i ||x_i^t - z_t||²), s = ρ sqrt(m) ||z_t - z_{t-1}||); records
    0..rounds.  ``balance``: after round t, ρ' = eq. 3.13 (μ=10, τ=2) of record t's residuals; ``refresh_to``:
    before round 8, ρ' = that value.  Either way u_i ← u_i ρ/ρ' (section 3.4.1).  Returns per record (ρ, r, s)
    and the iterates z_0..z_rounds."""
    A = [p.A.numpy() for p in problems]
    b = [p.b.numpy() for p in problems]
    lam, m, d = problems[0].lam, len(problems), problems[0].dim
    z, u = np.zeros(d), [np.zeros(d) for _ in problems]
    residuals, rows, iterates = None, [], []
    for t in range(rounds):
        if refresh_to is not None and t == 8:
            u, rho = [ui * (rho / refresh_to) for ui in u], refresh_to
        rows.append((rho, *(residuals or (None, None))))
        iterates.append(z)
        x = [np.linalg.solve(Ai + rho * np.eye(d), bi + rho * (z - ui)) for Ai, bi, ui in zip(A, b, u)]
        z_next = rho / (rho + 2 * lam) * np.mean([xi + ui for xi, ui in zip(x, u)], axis=0)
        u = [ui + xi - z_next for ui, xi in zip(u, x)]
        residuals = (math.sqrt(sum(np.sum((xi - z_next) ** 2) for xi in x)),
                     rho * math.sqrt(m) * np.linalg.norm(z_next - z))
        z = z_next
        if balance and rows[-1][1] is not None:
            r, s = rows[-1][1:]
            new = rho * 2 if r > 10 * s else rho / 2 if s > 10 * r else rho
            u, rho = [ui * (rho / new) for ui in u], new
    rows.append((rho, *residuals))  # the run's last record: z_T evaluated after the last round
    iterates.append(z)
    return rows, iterates


def assert_admm_matches(records, iterates, rows, numpy_iterates):
    assert [r["rho"] for r in records] == [row[0] for row in rows] and len(iterates) == len(numpy_iterates)
    for record, (_, r, s) in zip(records, rows):
        if r is None:
            assert "primal_residual" not in record
        else:
            assert record["primal_residual"] == pytest.approx(r, rel=1e-8, abs=1e-13)
            assert record["dual_residual"] == pytest.approx(s, rel=1e-8, abs=1e-13)
    for z, ref in zip(iterates, numpy_iterates):
        np.testing.assert_allclose(z.numpy(), ref, rtol=0, atol=1e-10 * max(1.0, np.abs(ref).max()))


@pytest.mark.parametrize("rho", [0.01, 100.0])
def test_admm_residual_balancing_matches_a_numpy_transcription_round_by_round(rho):
    """ρ doubles or halves after each round whose residuals are out of balance by 10x, and the scaled duals follow
    (u ← u ρ/ρ'): without that rescaling (u kept) the iterates leave the transcription's at the first change."""
    problems = ridge_shards(M, RidgeSyntheticConfig(n_samples=400, dim=10))
    (algo, records, iterates), *_ = simulate(ADMMConfig(rho=rho, adaptive_rho=True), problems, rounds=20)
    rows, numpy_iterates = numpy_admm(problems, rho, 20, balance=True)
    assert len({row[0] for row in rows}) >= 3  # ρ changed at least twice in these rounds
    assert_admm_matches(records, iterates, rows, numpy_iterates)


def test_admm_refreshed_rho_rescales_the_scaled_duals():
    """A refresh (round 8, where an estimated ρ of a non-quadratic loss is re-estimated at z_8) rescales u as residual
    balancing does; here a stand-in estimate on ridge shards so the transcription stays closed form."""
    problems = ridge_shards(M, RidgeSyntheticConfig(n_samples=400, dim=10))

    def worker(comm):
        algo = ADMM(problems[comm.rank], comm, rho=0.05, refresh=lambda at: (3.0, {}))
        iterates = [algo.iterate.clone()]
        records, _ = run(algo, StopRule(rounds=14), lambda record: iterates.append(algo.iterate.clone()))
        return records, iterates[: len(records)]

    records, iterates = ThreadGroup(M).run(worker)[0]
    rows, numpy_iterates = numpy_admm(problems, 0.05, 14, refresh_to=3.0)
    assert [row[0] for row in rows[7:10]] == [0.05, 3.0, 3.0]
    assert_admm_matches(records, iterates, rows, numpy_iterates)


def test_residual_balance_is_boyds_rule():
    assert residual_balance(1.0, primal=11.0, dual=1.0) == 2.0
    assert residual_balance(1.0, primal=1.0, dual=11.0) == 0.5
    assert residual_balance(1.0, primal=9.0, dual=1.0) == 1.0
    assert residual_balance(3.0, primal=100.0, dual=1.0, mu=50, tau=3) == 9.0
    # eq. 3.13's inequalities are strict: a ratio of exactly mu either way leaves rho
    assert residual_balance(1.0, primal=10.0, dual=1.0) == residual_balance(1.0, primal=1.0, dual=10.0) == 1.0


# --- GD ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("covariance", ["iso", "decay"])
def test_gd_step_comes_from_bounds_on_the_global_spectrum_sent_with_round_0(covariance):
    config = RidgeSyntheticConfig(n_samples=2000, dim=50, covariance=covariance)
    problems = ridge_shards(M, config)
    global_eig = torch.linalg.eigvalsh(global_hessian(problems))
    local_eig = [torch.linalg.eigvalsh(p.A + 2 * p.lam * torch.eye(p.dim, dtype=p.dtype)) for p in problems]
    L_bar, mu_low = (sum(float(e[k]) for e in local_eig) / M for k in (-1, 0))
    assert L_bar >= float(global_eig[-1]) and mu_low <= float(global_eig[0])  # λ_max convex, λ_min concave
    results = simulate(GDConfig(power_iters=50), problems, rounds=400, tol=1e-8)  # 50 >= dim: Lanczos is exact
    algo, records, _ = results[0]
    assert algo.L_est == pytest.approx(L_bar, rel=1e-10) and algo.mu_est == pytest.approx(mu_low, rel=1e-8)
    assert algo.lr == pytest.approx(min(2 / (L_bar + mu_low), 1.9 / L_bar), rel=1e-10)
    # iso is well conditioned: Nesterov's 2/(L+μ); decay is not: the cap 1.9/L̄
    assert (algo.lr * (L_bar + mu_low) == pytest.approx(2)) == (covariance == "iso")
    assert all(a.lr == algo.lr for a, _, _ in results)  # every worker agrees
    assert records[0]["comm_rounds"] == 0 and records[1]["comm_rounds"] == 1  # (μ_i, L_i) rode in round 0's allreduce
    assert records[0]["L_est"] == algo.L_est and records[0]["lr"] == algo.lr
    (entry,) = algo.defaults  # the summary's: the resolved lr with what it read
    assert entry["key"] == "algorithm.lr" and entry["value"] == algo.lr
    assert entry["stats"] == {"L_bar": algo.L_est, "mu_low": algo.mu_est, "lr_factor": 1.9}
    if covariance == "iso":
        assert records[-1]["suboptimality"] <= 1e-8
    # lr < 2 / L: the objective never increases (descent lemma)
    objectives = [r["objective"] for r in records]
    assert all(b <= a + 1e-12 for a, b in zip(objectives, objectives[1:]))


def test_gd_default_step_is_within_2x_of_the_best_lr_grid_on_a_logistic_rare_value_instance():
    """The defaults benchmark's rare-value family (small): GD's default step against lr = c / L, c in {1, 1.5, 1.9}."""
    X, y, _ = rare_onehot("logistic", n=400)
    problem = dane.problems.LogReg(X, y, lam=1e-2, optimum="auto")
    L = 0.25 * float(np.linalg.eigvalsh(X.T @ X / len(y))[-1]) + 1e-2

    made: dict = {}  # lr -> its run's allreduces: lr = 1/L is the grid's first point and the old default, one run

    def allreduces(**keys) -> int:
        if keys.get("lr") not in made:
            result = dane.fit(problem, "gd", workers=4, rounds=400, tol=1e-8, **keys)
            assert result.status == "converged", keys
            made[keys.get("lr")] = result.records[-1]["comm_rounds"]
        return made[keys.get("lr")]

    default = allreduces()
    best = min(allreduces(lr=c / L) for c in (1.0, 1.5, 1.9))
    assert default <= 2 * best, (default, best)
    assert default < allreduces(lr=1.0 / L) + 20  # the old default: 1/L after 20 allreduces of distributed Lanczos


def test_lanczos_is_exact_after_dim_products_and_beats_power_iteration():
    g = torch.Generator().manual_seed(0)
    Q, _ = torch.linalg.qr(torch.randn(30, 30, generator=g, dtype=torch.float64))
    eig = torch.linspace(1.0, 2.0, 30, dtype=torch.float64)
    H = Q @ torch.diag(eig) @ Q.T
    v0 = torch.randn(30, generator=g, dtype=torch.float64)
    assert lanczos_max_eig(lambda v: H @ v, v0, 30) == pytest.approx(2.0, rel=1e-12)
    w = v0 / v0.norm()
    for _ in range(10):
        w = H @ w
        w = w / w.norm()
    assert lanczos_max_eig(lambda v: H @ v, v0, 11) >= float(w @ H @ w)


# --- one-shot averaging -----------------------------------------------------------------------------

def test_osa_is_the_mean_of_the_local_optima_and_stops_after_its_one_round():
    """w_1 is the mean of the local optima; the run ends on w_1's record (round 1, one allreduce) with status
    one_shot, not max_rounds, and says why, whatever the cap; with tol met by w_1 it ends converged."""
    problems = ridge_shards()

    def osa(comm):
        algo = OSAConfig().build(problems[comm.rank], comm)
        assert algo.defaults == ()  # it takes no number: its summary says no package rule applied
        iterates = [algo.iterate.clone()]  # on_round(record t) sees w_{t+1}
        result = run(algo, StopRule(rounds=10), lambda record: iterates.append(algo.iterate.clone()))
        return algo, result, iterates
    results = ThreadGroup(M).run(osa)
    expected = sum(local_optimum(p) for p in problems) / len(problems)
    for algo, result, iterates in results:
        records = result.records
        assert torch.allclose(algo.iterate, expected, rtol=0, atol=1e-12)
        assert torch.equal(result.iterate, algo.iterate) and torch.equal(iterates[1], algo.iterate)
        assert [r["round"] for r in records] == [0, 1]
    algo, result, _ = results[0]
    records = result.records
    assert records[-1]["comm_rounds"] == 1  # w_1 cost the one average
    assert 0 < records[1]["suboptimality"] < records[0]["suboptimality"]
    optimum = records[1]["objective"] - records[1]["suboptimality"]
    relative = records[1]["suboptimality"] / abs(optimum)
    assert result.stopped_by == f"the one-shot average is final; suboptimality {relative:.1e} x |O*|"

    def worker(comm, stop):
        result = run(OSAConfig().build(problems[comm.rank], comm), stop)
        return result.status, result.stopped_by
    loose = relative * 1.01  # w_1 within tol: converged, at the same round
    assert ThreadGroup(M).run(lambda comm: worker(comm, StopRule(rounds=10, tol=1e-12)))[0] == \
        ("one_shot", f"the one-shot average is final; suboptimality {relative:.1e} x |O*|, above tol 1e-12")
    assert ThreadGroup(M).run(lambda comm: worker(comm, StopRule(rounds=10, tol=loose)))[0] == \
        ("converged", f"suboptimality <= {loose:g} x |O*|")


# --- local SGD --------------------------------------------------------------------------------------

def test_local_sgd_one_full_batch_step_is_gradient_descent():
    problem = RIDGE.build_stacked(M)  # the identity is the point: the 4 workers as one stacked computation
    lr = 0.3
    gd = simulate_stacked(GDConfig(lr=lr), problem, rounds=15)[0][2]
    local = simulate_stacked(LocalSGDConfig(local_steps=1, lr=lr), problem, rounds=15)[0][2]
    assert len(gd) == len(local) == 16
    for w_gd, w_local in zip(gd, local):
        assert torch.allclose(w_gd, w_local, rtol=0, atol=1e-12)


def unequal_shards(sizes=(200, 500, 900, 400)):
    X, y = generate(sum(sizes), 50, "iso", 1.0, 0)
    bounds = torch.tensor((0, *sizes)).cumsum(0).tolist()
    scale = len(sizes) / sum(sizes)
    return [quadratic_shard(X[a:b], y[a:b], 0.005, scale=scale) for a, b in zip(bounds, bounds[1:])]


def full_batch_steps(p: QuadraticProblem, w: torch.Tensor, lr: float, steps: int) -> torch.Tensor:
    H = p.A + 2 * p.lam * torch.eye(p.dim, dtype=p.dtype)
    for _ in range(steps):
        w = w - lr * (H @ w - p.b)
    return w


def test_weighted_aggregation_is_fedavgs_weighting():
    """FedAvg's weighting (McMahan et al.): worker i steps on its mean loss per row, O_i / s_i (s_i = n_i / n̄, the
    shard weight O_i carries), at lr / s_i, and the server takes Σ n_i w_i / Σ n_i."""
    problems = unequal_shards()
    results = simulate(LocalSGDConfig(local_steps=3, lr=0.1, aggregate="weighted"), problems, rounds=1)
    w0 = torch.zeros(50, dtype=torch.float64)
    n = [p.n_local for p in problems]
    local = [full_batch_steps(p, w0, 0.1 * (sum(n) / len(n)) / n_i, 3) for p, n_i in zip(problems, n)]
    expected = sum(n_i * w_i for n_i, w_i in zip(n, local)) / sum(n)
    plain_mean = sum(local) / len(local)
    assert not torch.allclose(expected, plain_mean, atol=1e-6)  # the weights matter here
    for _, _, iterates in results:
        assert torch.allclose(iterates[1], expected, rtol=0, atol=1e-12)


def test_weighted_local_sgd_with_one_full_step_is_gradient_descent_on_unequal_shards():
    """K=1, full batches: a weighted round is w − lr ∇O(w), as mean's is (it counted the shard weight twice, and
    stalled at the argmin of Σ (n_i/N) O_i: 1.4e-2 suboptimality on a logistic table)."""
    problems = unequal_shards()
    lr = 0.2
    gd = simulate(GDConfig(lr=lr), problems, rounds=6)[0][2]
    weighted = simulate(LocalSGDConfig(local_steps=1, lr=lr, aggregate="weighted"), problems, rounds=6)[0][2]
    for w_gd, w_weighted in zip(gd, weighted):
        assert torch.allclose(w_gd, w_weighted, rtol=0, atol=1e-12)


@pytest.mark.parametrize("stacked", [False, True], ids=["threads", "batched"])
def test_weighted_round_sends_what_a_mean_round_sends(stacked):
    """A weighted round allreduces n_i w_i and the metrics, mean's message at mean's size: n̄ is known from the one
    allreduce of n_i before round 0 (it allreduced n_i again every round, one float64 more a round: 12 bytes at
    m=4, on both paths)."""
    def counts(aggregate):
        config = LocalSGDConfig(local_steps=2, lr=0.1, aggregate=aggregate)
        run = simulate_stacked(config, RIDGE.build_stacked(M), rounds=3) if stacked else \
            simulate(config, unequal_shards(), rounds=3)
        return [(r["bytes_sent"], r["comm_rounds"]) for r in run[0][1]]

    sizes = ring_allreduce_bytes(8, M)  # n_i, one float64, allreduced once before round 0
    assert counts("weighted") == [(sent + sizes, calls + 1) for sent, calls in counts("mean")]


def test_local_sgd_checks_its_problem_once(monkeypatch):
    calls = []
    monkeypatch.setattr("dane.baselines.local_sgd.check_problem", lambda *args: calls.append(args))
    simulate(LocalSGDConfig(local_steps=1, lr=0.1, aggregate="weighted"), unequal_shards(), rounds=1)
    assert len(calls) == M  # one per worker, in LocalSGDConfig.build (the constructor checked again)


def test_best_election_keeps_the_model_of_the_worker_with_the_lowest_score():
    shards = unequal_shards((300, 300, 300, 300))
    offsets = [5.0, 3.0, -50.0, 1.0]  # worker 2's local objective is lowest by construction
    problems = [QuadraticProblem(p.A, p.b, p.c + c, p.lam) for p, c in zip(shards, offsets)]
    results = simulate(LocalSGDConfig(local_steps=2, lr=0.1, aggregate="best"), problems, rounds=1)
    w0 = torch.zeros(50, dtype=torch.float64)
    local = [full_batch_steps(p, w0, 0.1, 2) for p in problems]
    scores = [float(p.evaluate(w)[1][0]) for p, w in zip(problems, local)]
    assert min(range(4), key=scores.__getitem__) == 2
    for _, records, iterates in results:
        assert records[0]["elected"] == 2
        assert torch.allclose(iterates[1], local[2], rtol=0, atol=1e-14)
        assert torch.equal(iterates[1], results[2][2][1])  # bitwise worker 2's own model, on every worker
    assert results[0][1][1]["comm_rounds"] == 2  # reaching w_1 took the scores allreduce and the broadcast


def test_minibatch_gradients_are_unbiased_and_seeded():
    (problem,) = [RIDGE.build(0, 2)]
    w = torch.linspace(-1, 1, 50, dtype=torch.float64)
    batches = torch.arange(problem.n_local).reshape(4, -1)  # 1000 rows in 4 disjoint batches
    mean_batch_grad = sum(problem.batch_grad(w, idx) for idx in batches) / 4
    assert torch.allclose(mean_batch_grad, problem.grad(w), rtol=0, atol=1e-12)
    config = LocalSGDConfig(local_steps=5, batch_size=50, lr=0.05, seed=3)
    first = simulate(config, ridge_shards(2), rounds=4)
    again = simulate(config, ridge_shards(2), rounds=4)
    other = simulate(dataclasses.replace(config, seed=4), ridge_shards(2), rounds=4)
    assert all(torch.equal(a, b) for a, b in zip(first[0][2], again[0][2]))
    assert torch.equal(other[0][2][0], first[0][2][0])  # the same start, then the seed's own batches
    assert not any(torch.equal(a, b) for a, b in zip(first[0][2][1:], other[0][2][1:]))
    assert first[0][1][-1]["objective"] < first[0][1][0]["objective"]


def test_local_steps_is_plain_gradient_descent():
    assert torch.equal(local_steps(torch.tensor([4.0]), lambda w: 2 * w, lr=0.25, steps=3), torch.tensor([0.5]))


# --- configuration ----------------------------------------------------------------------------------

@pytest.mark.parametrize("factory, key, value", [
    (ADMMConfig, "rho", 0.0),
    (ADMMConfig, "rho", -1.0),
    (ADMMConfig, "adaptive_rho", "yes"),
    (ADMMConfig, "balance_mu", 1.0),
    (ADMMConfig, "balance_tau", 0.5),
    (GDConfig, "lr", -0.1),
    (GDConfig, "power_iters", 0),
    (GDConfig, "seed", 1.5),
    (LocalSGDConfig, "local_steps", 0),
    (LocalSGDConfig, "batch_size", 0),
    (LocalSGDConfig, "lr", 0.0),
    (LocalSGDConfig, "aggregate", "median"),
])
def test_bad_hyperparameters_name_the_key_and_value(factory, key, value):
    with pytest.raises(ConfigError, match=rf"algorithm\.{key}.*{value}"):
        factory(**{key: value})


def test_a_batch_larger_than_the_shard_is_rejected():
    problems = ridge_shards(2)  # 1000 of the 2000 rows each: a batch of 1500 is under the data set, over a shard
    with pytest.raises(ConfigError) as err:
        simulate(LocalSGDConfig(batch_size=1500), problems, rounds=1)
    assert str(err.value) == ("algorithm.batch_size=1500 exceeds this worker's 1000 samples; use a smaller batch or "
                              "null for the full shard")


@pytest.mark.parametrize("algorithm, overrides, check", [
    ("admm", [], lambda s: s["status"] == "converged" and s["comm_rounds"] == s["rounds"] + 1),  # + ρ's allreduce
    ("gd", [], lambda s: s["status"] == "converged" and s["comm_rounds"] == s["rounds"]),
    ("osa", [], lambda s: s["status"] == "one_shot" and s["rounds"] == s["comm_rounds"] == 1),
    ("local_sgd", ["algorithm.local_steps=1", "algorithm.aggregate=weighted"], lambda s: s["status"] == "converged"),
])
def test_hydra_entry_point_runs_each_baseline(tmp_path, algorithm, overrides, check):
    cfg = composed(f"algorithm={algorithm}", "workers=4", "rounds=60", "tol=1e-8", "problem.n_samples=2000",
                   "problem.dim=50", "quiet=true", *overrides)
    summary = execute(run_spec(cfg), str(tmp_path))
    written = read_summary(tmp_path)
    assert written.pop("provenance")["command"]  # the file also says where the run came from
    assert written == summary and summary["algorithm"] == algorithm
    assert check(summary), summary
    rounds = read_rounds(tmp_path)
    assert [r["round"] for r in rounds] == list(range(summary["rounds"] + 1))
    assert {"round", "time_s", "bytes_sent", "comm_rounds", "objective", "suboptimality"} <= set(rounds[-1])


@pytest.mark.parametrize("config, every", [
    (ADMMConfig(rho=100.0, adaptive_rho=True), 4),
    (ADMMConfig(), 4),  # ρ estimated at the start
    (GDConfig(), 4),  # lr fixed in round 0 from the workers' L_i
    (OSAConfig(), 1),  # it ends at round 1: the checkpoint between its average and w_1's record
    (LocalSGDConfig(local_steps=3, batch_size=40, lr=0.05, aggregate="best"), 4),
], ids=["admm", "admm_default", "gd_default", "osa", "local_sgd"])
def test_a_resumed_run_continues_exactly(config, every):
    def worker(comm, problems, resume_from=None):
        algo = config.build(problems[comm.rank], comm)
        saved = {}
        resume = resume_from[comm.rank] if resume_from else None
        records, _ = run(algo, StopRule(rounds=8), resume=resume, checkpoint_every=every,
                         on_checkpoint=lambda state: saved.setdefault(state["round"], state))
        return records, saved

    first = ridge_shards()
    whole = ThreadGroup(M).run(lambda comm: worker(comm, first))
    checkpoints = [saved[every] for _, saved in whole]
    # a resumed run is a new process: its shards come without the first run's cached factors, so it factors (and
    # counts, `dane.work`) what the uninterrupted run did
    again = ridge_shards()
    resumed = ThreadGroup(M).run(lambda comm: worker(comm, again, checkpoints))
    strip = lambda records: [{k: v for k, v in r.items() if k != "time_s"} for r in records]  # noqa: E731
    assert strip(resumed[0][0]) == strip(whole[0][0][every:])


def test_sync_sgd_agrees_on_one_step_count_over_unequal_shards():
    """steps_per_round=null is one pass over the mean shard: shards of 150 and 350 rows (each worker's own pass: 1
    and 3 steps of 100, whose allreduces did not pair up) take 250 // 100 = 2 steps each, agreed in round 0."""
    from dane.baselines.sync_sgd import SyncSGDConfig
    from dane.problems.glm import LinearModelShard
    from dane.losses import LOSSES

    rng = np.random.default_rng(0)
    sizes = (150, 350)
    shards = [LinearModelShard(torch.from_numpy(rng.standard_normal((n, 5))), torch.from_numpy((rng.random(n) < 0.5)
              * 1.0), LOSSES["logistic"], l2=1e-3, weight=2 / sum(sizes)) for n in sizes]
    results = simulate(SyncSGDConfig(steps_per_round=None, batch_size=100), shards, rounds=3)
    for algo, records, _ in results:
        assert algo.steps_per_round == 2 and [r["comm_rounds"] for r in records] == [0, 2, 4, 6]
        assert [(e["key"], e["value"], e["stats"]["mean_rows"]) for e in algo.defaults] == \
            [("algorithm.steps_per_round", 2, 250.0)]
