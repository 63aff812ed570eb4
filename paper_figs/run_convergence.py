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

from dane.errors import say
from dane.records.results import read_rounds, read_summary
from dane.paper_figs.common import positive, save
from dane.records.provenance import command_name

METRICS = ("suboptimality", "grad_norm", "objective")


def metric_of(records: list[dict]) -> str:
    """The first of suboptimality, grad_norm, objective that every record has."""
    return next(key for key in METRICS if all(key in r for r in records))


def draw(run_dir: str | Path):
    records = read_rounds(run_dir)
    if not records:
        raise FileNotFoundError(f"{Path(run_dir) / 'rounds.jsonl'} has no rounds")
    summary_file = Path(run_dir) / "summary.json"
    summary = read_summary(run_dir) if summary_file.exists() else {}
    key = metric_of(records)
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
    except FileNotFoundError as exc:  # DataError too: a damaged log
        say(f"error: {exc}")
        sys.exit(2)
    for path in paths:
        print(path)
    return paths


if __name__ == "__main__":
    main()
