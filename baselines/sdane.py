r"""S-DANE and Acc-S-DANE (Jiang, Rodomanov & Stich, NeurIPS 2024): DANE stabilized by a prox-centre v.

Round r of S-DANE (the paper's Algorithm 1), clients S (all m without sampling), two allreduces:

.. math::
    \bar g &= \frac1{|S|}\sum_{j\in S}\nabla O_j(v), \qquad h_i = \nabla O_i(v) - \bar g        &&\text{(allreduce 1)}\\
    x_i &\approx \arg\min_x\; F_i(x) = O_i(x) - \langle h_i, x\rangle + \frac{\lambda}{2}\|x - v\|^2,
        \quad \|\nabla F_i(x_i)\| \le \frac{\lambda}{2}\|x_i - v\|                              &&\text{(local solve)}\\
    x &= \frac1{|S|}\sum_{i\in S} x_i, \qquad G = \frac1{|S|}\sum_{i\in S}\nabla O_i(x_i)       &&\text{(allreduce 2)}\\
    v &\leftarrow \frac{B v + a\mu\,x - a\,G}{B + a\mu}

with a = 1/λ and B = 1; μ ≥ 0 is the strong convexity of O (``mu``; null: the problem's).
λ = ``lam``: a number.  ``null`` is resolved before the method is built by `baselines.defaults.prox_weight` from
δ_A, ‖H‖ and the preconditioner gap measured at w_0 (Acc-S-DANE with its own constants, ``ACC_*`` there); under full
participation on a convex problem a null λ then doubles, up to δ_A, when the objective climbs or cycles or (S-DANE)
the steps settle into an overshoot (`baselines.adaptive.WeightDoubling`; ``adaptive=true`` moves λ itself).  Both
are this package's rules, not the paper's, and a run lists them (``algorithm.paper=true``: resolved and frozen).
Acc-S-DANE (Algorithm 2, ``accelerated=true``) centres the round at y = (A x + a v)/(A + a) instead
of v, where a > 0 solves λa² = (A + a)B, and after the round A ← A + a, B ← B + μa (A = 0, B = 1 at
the start).  With one client and an exact solve, S-DANE is the proximal point method v ← prox_{O/λ}(v)
(then x = v every round).

The local solve is ``local_solver`` (`baselines.federated`): ``problem`` (exact on a quadratic, Newton
to the problem's tolerance on a GLM, the inner torch optimizer on a network), ``cholesky``, ``cg``,
``svrg``, ``lbfgs`` (with the problem's ``local_tol``, caps and SVRG keys), or ``steps``: gradient steps on F_i from
the centre with step 1/(max_i L_i + λ) until the test holds (at most ``local_steps``); at ``lr`` null that step
follows the round's λ (``adaptive=true`` moves λ every round, ``double_weight`` on a doubling; the summary's defaults
give the step at the starting λ), and each record carries the step its round took as ``lr``.  The paper's round asks
for the test to hold, and how a solver meets it is this package's rule, ``local_retry``
(`baselines.adaptive.LocalRetry`, kept under ``algorithm.paper=true``; ``algorithm.adapt`` without it turns it off): a
cg, svrg or lbfgs solve that fails the test is solved again, up to `baselines.adaptive.LOCAL_RETRIES` = 3 times,
with twice the SVRG passes the failed solve ran (``auto``'s as resolved), twice a fixed count's products or iterations
at ``local_tol=0``, else a 100 times tighter tolerance (`baselines.defaults.tighter`).  Each re-solve counts one
``local_resolves`` in the client's local work (`dane.work`), which reaches rank 0 outside the round's messages, so the
method sends what the paper's round sends.  The record after a round where any client re-solved carries that round's
event (``adapted``: the first re-solve's setting and the round's re-solves; `baselines.adaptive.LocalRetry` says what
it leaves out), and the records' local work counts every re-solve's work.  Records carry ``local_failed``: whether
this worker's last solve ended without passing the test (``problem`` on a network is not tested).

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
once its objective stops improving (`baselines.adaptive.FloorStop`); the floor falls as 1/λ, hence the larger
sampled default (above; its side-by-side run against a λ grid: ``make bench`` section ``sampled``).

The record of round r is x_r (the paper's output), measured in allreduce 1 (x_0 = v_0).
Departure from the paper: the accuracy test is per client (the paper's sums over S, which the
per-client test implies).  ``adaptive=true`` is the paper's adaptive λ as mlolab/S-DANE runs it (full
participation only): after an accepted round λ is halved, after a rejected one doubled and the round's
result dropped (`SDANE.accepts`, a third allreduce a round); records carry ``accepted``.  Acc-S-DANE at its
default λ (full participation, convex) restarts its extrapolation (A = 0, B = 1, v = x) after a round whose
objective rose above the last round's and when λ doubles (`baselines.adaptive.Restart`: the function-value adaptive
restart of O'Donoghue & Candès 2015; without it the extrapolation's bumps read as cycles and λ doubled past its best
on ``make bench``'s ``defaults`` one-hot logistic cells).  A λ the user sets runs the paper's algorithm unchanged.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dane import checks
from dane.algorithm import AlgorithmConfig, Column
from dane.comm import Communicator
from dane.numerics.local_solvers import svrg_passes_at
from dane.problems import Problem
from dane.sampling import SamplingKeys
from dane.work import count

from .adaptive import Adaptation, FloorStop, LocalRetry, Restart, WeightDoubling
from .defaults import (ACC_GAP_BALANCE, ACC_HETEROGENEITY_DIVISOR, ACC_SAMPLED_PROX_PER_CURVATURE, GAP_BALANCE,
                       HETEROGENEITY_DIVISOR, SAMPLED_PROX_PER_CURVATURE, Resolution, local_step, tighter)
from .federated import LocalSolveKeys, LocalSolving, PolicyKeys, resolve_prox_weight



def extrapolation(lam: float, A: float, B: float) -> float:
    """a > 0 with λa² = (A + a)B (Acc-S-DANE's step)."""
    return (B + math.sqrt(B * B + 4.0 * lam * A * B)) / (2.0 * lam)


class SDANE(LocalSolving):
    name = "sdane"
    label = "S-DANE"
    # λ (> 0 already) shifts the local Hessian of an exact solve; one below the round-off of the shard's curvature fails
    singular_remedy = " or a larger algorithm.lam"
    columns = (*LocalSolving.columns, Column("lam", "{:>8.3g}"))
    own_state = ()  # the clients outside S_t may sleep (`dane.comm.roster`), unless λ's test takes every client

    @classmethod
    def sleeps_out(cls, config) -> bool:
        return not config.adaptive

    def __init__(self, problem: Problem, comm: Communicator, *, lam: float, mu: float, accelerated: bool = False,
                 adaptive: bool = False, **kwargs):
        super().__init__(problem, comm, **kwargs)
        self.lam, self.mu, self.accelerated, self.adaptive, self.accepted = lam, mu, accelerated, adaptive, True
        self.v = self.w.clone()
        self.A, self.B = 0.0, 1.0
        self.local_failed = False
        self.retry = next((a for a in self.adaptations if isinstance(a, LocalRetry)), None)

    def round(self) -> dict[str, float]:
        lam, mu, x, v, A, B = self.lam, self.mu, self.w, self.v, self.A, self.B
        a = extrapolation(lam, A, B) if self.accelerated else 1.0 / lam
        centre = (A * x + a * v) / (A + a) if self.accelerated else v          # y (Acc-S-DANE) or v
        members, inside = self.members()                                      # S
        if torch.equal(centre, x):                                            # x_r's metrics ride along
            grad_c, payload = self.grad_and_payload(x)
        else:  # the metrics alone at x_r (uncounted: only the record reads them), the method's gradient at the centre
            grad_c, payload = self.local_grad(centre), self.payload(x)
        (g_bar,), reduced = self.average(members, [grad_c], payload, down=[centre])   # 1. mean_S ∇O_j(centre)
        x_i, grad_i = self.local_solve(centre, grad_c - g_bar, grad_c) if inside else (centre, grad_c)  # 2. argmin F_i
        (x_bar, G), _ = self.average(members, [x_i, grad_i], down=[g_bar])   # 3. x = mean x_i, G = mean ∇O_i(x_i)
        step = {"lr": self.step_size(lam)} if self.L_max else {}              # the steps' 1/(max_i L_i + λ)
        if not (self.line_search(centre, x_i, grad_i, x_bar, G) if self.adaptive else True):  # adaptive λ
            return {**self.record(reduced, members), "lam": lam, **step, "accepted": False}  # rejected: x, v, A, B stay
        B = B if self.accelerated else 1.0
        self.v, self.w = (B * v + a * mu * x_bar - a * G) / (B + a * mu), x_bar  # 4. v-update
        if self.accelerated:
            self.A, self.B = A + a, B + mu * a
        return {**self.record(reduced, members), "lam": lam, **step, "local_failed": self.local_failed,
                **({"accepted": True} if self.adaptive else {})}

    def line_search(self, centre, x_i, grad_i, x_bar, G) -> bool:
        """The paper's adaptive λ (``adaptive=true``): `accepts` the round, then λ is halved (accepted) or doubled."""
        self.accepted = self.accepts(centre, x_i, grad_i, x_bar, G)
        self.lam = 0.5 * self.lam if self.accepted else 2.0 * self.lam
        return self.accepted

    def accepts(self, centre, x_i, grad_i, x_bar, G) -> bool:
        r"""The adaptive-λ acceptance test (mlolab/S-DANE's line search), one more allreduce:

        .. math:: \frac1m\sum_i\langle \nabla O_i(x_i) - h_i(\bar x), c - x_i\rangle \ge \frac{\|G\|^2}{2\lambda},
                  \qquad h_i(\bar x) = \nabla O_i(\bar x) - \frac1m\sum_j \nabla O_j(\bar x),

        computed as mean_i⟨∇O_i(x_i) − ∇O_i(x̄), c − x_i⟩ + ⟨mean_j ∇O_j(x̄), c − x̄⟩.
        """
        grad_bar = self.local_grad(x_bar)
        local = (grad_i - grad_bar) @ (centre - x_i)
        (g_at_bar, inner), _ = self.average(self.sampler.draw_all(), [grad_bar, local.reshape(1)], down=[x_bar])
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
        solver, resolves = self.solver, 0
        while self.retry is not None and resolves < self.retry.limit and not passes(z, grad_z):
            # ``local_retry``: twice the passes the failed SVRG solve ran (``auto`` resolved on this shard at λ), twice
            # a fixed count, or a 100 times smaller tolerance (`tighter`)
            ran = svrg_passes_at(self.local_problem, solver, lam) if solver.method == "svrg" else None
            solver = tighter(solver, ran)
            z = self.problem.prox_solve(centre, h, lam, anchor_grad=grad_c, solver=solver)
            grad_z = self.local_grad(z)
            resolves += 1
            count("local_resolves")  # bookkeeping: with the ledger's table, not in the round's messages
        self.local_failed = self.problem.strong_convexity is not None and not passes(z, grad_z)
        return z, grad_z

    def floor_diagnosis(self, floor) -> str:
        return (f"{super().floor_diagnosis(floor)}; a larger algorithm.lam (now {self.lam:.3g}) lowers it and slows "
                f"each round")

    def state_dict(self) -> dict:
        return {**super().state_dict(), "v": self.v.clone(), "A": self.A, "B": self.B, "lam": self.lam,
                "accepted": self.accepted}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.v, self.A, self.B = state["v"].clone(), float(state["A"]), float(state["B"])
        self.lam, self.accepted = float(state["lam"]), bool(state["accepted"])


class AccSDANE(SDANE):
    name = "acc_sdane"
    label = "Acc-S-DANE"


@dataclass(frozen=True)
class SDANEConfig(AlgorithmConfig, SamplingKeys, LocalSolveKeys, PolicyKeys):
    lam: float | None = None
    mu: float | None = None
    accelerated: bool = False
    adaptive: bool = False
    local_steps: int = 1000
    seed: int = 0
    name: str = "sdane"
    algorithm = SDANE
    mu_role = "strong_convexity"

    @property
    def adaptation_names(self) -> tuple[str, ...]:
        """The adaptations `build` may attach: Acc-S-DANE's extrapolation restart besides S-DANE's."""
        return (WeightDoubling.name, *(Restart.name,) * self.accelerated, FloorStop.name, LocalRetry.name)

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
        checks.seed("algorithm.seed", self.seed)
        self.check_policy()

    def build(self, problem: Problem, comm: Communicator) -> "SDANE":
        """The nulls resolved (`baselines.defaults`), the adaptations that apply attached (`baselines.adaptive`)."""
        resolution, adaptations = Resolution(), []
        smoothness = self.measured_smoothness(problem, comm, resolution)
        (s, m), lam, mu = self.clients(comm), self.lam, self.mu
        if lam is None:
            rule = ((ACC_HETEROGENEITY_DIVISOR, ACC_GAP_BALANCE, ACC_SAMPLED_PROX_PER_CURVATURE) if self.accelerated
                    else (HETEROGENEITY_DIVISOR, GAP_BALANCE, SAMPLED_PROX_PER_CURVATURE))
            lam, delta_a = resolve_prox_weight(problem, comm, "lam", resolution, s=s, m=m, divisor=rule[0],
                                               balance=rule[1], per_curvature=rule[2])
            watched = not self.adaptive and s == m and problem.strong_convexity is not None  # adaptive: moves λ itself
            adaptations += [WeightDoubling("lam", delta_a, point=not self.accelerated, smoothness=smoothness,
                                           solver=self.solves_with(problem))] * \
                (watched and self.allows("double_weight"))
            adaptations += [Restart()] * (watched and self.accelerated and self.allows("restart"))
        if mu is None:
            mu = resolution.add("mu", float(problem.strong_convexity or 0.0), "the problem's")
        if smoothness:
            resolution.add("lr", local_step(smoothness, lam), "local_step", smoothness=smoothness, shift=lam)
        adaptations += [FloorStop()] * (s < m and self.allows("sampling_floor"))
        solver = self.solver(problem.solver)
        if solver is not None and solver.method in ("cg", "svrg", "lbfgs") and self.allows("local_retry"):
            adaptations.insert(0, LocalRetry(solver))
        return (AccSDANE if self.accelerated else SDANE)(
            problem, comm, lam=lam, mu=mu, accelerated=self.accelerated, adaptive=self.adaptive, sampling=self,
            local=self, seed=self.seed, smoothness=smoothness, adaptations=adaptations, defaults=resolution.entries)


@dataclass(frozen=True)
class AccSDANEConfig(SDANEConfig):
    accelerated: bool = True
    name: str = "acc_sdane"
    algorithm = AccSDANE
