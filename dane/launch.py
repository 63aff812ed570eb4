"""From validated configs to a finished run, on any backend or in the simulator.

`RunSpec` is everything a run needs, checked before any process group starts.
`execute` starts the backend (or m simulated worker threads), runs the same worker
function on each, and lets rank 0 write the results.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from .algorithm import Algorithm
from .comm import AlphaBeta, Communicator, Stragglers, ThreadGroup, make_communicator
from .errors import DivergenceError
from .problems import Problem
from .results import RunWriter
from .runner import RoundTable, StopRule, run


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

    Small allreduces are latency-bound on these machines; a short cycle time roughly
    halves the latency of a 4 KB allreduce (DESIGN.md section 5).
    """

    cycle_time_ms: float = 0.1

    def apply(self) -> None:
        os.environ.setdefault("HOROVOD_CYCLE_TIME", str(self.cycle_time_ms))


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
    config_text: str = ""
    print_every: int = 1
    quiet: bool = False

    @property
    def simulated(self) -> bool:
        return self.backend == "local" and self.workers > 1


def execute(spec: RunSpec, out_dir: str | None) -> dict:
    """Run ``spec``; rank 0 writes ``out_dir``.  Returns the summary (on every rank)."""
    torch.manual_seed(spec.seed)
    if spec.simulated:
        problems = [spec.problem.build(rank, spec.workers, spec.dtype) for rank in range(spec.workers)]
        group = ThreadGroup(spec.workers, spec.cost, spec.stragglers)
        start = time.perf_counter()
        summaries = group.run(lambda comm: _worker(spec, comm, problems[comm.rank], out_dir, start))
        summary = summaries[0]
    else:
        if spec.backend == "horovod":
            spec.horovod.apply()
        comm = make_communicator(spec.backend, torch_backend=spec.torch_backend)
        try:
            out_dir = comm.broadcast_object(out_dir or "", root=0) or None  # every rank agrees on rank 0's directory
            problem = spec.problem.build(comm.rank, comm.size, spec.dtype)
            comm.barrier()
            comm.reset_clock()
            summary = _worker(spec, comm, problem, out_dir, time.perf_counter())
        finally:
            comm.shutdown()
    if summary["status"] == "diverged":
        raise DivergenceError(
            f"{summary['algorithm']} diverged at round {summary['rounds']} (objective {summary['final_objective']:.3g}); "
            f"results so far are in {out_dir}; try algorithm.safeguard=true or a larger algorithm.mu"
        )
    return summary


def _worker(spec: RunSpec, comm: Communicator, problem: Problem, out_dir: str | None, start: float) -> dict:
    algo = spec.algorithm.build(problem, comm)
    writer = RunWriter(out_dir) if comm.rank == 0 and out_dir else None
    table = RoundTable(spec.print_every) if comm.rank == 0 and not spec.quiet else None

    def on_round(record: dict) -> None:
        if writer is not None:
            writer.write_round(record)
        if table is not None:
            table(record)

    if writer is not None and spec.config_text:
        writer.write_text("config.yaml", spec.config_text)
    try:
        records, status = run(algo, spec.stop, on_round)
    finally:
        if writer is not None:
            writer.close()
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
    }
    if spec.simulated:
        group = comm.group  # type: ignore[attr-defined]
        summary.update(simulated_time_s=group.clock, simulated_compute_s=group.compute_time,
                       simulated_comm_s=group.comm_time, alpha=group.cost.alpha, beta=group.cost.beta)
    if writer is not None:
        writer.write_summary(summary)
    if table is not None:
        final = summary["final_suboptimality"]
        tail = f"final suboptimality {final:.3e}" if final is not None else f"final objective {summary['final_objective']:.8e}"
        print(f"{summary['algorithm']} on {summary['problem']}, {comm.size} worker(s), {summary['backend']}: "
              f"{status} after {summary['rounds']} rounds, {tail}, {summary['total_bytes']} bytes sent, "
              f"{summary['time_s']:.3f} s" + (f" -> {out_dir}" if out_dir else ""), flush=True)
    return summary
