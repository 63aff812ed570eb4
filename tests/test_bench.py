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


# ------------------------------------------------------------------ fedprox_synthetic (issue 47 item 2)
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


SECTIONS["fedprox_synthetic"] = (
    "fedprox_synthetic", {"started_at", "machine", "quick", "workers", "clients_per_round", "rounds", "seed", "lam",
                          "local", "runs", "load_avg_after", "wall_s"}, fedprox_synthetic_arithmetic)


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
