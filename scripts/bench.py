"""Every benchmark behind one command line (`scripts.harness`), JSON into --out (`make bench`, `dane bench`).

    python -m scripts.bench SECTION [--out results/bench.json] [--quick] [--only NAME ...] [options]
    python -m scripts.bench SECTION --help

``SECTION`` is ``X`` for scripts/bench_X.py.  A section ported to the runner declares ``BENCH`` (a
`scripts.harness.Bench`); the others still parse their own options (``main(argv)``), listed in `OWN_PARSER`.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

from scripts import harness

FOLDER = Path(__file__).resolve().parent
SECTIONS = sorted(p.stem.removeprefix("bench_") for p in FOLDER.glob("bench_*.py"))
#: sections not yet declared as a `scripts.harness.Bench`: their argv goes to their own main
OWN_PARSER = ("batched", "batched_net", "convex", "cuda", "fednl", "horovod", "load", "local_solve", "nn",
              "sampled_lambda", "scaling", "similarity", "svrg", "wallclock")


def main(argv: list[str] | None = None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in OWN_PARSER:
        return importlib.import_module(f"scripts.bench_{argv[0]}").main(argv[1:])
    benches = {name: importlib.import_module(f"scripts.bench_{name}").BENCH
               for name in SECTIONS if name not in OWN_PARSER}
    return harness.main(argv, benches)


if __name__ == "__main__":
    main()
