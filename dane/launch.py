"""From validated configs to a finished run, on any backend or in the simulator.

`RunSpec` is everything a run needs, checked before any process group starts.
`execute` starts the backend (or m simulated worker threads), runs the same worker
function on each, and lets rank 0 write the results.

A run with ``checkpoint_every`` survives a lost process: every rank writes its part of a
checkpoint, rank 0 commits the round once all parts are on disk (`dane.checkpoint`), and
``resume=auto`` (or ``resume=<run dir>``) continues from the newest committed round, so
a job restarted by its launcher (``torchrun --max-restarts``) finishes as if never
stopped.  Under Horovod elastic (``comm.elastic=true``, `dane.elastic`) the job is not
restarted: the surviving workers reset to the new world size and continue from the
last round committed in memory, in the same run loop and run directory.  In the simulator ``sim.fail_at`` loses a worker on purpose (`SimulatedFault`),
and a Ctrl-C stops every worker at its next collective, writes the summary with
``status: interrupted`` and exits with status 130 (`RunInterrupted`).
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from .algorithm import Algorithm
from .checkpoint import (CHECKPOINT_DIR, check_resume, commit_checkpoint, load_checkpoint, save_checkpoint,
                         truncate_rounds)
from .comm import AlphaBeta, Communicator, Stragglers, ThreadGroup, make_communicator
from .comm.threads import Interrupted
from .confusion import write_confusion
from .errors import ConfigError, DivergenceError
from .problems import Problem
from .results import SUMMARY_FILE, RunWriter
from .runner import ProgressBar, RoundTable, StopRule, run

PROGRESS = ("table", "bar", "auto", "none")

#: test-only fault hook: rank 1 (or rank `TEST_KILL_RANK_ENV`) kills itself (SIGKILL) when it reaches this round,
#: once per run directory
TEST_KILL_ENV = "DANE_TEST_KILL_AT_ROUND"
TEST_KILL_RANK_ENV = "DANE_TEST_KILL_RANK"


class RunInterrupted(SystemExit, KeyboardInterrupt):
    """A simulated run stopped by Ctrl-C after writing its summary (``status: interrupted``).

    A `KeyboardInterrupt` to a caller that catches one, and a `SystemExit` with status 130
    (the shell's code for Ctrl-C) when nothing does, so the program ends without a traceback.
    """

    def __init__(self, message: str):
        super().__init__(130)
        self.message = message

    def __str__(self) -> str:
        return self.message


class SimulatedFault(RuntimeError):
    """A simulated worker lost on purpose (``sim.fail_at``): the run ends as a crashed job would."""


class AlgorithmConfig(Protocol):
    name: str

    def build(self, problem: Problem, comm: Communicator) -> Algorithm: ...


class ProblemConfig(Protocol):
    name: str

    def check_workers(self, workers: int) -> None: ...

    def build(self, rank: int, size: int, dtype: torch.dtype) -> Problem: ...


@dataclass(frozen=True)
class HorovodOptions:
    """Horovod settings applied (unless already set in the environment) before ``hvd.init()``.

    Small allreduces are latency-bound on these machines (DESIGN.md section 5):
    - a short cycle time (``HOROVOD_CYCLE_TIME``) lets the background thread pick a
      request up sooner;
    - ``pin_cores`` gives each local rank its own block of cores: the process (and so
      gloo's threads and torch's intra-op threads) is bound to it, and Horovod's
      background thread to its first core (``HOROVOD_THREAD_AFFINITY``).  With two ranks
      on 2 cores this took the median 4 KB allreduce from about 0.7-0.9 ms to 0.35-0.55 ms,
      as threads stop migrating between cores;
    - torch gets one intra-op thread per core of the block, as torchrun does with
      OMP_NUM_THREADS=1: two ranks with two threads each on 2 cores made a DANE round
      on the synthetic ridge about 8x slower (scripts/bench.py).  A network run then
      holds one thread whatever the block (`dane.problems.neural.reproducible_numerics`).
    Pinning is skipped when there are more local ranks than usable cores.
    """

    cycle_time_ms: float = 0.1
    pin_cores: bool = True

    def apply(self) -> None:
        os.environ.setdefault("HOROVOD_CYCLE_TIME", str(self.cycle_time_ms))
        local_size = int(os.environ.get("HOROVOD_LOCAL_SIZE", os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", 1)))
        local_rank = int(os.environ.get("HOROVOD_LOCAL_RANK", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", 0)))
        blocks = pin_local_rank(local_rank, local_size) if self.pin_cores else []
        if blocks:
            os.environ.setdefault("HOROVOD_THREAD_AFFINITY", ",".join(str(b[0]) for b in blocks))
        if "OMP_NUM_THREADS" not in os.environ:
            share = len(blocks[local_rank]) if blocks else len(os.sched_getaffinity(0)) // max(1, local_size)
            torch.set_num_threads(max(1, share))


def pin_local_rank(local_rank: int, local_size: int) -> list[list[int]]:
    """Bind this process to the ``local_rank``-th of ``local_size`` equal blocks of its usable cores.

    Returns every local rank's block (empty, and nothing bound, when there are more
    local ranks than cores).
    """
    cores = sorted(os.sched_getaffinity(0))
    width = len(cores) // max(1, local_size)
    if width < 1:
        return []
    blocks = [cores[r * width:(r + 1) * width] for r in range(local_size)]
    os.sched_setaffinity(0, blocks[local_rank])
    return blocks


@dataclass(frozen=True)
class RunSpec:
    algorithm: AlgorithmConfig
    problem: ProblemConfig
    backend: str  # horovod | torch | local (workers > 1 means the in-process simulator)
    workers: int
    stop: StopRule
    dtype: torch.dtype = torch.float64
    seed: int = 0
    cost: AlphaBeta = field(default_factory=AlphaBeta)
    stragglers: Stragglers = field(default_factory=Stragglers)
    horovod: HorovodOptions = field(default_factory=HorovodOptions)
    torch_backend: str | None = None
    servers: int = 1                 # comm=ps: the last `servers` launched ranks are parameter servers
    config_text: str = ""
    print_every: int = 1
    quiet: bool = False
    save_iterate: bool = False  # rank 0 writes the final iterate to <out_dir>/iterate.pt
    checkpoint_every: int = 0        # 0: never; else every K rounds, into <run dir>/checkpoint/
    resume: str | None = None        # a run directory to continue in place from its checkpoint
    overwrite: bool = False          # replace the records of a finished run in out_dir (else refused)
    progress: str = "table"          # rank 0's display: table | bar | auto (bar on a terminal) | none
    restart_unfinished: bool = False  # resume=auto found no committed checkpoint: an unfinished run's records are replaced
    faults: tuple[tuple[int, int], ...] = ()  # (round, worker): that simulated worker is lost there (once per run dir)
    elastic: bool = False            # Horovod elastic: lost or added workers change the world size (dane.elastic)

    simulate_single: bool = False    # also one worker in the simulator (timed on its thread's CPU clock, as m > 1)
    staleness: float = 0             # comm.staleness: 0 synchronous; > 0 (inf: asynchronous) dane.asynchronous
    step_time: float = 1e-3          # sim.step_time: the asynchronous simulator's modelled seconds per worker step
    worker_slowdown: tuple[float, ...] = (1.0,)  # comm.slowdown: real asynchronous workers slowed on purpose

    @property
    def simulated(self) -> bool:
        return self.backend == "local" and (self.workers > 1 or self.simulate_single)


def execute(spec: RunSpec, out_dir: str | None, *, collect: dict | None = None) -> dict:
    """Run ``spec``; rank 0 writes ``out_dir``.  Returns the summary (on every rank).

    ``collect``, when given, receives rank 0's ``records`` and final iterate ``w`` (the Python API).
    A problem config with ``numerics()`` (a network: `dane.problems.neural.reproducible_numerics`)
    fixes torch's thread count and algorithms for the whole run, on every rank and in the simulator.
    """
    if spec.backend == "horovod":
        spec.horovod.apply()  # before hvd.init(), and before numerics() so that its thread count wins
    numerics = getattr(spec.problem, "numerics", None)
    with numerics() if numerics is not None else contextlib.nullcontext():
        return _execute(spec, out_dir, collect)


def _execute(spec: RunSpec, out_dir: str | None, collect: dict | None) -> dict:
    torch.manual_seed(spec.seed)
    if spec.resume is not None:
        out_dir = spec.resume  # a resumed run continues in its own directory
        check_resume(spec.resume, spec.workers, spec.stop.rounds, spec.config_text)  # before anything there changes
    if spec.checkpoint_every and not out_dir and spec.simulated:
        raise ConfigError(f"checkpoint_every={spec.checkpoint_every} needs a run directory; set out_dir")
    if spec.staleness > 0 and spec.backend == "local":  # asynchronous or stale-synchronous: simulated event by event
        from .asynchronous import run_async

        summary = run_async(spec, out_dir, collect, _build, _worker)
    elif spec.simulated:
        torch.set_num_threads(1)  # a simulated worker has one core, in its setup as in its rounds
        problems, setups = zip(*(_build(spec, rank, spec.workers, time.thread_time) for rank in range(spec.workers)))
        group = ThreadGroup(spec.workers, spec.cost, spec.stragglers)
        start = time.perf_counter()
        summaries = group.run(lambda comm: _worker(spec, comm, problems[comm.rank], out_dir, start, max(setups),
                                                   collect))
        summary = summaries[0]
        if group.interrupted:
            where = f"; records so far are in {out_dir}" if out_dir else ""
            at = f" after round {summary['rounds']}" if summary is not None else ""
            interrupted = RunInterrupted(f"interrupted{at}{where}")
            print(interrupted, file=sys.stderr, flush=True)
            raise interrupted
    elif spec.elastic:
        from .elastic import run_elastic

        summary = run_elastic(spec, out_dir, collect)
    else:
        comm = make_communicator(spec.backend, torch_backend=spec.torch_backend, servers=spec.servers)
        try:
            if getattr(comm, "is_server", False):
                if spec.staleness > 0:  # comm=ps asynchronous: set-up, the workers' pushes, then their evaluations
                    from .comm.ps_async import AsyncServer

                    comm.serve()
                    AsyncServer(comm, spec).serve()
                return comm.serve()  # comm=ps: a server rank answers the workers until they shut it down
            out_dir = comm.broadcast_object(out_dir or "", root=0) or None  # every rank agrees on rank 0's directory
            problem, setup_s = _build(spec, comm.rank, comm.size, time.perf_counter)
            release = getattr(spec.problem, "release", None)
            if release is not None:
                release()  # one process, one worker: keep only this worker's shard in memory
            comm.barrier()
            comm.reset_clock()
            if spec.staleness > 0:
                from .async_ps import run_async_ps

                summary = run_async_ps(spec, comm, problem, out_dir, time.perf_counter(), setup_s, collect, _worker)
            else:
                summary = _worker(spec, comm, problem, out_dir, time.perf_counter(), setup_s, collect)
        finally:
            comm.shutdown()
    if summary["status"] == "diverged":
        raise DivergenceError(
            f"{summary['algorithm']} diverged at round {summary['rounds']} (objective {summary['final_objective']:.3g}); "
            f"results so far are in {out_dir}; try algorithm.safeguard=true or a larger algorithm.mu"
        )
    return summary


def _build(spec: RunSpec, rank: int, size: int, clock) -> tuple[Problem, float]:
    """Worker ``rank``'s problem and the seconds of its own setup (its shard's local Hessian, say).

    The shared data set and reference optimum are made first by the config's optional
    ``prepare()``, untimed, so ``setup_s`` is the work that parallelizes over workers.
    """
    prepare = getattr(spec.problem, "prepare", None)
    if prepare is not None:
        prepare()
    t0 = clock()
    problem = spec.problem.build(rank, size, spec.dtype)
    return problem, clock() - t0


def worker_meta(spec: RunSpec, rank: int, size: int) -> dict:
    """What a checkpoint part records about its run, checked when it is loaded."""
    return {"algorithm": spec.algorithm.name, "problem": spec.problem.name, "workers": size, "rank": rank}


def _worker(spec: RunSpec, comm: Communicator, problem: Problem, out_dir: str | None, start: float,
            setup_s: float = 0.0, collect: dict | None = None, elastic=None, algo=None) -> dict:
    """One worker's run: the algorithm on ``problem``, rank 0 writing ``out_dir``.

    ``elastic`` (a `dane.elastic.ElasticSession`) is one attempt of a Horovod elastic run:
    it continues from the state committed in memory instead of a checkpoint on disk.
    ``algo``, when given, runs instead of a newly built algorithm (`dane.asynchronous.AsyncRun`).
    """
    algo = spec.algorithm.build(problem, comm) if algo is None else algo
    meta = worker_meta(spec, comm.rank, comm.size)
    if elastic is None:
        resume = load_checkpoint(spec.resume, comm.rank, meta) if spec.resume is not None else None
        if resume is not None and comm.rank == 0:
            truncate_rounds(spec.resume, resume["round"])
        continuing = resume is not None
    else:
        continuing = elastic.prepare(comm)  # rank 0 cuts the records back to the committed round
    overwrite = spec.overwrite or (spec.restart_unfinished and out_dir is not None
                                   and not os.path.exists(os.path.join(out_dir, SUMMARY_FILE)))
    writer = RunWriter(out_dir, resume=continuing, overwrite=overwrite) if comm.rank == 0 and out_dir else None
    show = _display(spec) if comm.rank == 0 else None
    notes = list(getattr(problem, "notes", ()))
    if show is not None:
        for note in notes:
            print(f"note: {note}", file=sys.stderr, flush=True)

    seen: list[dict] = []  # this call's records, for the summary of an interrupted run

    def on_round(record: dict) -> None:
        _inject_faults(spec, comm.rank, record["round"], out_dir)
        if elastic is not None:
            elastic.annotate(record, comm)
        seen.append(record)
        if writer is not None:
            writer.write_round(record)
        if show is not None:
            show(record)

    def on_checkpoint(state: dict) -> None:
        if out_dir and spec.checkpoint_every:
            save_checkpoint(out_dir, comm.rank, state, meta)
            comm.barrier()  # every rank's part is on disk before the round is committed
            if comm.rank == 0:
                commit_checkpoint(out_dir, state["round"], comm.size, spec.config_text)
        if elastic is not None:
            elastic.commit({**state, "workers": comm.size})  # in memory; raises Horovod's reset signals

    if writer is not None and spec.config_text:
        writer.write_text("config.yaml", spec.config_text)
    try:
        if elastic is not None:
            resume = elastic.resume(algo, spec.stop, comm)  # the first attempt commits round 0: may reset
        records, status = run(algo, spec.stop, on_round, resume=resume, on_checkpoint=on_checkpoint,
                              checkpoint_every=spec.checkpoint_every or (1 if elastic is not None else 0))
    except Interrupted:  # a Ctrl-C in the simulator: this worker stopped at a collective
        if not seen:
            raise
        records, status = seen, "interrupted"
    finally:
        if writer is not None:
            writer.close()
        if isinstance(show, ProgressBar):
            show.close()
    last = records[-1]
    summary: dict[str, Any] = {
        "algorithm": spec.algorithm.name,
        "problem": spec.problem.name,
        "workers": comm.size,
        "backend": "simulator" if spec.simulated else spec.backend,
        "status": status,
        "rounds": last["round"],
        "final_objective": last["objective"],
        "final_suboptimality": last.get("suboptimality"),
        "final_grad_norm": last.get("grad_norm"),
        "total_bytes": last["bytes_sent"],
        "comm_rounds": last["comm_rounds"],
        "time_s": last["time_s"],
        "wall_time_s": time.perf_counter() - start,
        "setup_s": setup_s,
    }
    summary.update({f"final_{key}": last[key] for key in ("test_loss", "test_accuracy") if key in last})
    if notes:
        summary["notes"] = notes
    if getattr(problem, "data_info", None) is not None:
        summary["data"] = problem.data_info
    if collect is not None and comm.rank == 0 and status != "interrupted":
        collect.update(records=records, w=algo.reported_iterate.detach().clone(), summary=summary)
    if resume is not None and elastic is None:
        summary["resumed_from_round"] = resume["round"]
    if elastic is not None:
        summary.update(elastic.summary())
    if spec.simulated:
        group = comm.group  # type: ignore[attr-defined]
        summary.update(simulated_time_s=group.clock, simulated_compute_s=group.compute_time,
                       simulated_comm_s=group.comm_time, **group.cost.describe())
    if hasattr(problem, "confusion_matrix") and status not in ("diverged", "interrupted"):
        # One extra allreduce after the last record, so no logged cost includes it.
        (counts,) = comm.allreduce_mean([problem.confusion_matrix(algo.reported_iterate)])
        if writer is not None:
            write_confusion(out_dir, counts.numpy(), f"{spec.algorithm.name} on {spec.problem.name}, "
                                                     f"{comm.size} worker(s), round {last['round']}")
    if writer is not None and spec.save_iterate and status != "interrupted":
        torch.save(algo.reported_iterate.detach().clone(), os.path.join(out_dir, "iterate.pt"))  # the last record's
    summary.update(getattr(comm, "summary_entries", dict)())  # comm=ps: the servers' busy time and per-link traffic
    if writer is not None:
        writer.write_summary(summary)
    if show is not None:
        final = summary["final_suboptimality"]
        tail = f"final suboptimality {final:.3e}" if final is not None else f"final objective {summary['final_objective']:.8e}"
        if "final_test_accuracy" in summary:
            tail += f", test accuracy {summary['final_test_accuracy']:.4f}"
        print(f"{summary['algorithm']} on {summary['problem']}, {comm.size} worker(s), {summary['backend']}: "
              f"{status} after {summary['rounds']} rounds, {tail}, {summary['total_bytes']} bytes sent, "
              f"{summary['time_s']:.3f} s" + (f" -> {out_dir}" if out_dir else ""), flush=True)
    return summary


def _inject_faults(spec: RunSpec, rank: int, round_: int, out_dir: str | None) -> None:
    """``sim.fail_at`` (and the test-only `TEST_KILL_ENV`): lose this worker at ``round_``, once per run directory.

    A marker in the run's checkpoint folder remembers a fault that fired, so the restarted
    run (``resume=auto``, same command) gets past it, as a restarted job on healthy machines would.
    """
    kill_at, kill_rank = os.environ.get(TEST_KILL_ENV), int(os.environ.get(TEST_KILL_RANK_ENV, 1))
    faults = [(r, w, "fault") for r, w in spec.faults] + ([(int(kill_at), kill_rank, "kill")] if kill_at else [])
    for r, w, kind in faults:
        if (r, w) != (round_, rank):
            continue
        marker = os.path.join(out_dir, CHECKPOINT_DIR, f"{kind}_round{r}_worker{w}") if out_dir else None
        if marker is not None:
            if os.path.exists(marker):
                continue
            os.makedirs(os.path.dirname(marker), exist_ok=True)
            open(marker, "w").close()
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise SimulatedFault(f"simulated worker {rank} was lost at round {round_} (sim.fail_at); "
                             "the last committed checkpoint stays: rerun with resume=auto to continue")


def _display(spec: RunSpec):
    """Rank 0's per-round display: the table, a progress bar, or nothing."""
    if spec.quiet or spec.progress == "none":
        return None
    if spec.progress == "bar" or (spec.progress == "auto" and sys.stderr.isatty()):
        return ProgressBar(spec.stop.rounds)
    return RoundTable(spec.print_every)
