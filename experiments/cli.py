"""The ``dane`` command: one entry point for runs, the simulator, calibration, figures and benchmarks.

    dane train algorithm=dane problem=ridge_synthetic workers=2      # = python -m experiments.train ...
    horovodrun -np 2 --gloo dane train algorithm=dane problem=ridge_synthetic
    torchrun --standalone --nproc_per_node 2 --no-python dane train algorithm=dane problem=ridge_synthetic
    dane simulate -m workers=1,2,4                                  # = python -m experiments.simulate ...
    dane figures run_convergence results/main                       # = python -m paper_figs.run_convergence ...
    dane data push data.csv --target y --uri stores/s --collection t   # = python -m experiments.data push ...

``dane COMMAND ARGS`` runs the command's module exactly as ``python -m dane.<module> ARGS``
would (`runpy`, as ``__main__``): Hydra reads the same overrides and finds ``conf/`` beside
the module, in a checkout or inside the installed package, and a ``-m`` sweep under
``hydra/launcher=horovod|torchrun`` relaunches the same module.  torchrun runs a console
script with ``--no-python``; horovodrun runs any command, so ``dane`` must be on ``PATH``
there (the virtual environment's ``bin/`` first).  The benchmarks are scripts of a
checkout (``scripts/bench*.py``), not part of the installed package.
"""
from __future__ import annotations

import atexit
import contextlib
import gc
import runpy
import sys
from pathlib import Path

from dane.errors import UserError, say
from dane.layout import CHECKOUT, scripts_in
from dane.records.provenance import set_entry_command

#: the modules whose run is one process where no launcher started it: a SIGTERM stops it as a Ctrl-C does from the
#: start, its imports included (`run_module`)
RUNS = ("dane.experiments.train", "dane.experiments.simulate")

#: command -> (module run as __main__, what it does)
MODULES = {
    "train": ("dane.experiments.train", "one run, or a -m sweep: Hydra overrides of conf/config.yaml"),
    "simulate": ("dane.experiments.simulate", "m simulated workers in one process: overrides of conf/simulate.yaml"),
    "calibrate": ("dane.synthetic.calibrate", "measure the simulator's alpha-beta network model, --tail its tail (--help)"),
    "data": ("dane.experiments.data", "dane data push FILE|FOLDER --uri STORE --collection NAME: a data set into MongoDB"),
}
FIGURES_HELP = "every figure and table from results/ (--help), or one: dane figures NAME ARGS"
BENCH_HELP = "a benchmark of a checkout, JSON into --out: dane bench NAME ARGS (dane bench lists them)"


def collect_then_freeze() -> None:
    """At exit: collect the garbage cycles once (their finalizers run, as at any shutdown), then freeze every object
    left (`gc.freeze`), so that the collections of CPython's shutdown, each over the whole heap, skip them.

    A command that imported torch holds every object of torch's modules, and those collections were most of its
    exit.  Frozen, an object still alive at exit is freed by reference counting when its module is cleared, as
    before; only the cycles among them are left to the operating system, whose ``__del__`` CPython does not promise
    to call at exit.  A run closes its files itself, the interpreter flushes the standard streams, and atexit handlers
    (run before this one where registered after it) are unchanged.
    """
    gc.collect()
    gc.freeze()


def freeze_at_exit() -> None:
    """Register `collect_then_freeze` (once, however often a process calls this)."""
    atexit.unregister(collect_then_freeze)
    atexit.register(collect_then_freeze)


def usage() -> str:
    rows = [(name, text) for name, (_, text) in MODULES.items()]
    rows += [("figures", FIGURES_HELP), ("bench", BENCH_HELP)]
    width = max(len(name) for name, _ in rows)
    lines = ["usage: dane COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, text in rows]
    lines += ["", "dane COMMAND --help shows a command's own options (Hydra's for train and simulate)."]
    return "\n".join(lines)


def run_module(module: str, prog: str, args: list[str]) -> None:
    """``python -m module args``, in this process (sys.argv as the module would see it).  A Ctrl-C the run does not
    take (in the imports, say) is one line and exit status 130; so is a SIGTERM to a run of `RUNS` in a process of
    its own (143), from before its imports (`dane.loop.faults.sigterm_as_ctrl_c`, which the run takes over)."""
    if CHECKOUT is not None and str(CHECKOUT) not in sys.path:
        # as python -m from the checkout's root: Hydra lists the launchers in hydra_plugins/ only through
        # sys.path (an editable install's import hook does not list a namespace package's modules)
        sys.path.insert(0, str(CHECKOUT))
    sys.argv = [prog, *args]
    set_entry_command([*prog.split(), *args], prog)  # runpy replaces argv[0] with the module's file
    stops = contextlib.nullcontext()
    if module in RUNS:
        from dane.comm import detect_launcher
        from dane.loop.faults import sigterm_as_ctrl_c

        stops = sigterm_as_ctrl_c() if detect_launcher()[0] == "local" else stops
    with stops:
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except KeyboardInterrupt as exc:  # a Ctrl-C (or that SIGTERM) the run did not take: one line
            if isinstance(exc, SystemExit):  # the run's own (`dane.loop.faults.RunInterrupted`): its line is said
                raise
            from dane.loop.faults import interrupted_by

            by, code = interrupted_by()
            say(f"{prog}: interrupted" + ("" if by == "interrupted" else f" by {by}"))
            sys.exit(code)


def figure_names() -> list[str]:
    """What ``dane figures NAME`` draws: paper_figs/'s scripts (make_all: every one, as ``dane figures`` alone)."""
    return scripts_in("paper_figs")


def figures(args: list[str]) -> None:
    if not args or args[0].startswith("-"):
        return run_module("dane.paper_figs.make_all", "dane figures", args)
    names = figure_names()
    if args[0] not in names:
        say(f"error: dane figures: no figure or table {args[0]!r}; choose one of {', '.join(names)}")
        sys.exit(2)
    try:
        run_module(f"dane.paper_figs.{args[0]}", f"dane figures {args[0]}", args[1:])
    except (UserError, FileNotFoundError) as exc:  # results missing or damaged: the figure's own words, one line
        say(f"error: dane figures {args[0]}: {' '.join(str(exc).split())}")
        sys.exit(2)


#: the sections of ``python -m scripts.bench`` that are not a scripts/bench_X.py: the figures' run helpers
FIGURE_RUNS = ("time_vs_workers", "ps_scaling_real")


def bench_scripts() -> dict[str, Path]:
    """Section name -> its module's file: scripts/bench_X.py is section ``X`` of ``python -m scripts.bench``, and so
    are the figures' run helpers that scripts/bench.py names beside them (`FIGURE_RUNS`)."""
    if CHECKOUT is None:
        return {}
    folder = CHECKOUT / "scripts"
    return {**{p.stem.removeprefix("bench_"): p for p in folder.glob("bench_*.py")},
            **{name: folder / f"{name}.py" for name in FIGURE_RUNS if (folder / f"{name}.py").is_file()}}


def bench(args: list[str]) -> None:
    scripts = bench_scripts()
    if not scripts:
        say("error: dane bench runs the benchmarks of a checkout (scripts/bench*.py), which this installed "
            "package does not hold: git clone the repository, make setup, then dane bench there")
        sys.exit(2)
    if not args or args[0] not in scripts:
        wrong = f"no benchmark {args[0]!r}; " if args and args[0] not in ("-h", "--help") else ""
        say(f"error: dane bench: {wrong}choose one of {', '.join(sorted(scripts))} (dane bench NAME --help)")
        sys.exit(2)
    run_module("scripts.bench", "dane bench", args)  # the runner, as python -m scripts.bench from the checkout


def main(argv: list[str] | None = None) -> None:
    freeze_at_exit()
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        (sys.stdout if argv else sys.stderr).write(usage() + "\n")
        sys.exit(0 if argv else 2)
    command, args = argv[0], argv[1:]
    if command in MODULES:
        return run_module(MODULES[command][0], f"dane {command}", args)
    if command == "figures":
        return figures(args)
    if command == "bench":
        return bench(args)
    say(f"error: dane: no command {command!r}; choose one of {', '.join([*MODULES, 'figures', 'bench'])} (dane --help)")
    sys.exit(2)


if __name__ == "__main__":  # python -m dane.experiments.cli, as the dane command
    main()
