r"""SCAFFOLD (Karimireddy, Kale, Mohri, Reddi, Stich & Suresh, ICML 2020), control variates of option I or II.

The server keeps w and c, client i its c_i (all zero at the start).  Round t, clients S_t, one
allreduce (the server sends (w, c) down, each sampled client sends (Δy_i, Δc_i) up):

.. math::
    y_i &\leftarrow y_i - \eta_l\,(\nabla O_i(y_i) - c_i + c) \quad (K \text{ times, from } y_i = w_t) \\
    c_i^+ &= \nabla O_i(w_t) \;\text{(option I)} \quad\text{or}\quad
        c_i - c + \frac{1}{K\eta_l}(w_t - y_i) \;\text{(option II)}, \qquad
        \Delta y_i = y_i - w_t, \quad \Delta c_i = c_i^+ - c_i, \quad c_i \leftarrow c_i^+ \\
    w_{t+1} &= w_t + \eta_g\,\frac1{|S_t|}\sum_{i\in S_t}\Delta y_i, \qquad
    c \leftarrow c + \frac{|S_t|}{m}\cdot\frac1{|S_t|}\sum_{i\in S_t}\Delta c_i

K = ``local_steps``, η_l = ``lr`` (null: min(2/(L + μ̲), lr_factor/L, 1/(K μ̲)), L = max_i L_i, below),
η_g = ``server_lr`` (null: 1.5 with that η_l and an even K, else 1; below), ``option`` = 1 or 2.
With K = 1 and η_g = 1 every round is a step of distributed gradient descent with step η_l, under either
option (for K = 1 they give the same c_i⁺).

*Option II by default*, as the paper's experiments and most
public implementations run it (so that iterates compare with theirs at the defaults).  The paper gives both:
option I takes the local gradient at the server's w_t, "an additional pass over the local data", option II
reuses the K steps' gradients (their mean), which is cheaper with minibatches; option I "can be more stable".
Here local gradients are full, the first local step's is ∇O_i(w_t), and option I (``option=1``) costs nothing.
Under full participation option I makes the local steps gradient steps on DANE's local problem
O_i(y) − ⟨∇O_i(w_{t−1}) − ∇O(w_{t−1}), y⟩ (control variates one round old).

*The default local step.*  Each local step is a gradient step on client i's corrected objective
O_i(y) − ⟨c_i − c, y⟩, which is L_i-smooth and μ_i-strongly convex, so the default takes the step that
`baselines.gd` takes for distributed GD, with one more bound:

.. math::
    \eta_l = \min\Big(\frac{2}{L + \underline\mu}, \frac{\text{lr\_factor}}{L}, \frac1{K\underline\mu}\Big),
    \qquad L = \max_i L_i, \quad
    \underline\mu \le \mu \quad (\text{`baselines.defaults.strong_convexity_bound`})

(max(λ_ℓ2, mean_i λ_min(H_i)) on a quadratic whose Lanczos runs d products, ``power_iters`` ≥ d or d ≤ 2000, as
mean_i λ_min(H_i) ≤ λ_min(mean_i H_i): λ_min is concave; otherwise λ_ℓ2, as a shorter Lanczos's λ_min lies above
the true one and a GLM's H_i here is its Hessian majorant, ≥ the curvature anywhere), L_i and λ_min(H_i) from one
local Lanczos each, shared by the one allreduce before round 0.
2/(L + μ) is the fixed gradient step with the best linear rate on a μ-strongly convex L-smooth function
(Nesterov, *Introductory Lectures on Convex Optimization*, 2004, Theorem 2.1.15); where μ̲ ≪ L it nears 2/L,
and ``lr_factor``/L (``lr_factor`` ∈ (0, 2), 1.9) caps it with room for a Lanczos L_i short of λ_max(H_i):
any step below 2/L_i decreases client i's corrected objective (Theorem 2.1.14).  The third bound is option
II's: its c_i⁺ is the mean local gradient along the path, c_i⁺ = c_i − c + (w_t − y_i)/(Kη_l).  Once the K
steps settle near the corrected local minimizer (where ∇O_i(y) = c_i − c), what is new about ∇O_i enters c_i
only through the bounded displacement w_t − y_i divided by Kη_l: the drift correction is learnt about
Kη_l L_i times more slowly, and rounds grow with K (option I's do not: its c_i⁺ is ∇O_i(w_t) at any K).
Gradient steps of η_l on a μ_i-strongly convex O_i settle after about 1/(η_l μ_i) of them, so the K steps'
reach is held within that time, 1/(Kμ̲).  It binds only where the local problems are well conditioned,
L/μ̲ < min(2K − 1, 1.9K) (ridge on iid features); on ill-conditioned or weakly regularized shards the step is
lr_factor/L.  On those cells SCAFFOLD's rounds fall as Kη_lη_g, the step of the
slow (μ-) directions, grows, until the stiff directions near their edge of stability or option II's stall
above sets in: the textbook 1/L paid the looseness of the majorant (on a logistic shard its curvature near
the optimum is several times below the start's) in rounds; ``make bench`` (section ``defaults``, its
``scaffold`` rows) measures the rule against η_l ∈ {0.25, 0.5, 2} × the default's and η_g ∈ {1, 2} at
the default's K, and the rows ``scaffold_k3``, ``scaffold_k30`` against the same knobs at their own K.
Departure from the paper: its experiments tune η_l, and its theory takes the effective step Kη_lη_g below a
small constant over L (η_l ≤ 1/(81 L K η_g)); the rule is this package's.  What the rule does not know: L is the
curvature at w_0 (a GLM's majorant), and on logistic shards the curvature near the optimum is several times
smaller, so a local step past lr_factor/L can still take fewer rounds there; past 2/L no theorem bounds the local
steps, so it is not the default.  K defaults to 10.

*The default server step* (``server_lr`` null).  In a direction of local curvature s the K steps of η_l cover the
fraction φ = 1 − (1 − η_l s)^K of the way to the corrected local minimizer, and the round moves that direction by
η_g φ of it: it contracts by |1 − η_g φ|.  For even K, φ ≤ 1 at every stable step (η_l s < 2), so η_g = 1.5 still
contracts the settled (stiff) directions, φ = 1, by 1/2 a round, and moves the slow ones, φ ≈ Kη_l s, 1.5 times as
far as η_g = 1 (the slow directions set the rounds on ill-conditioned shards).  η_g = 2 puts the settled directions
at the edge of stability, |1 − η_g| = 1.  For odd K the last step can overshoot: φ reaches 1 + (η_l L − 1)^K, 1.73
at K = 3 and η_l L = 1.9, which 1.5 would carry past 2; odd K keeps the paper's η_g = 1 (and K = 1 stays GD at the
default step).  So null is `baselines.defaults.SERVER_STEP` where the local step is this rule's (``lr`` null) on a
convex problem and K is even, and 1 otherwise: a given ``lr`` runs the paper's η_g = 1, as its experiments do
(``algorithm.paper=true`` takes 1 too).  A departure from the
paper's experiments (η_g = 1), within its theory (η_g ≥ 1); ``make bench`` measures it against η_g ∈ {1, 2}
(sections ``defaults`` and ``federated``).
A run that ends at the round cap without the target says so in its stop line (`diagnosis`), naming
``algorithm.local_steps`` and ``algorithm.lr``.  On a problem that is not convex (a network with
Hessian-vector products) lr null stays 1/L: the theorems above do not apply.

Departure from the paper: full local gradients (the paper's analysis allows minibatches).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dane import checks
from dane.algorithm import AlgorithmConfig
from dane.comm import Communicator
from dane.errors import ConfigError
from dane.problems import Problem
from dane.sampling import SamplingKeys

from .defaults import (LANCZOS_STEP_FACTOR, Resolution, lanczos_is_exact, lanczos_iters, local_step,
                       scaffold_local_step, scaffold_server_step, strong_convexity_bound)
from .federated import LocalSolveKeys, LocalSolving, PolicyKeys
from .measure import smoothness_and_lowest


class Scaffold(LocalSolving):
    name = "scaffold"
    label = "SCAFFOLD"
    batchable = True  # its round reads the same on stacked tensors, the participants' rows (`Federated.members`)
    stacked_needs = "gradients"
    own_state = ("c_i",)  # the clients outside S_t may sleep through the round (`dane.comm.roster`)

    def __init__(self, problem: Problem, comm: Communicator, *, lr: float, server_lr: float = 1.0, option: int = 2,
                 lr_factor: float = LANCZOS_STEP_FACTOR, **kwargs):
        super().__init__(problem, comm, **kwargs)
        self.lr, self.server_lr, self.option = lr, server_lr, option
        self.lr_factor = lr_factor  # the config's, named in `diagnosis`
        self.c = torch.zeros_like(self.w)      # the server's control variate
        self.c_i = self.client_state(torch.zeros_like(self.w))  # this client's (on the batched path, every one's)

    def round(self) -> dict[str, float]:
        members, inside = self.members()                                   # S_t; (w, c) sent down to them
        w, K, lr = self.w, self.local.local_steps, self.lr
        delta_y = delta_c = torch.zeros_like(w)
        if inside:
            c_i = self.held(self.c_i, members)                             # the participants' c_i
            y, grad_w = w, self.local_grad(w)
            for k in range(K):
                grad = grad_w if k == 0 else self.local_grad(y)
                y = y - lr * (grad - c_i + self.c)                         # corrected local steps
            if self.option == 1:
                c_plus = grad_w                                            # option I: ∇O_i(w_t)
            else:
                c_plus = c_i - self.c + (w - y) / (K * lr)                 # option II
            delta_y, delta_c = y - w, c_plus - c_i
            self.c_i = self.hold(self.c_i, members, c_plus)
        (mean_dy, mean_dc), reduced = self.average(members, [delta_y, delta_c], self.payload(w), down=[w, self.c])
        self.w = w + self.server_lr * mean_dy                              # server step
        self.c = self.c + (len(members) / self.comm.size) * mean_dc         # c += (|S|/m) mean_S Δc_i
        return {**self.record(reduced, members), "lr": lr, "server_lr": self.server_lr}

    def diagnosis(self, records: list[dict]) -> str | None:
        """At the round cap: K local steps of η_l a round are the knobs to turn (module docstring)."""
        return (f"SCAFFOLD moves at most {self.local.local_steps} local steps of lr {self.lr:.3g} a round "
                f"(min(2/(L + mu), {self.lr_factor:g}/L, 1/(K mu)), L = max_i L_i, unless algorithm.lr is set: "
                f"small when the shards' curvatures differ), scaled by the server step {self.server_lr:g} "
                f"(algorithm.server_lr); "
                f"more local steps (algorithm.local_steps) or a larger algorithm.lr speed up each round, at the price "
                f"of a weaker drift correction")

    def state_dict(self) -> dict:
        return {**super().state_dict(), "c": self.c.clone(), "c_i": self.c_i.clone()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.c, self.c_i = state["c"].clone(), state["c_i"].clone()


@dataclass(frozen=True)
class ScaffoldConfig(AlgorithmConfig, SamplingKeys, LocalSolveKeys, PolicyKeys):
    local_steps: int = 10  # module docstring: K = 3 stalled on label-skewed shards
    server_lr: float | None = None  # η_g; null: `baselines.defaults.scaffold_server_step` (module docstring)
    option: int = 2        # the control variate: 2, the mean corrected gradient of the K steps; 1, ∇O_i(w_t)
    lr_factor: float = LANCZOS_STEP_FACTOR  # lr null: η_l = min(2/(L + μ̲), lr_factor/L, 1/(K μ̲)), in (0, 2)
    local_solver: str = "steps"
    seed: int = 0
    name: str = "scaffold"
    algorithm = Scaffold
    adaptation_names = ()  # none applies

    def __post_init__(self) -> None:
        if self.server_lr is not None:
            checks.positive("algorithm.server_lr", self.server_lr)
        checks.one_of("algorithm.option", self.option, (1, 2))
        if not 0 < checks.positive("algorithm.lr_factor", self.lr_factor) < 2:
            raise ConfigError(f"algorithm.lr_factor must be in (0, 2) (a local step of 2/L or more can diverge), "
                              f"got {self.lr_factor}")
        checks.one_of("algorithm.local_solver", self.local_solver, ("steps",))
        self.check_local()
        self.check_sampling()
        checks.seed("algorithm.seed", self.seed)
        self.check_policy()

    def build(self, problem: Problem, comm: Communicator) -> "Scaffold":
        """The nulls resolved (`baselines.defaults`): η_l from max_i L_i and μ̲ (one allreduce before round 0), η_g."""
        resolution, lr, server_lr, K = Resolution(), self.lr, self.server_lr, self.local_steps
        convex = problem.strong_convexity is not None
        if lr is None:
            iters = lanczos_iters(problem, self.power_iters)
            L, mean_low = smoothness_and_lowest(problem, comm, iters=iters, seed=self.seed)
            if convex:  # no theorem for 2/(L + μ) off the convex problems: 1/L there
                mu_low = strong_convexity_bound(float(problem.strong_convexity), mean_low,
                                                exact=lanczos_is_exact(problem, iters)) \
                    if problem.strong_convexity else 0.0
                lr = resolution.add("lr", scaffold_local_step(L, mu_low, K, self.lr_factor), "scaffold_local_step",
                                    smoothness=L, mu_low=mu_low, local_steps=K, lr_factor=self.lr_factor)
            else:
                lr = resolution.add("lr", local_step(L), "local_step", smoothness=L)
        if server_lr is None:
            rule_step = self.lr is None and convex and not self.paper  # paper=true: the paper's η_g = 1
            server_lr = resolution.add("server_lr", scaffold_server_step(K, rule_step), "scaffold_server_step",
                                       local_steps=K, rule_step=rule_step)
        return Scaffold(problem, comm, lr=lr, server_lr=server_lr, option=self.option, lr_factor=self.lr_factor,
                        sampling=self, local=self,
                        seed=self.seed, defaults=resolution.entries)
