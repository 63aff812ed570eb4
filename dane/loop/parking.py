"""The run loop's side of parked workers (`dane.comm.roster`): rank 0's state at each round's start, and a parked
worker's return to the rounds.

`parks` says which simulated runs let the clients outside S_t sleep: a federated method that declares its
``own_state`` (`baselines.federated.Federated.sleeps_out`: SCAFFOLD, FedProx, FedRed, FedDANE without
``resample``, S-DANE without ``adaptive``), a round that samples (``clients_per_round`` below the
workers), and nothing that needs every worker's own progress each round or after the rounds: no ``comm.compress``
(a client outside S_t sends its error-feedback residual), no ``checkpoint_every`` or ``resume`` (every worker
writes and reads its own part), no injected ``faults`` (a worker is lost at a given round), no ``similarity``
(every worker's Hessian products after the rounds).  Any other run keeps every worker in every collective, as
before.

A parked worker's thread ends: `Parked` unwinds it out of the run loop with the way back in (`Parked.resume`:
`dane.loop.runner.run` with the worker's local-work ledger, wrapped by `dane.loop.driver.drive` to go on with the
callbacks, none of whose ends is called on the way out), and a draw that takes the worker again starts a thread
that goes back in with rank 0's state (`dane.comm.roster`).  A worker that wakes for round t (`Parking.rejoin`)
takes rank 0's state at the start of round t: the algorithm's, less its ``own_state`` keys and its shard's own
state (``problem``), which it keeps; the stop tests' windows; the record before round t; the collective counters
(its own clock is the group's).  None of it is on the clock: a woken worker's compute phase starts once it has
taken the state, and rank 0 takes its snapshot off its clock (`dane.comm.threads.PhaseClock.off_the_clock`).  Its
local-work ledger is its own, unchanged while it slept (it did no work).  That is the state the worker would have
reached had it run every round: every worker's copy of the server's state is the same, a client outside S_t
changes only that copy, and its metrics reach the round's allreduce through the group (`dane.comm.roster`).

The final evaluation and what follows the rounds wake nobody.  Their collectives are among the workers awake (the
last round's clients and rank 0), each saying what a parked worker would send from its shard
(`dane.comm.roster.fill_parked`: the evaluation's metrics and gradient, `baselines.federated.Federated.evaluate`;
a network's test confusion matrix, `dane.loop.callbacks.FinalState`), which the group fills in and charges as that
worker's compute.  A parked worker's local work is on the group's board as it left it (a round's draw comes before
its work, so its counts did not move after its last snapshot).  When its rounds end rank 0 closes the roster
(`Parking.finish`): a parked worker is done, and its result is not read (the run's is rank 0's).
"""
from __future__ import annotations

from typing import Callable

from ..comm.base import restore_traffic_bits
from ..comm.roster import Handoff, Parked, Roster, Woken

__all__ = ["Parked", "Parking", "Woken", "first_wake", "parks"]


def parks(spec) -> bool:
    """Whether the thread simulator lets ``spec``'s non-participants sleep through a sampled round (module
    docstring)."""
    config, control = spec.algorithm, spec.control
    s = getattr(config, "clients_per_round", None)
    sleeps_out = getattr(config.algorithm, "sleeps_out", None)
    return (sleeps_out is not None and sleeps_out(config) and s is not None
            and s < spec.comm.workers and spec.comm.compress is None and not control.checkpoint_every
            and control.resume is None and not control.faults and not control.similarity)


def first_wake(comm) -> Woken | None:
    """The way into the rounds of a worker's first thread where that worker was parked before it had one (its
    roster's ``first_resume``): rank 0's handoff, with a fresh local-work ledger (it did no work); None
    elsewhere."""
    handoff = getattr(comm, "first_handoff", None)
    if handoff is None:
        return None
    comm.first_handoff = None
    return Woken(handoff)


class Parking:
    """One simulated worker's part in parking: rank 0 leaves its state at each round's start and closes the roster
    at the end, and a woken worker takes rank 0's state."""

    def __init__(self, comm, roster: Roster, own_state: tuple[str, ...]):
        self.comm, self.roster = comm, roster
        self.own = (*own_state, "problem")  # the keys of the algorithm's state a worker keeps as its own

    @classmethod
    def of(cls, comm, algo) -> "Parking | None":
        roster = getattr(getattr(comm, "group", None), "roster", None)
        own_state = getattr(algo, "own_state", None)
        return None if roster is None or own_state is None else cls(comm, roster, own_state)

    def round_start(self, state: Callable[[], dict]) -> None:
        """A round begins: rank 0's state at its start is what a worker drawn in it wakes with."""
        if self.comm.rank == 0:
            with self.comm.off_the_clock():  # the simulator's bookkeeping, not rank 0's compute
                snapshot = state()
            self.roster.snapshot = lambda: snapshot

    def finish(self) -> None:
        """The rounds ended on this worker: rank 0 closes the roster, and the parked workers are done."""
        if self.comm.rank == 0:
            self.roster.close()

    def rejoin(self, handoff: Handoff, algo, watch, rising) -> tuple[int, dict, dict | None, list[dict]]:
        """Take rank 0's state from ``handoff`` (module docstring); the loop goes on from (round, cost, first
        record, records kept), and keeps no reference to the rest (a snapshot per sleeper would grow with m)."""
        state = handoff.state
        self.load(state["algorithm"], algo)
        watch.load_state_dict(state["early_stop"])
        rising.load_state_dict(state["divergence"])
        self.counters(state["cost"])
        self.comm.begin()  # its compute phase: from here to the round's collective, as a worker that never slept
        return state["round"], state["cost"], state["first"], list(state["last"])

    def load(self, state: dict, algo) -> None:
        own = algo.state_dict()
        algo.load_state_dict({**state, **{key: own[key] for key in self.own if key in own}})

    def counters(self, cost: dict) -> None:
        """The collective counters as rank 0 has them (the same on every worker: each enters every collective with
        the same tensors); not the clock, which the group keeps."""
        comm = self.comm
        comm.bytes_sent, comm.calls = int(cost["bytes_sent"]), int(cost["comm_rounds"])
        restore_traffic_bits(comm, cost)
