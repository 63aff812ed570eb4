"""Rounds, bytes and time to 97% test accuracy on MNIST-LeNet5, 4 workers, DANE and each baseline: JSON section
``mnist_lenet5_to_97``, one row of `scripts.harness.grid` per algorithm under ``algorithms`` (`row_from`), and
``fewest``, the algorithm with the least of each cost among those that reached the target."""
from __future__ import annotations

from contextlib import suppress
from pathlib import Path

from dane.comm import AlphaBeta
from dane.errors import DivergenceError
from dane.experiments.config import run_spec
from dane.loop.launch import execute
from dane.paper_figs.accuracy_table import Row, has_data
from dane.paper_figs.common import retime
from dane.paper_figs.target_table import TARGETS, job_cost
from dane.records.results import read_rounds, read_summary
from dane.synthetic.sweep import compose_job
from scripts.harness import SKIP_WITHOUT_DATA, Bench, Run, count, grid, option, timer

TARGET = TARGETS[0]
#: a row's costs to the target, each the fewest of which algorithm (`winners`), beside the simulated times
COSTS = ("rounds", "comm_rounds", "bytes_sent_per_worker")


def row_from(run_dir: Path, accuracy: float, costs: dict[str, AlphaBeta]) -> dict:
    """Rounds, allreduces and bytes one worker sent until the first record at ``accuracy``, and its simulated time
    under each α-β of ``costs`` (exact re-timing, `paper_figs.common.retime`)."""
    summary, records = read_summary(run_dir), read_rounds(run_dir)
    hit = next((r for r in records if r.get("test_accuracy", 0.0) >= accuracy), None)
    row = {"reached": hit is not None, **dict.fromkeys(COSTS)}
    if hit:
        row.update(rounds=hit["round"], comm_rounds=hit["comm_rounds"], bytes_sent_per_worker=hit["bytes_sent"])
    row.update(final_test_accuracy=records[-1]["test_accuracy"], rounds_run=records[-1]["round"],
               status=summary["status"], run_dir=str(run_dir), run_wall_time_s=summary.get("wall_time_s"))
    for label, cost in costs.items():
        timed = retime(records, summary, cost)[hit["round"]] if hit else None
        row[f"simulated_time_s{label}"] = summary.get("setup_s", 0.0) + timed["time_s"] if hit else None
    return row


def winners(rows: dict[str, dict]) -> dict:
    reached = {name: row for name, row in rows.items() if row["reached"]}
    if not reached:
        return {}
    keys = [*COSTS, *(k for k in next(iter(reached.values())) if k.startswith("simulated_time_s"))]
    return {key: min(reached, key=lambda name: reached[name][key]) for key in keys}


def costs() -> dict[str, AlphaBeta]:
    """The α-β models a row is timed under: the job's own ("") and, where there is one, the calibrated one."""
    out = {"": job_cost((TARGET.experiment, *TARGET.algorithms["dane"]))}
    if Path("results/calibration.json").exists():
        out["_at_calibration"] = AlphaBeta.load(Path("results/calibration.json"))
    return out


def measure(run: Run, name: str) -> dict:
    """One algorithm's row: ``dane simulate`` in this process (a divergence is a result) to the target or the round
    budget, into ``--runs``/NAME, then `row_from`."""
    args, out_dir = run.args, Path(run.args.runs) / name
    accuracy = args.target or TARGET.accuracy
    job = (TARGET.experiment, *TARGET.algorithms[name], f"rounds={args.rounds}", f"early_stop.target={accuracy}")
    for stale in ("rounds.jsonl", "summary.json"):
        (out_dir / stale).unlink(missing_ok=True)

    def simulate():
        with suppress(DivergenceError):
            execute(run_spec(compose_job(job)), str(out_dir))

    wall = timer(simulate)
    return {**row_from(out_dir, accuracy, costs()), "wall_time_s": wall, "settings": list(TARGET.algorithms[name])}


def head(args) -> dict:
    return {"setup": f"{TARGET.problem}, 4 workers in the in-process simulator (one core each), MNIST t10k split "
                     "8000/2000; simulated_time_s = simulated parallel time (compute + alpha-beta allreduce model) to "
                     "the first record at the target",
            "cost_models": {label or "default": {"alpha": c.alpha, "beta": c.beta} for label, c in costs().items()},
            "target_test_accuracy": args.target or TARGET.accuracy,
            "source": f"fresh runs, stopped at the target or after {args.rounds} rounds"}


def no_data(args) -> str | None:
    if not has_data(Row(TARGET.problem, TARGET.problem, None)):
        return "MNIST is not in data_dir (DANE_DATA_DIR or ../shared/data); point DANE_DATA_DIR at the IDX files"
    return None


BENCH = Bench("mnist_lenet5_to_97", grid(lambda run: {name: name for name in TARGET.algorithms}, measure, head=head,
                                         into="algorithms", skip=no_data, after=lambda rows: {"fewest": winners(rows)}),
              "rounds, bytes and time to 97% test accuracy on MNIST LeNet-5, 4 workers",
              only=tuple(TARGET.algorithms), resumable=True, options=(
                  option("--runs", default="results/bench_nn", help="where the runs' directories go"),
                  option("--rounds", type=count, default=40, help="round budget per algorithm"),
                  option("--target", type=float, default=None, help="test accuracy (default: the target table's)"),
                  SKIP_WITHOUT_DATA))
