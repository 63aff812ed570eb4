"""How a simulated worker's compute is timed: the meter it is read with, its phases between collectives, stragglers.

A worker's compute between two collectives is read by its group's `Meter`: on the CPU its thread's CPU time
(`ThreadCPUTime`), on a GPU the wall time of its turn on the device (`DeviceTurns`); `PhaseClock` opens and closes
those phases for a thread's communicator (`dane.comm.threads`) or for all m workers' stacked work
(`dane.comm.batched`).  `Stragglers` scales each worker's compute and adds seeded delays (the simulated clock of
a collective phase: `dane.comm.threads`).

*Start-up is not compute.*  What a thread does inside `start_up` (numba compiling a kernel or loading it from its
cache, `dane.numerics.jit`; a module imported at its first use) is left out of both meters: on m real machines each process pays it before its rounds,
as it pays its imports, which the simulator does not model either; in one process the first of the m threads to
need a kernel would pay it for all, in whichever phase that falls.  `start_up_seconds` says how much was left out.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import torch

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class Stragglers:
    """Per-worker compute slowdown factors and seeded random delays per collective phase.

    ``slowdown`` is a list of factors (recycled over the workers) that multiply each
    worker's measured compute; ``delay_mean`` (seconds) adds an exponential delay drawn
    per worker and phase from a generator seeded with ``seed``.
    """

    slowdown: Sequence[float] = (1.0,)
    delay_mean: float = 0.0
    seed: int = 0

    def factor(self, rank: int) -> float:
        return float(self.slowdown[rank % len(self.slowdown)]) if self.slowdown else 1.0


class SeededDraws:
    """The seeded generators a simulated clock draws from (a group's, `dane.comm.threads.ThreadGroup` and
    `dane.comm.batched.BatchedGroup`): the stragglers' delays (``_rng``, seeded with `Stragglers` ``seed``) and, for a
    cost model that draws (a calibrated tail, `dane.comm.tail.DrawnCost`), its ``rng``.  A checkpoint keeps where they
    stand (`draw_states`, beside the clock: `dane.loop.runner.clock_split`) and a resumed run goes on from there
    (`restore_draws`): it draws what the uninterrupted run would have drawn, so the same config and seeds give the same
    times, stopped and resumed or not."""

    _rng: "np.random.Generator"
    cost: object

    def draw_states(self) -> dict:
        """The generators' states: ``delays`` and, where the cost model draws, ``tail``."""
        tail = getattr(self.cost, "rng", None)
        return {"delays": self._rng.bit_generator.state,
                **({"tail": tail.bit_generator.state} if tail is not None else {})}

    def restore_draws(self, states: dict) -> None:
        """Set the generators to `draw_states`' ``states``."""
        self._rng.bit_generator.state = states["delays"]
        tail = getattr(self.cost, "rng", None)
        if tail is not None and "tail" in states:
            tail.bit_generator.state = states["tail"]


class _StartUp(threading.local):
    depth = 0  # `start_up` blocks this thread is inside (numba's compiler lock is re-entrant)
    cpu = wall = 0.0  # this thread's seconds inside them, CPU and wall, closed blocks
    opened = (0.0, 0.0)  # (CPU, wall) when the outermost open block began


_here = _StartUp()
_total = [0.0]  # CPU seconds in closed `start_up` blocks, every thread (`start_up_seconds`)
_total_lock = threading.Lock()


def start_up_begin() -> None:
    """A block of start-up work begins on this thread (`start_up`; numba's compiler lock, `dane.numerics.jit`)."""
    if _here.depth == 0:
        _here.opened = (time.thread_time(), time.perf_counter())
    _here.depth += 1


def start_up_end() -> None:
    _here.depth -= 1
    if _here.depth == 0:
        cpu, wall = time.thread_time() - _here.opened[0], time.perf_counter() - _here.opened[1]
        _here.cpu += cpu
        _here.wall += wall
        with _total_lock:
            _total[0] += cpu


@contextmanager
def start_up():
    """The block is start-up, left out of a simulated worker's compute (module docstring)."""
    start_up_begin()
    try:
        yield
    finally:
        start_up_end()


def start_up_seconds() -> float:
    """CPU seconds spent in `start_up` blocks so far, by every thread of this process."""
    with _total_lock:
        return _total[0]


def _outside_start_up(now: float, spent: float, opened: float) -> float:
    """``now`` on a clock that stops inside start-up: less the closed blocks' ``spent`` and an open block's time."""
    return now - spent - (now - opened if _here.depth else 0.0)


class StartUpLeftOut:
    """What a meter left out: this process's `start_up` CPU seconds since the meter was made (the summary's
    ``simulated_start_up_s``)."""

    def __init__(self) -> None:
        self.since = start_up_seconds()

    def start_up_left_out(self) -> float:
        return start_up_seconds() - self.since


class ThreadCPUTime(StartUpLeftOut):
    """A CPU worker's compute: its thread's CPU time outside start-up (module docstring), so m threads on fewer
    cores are timed as m machines."""

    name = "thread_cpu_time"

    def start(self) -> float:
        return _outside_start_up(time.thread_time(), _here.cpu, _here.opened[0])

    def read(self, mark: float) -> float:
        return self.start() - mark

    def stop(self) -> None:
        pass


class DeviceTurns(StartUpLeftOut):
    """Workers on GPUs take turns: a worker holds the GPUs from a collective to its next.

    A thread's CPU time misses a GPU's work (kernels run asynchronously, and a wait for
    them may sleep or spin), and m workers sharing a device slow each other.  So a worker
    holds a lock over its whole compute phase, and that phase's compute is its wall time
    with the GPUs' queues drained at both ends (``torch.cuda.synchronize``): the time
    the worker would take with a GPU of its own.  The turns serialize the m workers' compute
    (also when the workers are spread over several GPUs: each turn is then timed alone),
    so a simulated run takes about m times its simulated compute in wall time.
    """

    name = "gpu_turns"

    def __init__(self, synchronize: Callable[[], None] | None = None):
        super().__init__()
        self._turn = threading.Lock()
        self._synchronize = synchronize or _drain_every_gpu

    def start(self) -> float:
        self._turn.acquire()
        self._synchronize()
        return self._now()

    def read(self, mark: float) -> float:
        self._synchronize()
        return self._now() - mark

    @staticmethod
    def _now() -> float:
        """Wall time outside start-up (module docstring)."""
        return _outside_start_up(time.perf_counter(), _here.wall, _here.opened[1])

    def stop(self) -> None:
        self._turn.release()


def _drain_every_gpu() -> None:
    """Wait for every GPU's queue: simulated workers are spread over the GPUs by rank, and a bare
    ``torch.cuda.synchronize()`` waits for the current device only."""
    for device in range(torch.cuda.device_count()):
        torch.cuda.synchronize(device)


Meter = ThreadCPUTime | DeviceTurns


def meter_for(devices) -> Meter:
    """`DeviceTurns` when any of the workers' devices is a GPU, else `ThreadCPUTime`."""
    return DeviceTurns() if any(torch.device(d).type == "cuda" for d in devices) else ThreadCPUTime()


class PhaseClock:
    """The compute phases of a simulated communicator, from one collective to the next, read by its group's
    ``meter`` (`Meter`): a thread's own work (`ThreadCommunicator`) or all m workers' stacked work
    (`dane.comm.batched.BatchedCommunicator`).

    The hooks a simulated communicator uses: `begin` and `end` around each compute phase, `off_the_clock` around a
    wait that is no compute, ``computing`` (whether a phase is open: a barrier off the clock only waits) and
    `phase_compute` (the open phase's compute so far: the simulated clock read between collectives)."""

    group: "ThreadGroup"  # `dane.comm.threads`'s, or a `dane.comm.batched.BatchedGroup`: what it needs is the meter
    _mark: float = 0.0
    computing: bool = False  # whether a compute phase is open (on a GPU: holds its `DeviceTurns` turn)

    def begin(self) -> None:
        """A compute phase starts (the run's, or the one after a collective)."""
        self._mark = self.group.meter.start()
        self.computing = True

    @contextmanager
    def off_the_clock(self):
        """A wait that is none of this worker's compute (`dane.work`'s bookkeeping): the phase pauses, its slot (and
        GPU turn) goes to the others, and the compute measured so far stays in the phase."""
        pending = self.end()
        self.group.give_slot()
        try:
            yield
        finally:
            self.group.take_slot()
            self.begin()
            self._mark -= pending

    def phase_compute(self) -> float:
        """The compute measured so far in the open phase, which goes on; 0.0 where none is open."""
        return self.group.meter.read(self._mark) if self.computing else 0.0

    def end(self) -> float:
        """The compute phase ends (at a collective, or the run's end): its measured time."""
        if not self.computing:
            return 0.0
        try:
            return self.group.meter.read(self._mark)
        finally:  # the turn is given back even when the device reports an error
            self.computing = False
            self.group.meter.stop()

