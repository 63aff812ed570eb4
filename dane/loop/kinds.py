"""The kinds of run: which one a `RunSpec` is, and how each starts its workers.

Every kind ends in the one run loop (`dane.loop.driver.drive`) on each of its workers; they
differ in how the workers come to be (threads of the simulator, launched processes, a
Horovod elastic job, split learning's agents and server, an event-driven asynchronous
simulation) and in the round object and callbacks they hand the loop.  `kind` decides
which, in plain code, in the order a reader meets them, and `start` calls it; a new kind is a
function here, a branch of `kind` and one of `started`.
"""
from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import torch

from ..comm import Communicator, ThreadGroup, make_communicator
from .batching import batched_path
from ..comm.batched import BatchedGroup, run_batched
from ..comm.launcher_signals import LauncherTerminated
from ..comm.tail import drawing
from ..comm.meters import meter_for
from ..comm.rendezvous import Interrupted
from ..errors import SharedRefusal, say
from .faults import RunInterrupted, interrupted_by, sigterm_as_ctrl_c, worker_lost
from .parking import parks
from ..comm.roster import Roster
from ..problems.optimum import asks_reference
from .reference import attach_all, attach_one
from ..records.results import ROUNDS_FILE
from .spec import RunSpec
from .callbacks import refusal
from .worker import build_problem, check_one_push, run_worker
from . import timeline


def kind(spec: RunSpec) -> str:
    """The kind of run ``spec`` is, decided here and nowhere else, read top to bottom.

    A method that runs the whole job itself comes first (split learning); then the single-process backend
    (``comm=local``): the asynchronous simulator, the simulator (its m workers stacked into one computation where
    `dane.loop.batching.batched_path` chooses it, else one thread each), or one plain process; then launched processes
    (horovodrun, torchrun, Slurm): Horovod elastic, or one worker (under ``comm=ps`` perhaps a parameter server).
    """
    comm = spec.comm
    if spec.algorithm.run_job is not None:
        return "own driver"
    if comm.backend == "local":
        if comm.asynchronous:
            return "asynchronous simulator"
        if comm.simulated:
            return "batched simulator" if batched_path(spec)[0] else "simulator"
        return "launched"  # one process, one worker
    return "elastic" if comm.elastic else "launched"


def start(spec: RunSpec, out_dir: str | None, collect: dict | None) -> dict:
    """Start the `kind` of run ``spec`` is; its summary (on every rank).  The simulator and a one-process run take a
    SIGTERM as a Ctrl-C (`sigterm_as_ctrl_c`)."""
    chosen = kind(spec)
    one_process = spec.comm.backend == "local" and chosen in ("simulator", "batched simulator", "launched")
    with sigterm_as_ctrl_c() if one_process else contextlib.nullcontext():
        return started(spec, out_dir, collect, chosen)


def started(spec: RunSpec, out_dir: str | None, collect: dict | None, chosen: str) -> dict:
    """The run of the kind ``chosen``."""
    if chosen == "own driver":
        return own_driver(spec, out_dir, collect)
    if chosen == "asynchronous simulator":
        return asynchronous_simulator(spec, out_dir, collect)
    if chosen == "batched simulator":
        return batched_simulator(spec, out_dir, collect)
    if chosen == "simulator":
        return simulator(spec, out_dir, collect, batched_path(spec)[1])  # why sim.batched=auto kept threads
    if chosen == "elastic":
        return elastic(spec, out_dir, collect)
    return launched(spec, out_dir, collect)


def runs_batched(spec: RunSpec) -> bool:
    """Whether `start` runs ``spec`` on the simulator's batched path (one stacked computation for the m workers), as
    a resume checks against the checkpoint's path (`dane.loop.checkpoint.check_resume`)."""
    return kind(spec) == "batched simulator"


def own_driver(spec: RunSpec, out_dir: str | None, collect: dict | None) -> dict:
    """A method that runs the whole job itself (its config's ``run_job``): split learning (`dane.split.run`),
    one network cut between agents and a server, whose rank 0 drives the same run loop."""
    return spec.algorithm.run_job(spec, out_dir, collect)


def asynchronous_simulator(spec: RunSpec, out_dir: str | None, collect: dict | None) -> dict:
    """Asynchronous or stale-synchronous workers simulated event by event (`dane.loop.asynchronous.simulator`)."""
    from .asynchronous.simulator import run_async

    return run_async(spec, out_dir, collect)


def batched_simulator(spec: RunSpec, out_dir: str | None, collect: dict | None) -> dict:
    """m workers as one stacked computation (`dane.comm.batched`, ``sim.batched``): the algorithm's step runs once
    on the stacked form (the problem's, or the algorithm's own: `dane.algorithm.AlgorithmConfig.build_stacked`),
    each worker charged 1/m of its measured compute, timed by the cost model."""
    m = spec.comm.workers
    torch.set_num_threads(1)  # as in the per-worker path: one core, the stacked work of all m workers on it
    with set_up():
        spec.problem.prepare()
        t0 = time.thread_time()
        problem = spec.algorithm.build_stacked(spec.problem, m, spec.control.dtype)  # by default the problem's
        if asks_reference(spec.problem):  # attached to the stacked rows' shards (`build_rows`)
            timeline.mark("reference")
    setup_s = (time.thread_time() - t0) / m
    timeline.mark("data")
    group = BatchedGroup(m, drawing(spec.comm.cost), spec.comm.stragglers, meter_for([problem.device]))
    start = time.perf_counter()
    try:
        summary = run_batched(group, lambda comm: run_worker(spec, comm, problem, out_dir, start, setup_s, collect))
    except (KeyboardInterrupt, Interrupted):  # a second Ctrl-C, or one before round 0's record: the records kept
        raise interrupted(f"interrupted{records_kept(out_dir)}") from None
    if group.interrupted:  # stopped at a collective: the summary says interrupted, as the per-worker path's
        raise interrupted(f"interrupted after round {summary['rounds']}{records_kept(out_dir)}")
    return summary


def simulator(spec: RunSpec, out_dir: str | None, collect: dict | None, declined: str | None = None) -> dict:
    """m workers as threads of this process (`dane.comm.ThreadGroup`), timed by the cost model.

    A Ctrl-C stops every worker at its next collective; the summary says ``interrupted`` and
    the run ends with `RunInterrupted` (exit status 130).  ``declined``: why ``sim.batched=auto`` kept one thread
    per worker (`dane.loop.batching.batched_path`), a note rank 0 prints and writes into the summary.
    """
    m = spec.comm.workers
    torch.set_num_threads(1)  # a simulated worker has one core, in its setup as in its rounds
    with set_up():
        problems, setups = zip(*(build_problem(spec, rank, m, time.thread_time) for rank in range(m)))
        attach_all(spec.problem, problems)
    if declined is not None:  # rank 0 prints its notes before the first round and writes them into the summary
        problems[0].notes = [*problems[0].notes, declined]
    group = ThreadGroup(m, drawing(spec.comm.cost), spec.comm.stragglers,
                        meter_for(problem.device for problem in problems))
    if parks(spec):  # a sampled round runs its clients (and rank 0) only; the others sleep through it
        group.roster = Roster(m, list(problems))
    start = time.perf_counter()
    summary = group.run(lambda comm: run_worker(spec, comm, problems[comm.rank], out_dir, start, max(setups),
                                                collect))[0]
    if group.interrupted:
        at = f" after round {summary['rounds']}" if summary is not None else ""
        raise interrupted(f"interrupted{at}{records_kept(out_dir)}")
    return summary


@contextlib.contextmanager
def set_up():
    """A Ctrl-C while the simulator builds its workers' problems (before any record or run directory): one line and
    exit status 130 (`RunInterrupted`), as a Ctrl-C in the rounds, not the traceback of whatever was building."""
    try:
        yield
    except KeyboardInterrupt as exc:
        if isinstance(exc, RunInterrupted):
            raise
        raise interrupted("interrupted during set-up, before round 0; nothing was written") from None


def interrupted(message: str) -> RunInterrupted:
    """The `RunInterrupted` a Ctrl-C in the simulator ends with, its one line already said (exit status 130); after a
    SIGTERM (`sigterm_as_ctrl_c`) the line says "interrupted by SIGTERM" and the status is 143."""
    by, code = interrupted_by()
    if by != "interrupted":
        message = message.replace("interrupted", f"interrupted by {by}", 1)
    error = RunInterrupted(message, code)
    say(error)
    return error


def records_kept(out_dir: str | None) -> str:
    """"; records so far are in <out_dir>" where the interrupted run left records there; "" where it left none (a
    run stopped before its first record removes the folder it made: `dane.records.results.RunWriter.close`)."""
    rounds = Path(out_dir) / ROUNDS_FILE if out_dir else None
    return f"; records so far are in {out_dir}" if rounds is not None and rounds.is_file() and \
        rounds.stat().st_size > 0 else ""


def elastic(spec: RunSpec, out_dir: str | None, collect: dict | None) -> dict:
    """Horovod elastic (`dane.loop.elastic`): the workers that remain go on when one is lost."""
    from .elastic import run_elastic

    return run_elastic(spec, out_dir, collect)


def launched(spec: RunSpec, out_dir: str | None, collect: dict | None) -> dict:
    """One process of a horovodrun or torchrun job; under ``comm=ps`` also a parameter server's process, which
    serves and returns its counters (it has no records of its own)."""
    comm = make_communicator(spec.comm.backend, torch_backend=spec.comm.torch_backend, servers=spec.comm.servers)
    lost = None
    try:
        if comm.is_server:
            return serve(spec, comm)
        # every rank agrees on rank 0's run directory, and stops with rank 0 where it refuses it
        told = json.dumps([out_dir or "", refusal(spec.control, out_dir) or ""] if comm.rank == 0 else [])
        out_dir, refused = json.loads(comm.broadcast_object(told, root=0))
        out_dir = out_dir or None
        if refused:
            raise SharedRefusal(refused)
        summary = launched_worker(spec, comm, out_dir, collect)
        if spec.comm.backend == "local" and summary.get("status") == "interrupted":  # one process: as the simulator
            raise interrupted(f"interrupted after round {summary['rounds']}{records_kept(out_dir)}")
        return summary
    except KeyboardInterrupt as exc:  # one process, before its first record: one line, exit status 130
        if spec.comm.backend != "local" or isinstance(exc, RunInterrupted):
            raise
        raise interrupted(f"interrupted{records_kept(out_dir) or ' before round 0; nothing was written'}") from None
    except (RuntimeError, LauncherTerminated) as exc:  # the latter a BaseException: no except Exception takes it
        lost = worker_lost(exc, "a parameter server" if comm.is_server else f"worker {comm.rank}", out_dir,
                           spec.control.checkpoint_every)
        if lost is None:
            raise
    finally:
        with contextlib.suppress(RuntimeError) if lost is not None else contextlib.nullcontext():
            comm.shutdown()  # after a lost peer, a shutdown that talks to it fails too
    raise lost from None


def serve(spec: RunSpec, comm) -> dict:
    """A parameter server's part (comm=ps): it answers the workers until they shut it down; its counters."""
    if spec.comm.asynchronous:  # asynchronous: set-up, the workers' pushes, then their evaluations
        from .asynchronous.protocol import AsyncServer

        comm.serve()
        AsyncServer(comm, spec).serve()
    return comm.serve()


def launched_worker(spec: RunSpec, comm: Communicator, out_dir: str | None, collect: dict | None) -> dict:
    """One launched worker's run: its summary."""
    problem, setup_s = build_problem(spec, comm.rank, comm.size, time.perf_counter)
    spec.problem.release()  # one process, one worker: keep only this worker's shard in memory
    check_one_push(spec.problem, problem, comm)  # each process read the store itself
    attach_one(spec.problem, problem, comm)
    comm.barrier()
    comm.reset_clock()
    if spec.comm.asynchronous:
        from .asynchronous.replay import run_async_ps

        return run_async_ps(spec, comm, problem, out_dir, time.perf_counter(), setup_s, collect)
    return run_worker(spec, comm, problem, out_dir, time.perf_counter(), setup_s, collect)
