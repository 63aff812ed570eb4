"""Convergence of one run: suboptimality (log scale) against round, into the run directory.

    dane figures run_convergence results/main      # writes convergence.png and .pdf there

Plots the suboptimality when the problem knows its optimum, otherwise the gradient
norm (or, failing that, the objective), against the round and against the run's time.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib.pyplot as plt

from dane.errors import DataError, UserError, say
from dane.records.results import ROUNDS_FILE, read_rounds, read_summary
from dane.paper_figs.common import positive, save
from dane.records.provenance import command_name

METRICS = ("suboptimality", "grad_norm", "objective")


def metric_of(records: list[dict]) -> str | None:
    """The first of suboptimality, grad_norm, objective that every record has (None: none of them)."""
    return next((key for key in METRICS if all(key in r for r in records)), None)


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
    values = positive([r[key] for r in records])
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
    left.plot([r["round"] for r in records], values, "o-", markersize=3)
    right.plot([r["time_s"] for r in records], values, "o-", markersize=3)
    left.set_xlabel("round")
    right.set_xlabel("time (s)" + (" (simulated)" if summary.get("backend") == "simulator" else ""))
    left.set_ylabel(key.replace("_", " "))
    for ax in (left, right):
        if key != "objective" or min(v for v in values if v == v) > 0:
            ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
    title = " ".join(str(summary[k]) for k in ("algorithm", "problem") if k in summary)
    if summary:
        title += f", {summary.get('workers', '?')} worker(s), {summary.get('backend', '')}: {summary.get('status', '')}"
    fig.suptitle(title or str(run_dir), fontsize=10)
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
