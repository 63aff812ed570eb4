r"""FedProx (Li, Sahu, Zaheer, Sanjabi, Talwalkar & Smith, MLSys 2020): averaged proximal local solves.

Round t, clients S_t (all m without sampling), one allreduce:

.. math::
    w_i &\approx \arg\min_w\; O_i(w) + \frac{\mu}{2}\|w - w_t\|^2 \qquad (i \in S_t) \\
    w_{t+1} &= \frac1{|S_t|}\sum_{i\in S_t} w_i

The local solve is ``local_solver`` (`baselines.federated`): ``steps`` (the paper's, K = ``local_steps``
gradient steps on the proximal objective from w_t, step 1/(max_i L_i + μ)), or exact (``problem``)
or any solver of the package.  With μ = 0 and ``steps`` this is FedAvg (`baselines.local_sgd`, mean).
FedProx does not converge to the minimizer of O on heterogeneous shards: its fixed point satisfies
mean_i prox_{O_i/μ}(w) = w, which is w* only when the shards agree; μ trades that bias against speed.

Under full participation a round is a fixed map w ↦ T(w), and the run ends early, with status
``client_drift`` and a one-line diagnosis, once the clients' moves cancel in the average:
ρ_t = ‖w_{t+1} − w_t‖ / mean_i ‖w_i − w_t‖ at most `FIXED_POINT` times ρ_0 (the scalar ‖w_i − w_t‖ rides in
the round's allreduce, 8 bytes).  On identical shards ρ_t = 1 all the way to the optimum; on differing
shards it falls to 0 at the fixed point, where every client still moves.  A target met first ends the
run ``converged``.  With client sampling the iterate never settles, and `diagnosis` names the floor
at the round cap instead.

Departure from the paper: full local gradients (the paper takes minibatch SGD epochs), so that
runs are deterministic; the paper's tuned μ ∈ {0.001, 0.01, 0.1, 1}, 0.01 by default here.

Departure on unequal shards, FedAvg's and FedProx's alike.  Client k's objective is
O_k = s_k F_k + R with s_k = m n_k/N (F_k its mean loss per row, R the regularizer: `dane.problems`), so that
O = (1/m) Σ_k O_k, and the server takes the plain mean; the papers' client steps on F_k + R (McMahan et al. 2017 at
one lr for every client) and their server weights the clients by n_k/N (FedAvg's average, FedProx's draw ∝ n_k).
Divided by s_k, client k's problem here is the paper's at a proximal weight μ_k of its own, with R divided by s_k:

.. math:: O_k(w) + \frac{\mu}{2}\|w - w_t\|^2
    = s_k\Big(F_k(w) + \frac{R(w)}{s_k} + \frac{\mu_k}{2}\|w - w_t\|^2\Big), \qquad \mu_k = \frac{\mu N}{m n_k},

and ``steps`` takes the paper's steps at s_k·lr.  With ``steps`` at K = 1 a round is the paper's, w_t − lr ∇O(w_t)
(the plain mean of the s_k-scaled steps is the n_k-weighted mean of the paper's), and on equal shards (s_k = 1) every
round is; for K > 1 a client's steps scale with m n_k/N (a large shard moves further than the paper's, a small one
less; ``lr`` null reads the L_k of the O_k, which carry s_k), and an exact solve's μ_k grows as n_k falls.
McMahan's weighting is ``algorithm=local_sgd algorithm.aggregate=weighted`` (steps on O_k/s_k at lr, the mean weighted
by n_k), but for R, which it carries at R/s_k where the paper's clients carry it whole (`baselines.local_sgd`: the
same where R = 0 or the shards are equal), and without client sampling.  ``sampling=size`` is refused: each O_k
already carries s_k (`dane.sampling`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dane import checks
from dane.algorithm import AlgorithmConfig, Column
from dane.comm import Communicator
from dane.problems import Problem, ProblemConfig
from dane.records.projection import STALL, fit, log_change
from dane.sampling import SamplingKeys

from .adaptive import FIXED_POINT, STALLED, DriftStop, stalled
from .defaults import Resolution, local_step
from .federated import LocalSolveKeys, LocalSolving, PolicyKeys

__all__ = ["FIXED_POINT", "STALLED", "FedProx", "FedProxConfig"]


class FedProx(LocalSolving):
    name = "fedprox"
    label = "FedProx"
    singular_remedy = " or algorithm.mu > 0"  # μ shifts the local Hessian of an exact solve (local_solver not steps)
    batchable = True  # its round reads the same on stacked tensors, the participants' rows (`Federated.members`)
    stacked_needs = "gradients"
    own_state = ()  # no state of a client's own: the clients outside S_t may sleep (`dane.comm.roster`)
    columns = (*LocalSolving.columns, Column("mu", "{:>8.3g}"))

    def __init__(self, problem: Problem, comm: Communicator, *, mu: float = 0.01, **kwargs):
        super().__init__(problem, comm, **kwargs)
        self.mu = mu
        self.moves = (0.0, 0.0)  # (‖w_{t+1} − w_t‖, mean_i ‖w_i − w_t‖) for `baselines.adaptive.DriftStop`
        self.watch = any(isinstance(a, DriftStop) for a in self.adaptations)  # mean_i ‖w_i − w_t‖ rides along

    def round(self) -> dict[str, float]:
        members, inside = self.members()                                          # S_t
        w = self.w
        w_local = self.prox(w, torch.zeros_like(w), self.mu) if inside else w   # local prox solve
        moved = [torch.linalg.vector_norm(w_local - w, dim=-1).unsqueeze(-1)] if self.watch else []  # (m, 1) stacked
        (self.w,), reduced = self.average(members, [w_local], [*self.payload(w), *moved], down=[w])  # mean_S w_i
        if self.watch:
            *reduced, client_moves = reduced
            self.moves = (float(torch.linalg.vector_norm(self.w - w)), float(client_moves))
        return {**self.record(reduced, members), "mu": self.mu}

    def fixed_point(self) -> str:
        """Why more rounds do not help, and the knobs: FedProx's fixed point, or FedAvg's (μ = 0, gradient steps)."""
        if self.mu == 0 and self.local.local_solver == "steps":
            what = ("FedAvg's fixed point (the mean of the clients' local gradient steps from w is w)",
                    f"fewer algorithm.local_steps (now {self.local.local_steps}) or a smaller algorithm.lr lower the "
                    f"floor and slow each round")
        else:
            what = ("FedProx's fixed point (mean_i prox_(O_i/mu)(w) = w)",
                    f"a larger algorithm.mu (now {self.mu:g}) lowers the floor and slows each round")
        return (f"{what[0]} is not the optimum when the shards differ (client drift), and more rounds do not reach the "
                f"target; {what[1]}, and algorithm=scaffold or algorithm=sdane correct the drift")

    def diagnosis(self, records: list[dict]) -> str | None:
        """At the round cap, an objective that has stalled (its last quarter of rounds moved it by at most
        `STALLED` of the run's whole decrease) is FedProx's floor, not slowness: its fixed point is not the
        optimum when the shards differ (module docstring), whatever the number of rounds.  Not where the records'
        suboptimality still contracts (`dane.records.projection.fit` moves it by more than its ``STALL``): a slow run near the
        optimum moves its objective little against the first rounds' fall, and the stop line already says how many
        rounds it needs."""
        if not stalled([r["objective"] for r in records if math.isfinite(r.get("objective", math.nan))]):
            return None
        fitted = fit(records, "suboptimality")
        if fitted is not None and log_change(fitted[0], fitted[1]) < -STALL:
            return None
        return f"the objective has stalled: {self.fixed_point()}"


@dataclass(frozen=True)
class FedProxConfig(AlgorithmConfig, SamplingKeys, LocalSolveKeys, PolicyKeys):
    mu: float = 0.01
    local_solver: str = "steps"
    seed: int = 0
    name: str = "fedprox"
    algorithm = FedProx
    mu_role = "damping"
    adaptation_names = (DriftStop.name,)

    def __post_init__(self) -> None:
        checks.nonnegative("algorithm.mu", self.mu)
        self.check_local()
        self.check_sampling()
        checks.seed("algorithm.seed", self.seed)
        self.check_policy()

    def stacked_form(self, problem: ProblemConfig, size: int) -> str | None:
        """Gradient steps only (`LocalSolveKeys.stacked_solve`), on the problem's stacked form."""
        return self.stacked_solve() or super().stacked_form(problem, size)

    def build(self, problem: Problem, comm: Communicator) -> "FedProx":
        """``lr`` null resolved (`baselines.defaults.local_step`); the drift stop under full participation."""
        resolution = Resolution()
        smoothness = self.measured_smoothness(problem, comm, resolution)
        if smoothness:
            resolution.add("lr", local_step(smoothness, self.mu), "local_step", smoothness=smoothness, shift=self.mu)
        s, m = self.clients(comm)
        adaptations = [DriftStop()] * (s == m and self.allows("client_drift"))
        return FedProx(problem, comm, mu=self.mu, sampling=self, local=self, seed=self.seed, smoothness=smoothness,
                       adaptations=adaptations, defaults=resolution.entries)
