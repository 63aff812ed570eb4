"""The benchmarks' one runner: a section is a `Bench` (data), this turns it into JSON: one command line (`parser`),
one record around the numbers (`Run`), a merge into ``--out`` after each row (`Run.save`) and the goals table of the
whole file (`goals`); docs/benchmarks.md, section Benchmarks."""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from dane import checks

#: scripts/, where the sections' modules are
FOLDER = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Bench:
    """One benchmark section: ``key`` of the JSON, ``run`` the measurement (returns the section; the runner adds
    the record), ``doc`` its one line, ``options`` its own flags as ``(flags, argparse keywords)`` pairs,
    ``only`` the choices of ``--only`` (empty: the section has none), ``threads`` torch's threads (None: as
    they are; 1: a worker's compute, as the simulator times it), ``out`` the default of ``--out``, ``resumable``
    a `grid` section (``--resume`` skips the rows ``--out`` holds), ``sections(args)`` the keys of ``--out`` a run
    writes where they are not ``key`` alone (`checked_out` checks them), ``json`` False where ``--out`` is no JSON
    of sections (a folder of runs: the section checks it)."""

    key: str
    run: Callable[["Run"], dict]
    doc: str
    options: tuple[tuple[tuple[str, ...], dict], ...] = ()
    only: tuple[str, ...] = ()
    threads: int | None = 1
    out: str = "results/bench.json"
    resumable: bool = False
    sections: Callable[[argparse.Namespace], list[str]] | None = None
    json: bool = True

    def __post_init__(self) -> None:
        """``python scripts/bench_X.py`` defined its section and exited 0 having run nothing: refused in one line."""
        main = sys.modules.get("__main__")
        file = Path(getattr(main, "__file__", None) or ".")
        if getattr(main, "__spec__", None) is None and file.parent.resolve() == FOLDER and file.stem != "bench":
            sys.stderr.write(f"error: {file} is a section of the benchmarks' runner, which does not run as a file; "
                             f"run python -m scripts.bench {file.stem.removeprefix('bench_')} [--help]\n")
            raise SystemExit(2)


def option(*flags: str, **kwargs: Any) -> tuple[tuple[str, ...], dict]:
    """One flag of a section, as ``parser.add_argument(*flags, **kwargs)`` takes it."""
    return flags, kwargs


#: the ``type`` of a section's option that is a count (rounds, repeats, workers): 0 or less is argparse's one usage
#: line and exit 2, before any work (``--repeats 0`` measured nothing and exited 0)
count = checks.positive_int_argument
#: the ``type`` of one that is an amount (seconds, GiB): a finite number > 0
amount = checks.positive_number_argument
#: the flag of a section whose `grid` may ``skip`` (no data, no device): exit 0, not 2, once the section says why
SKIP_WITHOUT_DATA = option("--skip-without-data", action="store_true", help="exit 0 where the section skips (it says why)")


def counts(**defaults: int) -> tuple[tuple[tuple[str, ...], dict], ...]:
    """A section's `count` flags, ``--NAME`` (its underscores as dashes) defaulting to each value given."""
    return tuple(option(f"--{name.replace('_', '-')}", type=count, default=value) for name, value in defaults.items())


def folder(text: str) -> Path:
    """The ``type`` of a section's ``--data-dir``: an existing folder, a relative one from the repository root (as the
    package reads ``data_dir``); a missing one is argparse's one usage line and exit 2 (its tables were skipped and
    the command exited 0).  The default, a `data_dir` that may be absent, is no string and is not checked."""
    from dane.data.table import resolve_dir

    path = resolve_dir(text)
    if path is None or not path.is_dir():
        raise argparse.ArgumentTypeError(f"no folder {text!r}; give a folder that holds the data")
    return path


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def load() -> list[float]:
    """The load average, rounded to 0.01: what every launch and record is taken beside."""
    return [round(x, 2) for x in os.getloadavg()]


def spread(values: list) -> dict | None:
    """Median, min, max and count of the repeats that gave a value (None left out); None where none did."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


class Run:
    """One run of a section: ``args``, ``log`` (seconds since the start), ``earlier`` (the section as ``--out``
    held it before), the record's ``started_at`` and ``machine``."""

    def __init__(self, bench: Bench, args: argparse.Namespace):
        self.earlier = checked_out(bench, args).get(bench.key, {}) if bench.json else {}  # first: a refusal is quick
        # imported here: a section's module stays light to import (bench_wallclock's one-process baselines, no torch)
        from dane.synthetic.bench_file import elapsed_logger, machine

        self.bench, self.args, self.path = bench, args, Path(args.out)
        self.start = time.perf_counter()
        self.log = elapsed_logger(self.start)
        self.started_at, self.machine = now(), machine()

    def header(self) -> dict:
        """The record a section starts with: when, on what (the load average before, in ``machine``) and with which
        code (`dane.records.provenance.code_version`)."""
        from dane.records.provenance import code_version

        return {"started_at": self.started_at, "machine": self.machine, "code": code_version()}

    def save(self, section: dict, key: str | None = None) -> None:
        """Merge ``section`` into ``--out`` under ``key`` (the bench's), other keys kept."""
        from dane.synthetic.bench_file import merge_section

        merge_section(self.path, key or self.bench.key, section)

    def finish(self, section: dict, key: str | None = None) -> dict:
        """The last save: the load average after, the wall seconds and the code (a section that builds its own record
        has it too) added, then the goals table."""
        section.update(load_avg_after=load(), wall_s=round(time.perf_counter() - self.start, 1),
                       code=self.header()["code"])
        self.save(section, key)
        from dane.synthetic.bench_file import read_bench

        self.save(goals(read_bench(self.path)), "goals_table")
        return section


def timed_run(*job: str) -> dict:
    """One in-process simulated run of the ``dane simulate`` overrides ``job`` (`in_process`): the call's wall and CPU
    seconds (``total_s``, ``total_cpu_s``), the rounds' wall time (``rounds_s``, the summary's), the simulator's path,
    the objectives, the simulated time and the load average after."""
    summary, records, total, cpu = in_process(job)
    return {"total_s": total, "total_cpu_s": cpu, "rounds_s": summary["wall_time_s"], "path": summary["simulator_path"],
            "objectives": [r["objective"] for r in records],
            "simulated_time_s": summary["simulated_time_s"], "load_avg": load()}


#: a section's headline keys, in the order looked for, beside its ``goal``, where the section names none (``headline``)
HEADLINES = ("ratio", "error")


def goals(bench: dict) -> dict:
    """The goals table of a benchmark file: per section with a ``goal``, its headline (the key its ``headline``
    names, else the first of `HEADLINES` it has) and whether it is met (a ratio or an error at most its goal;
    ``>=`` goals are the sections' own ``meets`` key); per section with ``misses``, their count and lines."""
    table = {}
    for key, section in bench.items():
        if not isinstance(section, dict) or key == "goals_table":
            continue
        named = section.get("headline")
        headline = named if isinstance(named, str) else \
            next((h for h in HEADLINES if isinstance(section.get(h), (int, float))), None)
        if "goal" in section and headline is not None and isinstance(section["goal"], (int, float)):
            met = section.get("meets", section[headline] <= section["goal"])
            table[key] = {"headline": headline, "value": section[headline], "goal": section["goal"], "met": met}
        if isinstance(section.get("misses"), list):
            table[key] = {**table.get(key, {}), "misses": len(section["misses"]), "met": not section["misses"],
                          "lines": section["misses"]}
    return table


def parser(benches: dict[str, Bench]) -> argparse.ArgumentParser:
    """The one command line: ``SECTION`` and, for each, ``--out``, ``--quick``, ``--only`` and its options."""
    from dane.records.provenance import command_name

    top = argparse.ArgumentParser(prog=command_name() or "python -m scripts.bench",
                                  description="a benchmark section, JSON into --out")
    sections = top.add_subparsers(dest="section", required=True, metavar="SECTION")
    for name, bench in benches.items():
        sub = sections.add_parser(name, help=bench.doc.replace("%", "%%"), description=bench.doc)
        sub.add_argument("--out", default=bench.out, help="the JSON (other sections are kept; default: %(default)s)")
        sub.add_argument("--quick", action="store_true", help="the smallest run (make bench-smoke)")
        if bench.only:
            sub.add_argument("--only", nargs="+", choices=list(bench.only), default=None,
                             help="run these; the others' rows are kept from --out")
        if bench.resumable:
            sub.add_argument("--resume", action="store_true", help="skip the rows --out holds (same --quick)")
        for flags, kwargs in bench.options:
            sub.add_argument(*flags, **kwargs)
    return top


def main(argv: list[str], benches: dict[str, Bench]) -> dict:
    """Parse ``argv`` and run its section; returns what the section wrote.  A `dane.errors.UserError` (a bad
    ``--out``, a value the package refuses) is one line and exit 2; ``--out`` is checked before the work
    (`checked_out`), and what the section saved before a later one is kept."""
    from dane.errors import UserError, say

    args = parser(benches).parse_args(argv)
    bench = benches[args.section]
    try:
        run = Run(bench, args)
        if bench.threads is not None:
            import torch

            torch.set_num_threads(bench.threads)
        return bench.run(run)
    except UserError as exc:
        say(f"error: {' '.join(str(exc).split())}")
        raise SystemExit(2) from None


def checked_out(bench: Bench, args: argparse.Namespace) -> dict:
    """The JSON ``--out`` holds ({} where there is none yet), checked before the section's work, each problem a
    `dane.errors.ConfigError` naming ``--out`` and the fix: a path the section could not write once its work is
    done (a folder, a path under a file, an unwritable folder: `dane.records.results.output_file`), a file that
    is not a JSON object of sections, and a run that keeps rows of ``--out``'s section (``--only``, ``--resume``)
    where that section was taken at the other ``--quick`` (its rows would be mixed with or replaced by this
    run's)."""
    from dane.errors import ConfigError
    from dane.records.results import output_file
    from dane.synthetic.bench_file import read_bench

    path = output_file(args.out, "--out", "bench.json")
    whole = read_bench(path)  # {} where there is none yet; a file that is no JSON object is refused there
    keeps, quick = next((f for f in ("only", "resume") if getattr(args, f, None)), None), getattr(args, "quick", False)
    for key in bench.sections(args) if bench.sections else [bench.key]:
        section = whole.get(key)
        if key in whole and not isinstance(section, dict):
            raise ConfigError(f"--out {path} holds {key} as a JSON {type(section).__name__}, not a section; "
                              "remove that key, or choose another --out")
        if keeps and isinstance(section, dict) and "quick" in section and section["quick"] != quick:
            taken = "with" if section["quick"] else "without"
            raise ConfigError(f"--out {path} holds section {key} taken {taken} --quick, and --{keeps} would keep "
                              f"its rows beside this run's; rerun {taken} --quick, or choose another --out")
    return whole


#: the local-work counts a benchmark keeps at its target (`dane.work`, docs/results.md's schema): passes beside the
#: second-order work, since a table that ranks methods on passes alone understates a Newton-type method's work
LOCAL_WORK = ("local_passes", "local_hvps", "local_hessians", "local_factorizations")


def local_work_to(records: list[dict], hit: int) -> dict:
    """Each count of `LOCAL_WORK` spent to reach record ``hit``'s iterate (a record counts what reaching its iterate
    cost: `dane.loop.runner.run`); a count the records do not hold (from before it was counted, or None) is left
    out, not zero."""
    return {key: value for key in LOCAL_WORK if (value := records[hit].get(key)) is not None}


# ---------------------------------------------------------------- in-process sections: rows, targets
def stamped(measure: Callable[[], dict]) -> dict:
    """``measure()`` between its record: ``started_at`` and ``load_avg_before`` before it, ``load_avg_after`` and
    ``wall_s`` after it."""
    head = {"started_at": now(), "load_avg_before": load()}
    start = time.perf_counter()
    body = measure()
    return {**head, **body, "load_avg_after": load(), "wall_s": time.perf_counter() - start}


def kept(run: Run) -> dict:
    """The section ``--out`` held, where it was taken at the same ``--quick``, else nothing: what a run of some
    rows or parts keeps of the others."""
    return dict(run.earlier) if run.earlier.get("quick") == run.args.quick else {}


def optimum_of(records: list[dict]) -> float | None:
    """O* as the first record with a finite suboptimality gives it (objective − suboptimality); None where none has one."""
    return next((r["objective"] - r["suboptimality"] for r in records
                 if r.get("suboptimality") is not None and math.isfinite(r["suboptimality"])), None)


def relative(records: list[dict], f_star: float | None = None) -> list[float]:
    """Each record's relative suboptimality (O(w) − O*)/|O*|, inf where it has no finite one; O* is ``f_star``, else
    each record's own (objective − suboptimality)."""
    def one(r: dict) -> float:
        sub = r.get("suboptimality")
        if sub is None or not math.isfinite(sub):
            return math.inf
        star = r["objective"] - sub if f_star is None else f_star
        return sub / (abs(star) if star != 0 else 1.0)

    return [one(r) for r in records]


def first_at(values: list[float], tol: float) -> int | None:
    """The first index whose value is at most ``tol``, None where none is."""
    return next((i for i, value in enumerate(values) if value <= tol), None)


def grid(cells: Callable[[Run], dict[str, Any]], measure: Callable[[Run, Any], dict] | None = None,
         *, head: Callable[[argparse.Namespace], dict] | None = None, into: str = "rows",
         skip: Callable[[argparse.Namespace], str | None] | None = None,
         after: Callable[[dict], dict] | None = None, optional: tuple[str, ...] = ()) -> Callable[[Run], dict]:
    """A section's run from its declarations, the one cell loop (docs/benchmarks.md, section Benchmarks, says how
    it treats ``--only`` and ``--resume``).  ``cells(run)`` names the section's cells in order (a name -> what
    ``measure(run, cell)`` needs; without ``measure`` a cell is a call, ``cell()``, such as a `functools.partial`);
    ``head(args)`` gives the keys that say what the section measures.  The section is the runner's record
    (``started_at``, ``machine``, ``quick``), ``head``'s keys and, under ``into``, one row per cell, `stamped` and
    saved into ``--out`` as it ends.  ``optional``: cells (names or first words) measured only where ``--only`` names
    them (a GPU's, a slow variant's).  ``skip(args)``: why nothing can run here (no data, no device), or None; the
    section then holds it as ``skipped`` and the command exits 2, unless it has ``--skip-without-data``.
    ``after(rows)``: keys computed from all the rows, kept ones too (a winner), added at the end."""
    def run(bench: Run) -> dict:
        args = bench.args
        section = {**bench.header(), "quick": args.quick, **(head(args) if head else {})}
        if skip and (why := skip(args)):
            bench.log(f"{bench.bench.key}: skipped, {why}")
            section = bench.finish({**section, "skipped": why})
            if not getattr(args, "skip_without_data", False):
                raise SystemExit(2)
            return section
        todo = cells(bench)
        rows = section[into] = dict(kept(bench).get(into, {}))
        only = getattr(args, "only", None) or [n for n in todo if n.split()[0] not in optional]
        for name in [n for n in todo if any(n == o or n.startswith(f"{o} ") for o in only)]:
            if not (getattr(args, "resume", False) and name in rows):
                bench.log(f"{bench.bench.key}.{name}")
                rows[name] = stamped(lambda: measure(bench, todo[name]) if measure else todo[name]())
                bench.save(section)
        return bench.finish({**section, **(after(rows) if after else {})})

    return run


def timer(fn: Callable[[], Any]) -> float:
    """The wall seconds (perf_counter) of one call of ``fn``."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def paired(jobs: tuple[tuple[str, ...], tuple[str, ...]], repeats: int, log) -> dict:
    """``repeats`` interleaved `timed_run` pairs of a per-worker job and its batched twin (asserted to have run on
    the threads and on the batched path): per pair the rounds' seconds, their ``ratio`` (per-worker over
    batched), the CPU seconds and their ``cpu_ratio``, the largest relative gap of the objectives and the
    simulated seconds; the ratio's median, min and max, the CPU ratio's median and the largest gap."""
    pairs = []
    for _ in range(repeats):
        threads, batched = timed_run(*jobs[0]), timed_run(*jobs[1])
        assert threads["path"] == "threads" and batched["path"] == "batched"
        pairs.append({"threads_rounds_s": threads["rounds_s"], "batched_rounds_s": batched["rounds_s"],
                      "threads_cpu_s": threads["total_cpu_s"], "batched_cpu_s": batched["total_cpu_s"],
                      "ratio": threads["rounds_s"] / batched["rounds_s"],
                      "cpu_ratio": threads["total_cpu_s"] / batched["total_cpu_s"],
                      "objective_rel_diff": max(abs(a - b) / abs(a) for a, b in
                                                zip(threads["objectives"], batched["objectives"])),
                      "threads_simulated_s": threads["simulated_time_s"],
                      "batched_simulated_s": batched["simulated_time_s"], "load_avg": batched["load_avg"]})
        log(f"{jobs[0]}: per-worker {threads['rounds_s']:.2f} s, batched {batched['rounds_s']:.2f} s, "
            f"ratio {pairs[-1]['ratio']:.2f}")
    ratios = [p["ratio"] for p in pairs]
    return {"ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
            "cpu_ratio_median": statistics.median(p["cpu_ratio"] for p in pairs),
            "objective_rel_diff_max": max(p["objective_rel_diff"] for p in pairs), "pairs": pairs}


def in_fresh_process(function: str, *arguments, env: dict | None = None) -> dict:
    """``module:name(*arguments)`` (JSON in, JSON out) in a fresh Python process from the repository root, one
    OpenMP thread, ``env`` added: what a measurement of imports, compilation or peak memory needs; its answer, or
    ``failed`` with the last line of its error."""
    import json
    import subprocess
    import sys

    module, name = function.split(":")
    code = f"import json, sys; from {module} import {name}; print(json.dumps({name}(*json.loads(sys.argv[1]))))"
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(arguments)], capture_output=True, text=True, cwd=root,
                          env={**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1", **(env or {})})
    if proc.returncode != 0:
        return {"failed": proc.stderr.strip().splitlines()[-1:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def data_dir() -> Path:
    """DANE_DATA_DIR (default, also where it is empty: ../shared/data) as an absolute folder, a relative one from the
    repository root."""
    from dane.data.table import resolve_dir

    return resolve_dir(os.environ.get("DANE_DATA_DIR") or "../shared/data")


def mnist_dir() -> Path:
    """The ``mnist`` folder of `data_dir`."""
    return data_dir() / "mnist"


def mnist_missing() -> str | None:
    """Why the MNIST sections cannot run here (no `mnist_dir`), or None."""
    where = mnist_dir()
    return None if where.is_dir() else f"no MNIST files in {where} (set DANE_DATA_DIR to a folder holding mnist/)"


# ---------------------------------------------- the grid sections' runner (bench_federated, bench_defaults)
#: the knobs a default chooses at run time and logs in its first record, which a grid's ``X_times_default`` multiplies
CHOSEN = ("lam", "mu", "p", "lr")


def resolve(settings: dict, *, L: float | None = None, delta_a: float | None = None,
            chosen: dict | None = None) -> dict:
    """The algorithm keys of a grid setting: ``lr_times_L: c`` is lr = c/L; ``X_per_delta: c`` is X = c·δ_A (the
    shards' measured mean-square dissimilarity); ``X_times_default: c`` is c times the X the default run chose
    (``chosen``: `CHOSEN` of its first record), a probability p at most 1 (Scaffnew's p = 1 is GD with its step);
    other keys as given.  A multiple of what the default did not log is a ValueError naming it."""
    keys = {}
    for key, value in settings.items():
        if key == "lr_times_L":
            keys["lr"] = value / L
        elif key.endswith("_per_delta"):
            keys[key.removesuffix("_per_delta")] = value * delta_a
        elif key.endswith("_times_default"):
            name = key.removesuffix("_times_default")
            if (chosen or {}).get(name) is None:
                raise ValueError(f"{key}: the default run logged no {name}")
            keys[name] = min(value * float(chosen[name]), 1.0) if name == "p" else value * float(chosen[name])
        else:
            keys[key] = value
    return keys


def fit_setting(problem, algorithm: str, settings: dict, measure: Callable, failed: dict, *, given: dict,
                extra: dict, digits: int, **fit) -> tuple[dict, dict | None]:
    """One `dane.fit` of ``algorithm`` at a grid setting (``given``: `resolve`'s keywords; ``extra``: keys added to
    every setting's): the row ``{settings, **measure(result, settings, keys), wall_s}`` and the run's first record
    (None: no record).  A setting that does not resolve, or whose run raises, is a row too (``failed``, status
    ``error`` and the error's one line): the grid goes on."""
    import dane

    start = time.perf_counter()
    try:
        keys = {**resolve(settings, **given), **extra}
    except ValueError as exc:
        return {"settings": settings, **failed, "status": "error", "error": str(exc), "wall_s": 0.0}, None
    try:
        result = dane.fit(problem, algorithm, **fit, **keys)
    except Exception as exc:  # noqa: BLE001 -- a setting that fails is a result
        return {"settings": settings, **failed, "status": "error",
                "error": f"{type(exc).__name__}: {exc}".splitlines()[0],
                "wall_s": round(time.perf_counter() - start, digits)}, None
    wall = round(time.perf_counter() - start, digits)
    return {"settings": settings, **measure(result, settings, keys), "wall_s": wall}, (result.records or [None])[0]


def default_and_grid(problem, algorithm: str, default: dict, grid: list[dict], measure: Callable, failed: dict, *,
                     given: dict, **fit) -> tuple[dict, list[dict], dict | None]:
    """``algorithm``'s default run (settings ``default``) and one run per setting of its ``grid``, each a `fit_setting`
    (``measure``, ``failed``, ``fit``: its own) whose `resolve` gets ``given`` and what the default chose (`CHOSEN`
    of its first record, for ``X_times_default``; None where it made none).  Returns the rows and what it chose."""
    row, first = fit_setting(problem, algorithm, default, measure, failed, given={**given, "chosen": None}, **fit)
    chosen = None if first is None else {k: v for k, v in first.items() if k in CHOSEN}
    return row, [fit_setting(problem, algorithm, settings, measure, failed, given={**given, "chosen": chosen}, **fit)[0]
                 for settings in grid], chosen


def in_process(job, *, write: bool = False) -> tuple[dict, list[dict], float, float]:
    """The run ``dane simulate <job>`` makes, in this process (`dane.loop.launch.execute`): its summary, its records
    and the call's wall and CPU seconds; ``write``: into a temporary run folder, as the command writes its own."""
    import tempfile
    from contextlib import nullcontext

    from dane.experiments.config import run_spec
    from dane.loop.launch import execute
    from dane.synthetic.sweep import compose_job

    spec, collected = run_spec(compose_job(tuple(job))), {}
    with tempfile.TemporaryDirectory() if write else nullcontext() as folder:
        start, cpu = time.perf_counter(), time.process_time()
        summary = execute(spec, folder, collect=collected)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return summary, collected["records"], wall, cpu


# ---------------------------------------------------------------------- launched and timed (the launch sections)
def launch(cmd: list[str], *, env: dict[str, str] | None = None, answer: Path | None = None,
           timeout: float = 1800, log: Path | None = None) -> dict:
    """One command, timed from outside: run in the checkout with `launch_env(env)` (the package's Horovod settings,
    the checkout on PYTHONPATH), its output into ``log`` (kept) or a temporary file.

    Returns ``start`` and ``end`` (time.time() around it), ``answer`` (``answer``'s modification time: the result on
    disk; ``end`` where no file is asked for), ``wall_s`` (perf_counter), ``exit_status``, ``timed_out`` (its session
    killed after ``timeout`` s), ``peak_rss_gib`` (`with_peak`: the largest resident set of its waited-for processes,
    so a launcher's largest rank), ``load_before``, ``load_after``, and where it failed (an exit status, or no
    ``answer`` file) ``error``: the output's last 10 lines.  The wait blocks (no polling): ``end`` is the return to
    within the scheduler's wake-up (the wrapper's start is inside ``wall_s``: a few ms)."""
    import signal
    import subprocess
    import tempfile
    import threading

    from dane.synthetic.launchers import REPO, launch_env

    before = load()
    with (open(log, "w+") if log else tempfile.TemporaryFile("w+")) as output, \
            tempfile.NamedTemporaryFile("r") as peak:
        start, t0 = time.time(), time.perf_counter()
        proc = subprocess.Popen(with_peak(cmd, peak.name), cwd=REPO, env=launch_env(env), stdout=output,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        killer = threading.Timer(timeout, lambda: os.killpg(proc.pid, signal.SIGKILL))
        killer.daemon = True
        killer.start()
        try:
            _, status, _ = os.wait4(proc.pid, 0)
        except BaseException:  # a Ctrl-C reaches this process only (the command has its own session): end it too
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        finally:
            killer.cancel()
        end, wall = time.time(), time.perf_counter() - t0
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        out = {"start": start, "end": end, "wall_s": wall, "exit_status": code, "timed_out": wall > timeout,
               "peak_rss_gib": peak_of(peak.name), "load_before": before, "load_after": load(),
               "answer": end if answer is None else answer.stat().st_mtime if answer.exists() else None}
        if code != 0 or out["answer"] is None:
            output.seek(0)
            out["error"] = "\n".join(output.read().strip().splitlines()[-10:])
    return out


#: the small interpreter `with_peak` runs a command under: it writes the largest resident set (KiB, ru_maxrss) of the
#: command's waited-for processes into the file ``argv[1]`` and ends as the command did (its status, or its signal)
PEAK_WRAPPER = ("import os, resource, subprocess, sys; code = subprocess.call(sys.argv[2:]); "
                "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)); "
                "code < 0 and os.kill(os.getpid(), -code); sys.exit(code)")


def with_peak(cmd: list[str], peak_file: str) -> list[str]:
    """``cmd`` under `PEAK_WRAPPER`, which writes its peak into ``peak_file`` (`peak_of` reads it): forked from this
    small interpreter, not the benchmark, whose size Linux counts into the command's ru_maxrss (docs/benchmarks.md,
    section `federated_scale`)."""
    import sys

    return [sys.executable, "-c", PEAK_WRAPPER, peak_file, *cmd]


def peak_of(peak_file: str) -> float | None:
    """GiB: the peak `with_peak` wrote; None where it wrote none (the command was killed)."""
    try:
        return int(Path(peak_file).read_text()) / 2 ** 20
    except (OSError, ValueError):
        return None


def peak_rss_kb() -> int:
    """This process's peak resident set (kB): VmHWM of /proc/self/status (since its exec, unlike ru_maxrss, which
    counts the process it was forked from: `with_peak`) where there is one, else ru_maxrss."""
    import resource

    status = Path("/proc/self/status")
    lines = status.read_text().splitlines() if status.exists() else []
    return next((int(line.split()[1]) for line in lines if line.startswith("VmHWM:")),
                resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def trained(out: Path, overrides, *, np: int | None = None, launcher: str = "horovodrun",
            env: dict[str, str] | None = None, timeout: float = 900, log: Path | None = None,
            module: str = "dane.experiments.train") -> dict:
    """One ``module`` run (``dane.experiments.train``'s) of ``overrides`` into ``out`` (``out_dir`` added), timed from
    outside by `launch`: ``np`` None in one process (the simulator), else ``launcher`` (``horovodrun`` or
    ``torchrun``) with ``np`` processes.  Returns `launch`'s record (its ``error`` where the run failed or wrote no
    summary.json), ``summary`` (None where none was written) and ``records``, the rounds ([] where none)."""
    import sys

    from dane.records.results import read_rounds, read_summary
    from dane.synthetic.launchers import horovodrun_command, torchrun_command

    args = [*overrides, f"out_dir={out}"]
    command = {"horovodrun": horovodrun_command, "torchrun": torchrun_command}[launcher]
    t = launch([sys.executable, "-m", module, *args] if np is None else command(module, args, np=np), env=env,
               answer=out / "summary.json", timeout=timeout, log=log)
    return {**t, "summary": read_summary(out) if (out / "summary.json").exists() else None,
            "records": read_rounds(out) if (out / "rounds.jsonl").exists() else []}


def matching(rows: list[dict], key: str, **match) -> dict | None:
    """`spread` of ``key`` over the rows that have it and match every ``match`` (a failed launch has no ``key``)."""
    return spread([r[key] for r in rows if key in r and all(r.get(k) == v for k, v in match.items())])


def over(a: dict | None, b: dict | None) -> float | None:
    """The ratio of two `spread` medians; None where either is missing."""
    return a["median"] / b["median"] if a and b else None


def interleave(variants, repeats: int, measure: Callable[[Any, int], dict], rotate: bool = False) -> dict[Any, list]:
    """``measure(variant, repeat)`` for every repeat and variant, the variants taking turns so that each repeat
    sees them under one load (``rotate``: the order shifted one place a repeat, so none is always first): the
    results by variant, in repeat order."""
    variants = list(variants)
    runs: dict[Any, list] = {v: [] for v in variants}
    for repeat in range(repeats):
        for k in range(len(variants)):
            variant = variants[(k + repeat) % len(variants) if rotate else k]
            runs[variant].append(measure(variant, repeat))
    return runs


def best_of(fn: Callable[[], Any], repeats: int) -> float:
    """The least wall time (perf_counter) of ``repeats`` calls of ``fn``: its cost with the least interference."""
    return min(timer(fn) for _ in range(repeats))


def spreads(runs: list[dict], keys) -> dict:
    """`spread` of each of ``keys`` over ``runs`` (a run without the key left out)."""
    return {key: spread([r.get(key) for r in runs]) for key in keys}


# ------------------------------------------------------------- the launch sections' pieces (horovod, scaling, cuda)
def steady(records: list[dict], since: int = 1) -> list[float]:
    """The seconds of each round after round ``since`` (differences of the records' ``time_s``): round 0 is the first
    evaluation and round 1 factors the shards or warms up, so those after 1 are the rounds a longer run repeats."""
    times = [r["time_s"] for r in records[since:]]
    return [b - a for a, b in zip(times, times[1:])]


def need_horovod() -> None:
    """Exit 2 with one line where horovod.torch is not importable: the launch sections start horovodrun."""
    from dane.errors import say
    from dane.synthetic.launchers import have_horovod

    if not have_horovod():
        say("error: horovod.torch is not importable; run `make setup` first")
        raise SystemExit(2)


# ------------------------------------------------- a process tree timed from outside (bench_federated_scale)
def tree_memory(pid: int) -> int:
    """Bytes: the proportional set size (a shared page counted once in all) summed over ``pid`` and its descendants."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            children.setdefault(int(stat.read_text().rsplit(")", 1)[1].split()[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    total, todo = 0, [pid]
    while todo:
        process = todo.pop()
        todo += children.get(process, [])
        try:
            with open(f"/proc/{process}/smaps_rollup") as rollup:
                total += sum(int(line.split()[1]) * 1024 for line in rollup if line.startswith("Pss:"))
        except OSError:
            pass
    return total


def launched(cmd: list[str], timeout: float, env: dict[str, str]) -> dict:
    """``cmd`` from the repository root in a session of its own (``env`` added to this one's, output unbuffered),
    each output line stamped with perf_counter as it arrives, its whole tree killed after ``timeout`` s and at its
    end (daemons it left, such as Ray's): ``exit_status``, ``timed_out``, ``wall_s``, ``peak_tree_gib`` (`tree_memory`
    sampled every 0.25 s), ``peak_rss_gib`` (`with_peak`: the largest resident set of its waited-for processes),
    ``load_before``, ``load_after`` and ``lines``, (stamp, text) pairs."""
    import signal
    import subprocess
    import tempfile
    import threading

    def kill():
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    before, peak, done = load(), [0], threading.Event()
    peak_file = tempfile.NamedTemporaryFile("r")
    start = time.perf_counter()
    proc = subprocess.Popen(with_peak(cmd, peak_file.name), cwd=Path(__file__).resolve().parents[1], text=True,
                            start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def watch():
        while not done.wait(0.25):
            peak[0] = max(peak[0], tree_memory(proc.pid))
            if time.perf_counter() - start > timeout:
                kill()

    threading.Thread(target=watch, daemon=True).start()
    lines = [(time.perf_counter(), line.rstrip("\n")) for line in proc.stdout]
    _, status, _ = os.wait4(proc.pid, 0)
    done.set()
    wall = time.perf_counter() - start
    kill()
    with peak_file:
        peak_rss = peak_of(peak_file.name)
    return {"exit_status": os.waitstatus_to_exitcode(status), "timed_out": wall > timeout, "wall_s": wall,
            "peak_tree_gib": peak[0] / 2 ** 30, "peak_rss_gib": peak_rss,
            "load_before": before, "load_after": load(), "lines": lines}
