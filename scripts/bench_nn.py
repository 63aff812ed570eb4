"""Benchmark: rounds, bytes and time to 97% test accuracy on MNIST-LeNet5, 4 workers, DANE and each baseline."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from dane.errors import DivergenceError
from dane.loop.launch import execute
from dane.records.results import read_rounds, read_summary
from dane.comm import AlphaBeta
from dane.experiments.config import CONF_DIR, run_spec
from dane.paper_figs.accuracy_table import Row, find_run, has_data
from dane.paper_figs.common import retime
from dane.paper_figs.target_table import TARGETS, job, job_cost
from dane.synthetic.sweep import RunIndex
from scripts.harness import Bench, Run, option

KEY = "mnist_lenet5_to_97"


def row_from(run_dir: Path, accuracy: float, costs: dict[str, AlphaBeta]) -> dict:
    """Rounds, allreduces and bytes one worker sent until the first record at ``accuracy``, and its simulated time
    under each α-β of ``costs`` (exact re-timing, `paper_figs.common.retime`)."""
    summary, records = read_summary(run_dir), read_rounds(run_dir)
    hit = next((r for r in records if r.get("test_accuracy", 0.0) >= accuracy), None)
    row = {
        "reached": hit is not None,
        "rounds": hit["round"] if hit else None,
        "comm_rounds": hit["comm_rounds"] if hit else None,
        "bytes_sent_per_worker": hit["bytes_sent"] if hit else None,
        "final_test_accuracy": records[-1]["test_accuracy"],
        "rounds_run": records[-1]["round"],
        "status": summary["status"],
        "run_dir": str(run_dir),
        "run_wall_time_s": summary.get("wall_time_s"),
    }
    for label, cost in costs.items():
        timed = retime(records, summary, cost)[hit["round"]] if hit else None
        row[f"simulated_time_s{label}"] = summary.get("setup_s", 0.0) + timed["time_s"] if hit else None
    return row


def run_one(overrides: list[str], out_dir: Path) -> float:
    """Run in this process (a divergence is a result); returns the wall seconds it took."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("simulate", overrides=overrides)
    for name in ("rounds.jsonl", "summary.json"):
        (out_dir / name).unlink(missing_ok=True)
    start = time.perf_counter()
    try:
        execute(run_spec(cfg), str(out_dir))
    except DivergenceError:
        pass
    return time.perf_counter() - start


def winners(rows: dict[str, dict]) -> dict:
    reached = {name: row for name, row in rows.items() if row["reached"]}
    if not reached:
        return {}
    keys = ["rounds", "comm_rounds", "bytes_sent_per_worker"] + [k for k in next(iter(reached.values()))
                                                                 if k.startswith("simulated_time_s")]
    return {key: min(reached, key=lambda name: reached[name][key]) for key in keys}


def run(bench: Run) -> None:
    target, args = TARGETS[0], bench.args
    args.target = target.accuracy if args.target is None else args.target
    args.only = args.only or list(target.algorithms)
    if args.from_runs is None and not has_data(Row(target.problem, target.problem, None)):
        if args.skip_without_data:
            print("bench_nn: skipped, MNIST is not in data_dir (DANE_DATA_DIR or ../shared/data)")
            return
        print("error: MNIST is not in data_dir (DANE_DATA_DIR or ../shared/data); point DANE_DATA_DIR at the "
              "IDX files, or use --from-runs results to read earlier runs", file=sys.stderr)
        sys.exit(2)
    costs = {"": job_cost((target.experiment, *target.algorithms["dane"]))}
    calibration = Path("results/calibration.json")
    if calibration.exists():
        costs["_at_calibration"] = AlphaBeta.load(calibration)
    report = {"started_at": bench.started_at, "machine": bench.machine,
              "setup": f"{target.problem}, 4 workers in the in-process simulator (one core each), MNIST t10k split "
                       "8000/2000; simulated_time_s = simulated parallel time (compute + alpha-beta allreduce model) "
                       "to the first record at the target",
              "cost_models": {label or "default": {"alpha": c.alpha, "beta": c.beta} for label, c in costs.items()},
              "target_test_accuracy": args.target, "algorithms": {}}
    index = RunIndex(args.from_runs) if args.from_runs is not None else None
    report["source"] = (f"the fixed-budget runs of paper_figs/target_table.py under {args.from_runs} (nothing rerun)"
                        if index is not None else f"fresh runs, stopped at the target or after {args.rounds} rounds")
    for name in args.only:
        if index is not None:
            run_dir = find_run(index, job(target, name))
            if run_dir is None:
                report["algorithms"][name] = {"reached": False, "status": "no run", "rounds": None}
                print(f"{name}: no run under {args.from_runs}", flush=True)
                continue
            row = row_from(run_dir, args.target, costs)
        else:
            overrides = [target.experiment, *target.algorithms[name], f"rounds={args.rounds}",
                         f"early_stop.target={args.target}"]
            wall = run_one(overrides, Path(args.runs) / name)
            row = {**row_from(Path(args.runs) / name, args.target, costs), "wall_time_s": wall}
        row["settings"] = list(target.algorithms[name])
        report["algorithms"][name] = row
        shown = (f"{row['rounds']} rounds, {row['comm_rounds']} allreduces, {row['bytes_sent_per_worker']} B, "
                 f"{row['simulated_time_s']:.1f} s simulated") if row["reached"] else f"not reached ({row['status']})"
        print(f"{name}: {shown}", flush=True)
    path, earlier = bench.path, bench.earlier
    if set(args.only) != set(target.algorithms) and earlier.get("target_test_accuracy") == args.target:
        report["algorithms"] = {**earlier.get("algorithms", {}), **report["algorithms"]}  # --only updates its rows
    report["fewest"] = winners(report["algorithms"])
    report["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    bench.finish(report)
    print(f"fewest: {report['fewest']} -> {path}")


BENCH = Bench(KEY, run, "rounds, bytes and time to 97% test accuracy on MNIST LeNet-5, 4 workers",
              only=tuple(TARGETS[0].algorithms), options=(
                  option("--runs", default="results/bench_nn", help="where the runs' directories go"),
                  option("--rounds", type=int, default=40, help="round budget per algorithm"),
                  option("--target", type=float, default=None, help="test accuracy (default: the target table's)"),
                  option("--from-runs", metavar="RESULTS", default=None,
                         help="measure nothing: read the 30-round runs of paper_figs/target_table.py under RESULTS"),
                  option("--skip-without-data", action="store_true",
                         help="exit 0 with a note (not an error) when MNIST is absent; `make bench` uses it")))
