"""ADMM's default penalty ρ = sqrt(μ̲ L̄) when every shard shares a null direction (one-hot with every value + intercept).

Such a design (how the CSV path encodes a categorical column) makes XᵀX singular on every shard alike.
ADMM's iterates never leave range(Xᵀ), so μ̲ is taken over that range: with μ̲ = λ (the smallest local
eigenvalue over the whole space) ρ was ~50x too small and the default took 15-25x the allreduces of the
best fixed ρ on public tables (issue 23's rehearsal: admissions, diabetes).
"""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

import dane
from dane.baselines.admm import numerical_rank, range_bounds
from dane.comm import ThreadGroup

RHO_GRID = (1e-3, 1e-2, 0.1, 1.0, 10.0)  # the defaults benchmark's grid (scripts/bench_defaults.py)


def collinear_table(loss: str = "squared", n: int = 320, numeric: int = 3, values: int = 4, seed: int = 0):
    """Standardized Gaussian columns and a categorical one-hot encoded with every value (each on every shard);
    a linear target with noise, or labels drawn from the logistic model (not separable, as on a real table)."""
    rng = np.random.default_rng(seed)
    Z = rng.standard_normal((n, numeric))
    Z = (Z - Z.mean(0)) / Z.std(0)
    onehot = np.eye(values)[np.arange(n) % values]
    X = np.hstack([Z, onehot])
    margin = X @ rng.standard_normal(numeric + values)
    if loss == "squared":
        return X, margin + 0.3 * rng.standard_normal(n)
    return X, (rng.random(n) < 1 / (1 + np.exp(-margin))).astype(float)


def allreduces(problem, cap: int, workers: int = 4, **keys) -> float:
    result = dane.fit(problem, "admm", workers=workers, rounds=cap, tol=1e-8, **keys)
    return result.records[-1]["comm_rounds"] if result.status == "converged" else math.inf


# logistic: 2 s (20 s before each fixed ρ stopped at the best so far)
@pytest.mark.parametrize("loss", ["squared", pytest.param("logistic", marks=pytest.mark.slow)])
def test_default_rho_is_within_2x_of_the_best_fixed_rho_when_every_shard_shares_a_null_direction(loss):
    X, y = collinear_table(loss)
    make = dane.problems.Ridge if loss == "squared" else dane.problems.LogReg
    problem = make(X, y, lam=1e-5, fit_intercept=True, optimum="auto")
    run = dane.fit(problem, "admm", workers=4, rounds=120, tol=1e-8)
    default = run.records[-1]["comm_rounds"] if run.status == "converged" else math.inf
    rho = next(entry["value"] for entry in run.summary["defaults"] if entry["key"] == "algorithm.rho")
    # the grid's best takes 42-46 allreduces here.  Each fixed ρ, nearest the default's first, stops at the best so
    # far (at most 120): past it a run cannot be best (a round is an allreduce or more), so the minimum is exact
    best = math.inf
    for fixed in sorted(RHO_GRID, key=lambda r: abs(math.log(r / rho))):
        best = min(best, allreduces(problem, min(best, 120), rho=fixed, adaptive_rho=False))
    assert best < math.inf and default <= 2 * best, (default, best)


def test_range_bounds_are_the_local_extremes_over_the_range_of_the_global_data_hessian():
    """μ̲ = mean over shards of λ_min(H_i) on range(A): c + λ⁺_min(A_i) where range(A_i) = range(A), c elsewhere."""
    X, y = collinear_table(n=64, values=3)
    category = np.arange(64) % 2
    category[:2] = 2  # the last value in two rows only: two shards or more lack it, and their ranges are smaller
    X[:, -3:] = np.eye(3)[category]
    lam, m = 1e-3, 4
    problems = [dane.problems.Ridge(X, y, lam=lam, fit_intercept=True).build(rank, m, torch.float64)
                for rank in range(m)]
    A_i = [torch.stack([p.hessian_vector(e, with_reg=False) for e in torch.eye(p.dim, dtype=torch.float64)], 1)
           for p in problems]
    c = float(problems[0].hessian_vector(torch.eye(problems[0].dim, dtype=torch.float64)[0])[0] - A_i[0][0, 0])
    ranks = [numerical_rank(torch.linalg.eigvalsh(a), torch.float64) for a in A_i]
    rank_A = numerical_rank(torch.linalg.eigvalsh(sum(A_i) / m), torch.float64)
    assert rank_A == problems[0].dim - 1  # the one null direction every shard shares: one-hot sum - intercept
    assert set(ranks) == {rank_A - 1, rank_A}  # the shards without the rare value, and those with it
    expected_mu = sum(c + (float(torch.linalg.eigvalsh(a)[-r]) if r == rank_A else 0.0) for a, r in zip(A_i, ranks)) / m
    expected_L = sum(c + float(torch.linalg.eigvalsh(a)[-1]) for a in A_i) / m
    group = ThreadGroup(m)
    got = group.run(lambda comm: range_bounds(problems[comm.rank], comm))
    for mu_low, L_bar in got:
        assert mu_low == pytest.approx(expected_mu, rel=1e-10) and L_bar == pytest.approx(expected_L, rel=1e-10)
    assert expected_mu > 10 * c  # over the whole space every shard's λ_min is c: the old μ̲


@pytest.mark.parametrize("rho, errs, within", [(100.0, "large", 60), (1e-3, "small", 120)])
def test_a_fixed_rho_out_of_balance_at_the_cap_names_the_rho_to_try(rho, errs, within):
    """At the cap, a fixed ρ 100x too large (or 1000x too small) is named as such, with ρ·sqrt(r/s) to try;
    that ρ converges within ``within`` rounds (25 and 87 measured) where the given one does not in 60."""
    X, y = collinear_table()
    problem = dane.problems.Ridge(X, y, lam=1e-5, fit_intercept=True, optimum="auto")
    capped = dane.fit(problem, "admm", workers=4, rounds=60, tol=1e-8, rho=rho, adaptive_rho=False)
    said = capped.summary["stopped_by"]
    assert capped.status == "max_rounds" and f"rho = {rho:.3g} looks too {errs}" in said, said
    assert "algorithm.adaptive_rho=true" in said
    suggested = float(re.search(r"algorithm\.rho=([0-9.e+-]+)\)", said).group(1))
    assert allreduces(problem, within, rho=suggested, adaptive_rho=False) < math.inf, suggested
    balancing = dane.fit(problem, "admm", workers=4, rounds=10, tol=1e-8, rho=rho, adaptive_rho=True)
    assert balancing.status == "max_rounds" and "algorithm.rho=" not in balancing.summary["stopped_by"]  # at work


def test_the_estimated_rho_is_refreshed_from_the_hessian_at_z_on_nearly_separable_labels():
    """The logistic majorant c_f XᵀX/n is the Hessian at w = 0; on nearly separable labels (y > median of the
    collinear table) the Hessian at the optimum is far flatter and the majorant's ρ ~40x too large: kept, it
    did not reach 1e-8 in 300 allreduces (4753 measured).  Refreshed at rounds 8, 16, 32, ... from the Hessian
    at z (one counted allreduce each), ρ is sqrt(μ̲ L̄) of the local Hessians there, and the run converges
    (171 allreduces measured; the fixed-ρ grid's best: 245).  Two workers: ADMM has no stacked form, so each
    worker is a thread, and two show the refresh as four did (168, 2000 and 257 allreduces) at half the cost."""
    m = 2
    X, y = collinear_table()
    labels = (y > np.median(y)).astype(float)
    problem = dane.problems.LogReg(X, labels, lam=1e-5, fit_intercept=True, optimum="auto")
    refreshed = dane.fit(problem, "admm", workers=m, rounds=300, tol=1e-8)
    assert refreshed.status == "converged", refreshed.summary["stopped_by"]
    first = refreshed.records[0]["rho"]
    assert allreduces(problem, 300, workers=m, rho=first, adaptive_rho=False) == math.inf  # the majorant's ρ, kept
    # round 8's ρ from the local Hessians at z_8 (the iterate after 8 rounds), as range_bounds forms them
    z8 = dane.fit(problem, "admm", workers=m, rounds=8, tol=None).w
    shards = [dane.problems.LogReg(X, labels, lam=1e-5, fit_intercept=True).build(rank, m, torch.float64)
              for rank in range(m)]
    eye = torch.eye(z8.numel(), dtype=torch.float64)
    A_i = [torch.stack([p.hessian_vector(e, at=z8, with_reg=False) for e in eye], 1) for p in shards]
    c = float(shards[0].hessian_vector(eye[0], at=z8)[0] - A_i[0][0, 0])
    rank_A = numerical_rank(torch.linalg.eigvalsh(sum(A_i) / m), torch.float64)
    eigs = [torch.linalg.eigvalsh((a + a.T) / 2) for a in A_i]
    mu_low = sum(c + (float(e[-rank_A]) if numerical_rank(e, torch.float64) == rank_A else 0.0) for e in eigs) / m
    L_bar = sum(c + float(e[-1]) for e in eigs) / m
    assert refreshed.records[8]["rho"] == pytest.approx(math.sqrt(mu_low * L_bar), rel=1e-9)
    assert refreshed.records[8]["rho"] < first / 2 and refreshed.records[7]["rho"] == first
    # the estimate and each refresh are in the summary: the first as a resolved default, the rest as adaptations
    (rho_default,) = [e for e in refreshed.summary["defaults"] if e["key"] == "algorithm.rho"]
    assert rho_default["value"] == first and rho_default["stats"]["over_range"] is True
    assert math.sqrt(rho_default["stats"]["mu_low"] * rho_default["stats"]["L_bar"]) == pytest.approx(first, rel=1e-12)
    changes = [(a["round"] + 1, a["rho"], b["rho"]) for a, b in zip(refreshed.records, refreshed.records[1:])
               if a["rho"] != b["rho"]]
    assert [(e["round"], e["from"], e["to"]) for e in refreshed.summary["adaptations"]] == changes
    assert {e["trigger"] for e in refreshed.summary["adaptations"]} == {"refresh"} and changes[0][0] == 8
    # the refresh is the adaptation rho_refresh, which the summary names as watching (it named none), and which
    # algorithm.paper=true and algorithm.adapt=[] leave off: round 0's estimate for the whole run, bit for bit
    assert refreshed.summary["adaptations_attached"] == ["rho_refresh"]
    for keys in ({"paper": True}, {"adapt": []}):
        fixed = dane.fit(problem, "admm", workers=m, rounds=9, tol=None, **keys)
        assert [r["rho"] for r in fixed.records] == [first] * 10
        assert fixed.summary["adaptations"] == [] and fixed.summary["adaptations_attached"] == []
        assert [{k: v for k, v in r.items() if k != "time_s"} for r in fixed.records[:8]] == \
            [{k: v for k, v in r.items() if k != "time_s"} for r in refreshed.records[:8]]


def test_a_given_rho_is_balanced_by_default_and_every_change_is_recorded():
    """``adaptive_rho`` null balances a given ρ (Boyd's eq. 3.13: ×2 or ÷2 after the round whose residuals are out
    of balance); each change is that round's event, and a ρ given with ``adaptive_rho=false`` is no package rule."""
    X, y = collinear_table()
    problem = dane.problems.LogReg(X, (y > np.median(y)).astype(float), lam=1e-4,
                                   local_solver="cholesky")  # given: local_solver=auto's choice is a rule applied
    balanced = dane.fit(problem, "admm", workers=2, rounds=12, tol=None, rho=1e-3)
    changes = [(a["round"], a["rho"], b["rho"]) for a, b in zip(balanced.records, balanced.records[1:])
               if a["rho"] != b["rho"]]
    events = balanced.summary["adaptations"]
    assert changes and [(e["round"], e["from"], e["to"]) for e in events][:len(changes)] == changes
    assert all(e["trigger"] == "residual balance" and e["to"] / e["from"] in (2.0, 0.5) for e in events)
    assert [(e["key"], e["value"]) for e in balanced.summary["defaults"]] == [("algorithm.adaptive_rho", True)]
    fixed = dane.fit(problem, "admm", workers=2, rounds=12, tol=None, rho=1e-3, adaptive_rho=False)
    assert fixed.summary["package_rules_applied"] is False and {r["rho"] for r in fixed.records} == {1e-3}
