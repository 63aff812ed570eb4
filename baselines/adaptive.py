r"""What adapts during a federated run: wrappers around a round, each switchable on its own and recorded when it fires.

A `baselines.federated.Federated` method's ``round`` is its paper's round.  Its ``step`` runs the round, then each
of its adaptations in order, as optax's ``apply_if_finite`` wraps an update: an adaptation reads the round's record
(and the method's state), may change a number the method holds (a proximal weight, the extrapolation's A, B, v) or
declare the run finished, and returns what it did as events (`dane.records.results.adaptation`), which the round's
record carries under ``adapted``.  A method's config attaches an adaptation only where it applied before this module
existed (a weight the user left ``null``, full participation, a convex problem ...), lists them in
``algorithm.adapt`` (null: every one that applies; ``[]``: none; only the method's own, its config's
``adaptation_names``) and attaches none with ``algorithm.paper=true`` but
those that keep a condition of the paper's round (`PAPER_CONDITIONS`).

- ``double_weight`` (`WeightDoubling`, `CyclingObjective`): a default proximal weight doubles, up to δ_A, when the
  objective climbs, cycles or the steps settle into an overshoot (full participation, convex);
- ``restart`` (`Restart`): Acc-S-DANE's extrapolation restarts (A = 0, B = 1, v = x) after a round whose objective
  rose or whose λ doubled: the function-value adaptive restart of O'Donoghue & Candès (2015);
- ``sampling_floor`` (`FloorStop`, `SamplingFloor`): a sampled run of a method without a fixed point at the optimum
  ends with status ``sampling_floor`` once its objective stops improving;
- ``client_drift`` (`DriftStop`): a full-participation FedProx run ends with status ``client_drift`` once the
  clients' moves cancel in the average;
- ``rho_refresh`` (`RHO_REFRESH`, `refresh_due`): ADMM re-estimates an estimated ρ of a non-quadratic loss from the
  local Hessians at z at rounds `REFRESH_FIRST`, 2 `REFRESH_FIRST`, 4 `REFRESH_FIRST` ...; ADMM's residual balancing
  (`RESIDUAL_BALANCE`, ``algorithm.adaptive_rho``) is Boyd et al.'s (2011, section 3.4.1), the paper's method,
  named among the attached but not by ``algorithm.adapt``;
- ``tau_growth`` (`GROW_TAU`, `grown_tau`) and ``momentum_restart`` (`MOMENTUM_RESTART`): AIDE at ``tau=auto``
  grows τ after a round that failed its subproblem (and restarts the momentum with it), and restarts the momentum
  (y = w_t) where the objective rose;
- ``local_retry`` (`LocalRetry`): S-DANE's and Acc-S-DANE's iterative local solve (cg, svrg, lbfgs) whose x_i fails
  the paper's accuracy test is solved again with a tighter setting.  It acts inside the round, which the paper states
  with the test holding (how a solver meets it is this package's rule), so ``algorithm.paper=true`` keeps it
  (`PAPER_CONDITIONS`); ``algorithm.adapt`` without it leaves a failed solve as it is (the record's ``local_failed``).
  Its count travels with the local work, outside the method's messages, and its event is read from the next record's
  work (`read_work`: `dane.algorithm.Rounds.read_work`), which the round loop puts first in that record's ``adapted``.

ADMM's and AIDE's act inside their own ``step`` (a refresh before the round's solve, a growth before the round's
subproblem), which puts their events in the round's record: the names below (`RHO_REFRESH` ...) are what the method's
``adaptations`` hold for the summary's ``adaptations_attached``.

The constants are these rules' tuning constants (this package's, chosen on ``make bench``'s ``defaults`` and
``federated`` sections and the runs the tests name).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dane import checks
from dane.errors import ConfigError
from dane.numerics.local_solvers import LBFGS_MAX_ITER, LocalSolver, svrg_moved
from dane.numerics.svrg import PASSES_AUTO
from dane.records.results import adaptation
from dane.safeguard_rules import accepts, step_ratio_and_cosine

from .defaults import local_step

#: `SamplingFloor`: a sampled run whose objective has not improved on its best for this many rounds (and for half the
#: rounds it took to reach that best) is at its floor
FLOOR_ROUNDS = 10
#: the window (rounds) over which `CyclingObjective` compares the objective's swing with its progress
CYCLE_ROUNDS = 10
#: `CyclingObjective`: this many rounds in a row whose step turns back on the last one (cosine below −this) ...
ALTERNATING_COSINE = 0.9
ALTERNATING_ROUNDS = 4
#: ... while shrinking by less than this factor overshoot
ALTERNATING_RATIO = 0.8
#: `DriftStop`: the fall of ρ_t = ‖w_{t+1} − w_t‖ / mean_i ‖w_i − w_t‖ from ρ_0 at which a run is at its fixed point
FIXED_POINT = 1e-3
#: `stalled`: the share of a run's objective decrease its last quarter of rounds may make for it to have stalled
STALLED = 1e-3
#: `LocalRetry`: S-DANE's re-solves (`baselines.defaults.tighter`) of an iterative local solve whose result fails the
#: accuracy test (not swept)
LOCAL_RETRIES = 3
#: `refresh_due`: the first round at which ADMM re-estimates an estimated ρ from the local Hessians at z (then 16, 32
#: ...: re-estimates logarithmic in the run's length, as ADMM's convergence proof wants ρ fixed; not swept)
REFRESH_FIRST = 8
#: `grown_tau`: AIDE's τ after a round that failed its subproblem, this times max(τ, λ) (not swept)
TAU_GROWTH = 4.0
#: the names ``algorithm.adapt`` takes (the federated methods')
ADAPTATIONS = ("double_weight", "restart", "sampling_floor", "client_drift", "local_retry")
#: the adaptations that keep a condition the paper's round states, attached under ``algorithm.paper=true`` as well
PAPER_CONDITIONS = ("local_retry",)


class SamplingFloor:
    """The rounds since the global objective last improved on its best.  `update` says the run is at its floor once
    it has not improved for max(`FLOOR_ROUNDS`, half the best's round) rounds: under client sampling a method without
    a fixed point at the optimum (the sampled gradient mean_S ∇O_i(w*) is not zero when the shards differ) then
    oscillates about a floor, and on label-skewed shards it can climb from there and diverge."""

    def __init__(self) -> None:
        self.best, self.best_round, self.rounds = math.inf, 0, 0

    def update(self, objective: float) -> bool:
        """Round ``rounds``'s objective in; whether the run is at its floor."""
        if objective < self.best:
            self.best, self.best_round = objective, self.rounds
        self.rounds += 1
        return self.rounds - 1 - self.best_round >= max(FLOOR_ROUNDS, self.best_round // 2)

    def state_dict(self) -> dict:
        return {"best": self.best, "best_round": self.best_round, "rounds": self.rounds}

    def load_state_dict(self, state: dict) -> None:
        self.best, self.best_round, self.rounds = float(state["best"]), int(state["best_round"]), int(state["rounds"])


class CyclingObjective:
    r"""When a proximal weight should double, up to ``ceiling`` (δ_A, the theory's weight): the objective climbs,
    cycles, or (given the iterates) the steps settle into an overshoot.  `trigger` names the last reason.

    It climbs when it exceeds every objective since the weight last changed (round 0's at first).  Over the last
    `CYCLE_ROUNDS` rounds' objectives f, the swing is max f − min f and the progress is how far min f fell below the
    best objective before them; the objective cycles when the swing exceeds twice the progress.  Both compare beyond
    ``rtol`` of round-off (`dane.safeguard.accepts`).  An objective that falls every round neither climbs nor cycles,
    nor does one whose bumps are small against its descent.  Given the iterates, the weight also doubles when
    `ALTERNATING_ROUNDS` steps in a row turn back on the one before (cosine below −`ALTERNATING_COSINE`) while
    shrinking by less than `ALTERNATING_RATIO` (`dane.safeguard.step_ratio_and_cosine`).

    This package's rule: the default weight is measured at w_0, where the theory asks for λ ≥ δ along the whole path;
    where a client holds fewer rows than the dimension the dissimilarity against the curvature grows on the way to
    the optimum, and the local solves overshoot and cycle (tests/test_prox_weight_rule.py's one-hot shards).  The
    objective read is the one that already rides in each round's first allreduce (no communication)."""

    def __init__(self, active: bool = True, ceiling: float = math.inf, rtol: float = 1e-12) -> None:
        self.active, self.ceiling, self.rtol = active, ceiling, rtol
        self.high: float | None = None  # the highest objective since the weight last changed (round 0's at first)
        self.before, self.window = math.inf, []  # the best objective before the window; the window's objectives
        self.point: torch.Tensor | None = None  # the last iterate, its step, and the overshooting steps in a row
        self.step: torch.Tensor | None = None
        self.alternating = 0
        self.trigger = ""

    def next_weight(self, weight: float, objective: float, point: torch.Tensor | None = None) -> float:
        """The weight of the next round, given this round's weight, the objective at the round's start and, to read
        overshoot from, the round's new iterate."""
        if not self.active:
            return weight
        if point is not None and self.overshoots(point):
            return self.doubled(weight, objective, "overshoot")
        if self.high is not None and not accepts(objective, self.high, self.rtol):
            return self.doubled(weight, objective, "climb")  # above every objective since the weight last changed
        self.high = objective if self.high is None else self.high
        self.window.append(objective)
        if len(self.window) > CYCLE_ROUNDS:
            self.before = min(self.before, self.window.pop(0))
        if len(self.window) < CYCLE_ROUNDS or not math.isfinite(self.before):
            return weight
        low, high = min(self.window), max(self.window)
        if high - low <= 2.0 * (self.before - low) or accepts(high, low, self.rtol):
            return weight
        return self.doubled(weight, objective, "cycle")

    def overshoots(self, point: torch.Tensor) -> bool:
        """Whether the step to ``point`` makes `ALTERNATING_ROUNDS` slow steps in a row that turn back."""
        step = None if self.point is None else point - self.point
        previous, self.point, self.step = self.step, point.clone(), step
        if step is None or previous is None:
            return False
        step_sq = float(step @ step)
        if step_sq == 0.0 or float(previous @ previous) == 0.0:
            self.alternating = 0
            return False
        ratio, cosine = step_ratio_and_cosine(step, previous, step_sq)
        self.alternating = self.alternating + 1 if ratio > ALTERNATING_RATIO and cosine < -ALTERNATING_COSINE else 0
        return self.alternating >= ALTERNATING_ROUNDS

    def doubled(self, weight: float, objective: float, trigger: str = "") -> float:
        """2 × ``weight``, at most the ceiling; the window starts again, under the highest objective it held."""
        self.before, self.high = min([self.before, *self.window, objective]), max([objective, *self.window])
        self.window, self.alternating, self.trigger = [], 0, trigger
        return max(weight, min(2.0 * weight, self.ceiling))

    def state_dict(self) -> dict:
        return {"active": self.active, "ceiling": self.ceiling, "high": self.high, "before": self.before,
                "window": list(self.window), "point": self.point, "step": self.step, "alternating": self.alternating}

    def load_state_dict(self, state: dict) -> None:
        self.active, self.ceiling, self.high = bool(state["active"]), float(state["ceiling"]), state["high"]
        self.before = float(state["before"])
        self.window = [float(f) for f in state["window"]]
        self.point, self.step = state.get("point"), state.get("step")  # absent in checkpoints from before the test
        self.alternating = int(state.get("alternating", 0))


class Adaptation:
    """One wrapper of a round (module docstring): `after` each round; ``finished`` ends the run; ``damps``: it raises
    the method's damping when the objective rises (`dane.algorithm.Rounds.damps_itself`)."""

    name = ""
    damps = False
    finished: tuple[str, str] | None = None

    def after(self, algo, out: dict) -> list[dict]:
        """Act on round ``out`` of ``algo``; the events it fired."""
        raise NotImplementedError

    def read_work(self, t: int, work: dict[str, float]) -> list[dict]:
        """The events record ``t``'s local work over the workers tells of (`dane.algorithm.Rounds.read_work`); none
        by default."""
        return []

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class WeightDoubling(Adaptation):
    """``double_weight``: the proximal weight ``attr`` (``algorithm.<attr>``) doubles by `CyclingObjective`; ``point``:
    it also reads the overshoot off the round's new iterate (S-DANE's and FedDANE's x).  ``smoothness``: max_i L_i
    where the method's local gradient steps at ``lr`` null are 1/(max_i L_i + the weight)
    (`baselines.defaults.local_step`; S-DANE's and FedDANE's ``local_solver=steps``), which then follow the weight:
    each doubling also records that step's move (``algorithm.lr``, trigger "<attr> moved (local_step)"), as
    `dane.dane.DANE.rederived` records the local solve's nulls that follow μ; 0: no step reads the weight.
    ``solver``: the SVRG local solve (``local_solver=svrg``, or ``problem`` where the problem's solver is SVRG; None:
    another) whose null step and ``passes=auto`` (`dane.numerics.svrg.svrg_step`, `dane.numerics.svrg.svrg_passes`,
    each solve's own at the weight it is given) follow the weight too: each doubling records each that moved on this
    worker's rows (``problem.svrg_lr``, ``problem.svrg_passes``, trigger "<attr> moved (svrg_step)" or "(svrg_passes)",
    ``workers``: this worker's [rank, from, to], as the summary's ``defaults`` give them at the starting weight;
    `dane.numerics.local_solvers.svrg_moved`)."""

    name, damps = "double_weight", True

    def __init__(self, attr: str, ceiling: float, *, point: bool = False, smoothness: float = 0.0,
                 solver: LocalSolver | None = None) -> None:
        self.attr, self.point, self.rule = attr, point, CyclingObjective(True, ceiling=ceiling)
        self.smoothness, self.solver = smoothness, solver

    def after(self, algo, out: dict) -> list[dict]:
        before = getattr(algo, self.attr)
        after = self.rule.next_weight(before, out["objective"], algo.w if self.point else None)
        if after == before:
            return []
        setattr(algo, self.attr, after)
        events = [adaptation(f"algorithm.{self.attr}", before, after, self.rule.trigger)]
        if self.smoothness:  # the local steps' 1/(max_i L_i + weight) moves with the weight
            events.append(adaptation("algorithm.lr", local_step(self.smoothness, before),
                                     local_step(self.smoothness, after), f"{self.attr} moved (local_step)"))
        if self.solver is not None:  # SVRG's null step and passes=auto, re-derived at the weight each solve is given
            events += [adaptation(key, old, new, f"{self.attr} moved ({rule})", workers=[[algo.comm.rank, old, new]])
                       for _, key, rule, old, new in svrg_moved(algo.local_problem, self.solver, before, after)]
        return events

    def state_dict(self) -> dict:
        return {"cycling": self.rule.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if "cycling" in state:
            self.rule.load_state_dict(state["cycling"])


class Restart(Adaptation):
    """``restart``: Acc-S-DANE's A = 0, B = 1, v = x after a round whose objective rose above the last round's or
    whose λ changed (after `WeightDoubling`): O'Donoghue & Candès' (2015) function-value adaptive restart."""

    name = "restart"

    def __init__(self) -> None:
        self.last_objective: float | None = None

    def after(self, algo, out: dict) -> list[dict]:
        objective, events = out["objective"], []
        rose = self.last_objective is not None and objective > self.last_objective
        if rose or algo.lam != out["lam"]:
            events = [adaptation("algorithm.A", algo.A, 0.0, "objective rose" if rose else "lam changed")]
            algo.A, algo.B, algo.v = 0.0, 1.0, algo.w.clone()
        self.last_objective = objective
        return events

    def state_dict(self) -> dict:
        return {"last_objective": self.last_objective}

    def load_state_dict(self, state: dict) -> None:
        self.last_objective = state.get("last_objective")


class FloorStop(Adaptation):
    """``sampling_floor``: once `SamplingFloor` says a sampled run is at its floor, the run ends with status
    ``sampling_floor`` and the method's `floor_diagnosis`."""

    name = "sampling_floor"

    def __init__(self) -> None:
        self.floor = SamplingFloor()

    def after(self, algo, out: dict) -> list[dict]:
        if self.finished is None and self.floor.update(out["objective"]):
            self.finished = ("sampling_floor", algo.floor_diagnosis(self.floor))
            return [adaptation("status", "running", "sampling_floor", "no progress")]
        return []

    def state_dict(self) -> dict:
        return {"floor": self.floor.state_dict(), "at_floor": None if self.finished is None else self.finished[1]}

    def load_state_dict(self, state: dict) -> None:
        if "floor" in state:
            self.floor.load_state_dict(state["floor"])
            self.finished = None if state["at_floor"] is None else ("sampling_floor", state["at_floor"])


class DriftStop(Adaptation):
    """``client_drift``: once ρ_t = ‖w_{t+1} − w_t‖ / mean_i ‖w_i − w_t‖ is at most `FIXED_POINT` × ρ_0, the run ends
    with status ``client_drift`` (FedProx under full participation; the method puts (‖w_{t+1} − w_t‖,
    mean_i ‖w_i − w_t‖) in ``algo.moves`` each round).  This package's rule: on identical shards ρ_t = 1 to the
    optimum, on differing shards it falls to 0 at FedProx's biased fixed point, where every client still moves."""

    name = "client_drift"

    def __init__(self) -> None:
        self.first_ratio: float | None = None

    def after(self, algo, out: dict) -> list[dict]:
        moved, client_moves = algo.moves
        if self.finished is not None or not client_moves > 0:
            return []
        ratio = moved / client_moves
        if self.first_ratio is None:
            self.first_ratio = ratio
            return []
        if ratio > FIXED_POINT * self.first_ratio:
            return []
        self.finished = ("client_drift", f"client drift: the clients' local moves cancel in the average "
                                         f"({ratio / self.first_ratio:.1e} of round 0's share), so w no longer moves "
                                         f"although no client is at its optimum; {algo.fixed_point()}")
        return [adaptation("status", "running", "client_drift", "moves cancel")]

    def state_dict(self) -> dict:
        return {"first_ratio": self.first_ratio, "stalled": None if self.finished is None else self.finished[1]}

    def load_state_dict(self, state: dict) -> None:
        self.first_ratio = state.get("first_ratio")
        self.finished = None if state.get("stalled") is None else ("client_drift", state["stalled"])


class LocalRetry(Adaptation):
    r"""``local_retry``: a local solve by ``solver`` (cg, svrg or lbfgs) whose x_i fails S-DANE's accuracy test
    ‖∇F_i(x_i)‖ ≤ (λ/2)‖x_i − centre‖ is solved again with `baselines.defaults.tighter`'s setting, at most ``limit``
    (`LOCAL_RETRIES`) times (the method's `local_solve` asks `limit`).

    Each re-solve counts one ``local_resolves`` on its client's ledger (`dane.work`), whose table rides with the next
    round's first allreduce outside ``bytes_sent``, ``comm_rounds`` and the bits: the method sends what the paper's
    round sends.  So the re-solves of round t reach rank 0 with record t + 1 (the record whose local work counts
    them), and `read_work` makes their event there, carrying ``round`` t (`retry_event`).  The sum and the largest
    per-client total over the run are what that table gives: the event counts the round's re-solves, and does not
    say how many clients re-solved, how deep the deepest went, or which still failed (each worker's record keeps its
    own ``local_failed``)."""

    name = "local_retry"

    def __init__(self, solver: LocalSolver, limit: int = LOCAL_RETRIES) -> None:
        self.solver, self.limit = solver, limit
        self.seen = 0.0  # the re-solves the last record counted (rank 0's)

    def after(self, algo, out: dict) -> list[dict]:
        return []  # the round's re-solves come with the next record's local work

    def read_work(self, t: int, work: dict[str, float]) -> list[dict]:
        resolves, self.seen = work["local_resolves"] - self.seen, work["local_resolves"]
        return retry_event(self.solver, round(resolves), t - 1)

    def state_dict(self) -> dict:
        return {"resolves_seen": self.seen}

    def load_state_dict(self, state: dict) -> None:
        self.seen = float(state.get("resolves_seen", 0.0))  # checkpoints from before the count: none seen


def retried_setting(solver: LocalSolver, resolves: int) -> tuple[str, Any, Any]:
    """(key, given, after ``resolves`` re-solves) of the setting `baselines.defaults.tighter` moves: SVRG's passes,
    doubled each time (``auto``: "2^k x auto", each worker's own); a fixed count's iterations (tolerance 0: CG's
    products per system, L-BFGS's iterations, null: `LBFGS_MAX_ITER`), doubled; else the tolerance, divided by 100."""
    if solver.method == "svrg":
        if solver.passes == PASSES_AUTO:
            return "problem.svrg_passes", PASSES_AUTO, f"{2 ** resolves} x {PASSES_AUTO}"
        return "problem.svrg_passes", int(solver.passes), int(solver.passes) * 2 ** resolves
    if solver.tol == 0 and solver.method in ("cg", "lbfgs"):
        given = solver.max_iter or LBFGS_MAX_ITER
        return "problem.local_max_iter", given, given * 2 ** resolves
    return "problem.local_tol", solver.tol, solver.tol / 100 ** resolves


def retry_event(solver: LocalSolver, resolves: int, round_: int) -> list[dict]:
    """Round ``round_``'s ``local_retry`` event from its ``resolves`` over the clients: the setting every re-solve
    moved to at least (the first's, `retried_setting`; a client's further re-solves tighten it again) and the
    re-solves; none where there were none."""
    if resolves <= 0:
        return []
    key, given, after = retried_setting(solver, 1)
    return [adaptation(key, given, after, "accuracy test", round=round_, resolves=resolves)]


class Named:
    """An adaptation a method runs inside its own ``step``, which records its events: its name alone."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Named({self.name!r})"


#: ADMM's re-estimate of ρ (`refresh_due`), off under ``algorithm.paper=true``
RHO_REFRESH = Named("rho_refresh")
#: ADMM's residual balancing (``adaptive_rho``: Boyd et al. 2011, section 3.4.1, the paper's)
RESIDUAL_BALANCE = Named("residual_balance")
#: AIDE's τ growth (`grown_tau`) and momentum restart at ``tau=auto``, off under ``algorithm.paper=true``
GROW_TAU = Named("tau_growth")
MOMENTUM_RESTART = Named("momentum_restart")


def refresh_due(t: int) -> bool:
    """Whether ADMM's round ``t`` starts with a re-estimate of ρ: t a power of two, at least `REFRESH_FIRST` (8, 16,
    32, ...).  This package's rule (`baselines.admm` says why)."""
    return t >= REFRESH_FIRST and t & (t - 1) == 0


def grown_tau(tau: float, strong_convexity: float, mean_curvature: float) -> float:
    """AIDE's τ after a round that failed its subproblem: `TAU_GROWTH` · max(τ, λ), or · the mean column curvature
    where both are 0: Catalyst's adaptive smoothing (4WD-Catalyst-Automatic, Paquette et al. 2018) with this package's
    factor."""
    return TAU_GROWTH * (max(tau, strong_convexity) or mean_curvature)


def stalled(objectives: list[float]) -> bool:
    """Whether the last quarter of ``objectives`` moved the objective by at most `STALLED` of the run's whole
    decrease (at least 8 of them; FedProx's round-cap diagnosis)."""
    if len(objectives) < 8:
        return False
    total, late = objectives[0] - objectives[-1], objectives[-(len(objectives) // 4) - 1] - objectives[-1]
    return total > 0 and abs(late) <= STALLED * total


@dataclass(frozen=True)
class AdaptKeys:
    """The ``algorithm.*`` keys that say which adaptations a run may attach: ``paper`` and ``adapt`` (module
    docstring), ``adapt``'s names one of the config's `adaptation_names`."""

    paper: bool = False   # true: the paper's method as stated: nulls resolved at the start and frozen, no adaptation
    #                       but those that keep the paper's conditions (`PAPER_CONDITIONS`)
    adapt: tuple | None = None  # the adaptations that may act (null: each one that applies; []: none)
    adaptation_names = ADAPTATIONS  # the names ``adapt`` takes: the method's own (those its ``build`` may attach)

    def check_policy(self) -> None:
        checks.boolean("algorithm.paper", self.paper)
        if self.adapt is not None:
            if isinstance(self.adapt, str) or not isinstance(self.adapt, Sequence):  # 0, 1e308, one bare name
                names = f"[{', '.join(self.adaptation_names)}] or some of them, " if self.adaptation_names else ""
                raise ConfigError(f"algorithm.adapt must be a list of algorithm={self.name}'s adaptation names ({names}"
                                  f"[] for none, null for each that applies), got {self.adapt!r}")
            object.__setattr__(self, "adapt", tuple(self.adapt))
            if self.adapt and not self.adaptation_names:
                raise ConfigError(f"algorithm={self.name} has no adaptation, got algorithm.adapt={list(self.adapt)}; "
                                  f"set algorithm.adapt=[] or null")
            for name in self.adapt:
                checks.one_of("algorithm.adapt[]", name, self.adaptation_names)
            extra = [name for name in self.adapt if name not in PAPER_CONDITIONS]
            if self.paper and extra:
                raise ConfigError(f"algorithm.paper=true runs no adaptation but {', '.join(PAPER_CONDITIONS)}, got "
                                  f"algorithm.adapt={list(self.adapt)}; set one of them")

    def allows(self, name: str) -> bool:
        """Whether adaptation ``name`` may be attached (`chosen`)."""
        return chosen(self.adapt, self.paper, name)


def chosen(adapt, paper: bool, name: str) -> bool:
    """Whether adaptation ``name`` may be attached: ``algorithm.adapt`` null or naming it, and ``algorithm.paper`` off
    or ``name`` one of the `PAPER_CONDITIONS`."""
    return (adapt is None or name in adapt) and (not paper or name in PAPER_CONDITIONS)
