"""Convergence of one run: suboptimality (log scale) against round, into the run directory.

    dane figures run_convergence results/main      # writes convergence.png and .pdf there

Plots the suboptimality when the problem knows its optimum, otherwise the gradient
norm (or, failing that, the objective), against the round and against the run's time, on a log axis (a value
below its floor, 1e-16, drawn there and said on the axes), or a linear one for an objective not above 0 throughout
(`log_axis`).  The time axis says
which clock it is: a simulated run's (the cost model it was charged under, α and β and whether calibrated, from
its summary.json: `paper_figs.common.run_cost_text`) or a launched run's wall clock.  The title ends with the run's
status, or where it did not stop as its stop rule said, how it ended (`paper_figs.summary.ending`, the words of
``dane figures summary`` and ``plot_runs``): "stopped at round 168 (interrupted)", or for records without a
summary.json (a run still writing, or killed) "no summary: running or crashed", also said in one line on stderr.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import matplotlib.pyplot as plt

from dane.errors import DataError, UserError, say
from dane.records.results import ROUNDS_FILE, read_rounds, read_summary
from dane.paper_figs.common import alpha_beta_text, floored, mark_floor, positive, run_cost_text, save, wrapped
from dane.paper_figs.provenance import run_config
from dane.paper_figs.summary import ending
from dane.records.provenance import command_name

METRICS = ("suboptimality", "grad_norm", "objective")


def metric_of(records: list[dict]) -> str | None:
    """The first of suboptimality, grad_norm, objective that every record has (None: none of them)."""
    return next((key for key in METRICS if all(key in r for r in records)), None)


def log_axis(key: str, values: list[float]) -> bool:
    """Whether ``key``'s ``values`` are drawn on a log axis: a suboptimality or gradient norm always (one below the
    floor, 0 or below, is drawn at it and said: `paper_figs.common.mark_floor`); an objective where every finite
    value is above 0, read before any floor is applied (else a linear axis draws it as it is)."""
    return key != "objective" or all(float(v) > 0 for v in values if finite(v))


def finite(value) -> bool:
    return value is not None and math.isfinite(float(value))


def simulated(summary: dict) -> bool:
    return summary.get("time_s_clock") == "simulated" or summary.get("backend") == "simulator"


def time_label(summary: dict) -> str:
    """The time axis: simulated at the run's α and β (the title says whether calibrated), else the launched run's
    wall clock."""
    if not simulated(summary):
        return "time (s)" + (f", wall clock ({summary['backend']})" if summary.get("backend") else "")
    if "alpha" in summary and "beta" in summary:
        return f"simulated time (s) at {alpha_beta_text(summary['alpha'], summary['beta'])}"
    return "simulated time (s)"


def draw(run_dir: str | Path):
    records = read_rounds(run_dir)  # a missing, unreadable or damaged log: one DataError naming it and the fix
    path = Path(run_dir) / ROUNDS_FILE
    if not records:
        raise DataError(f"{path} has no rounds (the run stopped before its first record); rerun the run")
    key = metric_of(records)
    bad = next((r for r in records if "time_s" not in r or key not in r), None)  # key None: in no record
    if bad is not None:
        what = "time_s" if "time_s" not in bad else f"{' or '.join(METRICS)} that every record has"
        raise DataError(f"{path}: the record of round {bad['round']} has no {what}; the file was damaged or not "
                        "written by a run: restore it, or rerun the run")
    summary_file = Path(run_dir) / "summary.json"
    summary = read_summary(run_dir) if summary_file.exists() else {}
    raw = [r[key] for r in records]
    log_y = log_axis(key, raw)
    values = positive(raw) if log_y else [float(v) if finite(v) else math.nan for v in raw]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 4), sharey=True)
    left.plot([r["round"] for r in records], values, "o-", markersize=3)
    right.plot([r["time_s"] for r in records], values, "o-", markersize=3)
    left.set_xlabel("round")
    right.set_xlabel(time_label(summary))
    left.set_ylabel(key.replace("_", " "))
    for ax in (left, right):
        if log_y:
            ax.set_yscale("log")
            if floored(raw):  # a suboptimality or gradient norm below the floor (0, or below 0) is said on the axes
                mark_floor(ax)
        ax.grid(True, which="both", alpha=0.3)
    title = " ".join(str(summary[k]) for k in ("algorithm", "problem") if k in summary)
    said = ending(Path(run_dir), records[-1]["round"])  # a run that did not stop as asked, or has no summary: said
    if summary:
        title += (f", {summary.get('workers', '?')} worker(s), {summary.get('backend', '')}: "
                  f"{summary.get('status', '') if said is None else said.note}")
    else:
        title = f"{run_dir}: {said.note}"
    if said is not None and said.line is not None:
        say(f"{said.line}, marked in the title")
    cost = run_cost_text(summary, run_config(run_dir)) if simulated(summary) else None
    if cost:  # the cost model the simulated times were charged under, and whether it was calibrated
        title += f"\nsimulated time: {cost}"
    fig.suptitle(wrapped(title, 9), fontsize=10)
    return fig


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(prog=command_name(), description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help="a run directory holding rounds.jsonl (and summary.json)")
    args = parser.parse_args(argv)
    if not Path(args.run_dir).is_dir():
        say(f"error: {args.run_dir} is not a run directory (a folder holding rounds.jsonl)")
        sys.exit(2)
    try:
        paths = save(draw(args.run_dir), args.run_dir, "convergence")
    except (UserError, FileNotFoundError) as exc:  # a missing, unreadable or damaged log (DataError): its one line
        say(f"error: {' '.join(str(exc).split())}")
        sys.exit(2)
    for path in paths:
        print(path)
    return paths


if __name__ == "__main__":
    main()
