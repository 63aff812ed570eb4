"""Which simulated workers take part in a sampled round: the others have no thread until a draw takes them
(`dane.comm.threads`).

Under client sampling a round of a federated method is the s drawn clients' work; the other m − s clients
only measure the record's metrics at w_t and send zeros for the method's part of the round's allreduce
(`dane.sampling`).  With a `Roster` on its `dane.comm.threads.ThreadGroup`, a worker that draws S_t and is
not in it (rank 0, the record writer, aside) parks at the draw: it raises `Parked`, which unwinds its thread
to the group with the way back into the run loop (`Parked.resume`, which holds its algorithm and its local-work
ledger), and the thread ends.  A parked worker enters no collective, computes nothing, keeps no record
and has no thread, so a round runs |S_t ∪ {0}| threads.  What the parked clients would have sent, the round's
allreduce fills in for them in rank order (`absent`: zeros and the metrics of their shards at w_t, the same
numbers at the same places, so the mean is the same bit for bit).

A sampled run's workers start late: rank 0 starts alone, and at its first draw the drawn clients start (from the
beginning, drawing the same S_0) while the others are parked without ever having had a thread; their first
thread builds the worker and goes into the rounds as a woken one (``first_resume``,
`dane.comm.worker_threads.WorkerThreads.hand_to`).  Where rank 0 reaches a collective first (a measured default
takes every worker), every worker starts then, as without a roster.  Before its first draw a worker does what
every worker does alike, and no work it counts.

A parked worker wakes when a later draw takes it: rank 0 starts a thread for it (``Roster.spawn``, the group's)
that goes back into the run loop with rank 0's state at the start of that round (`Handoff`: the runner's and the
algorithm's, which every worker holds alike); the worker keeps its own client state (the algorithm's
``own_state`` keys, its shard's state, its local-work ledger) and continues from that round as a resumed run
would (`dane.loop.parking`).  The final evaluation and what follows the rounds wake nobody: the collectives
there are among the workers awake (the last round's clients and rank 0), and the reduction fills in each
parked worker's message from its shard and charges the clock its measured compute (`dane.comm.threads`); when
the rounds end rank 0 closes the roster, and a parked worker is done without another thread (`Roster.close`).

Which runs park is `dane.loop.parking.parks`; every other run keeps every worker in every collective.
"""
from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class Handoff:
    """What a parked worker wakes with: ``kind`` "round" (continue from ``state``, rank 0's state at the start of
    the round that drew it) or "closed" (it is done: the rounds ended, a worker failed, or the group was
    stopped)."""

    kind: str
    state: Any = None


class Parked(BaseException):
    """Raised in a worker that a draw leaves out, to unwind its thread (`dane.loop.parking`).  The run loop sets
    ``resume``: ``resume(handoff)`` goes back into the loop from rank 0's state (`dane.loop.runner.run` with its
    local-work ledger; each caller on the way out wraps it to go on as it would have) and returns what the
    worker's body returns, or raises `Parked` again.  The thread hands ``resume`` to the roster (`Roster.leave`)
    and ends.

    A `BaseException`, so that no ``except Exception`` in algorithm code takes it."""

    def __init__(self):
        super().__init__("parked")
        self.resume: Callable[[Handoff], Any] | None = None


@dataclass
class Woken:
    """What a thread started for a parked worker enters the run loop with: rank 0's ``handoff`` and the worker's
    own local-work ``ledger`` (`dane.loop.runner.run`)."""

    handoff: Handoff
    ledger: Any = None


def fill_parked(comm, absent: Callable) -> None:
    """The next collective of every worker (the final evaluation, one after the rounds) is entered by the workers
    awake; ``absent(problem)`` is what a parked worker sends from its shard (`dane.loop.parking`).  A no-op on every
    other communicator."""
    if comm.rank == 0 and getattr(getattr(comm, "group", None), "roster", None) is not None:
        comm.next_participants(None, absent=absent)


class Roster:
    """The parked workers of a thread group, and the way back into the run loop of each whose thread has ended.

    Only rank 0 wakes workers (at its draw), and it closes the roster when its rounds end (`close`).  A parked
    worker's thread unwinds and hands over its ``resume`` (`leave`); a wake-up that comes before that waits for it
    there, so a wake-up is never lost nor taken twice, and a worker runs in one thread at a time.  The group sets
    ``spawn(starts)`` (for each (rank, body), start a thread that runs ``body()``), ``start(ranks)`` (start these
    workers' threads from the beginning), ``first_resume(rank)`` (the way into the rounds of a worker parked before
    it had a thread) and ``ended(rank)`` (a worker without a thread is done).  ``problems`` are the workers' shards,
    which the group's reduction reads for the parked ones' messages (`absent`)."""

    def __init__(self, size: int, problems: list):
        self.size = size
        self.problems = problems
        self.parked: set[int] = set()  # as rank 0 last drew them: the ranks outside its round's collectives
        self.snapshot: Callable[[], dict] | None = None  # rank 0's state at its round's start (`dane.loop.parking`)
        self.closed = False
        self.unstarted: set[int] = set()  # the workers with no thread yet, before rank 0's first draw or collective
        self.start: Callable[[list[int]], None] | None = None  # the group's: start these workers from the beginning
        self.first_resume: Callable[[int], Callable[[Handoff], Any]] | None = None  # the group's: a first thread's way in
        self.spawn: Callable[[list[tuple[int, Callable[[], Any]]]], None] | None = None
        self.ended: Callable[[int], None] | None = None
        self._resume: dict[int, Callable] = {}  # the parked ranks whose thread has ended: the way back
        self._pending: dict[int, Handoff] = {}  # wake-ups that came before the woken rank's thread had ended
        self._asleep: set[int] = set()  # the ranks that parked and were not woken since
        self._settled = threading.Condition()

    def present(self, members: list[int]) -> list[int]:
        """The ranks in a sampled round's collectives: its clients and rank 0."""
        return sorted(set(members) | {0})

    def draw(self, members: list[int]) -> None:
        """Rank 0 drew ``members``: the parked ones among them wake with rank 0's state at the round's start.  At its
        first draw the workers not yet started are the drawn ones, which start from the beginning and draw the same
        clients, and the others, which park with no thread until a draw takes them (`first_resume`)."""
        present = set(self.present(members))
        if self.unstarted:
            with self._settled:  # against a `close` from a failing worker's thread
                drawn, later, self.unstarted = sorted(self.unstarted & present), self.unstarted - present, set()
                for rank in later:
                    self._resume[rank] = self.first_resume(rank)
                    self._asleep.add(rank)
            if drawn:
                self.start(drawn)
        waking = sorted(self.parked & present)
        if waking:
            state = self.snapshot()
            self._wake([(rank, Handoff("round", state)) for rank in waking])
        self.parked = set(range(self.size)) - present

    def start_unstarted(self) -> None:
        """Rank 0 reached a collective before its first draw (a measurement that takes every worker): the workers
        not yet started start from the beginning, as without a roster."""
        with self._settled:
            ranks, self.unstarted = sorted(self.unstarted), set()
        if ranks:
            self.start(ranks)

    def leave(self, rank: int, resume: Callable) -> Handoff | None:
        """A parked worker's thread has unwound: None, and ``resume`` waits for the draw that wakes it (the thread
        ends); or the wake-up that came first, which the thread goes on with."""
        with self._settled:
            if self.closed:
                return Handoff("closed")
            handoff = self._pending.pop(rank, None)
            if handoff is None:
                self._resume[rank] = resume
                self._asleep.add(rank)
                self._settled.notify_all()
            return handoff

    def settle(self) -> None:
        """Rank 0 waits until every worker its draw left out has parked and its thread unwound: each left its
        local-work snapshot on the group's board before its draw (`dane.work.post`), and the round's reduction,
        which no longer waits for it, must find it there; and m − s threads on their way out would otherwise take
        turns at the interpreter's lock with the round's clients, one switch interval each."""
        with self._settled:
            while not (self.parked <= self._asleep or self.closed):
                self._settled.wait(0.1)

    def close(self) -> None:
        """No parked worker wakes again (the rounds ended, a worker failed or the group was stopped): one without a
        thread is done (``ended``); one whose thread still unwinds ends in `leave`."""
        with self._settled:
            self.closed = True
            done, self._resume = sorted({*self._resume, *self.unstarted}), {}
            self.unstarted = set()
            self._settled.notify_all()
        for rank in done:
            self.ended(rank)

    def _wake(self, wakes: list[tuple[int, Handoff]]) -> None:
        starts = []
        with self._settled:
            for rank, handoff in wakes:
                self._asleep.discard(rank)
                resume = self._resume.pop(rank, None)
                if resume is None:  # its thread still unwinds: it takes the handoff in `leave`
                    self._pending[rank] = handoff
                else:
                    starts.append((rank, functools.partial(resume, handoff)))
        if starts:
            self.spawn(starts)

    def absent(self, members: list[int] | None) -> list[int]:
        """The ranks whose messages a collective fills in (`dane.comm.threads.ThreadGroup`): those outside a sampled
        round's ``members`` and rank 0; for a collective of every worker (``members`` None: the final evaluation,
        the summary's), the parked ones."""
        inside = set(self.present(members)) if members is not None else set(range(self.size)) - self.parked
        return [rank for rank in range(self.size) if rank not in inside]
