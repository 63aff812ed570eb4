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


# ------------------------------------------------------------------ the launch sections (wallclock, time_vs_workers)
# The wallclock rows read tests/data/bench/wallclock.json, a real `python -m scripts.bench wallclock --quick --out F
# --data-dir NOWHERE` whose F held {"other": {"kept": True}} before; the time_vs_workers rows read the tree of a real
# `python -m scripts.bench time_vs_workers --quick --problems mnist_lenet3 --real --out DIR` (tests/data/bench/
# time_vs_workers/: its calibration and the two simulated runs) or a hand-made tree whose answers are known.
import math  # noqa: E402

import yaml  # noqa: E402

from dane.paper_figs import time_vs_workers as fig  # noqa: E402
from scripts import bench_wallclock as wallclock  # noqa: E402
from scripts import time_vs_workers as tvw  # noqa: E402

# The parts telescope (each mark ends one part and starts the next), so they add up to the total
# exactly but for float64 addition on time.time() values near 1.8e9 s (one ulp: 2.4e-7 s, eight terms).
SUM_TOL = 1e-5
# A part may dip below zero by one kernel tick (10 ms): the process start is read in ticks, and a file's
# mtime comes from the kernel's coarse clock, which can lag time.time() by a tick.
TICK = 0.011


def test_repeats_take_turns_and_their_spreads_leave_out_what_is_missing():
    """`harness.interleave` runs repeat by repeat, the variants in turn (rotated one place a repeat where asked);
    `harness.spreads` takes each key's median, min, max and count over the runs that have it."""
    order = []
    runs = harness.interleave("abc", 3, lambda v, r: order.append(v + str(r)) or {"x": r, "y": None}, rotate=True)
    assert order == ["a0", "b0", "c0", "b1", "c1", "a1", "c2", "a2", "b2"]
    assert runs["b"] == [{"x": 0, "y": None}, {"x": 1, "y": None}, {"x": 2, "y": None}]
    order.clear()
    harness.interleave("ab", 2, lambda v, r: order.append(v + str(r)))
    assert order == ["a0", "b0", "a1", "b1"]
    assert harness.spreads([{"x": 3.0}, {"x": 1.0, "y": 2}, {"x": 2.0}], ("x", "y", "z")) == \
        {"x": {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}, "y": {"median": 2, "min": 2, "max": 2, "n": 1}, "z": None}


def test_wallclock_package_parts_add_up_to_the_answer_and_the_total():
    t_cmd = 1_800_000_000.0
    timeline = {"config": 4.0, "data": 6.5, "round0": 6.6, "end": 7.6, "clock_origin": t_cmd + 1.2,
                "process_start": -0.05}
    out = wallclock.package_parts(t_cmd, t_exit=t_cmd + 12.0, t_answer=t_cmd + 1.2 + 7.61, timeline=timeline)
    parts = out["parts"]
    assert parts["launcher"] == pytest.approx(1.15, abs=1e-6)   # the process started 0.05 s before psutil's origin
    assert parts["imports"] == pytest.approx(4.05, abs=1e-6)
    assert parts["reference"] == 0.0 and parts["setup"] == pytest.approx(0.1, abs=1e-6)
    assert parts["rounds"] == pytest.approx(1.0, abs=1e-6) and parts["write"] == pytest.approx(0.01, abs=1e-6)
    assert sum(parts.values()) == pytest.approx(out["total_s"], abs=SUM_TOL) and out["total_s"] == 12.0
    assert sum(v for k, v in parts.items() if k != "exit") == pytest.approx(out["answer_s"], abs=SUM_TOL)
    with_reference = wallclock.package_parts(t_cmd, t_cmd + 12.0, t_cmd + 8.81, {**timeline, "reference": 6.55})
    assert with_reference["parts"]["reference"] == pytest.approx(0.05, abs=1e-6)
    assert with_reference["parts"]["setup"] == pytest.approx(0.05, abs=1e-6)


def test_wallclock_first_stop_stops_the_sequence_where_it_is_good():
    # ratios fall, rise at index 2, fall again: a threshold must be below every earlier ratio
    ratios, good = [1.0, 0.1, 0.2, 0.01, 0.001], [False, False, False, True, True]
    t = wallclock.first_stop(ratios, good)
    assert 0.01 <= t < 0.1 and t == pytest.approx((0.01 * 0.1) ** 0.5)
    assert wallclock.first_stop([1.0, 0.5], [False, False]) is None
    assert wallclock.first_stop([0.3], [True]) == pytest.approx(0.303)


def test_wallclock_goals_are_differences_and_ratios_of_medians():
    variants = {"horovodrun_np2": {"answer_s": {"median": 9.0}, "parts": {"rounds": {"median": 0.6}}},
                "bare_horovodrun": {"total_s": {"median": 6.5}}, "scipy_lbfgsb": {"fit_s": {"median": 0.5}}}
    out = wallclock.goals(variants)
    assert out["launch_over_bare_horovodrun"]["over_s"] == pytest.approx(2.5)
    assert out["launch_over_bare_horovodrun"]["goal_met"] is False
    assert out["rounds_over_lbfgs_fit"]["ratio"] == pytest.approx(1.2) and not out["rounds_over_lbfgs_fit"]["goal_met"]
    assert wallclock.goals({})["rounds_over_lbfgs_fit"]["goal_met"] is None


def wallclock_keeps_its_key_and_others_and_skips_mnist_without_its_files(report: dict) -> None:
    assert report["other"] == {"kept": True}
    section = report[wallclock.KEY]
    assert section["quick"] and section["repeats"] == 1 and "load_avg" in section["machine"]
    assert set(section["how_measured"]) >= set(wallclock.PARTS)
    assert "not in" in section["problems"]["mnist_softmax"]["skipped"]  # the line the run printed, in its JSON


def wallclock_parts_add_up_and_every_run_reached_the_target(report: dict) -> None:
    problem = report[wallclock.KEY]["problems"]["tiny_dense_logreg"]
    assert problem["method"]["method"] in ("giant", "disco")
    check = problem["baselines"]["objective_check"]
    assert check["rel_difference"] < 1e-12  # the baselines' objective is the package's
    launched = [v for v in (*wallclock.PACKAGE, *wallclock.BASELINES) if v in problem["variants"]]
    assert set(wallclock.BASELINES) <= set(launched) and "simulator_m2" in launched
    for variant in launched:
        summary = problem["variants"][variant]
        assert summary["launches_failed"] == 0 and summary["all_reached_target"]
        for run in summary["runs"]:
            parts = run["parts"]
            assert sum(parts.values()) == pytest.approx(run["total_s"], abs=SUM_TOL)
            assert sum(v for k, v in parts.items() if k != "exit") == pytest.approx(run["answer_s"], abs=SUM_TOL)
            assert min(parts.values()) > -TICK, (variant, parts)
            assert run["rel_suboptimality"] <= wallclock.TARGET
        assert summary["answer_s"]["median"] == summary["runs"][0]["answer_s"]  # one repeat: the median is it


def wallclock_goals_follow_from_the_medians(report: dict) -> None:
    problem = report[wallclock.KEY]["problems"]["tiny_dense_logreg"]
    variants, goals = problem["variants"], problem["goals"]
    fit = variants["scipy_lbfgsb"]["fit_s"]["median"]
    assert goals["rounds_over_lbfgs_fit"]["lbfgs_fit_s"] == fit
    assert "horovodrun_np2" in variants  # the canned run had horovod
    rounds = variants["horovodrun_np2"]["parts"]["rounds"]["median"]
    assert goals["rounds_over_lbfgs_fit"]["ratio"] == pytest.approx(rounds / fit, rel=1e-12)
    over = variants["horovodrun_np2"]["answer_s"]["median"] - variants["bare_horovodrun"]["total_s"]["median"]
    assert goals["launch_over_bare_horovodrun"]["over_s"] == pytest.approx(over, rel=1e-12)
    assert goals["launch_over_bare_horovodrun"]["goal_met"] == (over <= wallclock.LAUNCH_GOAL_S)


@pytest.mark.parametrize("check", [wallclock_keeps_its_key_and_others_and_skips_mnist_without_its_files,
                                   wallclock_parts_add_up_and_every_run_reached_the_target,
                                   wallclock_goals_follow_from_the_medians], ids=lambda f: f.__name__)
def test_a_wallclock_quick_run(check):
    check(canned("wallclock"))


CALIBRATION = {"alpha": 5e-4, "beta": 1e9, "measured_at": "2026-01-02T03:04:05+0000",
               "machine": {"load_avg": [0.5, 0.4, 0.3]}, "source": "test"}
MNIST_SPLIT = {"name": "mnist", "train_size": 8000, "test_size": 2000,
               "split": "t10k split: 10000 t10k images split 8000/2000 (stratified, by the run's seed)"}


def write_run(root, name: str, *, backend: str, workers: int, seed: int, times, accuracies,
              target: float = 0.95, alpha: float | None = None, comm_rounds=None, problem: str = "mnist_lenet5"):
    run = root / problem / name
    run.mkdir(parents=True)
    comm_rounds = comm_rounds or [2 * t for t in range(len(times))]
    with open(run / "rounds.jsonl", "w") as f:
        for t, (time_s, acc, calls) in enumerate(zip(times, accuracies, comm_rounds)):
            f.write(json.dumps({"round": t, "time_s": time_s, "bytes_sent": 1000 * calls, "comm_rounds": calls,
                                "objective": 1.0 / (t + 1), "test_accuracy": acc}) + "\n")
    summary = {"algorithm": "dane", "problem": problem, "workers": workers, "backend": backend,
               "status": "target_reached" if max(accuracies) >= target else "max_rounds", "rounds": len(times) - 1,
               "data": MNIST_SPLIT, "provenance": {"git_commit": "abc123", "started_at": "2026-01-02T04:00:00+0000",
                                                   "load_avg": [1.0 + seed, 1.0, 1.0]}}
    if backend == "simulator":
        summary.update(alpha=CALIBRATION["alpha"] if alpha is None else alpha, beta=CALIBRATION["beta"])
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "config.yaml").write_text(yaml.safe_dump({"seed": seed, "rounds": 30, "early_stop": {"target": target}}))
    return run


@pytest.fixture
def tree(tmp_path):
    """results/time_vs_workers with known answers (target 0.95)."""
    root = tmp_path / "results" / "time_vs_workers"
    root.mkdir(parents=True)
    (root / "calibration.json").write_text(json.dumps(CALIBRATION))
    # m=1: to target 7 and 13 s (mean 10, spread 3); per epoch (3+3)/2=3 and (4+4)/2=4 (mean 3.5, spread 0.5)
    write_run(root, "simulator_m1_seed0", backend="simulator", workers=1, seed=0,
              times=[0, 4, 7, 10], accuracies=[0.1, 0.8, 0.96, 0.97])
    write_run(root, "simulator_m1_seed1", backend="simulator", workers=1, seed=1,
              times=[0, 5, 9, 13], accuracies=[0.1, 0.9, 0.94, 0.96])
    # m=2, seed 0: to target 3.5, per epoch 1.0
    write_run(root, "simulator_m2_seed0", backend="simulator", workers=2, seed=0,
              times=[0, 1.5, 2.5, 3.5], accuracies=[0.1, 0.5, 0.6, 0.96])
    # m=2, seed 1, simulated with α=0: re-timed to α=0.5 ms, each allreduce costs 2(m-1)α = 1 ms more
    write_run(root, "simulator_m2_seed1", backend="simulator", workers=2, seed=1, alpha=0.0,
              times=[0, 1, 2, 3], accuracies=[0.1, 0.5, 0.96, 0.97])
    # horovodrun (wall clock, never re-timed): np=1 reaches at round 1 (seed 1 stops there: no per-epoch point)
    write_run(root, "horovod_m1_seed0", backend="horovod", workers=1, seed=0, times=[0, 6, 11],
              accuracies=[0.1, 0.96, 0.97])
    write_run(root, "horovod_m1_seed1", backend="horovod", workers=1, seed=1, times=[0, 6], accuracies=[0.1, 0.96])
    write_run(root, "horovod_m2_seed0", backend="horovod", workers=2, seed=0, times=[0, 4, 7],
              accuracies=[0.1, 0.5, 0.6])
    return tmp_path / "results"


def test_time_vs_workers_points_and_statistics_on_known_numbers(tree):
    root = tree / "time_vs_workers"
    cost, calibration = fig.load_cost(root)
    assert (cost.alpha, cost.beta) == (5e-4, 1e9) and calibration["measured_at"] == CALIBRATION["measured_at"]
    table = fig.collect(root, cost)
    assert list(table) == ["mnist_lenet5"]
    points = {(p.backend, p.workers, p.seed): p for p in table["mnist_lenet5"]}
    assert points[("simulator", 1, 0)].time_to_target == 7 and points[("simulator", 1, 0)].rounds_to_target == 2
    assert points[("simulator", 1, 1)].time_to_target == 13 and points[("simulator", 1, 1)].per_epoch == 4
    retimed = points[("simulator", 2, 1)]  # comm_rounds 0, 2, 4, 6: +0, +2, +4, +6 ms
    assert retimed.time_to_target == pytest.approx(2.004)
    assert retimed.per_epoch == pytest.approx(1.002)
    assert points[("horovod", 1, 0)].time_to_target == 6 and points[("horovod", 1, 0)].per_epoch == 5
    assert math.isnan(points[("horovod", 1, 1)].per_epoch)  # stopped at round 1: nothing after round 0
    assert math.isnan(points[("horovod", 2, 0)].time_to_target) and points[("horovod", 2, 0)].rounds_to_target is None

    to_target = fig.aggregate(table["mnist_lenet5"], "time_to_target")
    per_epoch = fig.aggregate(table["mnist_lenet5"], "per_epoch")
    assert (to_target[("simulator", 1)].mean, to_target[("simulator", 1)].spread) == (10, 3)
    assert to_target[("simulator", 2)].mean == pytest.approx((3.5 + 2.004) / 2)
    assert to_target[("simulator", 2)].spread == pytest.approx((3.5 - 2.004) / 2)
    assert (per_epoch[("simulator", 1)].mean, per_epoch[("simulator", 1)].spread) == (3.5, 0.5)
    assert per_epoch[("simulator", 2)].mean == pytest.approx(1.001)
    assert to_target[("horovod", 1)] == fig.Stat(6, 0, 2, (6, 6))
    assert per_epoch[("horovod", 1)].n == 1 and per_epoch[("horovod", 1)].mean == 5
    assert to_target[("horovod", 2)].n == 0 and per_epoch[("horovod", 2)].mean == 3
    assert fig.ideal(to_target, [1, 2, 4, 8]) == [10, 5, 2.5, 1.25]
    assert fig.ideal(per_epoch, [1, 2]) == [3.5, 1.75]


def test_time_vs_workers_figure_files_caption_and_sidecar(tree, tmp_path):
    out = tmp_path / "figures"
    paths = fig.main(tree, out)
    assert sorted(p.name for p in paths) == [f"time_vs_workers.{e}" for e in ("json", "md", "pdf", "png")]
    md = (out / "time_vs_workers.md").read_text()
    assert "| simulator | 1 | 10 ± 3 | 10 | 2.5 ± 0.5 | 3.5 ± 0.5 |" in md
    assert "| horovod | 2 | — |  | — | 3 ± 0 (n=1 of 1) |" not in md  # one run of one: no "n of" note
    assert "| horovod | 2 | — |  | — | 3 ± 0 |" in md
    sidecar = json.loads((out / "time_vs_workers.json").read_text())
    caption = sidecar["caption"]
    assert "8,000 train / 2,000 test" in caption and "60,000 train / 10,000 test" in caption
    assert "α=500 µs" in caption and "2026-01-02T03:04:05+0000" in caption and "load avg 0.50" in caption
    assert sidecar["calibration"]["alpha"] == 5e-4 and sidecar["targets"] == {"mnist_lenet5": 0.95}
    assert sidecar["seeds"] == [0, 1] and len(sidecar["runs"]) == 7


def test_time_vs_workers_missing_runs_name_the_command(tmp_path):
    with pytest.raises(FileNotFoundError, match="scripts.bench time_vs_workers"):
        fig.main(tmp_path, tmp_path / "figures")


def test_time_vs_workers_mixed_targets_are_refused(tree):
    root = tree / "time_vs_workers"
    write_run(root, "simulator_m4_seed0", backend="simulator", workers=4, seed=0, times=[0, 1], accuracies=[0.1, 0.9],
              target=0.9)
    with pytest.raises(ValueError, match="mixes runs with targets"):
        fig.collect(root, fig.load_cost(root)[0])


def test_time_vs_workers_missing_mnist_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    """In-process (the runner's main): the data check refuses before anything is calibrated or run."""
    monkeypatch.setenv("DANE_DATA_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(SystemExit) as exit_:
        runner.main(["time_vs_workers", "--quick", "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "t10k-images-idx3-ubyte.gz" in errors[0] and "nowhere" in errors[0]
    assert not (tmp_path / "out").exists()


def test_a_time_vs_workers_quick_run_is_kept_and_drawn(tmp_path):
    """The canned --quick tree: the runs used the calibration, each is the job the script would run (so a second
    ``--keep-calibration`` run keeps them all and runs nothing), and the figure draws them."""
    import shutil

    out = tmp_path / "results" / "time_vs_workers"
    shutil.copytree(DATA / "time_vs_workers", out)
    calibration = json.loads((out / "calibration.json").read_text())
    assert calibration["alpha"] >= 0 and calibration["beta"] > 0 and calibration["measured_at"]
    for m in (1, 2):
        run = out / "mnist_lenet3" / f"simulator_m{m}_seed0"
        summary = json.loads((run / "summary.json").read_text())
        assert summary["backend"] == "simulator" and summary["workers"] == m
        assert (summary["alpha"], summary["beta"]) == (calibration["alpha"], calibration["beta"])
        assert 2 <= len((run / "rounds.jsonl").read_text().splitlines()) <= 3
    assert sorted(p.name for p in (out / "mnist_lenet3").iterdir()) == ["simulator_m1_seed0", "simulator_m2_seed0"]
    args = tvw.settle(argparse.Namespace(quick=True, seeds=list(tvw.SEEDS), rounds=tvw.ROUNDS, workers=list(tvw.WORKERS),
                                         real=[], calibration_reps=200, out=str(out)))
    todo = tvw.jobs(["mnist_lenet3"], args.seeds, args.workers, args.real, args.rounds, tvw.TARGET)
    assert [job.name for job in todo] == ["simulator_m1_seed0", "simulator_m2_seed0"]
    assert all(tvw.finished(job, out / job.problem / job.name) for job in todo)  # kept: nothing is run again
    paths = fig.main(tmp_path / "results", tmp_path / "figures")
    assert (tmp_path / "figures" / "time_vs_workers.png").stat().st_size > 10_000 and len(paths) == 4
