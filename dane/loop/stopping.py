"""When a run stops: the stop rule (a round cap, a target, a blow-up), the divergence watch and early stopping on a
monitored metric, each a small state the round loop (`dane.loop.runner.run`) updates after every record."""
from __future__ import annotations

import difflib
import math
from dataclasses import dataclass

from ..errors import ConfigError, plural
from ..records.projection import ROUND_OFF, Trend, fit, improved

#: what ``rounds=0`` runs: round 0's record of w_0 and no step
ROUNDS_ZERO = "only evaluate w_0"


@dataclass(frozen=True)
class StopRule:
    """Stop after ``rounds`` rounds, once the run is within ``tol`` of the optimum, or once it diverges.

    Within ``tol`` (relative, so it does not change when the objective is scaled):
    with a reference optimum (``problem.optimum``, `dane.problems.optimum`) the suboptimality
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
    Optionally (`EarlyStopping`) a run also stops once ``monitor`` reaches ``target``, or after ``patience``
    rounds without improving it by more than ``min_delta``: higher is better under ``mode`` ``max`` (e.g.
    test_accuracy), lower under ``min`` (test_loss).
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
    mode: str = "max"

    def status(self, record: dict, first: dict) -> str | None:
        """"diverged" on the stateless tests (non-finite, past ``blowup``), "converged" within tolerance, else None.
        The gradient test (no reference optimum) with ``tol`` >= 1 is refused in one line at the first record, before
        it is written: it holds at round 0 whatever the run, which would stop "converged" having done nothing (with a
        reference, a relative suboptimality above 1 is a test that can fail: tol >= 1 is taken)."""
        if self.blown_up(record, first):
            return "diverged"
        if "suboptimality" in record and (self.tol is not None or self.tol_abs is not None):
            if record["suboptimality"] <= self.threshold(record):
                return "converged"
        elif self.tol is not None and "grad_norm" in record:
            if self.tol >= 1:
                raise ConfigError(f"tol={self.tol:g} would stop this run at round 0, having done nothing: without a "
                                  "reference optimum its test is grad_norm <= tol x grad_norm at round 0, which holds "
                                  "there for any tol >= 1; set tol below 1, or measure the suboptimality, which "
                                  "problem.optimum=auto gives where the problem can solve for it")
            if record["grad_norm"] <= self.tol * first["grad_norm"]:
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

    def unapplied(self, record: dict) -> str | None:
        """Why ``tol_abs`` tests nothing in runs whose records look like ``record``: it bounds the suboptimality,
        which a run without a reference optimum does not measure; None where it applies or is not set."""
        if self.tol_abs is None or "suboptimality" in record:
            return None
        return (f"tol_abs {self.tol_abs:g} not applied: the run has no reference optimum to measure the "
                "suboptimality by, which problem.optimum=auto gives where the problem can solve for it")

    def counted_divergence(self) -> str | None:
        """The line of ``diverge_after``'s count test (a run above its start in that many of twice as many rounds),
        the one test a method that overshoots and falls back can trip; None under ``diverge_after=null`` (no count
        test)."""
        if self.diverge_after is None:
            return None
        return f"objective above its round-0 value in {self.diverge_after} of the last {2 * self.diverge_after} rounds"

    def stopped_by(self, status: str, record: dict, first: dict, records: list[dict] | None = None, *,
                   sampled: bool = False) -> str:
        """The test that ended a run with ``status`` on ``record`` (``first``: round 0's record): log and summary.

        At the round cap, with ``records`` (the run's, ``record`` last), it adds where the run was heading
        (`trend`): "rounds = 3700; suboptimality 2.1e-06 x |O*|, shrinking 0.9960x per round over the last 20
        rounds: about 1,300 more rounds to tol 1e-08 (try rounds=5100)", or "stalled", or "not contracting"; a
        gradient norm that is flat or growing while the objective or a test metric improved: those changes first
        ("objective 2.333 -> 1.370 ... over the last 2 rounds; grad_norm 1.0e+00 x its round-0 value, flat").
        """
        if status == "converged":
            return self.rule(record) or "converged"
        if status == "diverged":
            if not math.isfinite(record["objective"]):
                return "objective not finite"
            if self.blown_up(record, first):
                return f"|objective| > {self.blowup:g} x max(1, |objective at round 0|)"
            return self.counted_divergence() or status
        if status == "max_rounds":
            trend = self.trend(records, first, sampled=sampled) if records else None
            unapplied = self.unapplied(record)
            return f"rounds = {self.rounds}" + (f"; {trend.describe(self.rounds)}" if trend is not None else "") + \
                (f"; {unapplied}" if unapplied else "")
        if status == "target_reached":
            return f"{self.monitor} {'>=' if self.mode == 'max' else '<='} {self.target:g}"
        if status == "early_stopped":
            return f"{self.monitor} not better by {self.min_delta:g} for {plural(self.patience, 'round')}"
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
        if measure.key == "suboptimality":
            floor, whose = ROUND_OFF * abs(records[-1]["objective"]), "the objective's"
        else:  # the gradient norm, whose terms at round 0 set its scale
            floor, whose = ROUND_OFF * (first.get("grad_norm") or 0.0), "the gradient's"
        # a gradient norm is no progress measure on its own (a network's rises as its loss falls): what else moved
        progress = improved(records, span) if measure.key == "grad_norm" else ""
        return Trend(str(measure), value, rate, span, measure.target, measure.target_label,
                     whose if value <= floor else "", progress)


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
        sign = 1.0 if self.stop.mode == "max" else -1.0  # ``best`` is kept as sign x value: higher is better
        if self.stop.target is not None and sign * value >= sign * self.stop.target:
            return "target_reached"
        value = sign * value
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
        return {"best": self.best, "best_round": self.best_round, "mode": self.stop.mode}

    def load_state_dict(self, state: dict) -> None:
        """The best so far, where the resumed run watches it the same way (``mode``, which a resume may change: then
        the watch starts afresh at the resumed round)."""
        if state.get("mode", "max") == self.stop.mode:
            self.best, self.best_round = state["best"], state["best_round"]
