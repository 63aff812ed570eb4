"""scripts/bench_wallclock.py: its arithmetic on hand-made clocks, and a --quick run's JSON (never timed)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO

from scripts import bench_wallclock as bench

# The parts telescope (each mark ends one part and starts the next), so they add up to the total
# exactly but for float64 addition on time.time() values near 1.8e9 s (one ulp: 2.4e-7 s, eight terms).
SUM_TOL = 1e-5
# A part may dip below zero by one kernel tick (10 ms): the process start is read in ticks, and a file's
# mtime comes from the kernel's coarse clock, which can lag time.time() by a tick.
TICK = 0.011


def test_package_parts_add_up_to_the_answer_and_the_total():
    t_cmd = 1_800_000_000.0
    timeline = {"config": 4.0, "data": 6.5, "round0": 6.6, "end": 7.6, "clock_origin": t_cmd + 1.2,
                "process_start": -0.05}
    out = bench.package_parts(t_cmd, t_exit=t_cmd + 12.0, t_answer=t_cmd + 1.2 + 7.61, timeline=timeline)
    parts = out["parts"]
    assert parts["launcher"] == pytest.approx(1.15, abs=1e-6)   # the process started 0.05 s before psutil's origin
    assert parts["imports"] == pytest.approx(4.05, abs=1e-6)
    assert parts["reference"] == 0.0 and parts["setup"] == pytest.approx(0.1, abs=1e-6)
    assert parts["rounds"] == pytest.approx(1.0, abs=1e-6) and parts["write"] == pytest.approx(0.01, abs=1e-6)
    assert sum(parts.values()) == pytest.approx(out["total_s"], abs=SUM_TOL) and out["total_s"] == 12.0
    assert sum(v for k, v in parts.items() if k != "exit") == pytest.approx(out["answer_s"], abs=SUM_TOL)
    with_reference = bench.package_parts(t_cmd, t_cmd + 12.0, t_cmd + 8.81, {**timeline, "reference": 6.55})
    assert with_reference["parts"]["reference"] == pytest.approx(0.05, abs=1e-6)
    assert with_reference["parts"]["setup"] == pytest.approx(0.05, abs=1e-6)


def test_first_stop_stops_the_sequence_where_it_is_good():
    # ratios fall, rise at index 2, fall again: a threshold must be below every earlier ratio
    ratios, good = [1.0, 0.1, 0.2, 0.01, 0.001], [False, False, False, True, True]
    t = bench.first_stop(ratios, good)
    assert 0.01 <= t < 0.1 and t == pytest.approx((0.01 * 0.1) ** 0.5)
    assert bench.first_stop([1.0, 0.5], [False, False]) is None
    assert bench.first_stop([0.3], [True]) == pytest.approx(0.303)


def test_goals_are_differences_and_ratios_of_medians():
    variants = {"horovodrun_np2": {"answer_s": {"median": 9.0}, "parts": {"rounds": {"median": 0.6}}},
                "bare_horovodrun": {"total_s": {"median": 6.5}}, "scipy_lbfgsb": {"fit_s": {"median": 0.5}}}
    out = bench.goals(variants)
    assert out["launch_over_bare_horovodrun"]["over_s"] == pytest.approx(2.5)
    assert out["launch_over_bare_horovodrun"]["goal_met"] is False
    assert out["rounds_over_lbfgs_fit"]["ratio"] == pytest.approx(1.2) and not out["rounds_over_lbfgs_fit"]["goal_met"]
    assert bench.goals({})["rounds_over_lbfgs_fit"]["goal_met"] is None


# ------------------------------------------------------------------------------------------ a --quick run
# `slow`: the --quick run launches horovodrun, torchrun, the simulator and the scipy baselines one after
# another (30 s of the fast suite's 600 s budget on 2 cores); `make test-slow` runs it, `make bench` uses the script.
@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wallclock")
    out = tmp / "bench.json"
    out.write_text(json.dumps({"other": {"kept": True}}))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "scripts.bench", "wallclock", "--quick", "--out", str(out), "--data-dir", str(tmp / "none")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text()), proc.stdout


@pytest.mark.slow
def test_quick_run_writes_its_key_keeps_others_and_skips_mnist_without_its_files(quick):
    report, stdout = quick
    assert report["other"] == {"kept": True}
    section = report[bench.KEY]
    assert section["quick"] and section["repeats"] == 1 and "load_avg" in section["machine"]
    assert set(section["how_measured"]) >= set(bench.PARTS)
    assert "not in" in section["problems"]["mnist_softmax"]["skipped"]
    assert "mnist_softmax skipped" in stdout


@pytest.mark.slow
def test_quick_parts_add_up_and_every_run_reached_the_target(quick):
    problem = quick[0][bench.KEY]["problems"]["tiny_dense_logreg"]
    assert problem["method"]["method"] in ("giant", "disco")
    check = problem["baselines"]["objective_check"]
    assert check["rel_difference"] < 1e-12  # the baselines' objective is the package's
    launched = [v for v in (*bench.PACKAGE, *bench.BASELINES) if v in problem["variants"]]
    assert set(bench.BASELINES) <= set(launched) and "simulator_m2" in launched
    for variant in launched:
        summary = problem["variants"][variant]
        assert summary["launches_failed"] == 0 and summary["all_reached_target"]
        for run in summary["runs"]:
            parts = run["parts"]
            assert sum(parts.values()) == pytest.approx(run["total_s"], abs=SUM_TOL)
            assert sum(v for k, v in parts.items() if k != "exit") == pytest.approx(run["answer_s"], abs=SUM_TOL)
            assert min(parts.values()) > -TICK, (variant, parts)
            assert run["rel_suboptimality"] <= bench.TARGET
        assert summary["answer_s"]["median"] == summary["runs"][0]["answer_s"]  # one repeat: the median is it


@pytest.mark.slow
def test_quick_goals_follow_from_the_medians(quick):
    problem = quick[0][bench.KEY]["problems"]["tiny_dense_logreg"]
    variants, goals = problem["variants"], problem["goals"]
    fit = variants["scipy_lbfgsb"]["fit_s"]["median"]
    assert goals["rounds_over_lbfgs_fit"]["lbfgs_fit_s"] == fit
    if "horovodrun_np2" in variants:
        rounds = variants["horovodrun_np2"]["parts"]["rounds"]["median"]
        assert goals["rounds_over_lbfgs_fit"]["ratio"] == pytest.approx(rounds / fit, rel=1e-12)
        over = variants["horovodrun_np2"]["answer_s"]["median"] - variants["bare_horovodrun"]["total_s"]["median"]
        assert goals["launch_over_bare_horovodrun"]["over_s"] == pytest.approx(over, rel=1e-12)
        assert goals["launch_over_bare_horovodrun"]["goal_met"] == (over <= bench.LAUNCH_GOAL_S)
