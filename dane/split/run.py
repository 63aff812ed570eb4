"""A split run from its `RunSpec`: the simulator (``workers=m``, one process) or torchrun (m agents + 1 server).

`run_split` is what `dane.launch.execute` calls for ``algorithm=split``.  Rank 0 drives
the package's round loop (`dane.runner.run`) and writes the package's records
(``rounds.jsonl``, one record per epoch; ``summary.json``; ``confusion.json``;
``iterate.pt`` with ``save_iterate``), the checkpoints (``checkpoint_every``: one part per
agent, rank 0's with the run's state and the server's; the same layout in both kinds of
run) and the closing line.
"""
from __future__ import annotations

import contextlib
import os
import time

import torch

from ..checkpoint import commit_checkpoint, load_checkpoint, save_checkpoint, truncate_rounds
from ..confusion import write_confusion
from ..errors import ConfigError
from ..faults import inject_faults, worker_lost
from ..results import SUMMARY_FILE, RunWriter, atomic_write
from ..runner import run
from .links import DistLink, SimLink
from .training import CHECKPOINT, STOP, SplitClock, SplitRun, build_parties, follow, load_agents


def run_split(spec, out_dir: str | None, collect: dict | None = None) -> dict:
    backend, m = spec.comm.backend, spec.comm.workers
    if backend == "local":
        proto, info = build_parties(spec, set(range(m + 1)), SimLink(spec.comm.cost))
        algo = SplitRun(proto, info, SplitClock(m, simulated=True), proto.link, launched=False)
        algo.on_epoch = lambda _, epoch: [inject_faults(spec.control.faults, a, epoch, out_dir)  # sim.fail_at
                                          for a in range(m)]
        return drive(spec, algo, out_dir, collect)
    if backend != "ps" or spec.comm.servers != 1:
        raise ConfigError(f"algorithm=split runs in the simulator (workers=<m>, plain python) or under torchrun with "
                          f"comm=ps and one server (torchrun --nproc_per_node <m+1> ... comm=ps), not comm={backend}"
                          + (f" with comm.servers={spec.comm.servers}" if backend == "ps" else ""))
    return launched(spec, out_dir, collect)


def launched(spec, out_dir: str | None, collect: dict | None) -> dict:
    import torch.distributed as dist

    from ..comm.torch_dist import init_process_group

    build_parties(spec, set(), None)  # a bad cut or problem: one line before any process group starts
    if not dist.is_initialized():
        init_process_group("gloo")
    rank, m = dist.get_rank(), spec.comm.workers
    who = "the split server" if rank == m else f"agent {rank}"
    lost = None
    try:
        shared = [out_dir or ""]
        dist.broadcast_object_list(shared, src=0)  # every rank writes its checkpoint part into rank 0's run directory
        out_dir = shared[0] or None
        link = DistLink(rank)
        proto, info = build_parties(spec, {rank}, link)
        faults = lambda r, epoch: inject_faults(spec.control.faults, r, epoch, out_dir)  # noqa: E731 - test hook
        if rank == 0:
            algo = SplitRun(proto, info, SplitClock(m, simulated=False), link, launched=True)
            algo.on_epoch = faults
            return drive(spec, algo, out_dir, collect)
        if rank < m and spec.control.resume is not None:
            load_agents(proto, load_checkpoint(spec.control.resume, rank, meta(spec, rank))["algorithm"])

        def save_part(round_: int, agents: dict) -> None:
            save_checkpoint(out_dir, rank, {"round": round_, "algorithm": {"agents": agents}}, meta(spec, rank))
            link.send_control(torch.tensor([1]), 0)

        follow(proto, link, save_part, faults)
        return {"status": "served" if rank == m else "followed", "rank": rank}
    except RuntimeError as exc:
        lost = worker_lost(exc, who, out_dir, spec.control.checkpoint_every,
                           name=lambda r: "the split server" if r == m else f"agent {r}")
        if lost is None:
            raise
    finally:
        with contextlib.suppress(RuntimeError):
            if lost is None:
                dist.barrier()
            dist.destroy_process_group()
    raise lost from None


def meta(spec, rank: int) -> dict:
    return {"algorithm": "split", "problem": spec.problem.name, "workers": spec.comm.workers, "rank": rank}


def drive(spec, algo: SplitRun, out_dir: str | None, collect: dict | None) -> dict:
    """Rank 0: the round loop, the records, the checkpoints, the summary and the closing line."""
    control, start = spec.control, time.perf_counter()
    resume = load_checkpoint(control.resume, 0, meta(spec, 0)) if control.resume is not None else None
    writer = None
    if out_dir:
        if resume is not None:
            truncate_rounds(out_dir, resume["round"])
        overwrite = control.overwrite or (control.restart_unfinished and
                                          not os.path.exists(os.path.join(out_dir, SUMMARY_FILE)))
        writer = RunWriter(out_dir, resume=resume is not None, overwrite=overwrite)
    try:  # the directory stays this run's until its summary is written
        return run_rounds(spec, algo, out_dir, collect, resume, writer, start)
    finally:
        if writer is not None:
            writer.close()


def run_rounds(spec, algo: SplitRun, out_dir: str | None, collect: dict | None, resume: dict | None,
               writer: RunWriter | None, start: float) -> dict:
    """`drive`'s rounds, checkpoints, summary and closing line, with ``writer`` holding ``out_dir``."""
    from ..worker import display

    control, m = spec.control, spec.comm.workers
    if writer is not None and control.config_text:
        writer.write_text("config.yaml", control.config_text)
    show = display(control)

    def on_round(record: dict) -> None:
        if writer is not None:
            writer.write_round(record)
        if show is not None:
            show(record)

    def on_checkpoint(state: dict) -> None:
        if not out_dir:
            return
        if algo.launched:
            algo.command(CHECKPOINT, state["round"])
        for key, agent_part in state["algorithm"]["agents"].items():  # the simulator writes every agent's part
            if key != "0":
                save_checkpoint(out_dir, int(key), {"round": state["round"], "algorithm": {"agents": {key: agent_part}}},
                                meta(spec, int(key)))
        save_checkpoint(out_dir, 0, state, meta(spec, 0))
        if algo.launched:
            for rank in range(1, m):
                algo.link.recv_control((1,), torch.int64, rank)  # that agent's part is on disk
        commit_checkpoint(out_dir, state["round"], m, control.config_text)

    try:
        records, status = run(algo, control.stop, on_round, resume=resume, on_checkpoint=on_checkpoint,
                              checkpoint_every=control.checkpoint_every)
    finally:
        if writer is not None:
            writer.finish_rounds()
        if hasattr(show, "close"):
            show.close()
    algo.command(STOP)
    summary = make_summary(spec, algo, records, status, start, resume)
    if collect is not None:
        collect.update(records=records, w=algo.iterate.clone(), summary=summary)
    if writer is not None:
        write_confusion(out_dir, algo.confusion(), f"split ({spec.algorithm.schedule}) on {spec.problem.name}, "
                                                   f"{m} agent(s), epoch {records[-1]['round']}")
        if control.save_iterate:  # the uncut model's weights at the last record, as every other algorithm writes them
            iterate = algo.iterate.clone()
            atomic_write(os.path.join(out_dir, "iterate.pt"), lambda f: torch.save(iterate, f))
        writer.write_summary(summary)
    if show is not None:
        last = records[-1]
        print(f"split ({spec.algorithm.schedule}, cut {algo.info['cut']}) on {spec.problem.name}, {m} agent(s), "
              f"{summary['backend']}: {status} after {last['round']} epochs, test accuracy {last['test_accuracy']:.4f}, "
              f"{summary['total_bytes']} bytes sent, {summary['time_s']:.3f} s" + (f" -> {out_dir}" if out_dir else ""),
              flush=True)
    return summary


def make_summary(spec, algo: SplitRun, records: list[dict], status: str, start: float, resume: dict | None) -> dict:
    last, config, info = records[-1], spec.algorithm, algo.info
    parts = info["parts"]
    count = lambda module: sum(p.numel() for p in module.parameters()) if module is not None else 0  # noqa: E731
    summary = {
        "algorithm": "split", "problem": spec.problem.name, "workers": spec.comm.workers,
        "backend": "simulator" if spec.comm.backend == "local" else spec.comm.backend, "status": status,
        "rounds": last["round"], "final_objective": last["objective"], "final_suboptimality": None,
        "final_relative_suboptimality": None,
        "final_test_loss": last["test_loss"], "final_test_accuracy": last["test_accuracy"],
        "total_bytes": last["bytes_sent"], "comm_rounds": last["comm_rounds"], "time_s": last["time_s"],
        "wall_time_s": time.perf_counter() - start, "stop_rule": control_rule(spec, last),
        "schedule": config.schedule, "labels": config.labels, "cut": info["cut"], "cut_share": info["cut_share"],
        "cut_width": info["cut_width"], "bottom_params": count(parts.bottom), "top_params": count(parts.top),
        "head_params": count(parts.head), "data": info["data"].info(),
        "bytes_by_link": dict(algo.bytes_by_link),  # the whole run's, a resumed one's included
    }
    if resume is not None:
        summary["resumed_from_round"] = resume["round"]
    if spec.comm.backend == "local":
        summary.update(simulated_time_s=last["time_s"], **spec.comm.cost.describe())
    return summary


def control_rule(spec, record: dict) -> str | None:
    return spec.control.stop.rule(record)
