r"""m simulated workers as one stacked computation: the batched communicator (``sim.batched``).

Where the m workers' local computations can be stacked (convex shards of equal size and
networks of one architecture, `dane.problems.ProblemConfig.build_stacked`; or a method's own
stacked form, such as FedNL's clients on sparse, unequal shards,
`dane.algorithm.AlgorithmConfig.build_stacked`), the simulator runs the algorithm's ordinary
``step`` once, on tensors that carry a leading worker axis of length m, instead of m
threads (`dane.comm.threads`) each on its own shard.  The contract, for an algorithm that
declares ``batchable = True`` (`dane.algorithm.Algorithm`) and a stacked problem:

- *Stacked and shared tensors.*  A per-worker quantity (a local gradient, local metrics, a
  local solve's result) has shape (m, ...): row i is worker i's.  A quantity every worker
  holds alike (the iterate w_t, the global gradient g) has the per-worker shape (...)
  and broadcasts against stacked ones, so ``local_grad - eta * g`` is (m, d) whether
  ``local_grad`` is stacked or not.  Write reductions over the trailing axis
  (``dim=-1``, ``shape[-1]``, ``torch.cat(..., -1)``) and the same line serves both.
- *`BatchedCommunicator.allreduce_mean`* takes stacked tensors only (leading axis m; a
  tensor without it is a `TypeError`) and returns each one's mean over that axis,
  unstacked: exactly what every worker of the per-worker path receives.  The mean is
  the per-worker path's (`ThreadGroup`): the rows summed in rank order, divided by m.
  Bytes are counted per worker (numel / m of each tensor), so ``bytes_sent``, ``calls``
  and the cost model's time equal rank 0's in the per-worker path.
- *`BatchedCommunicator.broadcast(root=r)`* returns row r of each stacked tensor.
- *Per-rank values* (seeds, samplers): ``worker_ranks(comm)`` is ``range(m)`` on a
  batched communicator and ``(comm.rank,)`` on any other, and `per_worker` stacks
  ``fn(rank)`` over them (``per_worker(comm, lambda r: worker_seed(seed, r, STREAM))``);
  on a per-worker communicator it returns ``fn(comm.rank)`` unstacked, so an algorithm
  calls it the same way on every backend.
- ``comm.rank`` is 0 and ``comm.size`` is m: the batched run writes what rank 0 writes.

*Clock.*  A compute phase (from one collective to the next) is measured once, for the
stacked computation of all m workers, by the simulator's meter (thread CPU time; on a GPU
wall time with the queue drained, `dane.comm.threads.DeviceTurns`), and each worker is
charged an equal share, measured / m.  The collective's simulated time is then the
per-worker path's formula, max_{i in S}(slowdown_i * compute_i + delay_i) +
cost.allreduce_time(bytes, |S|) (a broadcast's ``cost.broadcast_time``), with the same seeded delays.  The equal share is the
departure from the per-worker path, which times each worker alone: shards of one size
cost alike, up to the noise of timing them one by one.  Under client sampling
(`next_participants`) the phase before a sampled collective holds the participants' local work
(and every worker's metrics), still shared by m: a sampled round's compute is charged below the
per-worker path's, which charges each participant its own.

*Ctrl-C.*  As on the per-worker path, a Ctrl-C stops the run at its next collective
(`dane.comm.threads.Interrupted`), where the driver writes its records and an ``interrupted``
summary (`run_batched` catches the SIGINT in the main thread; a second one interrupts at once).
"""
from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Sequence
from contextlib import contextmanager

import numpy as np
import torch

from .base import Communicator, one_hot_rows
from .cost import AlphaBeta, ParameterServerCost
from .meters import Meter, PhaseClock, SeededDraws, Stragglers, ThreadCPUTime
from .rendezvous import Interrupted


def worker_ranks(comm) -> range | tuple[int]:
    """The ranks whose values this communicator's tensors hold: all m on a batched one, else its own."""
    return range(comm.size) if isinstance(comm, BatchedCommunicator) else (comm.rank,)


def per_worker(comm, fn: Callable[[int], torch.Tensor]) -> torch.Tensor:
    """``fn(rank)`` for the ranks this communicator holds: stacked (m, ...) on a batched one, else ``fn(comm.rank)``."""
    if isinstance(comm, BatchedCommunicator):
        return torch.stack([torch.as_tensor(fn(rank)) for rank in range(comm.size)])
    return fn(comm.rank)


def stacked(comm) -> bool:
    """Whether ``comm``'s tensors carry the leading worker axis (a `BatchedCommunicator`)."""
    return isinstance(comm, BatchedCommunicator)


class BatchedGroup(SeededDraws):
    """The simulated clock of a batched run; the same totals (and seeded draws, `SeededDraws`) as a `ThreadGroup` (the
    summary reads them)."""

    path = "batched"

    def __init__(self, size: int, cost: AlphaBeta | ParameterServerCost | None = None,
                 stragglers: Stragglers | None = None, meter: Meter | None = None):
        self.size = size
        self.cost = cost or AlphaBeta()
        self.stragglers = stragglers or Stragglers()
        self.meter = meter or ThreadCPUTime()
        self._rng = np.random.default_rng(self.stragglers.seed)  # the per-worker path's delays, draw for draw
        self._factors = np.array([self.stragglers.factor(r) for r in range(size)])
        self.clock = 0.0
        self.compute_time = 0.0
        self.comm_time = 0.0
        self.interrupted = False

    @property
    def compute_clock(self) -> str:
        """What the stacked computation is read with (its share per worker: the reading / m)."""
        return self.meter.name

    def give_slot(self) -> None:
        """One computation for all m workers holds no slot (`dane.comm.threads.ThreadGroup.give_slot`)."""

    def take_slot(self) -> None:
        """As `give_slot`."""

    def phase(self, op: str, measured: float, nbytes: int, members: Sequence[int] | None) -> None:
        """Advance the clock by one collective: each worker's compute is ``measured`` / m (module docstring)."""
        delays = (self._rng.exponential(self.stragglers.delay_mean, self.size) if self.stragglers.delay_mean > 0
                  else np.zeros(self.size))
        ranks = np.arange(self.size) if members is None else np.asarray(members, dtype=np.int64)
        share = measured / self.size
        phase_compute = float(np.max(self._factors[ranks] * share + delays[ranks]))
        phase_comm = self.cost.allreduce_time(nbytes, len(ranks)) if op == "allreduce" else \
            self.cost.broadcast_time(nbytes, len(ranks)) if op == "broadcast" and nbytes else 0.0
        self.compute_time += phase_compute
        self.comm_time += phase_comm
        self.clock += phase_compute + phase_comm


class BatchedCommunicator(PhaseClock, Communicator):
    """All m simulated workers at once, their tensors stacked along a leading axis (module docstring).

    ``rank`` is 0 and ``size`` is m; ``bytes_sent`` and ``calls`` are rank 0's of the per-worker path.
    ``comm.compress`` is not supported (the simulator takes the per-worker path for it); a method that compresses
    its messages itself (DIANA, MARINA: ``precompressed``, `dane.comm.compression`) has them counted here as rank 0's
    (every worker's message of a kind has the same size).
    """

    local_work_path = "stacked"  # one local-work ledger with every worker's row (`dane.work`)

    def __init__(self, group: BatchedGroup):
        self.group = group
        self.rank = 0
        self.size = group.size
        self.traffic = group.cost  # rank 0 counts what the topology has it send (`Communicator.traffic`)
        self._participants: list[int] | None = None
        super().__init__()

    # ------------------------------------------------------------------ the clock (`PhaseClock`: all m workers' work)
    def _phase(self, op: str, nbytes: int = 0) -> None:
        if self.group.interrupted:
            raise Interrupted
        measured = self.end()
        members, self._participants = self._participants, None
        self.group.phase(op, measured, nbytes, members)
        self.begin()

    def next_participants(self, members: list[int]) -> None:
        self._participants = sorted(int(r) for r in members)

    def elapsed(self) -> float:
        """Simulated parallel time: the clock plus rank 0's share of the compute since the last collective."""
        pending = self.phase_compute()
        return self.group.clock + self.group.stragglers.factor(0) * pending / self.size

    # ------------------------------------------------------------------ the collectives
    def _check(self, tensors) -> list[torch.Tensor]:
        if not isinstance(tensors, (list, tuple)) or not tensors:
            raise TypeError("allreduce_mean takes a non-empty list of tensors")
        for t in tensors:
            if t.dim() == 0 or t.shape[0] != self.size:
                raise TypeError(f"a batched communicator takes stacked tensors (leading axis of the {self.size} "
                                f"workers), got shape {tuple(t.shape)}: stack a per-worker value with "
                                "dane.comm.batched.per_worker")
        return list(tensors)

    def allreduce_mean(self, tensors: list[torch.Tensor], kinds: Sequence[str | None] = ()) -> list[torch.Tensor]:
        """Each stacked tensor's mean over the workers (unstacked); bytes and time as the per-worker path's."""
        tensors = self._check(tensors)
        if self.compression is not None:  # rank 0's row counted (class docstring); nothing is compressed here
            if not self.compression.precompressed:
                raise TypeError("the batched communicator counts messages a method compressed itself only")
            _, nbytes = self.compression.encode([t[0] for t in tensors], kinds)
        else:
            nbytes = sum(t.numel() // self.size * t.element_size() for t in tensors)
        self.count_allreduce(nbytes)
        self._phase("allreduce", nbytes)
        # rows summed in rank order then divided by m, as `ThreadGroup._reduce` does
        return [t.sum(0) / self.size for t in tensors]

    def gather(self, values: torch.Tensor, rides=()) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """`Communicator.gather` of the stacked (m, k) ``values``: they are the rows (the one-hot blocks' mean times m,
        bit for bit), counted and priced as rank 0's block and ``rides`` (stacked), as the per-worker path."""
        rides = self._check(rides) if rides else []
        self._check([values])
        if self.compression is not None:  # rank 0's block for the count, as `allreduce_mean` counts rank 0's row
            if not self.compression.precompressed:
                raise TypeError("the batched communicator counts messages a method compressed itself only")
            block = values.new_zeros(values.shape)
            block[0] = values[0]
            _, nbytes = self.compression.encode([block, *(t[0] for t in rides)], ())
        else:
            nbytes = values.numel() * values.element_size() + sum(t.numel() // self.size * t.element_size()
                                                                   for t in rides)
        self.count_allreduce(nbytes)
        self._phase("allreduce", nbytes)
        return one_hot_rows(values, self.size), [t.sum(0) / self.size for t in rides]

    def broadcast(self, tensors: list[torch.Tensor], root: int = 0) -> list[torch.Tensor]:
        """Row ``root`` of each stacked tensor; rank 0's bytes as the per-worker path counts them."""
        tensors = self._check(tensors)
        nbytes = sum(t.numel() // self.size * t.element_size() for t in tensors)  # the root's payload
        if root == 0:
            self.bytes_sent += self.traffic.broadcast_sent(nbytes, self.size)
        self.calls += 1
        self._phase("broadcast", nbytes)
        return [t[root].clone() for t in tensors]

    def broadcast_object(self, text: str, root: int = 0) -> str:
        return text

    def barrier(self) -> None:
        """A collective phase; off the clock (`PhaseClock.off_the_clock`) nothing: one process waits for nobody, and
        the clock does not move (the per-worker path's `dane.comm.threads.ThreadCommunicator.barrier`)."""
        if self.computing:
            self._phase("barrier")

    def _allreduce_mean(self, tensors):  # pragma: no cover - allreduce_mean is overridden whole
        raise NotImplementedError

    def _broadcast(self, tensors, root):  # pragma: no cover - broadcast is overridden whole
        raise NotImplementedError

    def summary_entries(self) -> dict:
        """The summary says which path the simulator took (and, for a method that counts its own compressed
        messages, its compressor, as `Communicator.summary_entries`)."""
        return {"simulator_path": "batched", **super().summary_entries()}


def run_batched(group: BatchedGroup, fn: Callable[[BatchedCommunicator], object]) -> object:
    """Run ``fn(comm)`` once with the group's batched communicator, torch on one thread (one simulated core
    a worker, as the per-worker path), the compute metered from the start."""
    torch.set_num_threads(1)
    comm = BatchedCommunicator(group)
    comm.begin()
    try:
        with ctrl_c_stops(group):
            return fn(comm)
    finally:
        comm.end()


@contextmanager
def ctrl_c_stops(group: BatchedGroup):
    """A first Ctrl-C (SIGINT) sets ``group.interrupted``, which ends the run at its next collective
    (`BatchedCommunicator`); a second raises `KeyboardInterrupt` at once.  Only the main thread can set a
    signal handler; elsewhere (and under a handler set outside Python) a Ctrl-C interrupts as it comes."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        yield
        return

    def stop(signum, frame):
        if group.interrupted:
            raise KeyboardInterrupt
        group.interrupted = True

    previous = signal.signal(signal.SIGINT, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
