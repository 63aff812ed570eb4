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
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dane import checks
from dane.algorithm import AlgorithmConfig, Column
from dane.comm import Communicator
from dane.problems import Problem
from dane.projection import STALL, fit, log_change
from dane.sampling import SamplingKeys

from .federated import Federated, LocalSolveKeys


class FedProx(Federated):
    name = "fedprox"
    label = "FedProx"
    columns = (*Federated.columns, Column("mu", "{:>8.3g}"))

    def __init__(self, problem: Problem, comm: Communicator, *, mu: float = 0.01, **kwargs):
        super().__init__(problem, comm, **kwargs)
        self.mu = mu
        self.first_ratio: float | None = None  # ρ_0 (module docstring)
        self.stalled: str | None = None        # the diagnosis, once at the fixed point

    def step(self) -> dict[str, float]:
        members, inside = self.members()                                          # S_t
        w = self.w
        w_local = self.prox(w, torch.zeros_like(w), self.mu) if inside else w   # local prox solve
        full = len(members) == self.comm.size
        moved = [torch.linalg.vector_norm(w_local - w).reshape(1)] if full else []  # ‖w_i − w_t‖ rides along
        (self.w,), reduced = self.average(members, [w_local], [*self.payload(w), *moved], down=[w])  # mean_S w_i
        if full:
            *reduced, client_moves = reduced
            self.watch_fixed_point(float(torch.linalg.vector_norm(self.w - w)), float(client_moves))
        return {**self.record(reduced, members), "mu": self.mu}

    def watch_fixed_point(self, moved: float, client_moves: float) -> None:
        """Full participation: set `stalled` once ‖w_{t+1} − w_t‖ / mean_i ‖w_i − w_t‖ ≤ `FIXED_POINT` × its round-0
        value: the clients still move, but their moves cancel (module docstring)."""
        if not client_moves > 0:
            return
        ratio = moved / client_moves
        if self.first_ratio is None:
            self.first_ratio = ratio
        elif ratio <= FIXED_POINT * self.first_ratio:
            self.stalled = (f"client drift: the clients' local moves cancel in the average ({ratio / self.first_ratio:.1e} "
                            f"of round 0's share), so w no longer moves although no client is at its optimum; "
                            f"{self.fixed_point()}")

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

    @property
    def finished(self) -> tuple[str, str] | None:
        """("client_drift", why) once the iterate sits at FedProx's biased fixed point (`dane.runner.run`)."""
        return None if self.stalled is None else ("client_drift", self.stalled)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "first_ratio": self.first_ratio, "stalled": self.stalled}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.first_ratio, self.stalled = state.get("first_ratio"), state.get("stalled")

    def diagnosis(self, records: list[dict]) -> str | None:
        """At the round cap, an objective that has stalled (its last quarter of rounds moved it by at most
        `STALLED` of the run's whole decrease) is FedProx's floor, not slowness: its fixed point is not the
        optimum when the shards differ (module docstring), whatever the number of rounds.  Not where the records'
        suboptimality still contracts (`dane.projection.fit` moves it by more than its ``STALL``): a slow run near the
        optimum moves its objective little against the first rounds' fall, and the stop line already says how many
        rounds it needs (LIBSVM's mushrooms over 80 iid clients: 0.989 a round at 6.2e-3 after 300 rounds)."""
        objectives = [r["objective"] for r in records if math.isfinite(r.get("objective", math.nan))]
        if len(objectives) < 8:
            return None
        total, late = objectives[0] - objectives[-1], objectives[-(len(objectives) // 4) - 1] - objectives[-1]
        if not total > 0 or abs(late) > STALLED * total:
            return None
        fitted = fit(records, "suboptimality")
        if fitted is not None and log_change(fitted[0], fitted[1]) < -STALL:
            return None
        return f"the objective has stalled: {self.fixed_point()}"


#: the share of a run's objective decrease that its last quarter of rounds may make for `FedProx.diagnosis` to call
#: the objective stalled
STALLED = 1e-3
#: the fall of ρ_t = ‖w_{t+1} − w_t‖ / mean_i ‖w_i − w_t‖ from ρ_0 at which a full-participation run is at its
#: fixed point (module docstring)
FIXED_POINT = 1e-3


@dataclass(frozen=True)
class FedProxConfig(AlgorithmConfig, SamplingKeys, LocalSolveKeys):
    mu: float = 0.01
    local_solver: str = "steps"
    seed: int = 0
    name: str = "fedprox"
    algorithm = FedProx

    def __post_init__(self) -> None:
        checks.nonnegative("algorithm.mu", self.mu)
        self.check_local()
        self.check_sampling()
        checks.integer("algorithm.seed", self.seed)

    def build(self, problem: Problem, comm: Communicator) -> "FedProx":
        return FedProx(problem, comm, mu=self.mu, sampling=self, local=self, seed=self.seed)
