"""The processes the fast suite shares: one launch per kind a session, read by many tests.

A test module registers, at import, what it needs run; the first test that asks for the fixture runs
everything registered by the modules of the session's selected tests, once:

- `command` rows -> the ``commands`` fixture: ONE batch process runs each row in-process, as
  ``python -m <module> <args>`` runs it (`runpy`), with file descriptors 1 and 2 captured, so that a row
  costs a config composition (and its run), not an interpreter and a torch import.  For a test whose point
  is an exit status, a one-line error or the records of a small run.
- `job` functions -> the ``fresh`` fixture: ONE fresh interpreter first imports step by step and notes what
  each step loaded (`FRESH_IMPORTS`: import laziness needs a process that imported nothing; `FRESH_FORKS` in
  forks of it, before torch is imported), then calls each
  registered ``module:function`` (for what needs processes of its own: a real exit, a signal, sibling
  processes), each returning what its test asserts on (JSON).

Each kind is one process started by the pytest process (`horovodrun` and `torchrun` launches are the
tests of tests/test_launchers.py), in the background as soon as the selection is known (tests/conftest.py),
so that it runs beside the in-process tests; the modules that read it run last.  This module imports only the standard library: the fresh interpreter
runs it before anything else is imported.

``{tmp}`` in a row's arguments, environment, cwd and watched path is the session's batch folder.
"""
from __future__ import annotations

import functools
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Command:
    name: str
    args: tuple[str, ...]
    module: str = "experiments.train"
    env: dict = field(default_factory=dict)  # set around the row (and restored)
    cwd: str = ""                              # the working folder of the row ("": the batch folder)
    around: str = ""                           # "module:function": a context manager, called with the batch folder
    watch: str = ""                            # a path: whether it existed before the row and is byte for byte unchanged
    owner: str = ""                            # the test module that registered it


@dataclass(frozen=True)
class Job:
    name: str
    function: str                              # "module:function", called as function(batch folder, *args)
    args: tuple = ()
    owner: str = ""


COMMANDS: dict[str, Command] = {}
JOBS: dict[str, Job] = {}
PREPARE: dict[str, list] = {}                 # owner -> functions called with the batch folder before the batch


def _owner() -> str:
    return sys._getframe(2).f_globals.get("__name__", "")


def _register(table: dict, item) -> str:
    if item.name in table and table[item.name] != item:
        raise ValueError(f"{item.name} is registered twice, differently: {table[item.name]} and {item}")
    table[item.name] = item
    return item.name


def command(name: str, *args: str, **kwargs) -> str:
    """Register ``python -m module args`` (experiments.train unless ``module=``) as the batch row ``name``."""
    return _register(COMMANDS, Command(name, tuple(args), owner=_owner(), **kwargs))


def job(name: str, function: str, *args) -> str:
    """Register ``function(batch folder, *args)`` (``module:function``) as the fresh interpreter's job ``name``."""
    return _register(JOBS, Job(name, function, tuple(args), owner=_owner()))


def prepare(function) -> None:
    """Register ``function(batch folder)``: the files the rows of its module name, written before the batch."""
    PREPARE.setdefault(function.__module__, []).append(function)


def fill(text: str, tmp: Path) -> str:
    return text.replace("{tmp}", str(tmp))


def process_env(extra: dict | None = None) -> dict:
    return {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}", "OMP_NUM_THREADS": "1",
            **(extra or {})}


# ------------------------------------------------------------------ in the batch process


def run_batch(rows_file: str) -> None:
    """Run each row in-process (inside its ``around``); write [{rc, stdout, stderr, existed, unchanged}]."""
    import warnings

    warnings.filterwarnings("ignore", message=".*found in sys.modules.*")  # runpy re-running an imported module
    tmp = Path(rows_file).parent
    results = []
    for row in json.loads(Path(rows_file).read_text()):
        with _context(row["around"])(tmp) if row["around"] else nullcontext():
            target = Path(row["watch"]) if row["watch"] else None
            before = snapshot(target) if target is not None and target.exists() else None
            results.append(run_row(row, tmp))
            results[-1].update(existed=before is not None,
                               unchanged=before is not None and target.exists() and snapshot(target) == before)
    Path(rows_file + ".out").write_text(json.dumps(results))


def _context(name: str):
    module, function = name.split(":")
    return getattr(importlib.import_module(module), function)


def run_row(row: dict, tmp: Path) -> dict:
    """One row in-process, as ``python -m`` runs it: {rc, stdout, stderr}."""
    import runpy

    saved_env = {k: os.environ.get(k) for k in row["env"]}
    os.environ.update(row["env"])
    saved_cwd = os.getcwd()
    os.chdir(row["cwd"] or tmp)
    sys.argv = [row["module"], *row["args"]]
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            runpy.run_module(row["module"], run_name="__main__", alter_sys=True)
            rc = 0
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        except BaseException:  # noqa: BLE001 - a traceback is what a row must not get: record it
            traceback.print_exc()
            rc = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)
            os.chdir(saved_cwd)
            for k, v in saved_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        out.seek(0)
        err.seek(0)
        return {"rc": rc, "stdout": out.read().decode(errors="replace"), "stderr": err.read().decode(errors="replace")}


def snapshot(path: Path) -> dict[str, bytes] | bytes:
    """A file's bytes, or a folder's {relative path: bytes}."""
    if path.is_file():
        return path.read_bytes()
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------ in the fresh interpreter

#: the fresh interpreter's first steps, each after the one before: (statement, modules it must not have loaded,
#: modules it must have loaded).  In one process a step's sys.modules holds every module an earlier step loaded, a
#: superset of what the step alone loads (each statement imports dane first anyway): "absent here" implies "absent
#: in a fresh ``python -c <statement>``", so the shared check is at least as strict as one process a statement.
#: A "loaded" module was absent at the step before (it is also listed there), so this step loaded it.
FRESH_IMPORTS = (
    ("import dane", ("sklearn", "scipy.optimize", "matplotlib", "hydra", "omegaconf"), ()),
    ("import dane.loop.launch", ("sklearn", "scipy.optimize", "matplotlib", "hydra"), ()),
    ("import torch, dane.problems.glm, dane.numerics.local_solvers", ("numba",), ()),
    ("import torch, dane.numerics.local_solvers as ls; from test_svrg import shard, subproblem; "  # the first svrg solve
     "ls.svrg(subproblem(shard('squared', sparse=False)), ls.LocalSolver('svrg'), torch.Generator())", (), ("numba",)),
)


#: the commands whose help imports no torch (`FRESH_FORKS`), with every figure's (`helps`)
HELPS = (("--help",), ("train", "--help"), ("simulate", "--help"), ("figures", "--help"), ("bench", "--help"),
         ("calibrate", "--help"))


def helps() -> tuple[tuple[str, ...], ...]:
    """`HELPS`, then ``figures NAME --help`` for each figure and table of paper_figs/ (what ``dane figures NAME``
    draws): a figure reads results and never trains, so its help needs no torch either."""
    from dane.experiments.cli import figure_names  # not at the top: this module imports only the standard library

    return HELPS + tuple(("figures", name, "--help") for name in figure_names())
#: statements each run in a fork of the fresh interpreter after `FRESH_IMPORTS`' first step (``import dane``), before a
#: step imports torch, so that no later step sees what they loaded (a command's help loads Hydra, which the next step
#: must not): (statement, which sets ``value``; modules it must not have loaded).  A fork starts no interpreter.
FRESH_FORKS = (
    ("import runs; value = runs.exit_statuses('dane.experiments.cli:main', runs.helps())", ("torch",)),
)


def exit_statuses(function: str, argvs, watched: str = "torch") -> list[list]:
    """[``function(argv)``'s exit status, whether module ``watched`` is loaded after it] for each of ``argvs`` in turn,
    its output (a help's page) captured and dropped: the first ``True`` is the command that loaded it."""
    import contextlib
    import io

    said = []
    for argv in argvs:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                _context(function)(list(argv))
                status = 0
            except SystemExit as exc:
                status = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        said.append([status, watched in sys.modules])
    return said


def forked(statement: str) -> dict:
    """``statement`` run in a fork of this interpreter (`FRESH_FORKS`): {value: its ``value``, modules: sys.modules
    after it}, or {error: its traceback}; this interpreter's modules are untouched."""
    sys.stdout.flush()
    sys.stderr.flush()  # nothing buffered for the child to write a second time
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            namespace: dict = {}
            exec(statement, namespace)  # noqa: S102 - the statements of FRESH_FORKS, nothing from outside
            answer = {"value": namespace.get("value"), "modules": sorted(sys.modules)}
        except BaseException:  # noqa: BLE001 - the test shows it
            answer = {"error": traceback.format_exc()}
        with os.fdopen(write, "w") as pipe:
            json.dump(answer, pipe)
        os._exit(0)  # the answer is written and closed; the parent's atexit handlers and exit are not the child's
    os.close(write)
    with os.fdopen(read) as pipe:
        answer = json.load(pipe)
    os.waitpid(pid, 0)
    return answer


def run_fresh(jobs_file: str) -> None:
    """In a fresh interpreter: `FRESH_IMPORTS` (the modules loaded after each step; `FRESH_FORKS` after the first),
    then each job."""
    tmp = Path(jobs_file).parent
    imports, forks = [], []
    for step, (statement, _, _) in enumerate(FRESH_IMPORTS):
        exec(statement, {})  # noqa: S102 - the statements above, nothing from outside
        imports.append(sorted(sys.modules))
        if step == 0:
            forks = [forked(fork) for fork, _ in FRESH_FORKS]
    results = {"imports": imports, "forks": forks, "jobs": {}}
    for spec in json.loads(Path(jobs_file).read_text()):
        try:
            value = {"ok": _context(spec["function"])(tmp, *spec["args"])}
        except BaseException:  # noqa: BLE001 - the test shows it
            value = {"error": traceback.format_exc()}
        results["jobs"][spec["name"]] = value
    Path(jobs_file + ".out").write_text(json.dumps(results))


# ------------------------------------------------------------------ in the pytest process


@dataclass
class Batch:
    tmp: Path
    results: dict

    def __getitem__(self, name: str) -> dict:
        return self.results[name]


@functools.cache
def without_dac_override() -> list[str] | None:
    """A command prefix under which root obeys file permissions (setpriv drops CAP_DAC_OVERRIDE and
    CAP_DAC_READ_SEARCH from the bounding set); [] for another user; None where root cannot drop them."""
    if os.geteuid() != 0:
        return []
    prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]
    if shutil.which("setpriv") and subprocess.run([*prefix, "true"], capture_output=True).returncode == 0:
        return prefix
    return None


def selected_owners(session) -> set[str]:
    return {item.module.__name__ for item in session.items if getattr(item, "module", None) is not None}


class Started:
    """A shared process started in the background: ``result()`` waits for it and reads what it wrote."""

    def __init__(self, tmp: Path, command: list[str], out_file: Path, cwd: Path, read):
        self.tmp, self.out_file, self.read = tmp, out_file, read
        self.log = tmp / "process.log"  # its stdout and stderr: a file, not a pipe nobody reads while tests run
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(command, cwd=cwd, env=process_env(), stdout=log, stderr=subprocess.STDOUT)
        self.done = None

    def result(self) -> Batch:
        if self.done is None:
            returncode = self.proc.wait(timeout=1200)
            assert returncode == 0, self.log.read_text()[-5000:]
            self.done = Batch(self.tmp, self.read(json.loads(self.out_file.read_text())))
        return self.done

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def start_batch(tmp: Path, owners: set[str], prefix: list[str]) -> Started:
    """The ``commands`` of ``owners``' rows: one process (``prefix`` before the python, e.g. setpriv), started now."""
    for owner in sorted(owners & PREPARE.keys()):
        for function in PREPARE[owner]:
            function(tmp)
    rows = [c for c in COMMANDS.values() if c.owner in owners]
    rows_file = tmp / "rows.json"
    rows_file.write_text(json.dumps([
        {**asdict(c), "args": [fill(a, tmp) for a in c.args], "env": {k: fill(v, tmp) for k, v in c.env.items()},
         "cwd": fill(c.cwd, tmp), "watch": fill(c.watch, tmp)} for c in rows]))
    return Started(tmp, [*prefix, sys.executable, "-c", f"import runs; runs.run_batch({str(rows_file)!r})"],
                   Path(f"{rows_file}.out"), tmp, lambda results: {c.name: r for c, r in zip(rows, results)})


def start_fresh(tmp: Path, owners: set[str]) -> Started:
    """The ``fresh`` interpreter's imports and the jobs of ``owners``: one process, started now."""
    jobs_file = tmp / "jobs.json"
    jobs_file.write_text(json.dumps([asdict(j) for j in JOBS.values() if j.owner in owners]))
    return Started(tmp, [sys.executable, "-c", f"import runs; runs.run_fresh({str(jobs_file)!r})"],
                   Path(f"{jobs_file}.out"), REPO, lambda results: results)
