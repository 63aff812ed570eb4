"""GIANT when every step of its line search fails: one rejected round, then progress (issue 23, item 2).

The hard case: one of two shards holds no row of a rare column, and λ is 0 or tiny, so that
shard's Hessian is (nearly) singular along the column.  At μ = 0 its local Newton direction
is enormous or not finite there, no step of the line search meets Armijo, and the round is
rejected.  Raising one shared μ only by 4 from gᵀp/‖p‖² (≈ λ) stalled: at λ = 0 every round
was rejected and the objective never left its round-0 value; at λ = 1e-8 five rounds were
rejected.  One shared μ, however raised, then slows every worker: per-worker shifts leave the
shard that holds the column its own Newton step.  The references here are numpy's: the ridge
optimum by a dense solve.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import dane
from dane.baselines import GIANTConfig
from dane.baselines.giant import rejected_mu, unit
from dane.comm import LocalCommunicator, ThreadGroup

N, D = 200, 6


def rare_column_on_one_shard(seed: int = 0, ill_conditioned: bool = False):
    """Gaussian columns and a 0/1 column set in two rows, both held by worker 0 of 2; ill-conditioned: also a
    column of mean 40 and standard deviation 0.5 beside a column of ones (cond(XᵀX) ≈ 1e7)."""
    rng = np.random.default_rng(seed)
    X = np.hstack([rng.standard_normal((N, D)), np.zeros((N, 1))])
    if ill_conditioned:
        X = np.hstack([X, 40 + 0.5 * rng.standard_normal((N, 1)), np.ones((N, 1))])
    X[dane.shards(N, 2, seed=0)[0][:2], D] = 1.0
    y = X @ rng.standard_normal(X.shape[1]) + 0.1 * rng.standard_normal(N)
    return X, y


def ridge_objective(X, y, lam, w):
    return 0.5 * np.mean(np.square(X @ w - y)) + 0.5 * lam * w @ w


def ridge_optimum(X, y, lam):
    return ridge_objective(X, y, lam, np.linalg.solve(X.T @ X / len(y) + lam * np.eye(X.shape[1]), X.T @ y / len(y)))


@pytest.mark.parametrize("lam", [0.0, 1e-8])
def test_one_rejected_round_then_the_optimum(lam):
    X, y = rare_column_on_one_shard()
    rows = dane.shards(N, 2, seed=0)
    assert (X[rows[0], D] != 0).sum() == 2 and not X[rows[1], D].any()  # the hard case: worker 1 lacks the column
    f_star = ridge_optimum(X, y, lam)
    result = dane.fit(dane.problems.Ridge(X, y, lam=lam, optimum="auto"), "giant", workers=2, rounds=20, tol=1e-8)
    records = result.records
    objectives = [r["objective"] for r in records]
    assert all(b <= a for a, b in zip(objectives, objectives[1:]))  # monotone
    assert [r["accepted"] for r in records[:-1]] == [False] + [True] * (len(records) - 2)  # only round 0 rejected
    assert records[0]["step_size"] == 0.0 and records[1]["mu"] > 0
    # measured: 9 rounds (λ = 0), 7 (λ = 1e-8); the old rule stalled (λ = 0) or was rejected 5 times (λ = 1e-8)
    assert result.status == "converged" and len(records) - 1 <= 12
    assert 0 <= (ridge_objective(X, y, lam, result.w.numpy()) - f_star) / f_star <= 1e-8
    # every change of the largest shift is an event of the round that made it (the last round's shows in no later
    # record), and the summary lists them all; the rejection shifted the worker without the column
    changes = [(a["round"], a["mu"], b["mu"]) for a, b in zip(records, records[1:]) if a["mu"] != b["mu"]]
    events = [(e["round"], e["from"], e["to"]) for e in result.summary["adaptations"] if e["from"] != e["to"]]
    assert changes and events[:len(changes)] == changes and {e[0] for e in events[len(changes):]} <= {records[-1]["round"]}
    # and every move of any worker's shift is one (its worker, from, to), the largest unchanged or not
    for event in result.summary["adaptations"]:
        assert event["workers"] and all(a != b for _, a, b in event["workers"])
        assert event["to"] == max([b for _, _, b in event["workers"]] + [event["from"]]) or event["to"] < event["from"]
    assert result.summary["adaptations"][0]["workers"] == [[1, 0.0, result.summary["adaptations"][0]["to"]]]
    assert result.summary["adaptations"][0]["trigger"] == "flatter than objective"
    assert result.summary["package_rules_applied"] is True
    assert [(e["key"], e["value"]) for e in result.summary["defaults"]] == [("algorithm.cg_max_iter", 10 * (D + 1))]


@pytest.mark.parametrize("lam", [0.0, 1e-5])
def test_per_worker_shifts_keep_newton_steps_on_an_ill_conditioned_problem(lam):
    """One shared μ large enough for the shard without the column damps every worker along the near-null
    direction of XᵀX (λ_min ≈ 1e-4): 118 rounds (λ = 0) and 92 (λ = 1e-5) to 1e-8. Per-worker shifts: 20."""
    X, y = rare_column_on_one_shard(ill_conditioned=True)
    assert np.linalg.cond(X.T @ X) > 1e6
    f_star = ridge_optimum(X, y, lam)
    result = dane.fit(dane.problems.Ridge(X, y, lam=lam, optimum="auto"), "giant", workers=2, rounds=30, tol=1e-8)
    objectives = [r["objective"] for r in result.records]
    assert all(b <= a for a, b in zip(objectives, objectives[1:]))
    assert result.status == "converged"
    assert 0 <= (ridge_objective(X, y, lam, result.w.numpy()) - f_star) / f_star <= 1e-8


def test_only_the_worker_flat_along_the_rejected_direction_is_shifted():
    """λ = 1e-8: p is ~1e6 along the rare column, so u ≈ e_rare; worker 0 holds its two rows (c_0 = 2/100 + λ),
    worker 1 none (c_1 = λ): κ = 0.01 + λ and only worker 1 gets μ_1 = κ - c_1 = 0.01."""
    X, y = rare_column_on_one_shard()
    problem = dane.problems.Ridge(X, y, lam=1e-8)

    def first_round(comm):
        algo = GIANTConfig().build(problem.build(comm.rank, 2), comm)
        record = algo.step()
        return record["accepted"], algo.mus

    (accepted, mus), other = ThreadGroup(2).run(first_round)
    assert not accepted and other == (accepted, mus)  # every worker holds the whole list
    assert mus[0] == 0.0 and mus[1] == pytest.approx(0.01, rel=1e-5)  # u is e_rare to ~1e-6: measured 0.0100000102


def test_a_new_world_size_starts_from_the_largest_shift_and_old_checkpoints_load():
    X, y = rare_column_on_one_shard()
    shard = dane.problems.Ridge(X, y, lam=1e-3).build(0, 1)
    algo = GIANTConfig().build(shard, LocalCommunicator())
    w0 = torch.zeros(X.shape[1], dtype=torch.float64)
    algo.load_state_dict({"w": w0, "mus": [0.1, 0.3], "mu_floor": 1e-7, "rejected": False})  # written by 2 workers
    assert algo.step()["mu"] == 0.3 and len(algo.mus) == 1
    algo.load_state_dict({"w": w0, "mu": 0.5, "mu_floor": 1e-7})  # a checkpoint from before per-worker shifts
    assert algo.step()["mu"] == 0.5


def psd_shards(seed: int = 1, d: int = 8):
    """Two local Hessians, one singular along e_0 (the shard without the rare column), and a gradient."""
    rng = np.random.default_rng(seed)
    A = [rng.standard_normal((30, d)) for _ in range(2)]
    A[1][:, 0] = 0.0
    return [a.T @ a / 30 for a in A], rng.standard_normal(d)


def test_the_raised_mu_holds_the_next_direction_below_every_failed_step():
    """‖(1/m) Σ (H_i + μI)⁻¹ g‖ ≤ backtrack^K ‖p‖ for μ = rejected_mu: the trust-region bound of the docstring."""
    H, g = psd_shards()
    H[1] = H[1] + 1e-8 * np.eye(len(g))
    p = np.mean([np.linalg.solve(h, g) for h in H], axis=0)  # the μ = 0 direction: ~1e8 long along e_0
    shortest = 0.5 ** 10
    u = p / np.linalg.norm(p)
    curvature = u @ np.mean(H, axis=0) @ u
    mu = rejected_mu(0.0, slope=g @ p, g_norm=np.linalg.norm(g), p_norm=np.linalg.norm(p), curvature=curvature,
                     shortest=shortest)
    assert mu == pytest.approx(max(g @ p / (p @ p), curvature, np.linalg.norm(g) / (shortest * np.linalg.norm(p))),
                               rel=1e-15)
    assert mu > 1e3 * (g @ p) / (p @ p)  # the old rule's term is ~λ
    nxt = np.mean([np.linalg.solve(h + mu * np.eye(len(g)), g) for h in H], axis=0)
    assert np.linalg.norm(nxt) <= shortest * np.linalg.norm(p)
    assert rejected_mu(2.0, slope=1.0, g_norm=1.0, p_norm=1.0, curvature=0.1, shortest=1.0) == 8.0  # 4μ at least


def test_terms_that_are_not_finite_are_left_out():
    # an overflowed p: gᵀp/‖p‖² is nan or 0 and ‖g‖/‖p‖ is 0; the curvature along p/‖p‖ is what is left
    assert rejected_mu(0.0, slope=math.inf, g_norm=1.0, p_norm=math.inf, curvature=0.25, shortest=1e-3) == 0.25
    assert rejected_mu(0.0, slope=math.nan, g_norm=1.0, p_norm=math.nan, curvature=0.25, shortest=1e-3) == 0.25
    assert rejected_mu(1.0, slope=math.nan, g_norm=1.0, p_norm=math.nan, curvature=math.nan, shortest=1e-3) == 4.0


def test_unit_survives_overflow():
    big = torch.tensor([3e200, -4e200, 0.0], dtype=torch.float64)
    assert not math.isfinite(float(torch.linalg.vector_norm(big)))  # the naive p / ‖p‖ is 0
    torch.testing.assert_close(unit(big), torch.tensor([0.6, -0.8, 0.0], dtype=torch.float64))
    inf = torch.tensor([math.inf, 1.0, -math.inf, math.nan], dtype=torch.float64)
    torch.testing.assert_close(unit(inf), torch.tensor([1.0, 0.0, -1.0, 0.0], dtype=torch.float64) / math.sqrt(2))
    assert not unit(torch.zeros(3, dtype=torch.float64)).any()


def test_a_move_of_a_shift_below_the_largest_is_recorded(monkeypatch):
    """A round whose rule moves a worker's μ_i while the largest stays is an ``adapted`` event too (it named only
    moves of the largest): its worker, from and to, beside the largest before and after."""
    from dane.baselines.giant import GIANT

    update = GIANT.update_mus

    def raise_worker_2(self, accepted, k, curvatures, **keys):
        trigger = update(self, accepted, k, curvatures, **keys)
        if self.rounds_seen in (1, 2):  # round 1: workers 0 and 2 shifted to 1 and 0.5; round 2: worker 2 alone moves
            self.mus[:] = [1.0, self.mus[1], 0.5 if self.rounds_seen == 1 else 0.25]
        self.rounds_seen += 1
        return trigger

    monkeypatch.setattr(GIANT, "rounds_seen", 0, raising=False)
    monkeypatch.setattr(GIANT, "update_mus", raise_worker_2)
    rng = np.random.default_rng(3)
    X = rng.standard_normal((90, 4))
    result = dane.fit(dane.problems.Ridge(X, X @ np.ones(4), lam=1e-2), "giant", workers=3, rounds=4, tol=None)
    first, second = [e for e in result.summary["adaptations"] if e["round"] in (1, 2)]
    assert first["workers"] == [[0, 0.0, 1.0], [2, 0.0, 0.5]] and (first["from"], first["to"]) == (0.0, 1.0)
    assert second["workers"] == [[2, 0.5, 0.25]] and (second["from"], second["to"]) == (1.0, 1.0)
    assert [r["mu"] for r in result.records[1:4]] == [0.0, 1.0, 1.0]  # the record's column: the largest


def test_safeguard_false_is_the_papers_round():
    """``safeguard=false``: no shift and no rejected round; where no candidate meets Armijo the smallest is taken
    (the paper's method steps whatever happens), and no curvature rides in allreduce 3 (m values fewer a round).
    Where every full step is safe the iterates are the safeguarded run's."""
    X, y = rare_column_on_one_shard()
    problem = dane.problems.Ridge(X, y, lam=0.0)
    plain = dane.fit(problem, "giant", workers=2, rounds=3, tol=None, safeguard=False, cg_max_iter=40)
    first = plain.records[0]
    assert (first["accepted"], first["armijo_met"], first["step_size"]) == (True, False, 0.5 ** 9)  # α_{K-1}
    assert all(r["mu"] == 0.0 for r in plain.records) and plain.summary["adaptations"] == []
    assert plain.summary["adaptations_attached"] == [] and plain.summary["package_rules_applied"] is False
    rng = np.random.default_rng(5)
    easy = rng.standard_normal((120, 4))
    ridge = dane.problems.Ridge(easy, easy @ np.ones(4) + 0.1 * rng.standard_normal(120), lam=1e-2)
    runs = {flag: dane.fit(ridge, "giant", workers=3, rounds=3, tol=None, safeguard=flag) for flag in (True, False)}
    assert [r["objective"] for r in runs[True].records] == [r["objective"] for r in runs[False].records]
    assert all(r["step_size"] == 1.0 for r in runs[True].records[:-1]) and runs[True].summary["adaptations"] == []
    assert runs[True].summary["adaptations_attached"] == ["shifts"]
    per_round = [runs[flag].records[2]["bytes_sent"] - runs[flag].records[1]["bytes_sent"] for flag in (True, False)]
    assert per_round[0] - per_round[1] == 2 * (3 - 1) / 3 * (3 * 8)  # the m curvatures uᵀH_i u, in a ring of 3
