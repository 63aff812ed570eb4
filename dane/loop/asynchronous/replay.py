"""Real asynchronous and stale-synchronous runs (``torchrun ... comm=ps comm.staleness=s``), one worker's side.

The messages are `dane.loop.asynchronous.protocol`'s.  This module turns their result, the
iterate kept at every round boundary and the server's update log, into the records of an
ordinary run.  Each kept iterate is evaluated by every worker in lockstep through the
servers (`Replay`), so rounds.jsonl, updates.jsonl and summary.json have the simulator's
form (`dane.loop.asynchronous.simulator`).  ``time`` is the server's wall clock, counted from
the start of the asynchronous phase; the update order is whatever the machines produce.
"""
from __future__ import annotations

import torch

from ...algorithm import Rounds
from ..callbacks import worker_callbacks
from ..driver import Loop, drive
from .protocol import work
from .updates import LOG_FIELDS, KeepUpdates, Update, log_stats, round_stats


class Replay(Rounds):
    """A finished asynchronous ``comm=ps`` run behind the `Algorithm` interface: its kept iterates, one per round,
    each evaluated by every worker in lockstep (the algorithm's own ``evaluate``, through the servers)."""

    def __init__(self, algo, comm, results: dict, log: list[Update], updates_per_round: int, staleness: float):
        self.algo, self.results, self.log, self.staleness, self.t = algo, results, log, staleness, 0
        self.updates_per_round = comm.size * updates_per_round
        self.setup = comm.bytes_sent, comm.calls  # the set-up's collectives (local_sgd's lr=null), before the pushes
        self.comm = ReplayView(comm, self)

    @property
    def iterate(self) -> torch.Tensor:
        return self.results["iterates"][self.t].view_as(self.algo.iterate)

    @property
    def defaults(self) -> tuple[dict, ...] | None:
        """This worker's resolved defaults (`dane.algorithm.Rounds.defaults`), for the run's first lines and summary."""
        return self.algo.defaults

    @property
    def adaptations(self) -> tuple:
        return getattr(self.algo, "adaptations", ())

    def evaluate(self) -> dict[str, float]:
        with torch.no_grad():
            self.algo.w.copy_(self.iterate)
        return self.algo.evaluate()

    def step(self) -> dict[str, float]:
        metrics = self.evaluate()
        self.t += 1
        per = self.updates_per_round
        return {**metrics, **round_stats(self.log[(self.t - 1) * per:self.t * per])}


class ReplayView:
    """The worker's `PSCommunicator`, except for the costs of the asynchronous phase at the replayed iterate."""

    def __init__(self, comm, replay: Replay):
        self._comm, self._replay = comm, replay

    def __getattr__(self, name: str):
        return getattr(self._comm, name)

    @property
    def bytes_sent(self) -> int:  # the set-up's, then the workers' mean: every push carries the same number of bytes
        replay = self._replay
        per_push = replay.algo.iterate.numel() * replay.algo.iterate.element_size()
        return replay.setup[0] + replay.t * replay.updates_per_round * per_push // self._comm.size

    @property
    def calls(self) -> int:
        return self._replay.setup[1] + self._replay.t * self._replay.updates_per_round // self._comm.size

    def elapsed(self) -> float:
        return self._replay.results["times"][self._replay.t]

    def summary_entries(self) -> dict:
        replay = self._replay
        return {**self._comm.summary_entries(),
                "asynchronous": log_stats(replay.log, replay.staleness, self._comm.size)}


def run_async_ps(spec, comm, problem, out_dir: str | None, start: float, setup_s: float, collect: dict | None) -> dict:
    """A worker of a real asynchronous run (`dane.loop.asynchronous.protocol`), then its records (the run loop,
    `dane.loop.driver.drive`, over the replayed iterates).

    The algorithm is built while the servers still answer the synchronous protocol (local_sgd's
    lr=null takes one allreduce); the workers then end that loop, run the asynchronous phase,
    and evaluate the kept iterates through the servers' synchronous loop again.
    """
    algo = spec.algorithm.build(problem, comm)
    comm.pause_servers()  # the asynchronous phase runs on the protocol's own tags
    slowdown = spec.comm.worker_slowdown[comm.rank % len(spec.comm.worker_slowdown)]
    results = work(comm, algo, algo.updates_per_round, slowdown)
    log = [Update(**{k: (v if k == "time" else int(v)) for k, v in zip(LOG_FIELDS, row)}) for row in results["log"]]
    replay = Replay(algo, comm, results, log, algo.updates_per_round, spec.comm.staleness)
    loop = Loop(spec, replay, replay.comm, out_dir, problem, start=start, setup_s=setup_s,
                checkpoint_every=spec.control.checkpoint_every)
    return drive(loop, worker_callbacks(spec, loop, collect, end=(KeepUpdates(log, collect),)))
