"""Benchmark: rounds, bytes and time to 97% test accuracy on MNIST-LeNet5, 4 workers, DANE and each baseline.

Real MNIST t10k (split 8,000 train / 2,000 test, seeded) from data_dir, LeNet-5, 4 workers
in the in-process simulator: 4 threads, one core each, whose simulated parallel time is
each worker's measured compute plus the α-β ring-allreduce model.  Not horovodrun -np 4:
on a 2-core machine 4 ranks would time-share the cores and the wall time would measure
that, not the algorithm.  The algorithms and their settings are those of
``paper_figs/target_table.py`` (each spends about one pass over its shard per round).
Each run stops at the target (``early_stop.target``) or after ``--rounds``.  The result
is merged into ``--out`` under ``mnist_lenet5_to_97``, whichever algorithm wins
(``--only`` reruns some algorithms and keeps the others' earlier rows).

    PYTHONPATH=. python scripts/bench_nn.py [--out results/bench.json] [--rounds 40] [--only dane sync_sgd]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dane.errors import DivergenceError  # noqa: E402
from dane.launch import execute  # noqa: E402
from dane.results import read_rounds, read_summary  # noqa: E402
from experiments.config import CONF_DIR, run_spec  # noqa: E402
from paper_figs.target_table import TARGETS  # noqa: E402

KEY = "mnist_lenet5_to_97"


def machine() -> dict:
    return {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "torch": torch.__version__, "load_avg": list(os.getloadavg())}


def run_one(overrides: list[str], out_dir: Path) -> dict:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("simulate", overrides=overrides)
    for name in ("rounds.jsonl", "summary.json"):
        (out_dir / name).unlink(missing_ok=True)
    start = time.perf_counter()
    try:
        summary = execute(run_spec(cfg), str(out_dir))
    except DivergenceError:  # a result like any other: the rounds so far are in out_dir
        summary = read_summary(out_dir)
    wall = time.perf_counter() - start
    records = read_rounds(out_dir)
    target = cfg.early_stop.target
    hit = next((r for r in records if r.get("test_accuracy", 0.0) >= target), None)
    return {
        "reached": hit is not None,
        "rounds": hit["round"] if hit else None,
        "comm_rounds": hit["comm_rounds"] if hit else None,
        "bytes_sent_per_worker": hit["bytes_sent"] if hit else None,
        "simulated_time_s": (summary.get("setup_s", 0.0) + hit["time_s"]) if hit else None,
        "wall_time_s": wall,
        "final_test_accuracy": records[-1]["test_accuracy"],
        "rounds_run": records[-1]["round"],
        "status": summary["status"],
        "overrides": overrides,
        "run_dir": str(out_dir),
    }


def winners(rows: dict[str, dict]) -> dict:
    reached = {name: row for name, row in rows.items() if row["reached"]}
    if not reached:
        return {}
    return {key: min(reached, key=lambda name: reached[name][key])
            for key in ("rounds", "comm_rounds", "bytes_sent_per_worker", "simulated_time_s")}


def main(argv: list[str] | None = None) -> None:
    target = TARGETS[0]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/bench.json")
    parser.add_argument("--runs", default="results/bench_nn", help="where the runs' directories go")
    parser.add_argument("--rounds", type=int, default=40, help="round budget per algorithm")
    parser.add_argument("--target", type=float, default=target.accuracy)
    parser.add_argument("--only", nargs="+", choices=list(target.algorithms), default=list(target.algorithms))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    report = {"started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine(),
              "setup": f"{target.problem}, 4 workers in the in-process simulator (one core each), "
                       "MNIST t10k split 8000/2000; time = simulated parallel time to the first record at the target",
              "target_test_accuracy": args.target, "round_budget": args.rounds, "algorithms": {}}
    for name in args.only:
        overrides = [target.experiment, *target.algorithms[name], f"rounds={args.rounds}",
                     f"early_stop.target={args.target}"]
        row = run_one(overrides, Path(args.runs) / name)
        report["algorithms"][name] = row
        shown = (f"{row['rounds']} rounds, {row['comm_rounds']} allreduces, {row['bytes_sent_per_worker']} B, "
                 f"{row['simulated_time_s']:.1f} s simulated") if row["reached"] else f"not reached in {args.rounds} rounds"
        print(f"{name}: {shown} (wall {row['wall_time_s']:.0f} s)", flush=True)
    path = Path(args.out)
    merged = json.loads(path.read_text()) if path.exists() else {}
    earlier = merged.get(KEY, {})
    if set(args.only) != set(target.algorithms) and earlier.get("target_test_accuracy") == args.target:
        report["algorithms"] = {**earlier.get("algorithms", {}), **report["algorithms"]}  # --only updates its rows
    report["fewest"] = winners(report["algorithms"])
    report["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    merged[KEY] = report
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(merged, indent=2) + "\n")
    print(f"fewest: {report['fewest']} -> {path}")


if __name__ == "__main__":
    main()
