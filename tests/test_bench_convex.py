"""scripts/bench_convex.py's machinery on tiny inputs: the cost-to-target extraction, the two goals, the
rcv1-like generator, and a --quick run whose JSON agrees with its own run directories (never a timed test)."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from dane.data.files import LibSVMSource
from dane.records.results import read_rounds
from dane.synthetic.sparse_data import rcv1_like, write_sparse_libsvm
from tests.helpers import REPO, env

from scripts import bench_convex as bench


def records(subopts, f_star=2.0):
    """Hand-made rounds: round k has 3k allreduces, 100k bytes and 0.5k simulated seconds."""
    return [{"round": k, "comm_rounds": 3 * k, "bytes_sent": 100 * k, "time_s": 0.5 * k, "objective": f_star + s,
             "suboptimality": s} for k, s in enumerate(subopts)]


# ------------------------------------------------------------------------------------------ cost to target
def test_to_target_is_the_first_record_at_the_relative_target():
    f_star = -4.0  # relative to |O*|: the target is 4e-8 here
    subopts = [1.0, 1e-3, 5e-8, 4e-8, 1e-9, 1e-12]
    row = bench.to_target(records(subopts, f_star), f_star)
    first = next(k for k, s in enumerate(subopts) if s / abs(f_star) <= 1e-8)
    assert first == 3  # 4e-8 / 4 = 1e-8 exactly counts
    assert row["reached"] and row["rounds"] == first
    assert (row["comm_rounds"], row["bytes"], row["time_s"]) == (3 * first, 100 * first, 0.5 * first)
    assert row["best_rel_suboptimality"] == pytest.approx(1e-12 / 4)
    assert row["at_end"] == {"round": 5, "comm_rounds": 15, "bytes_sent": 500, "time_s": 2.5}


def test_to_target_not_reached_gives_nulls_and_the_best():
    row = bench.to_target(records([1.0, 1e-4, 3e-6, 2e-6, 5e-6]), 2.0)
    assert not row["reached"]
    assert row["rounds"] is row["comm_rounds"] is row["bytes"] is row["time_s"] is None
    assert row["best_rel_suboptimality"] == pytest.approx(1e-6)
    assert row["final_rel_suboptimality"] == pytest.approx(2.5e-6)
    assert row["at_end"]["round"] == 4


# ------------------------------------------------------------------------------------------ goals
def reached(comm, time_s=1.0):
    return {"reached": True, "comm_rounds": comm, "time_s": time_s, "at_end": {"comm_rounds": comm, "time_s": time_s}}


def capped(comm, time_s=1.0):
    return {"reached": False, "comm_rounds": None, "time_s": None, "best_rel_suboptimality": 1e-3,
            "at_end": {"comm_rounds": comm, "time_s": time_s}}


@pytest.mark.parametrize("rows, status, ratio", [
    ({"dane": reached(20), "giant": reached(12), "admm": reached(40), "gd": reached(300)}, "met", 12 / 40),
    ({"dane": reached(20), "admm": reached(50), "gd": reached(45)}, "not met", 20 / 45),
    ({"giant": reached(30), "admm": capped(90), "gd": capped(120)}, "met", 30 / 90),       # 30 <= (> 90) / 3
    ({"giant": reached(31), "admm": capped(90), "gd": capped(120)}, "undetermined", 31 / 90),
    ({"giant": reached(10), "admm": reached(100), "gd": capped(40)}, "met", 10 / 40),       # both need > 30
    ({"giant": reached(14), "admm": reached(100), "gd": capped(40)}, "undetermined", 14 / 40),  # GD might need 41
    ({"dane": capped(200), "admm": reached(50), "gd": reached(60)}, "not met", None),
    ({"dane": reached(6), "aide": {"reached": False, "error": "boom"}, "admm": {"reached": False, "error": "x"},
      "gd": reached(18)}, "met", 6 / 18),                                                  # failed runs are ignored
])
def test_goal_allreduces(rows, status, ratio):
    goal = bench.goal_allreduces(rows)
    assert goal["status"].startswith(status)
    assert goal.get("ratio") == (pytest.approx(ratio) if ratio is not None else None)


@pytest.mark.parametrize("dane_row, admm_row, status", [
    (reached(10, 2.0), reached(90, 3.0), "met"),
    (reached(10, 4.0), reached(90, 3.0), "not met"),
    (reached(10, 2.0), capped(90, 2.5), "met"),             # ADMM needs more than 2.5 s
    (reached(10, 4.0), capped(90, 2.5), "undetermined"),
    (capped(100, 9.0), reached(90, 3.0), "not met"),
])
def test_goal_time(dane_row, admm_row, status):
    assert bench.goal_time({"dane": dane_row, "admm": admm_row})["status"].startswith(status)


# ------------------------------------------------------------------------------------------ the generator
def test_rcv1_like_rows_vocabulary_and_labels():
    X, y = rcv1_like(300, 20000, seed=3)
    nnz = np.diff(X.indptr)
    assert X.shape == (300, 20000) and nnz.min() >= 50 and nnz.max() <= 100
    assert X.nnz / (300 * 20000) == pytest.approx(nnz.mean() / 20000) and 50 / 20000 <= X.nnz / 6e6 <= 100 / 20000
    assert np.all(X.data > 0)
    np.testing.assert_allclose(np.sqrt(X.multiply(X).sum(1).A1), 1.0, atol=1e-5)
    df = np.sort(np.bincount(X.indices, minlength=20000))[::-1]
    assert df[0] >= 0.9 * 300                   # a few features are in nearly every row
    assert df[:200].sum() > 0.3 * X.nnz         # the top 1% of features hold a large share of the entries
    assert np.median(df[df > 0]) <= 2           # most features that occur are rare
    assert set(np.unique(y)) == {-1.0, 1.0} and 0.3 < (y > 0).mean() < 0.7
    X2, y2 = rcv1_like(300, 20000, seed=3)
    assert (X2 != X).nnz == 0 and np.array_equal(y2, y)
    X3, _ = rcv1_like(300, 20000, seed=4)
    assert X3.shape == X.shape and (X3 != X).nnz > 0


def test_libsvm_file_round_trips_exactly(tmp_path):
    path = write_sparse_libsvm(tmp_path / "r.svm", 120, 20000, seed=1)
    X, y = rcv1_like(120, 20000, seed=1)
    table = LibSVMSource(str(path)).load()   # d inferred from the file: the last column is always used
    assert table.X.shape == (120, 20000)
    assert np.array_equal(table.X.indptr, X.indptr) and np.array_equal(table.X.indices, X.indices)
    assert np.array_equal(table.X.data, X.data) and np.array_equal(table.y, y)


# ------------------------------------------------------------------------------------------ a --quick run
@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    (tmp / "no_data").mkdir()
    out = tmp / "bench.json"
    out.write_text(json.dumps({"other_bench": {"kept": True}}))
    proc = subprocess.run([sys.executable, "-m", "scripts.bench", "convex", "--quick", "--out", str(out), "--runs", str(tmp / "runs"),
                           "--data-dir", str(tmp / "no_data")], cwd=REPO, env=env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(out.read_text()), proc.stdout


@pytest.mark.slow
def test_quick_run_writes_its_key_and_keeps_others(quick):
    report, stdout = quick
    assert report["other_bench"] == {"kept": True}
    assert "local_solve_cost" not in report  # scripts/bench_local_solve.py's
    family = report[bench.KEY]
    assert family["quick"] and family["cost_model"]["source"].startswith("package default")
    assert "mnist" in family["problems"]["mnist_softmax"]["skipped"].lower()
    assert "mnist_softmax: skipped" in stdout
    assert len(family["load_avg_before"]) == len(family["load_avg_after"]) == 3
    for name in ("breast_cancer_logreg", "diabetes_ridge", "rcv1_like_logreg"):
        problem = family["problems"][name]
        assert problem["lam"] > 0 and problem["lam_why"] and problem["dim"] >= 11
        for per_m in problem["workers"].values():
            assert set(per_m["algorithms"]) == set(bench.NEWTON + bench.BASELINES)
            assert set(per_m["goals"]) == {"a_allreduces", "b_time"}


@pytest.mark.slow
def test_quick_rows_agree_with_their_rounds_jsonl(quick):
    family = quick[0][bench.KEY]
    seen_reached = 0
    for problem in family["problems"].values():
        for per_m in problem.get("workers", {}).values():
            for name, row in per_m["algorithms"].items():
                if "error" in row:
                    continue
                recs = read_rounds(row["run_dir"])
                rel = [r["suboptimality"] / abs(problem["f_star"]) for r in recs]
                assert recs[-1]["round"] == row["at_end"]["round"] <= row["round_cap"]
                assert row["best_rel_suboptimality"] == pytest.approx(min(rel))
                if row["reached"]:
                    seen_reached += 1
                    k = row["rounds"]
                    assert rel[k] <= 1e-8 and all(v > 1e-8 for v in rel[:k])
                    assert (row["comm_rounds"], row["bytes"], row["time_s"]) == \
                        (recs[k]["comm_rounds"], recs[k]["bytes_sent"], recs[k]["time_s"])
                else:
                    assert row["rounds"] is None and min(rel) > 1e-8
                if name == "dane":
                    assert len(row["safeguard"]["mu"]) == len(recs) - 1
    assert seen_reached >= 3  # GIANT on diabetes, DANE, GIANT and DiSCO on the rcv1-like file reach it in 8 rounds


@pytest.mark.slow  # its fixture runs the bench's quick rows: 25 s of the fast suite (make test's 10 minutes)
def test_quick_goals_follow_from_the_numbers(quick):
    family = quick[0][bench.KEY]
    for problem in family["problems"].values():
        for per_m in problem.get("workers", {}).values():
            rows, goal = per_m["algorithms"], per_m["goals"]["a_allreduces"]
            newton = [r["comm_rounds"] for a, r in rows.items() if a in bench.NEWTON and r["reached"]]
            base = [r["comm_rounds"] if r["reached"] else r["at_end"]["comm_rounds"]
                    for a, r in rows.items() if a in bench.BASELINES and "error" not in r]
            assert goal["baseline_comm_rounds"] == min(base)
            if not newton:
                assert goal["status"] == "not met"
            elif goal["status"] == "met":
                assert 3 * min(newton) <= min(base)
            else:
                assert 3 * min(newton) > min(base)
            time_goal, dane_row, admm_row = per_m["goals"]["b_time"], rows["dane"], rows["admm"]
            admm_t = admm_row["time_s"] if admm_row["reached"] else admm_row["at_end"]["time_s"]
            if time_goal["status"] == "met":
                assert dane_row["reached"] and dane_row["time_s"] <= admm_t
            else:
                assert not dane_row["reached"] or dane_row["time_s"] > admm_t
