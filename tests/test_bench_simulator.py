"""scripts/bench_horovod.py's simulated round (``simulator_error``): steady rounds, and the cost model's share exactly."""
from __future__ import annotations

import pytest

from dane.comm import AlphaBeta
from dane.comm.tail import tail_entry
from dane.problems import RidgeSyntheticConfig

from scripts import bench_horovod as bench


def test_simulated_round_is_the_steady_round_with_the_models_communication(tmp_path):
    """DANE at m = 2 reaches the optimum within a few rounds, where the default stopping test would end the run;
    the real launches time rounds that keep going on cached factors, so the simulated round must too.  Its
    communication is the α-β model's: two ring allreduces a round (the gradient with the problem's metrics and
    the safeguard's objective, then the iterate: d = 500) and round 0's evaluation (`Algorithm.evaluate`: the
    gradient with the metrics), T(n) = n/β + 2α at m = 2."""
    cost = AlphaBeta(alpha=1e-3, beta=1e9)
    n_rounds = 12
    sim = bench.simulated_round(cost, n_rounds, tmp_path)
    metrics = len(RidgeSyntheticConfig().build(0, 2).metric_names)
    per_round = cost.allreduce_time(8 * (500 + metrics + 1), 2) + cost.allreduce_time(8 * 500, 2)
    expected_comm = (n_rounds * per_round + cost.allreduce_time(8 * (500 + metrics), 2)) / n_rounds
    assert sim["comm_s"] == pytest.approx(expected_comm, rel=1e-12)
    assert sim["compute_s"] > 0 and sim["round_s"] > per_round
    run_dir, = [p for p in tmp_path.iterdir() if p.name.startswith("sim_")]
    records = bench.read_rounds(run_dir)
    assert [r["round"] for r in records] == list(range(n_rounds + 1))  # no stopping test ended it early


def test_steady_round_leaves_out_round_one():
    records = [{"time_s": t} for t in (0.0, 5.0, 6.0, 7.5, 8.5)]  # round 1 factors: 5 s; then 1, 1.5, 1
    assert bench.steady_round_s(records) == pytest.approx((1.0 + 1.5 + 1.0) / 3, rel=1e-15)


def test_pair_k_draws_calibration_ks_tail(tmp_path):
    """``error_with_tail``: pair k's simulator draws calibration k's tail.  Calibration 0's phases exceed α-β by
    exactly c each, calibration 1's by 0: pair 0 then pays α-β + c for every allreduce (round 0's one and two a
    round), pair 1 α-β alone."""
    cost = AlphaBeta(alpha=1e-3, beta=1e9)
    c, n_rounds, n = 2.5e-3, 4, 20

    def calibration(excess: float) -> dict:
        phases = {"wall_s": [1e-3 + cost.allreduce_time(4000, 2) + excess] * n, "cpu_s": [1e-3] * n,
                  "nbytes": [4000] * n}
        return {"alpha": cost.alpha, "beta": cost.beta,
                "tail": tail_entry(phases, cost, 2, machine={"host": "h", "load_avg": [0.0] * 3}, launcher="l", np=2,
                                   measured_at="now")}

    timings = [{"means": {"round_s": 0.01}}] * 2
    pair0, pair1 = bench.with_tail(timings, [calibration(c), calibration(0.0)], n_rounds, tmp_path)
    plain = bench.simulated_round(cost, n_rounds, tmp_path)["comm_s"]
    assert pair0["simulated_comm_s_with_tail"] == pytest.approx(plain + c * (2 * n_rounds + 1) / n_rounds, rel=1e-9)
    assert pair1["simulated_comm_s_with_tail"] == pytest.approx(plain, rel=1e-9)
    assert pair0["tail_samples"] == pair1["tail_samples"] == n
