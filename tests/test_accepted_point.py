"""What a run returns is what it accepted (issue 45, item 5): the last record, the summary and the returned iterate of a
method that can reject a step describe the last accepted point, also when the round cap (or a stop rule) falls on a
step it rejected.

Which methods reject: DANE and InexactDANE with the μ safeguard (a trial whose objective rose is rejected at the next
round's first allreduce, so a run's final evaluation reads a trial no round reviewed: `dane.dane.DANE.evaluate`);
GIANT (no step of the line search met Armijo: w stays) and S-DANE with ``adaptive=true`` (the line search on λ
failed: x stays), which never move their iterate to a rejected point.  AIDE restarts its momentum and FedNL-LS's
backtracking always takes a step: neither rejects one.  The objective at the returned iterate is computed here
anew from the shards, (1/m) Σ_i O_i(w).
"""
from __future__ import annotations

import copy
import functools
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.datasets import load_breast_cancer

import dane
from dane.api import algorithm_config
from dane.loop.launch import execute
from dane.run_config import run_spec
from dane.loop.stopping import StopRule
from dane.loop.spec import Communication, RunControl, RunSpec
from dane.synthetic.sweep import compose_job
from test_giant_stall import N, rare_column_on_one_shard

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("DANE_DATA_DIR", REPO.parent / "shared" / "data"))


def breast_cancer(lam: float = 1e-3):
    X, y = load_breast_cancer(return_X_y=True)
    return dane.problems.LogReg((X - X.mean(0)) / X.std(0), y, lam=lam)


def objective_at(problem, workers: int, w: torch.Tensor) -> float:
    """(1/m) Σ_i O_i(w) over the m shards a ``workers``-worker run holds: the global objective its records carry."""
    return float(np.mean([float(problem.build(rank, workers, torch.float64).evaluate(w)[1][0])
                          for rank in range(workers)]))


def rare_feature(lam: float = 1e-4):
    """640 Gaussian rows with a column of 5s in 1% of them: 32 equal shards, most without that column."""
    rng = np.random.default_rng(1)
    X = rng.standard_normal((640, 8))
    X[:, 7] = (rng.random(640) < 0.01) * 5.0
    y = ((X @ rng.standard_normal(8) + rng.standard_normal(640)) > 0).astype(float)
    return dane.problems.LogReg(X, y, lam=lam)


#: (algorithm, keys, problem, workers, rounds of the long run, whether every accepted point lowers the objective);
#: each has rejected rounds within its first `rounds` (asserted below)
CASES = {
    "dane": ("dane", {}, breast_cancer, 2, 12, True),                   # rejects rounds 1 and 9
    "dane_batched": ("dane", {}, rare_feature, 32, 5, True),             # the stacked simulator; rounds 1, 2, 4
    "inexact_dane": ("inexact_dane", {}, breast_cancer, 4, 10, True),    # rounds 1 and 9
    "giant": ("giant", {}, lambda: dane.problems.Ridge(*rare_column_on_one_shard(), lam=0.0), 2, 4, True),  # round 0
    "sdane_adaptive": ("sdane", {"adaptive": True}, breast_cancer, 4, 12, False),  # rounds 0-4 and 11
}


@functools.cache
def _fitted(name: str, rounds: int) -> dane.api.Result:
    algorithm, keys, make, workers, _, _ = CASES[name]
    return dane.fit(make(), algorithm, workers=workers, rounds=rounds, **keys)


def fitted(name: str, rounds: int) -> dane.api.Result:
    """`CASES`' ``name`` run for ``rounds`` rounds, each run made once a session (a copy: a test may change it): the
    long run's cap and a short run's may be one run, and so may a short run and another test's."""
    return copy.deepcopy(_fitted(name, rounds))


@pytest.mark.parametrize("name", CASES)
def test_a_run_ending_on_a_rejected_step_reports_and_returns_the_accepted_point(name):
    algorithm, keys, make, workers, rounds, monotone = CASES[name]
    problem = make()
    long = fitted(name, rounds)
    rejected = [r["round"] for r in long.records if r.get("accepted") is False]
    assert rejected, "the case must exercise a rejection"
    # DANE's record t rejects the trial w_t (a run with rounds=t ends on it); GIANT's and S-DANE's record t rejects
    # the step from w_t (a run with rounds=t+1 ends after it)
    for cap in sorted({t for t in rejected if t > 0} | {t + 1 for t in rejected if t < rounds}):
        short = fitted(name, cap)
        last = short.records[-1]
        assert last["round"] == cap
        assert short.summary["final_objective"] == last["objective"]
        assert objective_at(problem, workers, short.w) == pytest.approx(last["objective"], rel=1e-12, abs=1e-15)
        if cap < rounds:  # (at cap = rounds the short run is the long one, shared)
            assert [r["objective"] for r in short.records[:-1]] == [r["objective"] for r in long.records[:cap]]
        if monotone:  # every record describes an accepted point, and none raised the objective
            objectives = [r["objective"] for r in short.records]
            assert all(b <= a * (1 + 1e-12) for a, b in zip(objectives, objectives[1:])), (cap, objectives)


def test_dane_ends_on_the_accepted_point_not_the_trial():
    """breast_cancer over 2 workers, λ = 1e-3: round 1 rejects plain DANE's first step (μ = 0), so a run of 1 round
    ends at w_0 = 0, objective log 2, where the trial it would have returned has a higher objective."""
    problem = breast_cancer()
    result = fitted("dane", 1)  # CASES["dane"] is this run for 1 round
    assert [r.get("accepted") for r in result.records] == [True, False]
    assert result.records[-1]["objective"] == pytest.approx(np.log(2), rel=1e-15)
    assert torch.equal(result.w, torch.zeros_like(result.w))
    unguarded = dane.fit(problem, "dane", workers=2, rounds=1, safeguard=False)  # the same trial, returned as it is
    assert unguarded.records[-1]["objective"] > np.log(2)
    assert objective_at(problem, 2, unguarded.w) == pytest.approx(unguarded.records[-1]["objective"], rel=1e-12)


def test_an_early_stop_on_a_rejected_round_returns_the_accepted_point():
    """A stop rule that fires on a round whose start was rejected returns the accepted point that round's record
    describes, not the trial the round started from: early stopping on grad_norm with patience 1 stops at round 1
    (its record re-describes w_0, so grad_norm did not change), whose trial w_1 the safeguard rejected."""
    problem = breast_cancer()
    control = RunControl(stop=StopRule(rounds=5, patience=1, monitor="grad_norm"), quiet=True)
    collect: dict = {}
    execute(RunSpec(problem=problem, algorithm=algorithm_config("dane"), comm=Communication(backend="local", workers=2),
                    control=control), None, collect=collect)
    assert [r["round"] for r in collect["records"]] == [0, 1] and collect["summary"]["status"] == "early_stopped"
    assert collect["records"][1]["accepted"] is False
    assert torch.equal(collect["w"], torch.zeros_like(collect["w"]))


@pytest.mark.skipif(not (SHARED_DATA / "admissions.csv").is_file(), reason="needs shared/data/admissions.csv")
def test_the_reported_admissions_run_ends_on_log_2_not_8():
    """The issue's command: admissions.csv over 40 quantity-skewed shards (sizes ~ (i+1)^-3), 2 rounds.  Round 1
    rejects the first step and round 2's trial (objective 8.04) would be rejected too: the run reports and returns
    w_0 = 0, objective log 2 = 0.693, as round 2 of a longer run shows."""
    overrides = ("problem=logreg", "data=csv", f"data.path={SHARED_DATA / 'admissions.csv'}", "data.target=admit",
                 "data.sharding=quantity", "data.exponent=3", "workers=40", "quiet=true")
    runs = {}
    for rounds in (2, 4):
        collect: dict = {}
        execute(run_spec(compose_job((*overrides, f"rounds={rounds}"))), None, collect=collect)
        runs[rounds] = collect
    short, long = runs[2], runs[4]
    assert [r["objective"] for r in short["records"]] == pytest.approx([np.log(2)] * 3, rel=1e-15)
    assert short["records"][-1]["accepted"] is False
    assert short["records"][-1]["objective"] == long["records"][2]["objective"]
    assert short["summary"]["final_objective"] == pytest.approx(np.log(2), rel=1e-15)
    assert torch.equal(short["w"], torch.zeros_like(short["w"]))
