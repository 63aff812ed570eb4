"""One algorithm worker's run, the same on every backend: its problem, its round object and its callbacks.

`build_problem` makes worker ``rank``'s shard; `run_worker` builds the algorithm on it and
runs the one round loop (`dane.loop.driver.drive`) with `dane.loop.callbacks.worker_callbacks`: the
records, the checkpoints, the display and the summary's parts, rank 0 writing the run directory.  The
run kinds (`dane.loop.kinds`) call it once per launched process or simulated thread; Horovod
elastic (`dane.loop.elastic`) and the asynchronous runs (`dane.loop.asynchronous`) drive their own
round objects with the same callbacks.
"""
from __future__ import annotations

from .callbacks import worker_callbacks
from .. import compress
from ..comm import Communicator
from ..comm.compression import MessageCompression
from .driver import Loop, drive
from ..problems import Problem
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


def run_worker(spec: RunSpec, comm: Communicator, problem: Problem, out_dir: str | None, start: float,
               setup_s: float = 0.0, collect: dict | None = None) -> dict:
    """One worker's run: the algorithm on ``problem``, resumed from ``resume=``'s checkpoint, rank 0 writing
    ``out_dir``.  Returns the summary."""
    if spec.comm.compress is not None:  # before the algorithm is built: its first collective may be compressed
        downlink = None if spec.comm.compress_down is None else compress.make(spec.comm.compress_down, "comm.compress_down")
        comm.use_compression(MessageCompression(compress.make(spec.comm.compress, "comm.compress"),
                                                spec.algorithm.algorithm.compressible,
                                                error_feedback=spec.comm.error_feedback, seed=spec.control.seed,
                                                rank=comm.rank, downlink=downlink))
    # in the simulator rank 0's records and summary are the run's: the other workers keep only their last record
    loop = Loop(spec, spec.algorithm.build(problem, comm), comm, out_dir, problem, start=start, setup_s=setup_s,
                checkpoint_every=spec.control.checkpoint_every, keep_records=comm.rank == 0 or not spec.comm.simulated)
    return drive(loop, worker_callbacks(spec, loop, collect))
