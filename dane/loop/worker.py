"""One algorithm worker's run, the same on every backend: its problem, its round object and its callbacks.

`build_problem` makes worker ``rank``'s shard; `run_worker` builds the algorithm on it and
runs the one round loop (`dane.loop.driver.drive`) with `dane.loop.callbacks.worker_callbacks`: the
records, the checkpoints, the display and the summary's parts, rank 0 writing the run directory.  The
run kinds (`dane.loop.kinds`) call it once per launched process or simulated thread; Horovod
elastic (`dane.loop.elastic`) and the asynchronous runs (`dane.loop.asynchronous`) drive their own
round objects with the same callbacks.
"""
from __future__ import annotations

import hashlib

import torch

from .callbacks import worker_callbacks
from .. import compress
from ..comm import Communicator
from ..comm.compression import MessageCompression
from ..errors import DataError
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


def check_one_push(config, problem: Problem, comm: Communicator) -> None:
    """Collective, before the run's clock: the workers of a run whose problem reads a store by id (``config.by_id``:
    ``data=mongo``), each in a process of its own that read the data set itself, read one push of it (each shard's
    ``data_push``), or every one stops with the same line: a ``dane data push --replace`` that ended between two
    workers' reads would have them train on two data sets.  One uncounted gather of a digest of each worker's push;
    none for one worker or a problem that reads no store (the simulator's workers share their process's read)."""
    if not config.by_id or comm.size == 1:
        return
    digest = hashlib.sha256((problem.data_push or "").encode()).digest()[:8]
    with comm.uncounted():  # not the method's traffic
        table, _ = comm.gather(torch.tensor(list(digest), dtype=torch.float64))
    digests = table.round().to(torch.int64)
    others = [str(rank) for rank in range(comm.size) if not torch.equal(digests[rank], digests[0])]
    if others:
        raise DataError(f"worker{'s' if len(others) > 1 else ''} {', '.join(others)} read another push of the data "
                        f"set than worker 0 (worker {comm.rank} read {problem.data_push}): it was pushed again while "
                        "the workers read it, and they would train on two data sets; run again (nothing was trained)")


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
