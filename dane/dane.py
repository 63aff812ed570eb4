r"""DANE: Distributed Approximate NEwton (Shamir, Srebro & Zhang, ICML 2014).

Round t on worker i of m, with step size η > 0 and proximal weight μ ≥ 0:

.. math::
    g_t &= \frac1m \sum_{i} \nabla O_i(w_t)  &&\text{(allreduce 1)} \\
    w_i &= \arg\min_w\; O_i(w) - \langle \nabla O_i(w_t) - \eta\, g_t, w\rangle
           + \frac{\mu}{2}\|w - w_t\|^2           &&\text{(local solve)} \\
    w_{t+1} &= \frac1m \sum_i w_i                 &&\text{(allreduce 2)}

For a quadratic the local solve is :math:`w_i = w_t - \eta (H_i + \mu I)^{-1} g_t`.

Departure from the paper: with ``safeguard=True`` (the default) μ is adapted so that
the method cannot diverge (on a non-convex problem: so that the objective stays bounded
and μ comes back down; see `dane.safeguard`); where the local solves return trials that are not finite and μ
cannot bring them back, the run ends diverged, naming what to change (`DANE.remedy`).  The check needs the global
objective of w_{t+1}, which rides in the next round's first allreduce, so an accepted round costs
no extra communication; a rejected one costs the round it undoes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .algorithm import Algorithm, AlgorithmConfig, Column, Finished, metrics_message, metrics_received
from .comm import Communicator
from .comm.compression import METRICS
from .numerics.local_solvers import LocalSolver, refuse_oversized_svrg, svrg_moved
from .numerics.svrg import load_svrg
from . import checks
from .problems import Problem
from .records.results import adaptation
from .safeguard import MuSafeguard
# the safeguard's rules lived here before dane.safeguard; their old import path still works
from .safeguard import ROUND_OFF_STEP, balanced_damping, round_off_sq, shortening_mu, snap  # noqa: F401


class DANE(Algorithm):
    name = "dane"
    label = "DANE"
    elastic = True  # μ and the safeguard's memory follow a change of workers (`load_elastic_state`)
    synchronous_because = "DANE's local solve needs the global gradient of the same iterate"
    singular_remedy = " or algorithm.mu > 0"  # μ shifts the local Hessian of the solve
    columns = (Column("mu", "{:>8.3g}"),)
    compressible = ("gradient",)  # the global gradient of step 1; the averaged iterate of step 3 is sent exactly
    batchable = True  # its step reads the same on stacked tensors (`dane.comm.batched`)

    def __init__(self, problem: Problem, comm: Communicator, *, eta: float = 1.0, mu: float = 0.0,
                 safeguard: bool = True, local_solver=None, w0: torch.Tensor | None = None):
        super().__init__(problem, comm, w0)
        self.eta = eta
        self.mu = mu
        self.local_solver = local_solver  # a dane.numerics.local_solvers.LocalSolver, or None: the problem's own
        refuse_oversized_svrg("algorithm.batch_size", local_solver, problem.n_local)  # before any collective
        load_svrg(problem, local_solver)  # numba's start-up in the set-up, not in round 0
        convex = problem.convex
        self.guard = MuSafeguard(mu, convex=convex, forget=not (convex and problem.quadratic)) if safeguard else None
        self.defaults, self.adaptations = (), (self.guard,) if self.guard else ()  # η and μ are numbers; μ's moves
        self.described: torch.Tensor | None = None  # the iterate the last record describes (`described_iterate`)

    def step(self) -> dict[str, float]:
        w = self.w
        local_grad, local_metrics = self.problem.evaluate(w)
        reads = self.guard is not None  # the safeguard reads O(w_t) and its statistics: the method's message
        parts, kinds = metrics_message(local_metrics, reads_objective=reads,
                                       beside=self.guard.local_stats(w, local_grad) if reads else None)
        g, *means = self.comm.allreduce_mean([local_grad, *parts], kinds=("gradient", *kinds))  # 1. g = mean ∇O_i
        metrics, stats = metrics_received(means, reads_objective=reads)
        extra = {}
        if self.guard is not None:
            w, local_grad, g, metrics, extra = self.guard.review(w, local_grad, g, metrics, stats)
            if self.guard.mu != self.mu:  # the solve's nulls that read μ follow it
                extra["adapted"] = [*extra["adapted"], *self.rederived(self.mu, self.guard.mu)]
            self.mu = self.guard.mu
            if self.guard.gave_up is not None:  # μ cannot bring the trials back: no solve, the run ends diverged,
                self.w = self.described = w      # on the last accepted iterate (the same verdict on every worker)
                self.finished = Finished("diverged", self.guard.gave_up, remedy=self.remedy())
                return {**self.metrics(g, metrics), "mu": self.mu, **extra}
        w_local = self.problem.prox_solve(w, local_grad - self.eta * g, self.mu,    # 2. local solve
                                          anchor_grad=local_grad, **solver_arg(self.local_solver))
        (self.w,) = self.comm.allreduce_mean([w_local], kinds=("iterate",))          # 3. w_{t+1} = mean w_i
        self.described = w if self.guard is not None else None
        return {**self.metrics(g, metrics), "mu": self.mu, **extra}

    def rederived(self, before: float, after: float) -> list[dict]:
        """The local solve's nulls that read μ, SVRG's step (`svrg_step`) and ``passes=auto`` (`svrg_passes`),
        re-derived as the safeguard moves μ from ``before`` to ``after``: one ``adapted`` event each whose value
        changed (`dane.records.results.adaptation`; ``workers``: this worker's ``[rank, from, to]``, from its rows,
        as the summary's ``defaults`` give them at the starting μ), under the key that left it null (``algorithm.*``
        where the method chose the solver, else ``problem.*``; `dane.numerics.local_solvers.svrg_moved`); none for given
        numbers or another solver."""
        solver = getattr(self.problem, "solver", None) if self.local_solver is None else self.local_solver
        return [adaptation(key, old, new, f"mu moved ({rule})", workers=[[self.comm.rank, old, new]])
                for _, key, rule, old, new in svrg_moved(self.problem, solver, before, after)]

    def remedy(self) -> str:
        """What to change where the safeguard gave up on trials that are not finite (`MuSafeguard.gave_up`): an SVRG
        local solve's given step (its key: ``algorithm.lr`` where the method chose the solver, else
        ``problem.svrg_lr``), a network's inner step, else an η above the paper's 1, else a μ floor (a local model
        that is singular at μ = 0)."""
        solver = self.local_solver if self.local_solver is not None else getattr(self.problem, "solver", None)
        if isinstance(solver, LocalSolver) and solver.method == "svrg" and solver.lr is not None:
            key = "algorithm.lr" if self.local_solver is not None else "problem.svrg_lr"
            return f"set {key} below {solver.lr:g} (SVRG's given step diverges), or null (1/L_max)"
        inner_lr = getattr(getattr(self.problem, "inner", None), "lr", None)  # a network's inner optimizer
        if self.eta > 1:
            return f"set algorithm.eta below {self.eta:g} (the paper's is 1)"
        if inner_lr is not None:
            return f"set problem.inner_lr below {inner_lr:g} (the inner optimizer's step diverges)"
        return "set algorithm.mu > 0 (a floor on mu: the local models may be singular at mu = 0)"

    def evaluate(self) -> dict[str, float]:
        """The last record's metrics: of the current iterate, or with the safeguard, of the last accepted one
        when the guard would reject the current one (then with ``accepted: False``), in the same one allreduce.

        The current iterate is the last round's trial; a run that ended on it would report (and return) a point
        the next round rejects (admissions.csv over 40 quantity-skewed shards, `tests/test_accepted_point.py`: the
        trial's objective rather than the accepted w_0's, log 2).  Nothing
        is changed: the guard's state stays as the last round left it, so that a resumed run is the same."""
        if self.guard is None:
            return super().evaluate()
        local_grad, local_metrics = self.problem.evaluate(self.w)
        g, metrics = self.comm.allreduce_mean([local_grad, local_metrics], kinds=(METRICS, METRICS))  # the record's
        if self.guard.would_accept(float(metrics[0])):
            self.described = self.w
            return self.metrics(g, metrics)
        self.described, _, g, metrics = self.guard.accepted
        return {**self.metrics(g, metrics), "accepted": False}

    def described_iterate(self, start: torch.Tensor | None) -> torch.Tensor:
        """With the safeguard, the point its review kept: the round's start when accepted, else the last accepted
        iterate (its record's metrics are that point's); without, `Rounds.described_iterate`'s."""
        if self.described is None:
            return super().described_iterate(start)
        return self.described

    def state_dict(self) -> dict:
        state = {**super().state_dict(), "mu": self.mu}
        if self.guard is not None:
            state["guard"] = self.guard.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.mu = state["mu"]
        if self.guard is not None:
            self.guard.load_state_dict(state["guard"])

    def load_elastic_state(self, state: dict) -> None:
        """μ and the safeguard's memory carry over a change of world size; see `MuSafeguard.rebase`."""
        super().load_elastic_state(state)
        if self.guard is not None:
            self.guard.rebase(self.problem)


@dataclass(frozen=True)
class DANEConfig(AlgorithmConfig):
    eta: float = 1.0
    mu: float = 0.0
    safeguard: bool = True
    name: str = "dane"
    algorithm = DANE
    mu_role = "damping"

    def __post_init__(self) -> None:
        checks.positive("algorithm.eta", self.eta)
        checks.nonnegative("algorithm.mu", self.mu)
        checks.boolean("algorithm.safeguard", self.safeguard)

    def build(self, problem: Problem, comm: Communicator) -> "DANE":
        return DANE(problem, comm, eta=self.eta, mu=self.mu, safeguard=self.safeguard)

    def recovery(self) -> list[str]:
        """Where the safeguard gave up on local solves whose trials are not finite (`MuSafeguard.gave_up`, the one
        way a safeguarded run on a convex problem diverges; the summary's ``remedy`` names the key of the run's
        solver, `DANE.remedy`, and the divergence line names it in place of these): an η above the paper's 1, and
        the local solver's step."""
        if not self.safeguard:
            return []
        return (["algorithm.eta=1 (the paper's step)"] if self.eta > 1 else []) + self.step_recovery()

    def step_recovery(self) -> list[str]:
        """`recovery`'s override of the local solver's step: the problem's SVRG step (an algorithm of one's own
        that chooses the solver overrides this)."""
        return ["problem.svrg_lr=null (where problem.local_solver=svrg: 1/L_max)"]


def solver_arg(local_solver) -> dict:
    """``prox_solve``'s keyword for a chosen local solver; none for the problem's own (networks take none)."""
    return {} if local_solver is None else {"solver": local_solver}
