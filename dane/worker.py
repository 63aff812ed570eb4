"""One algorithm worker's run, the same on every backend: its problem, its round object and its callbacks.

`build_problem` makes worker ``rank``'s shard; `run_worker` builds the algorithm on it and
runs the one round loop (`dane.driver.drive`) with `worker_callbacks`: the records, the
checkpoints, the display and the summary's parts, rank 0 writing the run directory.  The
run kinds (`dane.kinds`) call it once per launched process or simulated thread; Horovod
elastic (`dane.elastic`) and the asynchronous runs (`dane.asynchronous`) drive their own
round objects with the same callbacks.
"""
from __future__ import annotations

import time

from .callbacks import (Callback, Checkpoints, ClosingLine, Collect, CommEntries, Display, FinalState, Faults,
                        ProblemFacts, Records, SimulatedCost, Timeline, display)
from .comm import Communicator
from .driver import Loop, drive
from .problems import Problem
from .spec import RunSpec
from . import timeline


def build_problem(spec: RunSpec, rank: int, size: int, clock) -> tuple[Problem, float]:
    """Worker ``rank``'s problem and the seconds of its own setup (its shard's local Hessian, say).

    The shared data set and reference optimum are made first by the config's optional
    ``prepare()``, untimed, so ``setup_s`` is the work that parallelizes over workers.
    """
    spec.problem.prepare()
    t0 = clock()
    problem = spec.problem.build(rank, size, spec.control.dtype)
    timeline.mark("data")
    return problem, clock() - t0


def worker_meta(spec: RunSpec, rank: int, size: int) -> dict:
    """What a checkpoint part records about its run, checked when it is loaded."""
    return {"algorithm": spec.algorithm.name, "problem": spec.problem.name, "workers": size, "rank": rank}


def run_worker(spec: RunSpec, comm: Communicator, problem: Problem, out_dir: str | None, start: float,
               setup_s: float = 0.0, collect: dict | None = None) -> dict:
    """One worker's run: the algorithm on ``problem``, resumed from ``resume=``'s checkpoint, rank 0 writing
    ``out_dir``.  Returns the summary."""
    loop = Loop(spec, spec.algorithm.build(problem, comm), comm, out_dir, problem, start=start, setup_s=setup_s,
                checkpoint_every=spec.control.checkpoint_every)
    return drive(loop, worker_callbacks(spec, loop, collect))


def worker_callbacks(spec: RunSpec, loop: Loop, collect: dict | None = None, *,
                     start: list[Callback] | None = None, end: tuple[Callback, ...] = ()) -> list[Callback]:
    """What happens around an algorithm worker's rounds, in the order the loop calls it.

    ``start``: where the run starts and how its progress is committed (default: `Checkpoints` on disk,
    resumed from ``resume=``); ``end``: callbacks after the closing line (an asynchronous run's update log).
    """
    control, rank = spec.control, loop.comm.rank
    show = display(control, spec.algorithm.algorithm) if rank == 0 else None
    callbacks: list[Callback] = [Faults(control.faults)]
    callbacks += start if start is not None else [Checkpoints(control, worker_meta(spec, rank, loop.comm.size))]
    callbacks += [Timeline(), ProblemFacts()]
    if spec.comm.simulated:
        callbacks.append(SimulatedCost())
    if collect is not None:
        callbacks.append(Collect(collect))
    callbacks += [FinalState(spec), CommEntries()]
    if rank == 0 and loop.out_dir:
        callbacks.append(Records(control))
    if show is not None:
        callbacks += [Display(control, show), ClosingLine()]
    return [*callbacks, *end]
