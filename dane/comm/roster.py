"""Which simulated workers take part in a sampled round: the others sleep through it (`dane.comm.threads`).

Under client sampling a round of a federated method is the s drawn clients' work; the other m − s clients
only measure the record's metrics at w_t and send zeros for the method's part of the round's allreduce
(`dane.sampling`).  With a `Roster` on its `dane.comm.threads.ThreadGroup`, a worker that draws S_t and is
not in it (rank 0, the record writer, aside) parks on its own event at the draw: it enters no collective,
computes nothing and keeps no record, so a round runs |S_t ∪ {0}| threads.  What the parked clients would
have sent, the round's allreduce fills in for them in rank order (`absent`: zeros and the metrics of their
shards at w_t, the same numbers at the same places, so the mean is the same bit for bit).

A parked worker wakes when a later draw takes it (or when the rounds end): rank 0 hands it its own state at
the start of that round (`Handoff`: the runner's and the algorithm's, which every worker holds alike), the
worker keeps its own client state (the algorithm's ``own_state`` keys, its shard's state, its local-work
ledger) and continues from that round as a resumed run would (`dane.loop.parking`).

Which runs park is `dane.loop.parking.parks`; every other run keeps every worker in every collective.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class Handoff:
    """What a parked worker wakes with: ``kind`` "round" (continue from ``state``, rank 0's state at the start of
    the round that drew it or of the final evaluation), "end" (the rounds ended while it slept: ``state`` holds
    rank 0's result) or "abort" (a worker failed, or the group was stopped)."""

    kind: str
    state: Any = None


class Rejoin(BaseException):
    """Raised in a parked worker once it wakes, to unwind its round back to the run loop (`dane.loop.parking`).

    A `BaseException`, so that no ``except Exception`` in algorithm code takes it."""

    def __init__(self, handoff: Handoff):
        super().__init__(handoff.kind)
        self.handoff = handoff


class Roster:
    """The parked workers of a thread group: one event and one handoff each.

    Only rank 0 wakes workers (at its draw, and when its rounds end); a worker clears its own event once woken,
    before it can enter another collective, and rank 0 can set it again only after that collective: a wake-up is
    never lost nor taken twice.  ``problems`` are the workers' shards, which the group's reduction reads for the
    parked ones' metrics (`absent`)."""

    def __init__(self, size: int, problems: list):
        self.size = size
        self.problems = problems
        self._woken = [threading.Event() for _ in range(size)]
        self._handoff: list[Handoff | None] = [None] * size
        self.parked: set[int] = set()  # as rank 0 last drew them: the ranks outside its round's collectives
        self.snapshot: Callable[[], dict] | None = None  # rank 0's state at its round's start (`dane.loop.parking`)
        self.aborted = False
        self._asleep: set[int] = set()  # the ranks waiting in `park`
        self._settled = threading.Condition()

    def present(self, members: list[int]) -> list[int]:
        """The ranks in a sampled round's collectives: its clients and rank 0."""
        return sorted(set(members) | {0})

    def draw(self, members: list[int]) -> None:
        """Rank 0 drew ``members``: the parked ones among them wake with rank 0's state at the round's start."""
        present = set(self.present(members))
        waking = sorted(self.parked & present)
        if waking:
            state = self.snapshot()
            for rank in waking:
                self._wake(rank, Handoff("round", state))
        self.parked = set(range(self.size)) - present

    def wake_all(self, kind: str, state: Any = None) -> None:
        """Every parked worker wakes (the final evaluation, the rounds' end)."""
        for rank in sorted(self.parked):
            self._wake(rank, Handoff(kind, state))
        self.parked = set()

    def park(self, rank: int) -> Handoff:
        """Sleep until rank 0 (or `abort`) wakes this worker; what it woke with."""
        with self._settled:
            self._asleep.add(rank)
            self._settled.notify_all()
        event = self._woken[rank]
        event.wait()
        event.clear()
        with self._settled:
            self._asleep.discard(rank)
        handoff, self._handoff[rank] = self._handoff[rank], None
        return handoff if not self.aborted else Handoff("abort")

    def settle(self) -> None:
        """Rank 0 waits until every worker its draw left out is asleep: each left its local-work snapshot on the
        group's board before its draw (`dane.work.post`), and the round's reduction, which no longer waits for it,
        must find it there."""
        with self._settled:
            while not (self.parked <= self._asleep or self.aborted):
                self._settled.wait(0.1)

    def abort(self) -> None:
        """A worker failed or the group was stopped: every parked worker wakes to end."""
        self.aborted = True
        for event in self._woken:
            event.set()
        with self._settled:
            self._settled.notify_all()

    def _wake(self, rank: int, handoff: Handoff) -> None:
        self._handoff[rank] = handoff
        self._woken[rank].set()

    def absent(self, present: list[int]) -> list[int]:
        """The ranks a collective among ``present`` fills in (`dane.comm.threads.ThreadGroup`)."""
        inside = set(present)
        return [rank for rank in range(self.size) if rank not in inside]
