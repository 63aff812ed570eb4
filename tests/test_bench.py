"""The benchmark runner (scripts/harness.py) and its sections' JSON, table-driven over canned --quick outputs.

Each file of tests/data/bench/ is a real ``python -m scripts.bench SECTION --quick`` output (`make bench-smoke` runs
those commands; the defaults one cut to gd and dane).  Nothing here starts a process or runs a benchmark: the
tests check the keys a section keeps (docs/benchmarks.md names them), the arithmetic that holds between its numbers,
the runner's record and goals table, and the one command line.
"""
from __future__ import annotations

import argparse
import json

import pytest

from scripts import bench as runner
from scripts import harness
from tests.helpers import REPO

DATA = REPO / "tests" / "data" / "bench"


def canned(name: str) -> dict:
    return json.loads((DATA / f"{name}.json").read_text())


def defaults_arithmetic(section: dict) -> None:
    from scripts.bench_defaults import METHODS, misses

    for cell in section["cells"].values():
        for method, row in cell["methods"].items():
            reached = [g["comm_rounds"] for g in row["grid"] if g["reached"]]
            assert len(row["grid"]) == len(METHODS[method][2]) and row["best"]["comm_rounds"] == min(reached)
            assert row["ratio"] == pytest.approx(row["default"]["comm_rounds"] / min(reached))
            assert row["within_factor"] == (row["ratio"] <= METHODS[method][3])
    assert section["misses"] == misses(section)


def federated_arithmetic(section: dict) -> None:
    dim = section["similarity"]["dim"]
    assert section["similarity"]["delta"] >= section["similarity"]["delta_mean_square"] > 0
    for key, row in section["rows"].items():
        runs = [row["default"], *row["grid"]]
        reached = [r["targets"]["1e-08"]["rounds"] for r in runs if r["targets"].get("1e-08")]
        assert (row["best"] and row["best"]["rounds"]) == (min(reached) if reached else None), key
        if row["method"] == "scaffold":  # s clients x (Δy, Δc) x d float64 in each round that made w_t
            for hit in (r["targets"].get("1e-08") for r in runs):
                assert hit is None or hit["uplink_bytes"] == hit["rounds"] * row["clients"] * 2 * dim * 8


def compress_arithmetic(section: dict) -> None:
    for row in section["compressor_time"]:
        assert row["bits_over_dense"] == pytest.approx(row["bits"] / (64 * row["n"]))
        assert row["seconds_min"] <= row["seconds_median"] <= row["seconds_max"]
    dense, top = section["gd_to_target"][:2]  # top-10 of d = 100 sends fewer bits a round than the dense vector
    assert dense["compress"] == "none" and top["uplink_bits"] / top["rounds"] < dense["uplink_bits"] / dense["rounds"]


def local_solve_arithmetic(section: dict) -> None:
    for case in section["cases"]:
        if "skipped" not in case:
            assert case["round_s_min"] <= case["round_s"] <= case["round_s_max"]
            assert case["first_round_s_min"] <= case["first_round_s"] <= case["first_round_s_max"]
    assert {c["solver"] for c in section["cases"]} == {"cholesky", "cg"}


def similarity_arithmetic(section: dict) -> None:
    for data in section["datasets"].values():
        sizes = {sum(cell["rows"]) for cell in data["cells"]}
        assert len(sizes) == 1  # every sharding deals the same rows
        for cell in data["cells"]:
            assert cell["delta_start"] == max(cell["per_worker_start"])
            assert cell["delta_mean_square_start"] <= cell["delta_start"]
            assert not cell["reached"] or cell["final_relative_suboptimality"] <= 1e-8


#: section -> (its canned file, the keys its JSON keeps, the arithmetic between its numbers)
SECTIONS = {
    "defaults": ("defaults", {"started_at", "machine", "quick", "code", "target", "goals", "methods", "cells", "misses",
                              "load_avg_after", "wall_s"}, defaults_arithmetic),
    "federated": ("federated", {"started_at", "machine", "quick", "setting", "code", "dataset", "workers", "clients",
                                "sharding", "lam", "seed", "targets", "target", "round_caps", "grids", "methods", "rows",
                                "similarity", "load_avg_now", "load_avg_after", "wall_s"}, federated_arithmetic),
    "compress": ("compress", {"machine", "target", "compressor_time", "gd_to_target", "machine_after",
                              "load_avg_after", "wall_s"}, compress_arithmetic),
    "local_solve_cost": ("local_solve", {"started_at", "machine", "quick", "what", "time", "memory", "cases",
                                         "load_avg_before", "load_avg_after", "wall_s"}, local_solve_arithmetic),
    "similarity": ("similarity", {"started_at", "machine", "quick", "what", "target", "workers", "lam", "rounds_cap",
                                  "seed", "datasets", "load_avg_before", "load_avg_after", "wall_s"},
                   similarity_arithmetic),
}


@pytest.mark.parametrize("key", SECTIONS)
def test_a_section_keeps_its_keys_and_its_arithmetic(key):
    name, keys, arithmetic = SECTIONS[key]
    section = canned(name)[key]
    assert set(section) == keys
    assert {"load_avg", "cpu", "kernel", "cpus"} <= set(section["machine"])
    arithmetic(section)


@pytest.mark.parametrize("key", SECTIONS)
def test_the_docs_name_every_section(key):
    assert f"| `{key}` |" in (REPO / "docs" / "benchmarks.md").read_text()


def test_every_section_has_one_command_line():
    """One parser: every module of scripts/ declares its section; each answers ``--out``, ``--quick`` and its flags."""
    benches = {name: runner.importlib.import_module(module).BENCH for name, module in runner.MODULES.items()}
    assert {benches[name].key for name, *_ in SECTIONS.values()} == set(SECTIONS)
    assert all(isinstance(b, harness.Bench) for b in benches.values())
    assert {p.stem for p in (REPO / "scripts").glob("*.py")} == \
        {"__init__", "bench", "harness", *(m.removeprefix("scripts.") for m in runner.MODULES.values())}
    args = harness.parser(benches).parse_args(["defaults", "--quick", "--only", "gd", "--workers", "4"])
    assert (args.section, args.quick, args.only, args.workers, args.out) == \
        ("defaults", True, ["gd"], [4], "results/bench.json")
    assert harness.parser(benches).parse_args(["sampled_lambda"]).out == "results/sampled_lambda.json"
    with pytest.raises(SystemExit):
        harness.parser(benches).parse_args(["compress", "--only", "gd"])  # compress has no --only


def test_the_runner_merges_and_writes_the_goals_table(tmp_path):
    """`harness.Run.finish` merges the section beside the others, adds the load after and the wall seconds, and
    writes the goals table of the whole file: a headline against its goal, a section's misses."""
    out = tmp_path / "bench.json"
    out.write_text(json.dumps({"other": {"ratio": 1.3, "goal": 1.25}, "defaults": canned("defaults")["defaults"]}))
    bench = harness.Bench("mine", lambda run: {}, "a test")
    run = harness.Run(bench, argparse.Namespace(out=str(out)))
    run.finish({**run.header(), "error": 0.1, "goal": 0.25})
    whole = json.loads(out.read_text())
    assert set(whole["mine"]) == {"started_at", "machine", "error", "goal", "load_avg_after", "wall_s"}
    table = whole["goals_table"]
    assert table["mine"] == {"headline": "error", "value": 0.1, "goal": 0.25, "met": True}
    assert table["other"] == {"headline": "ratio", "value": 1.3, "goal": 1.25, "met": False}
    misses = whole["defaults"]["misses"]
    assert table["defaults"] == {"misses": len(misses), "met": not misses, "lines": misses}


def test_work_is_counted_to_the_record_that_reaches_the_target():
    """Record t holds the work of round t, which made w_{t+1}: w_t's is the record before; none when uncounted."""
    records = [{"uplink_bytes": 10 * (k + 1), "local_passes": 3 * (k + 1)} for k in range(4)]
    assert [harness.work_to(records, k, "local_passes") for k in range(4)] == [0, 3, 6, 9]
    assert harness.work_to([{"uplink_bytes": None}, {"uplink_bytes": None}], 1, "uplink_bytes") is None
    assert harness.work_to(records, 2, "local_steps") is None


def test_the_labels_are_the_algorithm_classes():
    """A table's method names are the classes' declared labels, a variant's qualifier beside them."""
    from dane.algorithm import known_algorithms
    from dane.paper_figs.blocks import method_label

    classes = known_algorithms()
    assert method_label("sdane") == classes["sdane"].label == "S-DANE"
    assert method_label("acc_sdane") == "Acc-S-DANE" and method_label("dane") == "DANE (safeguarded)"
    assert method_label("dane_mu0") == "DANE μ=0" and method_label("scaffold_k3") == "SCAFFOLD K=3"
    assert method_label("fedavg") == "FedAvg" and method_label("no_such_method") == "no_such_method"
    assert all(cls.label for name, cls in classes.items() if name != "split"), \
        [name for name, cls in classes.items() if not cls.label]


def test_the_tables_render_the_canned_json_with_local_passes():
    """The defaults and federated tables read the runner's JSON; a record without ``local_passes`` shows —, and each
    federated table names the fewest rounds, uplink bits and local passes to its last target."""
    from dane.paper_figs import defaults_table, federated_table

    text = defaults_table.render(canned("defaults")["defaults"])
    assert "| median local passes to target |" in text and "| GD | 1/1 | 0 |" in text
    section = canned("federated")["federated"]
    text = federated_table.render(section)
    assert "| local passes to 1e-08 |" in text
    for s in section["clients"]:
        assert text.count("To 1e-08 at defaults: fewest rounds: ") == len(section["clients"])
    row = section["rows"]["s=8/sdane"]
    hit = dict(row["default"]["targets"]["1e-08"], local_passes=120)
    line = federated_table.fewest([{**row, "default": {**row["default"], "targets": {"1e-08": hit}}}], "1e-08")
    assert line == (f"To 1e-08 at defaults: fewest rounds: S-DANE ({hit['rounds']}); fewest uplink bits: S-DANE "
                    f"({8 * hit['uplink_bytes']}); fewest local passes: S-DANE (120).")


# ---------------------------------------------------------------- convex_newton_family, cuda, local_solve_cost
# The cost-to-target extraction, the two goals and the rcv1-like generator of scripts/bench_convex.py on tiny inputs;
# its --quick run (tests/data/bench/convex.json, made with an --out that held other_bench and a --data-dir without
# MNIST) against its own run directories (convex_runs/: each run's rounds.jsonl, cut to the keys read here); the
# CUDA section's ratios from hand-made runs and its skip without a GPU (cuda.json, an --out that held
# strong_scaling); the local solve's Cholesky skip and its --quick run (local_solve.json, an --out that held
# other_bench).
import math  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from scripts import bench_convex as convex  # noqa: E402
from scripts import bench_cuda as cuda  # noqa: E402
from scripts import bench_local_solve as local_solve  # noqa: E402

SECTIONS.update({
    "convex_newton_family": ("convex", {"started_at", "machine", "load_avg_before", "quick", "target", "simulator",
                                        "cost_model", "counts", "algorithms", "problems", "full_run", "load_avg_after",
                                        "wall_s"}, lambda section: None),
    "cuda": ("cuda", {"started_at", "machine", "load_before", "rounds", "overrides", "skipped", "convex", "finished_at",
                      "load_after", "torch", "load_avg_after", "wall_s"}, lambda section: None),
})


def records(subopts, f_star=2.0):
    """Hand-made rounds: round k has 3k allreduces, 100k bytes and 0.5k simulated seconds."""
    return [{"round": k, "comm_rounds": 3 * k, "bytes_sent": 100 * k, "time_s": 0.5 * k, "objective": f_star + s,
             "suboptimality": s} for k, s in enumerate(subopts)]


def test_to_target_is_the_first_record_at_the_relative_target():
    f_star = -4.0  # relative to |O*|: the target is 4e-8 here
    subopts = [1.0, 1e-3, 5e-8, 4e-8, 1e-9, 1e-12]
    row = convex.to_target(records(subopts, f_star), f_star)
    first = next(k for k, s in enumerate(subopts) if s / abs(f_star) <= 1e-8)
    assert first == 3  # 4e-8 / 4 = 1e-8 exactly counts
    assert row["reached"] and row["rounds"] == first
    assert (row["comm_rounds"], row["bytes"], row["time_s"]) == (3 * first, 100 * first, 0.5 * first)
    assert row["best_rel_suboptimality"] == pytest.approx(1e-12 / 4)
    assert row["at_end"] == {"round": 5, "comm_rounds": 15, "bytes_sent": 500, "time_s": 2.5}


def test_to_target_not_reached_gives_nulls_and_the_best():
    row = convex.to_target(records([1.0, 1e-4, 3e-6, 2e-6, 5e-6]), 2.0)
    assert not row["reached"]
    assert row["rounds"] is row["comm_rounds"] is row["bytes"] is row["time_s"] is None
    assert row["best_rel_suboptimality"] == pytest.approx(1e-6)
    assert row["final_rel_suboptimality"] == pytest.approx(2.5e-6)
    assert row["at_end"]["round"] == 4


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
    goal = convex.goal_allreduces(rows)
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
    assert convex.goal_time({"dane": dane_row, "admm": admm_row})["status"].startswith(status)


def test_rcv1_like_rows_vocabulary_and_labels():
    from dane.synthetic.sparse_data import rcv1_like

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
    from dane.data.files import LibSVMSource
    from dane.synthetic.sparse_data import rcv1_like, write_sparse_libsvm

    path = write_sparse_libsvm(tmp_path / "r.svm", 120, 20000, seed=1)
    X, y = rcv1_like(120, 20000, seed=1)
    table = LibSVMSource(str(path)).load()   # d inferred from the file: the last column is always used
    assert table.X.shape == (120, 20000)
    assert np.array_equal(table.X.indptr, X.indptr) and np.array_equal(table.X.indices, X.indices)
    assert np.array_equal(table.X.data, X.data) and np.array_equal(table.y, y)


def convex_rounds(run_dir: str) -> list[dict]:
    """A canned run's records: its run directory's last three parts (problem, m<workers>, algorithm) in convex_runs/."""
    folder = DATA / "convex_runs" / Path(run_dir).relative_to(Path(run_dir).parents[2])
    return [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()]


def test_quick_convex_writes_its_key_and_keeps_others():
    report = canned("convex")
    assert report["other_bench"] == {"kept": True}
    assert "local_solve_cost" not in report  # scripts/bench_local_solve.py's
    family = report[convex.KEY]
    assert family["quick"] and family["cost_model"]["source"].startswith("package default")
    assert "mnist" in family["problems"]["mnist_softmax"]["skipped"].lower()
    assert len(family["load_avg_before"]) == len(family["load_avg_after"]) == 3
    for name in ("breast_cancer_logreg", "diabetes_ridge", "rcv1_like_logreg"):
        problem = family["problems"][name]
        assert problem["lam"] > 0 and problem["lam_why"] and problem["dim"] >= 11
        for per_m in problem["workers"].values():
            assert set(per_m["algorithms"]) == set(convex.NEWTON + convex.BASELINES)
            assert set(per_m["goals"]) == {"a_allreduces", "b_time"}


def test_quick_convex_rows_agree_with_their_rounds_jsonl():
    family = canned("convex")[convex.KEY]
    seen_reached = 0
    for problem in family["problems"].values():
        for per_m in problem.get("workers", {}).values():
            for name, row in per_m["algorithms"].items():
                if "error" in row:
                    continue
                recs = convex_rounds(row["run_dir"])
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


def test_quick_convex_goals_follow_from_the_numbers():
    family = canned("convex")[convex.KEY]
    for problem in family["problems"].values():
        for per_m in problem.get("workers", {}).values():
            rows, goal = per_m["algorithms"], per_m["goals"]["a_allreduces"]
            newton = [r["comm_rounds"] for a, r in rows.items() if a in convex.NEWTON and r["reached"]]
            base = [r["comm_rounds"] if r["reached"] else r["at_end"]["comm_rounds"]
                    for a, r in rows.items() if a in convex.BASELINES and "error" not in r]
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


def test_cuda_ratios_are_cpu_over_cuda_medians_and_the_simulators_m1_over_the_launched_np1():
    launched = [{"device": "cuda", "np": 1, "round_s": t} for t in (0.5, 0.4, 0.6)]
    launched += [{"device": "cpu", "np": 1, "round_s": t} for t in (2.0, 3.0)]
    launched += [{"device": "cuda", "np": 2, "round_s": 0.25}, {"device": "cpu", "np": 2, "status": "launch_failed"}]
    simulated = [{"device": "cuda", "workers": 1, "wall_round_s": 0.6, "simulated_round_s": 0.55},
                 {"device": "cpu", "workers": 1, "wall_round_s": 3.0, "simulated_round_s": 2.75}]
    out = cuda.ratios({"launched": {"runs": launched}, "simulated": {"runs": simulated}})
    assert out["launched_np1_cpu_over_cuda"] == pytest.approx(2.5 / 0.5)  # medians: 2.5 over 0.5
    assert out["launched_np2_cpu_over_cuda"] is None  # the CPU launch failed: no ratio, not a made-up one
    assert out["simulated_m1_wall_cpu_over_cuda"] == pytest.approx(3.0 / 0.6)
    assert out["sim_vs_launched_np1_cuda"] == pytest.approx(0.55 / 0.5)
    assert out["sim_vs_launched_np1_cpu"] == pytest.approx(2.75 / 2.5)


def test_cuda_without_a_gpu_records_why_and_keeps_the_other_sections():
    written = canned("cuda")
    assert written["strong_scaling"] == {"ratio": 1.9}
    assert written["cuda"]["skipped"] == "torch sees no CUDA device"
    assert "launched" not in written["cuda"]
    assert written["cuda"]["convex"] == {"skipped": "torch sees no CUDA device"}


def test_cuda_convex_case_data_and_one_run_on_the_cpu():
    """The convex section's pieces on a tiny case: CSR rows at the asked density, 0/1 labels, and a run's record."""
    X, y = cuda.convex_data(200, 50, 0.1, logistic=True)
    assert X.format == "csr" and X.nnz == 1000 and set(y) == {0.0, 1.0}
    assert all(len(set(X.indices[a:b])) == 5 for a, b in zip(X.indptr, X.indptr[1:]))  # 5 distinct columns a row
    from dane.problems import LogReg

    run = cuda.convex_run(LogReg(X, y, lam=1e-2, local_solver="cg", device="cpu"), workers=2, rounds=3)
    assert run["clock"] == "thread_cpu_time" and run["simulated_round_s"] > 0 and run["w"].shape == (50,)


@pytest.mark.slow  # ~45 s on a loaded 2-core machine: four LeNet-5 rounds over the digits shard
def test_the_plain_loop_does_a_dane_rounds_work_and_reaches_its_iterate():
    """Item 5's baseline on the CPU, on digits (no MNIST needed; a round is 14 steps of batch 100): at m = 1,
    η = 1, μ = 0 DANE's correction term ∇O_i(w_t) − η g is zero, so its round is the plain loop's full gradient,
    evaluation and SGD pass on the same minibatches, and the final iterates are equal (bit for bit here: the same
    operations in the same order on one thread)."""
    out = cuda.baseline(1, ["cpu"], config=lambda device: cuda.baseline_config(device, "digits"), repeats=1)
    cpu = out["cpu"]
    assert cpu["iterate_rel_diff"] == 0.0
    assert cpu["dane_round_s"]["n"] == cpu["plain_loop_round_s"]["n"] == 1
    ratio = cpu["dane_round_s"]["median"] / cpu["plain_loop_round_s"]["median"]
    assert cpu["dane_round_over_plain_loop"] == pytest.approx(ratio) and cpu["goal_met"] is None  # a goal on CUDA only


def test_cholesky_is_skipped_only_where_it_cannot_fit():
    memory = 24 * 2**30
    big = {"d": 50000, "layout": "sparse", "n_rows": 100000, "solver": "cholesky"}
    assert "20 GB" in local_solve.skip_reason(big, memory) and "densifies X (40 GB)" in local_solve.skip_reason(big, memory)
    assert local_solve.skip_reason({**big, "solver": "cg"}, memory) is None
    assert local_solve.skip_reason({"d": 5000, "layout": "dense", "n_rows": 10000, "solver": "cholesky"}, memory) is None


def test_quick_local_solve_measures_each_case_and_keeps_other_keys():
    report = canned("local_solve")
    assert report["other_bench"] == {"kept": True}
    cost = report[local_solve.KEY]
    assert cost["quick"] and cost["machine"]["cpus"] >= 1
    assert len(cost["load_avg_before"]) == len(cost["load_avg_after"]) == 3
    cases = cost["cases"]
    assert {(c["d"], c["layout"], c["solver"]) for c in cases} == \
        {(c["d"], c["layout"], c["solver"]) for c in local_solve.cost_cases(quick=True)}
    for case in cases:
        assert "failed" not in case and "skipped" not in case
        assert 0 < case["round_s_min"] <= case["round_s"] <= case["round_s_max"]
        assert case["first_round_s_min"] <= case["first_round_s"] <= case["first_round_s_max"]
        assert case["repeats"] == 3 and case["peak_mb"] >= 0 and case["data_mb"] > 0
        assert case["relative_gradient_after"] < 1e-8 and math.isfinite(case["baseline_mb"])
