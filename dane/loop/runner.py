"""The round loop shared by every algorithm and backend, with rank-0 logging."""
from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Callable

import torch

from .. import work
from ..algorithm import Algorithm, Rounds
from ..comm.base import restore_traffic_bits, traffic_bits
from ..errors import ConfigError
from ..records.projection import ROUND_OFF, Trend, fit
from .parking import Parked, Parking, Woken, first_wake


@dataclass(frozen=True)
class StopRule:
    """Stop after ``rounds`` rounds, once the run is within ``tol`` of the optimum, or once it diverges.

    Within ``tol`` (relative, so it does not change when the objective is scaled):
    with a reference optimum (``problem.optimum``, `dane.reference`) the suboptimality
    O(w_t) − O* at most ``tol`` · |O*|; without one, the gradient norm at most ``tol``
    times its value at round 0.  ``tol_abs`` is an absolute floor on the suboptimality
    test (the run stops once O(w_t) − O* ≤ max(tol · |O*|, tol_abs)); with ``tol`` None
    it is the whole test.  It is there for objectives whose O* is zero or near it,
    where a relative test asks for the impossible.  `rule` names the test in use, for
    the log and the summary, and `stopped_by` the test that ended a run.

    Diverged (`DivergenceWatch`): the objective became non-finite, rose past ``blowup``
    times max(1, |O(w_0)|), or was above its round-0 value in ``diverge_after`` of the
    last 2 · ``diverge_after`` rounds (None: never on that count).  A method that
    converges may rise above its start for a round or two (ADMM's consensus point, AIDE's
    extrapolation, plain DANE's first step); one that is above it five rounds of ten has
    not been seen to come back, whether the rounds run in a row (a slow climb) or
    alternate (plain DANE cycling between two points, one above the start: breast_cancer
    logistic at m=4).  The defaults benchmark, `scripts/bench_defaults.py`, records each
    converged run's largest rise, ``peak_rise``, which is how ``blowup`` was chosen.
    Under client sampling (a record whose ``clients`` is below the workers) the window
    test asks for more: above round 0 in every one of the last 2 · ``diverge_after``
    rounds, and rising over them (the mean of the newer half above the older half's).
    A sampled round moves by a noisy sampled gradient, and a run that converges can sit
    above its start in half of its first rounds without a long run of them: S-DANE at four
    times its default λ on phishing over 80 Dirichlet clients, 8 a round, was stopped so
    at round 7 and converges when let run (its recorded objectives are in
    tests/test_sampled_divergence.py; the benchmark's cell, rerun under this rule, is in
    scripts/bench_sampled_lambda.py's phishing Dirichlet cell); one that diverges stays above its start and climbs.
    Optionally (`EarlyStopping`) a run also stops once ``monitor`` (higher is better,
    e.g. test_accuracy) reaches ``target``, or after ``patience`` rounds without
    improving it by more than ``min_delta``.
    """

    rounds: int = 30
    tol: float | None = None
    tol_abs: float | None = None
    blowup: float = 1e4
    diverge_after: int | None = 5
    patience: int | None = None
    monitor: str = "test_accuracy"
    min_delta: float = 0.0
    target: float | None = None

    def status(self, record: dict, first: dict) -> str | None:
        """"diverged" on the stateless tests (non-finite, past ``blowup``), "converged" within tolerance, else None."""
        if self.blown_up(record, first):
            return "diverged"
        if "suboptimality" in record and (self.tol is not None or self.tol_abs is not None):
            if record["suboptimality"] <= self.threshold(record):
                return "converged"
        elif self.tol is not None and "grad_norm" in record and record["grad_norm"] <= self.tol * first["grad_norm"]:
            return "converged"
        return None

    def blown_up(self, record: dict, first: dict) -> bool:
        objective = record["objective"]
        return not math.isfinite(objective) or abs(objective) > self.blowup * max(1.0, abs(first["objective"]))

    def threshold(self, record: dict) -> float:
        """The suboptimality at which a record with a reference counts as converged: max(tol · |O*|, tol_abs)."""
        optimum = record["objective"] - record["suboptimality"]  # O*, exact to round-off near convergence
        relative = -math.inf if self.tol is None else self.tol * abs(optimum)
        return max(relative, -math.inf if self.tol_abs is None else self.tol_abs)

    def rule(self, record: dict) -> str | None:
        """The stopping test ``tol``/``tol_abs`` apply to runs whose records look like ``record``; None without one."""
        if "suboptimality" in record and (self.tol is not None or self.tol_abs is not None):
            parts = ([f"{self.tol:g} x |O*|"] if self.tol is not None else []) + \
                ([f"{self.tol_abs:g}"] if self.tol_abs is not None else [])
            return f"suboptimality <= {parts[0]}" if len(parts) == 1 else f"suboptimality <= max({', '.join(parts)})"
        if self.tol is None:
            return None
        return f"grad_norm <= {self.tol:g} x grad_norm at round 0"

    def stopped_by(self, status: str, record: dict, first: dict, records: list[dict] | None = None, *,
                   sampled: bool = False) -> str:
        """The test that ended a run with ``status`` on ``record`` (``first``: round 0's record): log and summary.

        At the round cap, with ``records`` (the run's, ``record`` last), it adds where the run was heading
        (`trend`): "rounds = 3700; suboptimality 2.1e-06 x |O*|, shrinking 0.9960x per round over the last 20
        rounds: about 1,300 more rounds to tol 1e-08 (try rounds=5100)", or "stalled", or "not contracting".
        """
        if status == "converged":
            return self.rule(record) or "converged"
        if status == "diverged":
            if not math.isfinite(record["objective"]):
                return "objective not finite"
            if self.blown_up(record, first):
                return f"|objective| > {self.blowup:g} x max(1, |objective at round 0|)"
            return f"objective above its round-0 value in {self.diverge_after} of the last {2 * self.diverge_after} rounds"
        if status == "max_rounds":
            trend = self.trend(records, first, sampled=sampled) if records else None
            return f"rounds = {self.rounds}" + (f"; {trend.describe(self.rounds)}" if trend is not None else "")
        if status == "target_reached":
            return f"{self.monitor} >= {self.target:g}"
        if status == "early_stopped":
            return f"{self.monitor} not better by {self.min_delta:g} for {self.patience} rounds"
        return status

    def measure(self, record: dict, first: dict) -> Measure | None:
        """What the tolerance tests in ``record``: the suboptimality (in units of |O*| where ``tol`` is relative)
        or the gradient norm (in units of round 0's), with the absolute value the run would stop at; None
        for records with neither."""
        if "suboptimality" in record:
            optimum = abs(record["objective"] - record["suboptimality"])
            relative = optimum > 0 and (self.tol is not None or self.tol_abs is None)
            target = self.threshold(record) if self.tol is not None or self.tol_abs is not None else None
            binding = "tol_abs" if self.tol_abs is not None and target == self.tol_abs else "tol"
            label = "" if target is None else f"{binding} {self.tol_abs if binding == 'tol_abs' else self.tol:g}"
            return Measure("suboptimality", record["suboptimality"], optimum if relative else 1.0,
                           " x |O*|" if relative else "", target, label)
        if "grad_norm" in record:
            start = first.get("grad_norm") or 0.0
            target = self.tol * start if self.tol is not None and start > 0 else None
            return Measure("grad_norm", record["grad_norm"], start if start > 0 else 1.0,
                           " x its round-0 value" if start > 0 else "", target,
                           "" if target is None else f"tol {self.tol:g}")
        return None

    def trend(self, records: list[dict], first: dict, *, sampled: bool = False) -> Trend | None:
        """`dane.records.projection`'s geometric fit to the last rounds of what `measure` reads (``sampled``: rounds of
        client sampling, fitted over the later half of the run); None when too few rounds have a positive finite
        value of it."""
        measure = self.measure(records[-1], first)
        fitted = None if measure is None else fit(records, measure.key, noisy=sampled)
        if fitted is None:
            return None
        rate, span, value = fitted  # value is records[-1]'s, the one measure shows (fit ends at the last record)
        round_off = measure.key == "suboptimality" and value <= ROUND_OFF * abs(records[-1]["objective"])
        return Trend(str(measure), value, rate, span, measure.target, measure.target_label, round_off)


@dataclass(frozen=True)
class Measure:
    """`StopRule.measure`: ``key``'s ``value``, shown as ``value / scale`` with ``unit``; ``target`` absolute."""

    key: str
    value: float
    scale: float
    unit: str
    target: float | None
    target_label: str

    def __str__(self) -> str:
        return f"{self.key} {self.value / self.scale:.1e}{self.unit}"


class DivergenceWatch:
    """`StopRule.diverge_after`'s state: which of the last 2 · ``diverge_after`` rounds ended above round 0's objective,
    and, once a record shows client sampling (``clients`` below ``comm.size``), their objectives (`StopRule`)."""

    def __init__(self, stop: StopRule, comm=None, *, patient: bool = False):
        self.stop, self.comm, self.patient = stop, comm, patient  # patient: `Algorithm.damps_itself`
        self.above: list[bool] = []  # the last rounds' verdicts, oldest first
        self.objectives: list[float] | None = None  # the last rounds' objectives, kept under client sampling only
        self.reason: str | None = None  # the sampled rule's line, once it has stopped the run (`why_stopped`)

    def sampled(self, record: dict) -> bool:
        """Whether ``record``'s round took part with fewer clients than the run has workers."""
        return "clients" in record and self.comm is not None and record["clients"] < self.comm.size

    def update(self, record: dict, first: dict) -> str | None:
        after = self.stop.diverge_after
        if after is None:
            return None
        self.above = [*self.above, record["objective"] > first["objective"]][-2 * after:]
        if self.objectives is None and not self.sampled(record) and not self.patient:
            return "diverged" if sum(self.above) >= after else None
        self.objectives = [*(self.objectives or []), record["objective"]][-2 * after:]
        older, newer = self.objectives[:after], self.objectives[after:]
        if len(self.objectives) == 2 * after and all(self.above) and sum(newer) > sum(older):
            why = (f"the rule under client sampling: {record['clients']} of {self.comm.size} clients a round"
                   if self.sampled(record) else "the rule for a method that raises its own damping")
            self.reason = (f"objective above its round-0 value in each of the last {2 * after} rounds and rising "
                           f"over them ({why})")
            return "diverged"
        return None

    def state_dict(self) -> dict:
        state = {"above": list(self.above)}
        return state if self.objectives is None else {**state, "objectives": list(self.objectives)}

    def load_state_dict(self, state: dict) -> None:
        above = state["above"]  # a count of rounds in a row in checkpoints written before the window
        self.above = [True] * above if isinstance(above, int) else list(above)
        self.objectives = list(state["objectives"]) if "objectives" in state else None


class MonitorError(ConfigError):
    """``early_stop.monitor`` names a key the run's records lack; raised at the first record, before it is written."""


class EarlyStopping:
    """The state behind `StopRule.patience` and `StopRule.target`: the best ``monitor`` value so far and its round."""

    def __init__(self, stop: StopRule):
        self.stop = stop
        self.best = -math.inf
        self.best_round: int | None = None
        self._checked = False

    def update(self, record: dict) -> str | None:
        if not self._checked:
            self._check_monitor(record)
        value = record.get(self.stop.monitor)
        if value is None or not math.isfinite(value):
            return None
        if self.stop.target is not None and value >= self.stop.target:
            return "target_reached"
        if value > self.best + self.stop.min_delta or self.best_round is None:
            self.best, self.best_round = max(value, self.best), record["round"]
        elif self.stop.patience is not None and record["round"] - self.best_round >= self.stop.patience:
            return "early_stopped"
        return None

    def _check_monitor(self, record: dict) -> None:
        """A misspelt monitor would never fire; the first record shows which keys there are."""
        self._checked = True
        if (self.stop.patience is None and self.stop.target is None) or self.stop.monitor in record:
            return
        keys = [k for k, v in record.items() if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "round"]
        close = difflib.get_close_matches(self.stop.monitor, keys, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise MonitorError(f"early_stop.monitor={self.stop.monitor} is not a key of this run's records; {hint}"
                           f"set it to one of: {', '.join(keys)}")

    def state_dict(self) -> dict:
        return {"best": self.best, "best_round": self.best_round}

    def load_state_dict(self, state: dict) -> None:
        self.best, self.best_round = state["best"], state["best_round"]


def _cost(comm) -> dict:
    return {"time_s": comm.elapsed(), "bytes_sent": comm.bytes_sent, "comm_rounds": comm.calls, **traffic_bits(comm)}


def _work_snapshot(comm, ledger: work.Ledger | None):
    """This worker's local work so far, taken where `_cost` is (a simulated thread posts it to its group)."""
    if ledger is None:
        return None
    snapshot = ledger.new_round()
    work.post(comm, snapshot)
    return snapshot


def restore_cost(comm, cost: dict) -> None:
    """Continue a communicator's counters and clock from a checkpoint's ``cost``."""
    comm.bytes_sent, comm.calls = int(cost["bytes_sent"]), int(cost["comm_rounds"])
    restore_traffic_bits(comm, cost)
    group = getattr(comm, "group", None)
    if group is not None:  # the simulator: its clock is the simulated parallel time
        group.clock = float(cost["time_s"])
    else:
        comm.restore_clock(float(cost["time_s"]))


def start_state(algo: Rounds, stop: StopRule) -> dict:
    """Round 0's state in the form ``on_checkpoint`` receives: ``run(algo, stop, resume=start_state(algo, stop))``
    is a fresh run (Horovod elastic commits it before the first round, `dane.loop.elastic`)."""
    return {"round": 0, "cost": _cost(algo.comm), "first": None, "early_stop": EarlyStopping(stop).state_dict(),
            "divergence": DivergenceWatch(stop).state_dict(), "algorithm": algo.state_dict()}


@dataclass(frozen=True)
class RunResult:
    """How `run` ended: this call's ``records``, the ``status``, the ``iterate`` the last record describes and
    ``stopped_by``, the test that ended the run (`StopRule.stopped_by`).  Unpacks as ``records, status``."""

    records: list[dict]
    status: str
    iterate: torch.Tensor
    stopped_by: str

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
    window and ``algo.state_dict()``.  Only the records of this call are returned
    (`RunResult`), with the iterate the last record describes (w_t when a stop rule fired
    on round t's own metrics; on a round DANE's safeguard rejected, and at the end on a trial it would
    reject, the records describe the last accepted iterate instead, and so does the iterate returned) and the test that ended the run.  The algorithm is
    only stepped and evaluated: nothing is set on it.

    ``keep_records=False`` keeps only the last record (and round 0's, for the stop tests): a simulated worker other
    than rank 0, whose records are rank 0's and whose summary nobody reads (`dane.loop.worker.run_worker`), so that m
    simulated workers hold the run's records once, not m times (about 0.8 KB a round each).

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
    else:
        ledger = work.ledger_for(comm, algo.problem) if isinstance(algo, Algorithm) else None
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
    start, cost, first = 0, _cost(comm), None
    if resume is not None:
        algo.load_state_dict(resume["algorithm"])
        watch.load_state_dict(resume["early_stop"])
        rising.load_state_dict(resume.get("divergence", {"above": 0}))  # checkpoints from before the rule: 0
        restore_cost(comm, resume["cost"])
        start, cost, first = resume["round"], resume["cost"], resume["first"]
        if ledger is not None:
            ledger.load_state_dict(resume.get("work"), comm.size)  # checkpoints from before the counters: zero
    return rounds_from(algo, stop, on_round, ledger, watch, rising, parking, start, cost, first, [],
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
        metrics = algo.step() if t < stop.rounds else algo.evaluate()  # a parked worker raises `Parked`
        done = work.reduce_over_workers(comm, snapshot) if ledger is not None else None
        record = {"round": t, **cost, **metrics, **(done or {}), **spent}
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
                           "divergence": rising.state_dict(), "algorithm": algo.state_dict(),
                           **({"work": work.checkpoint_state(comm, ledger, snapshot)} if ledger is not None else {})})
        t += 1
    # A run stopped by a round's metrics has already moved past the iterate they describe; a safeguard's rejected
    # start is described by the last accepted iterate (`Rounds.described_iterate`).
    iterate = algo.described_iterate(w_t).detach().clone()
    result = RunResult(records, status, iterate, why_stopped(algo, stop, status, records, first, rising))
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
    done = algo.finished
    if records and done is not None and status == done[0]:
        measure = stop.measure(records[-1], first)
        return done[1] + ("" if measure is None else f"; {measure}" +
                          (f", above {measure.target_label}" if measure.target_label else ""))
    sampled = divergence is not None and bool(records) and divergence.sampled(records[-1])
    said = stop.stopped_by(status, records[-1], first, records, sampled=sampled) if records else status
    extra = algo.diagnosis(records) if status == "max_rounds" and records else None
    return f"{said}; {extra}" if extra else said


def finished(algo: Rounds) -> str | None:
    """The status an algorithm whose answer is final ends the run with (its ``finished``: (status, why)), else None."""
    done = algo.finished
    return None if done is None else done[0]

