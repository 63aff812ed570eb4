r"""FedDANE (Li, Sahu, Zaheer, Sanjabi, Talwalkar & Smith, Asilomar 2019): DANE on sampled clients.

Round t draws the clients S_t for the gradient and S'_t for the local solves (both all m without
sampling, where FedDANE is DANE with η and μ, `dane.dane.DANE` with ``safeguard=False``):

.. math::
    g_t &= \frac1{|S_t|}\sum_{i\in S_t}\nabla O_i(w_t)                                       &&\text{(allreduce 1)}\\
    w_i &= \arg\min_w\; O_i(w) - \langle\nabla O_i(w_t) - \eta\,g_t, w\rangle + \frac{\mu}{2}\|w - w_t\|^2
          \quad (i\in S'_t)                                                                     &&\text{(local solve)}\\
    w_{t+1} &= \frac1{|S'_t|}\sum_{i\in S'_t} w_i                                              &&\text{(allreduce 2)}

S'_t = S_t by default, as in the authors' code (litian96/FedProx, ``trainers/feddane.py``: both draws call
``select_clients(round)``, which reseeds NumPy with the round, so they return the same set); ``resample=true``
draws S'_t afresh, as the paper's Algorithm 1 is printed.  The two differ in what the local solves invert:
the correction's heterogeneous part g_t − ∇O_i(w_t) comes from S_t's data, and a client of S'_t outside S_t
may have no curvature along it but μ and the l2 weight, so its step (H_i + μI)⁻¹ g_t can be large (the paper
reports FedDANE diverging under low participation and heterogeneity).  With S'_t = S_t and η = 1 FedDANE is S-DANE with exact local solves, round for
round (`baselines.sdane`).  With ``resample=true`` a client of S'_t outside S_t computes ∇O_i(w_t) for its own
solve (local work, no communication).

Under sampling FedDANE has no fixed point at the optimum: g_t at w* is mean_{S_t} ∇O_i(w*), which is not zero
when the shards differ, so the objective stalls at a floor that a larger μ lowers (and slows) and only full
participation removes, and from there it can climb and diverge (on phishing over 100 Dirichlet clients, α = 0.5,
10 a round).  A sampled run ends with status ``sampling_floor`` and a one-line diagnosis once its objective has
stopped improving (`baselines.adaptive.FloorStop`).

Departures from the paper: the local solve is ``local_solver`` (`baselines.federated`; ``problem``: exact on
a quadratic or a GLM, the inner torch optimizer on a network), where the paper runs local SGD epochs; the
means are plain means of the O_i, which carry their shard's weight m·n_i/N (`dane.problems`), where the
authors' code weights F_i (the mean loss) by n_i.  The paper tunes μ ∈ {0, 0.001, 0.01, 0.1, 1}; η = 1.
μ = ``mu``; null: S-DANE's default λ (`baselines.defaults.prox_weight`, resolved before the method is built), and
under full participation on a convex problem it doubles, up to δ_A, when the objective climbs or cycles or the steps
settle into an overshoot (`baselines.adaptive.WeightDoubling`): this package's rules, listed by the run.
"""
from __future__ import annotations

from dataclasses import dataclass

from dane import checks
from dane.algorithm import AlgorithmConfig, Column
from dane.comm import Communicator
from dane.problems import Problem
from dane.sampling import SamplingKeys

from .adaptive import FloorStop, WeightDoubling
from .defaults import Resolution, local_step
from .federated import LocalSolveKeys, LocalSolving, PolicyKeys, resolve_prox_weight


class FedDANE(LocalSolving):
    name = "feddane"
    label = "FedDANE"
    singular_remedy = " or algorithm.mu > 0"  # μ shifts the local Hessian of an exact solve (local_solver not steps)
    own_state = ()  # the clients outside S_t may sleep (`dane.comm.roster`), unless a second draw picks the solvers

    @classmethod
    def sleeps_out(cls, config) -> bool:
        return not config.resample
    columns = (*LocalSolving.columns, Column("mu", "{:>8.3g}"))

    def __init__(self, problem: Problem, comm: Communicator, *, mu: float, eta: float = 1.0, resample: bool = False,
                 **kwargs):
        super().__init__(problem, comm, **kwargs)
        self.eta, self.mu, self.resample = eta, mu, resample

    def round(self) -> dict[str, float]:
        w = self.w
        gradient_set, solves = self.members()                                  # S_t
        if self.resample:
            solve_set, solves = self.members()                                 # S'_t drawn afresh
        else:
            solve_set = gradient_set                                           # S'_t = S_t
        local_grad, payload = self.grad_and_payload(w)
        (g,), reduced = self.average(gradient_set, [local_grad], payload, down=[w])  # 1. g = mean_S ∇O_i
        w_local = w
        if solves:
            w_local = self.prox(w, local_grad - self.eta * g, self.mu, anchor_grad=local_grad)  # 2. local solve
        (self.w,), _ = self.average(solve_set, [w_local], down=[g])               # 3. w_{t+1} = mean_S' w_i
        if self.resample:  # a solver outside S_t needed w_t too
            self.traffic.add(len(set(solve_set.tolist()) - set(gradient_set.tolist())), down=[w])
        return {**self.record(reduced, solve_set), "mu": self.mu}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "mu": self.mu}  # a default μ may have doubled (`baselines.adaptive`)

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.mu = float(state.get("mu", self.mu))

    def floor_diagnosis(self, floor) -> str:
        return (f"{super().floor_diagnosis(floor)}; a larger algorithm.mu (now {self.mu:.3g}) lowers it and slows "
                f"each round")


@dataclass(frozen=True)
class FedDANEConfig(AlgorithmConfig, SamplingKeys, LocalSolveKeys, PolicyKeys):
    eta: float = 1.0
    mu: float | None = None
    resample: bool = False
    seed: int = 0
    name: str = "feddane"
    algorithm = FedDANE
    mu_role = "damping"
    adaptation_names = (WeightDoubling.name, FloorStop.name)

    def __post_init__(self) -> None:
        checks.positive("algorithm.eta", self.eta)
        if self.mu is not None:
            checks.nonnegative("algorithm.mu", self.mu)
        checks.boolean("algorithm.resample", self.resample)
        self.check_local()
        self.check_sampling()
        checks.seed("algorithm.seed", self.seed)
        self.check_policy()

    def recovery(self) -> list[str]:
        """An η above the paper's 1, which scales the local solves' linear term η g (at 1e308 it overflows and the
        solves are not finite): the divergence line's first hint (`dane.loop.launch.recovery_overrides`)."""
        return ["algorithm.eta=1 (the paper's)"] if self.eta > 1 else []

    def build(self, problem: Problem, comm: Communicator) -> "FedDANE":
        """The nulls resolved (`baselines.defaults`), the adaptations that apply attached (`baselines.adaptive`)."""
        resolution, adaptations = Resolution(), []
        smoothness = self.measured_smoothness(problem, comm, resolution)
        (s, m), mu = self.clients(comm), self.mu
        if mu is None:
            mu, delta_a = resolve_prox_weight(problem, comm, "mu", resolution, s=s, m=m)
            watched = s == m and problem.strong_convexity is not None
            adaptations += [WeightDoubling("mu", delta_a, point=True, smoothness=smoothness,
                                           solver=self.solves_with(problem))] * \
                (watched and self.allows("double_weight"))
        if smoothness:
            resolution.add("lr", local_step(smoothness, mu), "local_step", smoothness=smoothness, shift=mu)
        adaptations += [FloorStop()] * (s < m and self.allows("sampling_floor"))
        return FedDANE(problem, comm, eta=self.eta, mu=mu, resample=self.resample, sampling=self, local=self,
                       seed=self.seed, smoothness=smoothness, adaptations=adaptations, defaults=resolution.entries)
