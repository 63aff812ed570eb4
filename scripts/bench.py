"""Every benchmark behind one command line (`scripts.harness`), JSON into --out (`make bench`, `dane bench`):
``python -m scripts.bench SECTION [--help]``, SECTION ``X`` of scripts/bench_X.py or a figure's run helper, declared by
its module's ``BENCH`` (a `scripts.harness.Bench`); docs/benchmarks.md, section Benchmarks."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

from dane.experiments.cli import FIGURE_RUNS
from scripts import harness

FOLDER = Path(__file__).resolve().parent
#: section -> module: scripts/bench_X.py is X; the figures' run helpers keep their names
MODULES = {**{p.stem.removeprefix("bench_"): f"scripts.{p.stem}" for p in sorted(FOLDER.glob("bench_*.py"))},
           **{name: f"scripts.{name}" for name in FIGURE_RUNS}}


def main(argv: list[str] | None = None):
    argv = sys.argv[1:] if argv is None else argv
    # the named section's module alone: a section may set the environment before numpy loads (bench_fednl)
    names = [argv[0]] if argv and argv[0] in MODULES else list(MODULES)
    return harness.main(argv, {name: importlib.import_module(MODULES[name]).BENCH for name in names})


if __name__ == "__main__":
    main()
