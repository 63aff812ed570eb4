"""One `dane.comm.threads.ThreadGroup.run`: the m simulated workers' threads, what each returned or raised, and
when each is done.

A worker's thread runs its body (``fn(comm)`` from the beginning, or a parked worker's way back into the rounds)
holding one of the group's compute slots.  A worker that parks (`dane.comm.roster.Parked`) ends its thread; the
roster starts another when a draw wakes it (`spawn`), and its result is that thread's.  With a roster rank 0
starts alone and the others at its first draw or collective (`hand_to`); a worker parked before it ever had a
thread comes into the rounds from rank 0's state (`first_thread`, `dane.loop.parking.first_wake`).
"""
from __future__ import annotations

import functools
import threading
from typing import Callable

import torch

from .rendezvous import WORKER_STACK_BYTES, Interrupted, ctrl_c_held, thread_limit
from .roster import Parked


class WorkerThreads:
    """The threads of one run of ``fn`` over ``group``'s m workers (a `dane.comm.threads.ThreadGroup`)."""

    def __init__(self, group, fn: Callable[[object], object]):
        self.group, self.fn = group, fn
        self.comms = group.communicators()
        self.results: list[object] = [None] * group.size
        self.errors: list[BaseException | None] = [None] * group.size
        self.finished = [threading.Event() for _ in self.comms]
        self._starting = threading.Lock()  # one thread start at a time (`start_thread`)
        self._threads: list[threading.Thread] = []  # the threads started, the ended ones pruned
        self._alive = 0  # how many of them were alive at the last pruning

    def hand_to(self, roster) -> list:
        """Give ``roster`` the ways to start workers (`dane.comm.roster.Roster`): rank 0 starts alone, the others at
        its first draw or collective.  Returns the communicators to start now."""
        roster.spawn, roster.ended = self.spawn, lambda rank: self.finished[rank].set()
        roster.start = lambda ranks: self.spawn([(rank, self.body(rank)) for rank in ranks], True)
        roster.first_resume = lambda rank: functools.partial(self.first_thread, rank)
        roster.unstarted = set(range(1, self.group.size))
        return self.comms[:1]

    def body(self, rank: int) -> Callable[[], object]:
        """Worker ``rank``'s run from the beginning."""
        return functools.partial(self.fn, self.comms[rank])

    def first_thread(self, rank: int, handoff) -> object:
        """A worker parked before it had a thread: its run from the beginning, into the rounds from ``handoff``
        (`dane.loop.parking.first_wake`)."""
        self.comms[rank].first_handoff = handoff
        return self.fn(self.comms[rank])

    def start(self, comms: list) -> None:
        """Start ``comms``' workers from the beginning, the free slots held: none computes before all have started.
        A limit on threads or address space stops the started ones and fails with one line (`thread_limit`)."""
        with ctrl_c_held():  # a Ctrl-C while a thread starts would leave the others running, unwaited
            started = 0
            try:
                with self.group.slots_held():
                    for comm in comms:
                        self.start_thread(comm, self.body(comm.rank), True)
                        started += 1
            except RuntimeError as exc:  # "can't start new thread"
                self.group.stop()  # the started workers end at their first collective, their run folder released
                for done in self.finished[:started]:
                    done.wait()
                raise thread_limit(self.group.size, started, exc) from None

    def spawn(self, starts: list, fresh: bool = False) -> None:
        """Start a thread for each (rank, body): a woken worker's, or (``fresh``) a worker's from the beginning, the
        free slots held (`dane.comm.threads.ThreadGroup.slots_held`)."""
        with self.group.slots_held():
            for i, (rank, body) in enumerate(starts):
                try:
                    self.start_thread(self.comms[rank], body, fresh)
                except RuntimeError as exc:  # these workers are done (the group fails): none waits for them
                    for later, _ in starts[i:]:
                        self.finished[later].set()
                    raise thread_limit(self.group.size, threading.active_count() - 1, exc) from None

    def start_thread(self, comm, body: Callable[[], object], fresh: bool) -> None:
        """Start ``comm``'s worker thread, with `WORKER_STACK_BYTES` of stack (a setting of the process, so one
        start at a time: rank 0 starts woken workers while the first ones may still be starting)."""
        with self._starting:
            # the ended ones go once the list has doubled since the last pruning (a sampled run starts threads every
            # round; each ended one keeps its Event, locks and hook, a few KB): O(1) a start, amortized
            if len(self._threads) > 2 * self._alive + 64:
                self._threads = [thread for thread in self._threads if thread.is_alive()]
                self._alive = len(self._threads)
            previous = threading.stack_size(WORKER_STACK_BYTES)
            try:
                thread = threading.Thread(target=self.target, args=(comm, body, fresh), name=f"worker-{comm.rank}",
                                          daemon=True)
                thread.start()
                self._threads.append(thread)
            finally:
                threading.stack_size(previous)

    def target(self, comm, body: Callable[[], object] | None, fresh: bool) -> None:
        """A worker thread: ``body`` holding a slot, then what the worker goes on with (`rejoin`) until nothing."""
        group = self.group
        while body is not None:
            parked = None
            try:
                torch.set_num_threads(1)  # per thread: a fresh thread's first BLAS call may otherwise use more, in another order
                group.take_slot()
                if fresh:  # a woken worker's compute starts once it has taken rank 0's state (`dane.loop.parking`)
                    comm.begin()
                self.results[comm.rank] = body()
            except Parked as exc:
                if exc.resume is None:  # raised outside the run loop (`dane.loop.runner.run`): no way back
                    self.errors[comm.rank] = RuntimeError(f"worker {comm.rank} parked outside the run loop")
                    group.abort()
                else:
                    parked = exc
            except Interrupted:
                pass  # the group was stopped; the caller sees ``interrupted``
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                self.errors[comm.rank] = exc
                group.abort()
            finally:
                if parked is None:  # a parked worker's phase ended where it parked
                    try:
                        comm.end()  # the last compute phase: on a GPU, its turn is given back
                    finally:
                        group.give_slot()
                        self.finished[comm.rank].set()  # even if the device failed there: the caller must not wait forever
            body, fresh = self.rejoin(comm.rank, parked), False
            if parked is not None and body is None:
                group.give_slot()  # only now: m − s threads unwinding without one wait their turns at the GIL behind the round's clients

    def rejoin(self, rank: int, parked: Parked | None) -> Callable[[], object] | None:
        """After a worker's body returned or raised: None, its thread ends; or what it goes on with (a wake-up that
        came while it unwound, `dane.comm.roster.Roster.leave`)."""
        if parked is None:
            return None
        handoff = self.group.roster.leave(rank, parked.resume)
        if handoff is None:
            return None
        if handoff.kind == "closed":
            self.finished[rank].set()
            return None
        return lambda: parked.resume(handoff)

    def wait(self) -> None:
        """Until every worker is done and its thread has ended."""
        for done in self.finished:
            # In slices: the kernel may hand a Ctrl-C to a worker thread, and CPython runs the
            # handler only when the main thread wakes; an endless wait would never see it.
            while not done.wait(0.2):
                pass
        for thread in self._threads:  # to their end: a worker thread still ending when the process exits aborts it
            thread.join()

    def outcome(self) -> list[object]:
        """The m results, or the first failure raised (a broken collective only where nothing else failed)."""
        broken = (threading.BrokenBarrierError, Interrupted)
        first = next((e for e in self.errors if e is not None and not isinstance(e, broken)), None)
        if first is None:
            first = next((e for e in self.errors if e is not None), None)
        if first is not None:
            raise first
        return self.results
