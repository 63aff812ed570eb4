"""Start a module under horovodrun or torchrun from this virtualenv, for calibration, benchmarks and tests."""
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
    env = {k: v for k, v in os.environ.items() if k not in HOROVOD_KEYS}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


def horovodrun(module: str, args: list[str], *, np: int = 2, env: dict[str, str] | None = None,
               timeout: float = 600) -> subprocess.CompletedProcess:
    """``horovodrun -np NP --gloo python -m MODULE ARGS`` in the repository root; raises on failure."""
    cmd = [venv_bin("horovodrun"), "-np", str(np), "--gloo", sys.executable, "-m", module, *args]
    return _run(cmd, env, timeout)


def torchrun(module: str, args: list[str], *, np: int = 2, env: dict[str, str] | None = None,
             timeout: float = 600) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc_per_node NP -m MODULE ARGS`` in the repository root; raises on failure."""
    cmd = [venv_bin("torchrun"), "--standalone", "--nproc_per_node", str(np), "-m", module, *args]
    return _run(cmd, env, timeout)


def _run(cmd: list[str], env, timeout: float) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=REPO, env=_env(env), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}:\n{tail}")
    return proc
