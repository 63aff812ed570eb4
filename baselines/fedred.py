r"""FedRed and DANE+ (Jiang, Rodomanov & Stich, ICML 2024): doubly regularized drift correction.

Client i keeps a control variate h_i.  Round r from x̃ = x_r, clients S (all m without sampling):

.. math::
    &\text{type 1:}\quad h_i = \nabla O_i(\tilde x) - \frac1{|S|}\sum_{j\in S}\nabla O_j(\tilde x)  &&\text{(allreduce 1)}\\
    &x_i \approx \arg\min_x\; F_i(x) = O_i(x) - \langle h_i, x\rangle + \frac{\lambda}{2}\|x - \tilde x\|^2
        &&\text{(local solve)}\\
    &x_{r+1} = \tilde x + \eta_g\Big(\frac1{|S|}\sum_{i\in S} x_i - \tilde x\Big) \ \ (\text{``mean''})
        \quad\text{or}\quad x_{r+1} = x_j,\ j \text{ drawn uniformly from } S \ \ (\text{``random''})
        &&\text{(allreduce 2)}\\
    &\text{type 2:}\quad h_i \leftarrow h_i + c\,(\bar x - x_i), \quad \bar x = \frac1{|S|}\sum_{j\in S} x_j
        \quad (i \in S;\ h_i \text{ of type 1 at round 0})

FedRed's local solve (``local_solver=steps``) is K doubly regularized gradient steps from x̃: each
step minimizes the linearization of O_i at z, regularized both at z (weight 1/γ) and at x̃ (weight λ),

.. math:: z \leftarrow \arg\min_x\; \langle\nabla O_i(z) - h_i, x\rangle + \frac1{2\gamma}\|x - z\|^2
          + \frac{\lambda}{2}\|x - \tilde x\|^2 = \frac{z/\gamma + \lambda\tilde x - \nabla O_i(z) + h_i}{1/\gamma + \lambda},

with K = ``local_steps``, or, with ``p`` set, K ~ Geometric(p) from a coin every worker shares (the paper's
randomized local steps); γ = ``lr`` (null: 1/max_i L_i). DANE+ is the same round with any inexact solver of F_i
(``local_solver`` = ``problem``, ``cg``, ``svrg``, ``lbfgs``; `baselines.federated`). Type 1 with an exact solve and
mean averaging is DANE with η = 1 and μ = λ (under sampling, FedDANE's round). λ = ``lam``; null:
`baselines.defaults.prox_weight` without the balanced weight (FedRed's gradient-step solver's rounds depend on λ
otherwise), and for DANE+ under client sampling with the sampled floor λ_S; under full participation a null λ
doubles, up to δ_A, when the objective climbs or cycles (`baselines.adaptive.WeightDoubling`).

``local_steps`` null is K = 10, and under client sampling K = ⌈1/(γ λ_S)⌉ held between 10 and 100, with FedRed's own
λ unchanged (a heuristic of this package, not the paper's; the cap bounds the local work of a round, since 1/(γλ_S)
grows as 1/q without bound as s nears m). Why: K steps of size γ from x̃ act, along a direction of curvature h ≪
1/(Kγ), as a proximal term of weight 1/(Kγ) at x̃ (K steps move Kγ·g), so the sampled gradient's noise reaches the
iterate with the gain Kγ: the floor a sampled run stalls at grows with K, and the rounds to a target above it fall
as 1/K. K = 1/(γλ_S) puts that effective weight where S-DANE's sampled default puts its λ (the balance of speed and
floor measured there). Raising FedRed's λ to λ_S instead does not help: the doubly regularized steps then move less.
The side-by-side runs: a grid of K = 10, 30, 100 under sampling (the floors at each K) and
scripts/bench_sampled_lambda.py ``--fedred`` (sampled_lambda_fedred.json: the rounds to 1e-3 at
the default, at K = 10, at the default's K times 1/2, 2, 4 and at λ_S; the rule's K there is well inside the bounds;
w8a over 142 clients, 14 a round: sampled_lambda_fedred_w8a.json, where the default's floor on iid shards is above
1e-3, as S-DANE's default's is there, and the cell is judged at 3e-3). Full participation keeps K = 10, its iterates
bit for bit.

The type-2 weight c is ``cv_weight`` (null: p/γ with steps, as in the paper's Scaffnew-like choice, p = 1/K for a
fixed K; the starting λ with a prox solver, which a λ doubled later by ``double_weight`` leaves as it
is); type 2 costs one allreduce a round (type 1: two). The record of a round is x̃ (its
metrics ride in its first allreduce).

Departure from the paper in type 2: the correction is taken against x̄, the mean of the participants' local iterates,
where the paper (and mlolab/S-DANE's ``fedred.py``) takes it against the new server iterate x_{r+1}.  The two are
the same with mean averaging and η_g = 1 (those runs' iterates are unchanged, bit for bit).  With random averaging
(x_{r+1} = x_j) or η_g ≠ 1 the paper's updates c(x_{r+1} − x_i) do not sum to zero over S, Σ_i h_i drifts from 0,
and the run converges to the point where ∇O = mean_i h_i, not to x*, with all clients too (tests/test_fedred_type2.py
runs both forms); the updates c(x̄ − x_i) sum to zero over S by construction.  x̄ comes from the averaging allreduce
itself: under mean averaging it is that allreduce's mean; under random averaging every participant sends x_i (|S|
uplinks, not one) and the chosen x_j rides in the same allreduce.

The stop each type needs under client sampling (s < m).  Type 1 takes h_i against the sampled mean, so at x̃ = x*
the local problem's gradient at x* is ∇O_i(x*) − h_i = ξ_S := mean_{j∈S} ∇O_j(x*), which is not zero when the shards
differ: for any fixed λ and K, x* is not a fixed point of the sampled round (on a quadratic with exact solves,
x_{r+1} − x* = (I − M_S Ā_S)(x̃ − x*) − M_S ξ_S, M_S = mean_{i∈S} (∇²O_i + λI)⁻¹, Ā_S = mean_{i∈S} ∇²O_i), and the
run stalls at a floor set by ξ_S's variance, as FedDANE's and S-DANE's do: it ends with status ``sampling_floor``
once its objective stops improving (`baselines.adaptive.FloorStop`, attached for type 1).  Type 2 keeps
(x*, h_i = ∇O_i(x*)) a fixed point under sampling: every sampled local problem is then solved by x*, the mean is x*
and no h_i moves.  That point needs Σ_i h_i = 0, which the updates c(x̄ − x_i) keep
round by round (they sum to zero over S, under either averaging and any η_g); round 0's type-1 h_i is taken against the
mean over S_0 and sums to zero over S_0 only, so the clients outside S_0 start at h_i = 0 (a departure from
"type 1 at round 0", which under sampling left Σ_i h_i ≠ 0 and a run converging to the point where ∇O = mean_i h_i,
not x*).  A sampled type-2 run converges and has no floor stop.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dane import checks
from dane.algorithm import AlgorithmConfig, Column
from dane.comm import Communicator
from dane.errors import ConfigError
from dane.problems import Problem, ProblemConfig
from dane.sampling import SamplingKeys
from dane.seeds import STREAMS, shared_seed

from .adaptive import FloorStop, WeightDoubling
from .defaults import FEDRED_LOCAL_STEPS, Resolution, fedred_cv_weight, fedred_local_steps, local_step, prox_weight
from .federated import LocalSolveKeys, LocalSolving, PolicyKeys
from .measure import hessian_dissimilarity

AVERAGING = ("mean", "random")
COIN_STREAM = STREAMS["fedred_coin"].number  # the shared generator of local-step counts and random averaging


class FedRed(LocalSolving):
    name = "fedred"
    label = "FedRed"
    # λ shifts the local Hessian of DANE+'s exact solve (λ = 0 is refused there); one below its round-off fails
    singular_remedy = " or a larger algorithm.lam"
    batchable = True  # its round reads the same on stacked tensors, the participants' rows (`Federated.members`)
    stacked_needs = "gradients"
    own_state = ("h",)  # the client's control variate: the clients outside S_t may sleep (`dane.comm.roster`)
    columns = (*LocalSolving.columns, Column("lam", "{:>8.3g}"), Column("local_steps", "{:>6d}"))

    def __init__(self, problem: Problem, comm: Communicator, *, lam: float, local_steps: int, cv_weight: float | None,
                 gamma: float | None = None, control_variate: int = 1, averaging: str = "mean",
                 p: float | None = None, server_lr: float = 1.0, seed: int = 0, **kwargs):
        super().__init__(problem, comm, seed=seed, **kwargs)
        self.lam, self.local_steps, self.cv_weight, self.gamma = lam, local_steps, cv_weight, gamma
        self.control_variate, self.averaging, self.p, self.server_lr = control_variate, averaging, p, server_lr
        self.coin = torch.Generator().manual_seed(shared_seed(seed, COIN_STREAM))
        self.h = self.client_state(torch.zeros_like(self.w))  # type 2 outside S_0: h_i = 0 keeps Σ_i h_i = 0
        self.first = True  # round 0, whose h_i are of type 1 under either type (module docstring)

    def round(self) -> dict[str, float]:
        x = self.w
        members, inside = self.members()
        grad = None  # the participants' ∇O_i(x̃) where this round computes it: the local solve's first gradient
        if self.control_variate == 1 or self.first:
            grad, payload = self.grad_and_payload(x)
            grad = self.held(grad, members)                                     # the participants' ∇O_i(x̃)
            (g_bar,), reduced = self.average(members, [grad], payload, down=[x])  # 1. h_i = ∇O_i(x̃) − mean_S ∇O_j(x̃)
            rides = []
            if inside:
                self.h = self.hold(self.h, members, grad - g_bar)
        else:
            rides, reduced = self.payload(x), None  # x̃'s metrics ride in the averaging allreduce
        steps = self.local_step_count()
        self.traffic.add(len(members), down=[x])  # what step 2 needs: mean_S ∇O_j(x̃) (type 1, round 0) or x̃ (type 2)
        h = self.held(self.h, members)                                      # the participants' h_i
        x_i = self.local_solve(x, h, steps, grad) if inside else x           # 2. x_i ≈ argmin F_i
        if self.averaging == "mean":
            (x_mean,), late = self.average(members, [x_i], rides)
            x_next = x + self.server_lr * (x_mean - x) if self.server_lr != 1.0 else x_mean
        elif self.control_variate == 1:
            chosen = members[torch.randint(len(members), (1,), generator=self.coin)]
            (x_next,), late = self.average(chosen, [x_i], rides)                # 3. x_{r+1} = x_j
        else:  # type 2 also needs x̄ = mean_S x_i: x_j rides in the same allreduce
            chosen = int(members[torch.randint(len(members), (1,), generator=self.coin)])
            picked = x_i if self.comm.rank == chosen else torch.zeros_like(x_i)
            (x_mean,), late = self.average(members, [x_i], [*rides, picked], metrics=bool(rides))
            x_next, late = late[-1] * self.comm.size, late[:-1]               # 3. x_{r+1} = x_j
        if self.control_variate == 2 and (self.averaging == "random" or len(members) < self.comm.size):
            # x̄ for the participants' h_i: every client has it from x_{r+1} only under full participation and mean
            # averaging (x̄ = x̃ + (x_{r+1} − x̃)/η_g); else x_{r+1} is another point, or goes to another sample
            self.traffic.add(len(members), down=[x_mean])
        reduced = reduced or late
        if self.control_variate == 2 and inside:
            self.h = self.hold(self.h, members, h + self.cv_weight * (x_mean - x_i))  # type-2 control variate: Σ_S = 0
        self.w, self.first = x_next, False
        return {**self.record(reduced, members), "local_steps": steps, "lam": self.lam}

    def local_step_count(self) -> int:
        """K: ``local_steps``, or a draw of Geometric(p) from the shared coin (the same on every worker)."""
        if self.p is None:
            return self.local_steps
        steps = 1
        while not bool(torch.rand(1, generator=self.coin, dtype=torch.float64) < self.p):
            steps += 1
        return steps

    def local_solve(self, x: torch.Tensor, h: torch.Tensor, steps: int,
                    anchor_grad: torch.Tensor | None = None) -> torch.Tensor:
        """x_i from x̃ = ``x``; ``anchor_grad``: ∇O_i(x̃) where the round has it (type 1), not computed again."""
        if self.local.local_solver != "steps":
            return self.prox(x, h, self.lam, anchor_grad=anchor_grad)         # DANE+: any inexact solver
        z, inv = x, 1.0 / self.gamma
        for k in range(steps):                                                # FedRed: doubly regularized steps
            grad = anchor_grad if k == 0 and anchor_grad is not None else self.local_grad(z)
            z = (inv * z + self.lam * x - grad + h) / (inv + self.lam)
        return z

    def floor_diagnosis(self, floor) -> str:
        if self.local.local_solver != "steps":
            knob = f"a larger algorithm.lam (now {self.lam:.3g}) lowers it and slows each round"
        elif self.p is None:
            knob = f"fewer algorithm.local_steps (now {self.local_steps}) lower it and slow each round"
        else:
            knob = f"a larger algorithm.p (now {self.p:g}: fewer local steps) lowers it and slows each round"
        return (f"{super().floor_diagnosis(floor)}; {knob}; algorithm.control_variate=2 has no floor (its control "
                f"variates keep the optimum a fixed point under sampling)")

    def state_dict(self) -> dict:
        return {**super().state_dict(), "coin": self.coin.get_state(), "lam": self.lam,  # a default λ may have doubled
                "h": self.h.clone(), "first": self.first}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.coin.set_state(state["coin"])
        self.lam = float(state.get("lam", self.lam))
        self.first = bool(state.get("first", "h" not in state))  # a checkpoint from before the flag: h set after round 0
        if "h" in state:
            self.h = state["h"].clone()


@dataclass(frozen=True)
class FedRedConfig(AlgorithmConfig, SamplingKeys, LocalSolveKeys, PolicyKeys):
    lam: float | None = None
    control_variate: int = 1
    averaging: str = "mean"
    p: float | None = None
    cv_weight: float | None = None
    server_lr: float = 1.0
    local_solver: str = "steps"
    local_steps: int | None = None  # null: `baselines.defaults.fedred_local_steps` (module docstring)
    seed: int = 0
    name: str = "fedred"
    algorithm = FedRed
    adaptation_names = (WeightDoubling.name, FloorStop.name)

    def __post_init__(self) -> None:
        if self.lam is not None:
            checks.nonnegative("algorithm.lam", self.lam)
        checks.one_of("algorithm.control_variate", self.control_variate, (1, 2))
        checks.one_of("algorithm.averaging", self.averaging, AVERAGING)
        if self.p is not None:
            checks.fraction("algorithm.p", self.p, "the chance that a local step is the last")
        if self.cv_weight is not None:
            checks.positive("algorithm.cv_weight", self.cv_weight)
        checks.positive("algorithm.server_lr", self.server_lr)
        if self.averaging == "random" and self.server_lr != 1.0:
            raise ConfigError(f"algorithm.server_lr={self.server_lr:g} is the step of mean averaging; "
                              f"algorithm.averaging=random takes one client's iterate as it is: set server_lr=1")
        steps = FEDRED_LOCAL_STEPS if self.local_steps is None else self.local_steps
        LocalSolveKeys(local_solver=self.local_solver, local_steps=steps, lr=self.lr,
                       power_iters=self.power_iters).check_local()
        self.check_sampling()
        checks.seed("algorithm.seed", self.seed)
        if self.local_solver != "steps" and self.lam == 0:
            raise ConfigError(f"algorithm.lam=0 leaves DANE+'s local problem without its proximal term under "
                              f"algorithm.local_solver={self.local_solver}; set algorithm.lam > 0")
        self.check_policy()

    def stacked_form(self, problem: ProblemConfig, size: int) -> str | None:
        """FedRed's gradient steps (`LocalSolveKeys.stacked_solve`) with mean averaging, on the problem's stacked
        form."""
        if self.averaging != "mean":
            return "algorithm.averaging=random sends one drawn client's iterate (the batched path averages)"
        s = size if self.clients_per_round is None else self.clients_per_round
        if self.lam is None:
            return "algorithm.lam=null measures the Hessian dissimilarity worker by worker; set it to run batched"
        if self.local_steps is None and self.p is None and s < size:
            return ("algorithm.local_steps=null under client sampling measures the Hessian dissimilarity worker by "
                    "worker; set it to run batched")
        return self.stacked_solve() or super().stacked_form(problem, size)

    def build(self, problem: Problem, comm: Communicator) -> "FedRed":
        """The nulls resolved (`baselines.defaults`), the adaptations that apply attached (`baselines.adaptive`)."""
        resolution, adaptations = Resolution(), []
        smoothness = self.measured_smoothness(problem, comm, resolution)
        steps, (s, m), lam, K = self.local_solver == "steps", self.clients(comm), self.lam, self.local_steps
        gamma = (self.lr if self.lr is not None else local_step(smoothness)) if steps else None
        rule = steps and self.p is None and K is None and s < m  # K from λ_S (`baselines.defaults.fedred_local_steps`)
        if rule and lam is not None and problem.hessian_vector is None:
            raise ConfigError(f"algorithm.local_steps=null under client sampling is 1/(lr·λ_S) steps from "
                              f"the local Hessians, which {type(problem).__name__} cannot give (no Hessian-vector "
                              f"products); set algorithm.local_steps")
        if smoothness:
            resolution.add("lr", gamma, "local_step", smoothness=smoothness)
        if lam is None or rule:  # δ_A and ‖H‖: two allreduces before round 0 (d ≤ 512)
            found = hessian_dissimilarity(problem, comm, "algorithm.lam")
            delta_a, norm = found["delta_a"], found["hessian_norm"]
            sampled = prox_weight(delta_a, norm, s=s, m=m)  # S-DANE's λ_S without the balanced weight
            if lam is None:  # DANE+ under sampling is FedDANE's round; FedRed's steps keep the full default
                # FedRed's steps take the full-participation weight whatever the sampling (module docstring): the
                # rule's inputs are δ_A and ‖H‖ alone there, DANE+'s add the run's s of m
                lam = resolution.add("lam", prox_weight(delta_a, norm) if steps else sampled, "prox_weight",
                                     delta_a=delta_a, hessian_norm=norm, **({} if steps else {"s": s, "m": m}))
                watched = self.averaging == "mean" and s == m and problem.strong_convexity is not None
                adaptations += [WeightDoubling("lam", delta_a)] * (watched and self.allows("double_weight"))
            if rule:
                K = resolution.add("local_steps", fedred_local_steps(gamma, sampled, True), "fedred_local_steps",
                                   lr=gamma, sampled_lam=sampled)
        if K is None:  # unused by DANE+'s prox solver and by a Geometric(p) count: noted only where the steps use it
            K = resolution.add("local_steps", FEDRED_LOCAL_STEPS, "fedred_local_steps", s=s, m=m) \
                if steps and self.p is None else FEDRED_LOCAL_STEPS
        cv_weight = self.cv_weight
        if cv_weight is None and self.control_variate == 2:  # type 1 has no weight
            cv_weight = resolution.add("cv_weight", fedred_cv_weight(gamma, K, self.p, lam), "fedred_cv_weight",
                                       lr=gamma, local_steps=K, p=self.p, lam=lam)
        adaptations += [FloorStop()] * (self.control_variate == 1 and s < m and self.allows("sampling_floor"))
        return FedRed(problem, comm, lam=lam, local_steps=K, cv_weight=cv_weight, gamma=gamma,
                      control_variate=self.control_variate, averaging=self.averaging, p=self.p,
                      server_lr=self.server_lr, sampling=self, local=self, seed=self.seed, smoothness=smoothness,
                      adaptations=adaptations, defaults=resolution.entries)
