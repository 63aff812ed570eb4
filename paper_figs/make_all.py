"""Rebuild every figure and table from results/ and paper_figs/evidence/ into results/figures/ (`make figures`).

Each figure module of `FIGURES` names the runs it needs (``jobs()``) and draws from results/ only
(``main(results, out)``); ``TIMED = False`` marks one that reads rounds, not times.
Runs that no stored result answers are made first, in this process, with the in-process
simulator (see `synthetic.sweep.ensure`).

- ``make figures``: the synthetic figures; their missing runs are made (a cold start
  takes a few minutes on 2 cores, a warm one seconds).  The neural-network tables are
  drawn from whatever runs results/ has, and the command says how many are missing.
- ``make tables`` (``--nn``): also makes the neural-network tables' missing runs
  (the slowest step of a cold start: every network run the tables need, on MNIST and digits).
- always: the figures of the benchmarks whose JSON is tracked evidence (`EVIDENCE_FIGURES`: ``compressed``,
  ``fedprox_synthetic``, ``fedprox_synthetic_long``, ``federated_scale``), drawn from paper_figs/evidence/
  (``--evidence``) with no run; each sidecar names the files read.  docs/ is not touched (their tables' blocks
  are written by the scripts themselves).

Nothing under paper_figs/ is written: ``make publish-figures`` copies results/figures/
there, a deliberate step before a commit.

    dane figures make_all [--results results] [--out results/figures] [--no-run] [--nn] [--evidence DIR]
"""
from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

from dane.errors import say
from dane.paper_figs.common import EVIDENCE_DIR, FIG_DIR, checked_out
from dane.synthetic.sweep import RunIndex, ensure
from dane.layout import scripts_in
from dane.records.provenance import command_name

#: figure modules of paper_figs/, each with jobs() and main(results, out)
FIGURES = ("dane.paper_figs.speedup", "dane.paper_figs.convergence", "dane.paper_figs.rounds_table", "dane.paper_figs.ps_scaling",
           "dane.paper_figs.staleness", "dane.paper_figs.fednl_bits", "dane.paper_figs.local_work")
#: the neural-network tables: their runs take tens of minutes, so only `--nn` makes them
NN_TABLES = ("dane.paper_figs.accuracy_table", "dane.paper_figs.target_table", "dane.paper_figs.dane_vs_admm")
#: the figures drawn from tracked benchmark JSON (no run): module (its ``figure(files, out, name)``), the files it
#: reads in the evidence folder, the output's name
EVIDENCE_FIGURES = (
    ("dane.paper_figs.compressed", ("compressed.json",), "compressed"),
    ("dane.paper_figs.fedprox_synthetic", ("fedprox_synthetic.json",), "fedprox_synthetic"),
    ("dane.paper_figs.fedprox_synthetic", ("fedprox_synthetic_k322.json",), "fedprox_synthetic_long"),
    ("dane.paper_figs.federated_scale", ("federated_scale_phishing.json", "federated_scale_synthetic.json"),
     "federated_scale"),
)


def evidence_figures(out: str | Path = FIG_DIR, evidence: str | Path = EVIDENCE_DIR,
                     table: tuple = EVIDENCE_FIGURES) -> list[Path]:
    """Draw the figures of ``table`` from the JSON in ``evidence``; one whose files are not all there is one line."""
    written: list[Path] = []
    for module, files, name in table:
        paths = [Path(evidence) / file for file in files]
        absent = [str(path) for path in paths if not path.is_file()]
        if absent:
            say(f"make_all: no {name}: {', '.join(absent)} missing (the tracked evidence is in a checkout's "
                "paper_figs/evidence/)")
            continue
        written += importlib.import_module(module).figure(paths, out, name)
    return written


def make_all(results: str | Path = "results", out: str | Path = FIG_DIR, run_missing: bool = True,
             nn: bool = False, evidence: str | Path = EVIDENCE_DIR) -> list[Path]:
    """Draw every figure and table: first the evidence figures from ``evidence`` (they need no run), then the others,
    making the missing runs of the figures (and of the NN tables if ``nn``)."""
    written = evidence_figures(out, evidence)
    figures = [importlib.import_module(name) for name in FIGURES]
    tables = [importlib.import_module(name) for name in NN_TABLES]
    to_run = figures + tables if nn else figures
    if nn or not run_missing:
        from dane.paper_figs.accuracy_table import ROWS, data_problem

        for row in ROWS:
            problem = data_problem(row)
            if problem is not None:
                say(f"make_all: no {row.label} row: {problem}; set DANE_DATA_DIR to the data folder")
    if run_missing:  # figures that read times first, so that rounds-only figures reuse their runs
        for timed in (True, False):
            ensure([job for module in to_run if getattr(module, "TIMED", True) == timed for job in module.jobs()],
                   root=results, timed=timed)
    if not nn:
        index = RunIndex(results)
        missing = sum(module.find_run(index, job) is None for module in tables for job in module.jobs())
        if missing:
            print(f"make_all: {missing} neural-network table runs are missing; their cells show '—' (a table with none is not drawn). "
                  "`make tables` makes them (three seeds each: the slow part).", file=sys.stderr)
    for module in figures + tables:
        written += module.main(results, out)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=command_name(), description=__doc__.splitlines()[0],
                                     epilog=f"one of them: {command_name() or 'make_all.py'} NAME [--help], NAME one "
                                            f"of {', '.join(n for n in scripts_in('paper_figs') if n != 'make_all')}")
    parser.add_argument("--results", default="results", help="results root to read (and to add missing runs to)")
    parser.add_argument("--out", default=str(FIG_DIR), help="where the figures, tables and their .json sidecars go")
    parser.add_argument("--no-run", action="store_true", help="draw from what is there; fail if runs are missing")
    parser.add_argument("--nn", action="store_true", help="also make the neural-network tables' missing runs (slow)")
    parser.add_argument("--evidence", default=str(EVIDENCE_DIR), help="the tracked benchmark JSON the evidence "
                        "figures are drawn from (default paper_figs/evidence/)")
    args = parser.parse_args(argv)
    checked_out(args.out)  # before the missing runs are made
    start = time.perf_counter()
    try:
        written = make_all(args.results, args.out, run_missing=not args.no_run, nn=args.nn, evidence=args.evidence)
    except FileNotFoundError as exc:
        say(f"error: {exc}")
        sys.exit(2)
    for path in written:
        print(path)
    print(f"make_all: {len(written)} files in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
