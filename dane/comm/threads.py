"""m simulated workers in one process, one thread each.

Every simulated worker runs the ordinary algorithm code in its own thread with its own
`ThreadCommunicator`; `allreduce_mean` is a barrier plus a mean taken in rank order.
Between two collectives each worker's compute is read by the group's `Meter`: on the CPU
its thread's CPU time (`ThreadCPUTime`; torch is held to one intra-op thread), on a GPU
the wall time of its turn on the device (`DeviceTurns`).  The simulated clock of a
collective phase is

    max_{i in S}(slowdown_i * compute_i + delay_i) + cost.allreduce_time(bytes, |S|)

(a broadcast's, ``cost.broadcast_time(bytes, |S|)``, at the root's payload) with the cost of a ring (`AlphaBeta`) or of parameter servers (`ParameterServerCost`):
the parallel wall time the m workers would have taken on m machines.  S is every worker,
except for a collective that client sampling gives to the sampled clients only
(`Communicator.next_participants`, `dane.sampling`): the others' compute before it (the
round's metrics, not the method's work) and their place in the ring are not charged.

*Sampled rounds.*  With a `dane.comm.roster.Roster` (a federated method that declares its client state,
`dane.loop.parking`) a worker outside S_t parks at the round's draw and its thread ends (a draw that takes it
again starts another, `dane.comm.roster`): a round's collectives are among S_t and rank 0
(`ThreadGroup.set_parties`), a round runs their threads only, and the reduction fills in the parked workers'
messages in their places (zeros, and the metrics of their shards at w_t), so the mean, the records and the
clock are those of a round that every worker entered.  The final evaluation and the collectives after the rounds
wake nobody: they are among the workers awake, each parked worker's message is filled in from its shard, and
each is charged the compute its fill took, as the worker that computed it would have been.

A Ctrl-C while `ThreadGroup.run` waits for its workers stops them at their next
collective (`Interrupted`), so the run ends within a round and its workers can report.

*Thousands of workers.*  A collective is one pass through a `Rendezvous` (a barrier whose
waiters are released one by one, each handing the gate to the next, so a collective
costs O(m) wake-ups; `threading.Barrier` wakes all m at once on one condition, and they
then fight over its lock and the GIL, which grows faster than m), and the reduction
itself is O(m d).  Worker threads get `WORKER_STACK_BYTES` of stack address space instead
of the system's default.  ``make bench`` (scripts/bench_load.py, ``load``; scripts/bench_federated_scale.py)
measures time per round and peak memory at large m.

The meters and the compute phases live in `dane.comm.meters`, the barrier, the threads' stack and the Ctrl-C
handling in `dane.comm.rendezvous` (their names are still imported from here too), and one run's threads in
`dane.comm.worker_threads`.
"""
from __future__ import annotations

import contextlib
import os
import threading
from typing import Callable

import numpy as np
import torch

from .base import Communicator, one_hot_rows
from .cost import AlphaBeta, ParameterServerCost
from .meters import DeviceTurns, Meter, PhaseClock, SeededDraws, Stragglers, ThreadCPUTime, meter_for
from .rendezvous import WORKER_STACK_BYTES, Interrupted, Rendezvous, ctrl_c_held, thread_limit
from .roster import Parked
from .worker_threads import WorkerThreads

#: the names moved to `dane.comm.meters` and `dane.comm.rendezvous`, still imported from here
__all__ = ["DeviceTurns", "Interrupted", "Meter", "PhaseClock", "Rendezvous", "Stragglers", "ThreadCPUTime",
           "ThreadCommunicator", "ThreadGroup", "WORKER_STACK_BYTES", "ctrl_c_held", "meter_for", "thread_limit"]


class ThreadGroup(SeededDraws):
    """Shared state of m simulated workers: the barrier, the mailbox and the simulated clock (its seeded draws:
    `SeededDraws`).

    At most ``slots`` workers (default: the machine's cores) compute at once: a worker holds a slot from a
    collective to its next and gives it back while it waits there, so the others sleep until one is free.
    Without the slots every worker a collective releases is runnable at once, and m of them contend for the
    GIL, which each torch call drops and takes back: at m = 1,000 on two idle cores most of a round went to
    the kernel's futex wake-ups, not to the workers' work (``make bench`` section ``batched_workers``).  A
    wait for a slot is not CPU time: what the meter reads, and the simulated clock, do not change.  The slot
    belongs to the thread, not to its communicator (an algorithm built in one `run` may call collectives on
    that run's communicator in a later one: the asynchronous simulator's evaluations).
    """

    def __init__(self, size: int, cost: AlphaBeta | ParameterServerCost | None = None,
                 stragglers: Stragglers | None = None, meter: Meter | None = None, slots: int | None = None):
        self.size = size
        self.slots = slots or os.cpu_count() or 1
        self._slots = threading.BoundedSemaphore(self.slots)
        self._holding = threading.local()  # whether this thread holds a slot
        self.cost = cost or AlphaBeta()
        self.stragglers = stragglers or Stragglers()
        self.meter = meter or ThreadCPUTime()
        self._rng = np.random.default_rng(self.stragglers.seed)
        self._barrier = Rendezvous(size, action=self._reduce)
        self._inbox: list = [None] * size
        self._compute = [0.0] * size
        self._result = None
        self._op = None
        self.clock = 0.0
        self.interrupted = False  # set by a Ctrl-C in `run`: every worker stops at its next collective
        self.compute_time = 0.0  # sum over phases of the slowest worker's compute
        self.comm_time = 0.0
        self.work_board = None  # `dane.work.Board`, made by the first worker's rounds
        self.roster = None  # `dane.comm.roster.Roster`: sampled rounds run their participants only (`dane.loop.parking`)

    @property
    def compute_clock(self) -> str:
        """What a worker's compute is read with (the summary's ``simulated_compute_clock``)."""
        return self.meter.name

    def communicators(self) -> list["ThreadCommunicator"]:
        return [ThreadCommunicator(self, rank) for rank in range(self.size)]

    def _reduce(self) -> None:
        """Runs once, in the last thread to arrive, while the others wait at the barrier."""
        op, nbytes, root, members, down, absent = self._op
        if op == "wait":  # a barrier off the clock (`ThreadCommunicator.barrier`): nothing to reduce, nothing charged
            self._result = None
            return
        if self._barrier.parties < self.size:  # the parked workers' messages, in their places (`dane.comm.roster`)
            self._fill(members, absent)
        if self.work_board is not None:  # the workers' local work as they left it, while none moves (`dane.work`)
            self.work_board.capture()
        delays = self._rng.exponential(self.stragglers.delay_mean, self.size) if self.stragglers.delay_mean > 0 else np.zeros(self.size)
        ranks = range(self.size) if members is None else members
        phase_compute = max(self.stragglers.factor(r) * self._compute[r] + delays[r] for r in ranks)
        phase_comm = self.cost.allreduce_time(nbytes, len(ranks), down) if op in ("allreduce", "gather") else \
            self.cost.broadcast_time(nbytes, len(ranks)) if op == "broadcast" and nbytes else 0.0
        self.compute_time += phase_compute
        self.comm_time += phase_comm
        self.clock += phase_compute + phase_comm
        if op == "allreduce":
            columns = zip(*self._inbox)
            self._result = [torch.stack(list(column)).sum(0) / self.size for column in columns]
        elif op == "gather":  # `Communicator.gather`: the rows, and the rides' means
            rows, *columns = zip(*self._inbox)
            self._result = [one_hot_rows(torch.stack(list(rows)), self.size),
                            *(torch.stack(list(column)).sum(0) / self.size for column in columns)]
        elif op == "broadcast":
            self._result = [t.clone() for t in self._inbox[root]]  # the root may change its own in place once through
        else:
            self._result = None

    def _fill(self, members: list[int] | None, absent: Callable | None) -> None:
        """Put each parked worker's message, ``absent(its shard)``, in its place.  In a collective of every worker
        (``members`` None) each is charged as a worker that computed it: its compute is the fill's, read by the
        meter.  A message must have the shapes of rank 0's, or the collective is not one they all could enter."""
        if absent is None:
            raise RuntimeError(f"a collective among {self._barrier.parties} of {self.size} workers without the "
                               "parked workers' messages: a sampled round's collectives must all be sampled means, "
                               "and a collective of every worker must say what a parked one sends")
        shapes = [t.shape for t in self._inbox[0] or ()]
        for rank in self.roster.absent(members):
            mark = self.meter.start() if members is None else None
            message = absent(self.roster.problems[rank])
            if mark is not None:
                self._compute[rank] = self.meter.read(mark)
                self.meter.stop()
            if [t.shape for t in message] != shapes:
                raise RuntimeError(f"worker {rank}'s filled-in message has shapes {[tuple(t.shape) for t in message]}, "
                                   f"not rank 0's {[tuple(t) for t in shapes]}: its collective cannot be filled in")
            self._inbox[rank] = message

    def take_slot(self) -> None:
        """This worker computes from now on: wait for a slot unless it holds one."""
        if not getattr(self._holding, "slot", False):
            self._slots.acquire()
            self._holding.slot = True

    def give_slot(self) -> None:
        """This worker waits (at a collective, or is done): its slot, if it holds one, goes to another."""
        if getattr(self._holding, "slot", False):
            self._holding.slot = False
            self._slots.release()

    @property
    def broken(self) -> bool:
        """Whether a worker failed or the group was stopped: a wait for the others outside a collective gives up."""
        return self.interrupted or self._barrier.broken

    def stop(self) -> None:
        """Make every worker raise `Interrupted` at its next collective (or in the one it waits in)."""
        self.interrupted = True
        self.abort()

    def abort(self) -> None:
        """Break the collectives for good; the parked workers (`dane.comm.roster`) are done."""
        self._barrier.abort()
        if self.roster is not None:
            self.roster.close()

    def set_parties(self, present: int) -> None:
        """The next collectives are among ``present`` workers (a sampled round's clients and rank 0; all m until the
        first draw); each worker that enters them sets it first, all to the same number, after the previous
        collective ended."""
        self._barrier.parties = present

    def run(self, fn: Callable[["ThreadCommunicator"], object]) -> list[object]:
        """Run ``fn(comm)`` in m threads (`dane.comm.worker_threads.WorkerThreads`); return the m results, re-raising
        the first failure.

        A worker that parks (`dane.comm.roster.Parked`) ends its thread; the roster starts another for it when a
        draw wakes it (``roster.spawn``), which goes on from there, and its result is that thread's.

        A `KeyboardInterrupt` while waiting (or while the threads start: `ctrl_c_held`)
        stops the workers (`stop`) and waits for them:
        a worker that handles `Interrupted` returns its result, one that does not
        returns None; ``interrupted`` is then set for the caller to act on.
        """
        torch.set_num_threads(1)
        workers = WorkerThreads(self, fn)
        first = workers.comms if self.roster is None else workers.hand_to(self.roster)
        try:
            workers.start(first)
            workers.wait()
        except KeyboardInterrupt:
            self.stop()
            for done in workers.finished:  # not join(): after an interrupted join it may return early (Python 3.11)
                done.wait()  # a second Ctrl-C here leaves the (daemon) workers behind
        return workers.outcome()

    @contextlib.contextmanager
    def slots_held(self):
        """Hold the free compute slots while worker threads start, so that none of them computes before the starts
        are done: a thread's start waits for it to take the interpreter's lock, which computing workers would hold
        for a switch interval at a time.  Then the started workers take the slots in turn, as they arrived."""
        held = 0
        while held < self.slots and self._slots.acquire(blocking=False):
            held += 1
        try:
            yield
        finally:
            for _ in range(held):
                self._slots.release()


class ThreadCommunicator(PhaseClock, Communicator):
    """One simulated worker's view of a `ThreadGroup`."""

    local_work_path = "threads"  # each worker's local-work snapshot on the group's board (`dane.work.Board`)

    def __init__(self, group: ThreadGroup, rank: int):
        self.group = group
        self.rank = rank
        self.size = group.size
        self.traffic = group.cost  # a worker counts what the topology has it send (`Communicator.traffic`)
        self._participants: list[int] | None = None  # of the next collective (`next_participants`); None: all
        self._absent = None  # what a parked worker sends to it (`dane.comm.roster`)
        self.first_handoff = None  # a parked worker's first thread goes into the rounds from this (`dane.loop.parking`)
        self._priced = 0  # the payload of the broadcast in progress (`broadcast`)
        super().__init__()

    def next_participants(self, members: list[int] | None, absent: Callable | None = None) -> None:
        self._participants = None if members is None else sorted(int(r) for r in members)
        self._absent = absent

    def drew(self, members: list[int]) -> None:
        """A sampled round drew ``members``: with a roster, rank 0 wakes the drawn among the parked, and a worker
        outside them parks until a later draw takes it (`dane.comm.roster.Parked`)."""
        roster = self.group.roster
        if roster is None:
            return
        present = roster.present(members)
        self.group.set_parties(len(present))
        if self.rank == 0:
            with self.off_the_clock():  # thread starts and a wait, none of rank 0's compute (on a GPU its turn goes)
                roster.draw(members)
                roster.settle()
        elif self.rank not in present:
            self.park()

    def park(self) -> None:
        """Park, off the clock: unwind the round and end this thread (`Parked`); a draw that takes this worker
        again starts a thread that goes on from rank 0's state (`dane.loop.parking`)."""
        self.end()
        raise Parked  # its slot goes once it has unwound (`dane.comm.worker_threads.WorkerThreads.target`)

    def summary_entries(self) -> dict:
        """The summary says which path the simulator took (``sim.batched``, `dane.comm.batched`)."""
        return {**super().summary_entries(), "simulator_path": "threads"}

    def _collective(self, op: str, tensors: list[torch.Tensor] | None, nbytes: int = 0, root: int = 0,
                    down: int | None = None):
        g = self.group
        g._compute[self.rank] = self.end()
        g.give_slot()  # while it waits, another worker computes
        if self.rank == 0 and g.roster is not None and g.roster.unstarted:  # a collective before the first draw
            g.roster.start_unstarted()
        if g.interrupted:
            raise Interrupted
        g._inbox[self.rank] = tensors
        members, self._participants = self._participants, None
        absent, self._absent = self._absent, None
        if self.rank == 0:
            g._op = (op, nbytes, root, members, down, absent)
        try:
            # The last arrival runs ThreadGroup._reduce.  The result is read before this worker can
            # arrive again, and the next reduction needs every worker's arrival: nobody overwrites
            # it unread, so one rendezvous per collective is enough.
            g._barrier.wait()
            result = g._result
        except threading.BrokenBarrierError:
            if g.interrupted:
                raise Interrupted from None
            raise
        if op != "wait":  # a wait off the clock leaves the phase closed, as `off_the_clock` found it
            g.take_slot()
            self.begin()
        return result

    def allreduce_mean(self, tensors: list[torch.Tensor], kinds=()) -> list[torch.Tensor]:
        """`Communicator.allreduce_mean`; one simulated worker alone (``sim.single_worker``), which never reaches a
        collective of the group, still stops at it once Ctrl-C has interrupted the group."""
        if self.size == 1 and self.group.interrupted:
            raise Interrupted
        return super().allreduce_mean(tensors, kinds)

    def _allreduce_mean(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        # priced at the sizes the base counted: under comm.compress, the compressed message's (and reply's)
        return [t.clone() for t in self._collective("allreduce", tensors, self.message_bytes,
                                                    down=self.message_down_bytes)]

    def gather(self, values: torch.Tensor, rides=()) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """`Communicator.gather`, counted and priced as its one-hot block, with each worker's k values moved alone.
        Every worker receives the one (m, k) table, which it reads and does not write: a copy each would be m²k
        values again."""
        if self.compression is not None or self.size == 1:
            return super().gather(values, rides)
        self.count_allreduce(sum(t.numel() * t.element_size() for t in rides)
                              + self.size * values.numel() * values.element_size())
        rows, *means = self._collective("gather", [values, *rides], self.message_bytes)
        return rows, [t.clone() for t in means]

    def broadcast(self, tensors: list[torch.Tensor], root: int = 0) -> list[torch.Tensor]:
        """`Communicator.broadcast`, priced by the cost model at the root's payload (`broadcast_object`'s short
        strings, which are not the method's traffic, are not)."""
        self._priced = sum(t.numel() * t.element_size() for t in tensors)
        try:
            return super().broadcast(tensors, root)
        finally:
            self._priced = 0

    def _broadcast(self, tensors: list[torch.Tensor], root: int) -> list[torch.Tensor]:
        return [t.clone() for t in self._collective("broadcast", tensors, nbytes=self._priced, root=root)]

    def barrier(self) -> None:
        """A collective phase like any other; entered off the clock (`PhaseClock.off_the_clock`: a checkpoint's, whose
        parts must all be on disk before rank 0 commits, `dane.loop.callbacks.Checkpoints`) it only waits for the
        others: no phase ends, no straggler delay is drawn, the clock does not move."""
        self._collective("barrier" if self.computing else "wait", None)

    def elapsed(self) -> float:
        """Simulated parallel time: the group's clock plus this worker's compute since the last collective."""
        pending = self.phase_compute()
        return self.group.clock + self.group.stragglers.factor(self.rank) * pending
