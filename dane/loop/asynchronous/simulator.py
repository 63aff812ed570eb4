r"""The asynchronous simulator: m workers and one server in this process, on a modelled clock.

``workers=m`` under plain python with ``sim.topology=ps`` and ``comm.staleness=s > 0``
(the rule for s, the algorithm's two halves and the records: `dane.loop.asynchronous`).

Time is modelled, so that the update order depends only on the seed and the straggler
model.  Step k of worker i takes

.. math:: c_{i,k} = \mathrm{step\_time} \cdot \mathrm{slowdown}_i + \mathrm{Exp}(\mathrm{delay\_mean}),

its delays drawn from a generator seeded by (``sim.seed``, i).  Every step is measured as
well, by the synchronous simulator's meter (`dane.comm.threads.meter_for`: the thread's CPU
time, or on a GPU the wall time with its queues drained), but only reported
(``measured_compute_s``).  The server handles one message at a time, as in the serial
part of `ParameterServerCost`:

- a push of n bytes takes α + n/(kβ) to receive and n/(kγ) to apply;
- a pull reply takes α + n/(kβ) to send.

So m pushes and pulls that arrive together take exactly
``ParameterServerCost.allreduce_time(n, m)``.  Pushes are served in order of arrival,
ties broken by rank.  After a push, the pushing worker's reply is sent first, then the
replies that push released, by rank.

Record t is timed at the simulated moment the server applied round t's last update.
The metrics of an iterate are those its synchronous evaluation would log: each worker's
``evaluate`` runs at the server's parameters in lockstep, and this costs no simulated time.
"""
from __future__ import annotations

import heapq
import time
from typing import Protocol, Sequence

import numpy as np
import torch

from ...algorithm import Rounds
from ...comm import ParameterServerCost, Stragglers, ThreadGroup
from ...comm.meters import Meter, ThreadCPUTime, meter_for
from ...errors import ConfigError
from ..driver import Loop, drive
from ..reference import attach_all
from ..callbacks import worker_callbacks
from ..worker import build_problem
from .updates import KeepUpdates, Update, log_stats, round_stats

class AsyncServer(Protocol):
    w: torch.Tensor

    def apply(self, update: list[torch.Tensor], rank: int) -> None: ...


class AsyncAlgorithm(Protocol):
    """What an algorithm offers an asynchronous run (sync_sgd and local_sgd do); its config adds
    ``async_server(w0, sizes)``, the server's half."""

    updates_per_round: int

    def worker_update(self, w: torch.Tensor) -> list[torch.Tensor]: ...

    def evaluate(self) -> dict[str, float]: ...


class EventSimulator:
    """The event loop: m workers, one server, a simulated clock; `advance` applies the next update."""

    def __init__(self, workers: Sequence[AsyncAlgorithm], server: AsyncServer, *, staleness: float,
                 cost: ParameterServerCost, stragglers: Stragglers, step_time: float, meter: Meter | None = None):
        if not staleness > 0:
            raise ConfigError(f"comm.staleness must be > 0 in the asynchronous simulator, got {staleness}")
        self.workers, self.server, self.staleness = list(workers), server, staleness
        self.cost, self.stragglers, self.step_time = cost, stragglers, step_time
        self.meter = meter or ThreadCPUTime()
        m = self.size = len(self.workers)
        self.param_bytes = server.w.numel() * server.w.element_size()
        self.version = 0
        self.time = 0.0           # when the current version was applied
        self.server_free = 0.0    # when the server's link is next free
        self.server_busy = 0.0
        self.clocks = [0] * m
        self.pulled = [0] * m
        self.lead = [0] * m
        self.pending: list[list[torch.Tensor] | None] = [None] * m
        self.blocked_since: dict[int, float] = {}
        self.ssp_wait = [0.0] * m
        self.measured = [0.0] * m
        self.modelled = [0.0] * m
        self.bytes = [0] * m
        self.rngs = [np.random.default_rng([stragglers.seed, i]) for i in range(m)]
        self.log: list[Update] = []
        self._arrivals: list[tuple[float, int]] = []
        for i in range(m):
            self._start(i, 0.0)  # every worker holds w_0 already, as in a synchronous run

    def _start(self, i: int, t: float) -> None:
        """Worker i has pulled the current version at time t: it computes its step on it."""
        self.pulled[i], self.lead[i] = self.version, self.clocks[i] - min(self.clocks)
        w = self.server.w.detach().clone()
        mark = self.meter.start()
        try:
            self.pending[i] = self.workers[i].worker_update(w)
            self.measured[i] += self.meter.read(mark)
        finally:  # a GPU turn is given back even when the step fails
            self.meter.stop()
        delay = self.rngs[i].exponential(self.stragglers.delay_mean) if self.stragglers.delay_mean > 0 else 0.0
        compute = self.step_time * self.stragglers.factor(i) + float(delay)
        self.modelled[i] += compute
        heapq.heappush(self._arrivals, (t + compute, i))

    def _link(self, nbytes: int) -> float:
        """One message of ``nbytes`` on the server's link: α + n/(kβ) (each of k servers holds 1/k)."""
        return self.cost.alpha + nbytes / (self.cost.servers * self.cost.beta)

    def advance(self) -> Update:
        arrival, i = heapq.heappop(self._arrivals)
        update, self.pending[i] = self.pending[i], None
        nbytes = sum(t.numel() * t.element_size() for t in update)
        start = max(arrival, self.server_free)
        applied = start + self._link(nbytes) + nbytes / (self.cost.servers * self.cost.gamma)
        self.server.apply(update, i)
        self.clocks[i] += 1
        record = Update(version=self.version + 1, rank=i, clock=self.clocks[i], pulled=self.pulled[i],
                        staleness=self.version - self.pulled[i], clock_lead=self.lead[i], time=applied)
        self.version, self.time = self.version + 1, applied
        self.server_busy += applied - start
        self.server_free = applied
        self.bytes[i] += nbytes
        self.log.append(record)
        self.blocked_since[i] = applied
        self._release(first=i)
        return record

    def _release(self, first: int) -> None:
        """Send the pull replies SSP allows now: the pushing worker's first, then the others by rank."""
        slowest = min(self.clocks)
        for j in [first] + sorted(set(self.blocked_since) - {first}):
            if j in self.blocked_since and self.clocks[j] - slowest <= self.staleness:
                since = self.blocked_since.pop(j)
                start = max(self.server_free, since)
                if j != first:
                    self.ssp_wait[j] += start - since
                done = start + self._link(self.param_bytes)
                self.server_busy += done - start
                self.server_free = done
                self._start(j, done)

    def stats(self) -> dict:
        """What summary.json records: staleness histograms and per-worker counts and times."""
        return {**log_stats(self.log, self.staleness, self.size), "ssp_wait_s": self.ssp_wait,
                "modelled_compute_s": self.modelled, "measured_compute_s": self.measured,
                "server_busy_s": self.server_busy, "step_time": self.step_time}


class ServerView:
    """The simulated run as the round loop (`dane.loop.driver.drive`) sees one worker's communicator.

    ``bytes_sent`` and ``calls`` are the workers' means of their pushes, after what the set-up's collectives
    counted (``setup``: a worker's bytes and calls before the first update, as a synchronous run's round 0 counts
    them: local_sgd's lr=null); ``elapsed`` is the simulated time of the server's current version;
    ``allreduce_mean`` returns its input, because the simulator already hands over global values (see `AllWorkers`).
    """

    rank = 0

    def __init__(self, sim: EventSimulator, setup: tuple[int, int] = (0, 0)):
        self.sim, self.size, self.setup = sim, sim.size, setup
        self.group = _GroupTimes(sim)

    @property
    def bytes_sent(self) -> int:
        return self.setup[0] + sum(self.sim.bytes) // self.size

    @property
    def calls(self) -> int:
        return self.setup[1] + len(self.sim.log) // self.size

    def elapsed(self) -> float:
        return self.sim.time

    def allreduce_mean(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        return [t.clone() for t in tensors]

    def summary_entries(self) -> dict:
        return {"asynchronous": self.sim.stats()}


class _GroupTimes:
    """The simulated totals that `dane.loop.callbacks.SimulatedCost` reads from a `ThreadGroup` for the summary."""

    compute_clock = "sim_step_time"  # a step's compute is modelled (``sim.step_time``), not measured

    def __init__(self, sim: EventSimulator):
        self.sim, self.cost = sim, sim.cost

    @property
    def clock(self) -> float:
        return self.sim.time

    @property
    def compute_time(self) -> float:
        return max(self.sim.modelled)

    @property
    def comm_time(self) -> float:
        return self.sim.server_busy


class AllWorkers:
    """Worker 0's problem as the driver sees it, except that ``confusion_matrix`` is already the global one."""

    def __init__(self, problems: Sequence):
        self._problems = list(problems)

    def __getattr__(self, name: str):
        value = getattr(self._problems[0], name)  # AttributeError when absent: hasattr() stays truthful
        if name == "confusion_matrix" and value is not None:
            return lambda w: torch.stack([p.confusion_matrix(w) for p in self._problems]).sum(0) / len(self._problems)
        return value


class AsyncRun(Rounds):
    """The asynchronous run behind the `Algorithm` interface that `dane.loop.runner.run` drives.

    ``step`` evaluates the server's iterate and then applies one round of updates.
    """

    def __init__(self, workers: Sequence[AsyncAlgorithm], group: ThreadGroup, sim: EventSimulator):
        self.workers, self.group, self.sim = list(workers), group, sim
        self.comm = ServerView(sim, (self.workers[0].comm.bytes_sent, self.workers[0].comm.calls))  # the set-up's
        self.updates_per_round = sim.size * workers[0].updates_per_round

    @property
    def iterate(self) -> torch.Tensor:
        return self.sim.server.w.detach()

    @property
    def defaults(self) -> tuple[dict, ...] | None:
        """Worker 0's resolved defaults (`dane.algorithm.Rounds.defaults`), for the run's first lines and summary."""
        return self.workers[0].defaults

    @property
    def adaptations(self) -> tuple:
        return getattr(self.workers[0], "adaptations", ())

    def evaluate(self) -> dict[str, float]:
        """Every worker's synchronous ``evaluate`` at the server's parameters, in lockstep; untimed."""
        w = self.iterate.clone()
        for algo in self.workers:
            with torch.no_grad():
                algo.w.copy_(w)
        return self.group.run(lambda comm: self.workers[comm.rank].evaluate())[0]

    def step(self) -> dict[str, float]:
        metrics = self.evaluate()
        return {**metrics, **round_stats([self.sim.advance() for _ in range(self.updates_per_round)])}

    def state_dict(self) -> dict:
        raise ConfigError("the asynchronous simulator does not checkpoint yet; set checkpoint_every=0")


def build_workers(spec, problems: Sequence) -> tuple[list, ThreadGroup]:
    """Each worker's algorithm object, built in lockstep (local_sgd's lr=null takes one allreduce)."""
    group = ThreadGroup(len(problems), spec.comm.cost, spec.comm.stragglers)
    workers = group.run(lambda comm: spec.algorithm.build(problems[comm.rank], comm))
    for algo in workers:
        if not algo.asynchronous:
            raise ConfigError(f"algorithm={spec.algorithm.name} has no asynchronous form; set comm.staleness=0")
    return workers, group


def run_async(spec, out_dir: str | None, collect: dict | None) -> dict:
    """The asynchronous simulator's run kind: ``spec`` simulated event by event, through the run loop
    (`dane.loop.driver.drive`) with an algorithm worker's callbacks; ``out_dir`` as a synchronous run's.

    Besides the usual records and summary, ``out_dir`` gets ``updates.jsonl``, one line per server update.
    """
    net = spec.comm
    if not isinstance(net.cost, ParameterServerCost):
        raise ConfigError(f"comm.staleness={net.staleness} simulates a parameter server; add sim.topology=ps")
    torch.set_num_threads(1)  # one core per simulated worker, and one order of floating-point sums
    problems, setups = zip(*(build_problem(spec, rank, net.workers, time.thread_time) for rank in range(net.workers)))
    attach_all(spec.problem, problems)
    workers, group = build_workers(spec, problems)
    server = spec.algorithm.async_server(workers[0].iterate.detach().clone(),
                                         [float(algo.problem.n_local) for algo in workers])
    sim = EventSimulator(workers, server, staleness=net.staleness, cost=net.cost, stragglers=net.stragglers,
                         step_time=net.step_time, meter=meter_for(p.device for p in problems))
    run = AsyncRun(workers, group, sim)
    loop = Loop(spec, run, run.comm, out_dir, AllWorkers(problems), setup_s=max(setups),
                checkpoint_every=spec.control.checkpoint_every)
    return drive(loop, worker_callbacks(spec, loop, collect, end=(KeepUpdates(sim.log, collect),)))
