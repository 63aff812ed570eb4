"""Where a process's time went before and during its run: marks on one clock, from the process's start.

`mark(name)` notes the wall-clock time of a phase's end; `phases()` gives each mark in
seconds since the process started (the kernel's start time of this process, so the
interpreter's start and the imports before the first mark are counted too).  Rank 0's
summary carries them as ``timeline`` (`dane.loop.worker`): ``config`` (the entry point has
its configuration: imports and Hydra done), ``data`` (the data read and the worker's
shard built), ``reference`` (the reference optimum, when asked for), ``round0`` (the
first round starts) and ``end`` (the last record written). A mark made twice in one run keeps the first. A run's
marks are its own: `begin_run` drops what was marked since the last run but the entry point's ``config``, and
`end_run` (`dane.loop.launch.execute`, as a run ends, however it ends) drops them all, so the next run of one
process (an in-process sweep, `synthetic.sweep.ensure`; a Hydra multirun's next job; `dane.fit` called again)
records its own ``data`` ... ``end``, later than the earlier run's, and its own ``config`` where its entry point
marks one (a multirun's job does; `dane.fit` and `ensure` do not, and the time before such a run's first mark is
partly the earlier runs'). The launcher's own start-up is what lies before this process's start: a caller that timed
the launch from outside subtracts (``scripts/bench_wallclock.py``).

Two fields let such a caller put the marks on its own clock: ``clock_origin``, the
``time.time()`` value the marks count from (so mark + clock_origin is the mark's wall
time), and ``process_start``, the process's start read from the kernel's boot clock
(`boot_clock_start`: Linux, 10 ms ticks) on the marks' axis: 0 where that clock is the
origin, as on Linux; elsewhere the origin is psutil's start, which adds the kernel's boot
time in whole seconds and so can sit up to a second away from the true start.
"""
from __future__ import annotations

import os
import threading
import time

_MARKS: dict[str, float] = {}


def process_start() -> float | None:
    """This process's start, as a ``time.time()`` value; None where the platform does not say."""
    try:
        import psutil
    except ImportError:
        return None
    return psutil.Process().create_time()


_START: list[float | None] = []  # `boot_clock_start`'s one reading in this process
_START_LOCK = threading.Lock()


def boot_clock_start() -> float | None:
    """This process's start as a ``time.time()`` value: its start tick (/proc/self/stat) against CLOCK_BOOTTIME.

    Exact to the kernel's tick (10 ms); None where there is no /proc or no boot clock.  Read once a process, under a
    lock: /proc/self/stat sums over the threads, and m simulated workers ask at their end, at once (two readings
    differ in their last bits: time.time() and the boot clock are read a moment apart)."""
    with _START_LOCK:
        if not _START:
            _START.append(_read_start())
        return _START[0]


def _read_start() -> float | None:
    try:
        after_name = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
        start_s = int(after_name[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime; the list starts at field 3
        now, since_boot = time.time(), time.clock_gettime(time.CLOCK_BOOTTIME)
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return now - (since_boot - start_s)


os.register_at_fork(after_in_child=_START.clear)  # a forked child started later than its parent


def configured() -> None:
    """The entry point has its configuration: the ``config`` mark of the run it starts next, which an earlier
    job's left over (one refused before its run, in a multirun) does not hold back."""
    _MARKS.pop("config", None)
    mark("config")


def begin_run() -> None:
    """A run of this process starts: marks made since the last run ended go (a reference optimum made between runs,
    by a benchmark), but its entry point's ``config``."""
    for name in [name for name in _MARKS if name != "config"]:
        del _MARKS[name]


def end_run() -> None:
    """A run of this process has ended (its summary holds its marks): they go, so that the next run's are its own."""
    _MARKS.clear()


def mark(name: str) -> None:
    _MARKS.setdefault(name, time.time())


def phases() -> dict[str, float]:
    """Every mark in seconds since the process started (since the first mark where the start is unknown),
    then the fields ``clock_origin`` and ``process_start`` (see the module docstring)."""
    if not _MARKS:
        return {}
    start = boot_clock_start()
    origin = start or process_start() or min(_MARKS.values())
    marks = {name: round(t - origin, 4) for name, t in sorted(_MARKS.items(), key=lambda item: item[1])}
    fields = {"clock_origin": origin, "process_start": None if start is None else round(start - origin, 4)}
    return {**marks, **fields}
