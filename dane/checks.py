"""One-line validation of config values, raised before any process group starts."""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
from numbers import Real
from pathlib import Path

from .errors import ConfigError


def is_number(value) -> bool:
    """A number (inf included), not a bool (true == 1 in Python) nor text (which float() would read)."""
    return isinstance(value, Real) and not isinstance(value, bool)


def number(key: str, value) -> float:
    """A number (inf included), not a bool (true == 1 in Python) nor text."""
    if not is_number(value):
        raise ConfigError(f"{key} must be a number, got {value!r}")
    return value


def _number(key: str, value) -> float:
    number(key, value)
    if not math.isfinite(value):  # inf and nan compare as valid or invalid by accident, and break the math later
        raise ConfigError(f"{key} must be a finite number, got {value}")
    return float(value)


def positive(key: str, value) -> float:
    if not _number(key, value) > 0:
        raise ConfigError(f"{key} must be > 0, got {value}")
    return value


def nonnegative(key: str, value) -> float:
    if not _number(key, value) >= 0:
        raise ConfigError(f"{key} must be >= 0, got {value}")
    return value


def fraction(key: str, value, what: str = "") -> float:
    """``value`` in (0, 1] (a probability, a step share); ``what``: what it is, said in the error."""
    if not 0 < _number(key, value) <= 1:
        raise ConfigError(f"{key} must be in (0, 1]{f' ({what})' if what else ''}, got {value}")
    return value


def relative_tolerance(key: str, value, *, zero: bool = False) -> float:
    """A relative residual or gradient tolerance: in (0, 1), or [0, 1) where 0 means a fixed count (``zero``); 1 or
    more stops the iteration at once."""
    (nonnegative if zero else positive)(key, value)
    if not value < 1:
        raise ConfigError(f"{key} must be in {'[' if zero else '('}0, 1), got {value}")
    return value


def positive_int(key: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key} must be a positive integer, got {value!r}")
    return value


def count(key: str, value, zero: str) -> int:
    """An integer >= 0; ``zero`` says what 0 means (``never``)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{key} must be an integer >= 0 (0: {zero}), got {value!r}")
    return value


def one_of(key: str, value, choices) -> str:
    # true == 1 in Python: a boolean is no choice among numbers (algorithm.option=true)
    if value not in choices or (isinstance(value, bool) and not any(isinstance(c, bool) for c in choices)):
        raise ConfigError(f"{key} must be one of {'|'.join(map(str, choices))}, got {value!r}")
    return value


def boolean(key: str, value) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    return value


def integer(key: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key} must be an integer, got {value!r}")
    return value


def positive_int_argument(text: str) -> int:
    """An ``argparse`` type: a positive integer (``--np 0`` is argparse's one usage error, not a failure later)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def positive_number_argument(text: str) -> float:
    """An ``argparse`` type: a finite number > 0 (seconds, GiB)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


#: the largest seed: numpy's and torch's generators take every seed in [0, SEED_MAX] (and the per-worker seeds
#: derived from it), numpy no negative one
SEED_MAX = 2**32 - 1


def seed(key: str, value) -> int:
    """A random seed: an integer in [0, `SEED_MAX`]."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SEED_MAX:
        raise ConfigError(f"{key} must be an integer in [0, 2**32 - 1], got {value!r}")
    return value


def integer_fields(config, prefix: str) -> None:
    """Every field declared ``int`` of a config dataclass (and of the dataclasses it holds) is an integer.

    A value Hydra passes on as text (``problem.seed=abc``) would otherwise fail deep inside
    a random generator; this names the key instead.
    """
    if not dataclasses.is_dataclass(config):
        return
    for f in dataclasses.fields(config):
        value = getattr(config, f.name, None)
        if f.type in ("int", int):
            (seed if f.name.endswith("seed") else integer)(f"{prefix}.{f.name}", value)
        integer_fields(value, f"{prefix}.{f.name}")


def available_memory() -> int | None:
    """Bytes this process can still allocate: the machine's MemAvailable (reclaimable page cache counts
    as free; else free pages), within a container's cgroup v2 limit; None where neither can be read."""
    have = None
    try:
        with open("/proc/meminfo") as f:
            have = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        try:
            have = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, AttributeError):
            pass
    cgroup = Path("/sys/fs/cgroup")
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            stat = dict(line.split() for line in (cgroup / "memory.stat").read_text().splitlines())
            left = int(limit) - int((cgroup / "memory.current").read_text()) + int(stat.get("inactive_file", 0))
            have = left if have is None else min(have, left)
    except (OSError, ValueError):
        pass
    return have


def address_space_left() -> int | None:
    """Bytes this process may still map under its address-space limit (``ulimit -v``, RLIMIT_AS): the
    limit less the process's current virtual size (VmSize); None where there is no limit or it cannot be read.

    The kernel refuses an allocation past this limit whatever the free memory, so a run that fits
    the machine can still fail here (torch's allocator says ``can't allocate memory``).
    """
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        if limit == resource.RLIM_INFINITY:
            return None
        with open("/proc/self/status") as f:
            used = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    except (ImportError, OSError, StopIteration, ValueError, IndexError):
        return None
    return max(limit - used, 0)


def fits_in_memory(what: str, need: int, parts: str, fix: str) -> None:
    """Refuse, with the numbers, before allocating: ``what`` needs about ``need`` bytes (``parts`` says of what).

    Compared with the memory available (`available_memory`) and with what the process limit
    (`address_space_left`) leaves, whichever is smaller; no refusal where neither is known.
    """
    have, left = available_memory(), address_space_left()
    if left is not None and (have is None or left < have):
        if need > left:
            raise ConfigError(f"{what} needs about {gigabytes(need)} of memory ({parts}) but the process limit "
                              f"(ulimit -v) leaves {gigabytes(left)}; {fix}, or raise the limit (ulimit -v unlimited)")
        return
    if have is not None and need > have:
        raise ConfigError(f"{what} needs about {gigabytes(need)} of memory ({parts}) but {gigabytes(have)} "
                          f"is available; {fix}")


def gigabytes(nbytes: float) -> str:
    return f"{nbytes / 1e9:.1f} GB"
