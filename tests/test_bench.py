"""The benchmark runner (scripts/harness.py) and its sections' JSON, table-driven over canned --quick outputs.

Each file of tests/data/bench/ is a real ``python -m scripts.bench SECTION --quick`` output (`make bench-smoke` runs
those commands; the defaults one cut to gd and dane).  Nothing here starts a process or runs a benchmark: the
tests check the keys a section keeps (docs/benchmarks.md names them), the arithmetic that holds between its numbers,
the runner's record and goals table, and the one command line.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import statistics
from pathlib import Path

import numpy as np
import pytest
import yaml

from dane.paper_figs import time_vs_workers as fig
from dane.synthetic.defaults_data import ill_conditioned, large_targets, rare_onehot
from scripts import bench as runner
from scripts import bench_convex as convex
from scripts import bench_cuda as cuda
from scripts import bench_local_solve as local_solve
from scripts import bench_wallclock as wallclock
from scripts import harness
from scripts import time_vs_workers as tvw
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
    from dane.compress import make
    from scripts.bench_compress import SPECS

    times = {name: row for name, row in section["rows"].items() if name.startswith("time ")}
    assert {row["spec"] for row in times.values()} == set(SPECS)
    for name, row in times.items():
        assert name == f"time n={row['n']} {row['spec']}" and row["bits"] == make(row["spec"]).bits(row["n"])
        assert row["bits_over_dense"] == pytest.approx(row["bits"] / (64 * row["n"]))
        spread_holds(row["seconds"])
    dense, top = section["rows"]["gd none"], section["rows"]["gd topk:10"]  # top-10 of d = 100: fewer bits a round
    assert dense["status"] == "converged" and top["uplink_bits"] / top["rounds"] < dense["uplink_bits"] / dense["rounds"]


def spread_holds(spread: dict) -> None:
    """`harness.spread`'s one format: the median between the least and the most of its n values."""
    assert set(spread) == {"median", "min", "max", "n"} and spread["n"] >= 1
    assert spread["min"] <= spread["median"] <= spread["max"]


def local_solve_arithmetic(section: dict) -> None:
    for name, case in section["rows"].items():
        assert name == f"d={case['d']} {case['layout']} {case['solver']}"
        if "skipped" not in case:
            spread_holds(case["round_s"])
            spread_holds(case["first_round_s"])
    assert {c["solver"] for c in section["rows"].values()} == {"cholesky", "cg"}


def similarity_arithmetic(section: dict) -> None:
    """Every sharding deals the same rows, δ is the largest worker's; on the synthetic set (--quick: 800 rows, 4
    workers) label skew raises δ and DANE's allreduces."""
    from dane.paper_figs.similarity import datasets

    skewed, iid = section["rows"]["synthetic_logistic dirichlet 0.1"], section["rows"]["synthetic_logistic iid"]
    assert sum(skewed["rows"]) == sum(iid["rows"]) == 800 and len(set(iid["rows"])) == 1
    assert skewed["delta_start"] > 5 * iid["delta_start"] and skewed["comm_rounds"] > iid["comm_rounds"]
    for cells in datasets(section).values():
        assert len({sum(cell["rows"]) for cell in cells}) == 1  # every sharding deals the same rows
        for cell in cells:
            assert cell["delta_start"] == max(cell["per_worker_start"])
            assert cell["delta_mean_square_start"] <= cell["delta_start"]
            assert not cell["reached"] or cell["final_relative_suboptimality"] <= 1e-8


def svrg_arithmetic(section: dict) -> None:
    from scripts.bench_svrg import REFERENCE_ROUND_S

    rows = section["rows"]
    for name, row in rows.items():
        if name.startswith("pass "):
            for key in ("full_gradient", "svrg_pass", "reference_pass"):
                spread_holds(row[key])
            assert row["pass_over_gradient"] == row["svrg_pass"]["median"] / row["full_gradient"]["median"]
            assert row["goal_met"] == (row["pass_over_gradient"] <= 3)
    assert {"import_s", "first_solve_s", "second_solve_s"} <= set(rows["compile"]["cold"]) == set(rows["compile"]["warm"])
    cold = rows["compile"]["cold"]
    assert cold["first_solves_total_s"] == pytest.approx(sum(cold["first_solve_s"].values()))
    spread_holds(rows["round"]["compiled"])
    assert rows["round"]["ratio_to_public_reference"] == rows["round"]["compiled"]["median"] / REFERENCE_ROUND_S
    assert rows["launch"]["exit_status"] == 0 and rows["launch"]["round_time"]["n"] == rows["launch"]["rounds"]
    first = rows["first_round"]  # per repeat: InexactDANE cold, then warm, then GIANT; the median repeat's ratio
    for cache in ("cold", "warm"):
        spread_holds(first[f"{cache}_first_round_s"])
        assert first[f"first_over_giant_{cache}"] == statistics.median(
            r[cache]["first_round_s"] / r["giant"]["first_round_s"] for r in first["runs"])
    assert first["first_over_giant"] == first["first_over_giant_warm"]
    assert first["goal_met"] == (first["first_over_giant"] <= 2)
    assert [r["giant"]["start_up_left_out_s"] for r in first["runs"]] == [0.0] * len(first["runs"])  # no kernel


def paired_holds(row: dict) -> None:
    """`harness.paired`: the ratios are per-worker over batched, pair by pair, their median the headline; the two
    paths' objectives agree to round-off."""
    for pair in row["pairs"]:
        assert pair["ratio"] == pair["threads_rounds_s"] / pair["batched_rounds_s"]
        assert pair["cpu_ratio"] == pair["threads_cpu_s"] / pair["batched_cpu_s"]
    assert row["ratio_median"] == statistics.median(p["ratio"] for p in row["pairs"])
    assert row["ratio_min"] <= row["ratio_median"] <= row["ratio_max"] and row["objective_rel_diff_max"] < 1e-12


def batched_arithmetic(section: dict) -> None:
    speedup, large = section["rows"]["speedup"], section["rows"]["m10000"]
    paired_holds(speedup)
    paired_holds(section["rows"]["federated"])
    assert speedup["steady_ratio_median"] == statistics.median(s["ratio"] for s in speedup["steady"])
    assert all(s["ratio"] == s["threads_round_s"] / s["batched_round_s"] for s in speedup["steady"])
    assert large["workers"] == 10 * speedup["workers"] and 0 < large["rounds_s"] < large["total_s"]


#: section -> (its canned file, the keys its JSON keeps, the arithmetic between its numbers)
SECTIONS = {
    "defaults": ("defaults", {"started_at", "machine", "quick", "code", "target", "goals", "methods", "cells", "misses",
                              "load_avg_after", "wall_s"}, defaults_arithmetic),
    "federated": ("federated", {"started_at", "machine", "quick", "setting", "code", "dataset", "workers", "clients",
                                "sharding", "lam", "seed", "targets", "target", "round_caps", "grids", "methods", "rows",
                                "similarity", "load_avg_now", "load_avg_after", "wall_s"}, federated_arithmetic),
    "compress": ("compress", {"started_at", "machine", "quick", "target", "rows", "load_avg_after", "wall_s"},
                 compress_arithmetic),
    "local_solve_cost": ("local_solve", {"started_at", "machine", "quick", "rows", "load_avg_after", "wall_s"},
                         local_solve_arithmetic),
    "similarity": ("similarity", {"started_at", "machine", "quick", "target", "workers", "lam", "rounds_cap", "seed",
                                  "rows", "load_avg_after", "wall_s"}, similarity_arithmetic),
    "batched_workers": ("batched", {"started_at", "machine", "quick", "rows", "load_avg_after", "wall_s"},
                        batched_arithmetic),
    "svrg_local_solver": ("svrg", {"started_at", "machine", "quick", "rows", "load_avg_after", "wall_s"},
                          svrg_arithmetic),
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


@pytest.mark.parametrize("value, expected", [(None, "../shared/data"), ("", "../shared/data"), ("/data/x", "/data/x"),
                                             ("rel/data", "rel/data")])
def test_the_sections_data_folder_is_dane_data_dir_from_the_repository_root(value, expected, monkeypatch):
    """Unset or empty: ../shared/data; a relative folder from the repository root (as a run's data_dir)."""
    if value is None:
        monkeypatch.delenv("DANE_DATA_DIR", raising=False)
    else:
        monkeypatch.setenv("DANE_DATA_DIR", value)
    assert harness.data_dir() == (REPO / expected).resolve() and harness.mnist_dir() == harness.data_dir() / "mnist"


@pytest.mark.parametrize("section", ["convex", "fednl", "wallclock"])
def test_a_data_folder_that_is_not_there_is_one_usage_line(section, tmp_path, capsys):
    """``--data-dir`` names a folder that exists (relative: from the repository root): a missing one is argparse's
    exit 2 naming it, before any work (it skipped every table and exited 0); the default is not checked."""
    benches = {section: runner.importlib.import_module(runner.MODULES[section]).BENCH}
    with pytest.raises(SystemExit) as stop:
        harness.parser(benches).parse_args([section, "--data-dir", str(tmp_path / "nowhere")])
    assert stop.value.code == 2 and "argument --data-dir: no folder" in capsys.readouterr().err
    args = harness.parser(benches).parse_args([section, "--data-dir", "tests"])
    assert args.data_dir == REPO / "tests"


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
        harness.parser(benches).parse_args(["local_solve", "--only", "gd"])  # local_solve has no --only


def test_the_public_programs_numbers_are_read_from_their_evidence_file(tmp_path, monkeypatch):
    """The svrg and fednl goals are the public programs' numbers in paper_figs/evidence/external_references.json
    (each with its program, workload, machine, date and source): a file holding others gives the sections those
    (they were constants typed into the scripts, 0.017 s and eight u-FedNL figures, with no record of their runs)."""
    import importlib

    from dane.synthetic import bench_file
    from scripts import bench_fednl, bench_svrg

    tracked = json.loads((REPO / "paper_figs" / "evidence" / "external_references.json").read_text())
    assert bench_file.EXTERNAL_REFERENCES == REPO / "paper_figs" / "evidence" / "external_references.json"
    for entry in (tracked["inexact_dane_octave"], tracked["ufednl"]):
        assert {"program", "repository", "commit", "command", "workload", "machine", "date", "source"} <= set(entry)
    assert bench_svrg.REFERENCE_ROUND_S == tracked["inexact_dane_octave"]["round_s"]
    assert bench_fednl.UFEDNL_S_PER_ROUND == {(r["table"], r["compressor"]): r["s"]
                                              for r in tracked["ufednl"]["s_per_round"]}
    other = {"inexact_dane_octave": {"round_s": 2.5},
             "ufednl": {"s_per_round": [{"table": "a9a", "compressor": "topk", "s": 3.5}]}}
    (tmp_path / "refs.json").write_text(json.dumps(other))
    monkeypatch.setattr(bench_file, "EXTERNAL_REFERENCES", tmp_path / "refs.json")
    try:
        assert importlib.reload(bench_svrg).REFERENCE_ROUND_S == 2.5
        assert importlib.reload(bench_fednl).UFEDNL_S_PER_ROUND == {("a9a", "topk"): 3.5}
    finally:
        monkeypatch.undo()
        importlib.reload(bench_svrg), importlib.reload(bench_fednl)


def test_the_runner_merges_and_writes_the_goals_table(tmp_path):
    """`harness.Run.finish` merges the section beside the others, adds the load after, the wall seconds and the
    code, and writes the goals table of the whole file: a headline against its goal, a section's misses.  A section
    that builds its own record, without `harness.Run.header` (fednl, horovod, wallclock), names its code too: the
    horovod, fednl, svrg and wallclock evidence named none."""
    from dane.records.provenance import code_version

    out = tmp_path / "bench.json"
    out.write_text(json.dumps({"other": {"ratio": 1.3, "goal": 1.25}, "defaults": canned("defaults")["defaults"],
                               "named": {"error": 0.4, "error_with_tail": 0.1, "goal": 0.25,
                                         "headline": "error_with_tail"}}))
    bench = harness.Bench("mine", lambda run: {}, "a test")
    run = harness.Run(bench, argparse.Namespace(out=str(out)))
    run.finish({**run.header(), "error": 0.1, "goal": 0.25})
    whole = json.loads(out.read_text())
    assert set(whole["mine"]) == {"started_at", "machine", "code", "error", "goal", "load_avg_after", "wall_s"}
    assert whole["mine"]["code"] == run.header()["code"] == code_version()
    table = whole["goals_table"]
    assert table["mine"] == {"headline": "error", "value": 0.1, "goal": 0.25, "met": True}
    assert table["other"] == {"headline": "ratio", "value": 1.3, "goal": 1.25, "met": False}
    assert table["named"] == {"headline": "error_with_tail", "value": 0.1, "goal": 0.25, "met": True}  # its own
    misses = whole["defaults"]["misses"]
    assert table["defaults"] == {"misses": len(misses), "met": not misses, "lines": misses}
    run.finish({"error": 0.1}, "own")
    assert json.loads(out.read_text())["own"]["code"] == code_version()


def test_the_cell_loop_runs_only_resume_optional_skip_and_after(tmp_path):
    """`harness.grid`: every cell but the optional ones; ``--only`` by name or first word, the other rows kept;
    ``--resume`` measures none it holds; a skip is recorded, exit 2 without ``--skip-without-data``."""
    calls = []

    def cells(run):
        return {name: name for name in ("a x", "a y", "b", "gpu")}

    def measure(run, cell):
        calls.append(cell)
        return {"value": len(calls)}

    def bench(skip=None):
        return {"toy": harness.Bench("toy", harness.grid(cells, measure, head=lambda args: {"unit": "s"}, skip=skip,
                                                         after=lambda rows: {"cells": len(rows)}, optional=("gpu",)),
                                     "a toy", only=("a", "b", "gpu"), resumable=True, threads=None,
                                     options=(harness.option("--skip-without-data", action="store_true"),))}

    out = ["--out", str(tmp_path / "b.json")]
    harness.main(["toy", *out], bench())
    assert calls == ["a x", "a y", "b"]
    harness.main(["toy", "--only", "a", "gpu", *out], bench())
    harness.main(["toy", "--resume", *out], bench())
    section = json.loads((tmp_path / "b.json").read_text())["toy"]
    assert calls == ["a x", "a y", "b", "a x", "a y", "gpu"] and section["cells"] == 4 and section["unit"] == "s"
    assert {name: row["value"] for name, row in section["rows"].items()} == {"a x": 4, "a y": 5, "b": 3, "gpu": 6}
    assert all(len(row["load_avg_before"]) == 3 for row in section["rows"].values())
    with pytest.raises(SystemExit) as skipped:
        harness.main(["toy", *out], bench(skip=lambda args: "no data"))
    assert skipped.value.code == 2 and len(calls) == 6  # a failure, nothing measured, and the skip saved first
    assert json.loads((tmp_path / "b.json").read_text())["toy"]["skipped"] == "no data"
    (tmp_path / "b.json").unlink()
    harness.main(["toy", "--skip-without-data", *out], bench(skip=lambda args: "no data"))
    assert json.loads((tmp_path / "b.json").read_text())["toy"]["skipped"] == "no data" and len(calls) == 6


def test_every_local_work_count_is_kept_at_the_target_and_an_uncounted_one_stays_absent():
    """`harness.local_work_to`: passes, HVPs, Hessians formed and factorizations at record ``hit``; a key the records
    lack (a run from before the count) or hold as None is left out, never made 0."""
    records = [{"local_passes": 2.0 * k, "local_hvps": 5 * k, "local_hessians": k, "local_factorizations": k,
                "local_flops": 99} for k in range(3)]
    assert harness.local_work_to(records, 2) == {"local_passes": 4.0, "local_hvps": 10, "local_hessians": 2,
                                                 "local_factorizations": 2}
    old = [{"local_passes": 7.0, "local_hessians": None}]
    assert harness.local_work_to(old, 0) == {"local_passes": 7.0} and harness.local_work_to([{}], 0) == {}


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


def test_fedavg_is_named_fedavg_where_a_run_records_its_label():
    """conf/algorithm/fedavg.yaml runs FedProx's class at mu = 0: a run of it recorded the label "FedProx", so
    `dane figures local_work` named a FedAvg run FedProx; the package's config records its own name, a config class
    of one's own named fedavg keeps its class's label."""
    import dataclasses

    from dane.algorithm import label_of, label_of_run, recorded_label
    from dane.api import algorithm_config
    from dane.baselines.fedprox import FedProx, FedProxConfig

    assert recorded_label(algorithm_config("fedavg"), None) == label_of("fedavg") == "FedAvg"
    assert recorded_label(algorithm_config("fedprox"), None) == label_of("fedprox") == "FedProx"
    own = dataclasses.make_dataclass("MyConfig", [], bases=(FedProxConfig,), frozen=True,
                                     namespace={"__module__": "my_methods"})
    assert recorded_label(own(name="fedavg"), None) == FedProx.label == "FedProx"
    assert label_of_run({"label": "FedAvg"}, "fedavg") == "FedAvg"


def test_the_tables_render_the_canned_json_with_local_passes():
    """The defaults and federated tables read the runner's JSON; a record without ``local_passes`` shows —, and each
    federated table names the fewest rounds, clients' uplink bits and local passes to its last target."""
    from dane.paper_figs import defaults_table, federated_table

    text = defaults_table.render(canned("defaults")["defaults"])
    assert "| median local passes to target |" in text and "| GD | 1/1 | 0 |" in text
    section = canned("federated")["federated"]
    text = federated_table.render(section)
    assert "| local passes to 1e-08 |" in text
    for s in section["clients"]:
        assert text.count("To 1e-08 at defaults, each axis's leader: fewest rounds: ") == len(section["clients"])
    row = section["rows"]["s=8/sdane"]
    hit = dict(row["default"]["targets"]["1e-08"], local_passes=120)
    # DANE has no server: its communicator's bytes (one worker's share of a ring) are not ranked with clients' uplink
    ring = {"rounds": hit["rounds"] + 1, "bytes_sent": 8, "uplink_bytes": None}
    line = federated_table.fewest([{**row, "default": {**row["default"], "targets": {"1e-08": hit}}},
                                   {"method": "dane", "default": {"targets": {"1e-08": ring}}}], "1e-08")
    # the canned run predates the second-order counts: its passes are named, not ranked
    assert line == (f"To 1e-08 at defaults, each axis's leader: fewest rounds: S-DANE ({hit['rounds']}); fewest "
                    f"clients' uplink bits: S-DANE ({8 * hit['uplink_bytes']}); fewest downlink bits: S-DANE "
                    f"({8 * hit['downlink_bytes']}); local passes not ranked (HVPs, Hessians, factorizations not "
                    f"recorded): S-DANE (120).")


def test_local_passes_rank_only_among_rows_of_one_kind():
    """DANE's few passes come with a Hessian and a factorization per client and round: the sentence ranks passes
    among the first-order rows and, apart, among the rows with second-order work, naming the winner's counts; a row of
    old (no second-order counts) is named with its passes, not ranked."""
    from dane.paper_figs.federated_table import fewest

    def row(method, passes, **counts):
        return {"method": method, "default": {"targets": {"1e-08": {"rounds": 10, "uplink_bytes": None,
                                                                    "bytes_sent": 8, "local_passes": passes, **counts}}}}

    second = {"local_hvps": 0, "local_hessians": 3000, "local_factorizations": 3000}
    first = {"local_hvps": 0, "local_hessians": 0, "local_factorizations": 0}
    rows = [row("dane", 22801, **second), row("scaffnew", 989900, **first), row("scaffold", 34800, **first),
            row("sdane", 4765, local_hvps=1200, local_hessians=0, local_factorizations=0), row("fedavg", 500)]
    assert fewest(rows, "1e-08").split("; ", 3)[3] == (
        "fewest local passes among first-order rows: SCAFFOLD (34800); fewest local passes among rows with "
        "second-order work: S-DANE (4765 passes; 1200 HVPs); local passes not ranked (HVPs, Hessians, factorizations "
        "not recorded): FedAvg (500).")
    rows[3] = row("sdane", 22801, local_hvps=0, local_hessians=100, local_factorizations=0)  # a tie: each one's work
    assert "second-order work: DANE (safeguarded) (22801 passes; 3000 Hessians, 3000 factorizations) and S-DANE " \
           "(22801 passes; 100 Hessians)" in fewest(rows, "1e-08")
    assert fewest([row("gd", None)], "1e-08").endswith("; fewest local passes: —.")


# ---------------------------------------------------------------- convex_newton_family, cuda, local_solve_cost
# The cost-to-target extraction, the two goals and the rcv1-like generator of scripts/bench_convex.py on tiny inputs;
# its --quick run (tests/data/bench/convex.json, made with an --out that held other_bench and a --data-dir without
# MNIST, a folder without mnist/) against its own run directories (convex_runs/: each run's rounds.jsonl, cut to the keys read here); the
# CUDA section's ratios from hand-made runs and its skip without a GPU (cuda.json, an --out that held
# strong_scaling); the local solve's Cholesky skip and its --quick run (local_solve.json, an --out that held
# other_bench).

SECTIONS.update({
    "convex_newton_family": ("convex", {"started_at", "machine", "quick", "target", "simulator", "cost_model",
                                        "counts", "algorithms", "problems", "load_avg_after", "wall_s"},
                             lambda section: None),
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
            "at_end": {"round": comm, "comm_rounds": comm, "time_s": time_s}}


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


CAPPED_ADMM = " (ADMM stopped by its cap at round 90, relative suboptimality 1.0e-03)"


@pytest.mark.parametrize("dane_row, admm_row, status, ratio, detail", [
    (reached(10, 2.0), reached(90, 3.0), "met", 2 / 3, "DANE 2 s vs ADMM 3 s"),
    (reached(10, 3.0), reached(90, 3.0), "met", 1.0, "DANE 3 s vs ADMM 3 s"),   # a tie meets "at most"
    (reached(10, 4.0), reached(90, 3.0), "not met", 4 / 3, "DANE 4 s vs ADMM 3 s"),
    (reached(10, 2.0), capped(90, 2.5), "met", 0.8, "DANE 2 s vs ADMM > 2.5 s" + CAPPED_ADMM),  # ADMM needs > 2.5 s
    (reached(10, 4.0), capped(90, 2.5), "undetermined (ADMM's cap ends before DANE's time)", 1.6,
     "DANE 4 s vs ADMM > 2.5 s" + CAPPED_ADMM),
    (capped(100, 9.0), reached(90, 3.0), "not met", None, "DANE did not reach 1e-08 (best 1.00e-03); ADMM 3 s"),
])
def test_goal_time(dane_row, admm_row, status, ratio, detail):
    """The status, DANE's time over ADMM's (its time at the cap where it was capped) and the line that shows both."""
    goal = convex.goal_time({"dane": dane_row, "admm": admm_row})
    assert (goal["status"], goal.get("ratio"), goal["detail"]) == (status, ratio, detail)


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
    assert len(family["machine"]["load_avg"]) == len(family["load_avg_after"]) == 3
    assert all(len(problem["load_avg_before"]) == 3 for problem in family["problems"].values())
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
    assert len(cost["machine"]["load_avg"]) == len(cost["load_avg_after"]) == 3
    cases = cost["rows"]
    assert {name: {k: c[k] for k in ("d", "layout", "n_rows", "solver")} for name, c in cases.items()} == \
        local_solve.cost_cases(argparse.Namespace(quick=True))
    for case in cases.values():
        assert "failed" not in case and "skipped" not in case
        assert 0 < case["round_s"]["min"] and case["round_s"]["n"] == case["first_round_s"]["n"] == 3
        assert case["peak_mb"] >= 0 and case["data_mb"] > 0 and len(case["load_avg_before"]) == 3
        assert case["relative_gradient_after"] < 1e-8 and math.isfinite(case["baseline_mb"])


def test_the_similarity_figure_and_table_come_from_the_canned_json(tmp_path):
    from dane.paper_figs import similarity as figure

    (tmp_path / "bench.json").write_text((DATA / "similarity.json").read_text())
    paths = figure.main(tmp_path, tmp_path / "figures")
    assert {p.suffix for p in paths} == {".png", ".pdf", ".md"}
    assert "| synthetic_logistic | α=0.1 | " in (tmp_path / "figures" / "similarity.md").read_text()


def test_the_local_solve_figure_and_table_come_from_the_canned_json(tmp_path):
    from dane.paper_figs import local_solve_cost as figure

    (tmp_path / "bench.json").write_text((DATA / "local_solve.json").read_text())
    paths = figure.main(tmp_path, tmp_path / "figures")
    assert {p.suffix for p in paths} >= {".png", ".md"}
    table = (tmp_path / "figures" / "local_solve_cost.md").read_text()
    case = canned("local_solve")[local_solve.KEY]["rows"]["d=1000 sparse cg"]
    assert f"| 1,000 | sparse | cg | {case['first_round_s']['median']:.4g} " in table
# ------------------------------------------------ bench-fed: the grid sections (bench_defaults, bench_federated)
# scripts/bench_defaults.py: the --quick JSON's arithmetic, one tiny cell's numbers against numpy, the grid's knobs
# (`harness.resolve`) and verdicts on hand-made runs; scripts/bench_federated.py and its generated table
# (paper_figs/federated_table.py, docs/benchmarks.md): the per-target arithmetic on hand-made records, the grid's
# verdict, the table rendered from a hand-made report, and the page's block being the generator's.


@pytest.fixture(scope="module")
def quick():
    """``python -m scripts.bench defaults --quick`` (make bench-smoke runs it), cut to gd and dane."""
    from scripts import bench_defaults

    return bench_defaults, canned("defaults")


def test_the_json_holds_its_arithmetic(quick):
    bench, whole = quick
    report = whole["defaults"]
    (key, cell), = report["cells"].items()
    assert key == "large_targets/ridge/lam=0.001/m=4" and set(cell["methods"]) == {"gd", "dane"}
    for method, row in cell["methods"].items():
        reached = [g for g in row["grid"] if g["reached"]]
        assert len(row["grid"]) == len(bench.METHODS[method][2]) and reached
        best = min(g["comm_rounds"] for g in reached)
        assert row["best"]["comm_rounds"] == best
        assert row["ratio"] == pytest.approx(row["default"]["comm_rounds"] / best)
        assert row["within_factor"] == (row["ratio"] <= bench.METHODS[method][3])
        assert row["no_divergence"] and row["default"]["status"] == "converged"
        for run in [row["default"], *row["grid"]]:
            if run["reached"]:
                assert run["best_rel_suboptimality"] <= 1e-8 and run["peak_rise"] >= 1.0
    assert report["misses"] == bench.misses(report)
    assert len(cell["methods"]["dane"]["grid"]) == 9  # the fixed-mu grid of issue 23


def test_gd_rounds_match_numpy_gradient_descent(quick):
    """GD at lr = c/L on the quick cell, replayed in numpy: the same round reaches relative 1e-8."""
    bench, whole = quick
    cell = whole["defaults"]["cells"]["large_targets/ridge/lam=0.001/m=4"]
    X, y, _ = large_targets("squared", n=400)
    Z = np.hstack([X, np.ones((400, 1))])
    lam, n = 1e-3, 400
    H, b = Z.T @ Z / n + lam * np.eye(Z.shape[1]), Z.T @ y / n
    objective = lambda w: 0.5 * np.mean((Z @ w - y) ** 2) + 0.5 * lam * w @ w  # noqa: E731
    f_star = objective(np.linalg.solve(H, b))
    L = np.linalg.eigvalsh(H)[-1]
    assert cell["L"] == pytest.approx(L, rel=1e-12)
    for run in cell["methods"]["gd"]["grid"]:
        w, rounds = np.zeros(Z.shape[1]), 0
        while (objective(w) - f_star) / abs(f_star) > 1e-8:
            w, rounds = w - run["settings"]["lr_times_L"] / L * (H @ w - b), rounds + 1
        assert run["rounds"] == rounds and run["comm_rounds"] == rounds  # one allreduce a round, lr given


@pytest.mark.parametrize("family", [rare_onehot, large_targets, ill_conditioned])
def test_the_families_have_the_property_they_are_named_for(family):
    X, y, _ = family("squared")
    if family is rare_onehot:
        counts = X[:, -4:].sum(0)
        assert counts[-1] == 3 and counts[:-1].min() > 500  # 3 rows of 2000: some of 4 or 8 shards hold none
    elif family is large_targets:
        assert 1e5 < np.abs(y).mean() < 1e6
    else:
        eig = np.linalg.eigvalsh(X.T @ X / len(X))
        assert 3e5 < eig[-1] / eig[0] < 3e6  # condition number ~1e6 (a sample of 2000 rows of d = 20)


def test_the_readme_table_is_generated_from_the_json(quick, tmp_path):
    from dane.paper_figs.defaults_table import BEGIN, END, main, render

    _, whole = quick
    report = whole["defaults"]
    row = report["cells"]["large_targets/ridge/lam=0.001/m=4"]["methods"]["gd"]
    text = render(report)
    assert f"| {row['default']['comm_rounds']} ({row['best']['comm_rounds']}) |" in text
    assert f"| GD | 1/1 | 0 | {int(row['within_factor'])}/1 | 2x | {row['ratio']:.2f} |" in text
    assert "| DANE (safeguarded) | 1/1 | 0 |" in text
    readme, bench = tmp_path / "README.md", tmp_path / "bench.json"
    bench.write_text(json.dumps(whole))
    readme.write_text(f"before\n{BEGIN}\nold numbers\n{END}\nafter\n")
    main(["--json", str(bench), "--readme", str(readme)])
    named = render(report, sources=[str(bench)])  # the caption names the JSON it was rendered from
    assert f"defaults.py's JSON {bench} (" in named and named.replace(f" {bench}", "", 1) == text
    assert readme.read_text() == f"before\n{BEGIN}\n{named}\n{END}\nafter\n"


def test_the_defaults_row_keeps_each_local_work_count_to_the_target():
    """`bench_defaults.to_target`: the counts of record ``hit`` (the first at relative 1e-8), none where not reached
    or not counted."""
    from scripts.bench_defaults import to_target

    subs = [1.0, 1e-3, 1e-9, 1e-12]  # relative to |O*| = 2: the target is first met at round 2
    runs = [record(k, s, local_passes=3.0 * k, local_hessians=k, local_factorizations=k, local_hvps=0)
            for k, s in enumerate(subs)]
    row = to_target(runs)
    assert (row["rounds"], row["local_passes"], row["local_hvps"], row["local_hessians"],
            row["local_factorizations"]) == (2, 6.0, 0, 2, 2)
    assert "local_hvps" not in to_target([record(k, s, local_passes=k) for k, s in enumerate(subs)])
    assert "local_passes" not in to_target(runs[:2])  # not reached


def test_the_defaults_row_keeps_its_bytes_to_the_target_and_the_table_shows_them():
    """An allreduce's size differs by method, so the row keeps round 2's bytes (100 a round sent, 10 up, 20 down:
    200, 20, 40) beside its allreduces, and the table shows their median in MB where the JSON has them; a JSON of
    old, which has none, says in its legend that its columns count allreduces of sizes that differ by method."""
    from dane.paper_figs.defaults_table import NO_BYTES_NOTE, render
    from scripts.bench_defaults import to_target

    subs = [1.0, 1e-3, 1e-9, 1e-12]
    row = to_target([record(k, s) for k, s in enumerate(subs)])
    assert (row["comm_rounds"], row["bytes_sent"], row["uplink_bytes"], row["downlink_bytes"]) == (5, 200, 20, 40)
    assert "bytes_sent" not in to_target([record(k, s) for k, s in enumerate(subs[:2])])  # not reached

    def method(sent):
        return {"default": {"status": "converged", "reached": True, "comm_rounds": 10,
                            **({"bytes_sent": sent} if sent else {})},
                "best": {"comm_rounds": 10}, "ratio": 1.0, "factor": 2.0, "no_divergence": True, "within_factor": True}

    report = {"started_at": "t", "machine": {"load_avg": [1.0]}, "target": "relative 1e-8",
              "cells": {k: {"methods": {"giant": method(sent)}}
                        for k, sent in (("a", 1_000_000), ("b", 2_000_000), ("c", 9_000_000))}}  # mean 4, median 2
    text = render(report)
    assert "| worst ratio (cell) | median MB sent to target | median local passes to target |" in text
    assert "| GIANT | 3/3 | 0 | 3/3 | 2x | 1.00 | 1.00 (a) | 2 | — |" in text and NO_BYTES_NOTE not in text
    report["cells"] = {k: {"methods": {"giant": method(None)}} for k in "ab"}
    text = render(report)
    assert "MB sent" not in text and NO_BYTES_NOTE in text and "differ by method" in NO_BYTES_NOTE


def test_the_defaults_table_gives_the_median_of_each_local_work_count():
    """Per method the median over cells of passes, HVPs, Hessians and factorizations to the target at defaults, each
    over the cells that recorded it (— where none did)."""
    from dane.paper_figs.defaults_table import render

    def row(**work):
        return {"default": {"status": "converged", "reached": True, "comm_rounds": 10, **work},
                "best": {"comm_rounds": 10}, "ratio": 1.0, "factor": 2.0, "no_divergence": True, "within_factor": True}

    cells = {"a": {"giant": row(local_passes=30.0, local_hvps=0, local_hessians=0, local_factorizations=0),
                   "dane": row(local_passes=48.0, local_hvps=0, local_hessians=24, local_factorizations=24)},
             "b": {"giant": row(local_passes=50.0, local_hvps=0, local_hessians=0, local_factorizations=0),
                   "dane": row(local_passes=52.0, local_hvps=0, local_hessians=26, local_factorizations=27)},
             "c": {"giant": row(local_passes=70.0), "dane": row(local_passes=60.0)}}  # a run of old: passes alone
    report = {"started_at": "t", "machine": {"load_avg": [1.0]}, "target": "relative 1e-8",
              "cells": {key: {"methods": methods} for key, methods in cells.items()}}
    text = render(report)
    assert "| median local passes to target | median HVPs | median Hessians | median factorizations |" in text
    assert "| GIANT | 3/3 | 0 | 3/3 | 2x | 1.00 | 1.00 (a) | 50 | 0 | 0 | 0 |" in text
    assert "| DANE (safeguarded) | 3/3 | 0 | 3/3 | 2x | 1.00 | 1.00 (a) | 52 | 0 | 25 | 25.5 |" in text
    cells["a"]["dane"]["default"] = {"status": "converged", "reached": True, "comm_rounds": 10, "local_passes": 9.0}
    cells["b"]["dane"]["default"] = dict(cells["a"]["dane"]["default"])
    assert "| 1.00 (a) | 9 | — | — | — |" in render(report)


def test_each_method_row_records_the_code_it_ran(quick):
    _, whole = quick
    report = whole["defaults"]
    rows = [row for cell in report["cells"].values() for row in cell["methods"].values()]
    assert all(row["code"] == report["code"] and set(row["code"]) == {"git_commit", "git_dirty"} for row in rows)


def test_federated_grid_settings_are_multiples_of_what_the_default_chose():
    """``X_times_default: c`` is c times the X of the default run's first record; ``lr_times_L`` is c/L."""
    from scripts import bench_defaults as bench
    chosen = {"lam": 0.02, "p": 0.1, "lr": 0.5}
    assert harness.resolve({"lam_times_default": 0.25}, L=4.0, chosen=chosen) == {"lam": 0.005}
    assert harness.resolve({"lr_times_default": 0.5, "p_times_default": 4.0}, L=4.0, chosen=chosen) == \
        {"lr": 0.25, "p": 0.4}
    assert harness.resolve({"p_times_default": 20.0}, chosen=chosen) == {"p": 1.0}  # a probability: at most 1
    assert harness.resolve({"lr_times_L": 1.5, "local_steps": 3}, L=4.0) == {"lr": 0.375, "local_steps": 3}
    with pytest.raises(ValueError, match="mu_times_default: the default run logged no mu"):
        harness.resolve({"mu_times_default": 2.0}, L=4.0, chosen=chosen)
    for method in ("sdane", "acc_sdane", "feddane", "fedred", "fedprox", "fedavg", "scaffold", "scaffnew"):
        algorithm, default, grid, factor = bench.METHODS[method]
        assert algorithm == method and default == {} and factor == 2.0 and 2 <= len(grid) <= 5


def test_a_grid_holds_its_default_local_work_and_variant():
    """The cost counted is allreduces, in which local steps are free: no grid setting changes the local steps per
    round or the control variate of the default it is judged against (those are rows of their own)."""
    from scripts import bench_defaults as bench
    for method, (algorithm, default, grid, factor) in bench.METHODS.items():
        for setting in grid:
            for key in ("local_steps", "option"):
                assert setting.get(key) == default.get(key), (method, setting)
    assert {m for m, row in bench.METHODS.items() if row[0] == "scaffold"} == \
        {"scaffold", "scaffold_option1", "scaffold_k3", "scaffold_k30"}


def test_a_variant_default_keeps_what_it_chose_for_its_grid():
    """A default with keys of its own (``scaffold_option1``) logs the η_l it chose, which its grid's
    ``lr_times_default`` multiplies."""
    from dane.problems import Ridge

    from scripts import bench_defaults as bench
    X, y = np.random.default_rng(0).standard_normal((80, 5)), np.random.default_rng(1).standard_normal(80)
    problem = Ridge(X, y, lam=1e-2, fit_intercept=False, optimum="auto")
    L = bench.smoothness(X, "squared", 1e-2, False)
    default, grid = bench.run_method(problem, "scaffold_option1", 2, L, 3)
    lr = default["first_record"]["lr"]
    assert 0 < lr <= 1.9 / L * (1 + 1e-9)  # lr <= 1.9/max_i L_i <= 1.9/L: L = λ_max(mean_i H_i) <= max_i λ_max(H_i)
    assert bench.METHODS["scaffold_option1"][2][0] == {"option": 1, "lr_times_default": 0.25}
    assert grid[0]["keys"] == {"option": 1, "lr": 0.25 * lr} and "first_record" not in grid[0]


def test_a_floored_method_passes_at_its_drift_floor_and_misses_at_the_cap():
    """FedProx/FedAvg: reaching nothing is no miss when the default ended at its client-drift floor
    (status client_drift); running to the cap instead is one, named."""
    from scripts import bench_defaults as bench
    run = lambda status, comm=None: {"settings": {}, "status": status, "reached": comm is not None,  # noqa: E731
                                     "comm_rounds": comm, "rounds": comm}
    floor = bench.judge("fedavg", run("client_drift"), [run("client_drift"), run("max_rounds")])
    assert floor["diagnosed"] and floor["within_factor"] is None and floor["no_divergence"]
    capped = bench.judge("fedprox", run("max_rounds"), [run("client_drift")])
    assert capped["diagnosed"] is False
    reached = bench.judge("fedprox", run("converged", 12), [run("converged", 8)])
    assert reached["diagnosed"] and reached["ratio"] == 1.5 and reached["within_factor"]
    report = {"cells": {"c": {"methods": {"fedavg": {**floor, "default": run("client_drift")},
                                          "fedprox": {**capped, "default": run("max_rounds")}}}}}
    assert bench.misses(report) == ["c fedprox: default ran to the cap without reaching the target or its floor "
                                    "(max_rounds)"]


def test_the_federated_methods_have_their_own_block(tmp_path):
    """defaults_table renders the federated line into its own block, and leaves a block whose methods the JSON
    lacks as it is (the older methods' numbers come from another run)."""
    from dane.paper_figs.defaults_table import BEGIN, END, FEDERATED, FEDERATED_BEGIN, FEDERATED_END, main, render

    row = lambda status, comm, best: {  # noqa: E731
        "default": {"status": status, "reached": comm is not None, "comm_rounds": comm},
        "best": {"comm_rounds": best}, "ratio": None if comm is None else comm / best, "factor": 2.0,
        "no_divergence": True, "within_factor": None if comm is None else comm / best <= 2}
    report = {"started_at": "t", "machine": {"load_avg": [1.0]}, "target": "relative 1e-8",
              "cells": {"c/ridge": {"methods": {"sdane": row("converged", 12, 8), "fedavg": row("client_drift", None, 5)}}}}
    text = render(report, ("sdane", "fedavg"))
    assert "| S-DANE | 1/1 | 0 | 1/1 | 2x | 1.50 | 1.50 (c/ridge) |" in text
    assert "| FedAvg | 0/1 (+1 at its drift floor) | 0 | 0/0 | 2x | — | — |" in text
    assert "| c/ridge | 12 (8) | floor (5) |" in text
    page, data = tmp_path / "page.md", tmp_path / "bench.json"
    page.write_text(f"a\n{BEGIN}\nold\n{END}\nb\n{FEDERATED_BEGIN}\nold\n{FEDERATED_END}\n")
    data.write_text(json.dumps({"defaults": report}))
    main(["--json", str(data), "--page", str(page)])
    assert page.read_text() == \
        f"a\n{BEGIN}\nold\n{END}\nb\n{FEDERATED_BEGIN}\n{render(report, FEDERATED, [str(data)])}\n{FEDERATED_END}\n"
    other = {**report, "started_at": "u", "cells": {"c/ridge": {"methods": {"scaffold": row("converged", 30, 20)}}}}
    (tmp_path / "other.json").write_text(json.dumps({"defaults": other}))
    main(["--json", str(data), str(tmp_path / "other.json"), "--page", str(page)])  # runs split by --only
    text = page.read_text()
    assert "| c/ridge | 12 (8) | floor (5) | 30 (20) |" in text and "(t, load average [1.0]; u, load average" in text
    assert f"JSON {data}, {tmp_path / 'other.json'} (t," in text  # the caption names both files


def record(k, sub, objective_star=-2.0, **extra):
    return {"round": k, "comm_rounds": 2 * k + 1, "objective": objective_star + sub, "suboptimality": sub,
            "time_s": 0.5 * k, "bytes_sent": 100 * k, "uplink_bytes": 10 * k, "downlink_bytes": 20 * k, **extra}


def test_targets_are_the_first_records_at_or_below_them():
    from scripts import bench_federated as bench
    subs = [1.0, 1e-3, 2e-4, 1e-5, 1e-9, 3e-9]  # relative to |O*| = 2: 0.5, 5e-4, 1e-4, 5e-6, 5e-10, 1.5e-9
    found = bench.at_targets([record(k, s) for k, s in enumerate(subs)])
    # record t counts what reaching w_t cost: w_2's traffic is record 2's
    assert found["targets"]["0.0001"] == {"rounds": 2, "comm_rounds": 5, "time_s": 1.0, "uplink_bytes": 20,
                                          "downlink_bytes": 40, "bytes_sent": 200}
    assert found["targets"]["1e-08"]["rounds"] == 4
    work = {"local_passes": 1.5, "local_hvps": 4, "local_hessians": 2, "local_factorizations": 1, "local_flops": 9}
    counted = bench.at_targets([record(k, s, **{key: k * v for key, v in work.items()}) for k, s in enumerate(subs)])
    assert counted["targets"]["1e-08"] == {**found["targets"]["1e-08"], "local_passes": 6.0, "local_hvps": 16,
                                           "local_hessians": 8, "local_factorizations": 4}  # w_4's, no flops
    assert found["best_rel_suboptimality"] == pytest.approx(5e-10)
    assert bench.at_targets([record(0, 1.0), record(1, float("nan"))])["targets"]["1e-08"] is None


def test_best_is_the_fewest_rounds_over_the_grid_and_the_default():
    from scripts import bench_federated as bench
    run = lambda rounds, settings, status="converged": {  # noqa: E731
        "settings": settings, "status": status, "targets": {"1e-08": None if rounds is None else {"rounds": rounds}}}
    verdict = bench.judge(run(30, {}), [run(12, {"lam_per_delta": 1.0}), run(None, {"lam_per_delta": 0.1}, "diverged")])
    assert verdict["best"]["settings"] == {"lam_per_delta": 1.0} and verdict["ratio"] == 2.5
    assert verdict["best_per_target"]["1e-08"] == {"settings": {"lam_per_delta": 1.0}, "rounds": 12}
    assert verdict["best_per_target"]["0.0001"] is None  # no run of this made-up grid logged that target
    assert verdict["no_divergence"]
    verdict = bench.judge(run(None, {}, "diverged"), [run(7, {"mu": 0.1})])
    assert verdict["ratio"] is None and not verdict["no_divergence"] and verdict["best"]["rounds"] == 7
    assert harness.resolve({"lam_per_delta": 0.25, "local_steps": 5}, delta_a=0.8) == {"lam": 0.2, "local_steps": 5}


def test_scaffold_and_fedavg_grids_hold_the_local_work_and_follow_the_defaults_benchmark():
    """SCAFFOLD's and FedAvg's grids keep the default's K (no local_steps key) and are scripts/bench_defaults.py's:
    η_l as multiples of the step the default chose, η_g; FedAvg's step as multiples of 1/L, L = ‖H‖ + λ."""
    from scripts import bench_federated as bench
    from scripts import bench_defaults as defaults

    assert bench.METHODS["scaffold"][3] == defaults.SCAFFOLD_GRID == defaults.METHODS["scaffold"][2]
    assert bench.METHODS["fedavg"][3] == defaults.METHODS["fedavg"][2]
    assert all("local_steps" not in g for m in ("scaffold", "fedavg") for g in bench.METHODS[m][3])
    assert harness.resolve({"lr_times_default": 0.5}, delta_a=0.8, chosen={"lr": 3.0}) == {"lr": 1.5}
    assert harness.resolve({"lr_times_L": 0.25}, delta_a=0.8, L=2.0) == {"lr": 0.125}
    assert harness.resolve({"server_lr": 2.0}, delta_a=0.8, chosen={"lr": 3.0}) == {"server_lr": 2.0}
    with pytest.raises(ValueError, match="logged no lr"):
        harness.resolve({"lr_times_default": 0.5}, delta_a=0.8)


def report(rows, **extra):
    return {"started_at": "2026-01-01T00:00:00+0000", "machine": {"load_avg": [1.0, 1.0, 1.0]}, "lam": 1e-3,
            "dataset": "phishing", "workers": 4, "clients": [4, 2], "sharding": "dirichlet alpha=0.5",
            "targets": ["0.0001", "1e-08"], "target": "relative suboptimality",
            "similarity": {"rows": 40, "dim": 3, "shard_rows_min": 2, "shard_rows_max": 20, "delta": 1.5,
                           "delta_mean_square": 0.5, "hessian_norm": 0.25}, "rows": rows, **extra}


def test_the_table_shows_defaults_beside_the_best_setting():
    from dane.paper_figs.federated_table import render

    hit = lambda rounds, up: {"rounds": rounds, "uplink_bytes": up, "bytes_sent": 7_000_000}  # noqa: E731
    run = lambda settings, t4, t8, rel=9e-9, status="converged": {  # noqa: E731
        "settings": settings, "targets": {"0.0001": t4, "1e-08": t8}, "best_rel_suboptimality": rel, "status": status}
    rows = {"s=4/scaffold": {"method": "scaffold", "default": run({}, hit(5, 1), hit(20, 2_500_000)),
                             "grid": [run({"local_steps": 5}, hit(4, 1), hit(11, 1)),
                                      run({"local_steps": 1}, hit(6, 1), None, 1e-5, "max_rounds")]},
            "s=4/gd": {"method": "gd", "default": run({}, hit(9, None), None, 3e-6, "max_rounds"),
                       "grid": [run({"lr_factor": 1.0}, hit(8, None), None, 4e-6, "max_rounds")]},
            "s=2/gd": {"skipped": "gd has no client sampling; run at s=m only"}}
    text = render(report(rows))
    assert "| SCAFFOLD | 5 (4) | 20 (11) | 2.50 | — | — | — | — | — | 9.0e-09 | converged | {\"local_steps\": 5} |" in text
    assert "| GD | 9 (8) | — (—) | — | — | — | — | — | — | 3.0e-06 | max_rounds | {\"lr_factor\": 1.0} (to 0.0001) |" \
        in text
    assert "| local passes to 1e-08 | HVPs | Hessians | factorizations | best rel. suboptimality |" in text
    assert "To 1e-08 at defaults, each axis's leader: fewest rounds: SCAFFOLD (20); fewest clients' uplink bits: " \
           "SCAFFOLD (20000000); fewest downlink bits: —; fewest local passes: —." in text  # GD reached 1e-4 only; no record of these counts local passes
    assert "delta = 1.50e+00, delta_A = 5.00e-01, ||H|| = 2.50e-01" in text
    assert "**s = 2 of 4" not in text and "At s < m: GD not run (no client sampling)." in text
    assert "Not in this JSON" not in text  # no methods listed: nothing to miss
    assert "in parentheses; —" in text  # every row has a grid
    flipped = render(report(dict(reversed(rows.items()))))  # runs split by --only join in any order
    assert flipped.index("| SCAFFOLD |") < flipped.index("| GD |")  # the rows in LABELS' order (the benchmark's)
    rows["s=4/gd"]["grid"], rows["s=2/scaffold"] = [], {**rows["s=4/scaffold"], "grid": []}
    assert "in parentheses; no grid run for GD at s = 4; SCAFFOLD at s = 2: the default alone; —" in render(report(rows))
    del rows["s=2/scaffold"]
    methods = {"scaffold": {"samples_clients": True}, "gd": {"samples_clients": False}}
    text = render(report(rows, methods=methods, setting="mild"))
    assert "Not in this JSON at s = 2: SCAFFOLD (python -m scripts.bench federated --setting mild --clients 2 --only " \
           "scaffold adds them)." in text and "Not in this JSON at s = 4" not in text
    del rows["s=2/gd"]  # a method without client sampling is named as such at s < m from the run's methods alone
    assert "At s < m: GD not run (no client sampling)." in render(report(rows, methods=methods))


def test_each_axis_has_its_leader_and_the_legend_states_the_round_caps():
    """Uplink and downlink differ (S-DANE sends its λ-step and its gradient up, one model down: in the mild setting
    1.06 MB up, 0.71 MB down): the table shows both, the summary names the leader of each axis (rounds, uplink,
    downlink, local passes) and no overall winner, and the legend states the round caps the rows ran under; the
    summary ranked by uplink bits alone and the table had no downlink column though the JSON records it."""
    from dane.paper_figs.federated_table import render

    def row(method, rounds, up, down, passes, cap):
        hit = {"rounds": rounds, "uplink_bytes": up, "downlink_bytes": down, "bytes_sent": 70_000,
               "local_passes": passes, "local_hvps": 0, "local_hessians": 0, "local_factorizations": 0}
        return {"method": method, "default": {"settings": {}, "targets": {"0.0001": hit, "1e-08": hit}, "round_cap": cap,
                                              "best_rel_suboptimality": 5e-9, "status": "converged"}, "grid": []}

    rows = {"s=4/sdane": row("sdane", 30, 1_500_000, 1_000_000, 900, 60),
            "s=4/scaffold": row("scaffold", 90, 1_200_000, 1_200_000, 700, 200),
            "s=4/dane": row("dane", 20, None, None, 800, 60)}
    text = render(report(rows, clients=[4]))
    assert "| uplink MB to 1e-08 | downlink MB to 1e-08 | local passes to 1e-08 |" in text
    assert "| S-DANE | 30 (30) | 30 (30) | 1.50 | 1.00 | 900 |" in text and "| SCAFFOLD | 90 (90) | 90 (90) | 1.20 | 1.20 |" \
        in text and "| DANE (safeguarded) | 20 (20) | 20 (20) | 0.07* | * | 800 |" in text
    assert ("To 1e-08 at defaults, each axis's leader: fewest rounds: DANE (safeguarded) (20); fewest clients' uplink "
            "bits: SCAFFOLD (9600000); fewest downlink bits: S-DANE (8000000); fewest local passes among first-order "
            "rows: SCAFFOLD (700).") in text
    assert " Round caps: 60 rounds (S-DANE, DANE (safeguarded)); 200 rounds (SCAFFOLD). Uplink: " in text.splitlines()[0]


def test_a_defaults_table_with_blank_cells_says_what_a_blank_is():
    """The federated line's first-order methods ran on 4 of the 20 cells: their 16 blank cells each are legend's
    "blank: not run on this cell"; a table with every method on every cell has no such entry."""
    from dane.paper_figs.defaults_table import FEDERATED, combine, render

    evidence = REPO / "paper_figs" / "evidence"
    reports = [json.loads((evidence / f"defaults_federated_{n}.json").read_text())["defaults"]
               for n in ("newton", "first_order")]
    text = render(combine(reports), FEDERATED)
    rows = [line for line in text.splitlines() if line.startswith("| rare_onehot/ridge/lam=0.001/m=4 |")]
    assert [c.strip() for c in rows[0].strip("|").split("|")].count("") == 8 and "—: not reached within the cap; blank: not run on this cell." in text
    alone = render(json.loads((evidence / "defaults.json").read_text())["defaults"])
    assert "blank" not in alone and "—: not reached within the cap.\n" in alone


def test_a_row_shows_its_second_order_work_beside_its_passes():
    """Each row's passes to the last target, then its HVPs, Hessians formed and factorizations (0 where counted and
    none made); a run from before those counts shows its passes and — for each; a target not reached, — for all."""
    from dane.paper_figs.federated_table import render

    def run(t8):
        return {"settings": {}, "targets": {"0.0001": {"rounds": 3, "uplink_bytes": None, "bytes_sent": 8},
                                            "1e-08": t8}, "best_rel_suboptimality": 5e-9, "status": "converged"}

    hit = {"rounds": 30, "uplink_bytes": None, "bytes_sent": 70_000, "local_passes": 22801.0}
    rows = {"s=4/dane": {"method": "dane", "default": run({**hit, "local_hvps": 0, "local_hessians": 3000,
                                                           "local_factorizations": 3000}), "grid": []},
            "s=4/scaffnew": {"method": "scaffnew", "default": run({**hit, "uplink_bytes": 10 ** 7, "local_passes": 989900,
                                                                   "local_hvps": 0, "local_hessians": 0,
                                                                   "local_factorizations": 0}), "grid": []},
            "s=4/gd": {"method": "gd", "default": run({**hit, "local_passes": 480.0}), "grid": []},
            "s=4/fedavg": {"method": "fedavg", "default": run(None), "grid": []}}
    text = render(report(rows, clients=[4]))
    assert "| DANE (safeguarded) | 3 (3) | 30 (30) | 0.07* | * | 22801 | 0 | 3000 | 3000 | 5.0e-09 | converged |" in text
    assert "| Scaffnew | 3 (3) | 30 (30) | 10.00 | — | 989900 | 0 | 0 | 0 | 5.0e-09 | converged |" in text
    assert "| GD | 3 (3) | 30 (30) | 0.07* | * | 480 | — | — | — | 5.0e-09 | converged |" in text
    assert "| FedAvg | 3 (3) | — (—) | — | — | — | — | — | — | 5.0e-09 | converged |" in text
    assert "fewest local passes among first-order rows: Scaffnew (989900); fewest local passes among rows with " \
           "second-order work: DANE (safeguarded) (22801 passes; 3000 Hessians, 3000 factorizations); local passes " \
           "not ranked (HVPs, Hessians, factorizations not recorded): GD (480)." in text
    assert "The fewest local passes are ranked only among rows of one kind" in text.splitlines()[0]


@pytest.mark.parametrize("section", ["federated", "federated_mild", "federated_quadratic"])
def test_the_page_holds_the_generated_table(section):
    """Each section's block is the generator's, and names the JSON it came from; where that JSON is here (results/ is
    untracked), rendering it again gives the block to the character."""
    from dane.paper_figs.federated_table import SECTIONS, combine, render

    begin, end = SECTIONS[section]
    text = (REPO / "docs" / "benchmarks.md").read_text()
    assert text.count(begin) == 1 and text.count(end) == 1
    block = text.split(begin, 1)[1].split(end, 1)[0].strip("\n")
    found = re.match(r"Generated by `dane figures federated_table` from scripts/bench_federated\.py's JSON "
                     r"(\S+\.json(?:, \S+\.json)*) \((\S+), load average \[[\d., ]+\]", block)
    assert found, block[:200]
    sources = found.group(1).split(", ")
    if all((REPO / path).is_file() for path in sources):
        reports = [json.loads((REPO / path).read_text())[section] for path in sources]
        assert render(combine(reports), sources) == block


def quadratic_report(sdane_rounds, acc_rounds, dane_rounds):
    """A made-up quadratic section: per method, {multiple of δ_A: rounds to 1e-8 (None: not reached)}; the defaults
    are the key None, DANE's μ = 0 the key 0."""
    def run(settings, rounds, prox=None):
        return {"settings": settings, "status": "converged" if rounds else "max_rounds", "prox_weight": prox,
                "targets": {"0.0001": {"rounds": 1, "uplink_bytes": 8, "bytes_sent": 8},
                            "1e-08": rounds and {"rounds": rounds, "uplink_bytes": 8, "bytes_sent": 8}},
                "best_rel_suboptimality": 1e-9 if rounds else 1e-6}

    def row(method, found, knob):
        grid = [run({"safeguard": False, "mu": 0.0} if c == 0 else {knob: c}, r) for c, r in found.items()
                if c is not None]
        return {"method": method, "clients": 5, "default": run({}, found[None], 2e-4), "grid": grid}

    rows = {"s=5/dane": row("dane", dane_rounds, "mu_per_delta"), "s=5/sdane": row("sdane", sdane_rounds, "lam_per_delta"),
            "s=5/acc_sdane": row("acc_sdane", acc_rounds, "lam_per_delta")}
    return report(rows, dataset="quadratic", workers=5, clients=[5], setting="quadratic", lam=1e-6, delta=0.1,
                  grids=True)


def test_the_quadratic_table_states_the_papers_comparisons_from_the_data():
    """The prox-weight table puts each method's run at each multiple of δ_A side by side, and each sentence follows
    the rounds: Acc-S-DANE fewer than S-DANE at every λ, S-DANE as many as DANE at equal weight, DANE's default
    fewer, so the paper's "no more rounds than DANE" holds at equal weight only; a reversal is said, not hidden."""
    from dane.paper_figs.federated_table import render

    sdane = {None: None, 1.0: None, 0.125: 40}
    text = render(quadratic_report(sdane, {None: 30, 1.0: 50, 0.125: 20}, {None: 4, 0: 4, 1.0: None, 0.125: 40}))
    assert "| prox weight | DANE | S-DANE | Acc-S-DANE |" in text
    assert "| defaults | 1 / 4 at 2.00e-04 | 1 / — (best 1.0e-06) at 2.00e-04 | 1 / 30 at 2.00e-04 |" in text
    assert "| 0 | 1 / 4 |  |  |" in text  # δ_A = 0.5 in report(): δ_A/8 = 6.25e-2
    assert "| delta_A/8 = 6.25e-02 | 1 / 40 | 1 / 40 | 1 / 20 |" in text
    assert "Acc-S-DANE needs fewer rounds than S-DANE at every lambda of the grid (delta_A, delta_A/8)." in text
    assert "At equal prox weight (lambda = mu = delta_A, delta_A/8) S-DANE takes as many rounds as DANE" in text
    assert "DANE (mu = 0, safeguarded: exact Newton-type local solves) needs fewer rounds than S-DANE " \
           "(lambda = 2.00e-04), so the paper's \"S-DANE in no more rounds than DANE\" holds at equal prox weight only." \
           in text
    text = render(quadratic_report(sdane, {None: 30, 1.0: 50, 0.125: 41}, {None: 4, 0: 4, 1.0: None, 0.125: 39}))
    assert "Acc-S-DANE against S-DANE: fewer rounds at delta_A; more rounds at delta_A/8." in text
    assert "S-DANE against DANE at equal prox weight: as many rounds at delta_A; more rounds at delta_A/8." in text
    assert "needs fewer rounds than S-DANE (lambda = 2.00e-04)." in text and "equal prox weight only" not in text
    assert "**Rounds to" not in render({**quadratic_report(sdane, sdane, sdane), "grids": False})


def test_runs_with_the_same_rounds_compare_by_their_best_up_to_round_off():
    from dane.paper_figs.federated_table import compare

    targets = ["0.0001", "1e-08"]
    run = lambda r4, r8, best: {"targets": {"0.0001": r4 and {"rounds": r4}, "1e-08": r8 and {"rounds": r8}},  # noqa: E731
                                "best_rel_suboptimality": best}
    assert compare(run(2, None, 1.0568841373503738e-08), run(2, None, 1.056884137543459e-08), targets) == "as many"
    assert compare(run(2, None, 1.0e-08), run(2, None, 1.01e-08), targets) == "fewer"
    assert compare(run(9, 40, 1e-9), run(2, 41, 1e-9), targets) == "fewer"  # the last target decides first
    assert compare(run(3, None, 1e-9), run(2, None, 1e-6), targets) == "more"  # then the earlier ones
    assert compare(run(None, None, 1e-5), run(None, None, None), targets) == "fewer"


def test_the_quadratic_grids_compare_at_equal_prox_weight():
    """DANE's μ runs on S-DANE's and Acc-S-DANE's multiples of δ_A (and at 0), and each run records the weight it
    started with: a null default's resolved λ or μ."""
    from scripts import bench_federated as bench
    grids = bench.SETTINGS["quadratic"]["grids_of"]
    multiples = lambda grid, key: [g[key] for g in grid if key in g]  # noqa: E731
    assert multiples(grids["dane"], "mu_per_delta") == multiples(grids["sdane"], "lam_per_delta") \
        == multiples(grids["acc_sdane"], "lam_per_delta") and 1.0 in multiples(grids["sdane"], "lam_per_delta")
    assert {"safeguard": False, "mu": 0.0} in grids["dane"] and all(g.get("safeguard") is False for g in grids["dane"])
    hard = argparse.Namespace(**bench.SETTINGS["hard"])
    assert bench.grid_of(hard, "dane") == bench.METHODS["dane"][3]
    assert bench.prox_weight([{"lam": 0.25}, {"lam": 0.5}]) == 0.25 and bench.prox_weight([{"mu": 0}]) == 0.0
    assert bench.prox_weight([{"round": 0}]) is None and bench.prox_weight([]) is None


def test_each_setting_renders_into_its_own_block(tmp_path):
    """``federated`` (the hard setting) and ``federated_mild`` go between their own markers; a JSON without the mild
    section leaves its block alone, and asking for a section the JSON lacks is one line naming the command."""
    from dane.paper_figs.federated_table import SECTIONS, main, render

    hard = report({"s=4/gd": {"method": "gd", "default": {"settings": {}, "targets": {}, "status": "max_rounds"},
                              "grid": []}})
    mild = {**hard, "setting": "mild", "grids": False, "workers": 2, "clients": [2]}
    mild["rows"] = {"s=2/gd": {**hard["rows"]["s=4/gd"], "clients": 2}}
    (hb, he), (mb, me) = SECTIONS["federated"], SECTIONS["federated_mild"]
    page, data = tmp_path / "page.md", tmp_path / "bench.json"
    page.write_text(f"{hb}\nold\n{he}\n{mb}\nold\n{me}\n")
    data.write_text(json.dumps({"federated": hard}))
    main(["--json", str(data), "--page", str(page)])
    source = [str(data)]  # the caption names the JSON as given
    assert page.read_text() == f"{hb}\n{render(hard, source)}\n{he}\n{mb}\nold\n{me}\n"
    assert f"from scripts/bench_federated.py's JSON {data} (2026-01-01T00:00:00+0000, load average" in render(hard, source)
    data.write_text(json.dumps({"federated": hard, "federated_mild": mild}))
    main(["--json", str(data), "--page", str(page)])
    assert page.read_text() == f"{hb}\n{render(hard, source)}\n{he}\n{mb}\n{render(mild, source)}\n{me}\n"
    assert "Setting mild: " in render(mild) and "defaults only, no grid" in render(mild)
    data.write_text(json.dumps({"federated": hard}))
    with pytest.raises(SystemExit, match="holds no federated_mild section; run python -m scripts.bench federated --setting mild"):
        main(["--json", str(data), "--page", str(page), "--section", "federated_mild"])


def test_the_settings_fill_what_the_command_line_leaves_out(tmp_path, monkeypatch):
    """``--setting mild`` runs the mild setting into its own section; a flag given overrides it."""
    from scripts import bench as runner

    from scripts import bench_federated as bench
    seen = []
    monkeypatch.setattr(bench, "run_setting_rows", lambda args, run: seen.append(args) or {})
    runner.main(["federated", "--out", str(tmp_path / "b.json"), "--setting", "mild", "hard", "--clients", "5"])
    mild, hard = seen
    assert (mild.key, mild.workers, mild.alpha, mild.clients, mild.caps) == ("federated_mild", 20, 1.0, [5], [60, 200])
    assert (hard.key, hard.workers, hard.alpha, hard.caps) == ("federated", 100, 0.5, [60, 200])


def test_a_rerun_of_some_rows_keeps_the_others_in_order():
    """``--only`` with ``--clients 10`` over a section of s = 100 and 10: the earlier rows stay, a row of both runs is
    the new one, s keeps both values and rows the order of s then of METHODS, and both runs' starts are named."""
    from scripts import bench_federated as bench
    earlier = {"started_at": "A", "machine": {"load_avg": [1]}, "clients": [100, 10],
               "rows": {"s=100/gd": 1, "s=10/sdane": 2, "s=10/fedavg": 3}}
    new = {"started_at": "B", "machine": {"load_avg": [2]}, "clients": [10], "rows": {"s=10/fedavg": 4, "s=10/fedprox": 5}}
    args = argparse.Namespace(only=["fedavg", "fedprox"])
    merged = bench.with_earlier(new, earlier, args)
    assert merged["clients"] == [100, 10]
    assert list(merged["rows"].items()) == [("s=100/gd", 1), ("s=10/sdane", 2), ("s=10/fedprox", 5), ("s=10/fedavg", 4)]
    assert merged["runs"] == [{"started_at": "A", "load_avg": [1], "code": None},
                              {"started_at": "B", "load_avg": [2], "code": None}]
    earlier["methods"], new["methods"] = {"gd": 1, "fedavg": 2}, {"fedavg": 3, "fedprox": 4}
    assert bench.with_earlier(new, earlier, args)["methods"] == {"gd": 1, "fedavg": 3, "fedprox": 4}
    assert bench.with_earlier(new, earlier, argparse.Namespace(only=None)) is new


def test_each_federated_row_keeps_the_code_it_was_measured_with(tmp_path, monkeypatch):
    """A ``--only gd`` rerun over a section whose rows came from commit a: the new row names commit b, the kept row
    still names a, and ``runs`` names each run's code (the section's own ``code`` is the last run's, as before);
    it was one ``code`` for the section, so a file of 7 runs named 1 commit."""
    from scripts import bench_federated as bench

    a, b = {"git_commit": "a" * 40, "git_dirty": True}, {"git_commit": "b" * 40, "git_dirty": False}
    out = tmp_path / "bench.json"
    # run_setting_rows sets DANE_CACHE_DIR where it is unset (the benchmark's own process): set here, it is put back
    # after the test, which otherwise left every later test of the session writing O* into the checkout's results/
    monkeypatch.setenv("DANE_CACHE_DIR", str(tmp_path / "cache"))
    out.write_text(json.dumps({"federated": {"started_at": "A", "machine": {"load_avg": [1]}, "code": a,
                                             "clients": [4], "rows": {"s=4/sdane": {"method": "sdane", "code": a}}}}))
    monkeypatch.setattr(bench, "code_version", lambda: b)
    monkeypatch.setattr(bench, "problem_config", lambda args, folder: argparse.Namespace(release=lambda: None))
    monkeypatch.setattr(bench, "dissimilarity", lambda config, m: {"delta_mean_square": 1.0})
    monkeypatch.setattr(bench, "run_method", lambda *a: ({"status": "converged", "targets": {}}, []))
    saved = []
    runner = argparse.Namespace(path=out, machine={"load_avg": [2]}, log=lambda line: None,
                                save=lambda section, key: saved.append(section), finish=lambda section, key: section)
    args = argparse.Namespace(iid=False, dataset="phishing", quick=False, only=["gd"], workers=4, clients=[4],
                              setting="hard", alpha=0.5, lam=1e-3, seed=0, caps=[60, 200], defaults_only=True,
                              repeats=1, key="federated")
    section = bench.run_setting_rows(args, runner)
    assert section["rows"]["s=4/sdane"]["code"] == a and section["rows"]["s=4/gd"]["code"] == b
    assert [run["code"] for run in section["runs"]] == [a, b] and section["code"] == b and saved[-1] == section


def test_the_grid_runner_gives_each_setting_what_the_default_chose(monkeypatch):
    """`harness.default_and_grid`: every grid setting gets `harness.CHOSEN` of the default's first record (None where
    it made none) beside the given keys; `harness.fit_setting`: a setting that does not resolve, or whose run raises,
    is an error row of one line (the grid goes on), and a run's row is its settings, the section's measure and its
    wall seconds."""
    seen, first = [], {"round": 0, "objective": 1.0, "lr": 0.5, "lam": 0.25}

    def fit_setting(problem, algorithm, settings, measure, failed, *, given, **fit):
        seen.append((problem, algorithm, given, fit))
        return {"settings": settings}, first

    monkeypatch.setattr(harness, "fit_setting", fit_setting)
    default, grid, chosen = harness.default_and_grid("P", "gd", {"k": 1}, [{"a": 1}, {"a": 2}], None, {},
                                                     given={"L": 2.0}, digits=3, rounds=5)
    assert chosen == {"lr": 0.5, "lam": 0.25}
    assert seen == [("P", "gd", {"L": 2.0, "chosen": c}, {"digits": 3, "rounds": 5}) for c in (None, chosen, chosen)]
    assert default == {"settings": {"k": 1}} and grid == [{"settings": {"a": 1}}, {"settings": {"a": 2}}]
    first = None
    assert harness.default_and_grid("P", "gd", {}, [{}], None, {}, given={})[2] is None
    monkeypatch.undo()
    from dane.problems import Ridge

    problem = Ridge(np.eye(4), np.ones(4), lam=0.1)
    common = dict(given={"L": 2.0}, extra={}, digits=3, workers=2, rounds=2)
    row, first = harness.fit_setting(problem, "gd", {"lr_times_default": 2.0}, None, {"reached": False}, **common)
    assert first is None and row == {"settings": {"lr_times_default": 2.0}, "reached": False, "status": "error",
                                     "error": "lr_times_default: the default run logged no lr", "wall_s": 0.0}
    row, first = harness.fit_setting(problem, "gd", {"no_such_key": 1}, None, {"reached": False}, **common)
    assert first is None and row["error"].startswith("ConfigError: algorithm gd has no key(s) no_such_key")
    measure = lambda result, settings, keys: {"status": result.status, "keys": keys}  # noqa: E731
    row, first = harness.fit_setting(problem, "gd", {"lr_times_L": 1.0}, measure, {}, **common)
    assert list(row) == ["settings", "status", "keys", "wall_s"] and row["keys"] == {"lr": 0.5}
    assert first["round"] == 0 and first["lr"] == 0.5


def test_relative_suboptimality_starts_from_the_first_finite_record():
    """O* = O − (O − O*) of the first record with a finite suboptimality (`optimum_of`); a record without one is inf."""
    records = [{"objective": 5.0, "suboptimality": None}, {"objective": 3.0, "suboptimality": 1.0},
               {"objective": 2.5, "suboptimality": float("nan")}, {"objective": 2.0002, "suboptimality": 2e-4}]
    star = harness.optimum_of(records)
    assert star == 2.0 and harness.relative(records, star) == [float("inf"), 0.5, float("inf"), pytest.approx(1e-4)]
    assert harness.optimum_of([{"objective": 1.0}]) is None
    # without O*, each record its own: (O − O*)/|O − (O − O*)|
    assert harness.relative(records)[1:] == [0.5, float("inf"), pytest.approx(2e-4 / 2.0)]
    assert harness.first_at([1.0, 0.5, 1e-4], 1e-4) == 2 and harness.first_at([1.0], 1e-8) is None


# ------------------------------------------------------------------ the launch sections (wallclock, time_vs_workers)
# The wallclock rows read tests/data/bench/wallclock.json, a real `python -m scripts.bench wallclock --quick --out F
# --data-dir EMPTY` (a folder without mnist/) whose F held {"other": {"kept": True}} before; the time_vs_workers rows read the tree of a real
# `python -m scripts.bench time_vs_workers --quick --problems mnist_lenet3 --real --out DIR` (tests/data/bench/
# time_vs_workers/: its calibration and the two simulated runs) or a hand-made tree whose answers are known.



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


def test_wallclock_without_horovod_times_nothing_that_imports_it():
    assert wallclock.variants_here(True) == ["bare_python", "bare_horovodrun", "horovodrun_np1", "horovodrun_np2",
                                             "simulator_m2", "scipy_lbfgsb", "sklearn_lbfgs"]
    # the bare python line imports horovod.torch too: it failed there, though the section said it was left out
    assert wallclock.variants_here(False) == ["simulator_m2", "scipy_lbfgsb", "sklearn_lbfgs"]


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
# ------------------------------------------------------------------ fedprox_synthetic (issue 47 item 2)
#: method -> the vectors a sampled client sends up and receives a round: FedAvg and FedProx their model each way,
#: SCAFFOLD and FedDANE two (with the control variate; the gradient round), S-DANE three up (x_i, its gradient,
#: the test's inner product's vector) and two down
FEDPROX_SYNTHETIC_MESSAGES = {"fedavg": (1, 1), "fedprox": (1, 1), "scaffold": (2, 2), "feddane": (2, 2),
                              "sdane": (3, 2)}


def fedprox_synthetic_arithmetic(section: dict) -> None:
    """Every run logs w_0 .. w_T, from log 10 (w = 0: every row's cross-entropy is log 10); the methods of fixed
    local work count rounds x sampled clients x local steps gradient passes."""
    import math

    assert {r["setting"] for r in section["runs"]} == {"synthetic_1_1"} and section["quick"]
    for run in section["runs"]:
        assert run["status"] == "max_rounds" and len(run["objective"]) == section["rounds"] + 1 == run["rounds"] + 1
        assert run["objective"][0] == pytest.approx(math.log(10), rel=1e-8)
        if run["method"] in ("fedavg", "fedprox", "scaffold"):
            steps = section["local"]["local_steps"]
            assert run["local_passes"] == section["rounds"] * section["clients_per_round"] * steps
        up, down = FEDPROX_SYNTHETIC_MESSAGES[run["method"]]  # vectors of d = 10 x (60 + 1) float64 values a client
        sent = section["rounds"] * section["clients_per_round"] * 8 * 610
        assert (run["uplink_bytes"], run["downlink_bytes"]) == (up * sent, down * sent)
        assert run["local_hvps"] == run["local_hessians"] == run["local_factorizations"] == 0


SECTIONS["fedprox_synthetic"] = (
    "fedprox_synthetic", {"started_at", "machine", "quick", "workers", "clients_per_round", "rounds", "seed", "lam",
                          "fit_intercept", "local", "runs", "load_avg_after", "wall_s"}, fedprox_synthetic_arithmetic)


def test_the_fedprox_synthetic_table_judges_the_papers_claims_from_the_numbers():
    """The table's cells are each run's last objective and its rises (Σ max(0, f_{t+1} − f_t)); a claim is judged
    only where both FedAvg and FedProx ran, and flips with the numbers."""
    from dane.paper_figs import fedprox_synthetic as fig

    section = canned("fedprox_synthetic")["fedprox_synthetic"]
    assert fig.rises([3.0, 2.0, 2.5, 1.0, 1.25]) == 0.75 and fig.rises([2.0, 1.0]) == 0.0
    text = fig.render(section, "tests/data/bench/fedprox_synthetic.json")
    runs = {r["method"]: r for r in section["runs"]}
    fa, fp = runs["fedavg"]["objective"], runs["fedprox"]["objective"]
    assert f"| Synthetic(1,1) | {fig.num(fa[-1])} ({fig.num(fig.rises(fa), 3)}) | {fig.num(fp[-1])} " in text
    assert fig.num(0.98765) == "9.877e-01" and fig.num(1.2345678) == "1.235" and fig.num(0.4, 3) == "0.4"
    assert "| setting | FedAvg | FedProx μ=1 | FedDANE | S-DANE | SCAFFOLD |" in text
    stabler = "agrees" if fig.rises(fp) <= fig.rises(fa) else "does not agree"
    lower = "agrees" if fp[-1] <= fa[-1] else "does not agree"
    assert text.count("- Synthetic(1,1): the paper: ") == 2 and text.count("- Synthetic") == 2
    assert f"FedAvg on the most heterogeneous data (its loss rises no more). Here: {stabler};" in text
    assert f"(ends no higher). Here: {lower};" in text
    flipped = {**section, "runs": [{**r, "objective": r["objective"][::-1]} if r["method"] == "fedprox" else r
                                   for r in section["runs"]]}  # FedProx's loss now climbs from its last value
    assert "(ends no higher). Here: does not agree;" in fig.render(flipped, "x.json")


def test_a_fedprox_synthetic_run_records_its_bytes_and_every_local_work_count():
    """`one` keeps the last record's totals: the sampled clients' bytes (2 rounds x 10 clients x a 610-value float64
    vector, once each way for FedAvg, twice for SCAFFOLD) and each `scripts.harness.LOCAL_WORK` count (20 passes a
    client a round, no second-order work)."""
    from scripts.bench_fedprox_synthetic import LOCAL, one

    for method, vectors in (("fedavg", 1), ("scaffold", 2)):
        run = one("synthetic_1_1", method, 2, 10, 0, LOCAL)
        assert (run["uplink_bytes"], run["downlink_bytes"]) == (vectors * 2 * 10 * 4880, vectors * 2 * 10 * 4880)
        assert {key: run[key] for key in harness.LOCAL_WORK} == {"local_passes": 400.0, "local_hvps": 0.0,
                                                          "local_hessians": 0.0, "local_factorizations": 0.0}


def test_the_fedprox_synthetic_caption_says_what_ran_and_the_second_table_what_it_cost():
    """K is the most local steps a solve takes (S-DANE's stops at its accuracy test) and the passes per sampled
    client and round are the JSON's (S-DANE's 1123 over 10 rounds x 10 clients: 11.2, the others' 20); the second
    table gives each run's bits (8 x bytes) and local work; a file that predates the counts says so, a run that
    lacks one in a file that has it says so in its cell."""
    from dane.paper_figs import fedprox_synthetic as fig

    section = canned("fedprox_synthetic")["fedprox_synthetic"]
    text = fig.render(section, "tests/data/bench/fedprox_synthetic.json")
    assert ("every local solve at most K = 20 full-gradient steps at lr 0.01 (S-DANE's stopping once its accuracy "
            "test holds); local passes (full local gradients: the steps' and any other the round takes) per sampled "
            "client and round: FedAvg, FedProx μ=1, FedDANE, SCAFFOLD 20; S-DANE 11.2.") in text
    assert "every local solve 20 full-gradient steps" not in text
    assert ("| setting | method | rounds | uplink bits | downlink bits | local passes | HVPs | Hessians | "
            "factorizations | local passes per client and round |") in text
    assert "| Synthetic(1,1) | FedAvg | 10 | 3904000 | 3904000 | 2000 | 0 | 0 | 0 | 20 |" in text
    assert "| Synthetic(1,1) | S-DANE | 10 | 11712000 | 7808000 | 1123 | 0 | 0 | 0 | 11.2 |" in text
    assert fig.UNRECORDED not in text
    old = {**section, "runs": [{k: v for k, v in r.items() if k in ("setting", "method", "algorithm", "keys", "status",
                                                                      "rounds", "objective", "local_passes")}
                               for r in section["runs"]]}
    text = fig.render(old, "x.json")
    assert "| Synthetic(1,1) | FedAvg | 10 | 2000 | 20 |" in text
    assert ("Uplink bits, downlink bits, HVPs, Hessians, factorizations: not recorded in this evidence (its runs "
            "predate these counts; the benchmark records them now).") in text
    mixed = {**section, "runs": [*old["runs"][:1], *section["runs"][1:]]}  # a kept run of an older file
    assert "| Synthetic(1,1) | FedAvg | 10 | " + " | ".join([fig.UNRECORDED] * 2) + " | 2000 | " + \
        " | ".join([fig.UNRECORDED] * 3) + " | 20 |" in fig.render(mixed, "x.json")
    bare = {**old, "runs": [{**r, "local_passes": None} for r in old["runs"]]}
    assert f"per sampled client and round: FedAvg, FedProx μ=1, FedDANE, S-DANE, SCAFFOLD {fig.UNRECORDED}." in \
        fig.render(bare, "x.json")


def test_the_fedprox_synthetic_figure_names_its_setting_from_the_json():
    """The suptitle is the section's setting (the settings drawn, λ, clients and those sampled, K local steps, rounds),
    so the 20-step and the 322-step figures differ on the image, not only by their x axis."""
    import matplotlib.pyplot as plt

    from dane.paper_figs import fedprox_synthetic as fig

    section = canned("fedprox_synthetic")["fedprox_synthetic"]
    drawn = fig.draw(section)
    heading = ("FedProx's Synthetic(α, β) data, Synthetic(1,1): softmax regression (λ = 0.001, intercept), seed 0 "
               "30 clients, 10 sampled a round, 10 rounds; every local solve at most K = 20 full-gradient steps at lr "
               "0.01 (S-DANE's stopping once its accuracy test holds); local passes (full local gradients: the steps' "
               "and any other the round takes) per sampled client and round: FedAvg, FedProx μ=1, FedDANE, SCAFFOLD "
               "20; S-DANE 11.2")
    assert " ".join(drawn.get_suptitle().split()) == heading == " ".join(fig.title(section).split())
    longer = {**section, "local": {**section["local"], "local_steps": 322}, "rounds": 100}
    long_figure = fig.draw(longer)
    long_title = " ".join(long_figure.get_suptitle().split())
    assert "100 rounds; every local solve at most K = 322 full-gradient steps at lr 0.01" in long_title
    plt.close(drawn)
    plt.close(long_figure)


# ------------------------------------------------------------------ the horovod and scaling sections' arithmetic
# scripts/bench_scaling.py's ceilings on hand-made runs and its side-by-side launches (never timed here);
# scripts/bench_horovod.py's simulated round (``simulator_error``): steady rounds, and the cost model's share exactly.
def test_ceiling_is_twice_the_lone_round_over_the_round_beside_a_twin():
    from scripts import bench_scaling as scaling

    done = {"status": "max_rounds"}
    runs = [{"np": 1, "repeat": 0, "round_s": 3.0, **done}, {"np": 2, "repeat": 0, "round_s": 1.7, **done},
            {"np": "twin", "repeat": 0, "round_s": 3.2, **done}, {"np": "twin", "repeat": 0, "round_s": 3.4, **done},
            {"np": 1, "repeat": 1, "round_s": 2.8, **done},
            {"np": "twin", "repeat": 1, "status": "launch_failed"},
            {"np": 1, "repeat": 2, "status": "launch_failed"},
            {"np": "twin", "repeat": 2, "round_s": 9.0, **done}, {"np": "twin", "repeat": 2, "round_s": 9.0, **done}]
    out = scaling.mnist_ceiling(runs)
    # repeat 1 has no twins and repeat 2 no lone run: only repeat 0 pairs up, with the twins' mean 3.3
    assert out["ceiling"] == pytest.approx(2 * 3.0 / 3.3, rel=1e-15)
    assert out["ceiling_per_repeat"]["n"] == 1
    assert out["twin_round_s"]["median"] == pytest.approx(3.3, rel=1e-15)
    assert out["slowdown_beside_twin"] == pytest.approx(3.3 / 3.0, rel=1e-15)
    assert scaling.mnist_ceiling([{"np": 1, "repeat": 0, "round_s": 3.0, **done}]) == {"ceiling": None}


def test_ridge_ceiling_is_the_lone_time_over_half_the_setup_beside_a_twin_plus_the_lone_rounds():
    from scripts import bench_scaling as scaling

    done = {"status": "converged"}
    runs = [{"np": 1, "repeat": 0, "setup_s": 2.0, "time_s": 0.1, **done}, {"np": 2, "repeat": 0, "setup_s": 1.2,
                                                                            "time_s": 0.3, **done},
            {"np": "twin", "repeat": 0, "setup_s": 2.4, "time_s": 0.1, **done},
            {"np": "twin", "repeat": 0, "setup_s": 2.6, "time_s": 0.1, **done},
            {"np": 1, "repeat": 1, "setup_s": 2.2, "time_s": 0.1, **done},
            {"np": "twin", "repeat": 1, "status": "launch_failed"}]
    out = scaling.ridge_ceiling(runs)
    # only repeat 0 has twins (mean setup 2.5): (2.0 + 0.1) / (2.5 / 2 + 0.1)
    assert out["ceiling"] == pytest.approx(2.1 / 1.35, rel=1e-15)
    assert out["ceiling_per_repeat"]["n"] == 1
    assert out["twin_setup_s"]["median"] == pytest.approx(2.5, rel=1e-15)
    assert out["setup_slowdown_beside_twin"] == pytest.approx(2.5 / 2.0, rel=1e-15)
    assert scaling.ridge_ceiling(runs[:2]) == {"ceiling": None}


@pytest.mark.needs_horovod  # horovodrun -np 1, twice
@pytest.mark.skipif(len(__import__("os").sched_getaffinity(0)) < 2, reason="needs two usable cores")
@pytest.mark.slow
def test_side_by_side_runs_each_hold_one_core_of_their_own(tmp_path):
    import os

    from dane.synthetic.launchers import horovodrun_side_by_side

    files = [tmp_path / f"probe{k}.jsonl" for k in range(2)]
    horovodrun_side_by_side("tests.comm_probe", [[str(f)] for f in files], timeout=300)
    records = [json.loads(f.read_text()) for f in files]
    assert [r["size"] for r in records] == [1, 1]
    assert [r["cores"] for r in records] == [[c] for c in sorted(os.sched_getaffinity(0))[:2]]
    assert [r["threads"] for r in records] == [1, 1]  # the package gives a rank one thread per core of its block


@pytest.mark.needs_horovod
@pytest.mark.slow
def test_side_by_side_reports_which_run_failed(tmp_path):
    from dane.synthetic.launchers import horovodrun_side_by_side

    with pytest.raises(RuntimeError, match="exited with"):
        horovodrun_side_by_side("tests.comm_probe", [[str(tmp_path / "ok.jsonl")], ["/no/such/dir/x.jsonl"]],
                                timeout=300)
    assert json.loads((tmp_path / "ok.jsonl").read_text())["allreduce_err"] == 0.0  # the other run still finished


def test_simulated_round_is_the_steady_round_with_the_models_communication(tmp_path):
    """DANE at m = 2 reaches the optimum within a few rounds, where the default stopping test would end the run;
    the real launches time rounds that keep going on cached factors, so the simulated round must too.  Its
    communication is the α-β model's: two ring allreduces a round (the gradient with the problem's metrics and
    the safeguard's objective, then the iterate: d = 500) and round 0's evaluation (`Algorithm.evaluate`: the
    gradient with the metrics), T(n) = n/β + 2α at m = 2."""
    from dane.comm import AlphaBeta
    from dane.problems import RidgeSyntheticConfig
    from dane.records.results import read_rounds
    from scripts import bench_horovod as horovod

    cost = AlphaBeta(alpha=1e-3, beta=1e9)
    n_rounds = 12
    sim = horovod.simulated_round(cost, n_rounds, tmp_path)
    metrics = len(RidgeSyntheticConfig().build(0, 2).metric_names)
    per_round = cost.allreduce_time(8 * (500 + metrics + 1), 2) + cost.allreduce_time(8 * 500, 2)
    expected_comm = (n_rounds * per_round + cost.allreduce_time(8 * (500 + metrics), 2)) / n_rounds
    assert sim["comm_s"] == pytest.approx(expected_comm, rel=1e-12)
    assert sim["compute_s"] > 0 and sim["round_s"] > per_round
    run_dir, = [p for p in tmp_path.iterdir() if p.name.startswith("sim_")]
    records = read_rounds(run_dir)
    assert [r["round"] for r in records] == list(range(n_rounds + 1))  # no stopping test ended it early


def test_pair_k_draws_calibration_ks_tail(tmp_path):
    """``error_with_tail``: pair k's simulator draws calibration k's tail.  Calibration 0's phases exceed α-β by
    exactly c each, calibration 1's by 0: pair 0 then pays α-β + c for every allreduce (round 0's one and two a
    round), pair 1 α-β alone."""
    from dane.comm import AlphaBeta
    from dane.comm.tail import tail_entry
    from scripts import bench_horovod as horovod

    cost = AlphaBeta(alpha=1e-3, beta=1e9)
    c, n_rounds, n = 2.5e-3, 4, 20

    def calibration(excess: float) -> dict:
        phases = {"wall_s": [1e-3 + cost.allreduce_time(4000, 2) + excess] * n, "cpu_s": [1e-3] * n,
                  "nbytes": [4000] * n}
        return {"alpha": cost.alpha, "beta": cost.beta,
                "tail": tail_entry(phases, cost, 2, machine={"host": "h", "load_avg": [0.0] * 3}, launcher="l", np=2,
                                   measured_at="now")}

    timings = [{"means": {"round_s": 0.01}}] * 2
    pair0, pair1 = horovod.with_tail(timings, [calibration(c), calibration(0.0)], n_rounds, tmp_path)
    plain = horovod.simulated_round(cost, n_rounds, tmp_path)["comm_s"]
    assert pair0["simulated_comm_s_with_tail"] == pytest.approx(plain + c * (2 * n_rounds + 1) / n_rounds, rel=1e-9)
    assert pair1["simulated_comm_s_with_tail"] == pytest.approx(plain, rel=1e-9)
    assert pair0["tail_samples"] == pair1["tail_samples"] == n


def test_counts_declare_the_count_flags_a_section_spelled_out():
    """`harness.counts`: ``--NAME`` (dashes for underscores), `harness.count`'s type and the default, in order; the
    parser then refuses 0 as it did (exit 2)."""
    assert harness.counts(rounds=10, local_steps=3) == (harness.option("--rounds", type=harness.count, default=10),
                                                        harness.option("--local-steps", type=harness.count, default=3))
    toy = {"toy": harness.Bench("toy", lambda run: {}, "a toy", options=harness.counts(batch_size=32))}
    assert harness.parser(toy).parse_args(["toy"]).batch_size == 32
    with pytest.raises(SystemExit) as exit_:
        harness.parser(toy).parse_args(["toy", "--batch-size", "0"])
    assert exit_.value.code == 2


def test_steady_rounds_leave_out_rounds_zero_and_one():
    records = [{"time_s": t} for t in (0.0, 5.0, 6.0, 7.5, 8.5)]  # round 1 factors: 5 s; then 1, 1.5, 1
    assert harness.steady(records) == [1.0, 1.5, 1.0]
    assert harness.steady(records, 0) == [5.0, 1.0, 1.5, 1.0]  # every round (bench_load's short runs, bench_svrg's)
    assert harness.steady(records[:2]) == [] and harness.steady(records[:2], 0) == [5.0]


def test_np1_over_np2_is_the_ratio_of_medians_and_of_each_repeats_pair():
    """The ridge's and MNIST's ratios: medians over the launches that ran, and per repeat the pair launched side by
    side; a failed launch is counted, never paired."""
    from scripts import bench_scaling as scaling

    def launch(np, repeat, t):
        return {"np": np, "repeat": repeat, "status": "converged", "time_to_tol_s": t, "launcher_wall_s": t + 1,
                "setup_s": 0.5, "time_s": t - 0.5, "rounds": 3, "round_s": t}

    runs = [launch(1, 0, 4.0), launch(2, 0, 2.0), launch(1, 1, 6.0), launch(2, 1, 4.0),
            {"np": 2, "repeat": 2, "status": "launch_failed"}]
    ridge = scaling.summarize(runs, goal=1.5)
    assert ridge["launches_failed"] == 1 and ridge["np2"]["time_to_tol_s"]["n"] == 2
    assert ridge["ratio_time_to_tol"] == pytest.approx(5.0 / 3.0, rel=1e-15) and ridge["goal_met"]
    assert ridge["ratio_time_to_tol_per_repeat"] == {"median": 1.75, "min": 1.5, "max": 2.0, "n": 2}
    assert ridge["ratio_launcher_wall"] == pytest.approx(6.0 / 4.0, rel=1e-15)
    mnist = scaling.mnist_ratio(runs)
    assert mnist["ratio"] == pytest.approx(5.0 / 3.0, rel=1e-15) and mnist["ratio_per_repeat"]["n"] == 2
    assert scaling.summarize(runs[:1], goal=None)["ratio_time_to_tol"] is None
    assert scaling.mnist_ratio(runs[:1]) == {"runs": runs[:1], "ratio": None}


# ---------------------------------------------------------------- federated_scale (scripts/bench_federated_scale.py)
# dane's FedAvg beside Flower, pfl and a NumPy loop on the same shards (federated_scale.json: a real --quick run);
# the peers' shared arithmetic (scripts/peers/peer_common.py, NumPy alone) against dane's own shard, in this process.
def test_danes_rounds_leave_out_the_final_evaluations_line(tmp_path):
    """dane's progress line k comes during round k + 1 (its metrics ride in that round's first allreduce), the last
    after the final evaluation alone: R + 1 lines give R − 1 whole rounds (the last interval read as the fastest)."""
    from scripts.bench_federated_scale import dane_rounds

    (tmp_path / "summary.json").write_text(json.dumps({"final_objective": 0.5, "wall_time_s": 3.0}))
    head = "round     time_s  bytes_sent       objective"
    rows = [(0.0, head), (1.0, "    0     0.0045         48B  6.16e+00"), (2.0, "    1     0.0090        144B  1.0e+00"),
            (3.5, "    2     0.0130        240B  1.0e+00"), (3.6, "    3     0.0131        336B  1.0e+00")]
    assert dane_rounds(rows, tmp_path)["round_s"] == [1.0, 1.5]


def federated_scale_arithmetic(section: dict) -> None:
    from scripts.bench_federated_scale import AGREE, goals, misses

    for name, setting in section["settings"].items():
        reference = setting["frameworks"]["numpy"]["objective"]
        full = setting["per_round"] >= setting["clients"]
        for framework, row in setting["frameworks"].items():
            for run in row["runs"]:  # rounds 2..R; the first apart (where Flower starts Ray's workers)
                seconds = run["round_seconds"]
                assert run["rounds"] == len(seconds) == section["rounds"] and run["first_round_s"] == seconds[0]
                assert (run["round_s"], run["round_s_min"], run["round_s_max"]) == \
                    (statistics.median(seconds[1:]), min(seconds[1:]), max(seconds[1:]))
            assert row["round_s"] == statistics.median(r["round_s"] for r in row["runs"])
            assert row["round_s_min"] <= row["round_s"] <= row["round_s_max"]
            assert row["peak_gib"] == max(max(r["peak_tree_gib"], r["peak_rss_gib"]) for r in row["runs"])
            if framework != "numpy":
                agree = setting["agreement"][framework]
                assert agree["rel_diff"] == abs(row["objective"] - reference) / abs(reference), (name, framework)
                assert agree["tol"] == AGREE["float32" if full and framework == "pfl" else "full" if full else "sampled"]
                assert agree["agree"] == (agree["rel_diff"] <= agree["tol"])
    for goal in section["goals"]:
        rows = section["settings"][goal["setting"]]["frameworks"]
        peer = "pfl" if "pfl's" in goal["goal"] else "numpy"
        assert goal["value"] == rows["dane"]["round_s"] / rows[peer]["round_s"]
        assert goal["met"] == (goal["value"] <= goal["target"])
    assert section["goals"] == goals(section["settings"], section["rounds"])
    assert section["misses"] == misses(section)


SECTIONS["federated_scale"] = (
    "federated_scale", {"started_at", "machine", "quick", "rounds", "seed", "dane_device", "workload", "peers", "skipped",
                        "settings", "goals", "misses", "load_avg_after", "wall_s"}, federated_scale_arithmetic)


def test_federated_scale_quick_reaches_one_objective_and_records_its_launches():
    """The --quick run: the two phishing settings, 5 rounds, every framework once; with all 100 clients a round dane,
    Flower and the NumPy loop reach one objective to 1e-10 and pfl to its float32 differences; every launch kept its
    load average, exit status 0 and one step 1/max_i L_i for all."""
    section = canned("federated_scale")["federated_scale"]
    assert list(section["settings"]) == ["phishing_100", "phishing_1000"] and section["quick"]
    assert {name: "version" in peer for name, peer in section["peers"].items()} == {"flower": True, "pfl": True}
    full = section["settings"]["phishing_100"]
    assert (full["rows"], full["features"], full["clients"], full["per_round"]) == (11055, 68, 100, 100)
    assert full["agreement"]["dane"]["rel_diff"] <= 1e-10 and full["agreement"]["flower"]["rel_diff"] <= 1e-10
    assert full["agreement"]["pfl"]["rel_diff"] <= 1e-6
    for setting in section["settings"].values():
        assert list(setting["frameworks"]) == ["dane", "flower", "pfl", "numpy"]
        for row in setting["frameworks"].values():
            assert all(run["exit_status"] == 0 and len(run["load_before"]) == 3 for run in row["runs"])


def peer_common():
    import importlib.util

    spec = importlib.util.spec_from_file_location("peer_common", REPO / "scripts" / "peers" / "peer_common.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_peers_take_dane_s_local_steps_and_objective(tmp_path):
    """The peers' clients are the rows of one client value in file order (dane's client column); a local step is
    w − lr ∇O_i(w) with dane's O_i = (m/N) Σ_{j∈i} f_j + (λ/2)‖w‖² (its `LinearModelShard`, labels ±1), and the
    objective O(w) = (1/m) Σ_i O_i(w)."""
    import torch

    from dane.losses import LOSSES
    from dane.problems.glm import LinearModelShard

    peers, rng = peer_common(), np.random.default_rng(3)
    X, y = rng.standard_normal((7, 3)), np.array([1.0, 0, 0, 1, 1, 0, 1])
    client = np.array([2, 0, 1, 0, 2, 1, 2])
    np.savez(tmp_path / "shards.npz", X=X, y=y, client=client)
    parts, rows, labels = peers.clients(str(tmp_path / "shards.npz"))
    for i, (Xi, yi) in enumerate(parts):
        assert np.array_equal(Xi, X[client == i]) and np.array_equal(yi, y[client == i])
    assert np.array_equal(rows, np.concatenate([X[client == i] for i in range(3)]))
    m, lam, lr, w = 3, 1e-2, 0.3, rng.standard_normal(3)
    shards = [LinearModelShard(torch.from_numpy(Xi), torch.from_numpy(2 * yi - 1), LOSSES["logistic"], l2=lam,
                               weight=m / len(y)) for Xi, yi in parts]
    for (Xi, yi), shard in zip(parts, shards):
        stepped = peers.local_steps(w, Xi, yi, weight=m / len(y), lam=lam, lr=lr, steps=2)
        once = w - lr * shard.grad(torch.from_numpy(w)).numpy()
        assert np.allclose(stepped, once - lr * shard.grad(torch.from_numpy(once)).numpy(), rtol=1e-14, atol=1e-15)
    dane_objective = sum(float(s.objective(torch.from_numpy(w))) for s in shards) / m
    assert peers.objective(w, rows, labels, lam) == pytest.approx(dane_objective, rel=1e-14)



def test_fednl_public_records_the_references_own_commit_and_refuses_a_given_one_git_contradicts(tmp_path):
    """scripts/peers/fednl_public.py's --reference commit: git's HEAD only where the folder is the top of its own
    work tree (a folder inside another repository would give that one's HEAD), a --commit there checked against it;
    elsewhere --commit as given (``commit_source`` says which), or none."""
    from scripts.peers.fednl_public import reference_commit

    ref, head, other = tmp_path / "ref", "a" * 40, "b" * 40
    ref.mkdir()
    (tmp_path / "link").symlink_to(ref)
    assert reference_commit(str(ref), str(ref), head, None) == (head, "git")
    assert reference_commit(str(tmp_path / "link"), str(ref), head, head) == (head, "git")
    with pytest.raises(SystemExit, match=rf"^error: --commit {other} is not --reference {ref}'s HEAD {head}; "
                                         rf"check out {other} there, or drop --commit$"):
        reference_commit(str(ref), str(ref), head, other)
    inside = ref / "sub"  # a copy unpacked inside another repository: that repository's HEAD is not its commit
    assert reference_commit(str(inside), str(ref), head, None) == (None, None)
    assert reference_commit(str(inside), str(ref), head, other) == (other, "given")
    assert reference_commit(str(ref), None, None, other) == (other, "given")  # a plain folder
    assert reference_commit(str(ref), None, None, None) == (None, None)

def test_the_federated_scale_figure_is_drawn_from_the_json_alone(tmp_path):
    from dane.paper_figs import federated_scale as fig

    section = canned("federated_scale")["federated_scale"]
    (tmp_path / "bench.json").write_text(json.dumps({"federated_scale": section}))
    written = fig.main(["--json", str(tmp_path / "bench.json"), "--out", str(tmp_path / "out")])
    assert sorted(p.name for p in written) == ["federated_scale." + ext for ext in ("json", "md", "pdf", "png")]
    table = (tmp_path / "out" / "federated_scale.md").read_text()
    numpy_row = section["settings"]["phishing_100"]["frameworks"]["numpy"]
    assert f"| phishing_100 | numpy | {numpy_row['version']} | {numpy_row['round_s']:.3g} [" in table
    assert table.count("| phishing_1000 |") == 4 + sum(g["setting"] == "phishing_1000" for g in section["goals"])
    sidecar = json.loads((tmp_path / "out" / "federated_scale.json").read_text())
    assert sidecar["json"] == [str(tmp_path / "bench.json")]
    assert sidecar["benchmarks"][0]["machine"] == section["machine"]
    with pytest.raises(FileNotFoundError, match="run `make bench`"):
        fig.main(["--json", str(tmp_path / "empty.json"), "--out", str(tmp_path / "out")])


# ------------------------------------------------------------------ compressed (issue 49 item 4)
def compressed_arithmetic(section: dict) -> None:
    """A cell reached the target iff its best relative suboptimality is at most it (else it missed by best/target);
    its work is its curve's at that round, bits down add to bits up, one pass a round per node (every quick method
    reads its shard once a round) and FedNL one Hessian; GD's uncompressed messages cost the same bits every round;
    absent rows are one line each; the run is its one part, its command the quick one."""
    from scripts.bench_compressed import METHODS, QUICK, claims

    cells = section["cells"]["phishing"]
    assert section["quick"] and list(cells) == list(QUICK)
    for method, c in cells.items():
        if c["status"] == "absent":
            assert set(c) == {"method", "algorithm", "status", "error"}
            assert c["error"] == f"not run: {METHODS[method][0]} absent"
            continue
        assert c["reached"] == (c["best_rel"] <= section["target"]) and c["rounds"] <= c["round_cap"]
        assert c["missed_by"] == (None if c["reached"] else pytest.approx(c["best_rel"] / section["target"]))
        curve = c["curve"]
        assert curve["round"][-1] == c["rounds"] and curve["uplink_bits"][-1] == c["uplink_bits"]
        assert c["total_bits"] >= c["uplink_bits"] and c["local_passes"] == c["rounds"]
        assert c["hessian_share"] == (1.0 if method.startswith("fednl") else 0.0)
        assert all(len(curve[k]) == len(curve["round"]) for k in ("rel", "uplink_bits", "total_bits"))
        assert curve["uplink_bits"] == sorted(curve["uplink_bits"])
    gd = cells["gd"]["curve"]
    steps = {round(b - a) / (r1 - r0) for a, b, r0, r1 in
             zip(gd["uplink_bits"][2:], gd["uplink_bits"][3:], gd["round"][2:], gd["round"][3:])}
    assert len(steps) == 1
    assert section["claims"] == claims("phishing", cells)
    (part,) = section["parts"]
    assert part["command"] == "python -m scripts.bench compressed --out tests/data/bench/compressed.json --quick" and part["finished"]
    assert (part["datasets"], part["methods"]) == (["phishing"], list(QUICK))


SECTIONS["compressed"] = (
    "compressed", {"started_at", "machine", "quick", "target", "lam", "seed", "parts", "clients", "cells", "claims",
                   "misses", "load_avg_after", "wall_s"}, compressed_arithmetic)


def test_the_compressed_claims_follow_from_the_numbers():
    """FedNL's claim holds where it reaches the target on fewer bits, or where DIANA never does; fails by the ratio
    where it spends more; is undecided where neither reaches it; is not run where a row is absent."""
    from scripts.bench_compressed import claims

    def c(reached, bits, **extra):
        curve = {"round": [0, 50, 100], "rel": [1.0, 1e-2, 1e-4], "uplink_bits": [0.0, bits / 2, bits]}
        return {"status": "converged" if reached else "max_rounds", "reached": reached, "uplink_bits": bits,
                "total_bits": 2 * bits, "best_rel": 1e-13 if reached else 1e-4, "rounds": 100, "curve": curve, **extra}

    def first(cells):
        return claims("x", cells)[0]

    assert first({"fednl_topk": c(True, 10.0), "diana": c(True, 20.0)})["holds"] is True
    assert first({"fednl_topk": c(True, 10.0), "diana": c(False, 50.0)})["holds"] is True
    short = first({"fednl_topk": c(True, 10.0), "diana": c(False, 5.0)})  # DIANA stopped before it spent as much
    assert short["holds"] is None and short["text"].startswith("undecided: diana missed the target on fewer bits")
    # its last half fell 2 decades on 2.5 bits: 8 more decades to 1e-12 are 10 more bits, 15 in all
    assert "diana more than 5 (best 0.0001 at the cap; about 15 at its last-half rate)" in short["text"]
    miss = first({"fednl_topk": c(True, 30.0), "diana": c(True, 20.0)})
    assert miss["holds"] is False and miss["text"].endswith("1.5x diana's")
    assert first({"fednl_topk": c(False, 30.0), "diana": c(False, 20.0)})["holds"] is None
    gone = claims("x", {"fednl_topk": c(True, 1.0), "newton_3pc_bag": {"status": "absent"}})[3]
    assert gone == {"dataset": "x", "claim": gone["claim"], "holds": None, "text": "not run: newton_3pc_bag absent"}
    lazy = claims("x", {"fednl_topk": c(True, 10.0), "newton_3pc_bag": c(True, 10.0, hessian_share=0.25)})[3]
    assert lazy["holds"] is True and lazy["text"].endswith("25.0% of its rounds per node; uplink bits/node 10, "
                                                           "fednl_topk 10")
    over = claims("x", {"fednl_topk": c(True, 10.0), "newton_3pc_bag": c(True, 15.0, hessian_share=0.3)})[3]
    assert over["holds"] is False and over["text"].endswith(": 1.2x a quarter of its rounds, 1.5x fednl_topk's bits")
    short = claims("x", {"fednl_topk": c(True, 10.0), "newton_3pc_bag": c(False, 5.0, hessian_share=0.2)})[3]
    assert short["holds"] is False and short["text"].endswith(": no target")


def test_the_compressed_rows_show_the_second_order_work_per_node():
    """`bench_compressed.per_node`: every local-work count over m (None where not counted); a row shows passes, HVPs,
    Hessians and factorizations per node, a missed cell each after >, a count it did not record —."""
    from dane.paper_figs.compressed import row
    from scripts.bench_compressed import per_node

    (node,) = per_node([{"uplink_bits": 64, "downlink_bits": 32, "local_passes": 40.0, "local_hvps": 0,
                         "local_hessians": 24, "local_factorizations": 6}], 4)
    assert node == {"uplink_bits": 64.0, "total_bits": 96.0, "local_passes": 10.0, "local_hvps": 0.0,
                    "local_hessians": 6.0, "local_factorizations": 1.5}
    assert per_node([{"uplink_bits": 8, "local_passes": 4.0}], 2)[0]["local_hessians"] is None
    cell = {"algorithm": "dane", "keys": {}, "reached": True, "rounds": 8, "uplink_bits": 7.22e4, "total_bits": 1.44e5,
            "local_passes": 64.6, "local_hvps": 0.0, "local_hessians": 8.0, "local_factorizations": 23 / 3}
    assert row(cell) == "| DANE | 8 | 7.22e+04 | 1.44e+05 | 64.6 | 0 | 8 | 7.67 | |"
    missed = {**cell, "reached": False, "best_rel": 1e-9, "missed_by": 1e3}
    del missed["local_hvps"]
    assert row(missed) == ("| DANE | > 8 | > 7.22e+04 | > 1.44e+05 | > 64.6 | — | > 8 | > 7.67 | best 1e-09 (1e+03x "
                           "the target) at the cap |")
    # a count the cell never makes is 0 by the cap and at any later round: not "> 0"
    first_order = {**missed, "algorithm": "gd", "local_hvps": 0.0, "local_hessians": 0.0, "local_factorizations": 0.0}
    assert row(first_order).startswith("| GD | > 8 | > 7.22e+04 | > 1.44e+05 | > 64.6 | 0 | 0 | 0 | best")


@pytest.fixture(scope="module")
def compressed_drawn(tmp_path_factory):
    """``python -m dane.paper_figs.compressed --json tests/data/bench/compressed.json --page PAGE`` in-process, once
    for the tests that read what it wrote (``out``, ``page``, ``paths``) or the figure it drew (``drawn``: each
    (section, figure) that `compressed.draw` was called with and returned)."""
    from dane.paper_figs import compressed as fig

    out, drawn, real = tmp_path_factory.mktemp("compressed"), [], fig.draw
    page = out / "page.md"
    page.write_text(f"x\n{fig.BEGIN}\nold\n{fig.END}\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fig, "draw", lambda section: drawn.append((section, real(section))) or drawn[-1][1])
        paths = fig.main(["--json", str(DATA / "compressed.json"), "--out", str(out), "--page", str(page)])
    return {"out": out, "page": page, "paths": paths, "drawn": drawn}


def test_the_compressed_figure_and_table_come_from_the_canned_json(tmp_path, compressed_drawn):
    """Each present cell is a row of its numbers (a missed one with > and its factor), absent rows one line at the
    end, each claim a line; the figure draws one row of the four panels per dataset."""
    from dane.paper_figs import compressed as fig

    section = canned("compressed")["compressed"]
    section["cells"]["phishing"]["nl1"] = {"method": "nl1", "algorithm": "nl1", "status": "absent",
                                           "error": "not run: nl1 absent"}
    text = fig.render(section, "tests/data/bench/compressed.json")
    gd = section["cells"]["phishing"]["gd"]
    assert (f"| GD | > {gd['rounds']} | > {gd['uplink_bits']:.3g} | > {gd['total_bits']:.3g} | > "
            f"{gd['local_passes']:.3g} | — | — | — | best {gd['best_rel']:.2g} ({gd['missed_by']:.2g}x the target) at "
            "the cap |" in text)  # the canned run predates the second-order counts
    assert "| FedNL (TopK) | " in text and "| DIANA | " in text and text.endswith("Not run: phishing nl1 absent.")
    # rounds are whole numbers, never e-notation: 1964 rounds to the target, > 3000 at a cap of 3000
    cells = section["cells"]["phishing"]
    reached, missed = {**cells["fednl_topk"], "reached": True, "rounds": 1964}, {**gd, "rounds": 3000}
    assert fig.row(reached).startswith("| FedNL (TopK) | 1964 | ") and fig.row(missed).startswith("| GD | > 3000 | ")
    assert "round caps 30 (FedNL (TopK), FedNL-BC, DIANA, GD)." in text and "(1 run from " in text
    assert fig.label({"algorithm": "fednl", "keys": {"compressor": "rank:1"}}) == "FedNL (rank-1)"
    assert fig.label({"algorithm": "newton_3pc", "keys": {"mechanism": "bag", "p": 0.25}}) == "Newton-3PC (bag, p = 0.25)"
    assert text.count("\n- phishing: ") == len(section["claims"]) == 4
    tmp_path, page, paths = compressed_drawn["out"], compressed_drawn["page"], compressed_drawn["paths"]
    assert (tmp_path / "compressed.png").stat().st_size > 10_000 and len(paths) == 4
    sidecar = json.loads((tmp_path / "compressed.json").read_text())  # the JSON it was drawn from, as the repo names it
    assert sidecar["json"] == ["tests/data/bench/compressed.json"] and "tests/data/bench/compressed.json (" in \
        sidecar["caption"]
    assert sidecar["caption"].startswith("The FedNL paper's comparison, relative suboptimality against bits, rounds "
                                         f"and local passes; {fig.PASSES_ONLY}; from ")
    assert fig.render(canned("compressed")["compressed"], str(DATA / "compressed.json")) in page.read_text()


def test_an_evidence_figures_sidecar_names_the_commands_that_made_its_json_and_the_span_of_its_parts(tmp_path):
    """The sidecar's commands are the ones that wrote the file: compressed.json's parts (its own record), the
    k322 run's row of docs/design.md's Evidence table (a file that records none), the section's bare command for a
    file of neither; a file written in parts is dated by its first and last part, not by the last part's start."""
    from dane.paper_figs import fedprox_synthetic
    from dane.paper_figs.provenance import bench_caption, bench_provenance, bench_section

    evidence = REPO / "paper_figs" / "evidence"
    compressed = bench_section(evidence / "compressed.json", "compressed")
    sidecar = bench_provenance([evidence / "compressed.json"], [compressed], "python -m scripts.bench compressed")
    (run,) = sidecar["benchmarks"]
    parts = compressed["parts"]  # the tracked file grows a part at each rerun: its numbers are read from it here
    assert len(parts) >= 3 and sidecar["commands"] == run["commands"] == [part["command"] for part in parts]
    assert all(command.startswith("python -m scripts.bench compressed --out paper_figs/evidence/compressed.json "
                                  "--datasets ") for command in run["commands"])
    first, last = min(p["started_at"] for p in parts), max(p["started_at"] for p in parts)  # the span, in any order
    assert first != last and run["dates"] == [first, last] and "started_at" not in run
    loads = [load for part in parts for load in (part["load_avg_before"][0], part["load_avg_after"][0])]
    assert run["load_avg_1min"] == [min(loads), max(loads)]
    assert run["wall_s"] == round(sum(part["wall_s"] for part in parts), 1)
    assert bench_caption("x", sidecar) == (f"x; from paper_figs/evidence/compressed.json ({len(parts)} runs started "
                                           f"{first} to {last}, load avg {min(loads):g}-{max(loads):g}).")
    sidecar = bench_provenance([evidence / "compressed.json"], [compressed], "python -m scripts.bench compressed",
                               codes=lambda section: [None])  # a figure names its rows' commits: here none recorded
    assert sidecar["commits"] == sidecar["benchmarks"][0]["commits"] == [] and sidecar["rows_without_commit"] == 1
    assert bench_caption("x", sidecar).endswith(f"load avg {min(loads):g}-{max(loads):g}; commit not recorded).")

    written = fedprox_synthetic.figure([evidence / "fedprox_synthetic_k322.json"], tmp_path, "fedprox_synthetic_long")
    long = json.loads((tmp_path / "fedprox_synthetic_long.json").read_text())
    assert tmp_path / "fedprox_synthetic_long.json" in written
    assert long["commands"] == ["scripts/bench_fedprox_synthetic.py --settings synthetic_1_1 --only fedavg fedprox "
                                "--local-steps 322 --rounds 100"]
    assert long["benchmarks"][0]["commands_from"] == "docs/design.md, Evidence"
    k322 = bench_section(evidence / "fedprox_synthetic_k322.json", "fedprox_synthetic")
    (commit,) = {run["code"]["git_commit"] for run in k322["runs"]}  # its two runs, one commit
    assert (f"(started {k322['started_at']}, load avg {k322['machine']['load_avg']}; measured at commit "
            f"{commit[:10]} (modified tree))") in long["caption"]
    assert long["commits"] == [f"{commit} (modified tree)"] and long["rows_without_commit"] == 0 and long["rows"] == 2

    elsewhere = tmp_path / "bench.json"  # a make bench file: no parts, no row; its options are not claimed
    elsewhere.write_text((evidence / "fedprox_synthetic_k322.json").read_text())
    made = bench_provenance([elsewhere], [bench_section(elsewhere, "fedprox_synthetic")], "python -m scripts.bench x")
    assert made["commands"] == [f"python -m scripts.bench x (its options are not recorded in {elsewhere})"]


def test_a_generated_header_names_the_commits_of_the_rows_it_shows():
    """Each generated table's header and each evidence figure's sidecar name the commit(s) of the rows shown: one,
    the distinct ones where rows differ ("(modified tree)" where a record says git_dirty), "not recorded" where rows
    record none.  federated_hard.json holds rows of 7 --only runs under the last run's section ``code``: its header
    named no commit, and a section-level commit would have named 1 for the rows of 7."""
    from dane.paper_figs import compressed, defaults_table, federated_scale, federated_table, fedprox_synthetic
    from dane.paper_figs.provenance import commits_text

    a, b = {"git_commit": "a" * 40, "git_dirty": True}, {"git_commit": "b" * 40, "git_dirty": False}
    assert commits_text([a, a]) == "Measured at commit aaaaaaaaaa (modified tree)."
    assert commits_text([b, a, None]) == ("Measured at commits aaaaaaaaaa (modified tree), bbbbbbbbbb; commit not "
                                          "recorded for 1 of 3 rows.")
    assert commits_text([None, {"git_commit": None, "git_dirty": None}]) == commits_text([]) == "Commit not recorded."

    evidence = REPO / "paper_figs" / "evidence"
    hard = json.loads((evidence / "federated_hard.json").read_text())["federated"]
    shown = [k for k, row in hard["rows"].items() if "default" in row]
    assert len(hard["runs"]) == 7 and hard["code"]["git_commit"].startswith("385b3e9")
    assert "). Commit not recorded. Setting hard" in federated_table.render(hard)
    alone = {**hard, "runs": hard["runs"][:1]}  # one run's section: its code is every row's
    assert "). Measured at commit 385b3e9627 (modified tree). Setting" in federated_table.render(alone)
    hard["rows"][shown[0]]["code"] = b  # a row of a new run names its own
    assert (f"). Measured at commit bbbbbbbbbb; commit not recorded for {len(shown) - 1} of {len(shown)} rows. "
            "Setting") in federated_table.render(federated_table.combine([hard]))

    defaults = json.loads((evidence / "defaults.json").read_text())["defaults"]  # a code on every method's row
    rows = [row["code"] for cell in defaults["cells"].values() for row in cell["methods"].values()]
    dirty = {c["git_commit"] for c in rows if c["git_dirty"]}
    names = [f"{c[:10]} (modified tree)" if c in dirty else c[:10] for c in sorted({c["git_commit"] for c in rows})]
    assert len(names) == 4 and f"). Measured at commits {', '.join(names)}. Target" in defaults_table.render(defaults)

    section = json.loads((evidence / "compressed.json").read_text())["compressed"]
    section["parts"] = [*section["parts"], {"datasets": ["w8a"], "methods": ["gd"], "code": b}]
    cells = sum(len(c) for c in section["cells"].values())
    assert compressed.codes(section).count(b) == 1 and len(compressed.codes(section)) == cells
    runs = json.loads((evidence / "fedprox_synthetic.json").read_text())["fedprox_synthetic"]["runs"]
    assert fedprox_synthetic.codes({"runs": [*runs, {"code": a}]}) == [run.get("code") for run in runs] + [a]
    old = [{k: v for k, v in run.items() if k != "code"} for run in runs]  # a file of runs that recorded none
    assert fedprox_synthetic.codes({"runs": old}) == [None] * len(runs)
    scale = [json.loads((evidence / f"federated_scale_{n}.json").read_text())["federated_scale"]
             for n in ("phishing", "synthetic")]
    sidecar = federated_scale.provenance(["p.json", "s.json"], scale)  # dane's rows name the commit they ran
    phishing, synthetic = (s["settings"][k]["frameworks"]["dane"]["version"] for s, k in
                           zip(scale, ("phishing_100", "synthetic_10k")))
    assert sidecar["commits"] == [phishing, synthetic] and sidecar["rows_without_commit"] == 0
    assert [run["commits"] for run in sidecar["benchmarks"]] == [[phishing], [synthetic]]
    assert phishing.startswith("44ddc6d572") and "; measured at commit 4919ac76f5)" in federated_scale.bench_caption(
        "x", sidecar)


def test_the_compressed_figure_has_one_legend_below_the_panels_and_a_title_from_the_json(compressed_drawn):
    """One figure-level legend, outside every panel (below their tick labels and x labels), one entry a method; the
    suptitle names λ, the datasets drawn with their clients m, and the target, as the JSON's section gives them.
    The figure is the one `compressed.main` drew of the canned section and saved (`compressed_drawn`)."""
    import matplotlib.pyplot as plt

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    ((section, drawn),) = compressed_drawn["drawn"]
    assert section == canned("compressed")["compressed"]
    FigureCanvasAgg(drawn)  # saved (its layout made then) and closed: a canvas of its own to measure it on
    axes = drawn.get_axes()
    assert len(axes) == 4 and all(ax.get_legend() is None for ax in axes) and len(drawn.legends) == 1
    (legend,) = drawn.legends
    assert [t.get_text() for t in legend.get_texts()] == ["FedNL (TopK)", "FedNL-BC", "DIANA", "GD"]
    renderer = drawn.canvas.get_renderer()
    assert legend.get_window_extent(renderer).y1 < min(ax.get_tightbbox(renderer).y0 for ax in axes)
    assert " ".join(drawn.get_suptitle().split()) == (
        "Logistic regression (λ = 0.001, intercept) on phishing (m = 100 clients): relative suboptimality "
        "(O(w) − O*)/|O*| against bits, rounds and local passes per node, log scales; the dashed line: the target "
        "1e-12; the local-passes panel counts gradient passes only: the table beside it has the HVPs, Hessians and "
        "factorizations per node")
    assert axes[0].get_ylabel() == "phishing (m = 100): (O(w) − O*)/|O*|"
    plt.close(drawn)


def test_the_fednl_evidence_names_each_rows_user_run_as_a_command_that_composes():
    """Each row of paper_figs/evidence/fednl.json names the ``dane train`` line it timed; the α row named its key
    (``topk:2408 alpha=0.02685``, two tokens) where the override is ``algorithm.compressor=topk:2408``."""
    from dane.synthetic.sweep import compose_job

    section = json.loads((REPO / "paper_figs" / "evidence" / "fednl.json").read_text())["fednl"]
    rows = [(name, key, row) for name, table in section["tables"].items() for key, row in
            table.get("compressors", {}).items()]
    assert len(rows) == 9
    for name, key, row in rows:
        command = row["user_path"]["command"].split()
        assert command[:2] == ["dane", "train"] and all("=" in token for token in command[2:]), (name, key)
        config = compose_job(tuple(command[2:]))
        assert config.algorithm.compressor == key.split()[0] and config.workers == section["tables"][name]["clients"]
        if "alpha=" in key:
            assert config.algorithm.alpha == pytest.approx(float(key.split("alpha=")[1]), rel=1e-3)
