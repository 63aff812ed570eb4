"""`RunSpec`: everything a run needs, checked before any process group starts.

The experiments' config code (`experiments.config.run_spec`) and the Python API
(`dane.api.fit`) build one; `dane.launch.execute` runs it; `dane.worker` reads it in
every worker.  It lives below both so that neither imports the other.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from .algorithm import Algorithm
from .comm import AlphaBeta, Communicator, Stragglers
from .comm.horovod import HorovodOptions
from .problems import Problem
from .runner import StopRule

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
