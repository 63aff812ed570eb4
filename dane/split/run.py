"""A split run from its `RunSpec`: the simulator (``workers=m``, one process) or torchrun (m agents + 1 server).

`run_split` is the run kind `dane.loop.kinds` picks for ``algorithm=split``.  Rank 0 drives the
package's one run loop (`dane.loop.driver.drive`) over `SplitRun` (a round is an epoch), with
the callbacks every run has (``rounds.jsonl``, ``summary.json``, the display, the API's
``collect``) and split learning's own: the checkpoints (``checkpoint_every``: one part per
agent, rank 0's with the run's state and the server's; the same layout in both kinds of
run), the summary's cut and link entries, ``confusion.json``, ``iterate.pt`` with
``save_iterate``, and the closing line.
"""
from __future__ import annotations

import contextlib

import torch

from ..loop.callbacks import Callback, Checkpoints, Collect, Display, Policy, Records, save_iterate, shows
from ..loop.checkpoint import commit_checkpoint, load_checkpoint, part_meta, save_checkpoint
from ..comm.launcher_signals import LauncherTerminated
from ..comm.tail import ALPHA_BETA_ONLY
from ..records.confusion import write_confusion
from ..loop.driver import Loop, drive as run_loop
from ..errors import ConfigError, plural
from ..loop.faults import inject_faults, worker_lost
from .links import DistLink, SimLink
from .training import CHECKPOINT, STOP, SplitClock, SplitRun, build_parties, follow, load_agents


def run_split(spec, out_dir: str | None, collect: dict | None = None) -> dict:
    backend, m = spec.comm.backend, spec.comm.workers
    if backend == "local":
        proto, info = build_parties(spec, set(range(m + 1)), SimLink(spec.comm.cost))
        algo = SplitRun(proto, info, SplitClock(m, simulated=True), proto.link, launched=False)
        algo.on_epoch = lambda _, epoch: [inject_faults(spec.control.faults, a, epoch, out_dir,
                                                        spec.control.checkpoint_every)  # sim.fail_at
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
        faults = lambda r, epoch: inject_faults(spec.control.faults, r, epoch, out_dir,  # noqa: E731 - test hook
                                                spec.control.checkpoint_every)
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
    except (RuntimeError, LauncherTerminated) as exc:  # the latter a BaseException: torchrun's SIGTERM
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
    return part_meta(spec, rank, spec.comm.workers)


def drive(spec, algo: SplitRun, out_dir: str | None, collect: dict | None) -> dict:
    """Rank 0: the run loop over ``algo``'s epochs with split learning's callbacks; returns the summary."""
    control = spec.control
    backend = "simulator" if spec.comm.backend == "local" else spec.comm.backend
    loop = Loop(spec, algo, algo.comm, out_dir, backend=backend,
                checkpoint_every=control.checkpoint_every)
    # the defaults policy's entry, shown and summarized by `Policy` as every method's: cut=null is the one package rule
    algo.defaults = () if spec.algorithm.cut is not None else (
        {"key": "algorithm.cut", "value": algo.info["cut"], "rule": "cut_model",  # the smallest valid bottom
         "stats": {"cut_share": algo.info["cut_share"]}},)
    callbacks: list[Callback] = [SplitCheckpoints(spec), SplitEnd(), Policy(shows(control))]
    if collect is not None:
        callbacks.append(Collect(collect))
    if out_dir:
        callbacks += [SplitOutputs(), Records(control)]
    if shows(control):
        callbacks += [Display(control, preamble=False), SplitClosingLine()]
    return run_loop(loop, callbacks)


class SplitCheckpoints(Checkpoints):
    """`Checkpoints` of a split run: rank 0 writes its part with the run's state and, in the simulator, every
    agent's; launched, it commands the agents to write theirs and waits for each before the commit."""

    def on_checkpoint(self, loop, state: dict) -> None:
        algo, out_dir, m = loop.algo, loop.out_dir, loop.comm.size
        if not out_dir:
            return
        if algo.launched:
            algo.command(CHECKPOINT, state["round"])
        for key, agent_part in state["algorithm"]["agents"].items():  # the simulator writes every agent's part
            if key != "0":
                part = {"round": state["round"], "algorithm": {"agents": {key: agent_part}}}
                save_checkpoint(out_dir, int(key), part, self.meta(loop, int(key)))
        save_checkpoint(out_dir, 0, state, self.meta(loop, 0))
        if algo.launched:
            for rank in range(1, m):
                algo.link.recv_control((1,), torch.int64, rank)  # that agent's part is on disk
        commit_checkpoint(out_dir, state["round"], m, self.control.config_text)


class SplitEnd(Callback):
    """After the last epoch: the followers stop, and the summary gets the cut, the parts' sizes, the data and the
    bytes per link (and, simulated, the cost model)."""

    def on_end(self, loop, summary: dict) -> None:
        loop.algo.command(STOP)
        summary.update(split_entries(loop.spec, loop.algo, loop.records[-1]))


def split_entries(spec, algo: SplitRun, last: dict) -> dict:
    config, info = spec.algorithm, algo.info
    parts = info["parts"]
    count = lambda module: sum(p.numel() for p in module.parameters()) if module is not None else 0  # noqa: E731
    entries = {
        "schedule": config.schedule, "labels": config.labels, "cut": info["cut"], "cut_share": info["cut_share"],
        "cut_width": info["cut_width"], "bottom_params": count(parts.bottom), "top_params": count(parts.top),
        "head_params": count(parts.head), "data": info["data"].info(),
        "bytes_by_link": dict(algo.bytes_by_link),  # the whole run's, a resumed one's included
    }
    if spec.comm.backend == "local":
        # its links charge α + bytes/β per message (`SimLink`): a calibration's tail is not drawn here
        entries.update(simulated_time_s=last["time_s"], **{**spec.comm.cost.describe(), "calibration": ALPHA_BETA_ONLY})
        if spec.comm.cost_file is not None:
            entries["calibration_file"] = spec.comm.cost_file
    notes = [*config.notes, *spec.control.notes]  # what the run chose for the user, then what the config says
    if notes:
        entries["notes"] = notes
    return entries


class SplitOutputs(Callback):
    """The test confusion matrix of the trained model and, with ``save_iterate``, the uncut model's weights at the
    last record, as every other algorithm writes them."""

    def on_end(self, loop, summary: dict) -> None:
        spec, algo = loop.spec, loop.algo
        write_confusion(loop.out_dir, algo.confusion(), f"split ({spec.algorithm.schedule}) on {spec.problem.name}, "
                                                        f"{loop.comm.size} agent(s), epoch {loop.records[-1]['round']}")
        if spec.control.save_iterate:
            save_iterate(loop.out_dir, loop.iterate)


class SplitClosingLine(Callback):
    def on_end(self, loop, summary: dict) -> None:
        spec, last = loop.spec, loop.records[-1]
        print(f"split ({spec.algorithm.schedule}, cut {loop.algo.info['cut']}) on {spec.problem.name}, "
              f"{loop.comm.size} agent(s), {summary['backend']}: {loop.status} after {plural(last['round'], 'epoch')}, "
              f"test accuracy {last['test_accuracy']:.4f}, {summary['total_bytes']} bytes sent, "
              f"{summary['time_s']:.3f} s" + (f" -> {loop.out_dir}" if loop.out_dir else ""), flush=True)
