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
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from .algorithm import Algorithm
from .checkpoint import check_resume, commit_checkpoint, load_checkpoint, save_checkpoint, truncate_rounds
from .comm import AlphaBeta, Communicator, Stragglers, ThreadGroup, make_communicator
from .comm.horovod import HorovodOptions
from .comm.threads import Interrupted, meter_for
from .confusion import write_confusion
from .errors import ConfigError, DivergenceError
from .faults import RunInterrupted, inject_faults, worker_lost
from .problems import Problem
from .results import SUMMARY_FILE, RunWriter
from .runner import ProgressBar, RoundTable, StopRule, run

PROGRESS = ("table", "bar", "auto", "none")

class AlgorithmConfig(Protocol):
    name: str

    def build(self, problem: Problem, comm: Communicator) -> Algorithm: ...


class ProblemConfig(Protocol):
    name: str

    def check_workers(self, workers: int) -> None: ...

    def build(self, rank: int, size: int, dtype: torch.dtype) -> Problem: ...


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

    simulate_single: bool = False    # also one worker in the simulator (timed as m > 1 is: `comm.threads.Meter`)
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
        group = ThreadGroup(spec.workers, spec.cost, spec.stragglers,
                            meter_for(getattr(problem, "device", "cpu") for problem in problems))
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
        server, lost = getattr(comm, "is_server", False), None
        try:
            if not server:
                out_dir = comm.broadcast_object(out_dir or "", root=0) or None  # every rank agrees on rank 0's
            summary = _serve(spec, comm) if server else _launched(spec, comm, out_dir, collect)
        except RuntimeError as exc:
            lost = worker_lost(exc, "a parameter server" if server else f"worker {comm.rank}", out_dir,
                               spec.checkpoint_every)
            if lost is None:
                raise
        finally:
            with contextlib.suppress(RuntimeError) if lost is not None else contextlib.nullcontext():
                comm.shutdown()  # after a lost peer, a shutdown that talks to it fails too
        if lost is not None:
            raise lost from None
        if server:
            return summary  # a parameter server's counters: it has no records of its own
    if summary["status"] == "diverged":
        raise DivergenceError(
            f"{summary['algorithm']} diverged at round {summary['rounds']} (objective {summary['final_objective']:.3g}); "
            f"results so far are in {out_dir}; try algorithm.safeguard=true or a larger algorithm.mu"
        )
    return summary


def _serve(spec: RunSpec, comm: Communicator) -> dict:
    """A parameter server's part (comm=ps): it answers the workers until they shut it down; its counters."""
    if spec.staleness > 0:  # asynchronous: set-up, the workers' pushes, then their evaluations
        from .comm.ps_async import AsyncServer

        comm.serve()
        AsyncServer(comm, spec).serve()
    return comm.serve()


def _launched(spec: RunSpec, comm: Communicator, out_dir: str | None, collect: dict | None) -> dict:
    """One launched worker's run: its summary."""
    problem, setup_s = _build(spec, comm.rank, comm.size, time.perf_counter)
    release = getattr(spec.problem, "release", None)
    if release is not None:
        release()  # one process, one worker: keep only this worker's shard in memory
    comm.barrier()
    comm.reset_clock()
    if spec.staleness > 0:
        from .async_ps import run_async_ps

        return run_async_ps(spec, comm, problem, out_dir, time.perf_counter(), setup_s, collect, _worker)
    return _worker(spec, comm, problem, out_dir, time.perf_counter(), setup_s, collect)


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
    resume, writer = _open(spec, comm, out_dir, meta, elastic)
    show = _display(spec) if comm.rank == 0 else None
    if show is not None:
        for note in getattr(problem, "notes", ()):
            print(f"note: {note}", file=sys.stderr, flush=True)

    seen: list[dict] = []  # this call's records, for the summary of an interrupted run

    def on_round(record: dict) -> None:
        inject_faults(spec.faults, comm.rank, record["round"], out_dir)
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
    summary = _summary(spec, comm, problem, records, status, start, setup_s,
                       resumed_from=resume["round"] if resume is not None and elastic is None else None,
                       elastic=elastic)
    if collect is not None and comm.rank == 0 and status != "interrupted":
        collect.update(records=records, w=algo.reported_iterate.detach().clone(), summary=summary)
    _write_final_state(spec, comm, problem, algo, out_dir if writer is not None else None, records[-1]["round"], status)
    summary.update(getattr(comm, "summary_entries", dict)())  # comm=ps: the servers' busy time and per-link traffic
    if writer is not None:
        writer.write_summary(summary)
    if show is not None:
        _report(summary, comm.size, out_dir)
    return summary


def _open(spec: RunSpec, comm: Communicator, out_dir: str | None, meta: dict,
          elastic) -> tuple[dict | None, RunWriter | None]:
    """Where this worker starts, and rank 0's writer of ``out_dir`` (with the run's config.yaml).

    The start is a committed checkpoint on disk (``resume``; rank 0 cuts the records back
    to its round), None for round 0, or, under Horovod elastic, the state in memory
    (`dane.elastic.ElasticSession.resume` loads it later; None here).
    """
    resume = None
    if elastic is None:
        resume = load_checkpoint(spec.resume, comm.rank, meta) if spec.resume is not None else None
        if resume is not None and comm.rank == 0:
            truncate_rounds(spec.resume, resume["round"])
        continuing = resume is not None
    else:
        continuing = elastic.prepare(comm)  # rank 0 cuts the records back to the committed round
    if comm.rank != 0 or not out_dir:
        return resume, None
    overwrite = spec.overwrite or (spec.restart_unfinished and not os.path.exists(os.path.join(out_dir, SUMMARY_FILE)))
    writer = RunWriter(out_dir, resume=continuing, overwrite=overwrite)
    if spec.config_text:
        writer.write_text("config.yaml", spec.config_text)
    return resume, writer


def _summary(spec: RunSpec, comm: Communicator, problem: Problem, records: list[dict], status: str, start: float,
             setup_s: float, *, resumed_from: int | None, elastic) -> dict[str, Any]:
    """summary.json's entries from the run's last record, its clocks, its data and (simulated) its cost split."""
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
    notes = list(getattr(problem, "notes", ()))
    if notes:
        summary["notes"] = notes
    if getattr(problem, "data_info", None) is not None:
        summary["data"] = problem.data_info
    if resumed_from is not None:
        summary["resumed_from_round"] = resumed_from
    if elastic is not None:
        summary.update(elastic.summary())
    if spec.simulated:
        group = comm.group  # type: ignore[attr-defined]
        summary.update(simulated_time_s=group.clock, simulated_compute_s=group.compute_time,
                       simulated_comm_s=group.comm_time, simulated_compute_clock=group.compute_clock,
                       **group.cost.describe())
    return summary


def _write_final_state(spec: RunSpec, comm: Communicator, problem: Problem, algo: Algorithm, out_dir: str | None,
                       last_round: int, status: str) -> None:
    """The test confusion matrix (networks) and, with ``save_iterate``, the final iterate; rank 0 writes
    them into ``out_dir`` (None on the other ranks, which still join the confusion matrix's allreduce)."""
    if hasattr(problem, "confusion_matrix") and status not in ("diverged", "interrupted"):
        # One extra allreduce after the last record, so no logged cost includes it.
        (counts,) = comm.allreduce_mean([problem.confusion_matrix(algo.reported_iterate)])
        if out_dir is not None:
            write_confusion(out_dir, counts.numpy(), f"{spec.algorithm.name} on {spec.problem.name}, "
                                                     f"{comm.size} worker(s), round {last_round}")
    if out_dir is not None and spec.save_iterate and status != "interrupted":
        torch.save(algo.reported_iterate.detach().clone(), os.path.join(out_dir, "iterate.pt"))  # the last record's


def _report(summary: dict, size: int, out_dir: str | None) -> None:
    """Rank 0's closing line: how the run ended, its final metrics, its traffic and time."""
    final = summary["final_suboptimality"]
    tail = f"final suboptimality {final:.3e}" if final is not None else f"final objective {summary['final_objective']:.8e}"
    if "final_test_accuracy" in summary:
        tail += f", test accuracy {summary['final_test_accuracy']:.4f}"
    print(f"{summary['algorithm']} on {summary['problem']}, {size} worker(s), {summary['backend']}: "
          f"{summary['status']} after {summary['rounds']} rounds, {tail}, {summary['total_bytes']} bytes sent, "
          f"{summary['time_s']:.3f} s" + (f" -> {out_dir}" if out_dir else ""), flush=True)


def _display(spec: RunSpec):
    """Rank 0's per-round display: the table, a progress bar, or nothing."""
    if spec.quiet or spec.progress == "none":
        return None
    if spec.progress == "bar" or (spec.progress == "auto" and sys.stderr.isatty()):
        return ProgressBar(spec.stop.rounds)
    return RoundTable(spec.print_every)
