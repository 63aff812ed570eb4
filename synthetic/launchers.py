"""Start a module under horovodrun or torchrun from this virtualenv, for calibration, benchmarks, tests and
the sweep launchers (`experiments.launchers`)."""
from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from dane.layout import CHECKOUT

#: the checkout the launched processes import dane from, their working folder; None where dane is installed
#: (then they import the environment's own dane and start in the current folder: the package folder on
#: sys.path would shadow the package dane with its module dane/dane.py)
REPO = CHECKOUT
#: Horovod settings that a caller's environment must not leak into a measurement
HOROVOD_KEYS = ("HOROVOD_CYCLE_TIME", "HOROVOD_FUSION_THRESHOLD", "HOROVOD_CACHE_CAPACITY")


def venv_bin(name: str) -> str:
    """``name`` beside this interpreter (the virtualenv's bin/), else on PATH."""
    path = Path(sys.executable).parent / name
    return str(path) if path.exists() else name


def have_horovod() -> bool:
    """Is horovod.torch importable here (the Horovod build is optional until `make setup` finished)?"""
    if importlib.util.find_spec("horovod") is None:
        return False
    try:
        import horovod.torch  # noqa: F401
    except Exception:  # noqa: BLE001 - a half-built horovod fails in several ways
        return False
    return True


def launch_env(extra: dict[str, str] | None) -> dict[str, str]:
    """This environment for a launch: the checkout on PYTHONPATH, `HOROVOD_KEYS` dropped, ``extra`` added."""
    env = {k: v for k, v in os.environ.items() if k not in HOROVOD_KEYS}
    if REPO is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


def horovodrun_command(module: str, args: list[str], *, np: int = 2, extra: list[str] = ()) -> list[str]:
    """``horovodrun -np NP [EXTRA] --gloo python -m MODULE ARGS``, this virtualenv's horovodrun and python."""
    return [venv_bin("horovodrun"), "-np", str(np), *extra, "--gloo", sys.executable, "-m", module, *args]


def torchrun_command(module: str, args: list[str], *, np: int = 2, extra: list[str] = ()) -> list[str]:
    """``torchrun --standalone --nproc_per_node NP [EXTRA] -m MODULE ARGS``, this virtualenv's torchrun."""
    return [venv_bin("torchrun"), "--standalone", "--nproc_per_node", str(np), *extra, "-m", module, *args]


def horovodrun(module: str, args: list[str], *, np: int = 2, env: dict[str, str] | None = None,
               timeout: float = 600) -> subprocess.CompletedProcess:
    """`horovodrun_command` in the repository root; raises on failure."""
    return _run(horovodrun_command(module, args, np=np), env, timeout)


def torchrun(module: str, args: list[str], *, np: int = 2, env: dict[str, str] | None = None,
             timeout: float = 600) -> subprocess.CompletedProcess:
    """`torchrun_command` in the repository root; raises on failure."""
    return _run(torchrun_command(module, args, np=np), env, timeout)


def horovodrun_side_by_side(module: str, runs: list[list[str]], *, env: dict[str, str] | None = None,
                            timeout: float = 600) -> None:
    """One ``horovodrun -np 1 ... MODULE ARGS`` per entry of ``runs``, all at once, the k-th bound to core k.

    Independent runs that share the machine as the ranks of one launch do, without
    communicating: a run alone against its twin beside it is what a second busy core costs
    a rank here (memory, caches, the hypervisor).  Raises if any of them fails.
    """
    if len(runs) > len(os.sched_getaffinity(0)):
        raise RuntimeError(f"{len(runs)} side-by-side runs need as many usable cores; this process has "
                           f"{len(os.sched_getaffinity(0))}")
    cores = sorted(os.sched_getaffinity(0))
    logs = [tempfile.TemporaryFile(mode="w+") for _ in runs]
    procs = [subprocess.Popen(horovodrun_command(module, args, np=1), cwd=REPO, env=launch_env(env), stdout=log,
                              stderr=subprocess.STDOUT, text=True,
                              preexec_fn=functools.partial(os.sched_setaffinity, 0, {core}))
             for args, core, log in zip(runs, cores, logs)]
    failed = []
    for proc, log in zip(procs, logs):
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.returncode != 0:
            log.seek(0)
            tail = "\n".join(log.read().strip().splitlines()[-15:])
            failed.append(f"{' '.join(proc.args)} exited with {proc.returncode}:\n{tail}")
        log.close()
    if failed:
        raise RuntimeError("\n".join(failed))


def _run(cmd: list[str], env, timeout: float) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=REPO, env=launch_env(env), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}:\n{tail}")
    return proc
