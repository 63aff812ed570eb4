"""What adapts during a federated run (`baselines.adaptive`): each wrapper on a scripted sequence of rounds, where it is
attached (`PolicyKeys`: algorithm.adapt, algorithm.paper), and what a run's records and summary say of it."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import dane
from dane.baselines.adaptive import (CYCLE_ROUNDS, FIXED_POINT, FLOOR_ROUNDS, DriftStop, FloorStop, LocalRetry,
                                     Restart, WeightDoubling, grown_tau, refresh_due, retried_setting, retry_event)
from dane.baselines.admm import ADMMConfig
from dane.baselines.defaults import local_step
from dane.baselines.aide import AIDEConfig
from dane.numerics.local_solvers import LBFGS_MAX_ITER, LocalSolver, Subproblem, svrg_resolved
from dane.numerics.svrg import svrg_constants
from dane.baselines.feddane import FedDANEConfig
from dane.baselines.fedprox import FedProxConfig
from dane.baselines.fedred import FedRedConfig
from dane.baselines.scaffold import ScaffoldConfig
from dane.baselines.sdane import AccSDANEConfig, SDANEConfig
from dane.comm import LocalCommunicator
from dane.errors import ConfigError
from helpers import simulate


def test_weight_doubling_fires_on_a_climb_and_records_from_to_and_trigger():
    algo = SimpleNamespace(lam=0.1, w=torch.zeros(2))
    wrap = WeightDoubling("lam", ceiling=0.3)
    assert wrap.after(algo, {"objective": 1.0}) == [] and algo.lam == 0.1      # round 0's objective: the first high
    assert wrap.after(algo, {"objective": 0.9}) == []
    assert wrap.after(algo, {"objective": 1.5}) == [{"key": "algorithm.lam", "from": 0.1, "to": 0.2,
                                                     "trigger": "climb"}]
    assert wrap.after(algo, {"objective": 1.6}) == [{"key": "algorithm.lam", "from": 0.2, "to": 0.3,
                                                     "trigger": "climb"}]          # capped at the ceiling, δ_A
    assert wrap.after(algo, {"objective": 1.7}) == [] and algo.lam == 0.3      # at the ceiling: nothing to record


def test_weight_doubling_on_a_limit_cycle_fires_once_a_window():
    """Objectives alternating 1.0, 1.2 after a start at 2.0.  At round 10 the window (rounds 1-10) has fallen 1.0
    below the best before it (2.0): progress, no change.  At round 11 round 1's 1.0 leaves the window: swing 0.2
    against no progress, the weight doubles ("cycle") and the window starts again, to fire 10 rounds later."""
    algo, wrap = SimpleNamespace(mu=1.0, w=torch.zeros(1)), WeightDoubling("mu", ceiling=100.0)
    events = []
    for t, f in enumerate([2.0] + [1.0, 1.2] * (CYCLE_ROUNDS + 2)):
        events += [(t, e["trigger"]) for e in wrap.after(algo, {"objective": f})]
    assert events == [(CYCLE_ROUNDS + 1, "cycle"), (2 * CYCLE_ROUNDS + 1, "cycle")] and algo.mu == 4.0
    assert wrap.damps and wrap.state_dict()["cycling"]["active"]


def test_restart_resets_the_extrapolation_when_the_objective_rises_or_the_weight_changed():
    algo = SimpleNamespace(A=3.0, B=2.0, v=torch.ones(2), w=torch.zeros(2), lam=0.1)
    wrap = Restart()
    assert wrap.after(algo, {"objective": 1.0, "lam": 0.1}) == [] and algo.A == 3.0
    assert wrap.after(algo, {"objective": 0.8, "lam": 0.1}) == []
    assert wrap.after(algo, {"objective": 0.9, "lam": 0.1}) == [{"key": "algorithm.A", "from": 3.0, "to": 0.0,
                                                                 "trigger": "objective rose"}]
    assert (algo.A, algo.B) == (0.0, 1.0) and torch.equal(algo.v, algo.w)
    algo.A, algo.lam = 5.0, 0.2  # the round ran at 0.1; the weight doubled after it
    assert wrap.after(algo, {"objective": 0.7, "lam": 0.1})[0]["trigger"] == "lam changed" and algo.A == 0.0


def test_floor_stop_ends_the_run_once_the_best_is_old_enough():
    """Best at round 2, then flat: at round 2 + max(FLOOR_ROUNDS, 1) it fires, once, with the method's line."""
    algo = SimpleNamespace(floor_diagnosis=lambda floor: f"stuck {floor.rounds - 1 - floor.best_round} rounds")
    wrap, fired = FloorStop(), []
    for t, f in enumerate([3.0, 2.0, 1.0] + [1.5] * 20):
        if wrap.after(algo, {"objective": f}):
            fired.append(t)
    assert fired == [2 + FLOOR_ROUNDS] and wrap.finished == ("sampling_floor", f"stuck {FLOOR_ROUNDS} rounds")
    resumed = FloorStop()
    resumed.load_state_dict(wrap.state_dict())
    assert resumed.finished == wrap.finished and resumed.floor.best_round == 2


def test_drift_stop_fires_when_the_moves_cancel_to_its_share_of_round_0():
    algo = SimpleNamespace(fixed_point=lambda: "knobs", moves=(1.0, 2.0))
    wrap = DriftStop()
    assert wrap.after(algo, {}) == [] and wrap.first_ratio == 0.5
    algo.moves = (0.5 * FIXED_POINT * 1.01, 1.0)
    assert wrap.after(algo, {}) == [] and wrap.finished is None  # just above FIXED_POINT × ρ_0
    algo.moves = (0.5 * FIXED_POINT, 1.0)
    assert wrap.after(algo, {})[0]["to"] == "client_drift" and wrap.finished[0] == "client_drift"
    assert wrap.finished[1].endswith("; knobs")


@pytest.mark.parametrize("solver, resolves, setting", [
    (LocalSolver("svrg", passes=3), 3, ("problem.svrg_passes", 3, 24)),
    (LocalSolver("svrg", passes="auto"), 2, ("problem.svrg_passes", "auto", "4 x auto")),   # each worker's own a
    (LocalSolver("cg", tol=1e-6, max_iter=7), 2, ("problem.local_tol", 1e-6, 1e-6 / 100 ** 2)),
    (LocalSolver("cg", tol=0, max_iter=2), 3, ("problem.local_max_iter", 2, 16)),
    (LocalSolver("lbfgs", tol=0), 1, ("problem.local_max_iter", LBFGS_MAX_ITER, 2 * LBFGS_MAX_ITER)),
])
def test_a_local_retry_names_the_setting_its_deepest_re_solve_ran(solver, resolves, setting):
    assert retried_setting(solver, resolves) == setting


def test_a_local_retry_event_counts_the_re_solves_the_next_record_s_local_work_adds():
    """Record t's ``local_resolves`` (cumulative over the clients) less the last record's are round t − 1's
    re-solves: the event carries that round, the first re-solve's setting and their number; none where none; a resumed
    run continues from the count the checkpoint saw."""
    svrg = LocalSolver("svrg", passes=3)
    assert retry_event(svrg, 0, 4) == []
    assert retry_event(svrg, 3, 0) == [{"round": 0, "key": "problem.svrg_passes", "from": 3, "to": 6,
                                        "trigger": "accuracy test", "resolves": 3}]
    wrap = LocalRetry(svrg)
    assert wrap.after(None, {}) == []                                    # the round's own counts are not sent
    assert wrap.read_work(0, {"local_resolves": 0.0}) == []
    assert wrap.read_work(1, {"local_resolves": 3.0}) == retry_event(svrg, 3, 0)
    assert wrap.read_work(2, {"local_resolves": 3.0}) == []             # round 1: every first solve passed
    resumed = LocalRetry(svrg)
    resumed.load_state_dict(wrap.state_dict())
    assert resumed.read_work(3, {"local_resolves": 10.0}) == retry_event(svrg, 7, 2)
    LocalRetry.load_state_dict(resumed, {})                              # a checkpoint from before the count
    assert resumed.seen == 0.0


RIDGE_SVRG = dane.problems.RidgeSyntheticConfig(n_samples=240, dim=6, lam=1e-3, local_solver="svrg", svrg_passes=1,
                                                seed=0)


def test_a_local_retry_is_recorded_with_every_participants_count_under_paper_true():
    """Ridge, 4 clients, SVRG at 1 pass, λ = 1: client 0's first solve passes S-DANE's accuracy test in round 0, the
    three others' pass at 2 passes.  The next record's local work counts the three re-solves over the clients (client
    0's record alone would say nothing) and carries round 0's event; the summary lists the wrapper and says a package
    rule applied; the re-solves' work is in the records (a pass at the centre, 3 a pass of SVRG less the snapshot at
    the anchor, 1 at the solve's result: 4 a client at 1 pass, 6 more for a re-solve at 2).  It ran with nothing
    recorded: adaptations [], package_rules_applied false."""
    result = dane.fit(RIDGE_SVRG, "sdane", workers=4, rounds=1, lam=1.0, mu=0.0, local_solver="svrg", paper=True)
    assert result.summary["adaptations"] == [{"round": 0, "key": "problem.svrg_passes", "from": 1, "to": 2,
                                              "trigger": "accuracy test", "resolves": 3}]
    assert result.summary["adaptations_attached"] == ["local_retry"] and result.summary["package_rules_applied"]
    assert result.records[1]["local_passes"] == 4 * 4 + 3 * 6
    assert [(r["local_resolves"], r["local_resolves_max"]) for r in result.records] == [(0, 0), (3, 1)]
    plain = dane.fit(RIDGE_SVRG, "sdane", workers=4, rounds=1, lam=1.0, mu=0.0, local_solver="svrg", adapt=[])
    assert plain.summary["adaptations_attached"] == [] and plain.summary["adaptations"] == []
    # the one rule applied without the wrapper is problem.svrg_lr's null step, noted where the solves use it
    assert [(d["key"], d["rule"]) for d in plain.summary["defaults"]] == [("problem.svrg_lr", "svrg_step")]
    assert plain.records[1]["local_passes"] == 4 * 4 and plain.records[0]["local_failed"] is False
    assert plain.records[1]["local_resolves"] == 0


def test_a_local_retry_sends_what_the_paper_s_round_sends():
    """S-DANE's round sends two allreduces: ∇O_i at the centre with the 2 metrics of x, then x_i and ∇O_i(x_i) (d = 6:
    20 numbers of 8 bytes, each worker 2(m − 1)/m of them on a ring of m = 4).  The re-solves (3, 4, 3 in rounds 0 to
    2) reach rank 0 with the local work's table, which no traffic counter counts: the bytes and the communication
    rounds are those of the run that re-solves nothing."""
    retried = dane.fit(RIDGE_SVRG, "sdane", workers=4, rounds=3, lam=1.0, mu=0.0, local_solver="svrg", paper=True)
    plain = dane.fit(RIDGE_SVRG, "sdane", workers=4, rounds=3, lam=1.0, mu=0.0, local_solver="svrg", adapt=[])
    assert [e["resolves"] for e in retried.summary["adaptations"]] == [3, 4, 3]
    assert [r["bytes_sent"] for r in retried.records] == [r["bytes_sent"] for r in plain.records] \
        == [t * 20 * 8 * 2 * 3 / 4 for t in range(4)]
    assert [r["comm_rounds"] for r in retried.records] == [r["comm_rounds"] for r in plain.records] == [0, 2, 4, 6]


def shard(problem, m=4):
    return problem.build(0, m, torch.float64)


LOGREG = dane.problems.LogReg(np.random.default_rng(0).standard_normal((200, 5)),
                              np.where(np.random.default_rng(1).standard_normal(200) > 0, 1.0, -1.0), lam=1e-2,
                              local_solver="cholesky")  # given: local_solver=auto's choice is a rule applied


@pytest.mark.parametrize("config, attached", [
    (SDANEConfig(), ["double_weight"]),
    (AccSDANEConfig(), ["double_weight", "restart"]),
    (AccSDANEConfig(adapt=["restart"]), ["restart"]),
    (SDANEConfig(lam=0.1), []),                             # a weight given: the paper's fixed one
    (SDANEConfig(adaptive=True), []),                       # the line search moves λ itself
    (FedDANEConfig(), ["double_weight"]),
    (FedRedConfig(), ["double_weight"]),
    (FedRedConfig(averaging="random"), []),                 # a random client's objective is noisy
    (FedProxConfig(), ["client_drift"]),
    (FedProxConfig(adapt=[]), []),
    (AccSDANEConfig(paper=True), []),
    (SDANEConfig(local_solver="svrg"), ["local_retry", "double_weight"]),
    (AccSDANEConfig(local_solver="cg", paper=True), ["local_retry"]),    # the paper's round asks for the test
    (SDANEConfig(local_solver="lbfgs", paper=True, adapt=["local_retry"]), ["local_retry"]),
    (SDANEConfig(local_solver="svrg", adapt=["double_weight"]), ["double_weight"]),
    (SDANEConfig(local_solver="steps"), ["double_weight"]),               # steps until the test holds: no re-solve
])
def test_adaptations_are_attached_only_where_they_apply(config, attached):
    algo = config.build(shard(LOGREG, 1), LocalCommunicator())
    assert [a.name for a in algo.adaptations] == attached


@pytest.mark.parametrize("config, attr", [(SDANEConfig(local_solver="steps"), "lam"),
                                          (FedDANEConfig(local_solver="steps"), "mu")])
def test_a_doubled_weight_records_the_local_step_that_follows_it(config, attr):
    """S-DANE's and FedDANE's ``local_solver=steps`` at lr null step 1/(max_i L_i + weight) (`local_step`), the step
    the summary's defaults give at the starting weight: a doubling moves it, and its events say so (from, to), the
    step the next round takes.  A method whose steps do not read the weight (any other solver) records the weight's
    move alone."""
    algo = config.build(shard(LOGREG, 1), LocalCommunicator())
    (wrap,) = algo.adaptations
    weight = getattr(algo, attr)
    assert {e["key"]: e["value"] for e in algo.defaults}["algorithm.lr"] == algo.step_size(weight)
    assert wrap.after(algo, {"objective": 1.0}) == []
    events = wrap.after(algo, {"objective": 1.5})                                      # a climb: the weight doubles
    assert [(e["key"], e["from"], e["to"]) for e in events] == [
        (f"algorithm.{attr}", weight, 2 * weight),
        ("algorithm.lr", local_step(algo.L_max, weight), algo.step_size(getattr(algo, attr)))]
    assert events[1]["trigger"] == f"{attr} moved (local_step)" and events[1]["to"] < events[1]["from"]
    exact = config.__class__(local_solver="cholesky").build(shard(LOGREG, 1), LocalCommunicator())
    exact.adaptations[0].after(exact, {"objective": 1.0})
    assert [e["key"] for e in exact.adaptations[0].after(exact, {"objective": 1.5})] == [f"algorithm.{attr}"]


@pytest.mark.parametrize("config", [SDANEConfig, AccSDANEConfig], ids=lambda c: c.name)
def test_an_adaptive_lambda_s_local_steps_record_the_step_each_round_took(config):
    """``adaptive=true`` halves or doubles λ every round, and ``local_solver=steps`` at lr null steps 1/(max_i L_i +
    λ) (`local_step`), so the step moves with λ, which the summary's defaults give at the starting λ alone: each
    record now carries its round's ``lr``.  Reference: with one local step every client's x_i is c − lr ∇O(c) from
    the round's centre c (the h_i average out), so an accepted round sets x = c − lr ∇O(c), v ← (Bv + aμx −
    a∇O(x))/(B + aμ); S-DANE: c = v, a = 1/λ, B = 1; Acc-S-DANE (the paper's Algorithm 2): c = (Ax + av)/(A + a)
    with a > 0 from λa² = (A + a)B, then A ← A + a, B ← B + μa (A = 0, B = 1 at the start); a rejected round keeps
    x, v, A and B.  The iterates follow from the records' lr, λ and ``accepted`` to round-off.  An exact solve takes
    no steps: its records carry no ``lr``."""
    problems = [LOGREG.build(rank, 2, torch.float64) for rank in range(2)]
    algo, records, ws = simulate(config(lam=0.5, adaptive=True, local_solver="steps", local_steps=1), problems, 4)[0]
    (entry,) = [e for e in algo.defaults if e["key"] == "algorithm.lr"]
    smoothness, mu, accelerated = entry["stats"]["smoothness"], algo.mu, config.accelerated
    assert [r["lr"] for r in records[:-1]] == [local_step(smoothness, r["lam"]) for r in records[:-1]]
    assert len({r["lr"] for r in records[:-1]}) > 1 and {r["accepted"] for r in records[:-1]} == {True, False}

    def grad(x):
        return sum(p.evaluate(x)[0] for p in problems) / len(problems)

    w = v = ws[0].clone()
    A, B = 0.0, 1.0
    for r, record in enumerate(records[:-1]):
        lam = record["lam"]
        a = (B + math.sqrt(B * B + 4 * lam * A * B)) / (2 * lam) if accelerated else 1.0 / lam
        centre = (A * w + a * v) / (A + a)
        if record["accepted"]:
            w = centre - record["lr"] * grad(centre)
            v = (B * v + a * mu * w - a * grad(w)) / (B + a * mu)
            if accelerated:
                A, B = A + a, B + mu * a
        torch.testing.assert_close(ws[r + 1], w, rtol=0, atol=1e-13)
    _, exact, _ = simulate(config(lam=0.5, adaptive=True, local_solver="cholesky"), problems, 2)[0]
    assert not any("lr" in r for r in exact)  # no local steps, no step to record (1/(0 + λ) was recorded as one)


def svrg_logreg(**keys):
    """LOGREG's rows at a smaller ℓ2, where SVRG's passes=auto follows the weight (5 passes at 5e-3, 3 at 1e-2)."""
    return dane.problems.LogReg(np.random.default_rng(0).standard_normal((200, 5)),
                                np.where(np.random.default_rng(1).standard_normal(200) > 0, 1.0, -1.0), lam=1e-5,
                                **keys)


@pytest.mark.parametrize("config, attr, problem", [
    (SDANEConfig(local_solver="svrg"), "lam", svrg_logreg(local_solver="cholesky")),
    (FedDANEConfig(local_solver="svrg"), "mu", svrg_logreg(local_solver="cholesky", svrg_passes="auto")),
    (AccSDANEConfig(), "lam", svrg_logreg(local_solver="svrg", svrg_passes="auto")),   # the problem's own SVRG
])
def test_a_doubled_weight_records_the_svrg_nulls_that_follow_it(config, attr, problem):
    """S-DANE's and FedDANE's SVRG local solve at problem.svrg_lr null steps 1/(n_i L_row + l2 + weight), and at
    svrg_passes=auto runs passes from that step (`svrg_step`, `svrg_passes`): each solve re-derives them at the weight
    it is given, and the summary's defaults give them at the starting weight.  A doubling moved them with no event; each
    that moved is now recorded (from, to: the value the next round's solve uses), with this worker's [rank, from, to],
    as DANE records them where its safeguard moves μ."""
    algo = config.build(problem.build(0, 1, torch.float64), LocalCommunicator())
    (wrap,) = [a for a in algo.adaptations if a.name == "double_weight"]
    # one shard: the rule's weight is δ_A's floor, too small to move passes=auto; start from a weight that does
    weight, solver, wrap.rule.ceiling = 5e-3, algo.solver or algo.problem.solver, math.inf
    setattr(algo, attr, weight)
    assert solver is not None and solver.method == "svrg"
    at = {w: svrg_resolved(algo.problem, solver, w) for w in (weight, 2 * weight)}
    wrap.after(algo, {"objective": 1.0})
    events = wrap.after(algo, {"objective": 1.5})                                      # a climb: the weight doubles
    moved = [name for name in at[weight] if at[weight][name]["value"] != at[2 * weight][name]["value"]]
    assert moved == (["lr", "passes"] if solver.passes == "auto" else ["lr"])
    rules = {"lr": ("problem.svrg_lr", "svrg_step"), "passes": ("problem.svrg_passes", "svrg_passes")}
    assert events[0]["key"] == f"algorithm.{attr}" and getattr(algo, attr) == 2 * weight
    assert events[1:] == [{"key": rules[name][0], "from": at[weight][name]["value"],
                           "to": at[2 * weight][name]["value"], "trigger": f"{attr} moved ({rules[name][1]})",
                           "workers": [[0, at[weight][name]["value"], at[2 * weight][name]["value"]]]}
                          for name in moved]
    assert events[1]["to"] == svrg_constants(Subproblem(algo.problem, None, None, 2 * weight, algo.problem.l2),
                                             solver)[0]                                # the step the next solve takes


def test_admms_refresh_falls_on_the_powers_of_two_from_8_and_aides_tau_grows_4_times_the_larger_weight():
    assert [t for t in range(100) if refresh_due(t)] == [8, 16, 32, 64]
    assert (grown_tau(0.0, 0.3, 9.0), grown_tau(0.5, 0.3, 9.0), grown_tau(0.0, 0.0, 2.5)) == (1.2, 2.0, 10.0)


@pytest.mark.parametrize("config, attached", [
    (ADMMConfig(), ["rho_refresh"]),                         # an estimated ρ of a logistic loss
    (ADMMConfig(paper=True), []),
    (ADMMConfig(adapt=[]), []),
    (ADMMConfig(rho=0.1), ["residual_balance"]),             # a given ρ: Boyd's balancing, the paper's
    (ADMMConfig(rho=0.1, paper=True), ["residual_balance"]),
    (ADMMConfig(rho=0.1, adaptive_rho=False), []),
    (AIDEConfig(), ["tau_growth", "momentum_restart"]),
    (AIDEConfig(adapt=["momentum_restart"]), ["momentum_restart"]),
    (AIDEConfig(paper=True), []),                            # round 0's τ for the whole run
    (AIDEConfig(tau=0.1), []),                               # a τ given: the paper's method
])
def test_admms_and_aides_adaptations_are_named_and_switchable(config, attached):
    algo = config.build(shard(LOGREG, 1), LocalCommunicator())
    assert [a.name for a in algo.adaptations] == attached


def test_admm_and_aide_take_only_their_own_adaptations():
    with pytest.raises(ConfigError, match=r"algorithm.adapt\[\] must be one of rho_refresh, got 'restart'"):
        ADMMConfig(adapt=["restart"])
    with pytest.raises(ConfigError, match="algorithm.paper=true runs no adaptation"):
        AIDEConfig(paper=True, adapt=["tau_growth"])


def test_a_federated_method_takes_only_its_own_adaptations():
    """``algorithm=fedprox algorithm.adapt=[local_retry]`` ran as if the name were FedProx's (S-DANE's re-solve, never
    attached): refused, naming the method's own names, as an unknown name is."""
    with pytest.raises(ConfigError, match=r"^algorithm.adapt\[\] must be one of client_drift, got 'local_retry'$"):
        FedProxConfig(adapt=["local_retry"])
    with pytest.raises(ConfigError, match=r"^algorithm.adapt\[\] must be one of double_weight\|sampling_floor\|"
                                          r"local_retry, got 'restart'$"):
        SDANEConfig(adapt=["restart"])  # Acc-S-DANE's extrapolation restart
    with pytest.raises(ConfigError, match=r"^algorithm.adapt\[\] must be one of double_weight\|sampling_floor, "
                                          r"got 'client_drift'$"):
        FedDANEConfig(adapt=["client_drift"])
    with pytest.raises(ConfigError, match=r"^algorithm=scaffold has no adaptation, got algorithm.adapt=\['restart'\]; "
                                          r"set algorithm.adapt=\[\] or null$"):
        ScaffoldConfig(adapt=["restart"])
    assert AccSDANEConfig(adapt=["restart", "local_retry"]).adapt == ("restart", "local_retry")
    assert FedRedConfig(adapt=["sampling_floor"]).adapt == ("sampling_floor",)
    assert ScaffoldConfig(adapt=[]).adapt == ()


def test_paper_mode_freezes_the_resolved_numbers_and_takes_the_papers_server_step():
    ours = ScaffoldConfig().build(shard(LOGREG, 1), LocalCommunicator())
    paper = ScaffoldConfig(paper=True).build(shard(LOGREG, 1), LocalCommunicator())
    assert (ours.server_lr, paper.server_lr) == (1.5, 1.0) and ours.lr == paper.lr
    with pytest.raises(ConfigError, match="algorithm.paper=true runs no adaptation"):
        AccSDANEConfig(paper=True, adapt=["restart"])
    with pytest.raises(ConfigError, match="algorithm.adapt"):
        SDANEConfig(adapt=["nonsense"])


def test_a_defaulted_runs_summary_lists_each_resolved_value_and_its_statistics():
    result = dane.fit(LOGREG, "sdane", workers=4, rounds=3)
    entries = {e["key"]: e for e in result.summary["defaults"]}
    assert set(entries) == {"algorithm.lam", "algorithm.mu"}
    lam = entries["algorithm.lam"]
    assert lam["rule"] == "prox_weight" and lam["value"] == result.records[0]["lam"]
    assert {"delta_a", "hessian_norm", "balanced", "s", "m", "divisor"} <= set(lam["stats"])
    assert lam["stats"]["s"] == lam["stats"]["m"] == 4
    assert entries["algorithm.mu"] == {"key": "algorithm.mu", "value": 1e-2, "rule": "the problem's",
                                       "stats": {}}
    assert result.summary["package_rules_applied"] is True
    assert result.summary["adaptations_attached"] == ["double_weight"]


def test_a_run_given_every_number_says_no_package_rule_applied():
    result = dane.fit(LOGREG, "sdane", workers=4, rounds=3, lam=0.1, mu=0.0)
    assert result.summary["defaults"] == [] and result.summary["adaptations"] == []
    assert result.summary["package_rules_applied"] is False and result.summary["adaptations_attached"] == []


def test_each_weight_change_of_a_run_is_an_adaptation_in_its_records_and_summary():
    """One-hot shards smaller than the dimension (tests/test_prox_weight_rule.py; 8 clients of 25 rows, d = 49): the
    default λ doubles; every change of the records' λ is one event (round, from, to, trigger) and the summary lists
    them all.  The paper's fixed weight, over the same rounds, never changes."""
    from test_prox_weight_rule import one_hot_logreg

    # 23 rounds hold all three triggers (climbs at rounds 3 and 4, an overshoot at 11, a cycle at 21); half the
    # clients and rows of the 16-client problem keep the test's threads few
    problem = one_hot_logreg(seed=2, n=200)
    result = dane.fit(problem, "sdane", workers=8, rounds=23)
    lams = [r["lam"] for r in result.records[:-1]]
    changes = [(t, a, b) for t, (a, b) in enumerate(zip(lams, lams[1:])) if a != b]
    events = result.summary["adaptations"]
    assert changes and [(e["round"], e["from"], e["to"]) for e in events] == changes
    assert all(e["key"] == "algorithm.lam" for e in events)
    assert {e["trigger"] for e in events} == {"climb", "cycle", "overshoot"}
    paper = dane.fit(problem, "sdane", workers=8, rounds=23, paper=True)
    assert paper.summary["adaptations"] == [] and len({r["lam"] for r in paper.records[:-1]}) == 1


def test_a_resumed_run_reads_the_same_local_retry_events():
    """A checkpoint at round 2 keeps the re-solves rank 0 has read (``resolves_seen``): the resumed records 2..4 carry
    the straight run's events (rounds 1 to 3), each the round's re-solves, not the run's so far."""
    from dane.api import algorithm_config
    from dane.comm import ThreadGroup
    from dane.loop.runner import run
    from dane.loop.stopping import StopRule

    config = algorithm_config("sdane", lam=1.0, mu=0.0, local_solver="svrg", paper=True)

    def worker(comm):
        states = []
        straight, _ = run(config.build(RIDGE_SVRG.build(comm.rank, comm.size), comm), StopRule(rounds=4),
                          on_checkpoint=states.append, checkpoint_every=2)
        again, _ = run(config.build(RIDGE_SVRG.build(comm.rank, comm.size), comm), StopRule(rounds=4),
                       resume=states[0])
        return straight, again

    RIDGE_SVRG.prepare()
    straight, again = ThreadGroup(4).run(worker)[0]
    assert [r["round"] for r in again] == [2, 3, 4]
    assert [r["adapted"] for r in again] == [r["adapted"] for r in straight[2:]]
    assert [[e["round"] for e in r["adapted"]] for r in again] == [[1], [2], [3]]
    assert [e["resolves"] for r in straight[1:] for e in r["adapted"]] == [3, 4, 3, 5]
