"""Where a run or a figure came from: code commit, command, date, machine load, and code of one's own.

A run records `run_provenance()` in its ``summary.json`` (taken when its writer opens,
so the load average is the machine's state as the run started).  A figure's sidecar
collects its runs' records (`paper_figs.common.save`), so a figure drawn twice from
the same logs carries the same provenance: nothing in it depends on when it was drawn.
"""
from __future__ import annotations

import hashlib
import json
import os
from contextlib import contextmanager
import site
import socket
import subprocess
import sys
import sysconfig
import time
from functools import lru_cache
from pathlib import Path

from ..layout import CHECKOUT  # noqa: E402
#: set by a launcher that starts the run's processes itself (experiments.launchers): its command line, as JSON
LAUNCH_COMMAND_ENV = "DANE_LAUNCH_COMMAND"
#: set where the process's own command line is a launcher's, not the run's (submitit's ``_submit.py`` in a
#: Slurm job, `experiments.slurm_launcher`): the run's command line as a user would type it, as JSON
RUN_COMMAND_ENV = "DANE_RUN_COMMAND"
#: set by a sweep's process launcher (experiments.launchers) for a job it starts: the sweep's command line, as JSON
SWEEP_COMMAND_ENV = "DANE_SWEEP_COMMAND"


@lru_cache(maxsize=1)
def code_version() -> dict:
    """``{"git_commit": sha or None, "git_dirty": bool or None}`` of the package's checkout (None installed)."""
    if CHECKOUT is None:  # an installed wheel: a git repository around site-packages is not its source
        return {"git_commit": None, "git_dirty": None}
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(CHECKOUT), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"git_commit": commit, "git_dirty": None if status is None else bool(status)}


@lru_cache(maxsize=1)
def numerics_platform() -> dict:
    """What decides a run's floating-point bits besides its config and seed: the torch build and
    the CPU instruction set its kernels use (runs agree bit for bit only where these agree)."""
    import platform

    import torch

    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "machine": platform.machine()}


def launch_layout(env=os.environ) -> dict | None:
    """How the launcher laid the processes out, as it told this process; None under plain python.

    horovodrun: world ``size``, ``local_size`` (processes on this host), ``cross_size``
    (hosts; 2 for ``-H a:1,b:1``) and this rank's ``hostname`` from ``-H``/``--hostfile``.
    torchrun: ``size``, ``local_size``, ``nodes`` (its agents, one per ``--nnodes``), and ``restarts``, how
    often torchrun had restarted the workers when this attempt began (of ``max_restarts``, ``--max-restarts``).
    srun (a Slurm job step, `slurm_layout`): ``size``, ``nodes``, ``hosts`` and the Slurm ``job_id``.
    ``command`` is the launch command line when a dane launcher started the processes
    (`LAUNCH_COMMAND_ENV`); a launcher started by hand is not visible from inside.
    """
    if "HOROVOD_RANK" in env:
        layout = {"launcher": "horovodrun", "size": int(env.get("HOROVOD_SIZE", 1)),
                  "local_size": int(env.get("HOROVOD_LOCAL_SIZE", 1)), "cross_size": int(env.get("HOROVOD_CROSS_SIZE", 1)),
                  "hostname": env.get("HOROVOD_HOSTNAME")}
    elif "TORCHELASTIC_RUN_ID" in env:
        layout = {"launcher": "torchrun", "size": int(env.get("WORLD_SIZE", 1)),
                  "local_size": int(env.get("LOCAL_WORLD_SIZE", 1)), "nodes": int(env.get("GROUP_WORLD_SIZE", 1)),
                  "restarts": int(env.get("TORCHELASTIC_RESTART_COUNT", 0)),
                  "max_restarts": int(env.get("TORCHELASTIC_MAX_RESTARTS", 0))}
    elif "SLURM_JOB_ID" in env and "SLURM_STEP_ID" in env:
        layout = slurm_layout(env)
    else:
        return None
    if LAUNCH_COMMAND_ENV in env:
        try:
            layout["command"] = json.loads(env[LAUNCH_COMMAND_ENV])
        except json.JSONDecodeError:
            layout["command"] = env[LAUNCH_COMMAND_ENV]
    return layout


def slurm_layout(env) -> dict:
    """An srun step as Slurm describes it to each task: its task count (``size``), node count and host list, the job."""
    def number(*keys: str) -> int | None:
        value = next((env[k] for k in keys if k in env), None)
        return int(value) if value is not None and value.isdigit() else None

    job = env["SLURM_JOB_ID"] + (f"_{env['SLURM_ARRAY_TASK_ID']}" if "SLURM_ARRAY_TASK_ID" in env else "")
    return {"launcher": "srun", "size": number("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS") or 1,
            "nodes": number("SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES") or 1,
            "hosts": env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST"), "job_id": job}


_entry_command: list[str] | None = None  # set once by the dane command, for this process only
_entry_prog: str | None = None  # its command without the arguments (``dane figures summary``)


def command_name() -> str | None:
    """What a usage line calls this process's command (``dane figures summary``) when the ``dane`` command started
    it, else None (argparse's own: the script's file).  `runpy` puts the module's file in ``sys.argv[0]``, which
    argparse would name."""
    return _entry_prog


def set_entry_command(argv: list[str], prog: str | None = None) -> None:
    """Record this process's command line as typed (``dane train ...``).

    The ``dane`` command runs a module with `runpy`, which puts the module's file in
    ``sys.argv[0]``; a module attribute, unlike an environment variable, is not inherited
    by the runs a sweep launches in processes of their own.
    """
    global _entry_command, _entry_prog
    _entry_command, _entry_prog = list(argv), prog


_made_for: list[str] | None = None  # the command of the run this process makes for a caller (`command_of_run`)
_sweep: list[str] | None = None  # the command of the sweep whose job that run is (`command_of_run`)


def entry_program() -> list[str]:
    """The words of this process's command before its arguments: ``dane train`` where the ``dane`` command started
    it (`set_entry_command`), else the program's file name, as `run_command` names it."""
    return _entry_prog.split() if _entry_prog is not None else [Path(sys.argv[0]).name]


@contextmanager
def command_of_run(argv: list[str], sweep: list[str] | None = None):
    """Within: `run_command` is ``argv``, the command line that makes the run this process is making on a caller's
    behalf (`synthetic.sweep.run_job`: ``dane simulate <its overrides>``; a job of an in-process ``-m`` sweep:
    its own overrides, `experiments.train.job_command`), not the caller's own (``dane figures``, the sweep's
    ``-m`` line, which ``sweep`` names: `run_provenance` records it as ``sweep_command``)."""
    global _made_for, _sweep
    before, _made_for, _sweep = (_made_for, _sweep), list(argv), None if sweep is None else list(sweep)
    try:
        yield
    finally:
        _made_for, _sweep = before


def run_command() -> list[str]:
    """The run's command line: the one `command_of_run` names while a caller makes the run in its process, else
    `RUN_COMMAND_ENV` where a launcher's script is this process's argv, else the command typed
    (`set_entry_command`), else argv."""
    if _made_for is not None:
        return list(_made_for)
    if RUN_COMMAND_ENV in os.environ:
        try:
            return list(json.loads(os.environ[RUN_COMMAND_ENV]))
        except (json.JSONDecodeError, TypeError):
            pass
    if _entry_command is not None:
        return list(_entry_command)
    return [Path(sys.argv[0]).name, *sys.argv[1:]]


def sweep_command() -> list[str] | None:
    """The ``-m`` command line of the sweep whose job this run is: `command_of_run`'s ``sweep`` in the sweep's own
    process, `SWEEP_COMMAND_ENV` in a process a sweep's launcher started; None outside a sweep."""
    if _sweep is not None:
        return list(_sweep)
    try:
        told = json.loads(os.environ[SWEEP_COMMAND_ENV]) if SWEEP_COMMAND_ENV in os.environ else None
    except json.JSONDecodeError:
        return None
    return list(told) if isinstance(told, list) else None


def run_provenance(config_text: str = "", config_dirs: tuple[tuple[str, tuple[str, ...]], ...] = ()) -> dict:
    """What a run's summary records about its origin: code, command line (a sweep's job: its own, the sweep's in
    ``sweep_command``), start time, host, load, numerics, the launcher's process layout (`launch_layout`)
    when one started it, and what ``git_commit`` does not pin: ``own_code`` (`own_code`) of the run's resolved config
    ``config_text`` and ``config_dirs`` (`config_files`) of the folders of one's own it was composed from, each
    only where there is one."""
    import yaml  # not at the module's top: the dane command imports this module before it knows it runs a run

    sweep = sweep_command()
    provenance = {
        **code_version(),
        "command": run_command(),
        **({"sweep_command": sweep} if sweep is not None else {}),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": socket.gethostname(),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        **numerics_platform(),
    }
    layout = launch_layout()
    if layout is not None:
        provenance["launch"] = layout
    own = own_code(yaml.safe_load(config_text) if config_text else None)
    if own:
        provenance["own_code"] = own
    if config_dirs:
        provenance["config_dirs"] = config_files(config_dirs)
    return provenance


def own_code(config) -> dict:
    """``{module: {"path": its file, "sha256": of its bytes}}`` of each module of one's own that defines what a
    ``_target_`` in ``config`` (a run's resolved config, as plain dicts and lists) names: code outside the package,
    which ``git_commit`` does not pin, so that a later rerun can tell whether the file changed.  Only modules this
    process imported (the run built its config from them) count; the package's own (``dane.*``), the standard
    library's and an installed distribution's (site-packages) are left out.  {} where there is none."""
    named: set[str] = set()

    def walk(node) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("_target_"), str):
                named.add(node["_target_"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(config)
    found = {}
    for target in sorted(named):
        module = defining_module(target)
        path = getattr(module, "__file__", None)
        if module is None or path is None or module.__name__.split(".")[0] == "dane" or installed(Path(path)):
            continue
        found[module.__name__] = {"path": str(Path(path).resolve()), "sha256": file_sha256(Path(path))}
    return found


def defining_module(target: str):
    """The imported module that defines what the dotted ``target`` names (the class's ``__module__``: a class a
    package re-exports is its defining file's), else the longest imported module ``target`` starts with; None
    where none is imported."""
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:cut]))
        if module is None:
            continue
        obj = module
        for attribute in parts[cut:]:
            obj = getattr(obj, attribute, None)
        defined_in = getattr(obj, "__module__", None)
        return sys.modules.get(defined_in, module) if isinstance(defined_in, str) else module
    return None


@lru_cache(maxsize=1)
def installed_roots() -> tuple[Path, ...]:
    """The folders of the standard library and of installed distributions (site-packages)."""
    paths = sysconfig.get_paths()
    folders = [paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths]
    folders += [*getattr(site, "getsitepackages", list)(), site.getusersitepackages()]
    return tuple(Path(folder).resolve() for folder in folders)


def installed(path: Path) -> bool:
    resolved = path.resolve()
    return any(resolved.is_relative_to(root) for root in installed_roots())


def file_sha256(path: Path) -> str | None:
    """The SHA-256 of the file's bytes, None where it cannot be read."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def config_files(config_dirs: tuple[tuple[str, tuple[str, ...]], ...]) -> dict:
    """``{folder: {yaml: sha256}}`` of the folders of one's own a run's config was composed from
    (`dane.loop.spec.RunControl.config_dirs`: ``--config-dir``), each yaml by its path in the folder."""
    return {folder: {name: file_sha256(Path(folder) / name) for name in names} for folder, names in config_dirs}
