r"""S-DANE and Acc-S-DANE (Jiang, Rodomanov & Stich, NeurIPS 2024): DANE stabilized by a prox-centre v.

Round r of S-DANE (the paper's Algorithm 1), clients S (all m without sampling), two allreduces:

.. math::
    \bar g &= \frac1{|S|}\sum_{j\in S}\nabla O_j(v), \qquad h_i = \nabla O_i(v) - \bar g        &&\text{(allreduce 1)}\\
    x_i &\approx \arg\min_x\; F_i(x) = O_i(x) - \langle h_i, x\rangle + \frac{\lambda}{2}\|x - v\|^2,
        \quad \|\nabla F_i(x_i)\| \le \frac{\lambda}{2}\|x_i - v\|                              &&\text{(local solve)}\\
    x &= \frac1{|S|}\sum_{i\in S} x_i, \qquad G = \frac1{|S|}\sum_{i\in S}\nabla O_i(x_i)       &&\text{(allreduce 2)}\\
    v &\leftarrow \frac{B v + a\mu\,x - a\,G}{B + a\mu}

with a = 1/λ and B = 1; μ ≥ 0 is the strong convexity of O (``mu``; null: the problem's).
λ = ``lam``; null: measured at w_0 before round 0 (`baselines.federated.default_prox_weight`): δ_A·max(1/512,
(δ_A/‖H‖)²/16), δ_A = sqrt(mean_i ‖H_i − H‖²) (the theory's λ = δ_A is a worst case), Acc-S-DANE's with
`ACC_HETEROGENEITY_DIVISOR` for 16; for d ≤ 512, where it is smaller, the λ at which the local preconditioners'
departure from the global one balances the slowest flat direction's contraction
(`baselines.federated.balanced_prox_weight`).  Under client sampling (s < m) the null is at least
0.5·q·(‖H‖ + 2δ_A), q = (m − s)/(s(m − 1)) (Acc-S-DANE: 1.0·q·(‖H‖ + 2δ_A), `ACC_SAMPLED_PROX_PER_CURVATURE`)
(`baselines.federated.sampled_prox_weight`: the floor a sampled run stalls at falls as 1/λ, as the paper's λ under
partial participation grows with the sampling variance).  Under full participation a null λ doubles, up to δ_A, when
the objective climbs or cycles, or (S-DANE) its steps settle into an overshoot (`baselines.federated.CyclingObjective`;
``adaptive=true`` moves λ itself).
Acc-S-DANE (Algorithm 2, ``accelerated=true``) centres the round at y = (A x + a v)/(A + a) instead
of v, where a > 0 solves λa² = (A + a)B, and after the round A ← A + a, B ← B + μa (A = 0, B = 1 at
the start).  With one client and an exact solve, S-DANE is the proximal point method v ← prox_{O/λ}(v)
(then x = v every round).

The local solve is ``local_solver`` (`baselines.federated`): ``problem`` (exact on a quadratic, Newton
to the problem's tolerance on a GLM, the inner torch optimizer on a network), ``cholesky``, ``cg``,
``svrg``, ``lbfgs`` (re-solved with a 100 times tighter tolerance, or twice the SVRG passes, up to
three times while the accuracy test fails), or ``steps``: gradient steps on F_i from the centre with
step 1/(max_i L_i + λ) until the test holds (at most ``local_steps``).  Records carry ``local_failed``:
whether this worker's last solve ended without passing the test (``problem`` on a network is not tested).

Acc-S-DANE is mlolab/S-DANE's ``SDANE(acceleration=True)`` line by line: a from λa² = (A + a)B with the B before
the round (its ``update_a``) and the round's λ (after an adaptive halving or doubling), y = (A x + a v)/(A + a)
from the last round's x, the v-update's weights with B, then A += a, B += μa; a rejected round leaves x, v, A, B.

*When acceleration pays.*  With exact local solves S-DANE contracts a direction of curvature s by λ/(s + λ)
a round, so its rounds grow as λ/μ and Acc-S-DANE's as sqrt(λ/μ): the papers' ranking (Acc-S-DANE in fewer
rounds than S-DANE) needs λ/μ large, as at the theory's λ ≈ δ_A.  The default λ is near the best fixed one, often
below μ, and there both take a handful of rounds and the extrapolation has nothing to gain.  Plain DANE at μ = 0
takes Newton-like steps and has no prox term to slow the flat directions: where the local problems are convex and
the dissimilarity sits in directions of curvature at least δ, it needs fewer rounds than either
(``scripts/bench_federated.py --setting quadratic``).

*Exact solves.*  With exact local solves and S the clients of both allreduces, mean_S ∇F_i(x_i) = 0 gives
G = λ(v − x), and the v-update returns v = x: S-DANE is then DANE (FedDANE with η = 1, μ = λ, solving on its
gradient's clients) round for round; its gain is the milder accuracy test.  Under client sampling both have a
floor (the sampled gradient is not zero at the optimum) and a sampled run ends with status ``sampling_floor``
once its objective stops improving (`baselines.federated.SamplingFloor`); the floor falls as 1/λ, hence the larger
sampled default (above; its side-by-side run against a λ grid: results/bench_runs/sampled_lambda.json).

The record of round r is x_r (the paper's output), measured in allreduce 1 (x_0 = v_0).
Departure from the paper: the accuracy test is per client (the paper's sums over S, which the
per-client test implies).  ``adaptive=true`` is the paper's adaptive λ as mlolab/S-DANE runs it (full
participation only): after an accepted round λ is halved, after a rejected one doubled and the round's
result dropped (`SDANE.accepts`, a third allreduce a round); records carry ``accepted``.  Acc-S-DANE at its
default λ (full participation, convex: where `baselines.federated.CyclingObjective` watches it) restarts its
extrapolation (A = 0, B = 1, v = x) after a round whose objective rose above the last round's and when λ doubles:
the function-value adaptive restart of O'Donoghue & Candès (2015).  Without it the extrapolation's bumps read as
cycles, λ doubled past its best, and on bench_defaults' rare one-hot logistic cells with λ = 1e-5 the default did not
reach 1e-8 in 150 rounds (results/bench_runs/defaults_federated_v10_acc.json beside
defaults_federated_v11_acc.json).  A λ the user sets runs the paper's algorithm unchanged.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from dane import checks
from dane.algorithm import AlgorithmConfig, Column
from dane.comm import Communicator
from dane.local_solvers import LocalSolver
from dane.problems import Problem
from dane.sampling import SamplingKeys

from .federated import (GAP_BALANCE, HETEROGENEITY_DIVISOR, SAMPLED_PROX_PER_CURVATURE, Federated, LocalSolveKeys,
                        default_prox_weight)

RETRIES = 3  # tighter re-solves of an iterative local solver whose result fails the accuracy test
#: Acc-S-DANE's δ_A-based default λ is at least δ_A (δ_A/‖H‖)² / this (S-DANE's rule has 16, `baselines.federated`).  At S-DANE's
#: rule Acc-S-DANE diverged on phishing over 20 and over 100 Dirichlet clients (δ_A/‖H‖ ≈ 0.6 and 1), where it
#: converged at δ_A/8 (``make bench``'s ``federated`` sections); on the defaults families (δ_A/‖H‖ ≤ 0.45) it is
#: the floor or this term (scripts/bench_defaults.py measures both).
ACC_HETEROGENEITY_DIVISOR = 4
#: Acc-S-DANE's sampled default λ is at least this times q·(‖H‖ + 2δ_A) (S-DANE's: `baselines.federated`'s 0.5): its
#: extrapolation carries more of the sampled gradient's noise, and at S-DANE's factor its floor stayed above
#: S-DANE's on label-skewed shards (results/bench_runs/sampled_lambda_acc.json beside sampled_lambda.json).
ACC_SAMPLED_PROX_PER_CURVATURE = 1.0
#: Acc-S-DANE's balanced default λ (d ≤ 512) is where this times the mean preconditioner gap meets the flat rate
#: (S-DANE's: `baselines.federated.GAP_BALANCE`; a larger value is a larger λ): at S-DANE's its extrapolation climbed
#: on bench_defaults' rare one-hot logistic cells with λ = 1e-5 (defaults_federated_v9.json beside v10_acc).
ACC_GAP_BALANCE = 2.0


def extrapolation(lam: float, A: float, B: float) -> float:
    """a > 0 with λa² = (A + a)B (Acc-S-DANE's step)."""
    return (B + math.sqrt(B * B + 4.0 * lam * A * B)) / (2.0 * lam)


class SDANE(Federated):
    name = "sdane"
    label = "S-DANE"
    floors_under_sampling = True  # module docstring
    columns = (*Federated.columns, Column("lam", "{:>8.3g}"))

    def __init__(self, problem: Problem, comm: Communicator, *, lam: float | None = None, mu: float | None = None,
                 accelerated: bool = False, adaptive: bool = False, **kwargs):
        super().__init__(problem, comm, **kwargs)
        self.adaptive, self.accepted = adaptive, True
        divisor, per_curvature, balance = (
            (ACC_HETEROGENEITY_DIVISOR, ACC_SAMPLED_PROX_PER_CURVATURE, ACC_GAP_BALANCE) if accelerated
            else (HETEROGENEITY_DIVISOR, SAMPLED_PROX_PER_CURVATURE, GAP_BALANCE))
        if lam is None:
            lam, delta_a = default_prox_weight(problem, comm, "algorithm.lam", divisor, sampler=self.sampler,
                                               per_curvature=per_curvature, balance=balance)
            if not adaptive:  # adaptive: the line search moves λ
                self.watch_default_weight(delta_a)
        self.lam = lam
        self.accelerated = accelerated
        self.mu = float(problem.strong_convexity or 0.0) if mu is None else mu
        self.v = self.w.clone()
        self.A, self.B = 0.0, 1.0
        self.local_failed = False
        self.last_objective: float | None = None  # Acc-S-DANE's restart test (a default λ only)

    def step(self) -> dict[str, float]:
        lam, mu, x, v = self.lam, self.mu, self.w, self.v
        if self.accelerated:
            a = extrapolation(lam, self.A, self.B)
            centre = (self.A * x + a * v) / (self.A + a)                     # y
        else:
            a, centre = 1.0 / lam, v
        members, inside = self.members()                                      # S
        grad_x, payload = self.grad_and_payload(x)                           # x_r's metrics ride along
        grad_c = grad_x if torch.equal(centre, x) else self.local_grad(centre)
        (g_bar,), reduced = self.average(members, [grad_c], payload, down=[centre])   # 1. mean_S ∇O_j(centre)
        x_i, grad_i = centre, grad_c
        if inside:
            x_i, grad_i = self.local_solve(centre, grad_c - g_bar, grad_c)   # 2. x_i ≈ argmin F_i
        (x_bar, G), _ = self.average(members, [x_i, grad_i], down=[g_bar])   # 3. x = mean x_i, G = mean ∇O_i(x_i)
        if self.adaptive and not self.accepts(centre, x_i, grad_i, x_bar, G):
            self.lam, self.accepted = 2.0 * lam, False                        # rejected: x, v, A, B stay
            return {**self.record(reduced, members), "lam": lam, "accepted": False}
        B = self.B if self.accelerated else 1.0
        self.v = (B * v + a * mu * x_bar - a * G) / (B + a * mu)
        self.w = x_bar
        if self.accelerated:
            self.A, self.B = self.A + a, self.B + mu * a
        extra = {}
        if self.adaptive:
            self.lam, self.accepted, extra = 0.5 * lam, True, {"accepted": True}  # accepted: try half next round
        out = {**self.record(reduced, members), "lam": lam, "local_failed": self.local_failed, **extra}
        point = None if self.accelerated else x_bar  # an accelerated run's steps turn back by design
        self.lam = self.cycling.next_weight(self.lam, out["objective"], point)  # a default λ doubles: cycles, overshoot
        if self.accelerated and self.cycling.active:  # a default λ: restart the extrapolation from x (docstring)
            rose = self.last_objective is not None and out["objective"] > self.last_objective
            if rose or self.lam != lam:
                self.A, self.B, self.v = 0.0, 1.0, x_bar.clone()
            self.last_objective = out["objective"]
        return out

    def accepts(self, centre, x_i, grad_i, x_bar, G) -> bool:
        r"""The adaptive-λ acceptance test (mlolab/S-DANE's line search), one more allreduce:

        .. math:: \frac1m\sum_i\langle \nabla O_i(x_i) - h_i(\bar x), c - x_i\rangle \ge \frac{\|G\|^2}{2\lambda},
                  \qquad h_i(\bar x) = \nabla O_i(\bar x) - \frac1m\sum_j \nabla O_j(\bar x),

        computed as mean_i⟨∇O_i(x_i) − ∇O_i(x̄), c − x_i⟩ + ⟨mean_j ∇O_j(x̄), c − x̄⟩.
        """
        grad_bar = self.local_grad(x_bar)
        local = (grad_i - grad_bar) @ (centre - x_i)
        (g_at_bar, inner), _ = self.average(self.sampler.draw_all(), [grad_bar, local.reshape(1)])
        lhs = float(inner) + float(g_at_bar @ (centre - x_bar))
        return lhs >= float(G @ G) / (2.0 * self.lam)

    def local_solve(self, centre: torch.Tensor, h: torch.Tensor, grad_c: torch.Tensor):
        """(x_i, ∇O_i(x_i)) with x_i ≈ argmin O_i(x) − ⟨h, x⟩ + (λ/2)‖x − centre‖², to the accuracy test."""
        lam = self.lam

        def passes(z: torch.Tensor, grad_z: torch.Tensor) -> bool:
            return bool(torch.linalg.vector_norm(grad_z - h + lam * (z - centre))
                        <= 0.5 * lam * torch.linalg.vector_norm(z - centre))

        if self.local.local_solver == "steps":
            z, grad_z, lr = centre, grad_c, self.step_size(lam)
            for _ in range(self.local.local_steps):
                z = z - lr * (grad_z - h + lam * (z - centre))
                grad_z = self.local_grad(z)
                if passes(z, grad_z):
                    break
            self.local_failed = not passes(z, grad_z)
            return z, grad_z
        z = self.prox(centre, h, lam, anchor_grad=grad_c)
        grad_z = self.local_grad(z)
        solver = self.solver
        for _ in range(RETRIES if solver is not None and solver.method in ("cg", "svrg", "lbfgs") else 0):
            if passes(z, grad_z):
                break
            solver = tighter(solver)
            z = self.problem.prox_solve(centre, h, lam, anchor_grad=grad_c, solver=solver)
            grad_z = self.local_grad(z)
        self.local_failed = self.problem.strong_convexity is not None and not passes(z, grad_z)
        return z, grad_z

    def floor_diagnosis(self) -> str:
        return (f"{super().floor_diagnosis()}; a larger algorithm.lam (now {self.lam:.3g}) lowers it and slows each "
                f"round")

    def state_dict(self) -> dict:
        return {**super().state_dict(), "v": self.v.clone(), "A": self.A, "B": self.B, "lam": self.lam,
                "accepted": self.accepted, "last_objective": self.last_objective}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.v, self.A, self.B = state["v"].clone(), float(state["A"]), float(state["B"])
        self.lam, self.accepted = float(state["lam"]), bool(state["accepted"])
        self.last_objective = state.get("last_objective")  # absent in checkpoints from before the restart


def tighter(solver: LocalSolver) -> LocalSolver:
    """The same solver asked for more: twice the SVRG passes, else a 100 times smaller tolerance."""
    if solver.method == "svrg":
        passes = solver.passes if isinstance(solver.passes, int) else 3
        return replace(solver, passes=2 * passes)
    return replace(solver, tol=solver.tol / 100)


class AccSDANE(SDANE):
    name = "acc_sdane"
    label = "Acc-S-DANE"


@dataclass(frozen=True)
class SDANEConfig(AlgorithmConfig, SamplingKeys, LocalSolveKeys):
    lam: float | None = None
    mu: float | None = None
    accelerated: bool = False
    adaptive: bool = False
    local_steps: int = 1000
    seed: int = 0
    name: str = "sdane"
    algorithm = SDANE

    def __post_init__(self) -> None:
        if self.lam is not None:
            checks.positive("algorithm.lam", self.lam)
        if self.mu is not None:
            checks.nonnegative("algorithm.mu", self.mu)
        checks.boolean("algorithm.accelerated", self.accelerated)
        checks.boolean("algorithm.adaptive", self.adaptive)
        self.check_local()
        self.check_sampling()
        if self.adaptive:
            self.refuse_sampling(self.name + " algorithm.adaptive=true", "the line search's test averages over every "
                                 "client (the paper's and mlolab/S-DANE's adaptive lambda is for full participation)")
        checks.integer("algorithm.seed", self.seed)

    def build(self, problem: Problem, comm: Communicator) -> "SDANE":
        return (AccSDANE if self.accelerated else SDANE)(problem, comm, lam=self.lam, mu=self.mu,
                                                         accelerated=self.accelerated, adaptive=self.adaptive,
                                                         sampling=self, local=self, seed=self.seed)


@dataclass(frozen=True)
class AccSDANEConfig(SDANEConfig):
    accelerated: bool = True
    name: str = "acc_sdane"
    algorithm = AccSDANE
