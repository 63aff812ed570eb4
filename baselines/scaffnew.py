r"""Scaffnew / ProxSkip (Mishchenko, Malinovsky, Stich & Richtárik, ICML 2022): local steps, random communication.

Client i keeps x_i and h_i (h_i = 0 at the start, so Σ_i h_i = 0 throughout).  One ProxSkip iteration:

.. math::
    \hat x_i &= x_i - \gamma\,(\nabla O_i(x_i) - h_i) \\
    &\text{with probability } p:\quad \bar x = \frac1m\sum_i \Big(\hat x_i - \frac{\gamma}{p} h_i\Big),\quad
        h_i \leftarrow h_i + \frac{p}{\gamma}(\bar x - \hat x_i),\quad x_i \leftarrow \bar x \\
    &\text{else:}\quad x_i \leftarrow \hat x_i

One round here is the iterations up to and including the next communication: a geometric number
(mean 1/p) of local steps, then one allreduce.  The coin comes from a generator seeded from the
run's seed that every worker shares, so all clients flip the same coins on every backend; it is in
the state_dict.  The record of a round is the common iterate x̄ it starts from.

γ = ``lr`` (null: 1/max_i L_i, `baselines.federated`); p = ``p`` (null: the paper's
p = sqrt(μ/L), L = max_i L_i and μ = μ̲, a lower bound of the strong convexity
(`baselines.defaults.strong_convexity_bound`: max(the ℓ2 weight, mean_i λ_min(H_i)) on a quadratic whose local
Lanczos runs d products, ``power_iters`` ≥ d or d ≤ 2000 (`baselines.defaults.lanczos_iters`), and one allreduce
before round 0; otherwise the ℓ2 weight), which gives the
O(sqrt(L/μ) log 1/ε) communications of Mishchenko et al., Theorem 3.6).  With p = 1 every
iteration communicates and the round is a step of distributed gradient descent with step γ.
Client sampling is not defined for ProxSkip (h_i's update needs every client's x̂_i at every
communication; see TAMUNA or 5GCS for partial participation), and it is refused.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dane import checks
from dane.algorithm import AlgorithmConfig, Column
from dane.comm import Communicator
from dane.errors import ConfigError
from dane.problems import Problem
from dane.sampling import SamplingKeys
from dane.seeds import STREAMS, shared_seed

from .defaults import (Resolution, lanczos_is_exact, lanczos_iters, local_step, scaffnew_probability,
                       strong_convexity_bound)
from .federated import Federated, LocalKeys, PolicyKeys
from .measure import mean_lowest

COIN_STREAM = STREAMS["scaffnew_coin"].number  # the shared communication coin


class Scaffnew(Federated):
    name = "scaffnew"
    label = "Scaffnew"
    batchable = True  # its round reads the same on stacked tensors (`dane.comm.batched`)
    stacked_needs = "gradients"
    columns = (Column("local_steps", "{:>6d}"), Column("p", "{:>8.3g}"))

    def __init__(self, problem: Problem, comm: Communicator, *, gamma: float, p: float,
                 max_local_steps: int = 100_000, seed: int = 0, **kwargs):
        super().__init__(problem, comm, seed=seed, **kwargs)
        self.gamma, self.p, self.max_local_steps = gamma, p, max_local_steps
        self.coin = torch.Generator().manual_seed(shared_seed(seed, COIN_STREAM))
        self.h = self.client_state(torch.zeros_like(self.w))  # this client's (on the batched path, every one's)

    def communicates(self) -> bool:
        return bool(torch.rand(1, generator=self.coin, dtype=torch.float64) < self.p)

    def round(self) -> dict[str, float]:
        members, _ = self.members()                        # every client: ProxSkip refuses sampling
        x, gamma, p = self.w, self.gamma, self.p
        steps = 0
        while True:
            x_hat = x - gamma * (self.local_grad(x) - self.h)   # local step
            steps += 1
            if self.communicates() or steps >= self.max_local_steps:
                break
            x = x_hat
        (x_bar,), reduced = self.average(members, [x_hat - (gamma / p) * self.h], self.payload(self.w),
                                         down=[self.w])
        self.h = self.h + (p / gamma) * (x_bar - x_hat)       # control variate
        self.w = x_bar
        return {**self.record(reduced, members), "local_steps": steps, "p": p, "lr": gamma}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "h": self.h.clone(), "coin": self.coin.get_state()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.h = state["h"].clone()
        self.coin.set_state(state["coin"])


@dataclass(frozen=True)
class ScaffnewConfig(AlgorithmConfig, SamplingKeys, LocalKeys, PolicyKeys):
    p: float | None = None
    local_solver: str = "steps"
    max_local_steps: int = 100_000  # a guard on one round's geometric count, never reached at a sane p
    seed: int = 0
    name: str = "scaffnew"
    algorithm = Scaffnew
    adaptation_names = ()  # none applies

    def __post_init__(self) -> None:
        if self.p is not None:
            checks.fraction("algorithm.p", self.p, "the probability to communicate")
        checks.one_of("algorithm.local_solver", self.local_solver, ("steps",))
        checks.positive_int("algorithm.max_local_steps", self.max_local_steps)
        self.check_local()
        self.check_sampling()
        self.refuse_sampling(self.name, "ProxSkip's control variates need every client's local iterate at each "
                                        "communication (partial participation is TAMUNA's or 5GCS's, not Scaffnew's)")
        checks.seed("algorithm.seed", self.seed)
        self.check_policy()

    def build(self, problem: Problem, comm: Communicator) -> "Scaffnew":
        """The nulls resolved (`baselines.defaults`): γ from max_i L_i, p from it and μ̲ (an allreduce each; μ̲'s
        only where its Lanczos is exact)."""
        resolution, p = Resolution(), self.p
        smoothness = self.measured_smoothness(problem, comm, resolution)
        gamma = self.lr if self.lr is not None else resolution.add("lr", local_step(smoothness), "local_step",
                                                                    smoothness=smoothness)
        if p is None:
            l2 = getattr(problem, "strong_convexity", None)
            if not l2 or self.lr is not None:
                raise ConfigError("algorithm.p=null is sqrt(mu/L) from the strong convexity and the estimated L, "
                                  "which needs a strongly convex problem and algorithm.lr=null; set algorithm.p "
                                  "(in (0, 1])")
            iters = lanczos_iters(problem, self.power_iters)
            exact = lanczos_is_exact(problem, iters)  # else its λ_min would bound nothing from below
            lowest = mean_lowest(problem, comm, iters=iters, seed=self.seed, key="algorithm.p") if exact else None
            mu_low = strong_convexity_bound(float(l2), lowest, exact=exact)
            p = resolution.add("p", scaffnew_probability(mu_low, smoothness), "scaffnew_probability", mu_low=mu_low,
                               lanczos_exact=exact, smoothness=smoothness)
        return Scaffnew(problem, comm, gamma=gamma, p=p, max_local_steps=self.max_local_steps, sampling=self,
                        local=self, seed=self.seed, smoothness=smoothness, defaults=resolution.entries)
