"""One worker's run, the same on every backend: build its problem, run the round loop, write what rank 0 writes.

`build_problem` makes worker ``rank``'s shard; `run_worker` runs the algorithm on it
through `dane.runner.run`, with rank 0 writing the records, checkpoints, the summary and
the closing line.  `dane.launch` calls them once per launched process or once per
simulated thread; `dane.elastic` calls them once per elastic attempt; the asynchronous
simulator and the asynchronous parameter-server run call `run_worker` with their own driver.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any

import torch
import yaml

from .algorithm import Algorithm
from .checkpoint import commit_checkpoint, keeps_what_was_written, load_checkpoint, save_checkpoint, truncate_rounds
from .comm import Communicator
from .comm.threads import Interrupted
from .confusion import write_confusion
from .errors import say
from .faults import inject_faults
from .problems import Problem
from .problems.linear_models import in_target_units
from .results import SUMMARY_FILE, RunWriter, atomic_write
from .progress import RoundBar, RoundTable
from .runner import run
from .spec import RunControl, RunSpec
from .trackers import open_trackers
from . import timeline

def build_problem(spec: RunSpec, rank: int, size: int, clock) -> tuple[Problem, float]:
    """Worker ``rank``'s problem and the seconds of its own setup (its shard's local Hessian, say).

    The shared data set and reference optimum are made first by the config's optional
    ``prepare()``, untimed, so ``setup_s`` is the work that parallelizes over workers.
    """
    prepare = getattr(spec.problem, "prepare", None)
    if prepare is not None:
        prepare()
    t0 = clock()
    problem = spec.problem.build(rank, size, spec.control.dtype)
    timeline.mark("data")
    return problem, clock() - t0


def worker_meta(spec: RunSpec, rank: int, size: int) -> dict:
    """What a checkpoint part records about its run, checked when it is loaded."""
    return {"algorithm": spec.algorithm.name, "problem": spec.problem.name, "workers": size, "rank": rank}


@keeps_what_was_written  # a full or read-only out_dir: one line saying what it keeps and how to go on
def run_worker(spec: RunSpec, comm: Communicator, problem: Problem, out_dir: str | None, start: float,
            setup_s: float = 0.0, collect: dict | None = None, elastic=None, algo=None) -> dict:
    """One worker's run: the algorithm on ``problem``, rank 0 writing ``out_dir``.

    ``elastic`` (a `dane.elastic.ElasticSession`) is one attempt of a Horovod elastic run:
    it continues from the state committed in memory instead of a checkpoint on disk.
    ``algo``, when given, runs instead of a newly built algorithm (`dane.asynchronous.simulator.AsyncRun`).
    """
    algo = spec.algorithm.build(problem, comm) if algo is None else algo
    meta = worker_meta(spec, comm.rank, comm.size)
    resume, writer = _open(spec.control, comm, out_dir, meta, elastic)
    try:  # the directory stays this run's until its summary is written
        show = display(spec.control, spec.algorithm.algorithm) if comm.rank == 0 else None
        if show is not None:
            for note in getattr(problem, "notes", ()):
                say(f"note: {note}")

        seen: list[dict] = []  # this call's records, for the summary of an interrupted run
        units = getattr(problem, "target_units", None)  # a standardized target: reported in its own units

        def on_round(record: dict) -> None:
            inject_faults(spec.control.faults, comm.rank, record["round"], out_dir)
            if elastic is not None:
                elastic.annotate(record, comm)
            seen.append(record)
            record = in_target_units(record, units)  # a copy: the stop rule keeps the records it compares
            if writer is not None:
                writer.write_round(record)
            if show is not None:
                if len(seen) == 1:  # the header: the records' keys now say which test tol applies to
                    say(f"stop: {' or '.join(filter(None, (spec.control.stop.rule(record), f'{spec.control.stop.rounds} rounds')))}")
                show(record)

        def on_checkpoint(state: dict) -> None:
            if out_dir and spec.control.checkpoint_every:
                save_checkpoint(out_dir, comm.rank, state, meta)
                comm.barrier()  # every rank's part is on disk before the round is committed
                if comm.rank == 0:
                    commit_checkpoint(out_dir, state["round"], comm.size, spec.control.config_text)
            if elastic is not None:
                elastic.commit({**state, "workers": comm.size})  # in memory; raises Horovod's reset signals

        try:
            if elastic is not None:
                resume = elastic.resume(algo, spec.control.stop, comm)  # the first attempt commits round 0: may reset
            timeline.mark("round0")
            records, status = run(algo, spec.control.stop, on_round, resume=resume, on_checkpoint=on_checkpoint,
                                  checkpoint_every=spec.control.checkpoint_every or (1 if elastic is not None else 0))
        except Interrupted:  # a Ctrl-C in the simulator: this worker stopped at a collective
            if not seen:
                raise
            records, status = seen, "interrupted"
        finally:
            if writer is not None:
                writer.finish_rounds()
            if isinstance(show, RoundBar):
                show.close()
        timeline.mark("end")
        if units is not None:
            records = [in_target_units(r, units) for r in records]
            algo.reported_iterate = algo.reported_iterate * units[1]
        summary = _summary(spec, comm, problem, records, status, start, setup_s,
                           resumed_from=resume["round"] if resume is not None and elastic is None else None,
                           elastic=elastic)
        summary["stopped_by"] = status if status == "interrupted" else getattr(algo, "stopped_by", status)
        if collect is not None and comm.rank == 0 and status != "interrupted":
            collect.update(records=records, w=algo.reported_iterate.detach().clone(), summary=summary)
        _write_final_state(spec, comm, problem, algo, out_dir if writer is not None else None, records[-1]["round"], status)
        summary.update(getattr(comm, "summary_entries", dict)())  # comm=ps: the servers' busy time and per-link traffic
        if writer is not None:
            writer.write_summary(summary)
        if show is not None:
            _report(summary, comm.size, out_dir)
        return summary
    finally:
        if writer is not None:
            writer.close()


def _open(control: RunControl, comm: Communicator, out_dir: str | None, meta: dict,
          elastic) -> tuple[dict | None, RunWriter | None]:
    """Where this worker starts, and rank 0's writer of ``out_dir`` (with the run's config.yaml).

    The start is a committed checkpoint on disk (``resume``; rank 0 cuts the records back
    to its round), None for round 0, or, under Horovod elastic, the state in memory
    (`dane.elastic.ElasticSession.resume` loads it later; None here).
    """
    resume = None
    if elastic is None:
        resume = load_checkpoint(control.resume, comm.rank, meta) if control.resume is not None else None
        if resume is not None and comm.rank == 0:
            truncate_rounds(control.resume, resume["round"])
        continuing = resume is not None
    else:
        continuing = elastic.prepare(comm)  # rank 0 cuts the records back to the committed round
    if comm.rank != 0 or not out_dir:
        return resume, None
    overwrite = control.overwrite or (control.restart_unfinished and not os.path.exists(os.path.join(out_dir, SUMMARY_FILE)))
    writer = RunWriter(out_dir, resume=continuing, overwrite=overwrite)
    try:
        if control.config_text:
            writer.write_text("config.yaml", control.config_text)
    except OSError:  # a full or read-only out_dir (`keeps_what_was_written` says so): release the lock first
        writer.close()
        raise
    if len(control.logger) > 1:  # trackers beside rounds.jsonl: each record goes to them once it is on disk
        writer.attach(open_trackers(control.logger, out_dir, config=yaml.safe_load(control.config_text) or {},
                                    continuing=continuing, mlflow_uri=control.mlflow_uri))
    return resume, writer


def _summary(spec: RunSpec, comm: Communicator, problem: Problem, records: list[dict], status: str, start: float,
             setup_s: float, *, resumed_from: int | None, elastic) -> dict[str, Any]:
    """summary.json's entries from the run's last record, its clocks, its data and (simulated) its cost split."""
    last = records[-1]
    summary: dict[str, Any] = {
        "algorithm": spec.algorithm.name,
        "problem": spec.problem.name,
        "workers": comm.size,
        "backend": "simulator" if spec.comm.simulated else spec.comm.backend,
        "status": status,
        "rounds": last["round"],
        "final_objective": last["objective"],
        "final_suboptimality": last.get("suboptimality"),
        "final_relative_suboptimality": relative_suboptimality(last),
        "final_grad_norm": last.get("grad_norm"),
        "total_bytes": last["bytes_sent"],
        "comm_rounds": last["comm_rounds"],
        "time_s": last["time_s"],
        "wall_time_s": time.perf_counter() - start,
        "setup_s": setup_s,
        "stop_rule": spec.control.stop.rule(last),
        "timeline": timeline.phases(),
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
    if spec.comm.simulated:
        group = comm.group  # type: ignore[attr-defined]
        summary.update(simulated_time_s=group.clock, simulated_compute_s=group.compute_time,
                       simulated_comm_s=group.comm_time, simulated_compute_clock=group.compute_clock,
                       **group.cost.describe())
    return summary


def relative_suboptimality(record: dict) -> float | None:
    """(O(w) − O*)/|O*| of a record with a suboptimality (O* = objective − suboptimality); None without one or at O* = 0."""
    if record.get("suboptimality") is None:
        return None
    optimum = abs(record["objective"] - record["suboptimality"])
    return record["suboptimality"] / optimum if optimum > 0 else None


def _write_final_state(spec: RunSpec, comm: Communicator, problem: Problem, algo: Algorithm, out_dir: str | None,
                       last_round: int, status: str) -> None:
    """The test confusion matrix (networks) and, with ``save_iterate``, the final iterate; rank 0 writes
    them into ``out_dir`` (None on the other ranks, which still join the confusion matrix's allreduce)."""
    if problem.confusion_matrix is not None and status not in ("diverged", "interrupted"):
        # One extra allreduce after the last record, so no logged cost includes it.
        (counts,) = comm.allreduce_mean([problem.confusion_matrix(algo.reported_iterate)])
        if out_dir is not None:
            write_confusion(out_dir, counts.numpy(), f"{spec.algorithm.name} on {spec.problem.name}, "
                                                     f"{comm.size} worker(s), round {last_round}")
    if out_dir is not None and spec.control.save_iterate and status != "interrupted":
        iterate = algo.reported_iterate.detach().clone()  # the last record's
        atomic_write(os.path.join(out_dir, "iterate.pt"), lambda f: torch.save(iterate, f))  # an OSError when full


def _report(summary: dict, size: int, out_dir: str | None) -> None:
    """Rank 0's closing line: how the run ended, its final metrics, its traffic and time."""
    final, relative = summary["final_suboptimality"], summary["final_relative_suboptimality"]
    tail = f"final suboptimality {final:.3e}" if final is not None else f"final objective {summary['final_objective']:.8e}"
    if relative is not None:
        tail += f" ({relative:.1e} x |O*|)"
    if "final_test_accuracy" in summary:
        tail += f", test accuracy {summary['final_test_accuracy']:.4f}"
    print(f"{summary['algorithm']} on {summary['problem']}, {size} worker(s), {summary['backend']}: "
          f"{summary['status']} ({summary['stopped_by']}) after {summary['rounds']} rounds, {tail}, {summary['total_bytes']} bytes sent, "
          f"{summary['time_s']:.3f} s" + (f" -> {out_dir}" if out_dir else ""), flush=True)


def display(control: RunControl, algorithm: type[Algorithm] = Algorithm):
    """Rank 0's per-round display: the table (with ``algorithm``'s columns), a progress bar, or nothing."""
    if control.quiet or control.progress == "none":
        return None
    if control.progress == "bar" or (control.progress == "auto" and sys.stderr.isatty()):
        return RoundBar(control.stop.rounds)
    return RoundTable(control.print_every, algorithm=algorithm)
