"""The one run loop: every kind of run (`dane.loop.kinds`) hands it one rank's round object and its callbacks.

`drive` opens the run (`dane.loop.callbacks`: where it starts, the run directory), runs the
rounds through `dane.loop.runner.run`, calling each callback at the same fixed points, and ends
it: the summary (`base_summary` plus what each callback adds), the final state, the
closing line.  Convex and network runs, the simulator and launched workers, Horovod
elastic, split learning and asynchronous runs differ only in the round object and the
callbacks their kind passes.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..algorithm import Algorithm, recorded_label
from .checkpoint import keeps_what_was_written
from ..comm.rendezvous import Interrupted
from .faults import RunInterrupted, interrupted_by
from ..records.results import in_target_units
from .parking import Parked
from .runner import RunResult, run
from .spec import RunSpec
from ..work import KEYS as LOCAL_WORK


@dataclass
class Loop:
    """One rank's run as the callbacks see it.

    ``algo`` is the round object `dane.loop.runner.run` drives (an `Algorithm`, or a split or
    asynchronous run behind the same interface) and ``comm`` its communicator.  The
    callbacks set ``resume`` (the state the rounds continue from), ``continuing`` (the run
    directory continues earlier records), ``resumed_from``, ``writer`` and ``when_locked`` (what rank 0 changes in
    the run directory once `dane.loop.callbacks.Records` holds its lock: a resume's cut of the records); the loop keeps
    ``seen`` (this call's raw records, for an interrupted run; the last one only where ``keep_records`` is False)
    and ``result``.
    """

    spec: RunSpec
    algo: Any
    comm: Any
    out_dir: str | None
    problem: Any = None
    backend: str = ""  # as the summary names it; by default "simulator" or the spec's backend
    start: float = field(default_factory=time.perf_counter)
    setup_s: float = 0.0
    checkpoint_every: int = 0
    resume: dict | None = None
    continuing: bool = False
    resumed_from: int | None = None
    writer: Any = None
    when_locked: list[Callable[[], None]] = field(default_factory=list)  # rank 0's steps once it holds out_dir's lock
    seen: list[dict] = field(default_factory=list)
    result: RunResult | None = None
    keep_records: bool = True  # False: only the last record (a simulated worker other than rank 0: `dane.loop.runner.run`)

    def __post_init__(self) -> None:
        if not self.backend:
            self.backend = "simulator" if self.spec.comm.simulated else self.spec.comm.backend

    @property
    def units(self) -> tuple[float, float] | None:
        """A standardized target's (mean, scale): records and the iterate are reported in the target's units."""
        return None if self.problem is None else self.problem.target_units

    def reported(self, record: dict) -> dict:
        """``record`` as written and shown: in the target's units (a copy; the stop rule keeps the record it read)."""
        return in_target_units(record, self.units)

    @property
    def records(self) -> list[dict]:
        return [self.reported(r) for r in self.result.records]

    @property
    def status(self) -> str:
        return self.result.status

    @property
    def iterate(self) -> torch.Tensor:
        """The iterate the last record describes, in the target's units."""
        units = self.units
        return self.result.iterate if units is None else self.result.iterate * units[1]


@keeps_what_was_written  # a full or read-only out_dir: one line saying what it keeps and how to go on
def drive(loop: Loop, callbacks: list, resumed: Callable[[], None] | None = None) -> dict:
    """Run ``loop``'s rounds with ``callbacks`` at their fixed points (`dane.loop.callbacks`); returns the summary.

    The run directory stays this run's (its lock held) until the summary is written.

    A simulated worker that a sampled round leaves out leaves by `Parked`, no callback of the ends called; its
    ``resume(handoff)`` is ``drive`` again, ``resumed`` going back into the rounds in place of the start's
    callbacks and the first call of `rounds` (`dane.loop.parking`).
    """
    parked = False
    try:
        if resumed is None:
            for callback in callbacks:
                callback.on_open(loop)
            for callback in callbacks:
                callback.on_start(loop)
            rounds(loop, callbacks)
        else:
            resumed()
        summary = base_summary(loop)
        for callback in callbacks:
            callback.on_end(loop, summary)
        return summary
    except Parked as exc:
        parked, inner = True, exc.resume
        exc.resume = lambda handoff: drive(loop, callbacks, lambda: inner(handoff))
        raise
    finally:
        if not parked:
            for callback in callbacks:
                callback.on_close(loop)


def rounds(loop: Loop, callbacks: list, resumed: Callable[[], RunResult] | None = None) -> None:
    """The rounds, from ``loop.resume`` (None: round 0), or (``resumed``) a parked worker's, back in from rank 0's
    state; a Ctrl-C in the simulator ends them as ``interrupted``."""

    def on_round(record: dict) -> None:
        if loop.keep_records or not loop.seen:
            loop.seen.append(record)
        else:
            loop.seen[-1] = record
        for callback in callbacks:
            callback.on_round(loop, record)

    def on_checkpoint(state: dict) -> None:
        for callback in callbacks:
            callback.on_checkpoint(loop, state)

    parked = False
    try:
        loop.result = resumed() if resumed is not None else run(
            loop.algo, loop.spec.control.stop, on_round, resume=loop.resume, on_checkpoint=on_checkpoint,
            checkpoint_every=loop.checkpoint_every, keep_records=loop.keep_records)
    except (Interrupted, KeyboardInterrupt) as exc:  # a Ctrl-C: in the simulator at a collective, or in one process
        one_process = loop.spec.comm.backend == "local" and not loop.spec.comm.simulated
        taken = isinstance(exc, Interrupted) or (one_process and not isinstance(exc, RunInterrupted))
        if not (taken and loop.seen):
            raise
        loop.result = RunResult(loop.seen, "interrupted", loop.algo.described_iterate(None), interrupted_by()[0])
    except Parked as exc:  # its rounds go on in another thread: ``resume`` comes back here (`drive`)
        parked, inner = True, exc.resume
        exc.resume = lambda handoff: rounds(loop, callbacks, lambda: inner(handoff))
        raise
    finally:
        if not parked:
            for callback in callbacks:
                callback.on_rounds_end(loop)


#: ``time_s_clock``: what ``time_s`` (the last record's, repeated in the summary) measures.  In the simulator the
#: cost model's parallel time (the slowest worker's compute plus sim.alpha/sim.beta communication), which can be far
#: from the wall time the run took (``wall_time_s``); under a launcher rank 0's wall clock.
TIME_CLOCK = {True: "simulated", False: "wall"}


def base_summary(loop: Loop) -> dict[str, Any]:
    """summary.json's entries that every kind of run has, from its last record and its clock."""
    spec, last = loop.spec, loop.records[-1]
    summary: dict[str, Any] = {
        "algorithm": spec.algorithm.name,
        "label": recorded_label(spec.algorithm, loop.algo),  # a class of one's own's too: what figures name it by
        "problem": spec.problem.name,
        "workers": loop.comm.size,
        "backend": loop.backend,
        "status": loop.status,
        "rounds": last["round"],
        "final_objective": last["objective"],
        "final_suboptimality": last.get("suboptimality"),
        "final_relative_suboptimality": relative_suboptimality(last),
        "total_bytes": last["bytes_sent"],
        "comm_rounds": last["comm_rounds"],
        "time_s": last["time_s"],
        "time_s_clock": TIME_CLOCK[loop.backend == "simulator"],  # split learning in one process: simulated too
        "wall_time_s": time.perf_counter() - loop.start,
        "stop_rule": spec.control.stop.rule(last),
        "stopped_by": loop.result.stopped_by,
        "remedy": loop.result.remedy,  # what to change, where the method ended the run itself and named it
    }
    summary.update({f"final_{key}": last[key] for key in ("test_loss", "test_accuracy") if key in last})
    # the counts the round object declares (`Algorithm.summary_keys`: traffic by direction, where the run counts it)
    summary.update({key: last[key] for key in getattr(loop.algo, "summary_keys", Algorithm.summary_keys) if key in last})
    if LOCAL_WORK[0] in last:  # an algorithm's rounds: its local work so far, summed and the busiest client's
        summary["local_work"] = {key: last[key] for key in LOCAL_WORK}
    return summary


def relative_suboptimality(record: dict) -> float | None:
    """(O(w) − O*)/|O*| of a record with a suboptimality (O* = objective − suboptimality); None without one or at
    O* = 0."""
    if record.get("suboptimality") is None:
        return None
    optimum = abs(record["objective"] - record["suboptimality"])
    return record["suboptimality"] / optimum if optimum > 0 else None
