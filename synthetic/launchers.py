"""Start a module under horovodrun or torchrun from this virtualenv, for calibration, benchmarks, tests and
the sweep launchers (`experiments.launchers`)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
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


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    """This environment for a launch: the repository on PYTHONPATH, `HOROVOD_KEYS` dropped, ``extra`` added."""
    env = {k: v for k, v in os.environ.items() if k not in HOROVOD_KEYS}
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


def _run(cmd: list[str], env, timeout: float) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=REPO, env=_env(env), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}:\n{tail}")
    return proc
