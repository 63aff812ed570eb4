"""What the federated DANE line shares: client sampling, the participants' traffic, and the local solve.

Every method of the line (`baselines.fedprox`, `scaffold`, `scaffnew`, `feddane`, `sdane`, `fedred`)
is a `Federated` algorithm: its round draws the clients S_t from the shared `dane.sampling.ClientSampler`,
averages over them with `dane.sampling.sampled_mean` (the metrics of the round's starting iterate ride
in the first allreduce from every worker), and counts the participants' uplink and downlink bytes
(`dane.sampling.Traffic`).  A local solve of

.. math:: \\min_w\\; O_i(w) - \\langle \\ell, w\\rangle + \\frac{\\mu}{2}\\|w - a\\|^2

is ``local_solver``: ``problem`` (the problem's own: the exact Cholesky solve on a quadratic, Newton
on a GLM, the inner torch optimizer on a network, `dane.inner`), one of the package's convex solvers
(``cholesky``, ``cg``, ``svrg``, ``lbfgs``: `dane.local_solvers`), or ``steps``: ``local_steps``
gradient steps from the anchor with step ``lr`` (null: 1/(max_i L_i + μ), the L_i by local Lanczos
and one allreduce of an m-vector before round 0, as `baselines.local_sgd`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dane import checks
from dane.algorithm import Algorithm, Column
from dane.comm import Communicator
from dane.errors import ConfigError
from dane.local_solvers import LocalSolver
from dane.problems import Problem
from dane.safeguard import accepts, step_ratio_and_cosine
from dane.sampling import ClientSampler, SamplingKeys, Traffic, sampled_mean
from dane.similarity import hessian_dissimilarity as measured_dissimilarity

from .metrics import global_metrics, local_payload, logs_gradient
from .spectral import largest_local_smoothness

FED_SOLVERS = ("problem", "steps", "cholesky", "cg", "svrg", "lbfgs")
DISSIMILARITY_FLOOR = 1e-6  # δ_A at least this times ‖H‖ (identical shards: δ_A = 0, and λ = 0 is no regularizer)


def hessian_dissimilarity(problem: Problem, comm: Communicator, key: str, *, gap: bool = False) -> dict:
    r"""`dane.similarity.hessian_dissimilarity` of the local Hessians at w_0 (exact for d ≤ 512: two allreduces, the
    d x d Hessians then an m-vector; Lanczos beyond), counted as this run's communication, with ``delta_a`` =
    max(δ_A, `DISSIMILARITY_FLOOR`·‖H‖), δ_A = sqrt(mean_i ‖H_i − H‖₂²).  ``gap``: also the preconditioner gap's
    curve (exact method only; `dane.similarity.preconditioner_gap`), shifted by the problem's strong convexity.

    The DANE line's theory (Jiang, Rodomanov & Stich 2024) takes the proximal weight λ = δ_A.
    """
    if problem.hessian_vector is None:
        raise ConfigError(f"{key}=null is the Hessian dissimilarity of the local Hessians, which "
                          f"{type(problem).__name__} cannot give (no Hessian-vector products); set {key} to a number")
    shift = float(problem.strong_convexity or 0.0) if gap else None
    found = measured_dissimilarity(problem, comm, problem.initial_point(), gap_shift=shift)
    comm.calls += found["allreduces"]  # the measurement restores the counters; here it is the method's traffic
    comm.bytes_sent += found["bytes_sent"]
    return {**found, "delta_a": max(found["delta_mean_square"], DISSIMILARITY_FLOOR * found["hessian_norm"]),
            "shift": shift}


#: `balanced_prox_weight`: the default λ is where this times the mean preconditioner gap equals λ/(μ + λ)
GAP_BALANCE = 1.0


def balanced_prox_weight(weights: list[float], gaps: list[float], mu: float, balance: float = GAP_BALANCE) -> float | None:
    r"""The proximal weight λ at which the two ways a DANE-type round fails to contract balance:
    ``balance`` · mean_i φ_i(λ) = λ/(μ + λ), interpolated in log λ between the octaves ``weights`` (descending)
    where it changes side; the smallest weight if the gap is below everywhere, None if it is above at the largest.

    Why.  With exact local solves a round of S-DANE (DANE with μ = λ) maps the error e to (I − M H)e near the
    optimum, M = mean_i (H_i + (r + λ)I)⁻¹ (r: the regularizer's curvature, in H and every H_i).  In the metric of
    K = H + (r + λ)I, M = K⁻¹ + K^{-1/2} G K^{-1/2} with G = mean_i (I + A_i)⁻¹A_i² (`dane.similarity.preconditioner_gap`:
    ‖G‖ ≤ mean_i φ_i).  A direction of curvature s ≫ λ is left with about G; one with s ≪ λ contracts by
    λ/(s + λ), at worst λ/(μ + λ) (μ: the least curvature).  The first grows as λ falls and the second shrinks, so the
    rounds are fewest near the λ where they meet.  At ``balance`` = 1/2 this λ was within about 2× of the one
    minimizing the spectral radius of I − M H at w_0 on the 20 cells of scripts/bench_defaults.py (a NumPy sweep),
    where the δ_A-based rule was up to 200× off (ill-conditioned shards, whose relative dissimilarity is small, want
    λ far below δ_A; one-hot shards, whose Hessians are rank-deficient, far above).  The defaults take `GAP_BALANCE`
    = 1 (Acc-S-DANE 2, `baselines.sdane`), twice that λ or more: on logistic cells with a small regularizer the
    Hessians move on the way to the optimum, and at 1/2 the default climbed there (scripts/bench_defaults.py
    --only sdane at GAP_BALANCE 1/2 beside 1)."""
    flat = [lam / (mu + lam) if mu + lam > 0 else 1.0 for lam in weights]
    excess = [balance * g / f if f > 0 else math.inf for g, f in zip(gaps, flat)]  # ≤ 1: λ large enough
    if not excess[0] <= 1.0:
        return None
    for k in range(1, len(weights)):
        if excess[k] > 1.0:
            if not math.isfinite(excess[k]):
                return weights[k - 1]
            t = math.log(excess[k - 1]) / (math.log(excess[k - 1]) - math.log(excess[k])) if excess[k - 1] > 0 else 0.0
            return math.exp(math.log(weights[k - 1]) + t * (math.log(weights[k]) - math.log(weights[k - 1])))
    return weights[-1]


#: The δ_A-based default proximal weight of the DANE line's local problems (S-DANE's and FedRed's λ, FedDANE's μ; for
#: d ≤ 512 the ceiling of `balanced_prox_weight`'s, beyond it the default, FedRed's always) is δ_A times at least this.  The theory's λ = δ_A
#: bounds the dissimilarity in every direction at once and is slow in practice (on ``make bench``'s families it took
#: several times the rounds of the best λ).  At δ_A/128 S-DANE and FedDANE still took more than twice the rounds of
#: a quarter of it on the ridge and ill-conditioned cells of scripts/bench_defaults.py; the heterogeneity term below
#: keeps λ large where the shards differ most (Acc-S-DANE: `baselines.sdane`).
PROX_PER_DISSIMILARITY = 1 / 512
#: ... and at least (δ_A/‖H‖)² times 1/this: shards as far apart as their Hessian (label skew over many small
#: clients: δ_A ≈ ‖H‖) diverged at δ_A/128 and δ_A/32 (``make bench``'s ``federated`` section); shards with
#: δ_A/‖H‖ ≤ 1/sqrt(32) keep the floor (‖H‖: the data term's, `dane.similarity`).
HETEROGENEITY_DIVISOR = 16


def prox_per_dissimilarity(delta_a: float, hessian_norm: float, divisor: float = HETEROGENEITY_DIVISOR) -> float:
    """λ/δ_A of the default without a gap curve (d > 512; FedRed's always): max(`PROX_PER_DISSIMILARITY`,
    (δ_A/‖H‖)² / ``divisor``) (`HETEROGENEITY_DIVISOR`; Acc-S-DANE's is its own, `baselines.sdane`).

    A heuristic between the two measured regimes, not the papers': near the theory's δ_A/16 when the shards'
    Hessians differ as much as the global one is large, the floor δ_A/512 when they differ by 1/sqrt(32) of it or less."""
    return max(PROX_PER_DISSIMILARITY, (delta_a / hessian_norm) ** 2 / divisor)


#: Under client sampling (s of m clients a round) the default proximal weight is at least this times q·(‖H‖ + 2δ_A),
#: q = `sampling_variance_factor` (`sampled_prox_weight` says why; the side-by-side run that set it is named there).
SAMPLED_PROX_PER_CURVATURE = 0.5


def sampling_variance_factor(s: int, m: int) -> float:
    """q = (m − s)/(s(m − 1)): E‖mean_S z_i − mean_i z_i‖² = q · mean_i ‖z_i − mean_j z_j‖² for s of m vectors drawn
    uniformly without replacement (0 at s = m, 1 at s = 1)."""
    return (m - s) / (s * (m - 1)) if m > 1 else 0.0


def sampled_prox_weight(lam: float, delta_a: float, hessian_norm: float, s: int, m: int,
                        per_curvature: float = SAMPLED_PROX_PER_CURVATURE) -> float:
    r"""The default proximal weight under client sampling: max(λ, ``per_curvature`` · q · (‖H‖ + 2δ_A)),
    q = `sampling_variance_factor`; λ itself at s = m (full participation keeps its iterates bit for bit).
    ``per_curvature``: `SAMPLED_PROX_PER_CURVATURE` (Acc-S-DANE's is its own, `baselines.sdane`).

    Why λ grows with q.  With exact solves a sampled round of S-DANE / FedDANE near w* is, to first order,
    w⁺ − w* = (H + λI)⁻¹(λ(w − w*) − ξ), ξ = mean_S ∇O_i(w*), E ξ = 0, E‖ξ‖² = q ζ², ζ² = mean_i ‖∇O_i(w*)‖².  Along an
    eigenvector of H with curvature h the error has the stationary variance σ_h²/(h(h + 2λ)), so the objective's
    floor is Σ_h σ_h²/(2(h + 2λ)) ≤ q ζ²/(4λ): it falls as 1/λ only once λ exceeds the curvatures that carry the
    noise, and a floor ε needs λ ≳ q ζ²/(4ε) (the S-DANE paper's λ under partial participation grows the same way,
    with the sampling variance over the target accuracy).  Each round contracts that direction by λ/(h + λ), so the
    rounds grow as λ/μ.  ζ² is unknown before the run (and its value at w_0 overstates it many times on logistic
    problems); the default puts λ on the scale of the local problems' curvature, ‖H‖ + 2δ_A (‖H_i‖ ≤ ‖H‖ + ‖H_i − H‖,
    δ_A the root mean square of the last), times q, so the noise no longer passes with the gain of a Newton step (the
    δ_A-based λ, set under full participation, is small against ‖H‖) and the relative floor does not grow as q.
    A heuristic, not the paper's rule (which needs ζ² and the target ε); the side-by-side run against a λ grid
    (phishing and a9a over 80 clients, 8 a round, iid and Dirichlet α = 0.5) is scripts/bench_sampled_lambda.py, its
    JSON written to its --out (its Acc-S-DANE rows are at the factor in force when their cell ran:
    this one, and Acc-S-DANE's own in a cell rerun with ``--update``, which carries its date; ``--acc`` runs Acc-S-DANE
    at its own into sampled_lambda_acc.json; w8a over 142 clients, 14 a round: sampled_lambda_w8a.json, its Acc-S-DANE
    rows at S-DANE's factor).  ``sampling=size`` takes the same q."""
    if s >= m:
        return lam
    return max(lam, per_curvature * sampling_variance_factor(s, m) * (hessian_norm + 2.0 * delta_a))


def default_prox_weight(problem: Problem, comm: Communicator, key: str,
                        divisor: float = HETEROGENEITY_DIVISOR, *, sampler: ClientSampler | None = None,
                        per_curvature: float = SAMPLED_PROX_PER_CURVATURE,
                        balance: float = GAP_BALANCE) -> tuple[float, float]:
    """(λ, δ_A), measured before round 0 (`hessian_dissimilarity`: two allreduces for d ≤ 512).  λ is δ_A ·
    `prox_per_dissimilarity` with ``divisor``, and for d ≤ 512 (the exact measurement) `balanced_prox_weight` of the
    preconditioner gap where that is smaller.  With a ``sampler`` that draws s < m clients, raised to
    `sampled_prox_weight` (with ``per_curvature``).

    Why the smaller of the two: where the shards are similar relative to their curvature (ill-conditioned iid shards)
    the balanced weight is up to 200 times below the δ_A rule's and the rounds fell up to 17 times on
    scripts/bench_defaults.py's cells; where the model at w_0 asks for more (label skew over many clients: phishing
    over 100 Dirichlet clients, δ_A ≈ ‖H‖), the δ_A rule's weight went further: S-DANE after 27 rounds at 2.1e-3
    with it (λ = 0.029) against 2.7e-2 at the balanced weight alone (λ = 0.059; a run of scripts/bench_federated.py's
    hard setting's configuration through `dane.fit`)."""
    found = hessian_dissimilarity(problem, comm, key, gap=True)
    delta_a, norm = found["delta_a"], found["hessian_norm"]
    lam = delta_a * prox_per_dissimilarity(delta_a, norm, divisor)
    if "gap" in found:  # the exact measurement (d ≤ 512): the balanced weight where it is the smaller
        balanced = balanced_prox_weight(found["gap_weights"], found["gap"], found["curvature_min"] + found["shift"],
                                        balance)
        lam = lam if balanced is None else min(balanced, lam)
    if sampler is not None:
        lam = sampled_prox_weight(lam, delta_a, norm, sampler.s, sampler.m, per_curvature)
    return lam, delta_a


#: `SamplingFloor`: a sampled run whose objective has not improved on its best for this many rounds (and for half the
#: rounds it took to reach that best) is at its floor
FLOOR_ROUNDS = 10


class SamplingFloor:
    """The rounds since the global objective last improved on its best, for a method without a fixed point at the
    optimum under client sampling (FedDANE, S-DANE, FedRed with type-1 control variates: the sampled gradient
    mean_S ∇O_i(w*) is not zero when the shards differ).  `stalled` once it has not improved for max(`FLOOR_ROUNDS`, half the best's round) rounds: the
    objective then oscillates about a floor, and on label-skewed shards it can climb from there and diverge."""

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


#: the window (rounds) over which `CyclingObjective` compares the objective's swing with its progress
CYCLE_ROUNDS = 10
#: `CyclingObjective`: this many rounds in a row whose step turns back on the last one (cosine below −this) ...
ALTERNATING_COSINE = 0.9
ALTERNATING_ROUNDS = 4
#: ... while shrinking by less than this factor overshoot
ALTERNATING_RATIO = 0.8


class CyclingObjective:
    r"""A default proximal weight (S-DANE's and FedRed's null ``lam``, FedDANE's null ``mu``) that doubles, up to
    ``ceiling`` (δ_A, the theory's weight), when the global objective climbs or cycles, under full participation on
    a convex problem.

    It climbs when it exceeds every objective since the weight last changed (round 0's at first); the weight then
    doubles at once.  Over the last `CYCLE_ROUNDS` rounds' objectives f, the swing is max f − min f and the progress
    is how far min f fell below the best objective before them; the objective cycles when the swing exceeds twice the
    progress.  Both compare beyond ``rtol`` of round-off (`dane.safeguard.accepts`' tolerance).  A run whose
    objective falls every round neither climbs nor cycles (its swing is below its progress), nor does one whose bumps
    are small against its descent (an accelerated one), so its iterates are bit for bit those of the fixed default.
    Given the iterates (``point``: S-DANE's and FedDANE's x, not an accelerated one's), the weight also doubles when
    `ALTERNATING_ROUNDS` steps in a row turn back on the one before (cosine below −`ALTERNATING_COSINE`) while
    shrinking by less than `ALTERNATING_RATIO` (`dane.safeguard.step_ratio_and_cosine`: the sign of the slowest mode
    of I − M H, as DANE's safeguard reads it): a settled overshoot, whose objective can still fall every round.

    Why: the default weight is measured at w_0 (`default_prox_weight`), where the theory asks for λ ≥ δ along the
    whole path.  Where a client holds fewer rows
    than the dimension, its rows are separable and its Hessian rank-deficient, and the dissimilarity against the
    curvature grows on the way to the optimum (LIBSVM's mushrooms over 80 iid clients, 101 rows each, d = 113:
    δ_A/‖H‖ is 0.11 at w_0 and 0.32 at w*, from a NumPy eigendecomposition of the shards' Hessians).  There the
    local solves overshoot and the iterates cycle far from the optimum, settling on a limit cycle whose best
    improves by round-off.  The cycle is read off the objective that already rides in each round's first allreduce
    (no communication); the weight doubles, the window starts again, and the weight never comes back down.  A weight
    the user sets is the paper's fixed one and is left alone; under client sampling a round's objective is noisy, and
    the sampled default and the floor stop (`SamplingFloor`) act instead.  Departure from the papers: theirs is a
    fixed λ, or S-DANE's adaptive line search (``adaptive=true``: a third allreduce a round, λ halved after an
    accepted round)."""

    def __init__(self, active: bool = False, ceiling: float = math.inf, rtol: float = 1e-12) -> None:
        self.active, self.ceiling, self.rtol = active, ceiling, rtol
        self.high: float | None = None  # the highest objective since the weight last changed (round 0's at first)
        self.before, self.window = math.inf, []  # the best objective before the window; the window's objectives
        self.point: torch.Tensor | None = None  # the last iterate, its step, and the overshooting steps in a row
        self.step: torch.Tensor | None = None
        self.alternating = 0

    def next_weight(self, weight: float, objective: float, point: torch.Tensor | None = None) -> float:
        """The weight of the next round, given this round's weight, the objective at the round's start and, to read
        overshoot from, the round's new iterate."""
        if not self.active:
            return weight
        if point is not None and self.overshoots(point):
            return self.doubled(weight, objective)
        if self.high is not None and not accepts(objective, self.high, self.rtol):
            return self.doubled(weight, objective)  # above every objective since the weight last changed: unstable
        self.high = objective if self.high is None else self.high
        self.window.append(objective)
        if len(self.window) > CYCLE_ROUNDS:
            self.before = min(self.before, self.window.pop(0))
        if len(self.window) < CYCLE_ROUNDS or not math.isfinite(self.before):
            return weight
        low, high = min(self.window), max(self.window)
        if high - low <= 2.0 * (self.before - low) or accepts(high, low, self.rtol):
            return weight
        return self.doubled(weight, objective)

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

    def doubled(self, weight: float, objective: float) -> float:
        """2 × ``weight``, at most the ceiling; the window starts again, under the highest objective it held."""
        self.before, self.high = min([self.before, *self.window, objective]), max([objective, *self.window])
        self.window, self.alternating = [], 0
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


@dataclass(frozen=True)
class LocalSolveKeys:
    """The ``algorithm.*`` keys of a federated local solve (module docstring)."""

    local_solver: str = "problem"
    local_steps: int = 10
    lr: float | None = None
    power_iters: int = 20

    def check_local(self) -> None:
        checks.one_of("algorithm.local_solver", self.local_solver, FED_SOLVERS)
        checks.positive_int("algorithm.local_steps", self.local_steps)
        if self.lr is not None:
            checks.positive("algorithm.lr", self.lr)
        checks.positive_int("algorithm.power_iters", self.power_iters)

    def solver(self) -> LocalSolver | None:
        """The `LocalSolver` handed to ``problem.prox_solve``; None: the problem's own (or ``steps``)."""
        return None if self.local_solver in ("problem", "steps") else LocalSolver(self.local_solver)


class Federated(Algorithm):
    """Sampler, traffic and local-solve plumbing of a federated method; subclasses write the round."""

    client_sampling = True  # algorithm.clients_per_round (dane.sampling)
    #: True: under client sampling the method has no fixed point at the optimum, and a run ends with status
    #: ``sampling_floor`` and `floor_diagnosis` once its objective stops improving (`SamplingFloor`); a method whose
    #: options decide it sets it on the instance (FedRed: its type-1 control variate has a floor, type 2 has not)
    floors_under_sampling = False
    synchronous_because = "its rounds average the sampled clients' results from the same iterate"
    columns = (Column("clients", "{:>7d}"),)

    def __init__(self, problem: Problem, comm: Communicator, *, sampling: SamplingKeys, seed: int = 0,
                 local: LocalSolveKeys | None = None, w0: torch.Tensor | None = None):
        super().__init__(problem, comm, w0)
        self.sampler = ClientSampler(comm, sampling.clients_per_round, sampling=sampling.sampling, seed=seed,
                                     n_local=problem.n_local)
        self.traffic = Traffic()
        self.with_grad = logs_gradient(problem)
        self.local = local or LocalSolveKeys()
        self.solver = self.local.solver()
        if self.solver is not None and problem.strong_convexity is None:
            raise ConfigError(f"algorithm.local_solver={self.local.local_solver} exists on the convex problems only, "
                              f"got {type(problem).__name__}; use algorithm.local_solver=problem (the inner optimizer)")
        self.lr = self.local.lr
        self.floor, self.at_floor = SamplingFloor(), None
        self.cycling = CyclingObjective()  # inactive; a method with a default proximal weight activates it
        if self.local.local_solver == "steps" and self.lr is None:
            self.L_max = self.largest_smoothness(seed)

    @property
    def damps_itself(self) -> bool:
        return self.cycling.active

    def watch_default_weight(self, delta_a: float) -> None:
        """Double a proximal weight left at its default when the objective cycles (`CyclingObjective`), up to the
        dissimilarity ``delta_a`` (δ_A), under full participation on a convex problem."""
        active = self.sampler.full and self.problem.strong_convexity is not None
        self.cycling = CyclingObjective(active, ceiling=delta_a)

    def largest_smoothness(self, seed: int) -> float:
        """max_i L_i for ``lr`` null, one allreduce before round 0 (a method that needs more of the local spectrum
        overrides this to share that allreduce: `baselines.scaffold`)."""
        return largest_local_smoothness(self.problem, self.comm, iters=self.local.power_iters, seed=seed)

    def step_size(self, shift: float) -> float:
        """``lr``, or 1/(max_i L_i + shift) for gradient steps on O_i + (shift/2)‖·‖²."""
        return self.local.lr if self.local.lr is not None else 1.0 / (self.L_max + shift)

    # --------------------------------------------------------------- pieces of a round
    def members(self) -> tuple[torch.Tensor, bool]:
        """(S_t, whether this worker is in it)."""
        members = self.sampler.draw()
        return members, bool((members == self.comm.rank).any())

    def payload(self, w: torch.Tensor) -> list[torch.Tensor]:
        """The local metrics of w (and ∇O_i(w) where records need it), to ride in an allreduce."""
        return local_payload(self.problem, w, with_grad=self.with_grad)

    def grad_and_payload(self, w: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(∇O_i(w), `payload` of w) from one evaluation."""
        grad, metrics = self.problem.evaluate(w)
        return grad, [metrics, grad] if self.with_grad else [metrics]

    def average(self, members: torch.Tensor, sampled: list[torch.Tensor], rides: list[torch.Tensor] = (),
                *, down: list[torch.Tensor] = ()) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Means over S_t of ``sampled`` (and over all of ``rides``); counts ``sampled`` up and ``down`` down."""
        self.traffic.add(len(members), up=sampled, down=down)
        return sampled_mean(self.comm, members, sampled, rides)

    def evaluate(self) -> dict[str, float]:
        """The last iterate's metrics (one allreduce, not a round of the method) and the traffic so far."""
        return {**super().evaluate(), **self.traffic.record(self.sampler.s)}

    def record(self, reduced: list[torch.Tensor], members: torch.Tensor) -> dict[str, float]:
        out = {**global_metrics(self, reduced), **self.traffic.record(len(members))}
        if self.floors_under_sampling and not self.sampler.full and self.at_floor is None \
                and self.floor.update(out["objective"]):
            self.at_floor = self.floor_diagnosis()
        return out

    def floor_diagnosis(self) -> str:
        """The one line a run at its sampling floor ends with (`floors_under_sampling`)."""
        return (f"the objective has not improved for {self.floor.rounds - 1 - self.floor.best_round} rounds: under "
                f"client sampling ({self.sampler.s} of {self.sampler.m}) the sampled gradient is not zero at the "
                f"optimum when the shards differ, so {self.name} stalls at a floor; algorithm.clients_per_round=null "
                f"(all clients) removes it")

    @property
    def finished(self) -> tuple[str, str] | None:
        """("sampling_floor", why) once a sampled run's objective has stopped improving (`floors_under_sampling`)."""
        return None if self.at_floor is None else ("sampling_floor", self.at_floor)

    def local_grad(self, w: torch.Tensor) -> torch.Tensor:
        return self.problem.evaluate(w)[0]

    def prox(self, anchor: torch.Tensor, linear: torch.Tensor, mu: float, *,
             anchor_grad: torch.Tensor | None = None) -> torch.Tensor:
        """≈ argmin_w O_i(w) − ⟨linear, w⟩ + (μ/2)‖w − anchor‖² by ``local_solver`` (module docstring)."""
        if self.local.local_solver == "steps":
            lr, w = self.step_size(mu), anchor
            for k in range(self.local.local_steps):
                grad = anchor_grad if k == 0 and anchor_grad is not None else self.local_grad(w)
                w = w - lr * (grad - linear + mu * (w - anchor))
            return w
        kwargs = {} if self.solver is None else {"solver": self.solver}
        return self.problem.prox_solve(anchor, linear, mu, anchor_grad=anchor_grad, **kwargs)

    # --------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        return {**super().state_dict(), "sampler": self.sampler.state_dict(), "traffic": self.traffic.state_dict(),
                "floor": self.floor.state_dict(), "at_floor": self.at_floor, "cycling": self.cycling.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.sampler.load_state_dict(state["sampler"])
        self.traffic.load_state_dict(state["traffic"])
        if "floor" in state:  # checkpoints from before the floor rule start it afresh
            self.floor.load_state_dict(state["floor"])
            self.at_floor = state["at_floor"]
        if "cycling" in state:  # checkpoints from before the rule start it afresh
            self.cycling.load_state_dict(state["cycling"])
