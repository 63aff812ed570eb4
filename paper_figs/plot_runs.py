"""Overlay any runs: one line per run of a record key against rounds, allreduces, bytes or time.

    dane figures plot_runs results/sweeps/2024-05-01_12-00-00-123456_4242  # every run of a sweep
    dane figures plot_runs RUN_A RUN_B --y test_accuracy --x comm_rounds --out results/figures/ab.png

A DIR is a run directory (``rounds.jsonl``, ``summary.json``, ``config.yaml`` as
`dane.records.results` writes them) or a folder holding run directories (a sweep: all its runs,
in job order).  Legend labels are what differs between the runs' saved configs
("algorithm=admm, workers=4"), else the directory names; ``--labels`` names the runs
in the order found.  A run with records but no summary.json (still running, or killed) is drawn as far as its
records go, "— no summary: running or crashed" after its label and one line on stderr naming it; one that stopped
otherwise than its stop rule said (interrupted, diverged) has "— stopped at round 168 (interrupted)" after its
label (`paper_figs.summary.ending`, the words of ``dane figures summary`` and ``local_work``).  Suboptimality and
gradient norm are drawn on a log axis.  A run whose ``rounds.jsonl`` is missing, torn, damaged or unreadable, or
lacks the key, is named in one line (a damaged or unreadable file with the fix) and skipped, a failed job's with the
first line of its error.txt (`paper_figs.summary.failure_reason`); with no run found the script says so and exits with
status 2.  Each curve has its own colour, marker and line style (`paper_figs.common.curve_style`: no two alike among
the first 400), and a value below the log axis's floor (1e-16) is said on the axes.  Writes FILE.png and FILE.pdf
(default ``results/figures/plot_runs``) and prints their paths.
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple, Sequence

import matplotlib.pyplot as plt

from dane.errors import say
from dane.paper_figs.common import checked_out, curve_style, positive, save
from dane.paper_figs.summary import UNFINISHED, ending, failure_reason, job_dirs, read_config, records_of
from dane.records.provenance import command_name

Y_AXES = {  # record key -> (axis label, log scale)
    "objective": ("objective O(w)", False),
    "suboptimality": ("suboptimality O(w) - O(w*)", True),
    "test_accuracy": ("test accuracy", False),
    "test_loss": ("test loss", False),
    "grad_norm": ("gradient norm ‖∇O(w)‖", True),
}
X_AXES = {  # record key -> (axis label, name in the title)
    "round": ("round", "rounds"),
    "comm_rounds": ("communication rounds (allreduces)", "allreduces"),
    "bytes_sent": ("bytes sent (rank 0)", "bytes sent"),
    "time_s": ("time (s; simulated in the simulator)", "time"),
}
DEFAULT_OUT = Path("results") / "figures" / "plot_runs.png"
#: config keys that do not change what a run computes: never a label
NOT_LABELS = ("out_dir", "overwrite", "quiet", "print_every", "progress", "data_dir", "checkpoint_every", "resume",
              "save_iterate", "sim.calibration", "logger", "mlflow_uri")


class Curve(NamedTuple):
    label: str
    x: list[float]
    y: list[float]
    run: Path | None = None


def flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def differing_keys(configs: Sequence[dict]) -> list[str]:
    """The config keys whose values differ between runs, in config order.

    A key inside a group (``algorithm.mu``) counts only when it differs between runs with
    the same ``<group>.name``: runs of DANE and ADMM differ in ``algorithm.name``, not in
    every key one of them lacks.
    """
    flat = [flatten(c) for c in configs]
    keys = list(dict.fromkeys(k for f in flat for k in f))
    found = []
    for key in keys:
        if key in NOT_LABELS or key.split(".")[0] in NOT_LABELS or key.startswith("hydra."):
            continue
        group = key.rsplit(".", 1)[0] + ".name" if "." in key else None
        values = defaultdict(set)
        for f in flat:
            values[None if group in (None, key) else repr(f.get(group))].add(repr(f.get(key, "<absent>")))
        if any(len(v) > 1 for v in values.values()):
            found.append(key)
    return found


def labels_for(runs: Sequence[Path], configs: Sequence[dict]) -> list[str]:
    """"algorithm=admm, workers=4" from what differs between the configs; else the directory names."""
    keys = differing_keys(configs) if all(configs) and len(configs) > 1 else []
    flat = [flatten(c) for c in configs]
    labels = [", ".join(f"{k[:-len('.name')] if k.endswith('.name') else k}={f[k]}" for k in keys if k in f)
              for f in flat]
    if not all(labels):
        return [run.name for run in runs]
    if len(set(labels)) < len(labels):  # configs that agree on everything labelled: tell them apart by directory
        return [f"{label} ({run.name})" for label, run in zip(labels, runs)]
    return labels


def find(dirs: Sequence[str | Path]) -> list[Path]:
    """The run directories named: each DIR itself if it is a run, else every run under it."""
    runs = []
    for d in dirs:
        if Path(d).is_dir():
            runs.extend(job_dirs(d))
        else:
            say(f"skipped {d}: not a directory")
    return list(dict.fromkeys(runs))


def curves(runs: Sequence[Path], x: str, y: str, labels: Sequence[str] | None = None,
           log=None) -> list[Curve]:
    """One curve per readable run, labelled by ``labels`` (one per run) or else by what differs
    between the plotted runs' configs; each unreadable run is named in one line on ``log``
    (default stderr) and skipped.  A run that did not stop where its stop rule said has it after its label
    (`paper_figs.summary.ending`: "— no summary: running or crashed", "— stopped at round 168 (interrupted)"),
    and one without a readable summary.json a line on ``log`` too."""
    log = log or sys.stderr
    out, notes = [], []
    for k, run in enumerate(runs):
        records, problem, line = records_of(run)
        if line is not None and not problem.startswith(UNFINISHED):  # damaged or unreadable: the file and the fix
            print(f"skipped: {' '.join(line.split())}", file=log)
            continue
        if problem is None and not any(r.get(y) is not None for r in records):
            problem = f"no '{y}' in its records"
        if problem is None and not all(x in r for r in records):
            problem = f"no '{x}' in its records"
        if problem is not None:
            reason = failure_reason(run)  # a failed job's one line (its error.txt): why it has no records
            print(f"skipped {run}: {problem}" + (f"; failed: {reason}" if reason else ""), file=log)
            continue
        out.append(Curve(labels[k] if labels else run.name, [r[x] for r in records], [r.get(y) for r in records], run))
        said = ending(run, records[-1].get("round"))
        if said is not None and said.line is not None:
            print(f"{said.line}, marked in the legend", file=log)
        notes.append(None if said is None else said.note)
    if not labels:
        out = [curve._replace(label=label) for curve, label in
               zip(out, labels_for([c.run for c in out], [read_config(c.run) for c in out]))]
    return [c if note is None else c._replace(label=f"{c.label} — {note}") for c, note in zip(out, notes)]


def draw(data: Sequence[Curve], x: str = "round", y: str = "suboptimality", title: str | None = None):
    """The overlay, one line per curve in order (``ax.lines[i]`` is ``data[i]``), each its own colour, marker and line
    style (`paper_figs.common.curve_style`); a value below the log axis's floor is said on it; returns the
    figure."""
    ylabel, log_y = Y_AXES[y]
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for k, curve in enumerate(data):
        ys = positive(curve.y, ax=ax) if log_y else [float("nan") if v is None else v for v in curve.y]
        ax.plot(curve.x, ys, markersize=3, markevery=max(1, len(ys) // 25), label=curve.label, **curve_style(k))
    if log_y:
        ax.set_yscale("log")
    ax.set_xlabel(X_AXES[x][0])
    ax.set_ylabel(ylabel)
    ax.set_title(title or title_for((), x, y, len(data)))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def title_for(configs: Sequence[dict], x: str, y: str, n: int) -> str:
    """The axes' names and what the runs share (the problem, if one)."""
    problems = {c["problem"].get("name") for c in configs if isinstance(c.get("problem"), dict)}
    shared = f" on {problems.pop()}" if len(problems) == 1 and len(configs) == n and None not in problems else ""
    return f"{y.replace('_', ' ')} against {X_AXES[x][1]}{shared}, {n} run(s)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=command_name(), description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", metavar="DIR", help="run directories, or folders holding them (a sweep)")
    parser.add_argument("--y", choices=sorted(Y_AXES), default="suboptimality")
    parser.add_argument("--x", choices=sorted(X_AXES), default="round")
    parser.add_argument("--out", default=str(DEFAULT_OUT),
                        help=f"the PNG; a PDF is written beside it (default {DEFAULT_OUT})")
    parser.add_argument("--labels", nargs="+", help="one legend label per run, in the order found")
    args = parser.parse_args(argv)
    checked_out(args.out, DEFAULT_OUT.name)  # before the runs are read
    runs = find(args.dirs)
    if not runs:
        print(f"error: no runs in {' '.join(args.dirs)} (no directory with rounds.jsonl or summary.json)",
              file=sys.stderr)
        return 2
    if args.labels is not None and len(args.labels) != len(runs):
        print(f"error: --labels has {len(args.labels)} label(s) for {len(runs)} run(s): "
              + ", ".join(str(r) for r in runs), file=sys.stderr)
        return 2
    data = curves(runs, args.x, args.y, args.labels)
    if not data:
        say(f"error: none of the {len(runs)} run(s) found could be plotted")
        return 2
    title = title_for([read_config(c.run) for c in data], args.x, args.y, len(data))
    out = Path(args.out)
    for path in save(draw(data, args.x, args.y, title), out.parent, out.stem):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
