"""The benchmark JSON (results/bench.json): every benchmark script merges its own key into it."""
from __future__ import annotations

import json
import os
import platform
import socket
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np

from dane.records.results import atomic_write_text, json_safe


def elapsed_logger(start: float):
    """``log(line)``: print ``line`` after the seconds since ``start`` (a ``time.perf_counter()`` value), flushed."""
    def log(line: str) -> None:
        print(f"[{time.perf_counter() - start:6.0f} s] {line}", flush=True)

    return log


#: the public programs' own measurements, run by hand beside the package, that benchmark sections are held to
EXTERNAL_REFERENCES = Path(__file__).resolve().parents[1] / "paper_figs" / "evidence" / "external_references.json"


def external_reference(name: str) -> dict:
    """Entry ``name`` of `EXTERNAL_REFERENCES` (``inexact_dane_octave``, ``ufednl``): the program, what the repository
    knows of its run (repository, commit, command, machine, date, source) and its numbers."""
    return json.loads(EXTERNAL_REFERENCES.read_text())[name]


def read_bench(path: Path) -> dict:
    """The sections of the benchmark JSON at ``path`` (``--out``; {} where there is no file yet).  A file that cannot
    be read, or is not a JSON object, is a `dane.errors.ConfigError` naming ``--out`` and the fix."""
    from dane.errors import ConfigError

    if not path.exists():
        return {}
    try:
        whole = json.loads(path.read_text())
    except OSError as err:
        raise ConfigError(f"--out {path} cannot be read ({(err.strerror or str(err)).lower()}); "
                          "choose another --out") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        why = f"{err.msg} at line {err.lineno} column {err.colno}" if isinstance(err, json.JSONDecodeError) else \
            "not UTF-8 text"
        raise ConfigError(f"--out {path} is not JSON ({why}); repair or remove it, or choose another --out") from None
    if not isinstance(whole, dict):
        raise ConfigError(f"--out {path} holds a JSON {type(whole).__name__}, not an object of benchmark sections; "
                          "choose another --out")
    return whole


def merge_section(path: Path, key: str, value: dict) -> dict:
    """Put ``value`` under ``key`` in the JSON at ``path``, other keys kept, atomically; returns the whole file.

    inf and nan are written as strings (`dane.records.results.json_safe`), so the JSON stays strict."""
    merged = read_bench(path)
    merged[key] = json_safe(value)
    atomic_write_text(path, json.dumps(merged, indent=2, allow_nan=False, default=str) + "\n")
    return merged


def linear_algebra() -> dict:
    """The BLAS and LAPACK numpy was built with (``np.linalg``'s), as ``np.show_config(mode="dicts")`` names them:
    {"blas": {"name", "version"}, "lapack": {"name", "version"}}, None where the build does not say."""
    built = np.show_config(mode="dicts").get("Build Dependencies", {})
    return {key: {"name": built.get(key, {}).get("name"), "version": built.get(key, {}).get("version")}
            for key in ("blas", "lapack")}


def machine() -> dict:
    """What a benchmark or a calibration ran on, and the load average when it started.

    ``kernel`` (``uname -r``) and ``cpu`` (the model name) are there because timings of
    threads that share a core (Horovod's background thread and a waiting rank) depend on
    the kernel's scheduler as much as on the CPU; ``numpy``, ``scipy`` and numpy's ``blas``
    and ``lapack`` (`linear_algebra`) because results can depend on the build: an SVD's
    singular-vector signs are LAPACK's choice."""
    import scipy
    import torch  # here, not at the top: a command's --help (dane calibrate's) imports this module

    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    cpu = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), platform.processor())
    try:
        horovod = version("horovod")
    except PackageNotFoundError:
        horovod = None
    return {"host": socket.gethostname(), "platform": platform.platform(), "kernel": platform.release(),
            "python": platform.python_version(),
            "cpu": cpu, "cpus": os.cpu_count(), "torch": torch.__version__, "horovod": horovod,
            "numpy": np.__version__, "scipy": scipy.__version__, **linear_algebra(),
            "load_avg": [round(x, 2) for x in os.getloadavg()]}
