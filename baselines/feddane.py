r"""FedDANE (Li, Sahu, Zaheer, Sanjabi, Talwalkar & Smith, Asilomar 2019): DANE on sampled clients.

Round t draws two sets of clients, S_t for the gradient and S'_t for the local solves (both all m
without sampling, where FedDANE is DANE with η and μ, `dane.dane.DANE` with ``safeguard=False``):

.. math::
    g_t &= \frac1{|S_t|}\sum_{i\in S_t}\nabla O_i(w_t)                                       &&\text{(allreduce 1)}\\
    w_i &= \arg\min_w\; O_i(w) - \langle\nabla O_i(w_t) - \eta\,g_t, w\rangle + \frac{\mu}{2}\|w - w_t\|^2
          \quad (i\in S'_t)                                                                     &&\text{(local solve)}\\
    w_{t+1} &= \frac1{|S'_t|}\sum_{i\in S'_t} w_i                                              &&\text{(allreduce 2)}

The local solve is ``local_solver`` (`baselines.federated`; ``problem``: exact on a quadratic, the
inner torch optimizer on a network).  The paper tunes μ ∈ {0, 0.001, 0.01, 0.1, 1}; η = 1.  μ = ``mu``; null: δ_A·max(1/512, (δ_A/‖H‖)²/16) of the local
Hessians (`baselines.federated.default_prox_weight`, measured before round 0).  A client of
S'_t outside S_t computes ∇O_i(w_t) for its own solve (local work, no communication).
"""
from __future__ import annotations

from dataclasses import dataclass

from dane import checks
from dane.algorithm import AlgorithmConfig, Column
from dane.comm import Communicator
from dane.problems import Problem
from dane.sampling import SamplingKeys

from .federated import Federated, LocalSolveKeys, default_prox_weight


class FedDANE(Federated):
    name = "feddane"
    columns = (*Federated.columns, Column("mu", "{:>8.3g}"))

    def __init__(self, problem: Problem, comm: Communicator, *, eta: float = 1.0, mu: float | None = None, **kwargs):
        super().__init__(problem, comm, **kwargs)
        self.eta = eta
        self.mu = default_prox_weight(problem, comm, "algorithm.mu") if mu is None else mu

    def step(self) -> dict[str, float]:
        w = self.w
        gradient_set, _ = self.members()                                       # S_t
        solve_set, solves = self.members()                                     # S'_t
        local_grad, payload = self.grad_and_payload(w)
        (g,), reduced = self.average(gradient_set, [local_grad], payload, down=[w])  # 1. g = mean_S ∇O_i
        w_local = w
        if solves:
            w_local = self.prox(w, local_grad - self.eta * g, self.mu, anchor_grad=local_grad)  # 2. local solve
        (self.w,), _ = self.average(solve_set, [w_local], down=[w, g])            # 3. w_{t+1} = mean_S' w_i
        return {**self.record(reduced, solve_set), "mu": self.mu}


@dataclass(frozen=True)
class FedDANEConfig(AlgorithmConfig, SamplingKeys, LocalSolveKeys):
    eta: float = 1.0
    mu: float | None = None
    seed: int = 0
    name: str = "feddane"
    algorithm = FedDANE

    def __post_init__(self) -> None:
        checks.positive("algorithm.eta", self.eta)
        if self.mu is not None:
            checks.nonnegative("algorithm.mu", self.mu)
        self.check_local()
        self.check_sampling()
        checks.integer("algorithm.seed", self.seed)

    def build(self, problem: Problem, comm: Communicator) -> "FedDANE":
        return FedDANE(problem, comm, eta=self.eta, mu=self.mu, sampling=self, local=self, seed=self.seed)
