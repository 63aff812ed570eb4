"""The round loop shared by every algorithm and backend, with rank-0 logging."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .. import work
from ..algorithm import Algorithm, Finished, Rounds
from ..comm.base import restore_traffic_bits, traffic_bits
from ..comm.batched import worker_ranks
from ..errors import NotPositiveDefinite
from .parking import Parked, Parking, Woken, first_wake
from .stopping import DivergenceWatch, EarlyStopping, StopRule


def _cost(comm) -> dict:
    return {"time_s": comm.elapsed(), "bytes_sent": comm.bytes_sent, "comm_rounds": comm.calls, **traffic_bits(comm)}


def _work_snapshot(comm, ledger: work.Ledger | None):
    """This worker's local work so far, taken where `_cost` is (a simulated thread posts it to its group)."""
    if ledger is None:
        return None
    snapshot = ledger.new_round()
    work.post(comm, snapshot)
    return snapshot


def clock_split(comm) -> dict:
    """The simulator's clock, split: the seconds of it spent in collectives (``comm_s``; the rest is compute), which a
    checkpoint keeps beside ``cost`` so that a resumed run's summary splits its whole clock, not the part after; and
    where its seeded draws stand (``draws``, `dane.comm.meters.SeededDraws`), so that a resumed run draws the
    straggler delays and tail excesses the uninterrupted run would have."""
    group = getattr(comm, "group", None)
    comm_time = getattr(group, "comm_time", None)  # split learning's clock keeps no split
    if comm_time is None:
        return {}
    draws = group.draw_states() if hasattr(group, "draw_states") else None
    return {"clock_split": {"comm_s": comm_time, **({"draws": draws} if draws is not None else {})}}


def restore_cost(comm, cost: dict, split: dict | None = None) -> None:
    """Continue a communicator's counters and clock from a checkpoint's ``cost`` (and `clock_split`'s ``split``)."""
    comm.bytes_sent, comm.calls = int(cost["bytes_sent"]), int(cost["comm_rounds"])
    restore_traffic_bits(comm, cost)
    group = getattr(comm, "group", None)
    if group is not None:  # the simulator: its clock is the simulated parallel time
        group.clock = float(cost["time_s"])
        if split is not None:  # checkpoints from before the split: the summary's parts cover the rounds after
            group.comm_time = float(split["comm_s"])
            group.compute_time = group.clock - group.comm_time
            if "draws" in split:  # checkpoints from before: the draws start again from the seeds
                group.restore_draws(split["draws"])
    else:
        comm.restore_clock(float(cost["time_s"]))


def start_state(algo: Rounds, stop: StopRule) -> dict:
    """Round 0's state in the form ``on_checkpoint`` receives: ``run(algo, stop, resume=start_state(algo, stop))``
    is a fresh run (Horovod elastic commits it before the first round, `dane.loop.elastic`)."""
    return {"round": 0, "cost": _cost(algo.comm), "first": None, "early_stop": EarlyStopping(stop).state_dict(),
            "divergence": DivergenceWatch(stop).state_dict(), "algorithm": algo.state_dict()}


@dataclass(frozen=True)
class RunResult:
    """How `run` ended: the ``records`` (this call's, after a resume's ``history``), the ``status``, the ``iterate``
    the last record describes, ``stopped_by``, the test that ended the run (`StopRule.stopped_by`), and ``remedy``,
    what to change where the method ended the run itself and named it (`dane.algorithm.Finished`; else None).
    Unpacks as ``records, status``."""

    records: list[dict]
    status: str
    iterate: torch.Tensor
    stopped_by: str
    remedy: str | None = None

    def __iter__(self):
        return iter((self.records, self.status))


def run(algo: Rounds, stop: StopRule, on_round: Callable[[dict], None] | None = None, *,
        resume: dict | None = None, on_checkpoint: Callable[[dict], None] | None = None,
        checkpoint_every: int = 0, keep_records: bool = True, woken: Woken | None = None) -> RunResult:
    """Run rounds until ``stop`` says so; every record describes iterate w_t and what it cost to reach.

    Round t's metrics are measured inside round t's first allreduce, and its time, bytes, local work and the
    method's own counters (`Algorithm.spent`) are the totals when w_t was produced.  The last iterate gets one
    evaluation.

    Every ``checkpoint_every`` rounds, ``on_checkpoint`` receives the state from which
    ``run(..., resume=state)`` continues exactly as the uninterrupted run would: the next
    round, the cost counters, the first record, the early-stopping state, the divergence
    window and ``algo.state_dict()``.  The records returned (`RunResult`) are this call's, after the state's
    ``history`` where it has one (the records before a resume, which rank 0 reads back: `dane.loop.callbacks`), with
    the iterate the last record describes (w_t when a stop rule fired
    on round t's own metrics; on a round DANE's safeguard rejected, and at the end on a trial it would
    reject, the records describe the last accepted iterate instead, and so does the iterate returned) and the test that ended the run.  The algorithm is
    only stepped and evaluated: nothing is set on it.

    ``keep_records=False`` keeps only the last record (and round 0's, for the stop tests): a simulated worker other
    than rank 0, whose records are rank 0's and whose summary nobody reads (`dane.loop.worker.run_worker`), so that m
    simulated workers hold the run's records once, not m times.

    An algorithm whose answer is final before the cap (one-shot averaging) says so with a
    ``finished`` attribute, None until then and afterwards (status, why): the run ends on
    the record that describes that answer, with that status unless a stop test fired first,
    and ``stopped_by`` is ``why`` and what the tolerance measures there.

    In the thread simulator a worker that a sampled round leaves out raises `Parked` out of ``run``
    (`dane.loop.parking`), whose ``resume(handoff)`` is ``run`` again with ``woken`` (rank 0's handoff and this
    worker's local-work ledger): the rounds go on from rank 0's state, in the thread a draw that takes it starts.
    A worker parked before it ever had a thread comes in the same way, with a fresh ledger (`first_wake`).
    """
    comm = algo.comm
    woken = woken or first_wake(comm)
    # an algorithm's rounds count its local work (`dane.work`); a split or asynchronous run's do not
    if woken is not None and woken.ledger is not None:
        ledger = woken.ledger
    elif isinstance(algo, Algorithm):  # a fresh one: every worker's row on the batched simulator, else this worker's
        ledger = work.Ledger(worker_ranks(comm), work.unit_costs(algo.problem))
    else:
        ledger = None
    with work.opened(ledger):
        try:
            return rounds_of(algo, stop, on_round, ledger, resume=resume, on_checkpoint=on_checkpoint,
                             checkpoint_every=checkpoint_every, keep_records=keep_records,
                             handoff=None if woken is None else woken.handoff)
        except Parked as parked:  # back in with its own ledger: the work it did before it parked
            parked.resume = lambda handoff: run(algo, stop, on_round, on_checkpoint=on_checkpoint,
                                                checkpoint_every=checkpoint_every, keep_records=keep_records,
                                                woken=Woken(handoff, ledger))
            raise


def rounds_of(algo: Rounds, stop: StopRule, on_round: Callable[[dict], None] | None, ledger: work.Ledger | None, *,
              resume: dict | None, on_checkpoint: Callable[[dict], None] | None, checkpoint_every: int,
              keep_records: bool, handoff=None) -> RunResult:
    """`run`'s rounds, with this worker's ``ledger`` (None: no local work counted) open; ``handoff``: a parked
    worker's, which it goes on from (`dane.loop.parking`)."""
    comm = algo.comm
    watch, rising = EarlyStopping(stop), DivergenceWatch(stop, comm, patient=algo.damps_itself)
    parking = Parking.of(comm, algo)  # the thread simulator's clients outside S_t park (`dane.loop.parking`)
    if handoff is not None:  # a parked worker woke: on from rank 0's state
        t, cost, first, records = parking.rejoin(handoff, algo, watch, rising)
        return rounds_from(algo, stop, on_round, ledger, watch, rising, parking, t, cost, first, records,
                           _work_snapshot(comm, ledger), on_checkpoint=on_checkpoint,
                           checkpoint_every=checkpoint_every, keep_records=keep_records)
    start, cost, first, records = 0, _cost(comm), None, []
    if resume is not None:
        algo.load_state_dict(resume["algorithm"])
        watch.load_state_dict(resume["early_stop"])
        rising.load_state_dict(resume.get("divergence", {"above": 0}))  # checkpoints from before the rule: 0
        restore_cost(comm, resume["cost"], resume.get("clock_split"))
        start, cost, first = resume["round"], resume["cost"], resume["first"]
        records = list(resume.get("history", ())) if keep_records else []  # rank 0's records before ``start``
        if ledger is not None:
            ledger.load_state_dict(resume.get("work"), comm.size)  # checkpoints from before the counters: zero
    return rounds_from(algo, stop, on_round, ledger, watch, rising, parking, start, cost, first, records,
                       _work_snapshot(comm, ledger), on_checkpoint=on_checkpoint, checkpoint_every=checkpoint_every,
                       keep_records=keep_records)


def rounds_from(algo: Rounds, stop: StopRule, on_round: Callable[[dict], None] | None, ledger: work.Ledger | None,
                watch: EarlyStopping, rising: DivergenceWatch, parking: Parking | None, t: int, cost: dict,
                first: dict | None, records: list[dict], snapshot, *, on_checkpoint: Callable[[dict], None] | None,
                checkpoint_every: int, keep_records: bool) -> RunResult:
    """`rounds_of`'s loop, from round ``t`` with the stop tests' state, the cost so far, round 0's record, the records
    kept and this worker's local-work ``snapshot`` at the round's start."""
    comm = algo.comm
    status = "max_rounds"
    while t <= stop.rounds:
        if parking is not None and t < stop.rounds:  # the final evaluation wakes nobody (`dane.loop.parking`)
            parking.round_start(lambda: {
                "round": t, "cost": cost, "first": first, "early_stop": watch.state_dict(),
                "divergence": rising.state_dict(), "algorithm": algo.state_dict(), "last": records[-1:]})
        w_t = algo.iterate.detach().clone() if t < stop.rounds else None
        spent = algo.spent()  # the method's own counters, to reach w_t
        try:
            metrics = algo.step() if t < stop.rounds else algo.evaluate()  # a parked worker raises `Parked`
        except NotPositiveDefinite as singular:  # the problem's remedy, then the method's own (its keys only)
            raise NotPositiveDefinite(f"{singular}{getattr(algo, 'singular_remedy', '')}") from None
        done = work.reduce_over_workers(comm, snapshot) if ledger is not None else None
        record = {"round": t, **cost, **metrics, **(done or {}), **spent}
        read = algo.read_work(t, done) if done is not None else []  # what the work says of the round before
        if read:
            record["adapted"] = [*read, *record.get("adapted", ())]
        if keep_records or not records:
            records.append(record)
        else:
            records[-1] = record
        first = first if first is not None else record
        verdict = stop.status(record, first) or rising.update(record, first) \
            or watch.update(record) or finished(algo)  # before on_round: a bad monitor writes nothing
        if on_round is not None:
            on_round(record)
        if verdict is not None:
            status = verdict
            break
        w_t = None
        cost, snapshot = _cost(comm), _work_snapshot(comm, ledger)
        if on_checkpoint is not None and checkpoint_every and (t + 1) % checkpoint_every == 0 and t < stop.rounds:
            on_checkpoint({"round": t + 1, "cost": cost, "first": first, "early_stop": watch.state_dict(),
                           "divergence": rising.state_dict(), "algorithm": algo.state_dict(), **clock_split(comm),
                           **({"work": work.checkpoint_state(comm, ledger, snapshot)} if ledger is not None else {})})
        t += 1
    # A run stopped by a round's metrics has already moved past the iterate they describe; a safeguard's rejected
    # start is described by the last accepted iterate (`Rounds.described_iterate`).
    iterate = algo.described_iterate(w_t).detach().clone()
    own = own_ending(algo, status, records, rising)
    result = RunResult(records, status, iterate, why_stopped(algo, stop, status, records, first, rising),
                       None if own is None else own.remedy)
    if parking is not None:
        parking.finish()
    return result


def why_stopped(algo: Rounds, stop: StopRule, status: str, records: list[dict], first: dict | None,
                divergence: DivergenceWatch | None = None) -> str:
    """`RunResult.stopped_by`: the test that ended the run (a run the divergence window stopped under client
    sampling: that rule's line, ``divergence.reason``), the algorithm's own reason (``finished``) and, at the
    round cap, its ``diagnosis``."""
    if status == "diverged" and divergence is not None and divergence.reason:
        return divergence.reason
    own = own_ending(algo, status, records, divergence)
    if own is not None:
        measure = stop.measure(records[-1], first)
        why = own.why if own.remedy is None else f"{own.why}: {own.remedy}"
        return why + ("" if measure is None else f"; {measure}" +
                      (f", above {measure.target_label}" if measure.target_label else ""))
    sampled = divergence is not None and bool(records) and divergence.sampled(records[-1])
    said = stop.stopped_by(status, records[-1], first, records, sampled=sampled) if records else status
    extra = algo.diagnosis(records) if status == "max_rounds" and records else None
    return f"{said}; {extra}" if extra else said


def own_ending(algo: Rounds, status: str, records: list[dict], divergence: DivergenceWatch | None) -> Finished | None:
    """The method's own ending (its ``finished``), where it is what ended the run: its status, and not the
    divergence window's under client sampling, which names its own rule; None otherwise."""
    done = algo.finished
    if not records or done is None or status != done[0] or (divergence is not None and divergence.reason):
        return None
    return Finished(*done)


def finished(algo: Rounds) -> str | None:
    """The status an algorithm whose answer is final ends the run with (its ``finished``: (status, why)), else None."""
    done = algo.finished
    return None if done is None else done[0]

