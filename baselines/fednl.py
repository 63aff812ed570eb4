r"""FedNL: Newton's method with learned, compressed Hessians (Safaryan, Islamov, Qian & Richtárik, ICML 2022).

Client i keeps H_i, its estimate of ∇²O_i; the server keeps H = mean_i H_i.  Round k of FedNL
(the paper's Algorithm 1), one allreduce (the clients' uplink):

.. math::
    S_i &= \mathcal C\big(\nabla^2 O_i(x_k) - H_i\big),\qquad H_i \leftarrow H_i + \alpha S_i
        &&\text{(client: sends } \nabla O_i(x_k),\ S_i\text{)}\\
    x_{k+1} &= x_k - [H]_\mu^{-1}\,\nabla O(x_k)\ \ \text{(option 1)}\quad\text{or}\quad
        x_k - (H + l_k I)^{-1}\nabla O(x_k),\ l_k = \tfrac1m\textstyle\sum_i\|H_i - \nabla^2 O_i(x_k)\|_F
        \ \ \text{(option 2)} &&\text{(server)}\\
    H &\leftarrow H + \alpha\,\tfrac1m\textstyle\sum_i S_i

with H the server's estimate *before* this round's update (the paper's order: the step uses H_k,
learned from the Hessians at x_0..x_{k-1}), H_i⁰ = ∇²O_i(x_0), so round 0 is an exact Newton
step.  [H]_μ is the projection onto {H ⪰ μI} (eigenvalues below μ raised to μ), μ = ``mu``
(null: the problem's ℓ2 weight λ, as the paper's code).  α = ``alpha``; null: the paper's
per class of C (`dane.compress`): 1 − sqrt(1 − δ) for a contractive compressor (TopK, rank-R;
1 for ``none``), 1/(ω + 1) for an unbiased one (RandK, natural, dithering).

``variant=ls`` (FedNL-LS, Algorithm 2): the step is x_k + t d_k, d_k = −[H]_μ⁻¹∇O(x_k), t the first
of 1, γ, γ², … with O(x_k + t d_k) ≤ O(x_k) + c t ⟨∇O(x_k), d_k⟩ (c = ``ls_c``, γ = ``ls_gamma``),
one more allreduce (the clients' objective values) per trial.

``variant=pp`` (FedNL-PP, Algorithm 3): s = ``clients_per_round`` clients a round
(`dane.sampling`).  Client i keeps w_i, H_i, l_i = ‖H_i − ∇²O_i(w_i)‖_F and
g_i = (H_i + l_i I) w_i − ∇O_i(w_i); the server keeps their means H, l, g and steps first:

.. math::
    x_{k+1} &= (H + l I)^{-1} g;\qquad i\in S_k:\ w_i = x_{k+1},\
    H_i \mathrel{+}= \alpha\,\mathcal C(\nabla^2 O_i(w_i) - H_i),\ \text{new } l_i, g_i;\\
    (H, l, g) &\mathrel{+}= \tfrac1m\textstyle\sum_{i\in S_k}\Delta(\alpha S_i, l_i, g_i).

With every client sampled and C = ``none``, FedNL-PP is Newton's method (its H is learned at the
point it steps from); plain FedNL then lags one round behind, so the two differ.

What a client sends a round, in bits (records: ``clients_uplink_bits``, cumulative, summed over the
participants as ``uplink_bytes`` is, by the compressor's exact `dane.compress.Compressor.bits`; not
``comm.compress``'s per-worker ``uplink_bits``, which FedNL, compressing its own message, does not
use): FedNL and FedNL-LS 64·d (its gradient) + bits(S_i) (+ 64 for l_i under option 2, + 64 per
line-search trial); FedNL-PP bits(S_i) + 64·d (Δg_i) + 64 (Δl_i).  Before round 0 each client sends
H_i⁰ whole (64·d(d+1)/2 bits), counted in round 0's record.  S_i travels as the packed upper
triangle of the symmetric difference (d(d+1)/2 entries: what u-FedNL sends), so TopK/RandK's k counts
entries of that triangle and δ, ω are those of the packed vector; ``rank:R`` compresses the d x d
matrix.

Departures: the paper's option-2 code uses the spectral norm, we use the Frobenius norm its text
states; [H]_μ takes a Cholesky factor of H − (μ − ε)I first (ε: 64·d·machine epsilon·max H_aa) and
when that exists uses H itself, the projection changing only eigenvalues within ε of μ.

The simulator plays each client as its own worker; `baselines.fednl_batched.StackedFedNL` runs the
same rounds for all m clients at once on arrays stacked by client (``make bench`` section ``fednl``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.linalg
import torch

from dane import checks
from dane.algorithm import AlgorithmConfig, Column
from dane.comm import Communicator
from dane.compress import Compressor, make
from dane.errors import ConfigError
from dane.problems import Problem
from dane.problems.glm import LinearModelShard
from dane.sampling import SamplingKeys, sampled_mean

from .federated import Federated
from .fednl_stacked import StackedClients, frobenius_norms, pack, packed_size, unpack

VARIANTS = ("plain", "ls", "pp")
LS_TRIALS = 60  # FedNL-LS: at most this many halvings (γ^60 ≈ 1e-18 at γ = 1/2)
VALUE_BITS = 64


def hessian_step(compressor: Compressor, d: int, alpha: float | None) -> float:
    """α: ``alpha``, or the paper's for the class of ``compressor`` on a d x d Hessian difference."""
    if alpha is not None:
        return float(alpha)
    n = message_entries(compressor, d)
    if compressor.unbiased:
        return 1.0 / (compressor.omega(n) + 1.0)
    return 1.0 - math.sqrt(max(0.0, 1.0 - compressor.delta(n)))


def message_entries(compressor: Compressor, d: int) -> int:
    """Entries of the Hessian-difference message: d² for a matrix compressor, else the packed triangle."""
    return d * d if compressor.matrices else packed_size(d)


def compress_packed(compressor: Compressor, diff: np.ndarray, d: int, generator: torch.Generator | None
                    ) -> np.ndarray:
    """C applied to each row of ``diff`` (s, T), packed symmetric differences; the decoded rows, packed
    (``none``: ``diff`` itself, not a copy)."""
    if compressor.name == "none":
        return diff
    if compressor.matrices:
        return pack(compressor(torch.from_numpy(unpack(diff, d)), generator).numpy())
    return compressor(torch.from_numpy(diff), generator).numpy()


def uplink_bits(compressor: Compressor, d: int, *, variant: str, option: int) -> int:
    """One participant's uplink bits of a round (the module docstring), line-search trials aside."""
    hessian = compressor.bits(message_entries(compressor, d), VALUE_BITS)
    if variant == "pp":
        return hessian + VALUE_BITS * d + VALUE_BITS
    return hessian + VALUE_BITS * d + (VALUE_BITS if option == 2 else 0)


def projected_newton(H: np.ndarray, g: np.ndarray, mu: float) -> np.ndarray:
    """[H]_μ⁻¹ g, [H]_μ the projection onto {H ⪰ μI}: by Cholesky when H − (μ − ε)I is positive definite,
    else by eigh."""
    d = len(g)
    eps = 64 * d * np.finfo(H.dtype).eps * max(float(np.abs(np.diag(H)).max()), mu)
    shifted = H - (mu - eps) * np.eye(d)
    try:
        scipy.linalg.cho_factor(shifted, lower=True, check_finite=False)
        factor = scipy.linalg.cho_factor(H, lower=True, check_finite=False)
        return scipy.linalg.cho_solve(factor, g, check_finite=False)
    except np.linalg.LinAlgError:
        evals, evecs = np.linalg.eigh(H)
        return evecs @ ((evecs.T @ g) / np.maximum(evals, mu))


def shifted_newton(H: np.ndarray, g: np.ndarray, shift: float) -> np.ndarray:
    """(H + shift I)⁻¹ g by Cholesky (H + shift I ≻ 0 in FedNL's option 2 and FedNL-PP)."""
    A = H + shift * np.eye(len(g))
    try:
        return scipy.linalg.cho_solve(scipy.linalg.cho_factor(A, lower=True, check_finite=False), g,
                                      check_finite=False)
    except np.linalg.LinAlgError:
        raise ConfigError(f"FedNL's H + {shift:.3g} I is not positive definite; use algorithm.option=1 "
                          "(the projection onto H >= mu I) or a larger problem.lam") from None


def armijo_backtrack(objective, x: np.ndarray, f_x: float, g: np.ndarray, direction: np.ndarray, *,
                     c: float, gamma: float) -> tuple[float, int]:
    """(t, trials): the first t = γ^j with objective(x + t·direction) ≤ f_x + c t ⟨g, direction⟩ (FedNL-LS)."""
    slope = float(g @ direction)
    t = 1.0
    for trial in range(1, LS_TRIALS + 1):
        if objective(x + t * direction) <= f_x + c * t * slope:
            return t, trial
        t *= gamma
    return t, LS_TRIALS


class FedNL(Federated):
    """FedNL on one worker = one client (module docstring); the server's H, l, g are kept on every worker."""

    name = "fednl"
    columns = (*Federated.columns, Column("step_size", "{:>9.3g}"), Column("clients_uplink_bits", "{:>12.4g}"))

    def __init__(self, problem: Problem, comm: Communicator, *, compressor: str = "none", alpha: float | None = None,
                 option: int = 1, mu: float | None = None, variant: str = "plain", ls_c: float = 0.5,
                 ls_gamma: float = 0.5, sampling: SamplingKeys, seed: int = 0):
        super().__init__(problem, comm, sampling=sampling, seed=seed)
        if not isinstance(problem, LinearModelShard):
            raise ConfigError(f"algorithm=fednl needs a linear model on rows (problem=logreg, or problem=ridge with "
                              f"data=...), got {type(problem).__name__}")
        self.client = StackedClients([problem])
        self.d = self.client.d
        self.compressor = make(compressor)
        self.alpha = hessian_step(self.compressor, self.d, alpha)
        self.option, self.variant, self.ls_c, self.ls_gamma = option, variant, ls_c, ls_gamma
        self.mu = float(problem.strong_convexity or 0.0) if mu is None else mu
        self.generator = torch.Generator().manual_seed(seed * 1_000_003 + comm.rank)  # a client's own draws
        self.uplink_bits = 0
        self.step_size = 1.0
        x0 = self.w.numpy()
        grad, hess = self.client.gradients_hessians(x0)
        self.H_i, self.l_i = hess[0].copy(), 0.0
        self.g_i = unpack(self.H_i, self.d) @ x0 - grad[0]  # FedNL-PP's g_i⁰ (l_i⁰ = 0)
        (H, g), _ = sampled_mean(comm, self.sampler.draw_all(),                       # H_i⁰ (and g_i⁰) up, once
                                 [torch.from_numpy(self.H_i), torch.from_numpy(self.g_i)])
        self.H, self.g, self.l = H.numpy().copy(), g.numpy().copy(), 0.0
        self.count(comm.size, VALUE_BITS * (packed_size(self.d) + (self.d if variant == "pp" else 0)), down=0)

    def step(self) -> dict[str, float]:
        return self.step_pp() if self.variant == "pp" else self.step_plain()

    def step_plain(self) -> dict[str, float]:
        x = self.w.numpy()
        members = self.sampler.draw_all()
        grad, hess = self.client.gradients_hessians(x)
        diff = hess - self.H_i                                                   # ∇²O_i(x) − H_i
        l_i = float(frobenius_norms(diff, self.d)[0])
        S_i = compress_packed(self.compressor, diff, self.d, self.generator)[0]  # S_i = C(...)
        self.H_i += self.alpha * S_i
        payload = self.payload(self.w)
        sent = [torch.from_numpy(grad[0]), torch.from_numpy(S_i), torch.tensor([l_i], dtype=torch.float64)]
        (g, S, l), reduced = sampled_mean(self.comm, members, sent, payload)                # uplink
        g, H = g.numpy(), unpack(self.H, self.d)
        if self.option == 1:
            direction = -projected_newton(H, g, self.mu)
        else:
            direction = -shifted_newton(H, g, float(l))
        trials = 0
        if self.variant == "ls":
            f_x = float(reduced[0][0])
            self.step_size, trials = armijo_backtrack(self.global_objective, x, f_x, g, direction,
                                                      c=self.ls_c, gamma=self.ls_gamma)
        self.w = torch.from_numpy(x + self.step_size * direction)
        self.H += self.alpha * S.numpy()                                         # H ← H + α mean S_i
        self.count(len(members), uplink_bits(self.compressor, self.d, variant="plain", option=self.option)
                   + VALUE_BITS * trials, down=self.d * (1 + trials))
        return {**self.record(reduced, members), "step_size": self.step_size,
                "clients_uplink_bits": self.uplink_bits}

    def step_pp(self) -> dict[str, float]:
        x_next = shifted_newton(unpack(self.H, self.d), self.g, self.l)          # server: (H + lI)⁻¹ g
        members, inside = self.members()                                         # S_k
        dS = np.zeros(packed_size(self.d))
        dl, dg = 0.0, np.zeros(self.d)
        if inside:
            grad, hess = self.client.gradients_hessians(x_next)
            S_i = compress_packed(self.compressor, hess - self.H_i, self.d, self.generator)[0]
            self.H_i += self.alpha * S_i
            l_new = float(frobenius_norms(self.H_i[None] - hess, self.d)[0])
            g_new = unpack(self.H_i, self.d) @ x_next + l_new * x_next - grad[0]
            dS, dl, dg = self.alpha * S_i, l_new - self.l_i, g_new - self.g_i
            self.l_i, self.g_i = l_new, g_new
        payload = self.payload(self.w)
        scale = len(members) / self.comm.size                                   # (1/m) Σ_{S_k} = (s/m) mean_{S_k}
        sent = [torch.from_numpy(dS), torch.tensor([dl], dtype=torch.float64), torch.from_numpy(dg)]
        (S, l, g), reduced = sampled_mean(self.comm, members, sent, payload)                # uplink
        self.H += scale * S.numpy()
        self.l += scale * float(l)
        self.g += scale * g.numpy()
        self.w = torch.from_numpy(x_next)
        self.count(len(members), uplink_bits(self.compressor, self.d, variant="pp", option=2), down=self.d)
        return {**self.record(reduced, members), "step_size": 1.0, "clients_uplink_bits": self.uplink_bits}

    def evaluate(self) -> dict[str, float]:
        return {**super().evaluate(), "clients_uplink_bits": self.uplink_bits}

    def count(self, clients: int, bits: int, *, down: int) -> None:
        self.uplink_bits += clients * bits
        self.traffic.uplink += clients * math.ceil(bits / 8)
        self.traffic.downlink += clients * down * VALUE_BITS // 8

    def global_objective(self, x: np.ndarray) -> float:
        """O(x): one allreduce of the clients' O_i(x) (FedNL-LS's trials)."""
        (value,) = self.comm.allreduce_mean([self.problem.objective(torch.from_numpy(x)).reshape(1)])
        return float(value)

    def state_dict(self) -> dict:
        arrays = {key: torch.from_numpy(np.array(getattr(self, key))) for key in ("H_i", "g_i", "H", "g")}
        return {**super().state_dict(), **arrays, "l_i": self.l_i, "l": self.l, "bits": self.uplink_bits,
                "step_size": self.step_size, "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        for key in ("H_i", "g_i", "H", "g"):
            setattr(self, key, state[key].numpy().copy())
        self.l_i, self.l = float(state["l_i"]), float(state["l"])
        self.uplink_bits, self.step_size = int(state["bits"]), float(state["step_size"])
        self.generator.set_state(state["generator"])


@dataclass(frozen=True)
class FedNLConfig(AlgorithmConfig, SamplingKeys):
    compressor: str = "none"
    alpha: float | None = None
    option: int = 1
    mu: float | None = None
    variant: str = "plain"
    ls_c: float = 0.5
    ls_gamma: float = 0.5
    seed: int = 0
    name: str = "fednl"
    algorithm = FedNL

    def __post_init__(self) -> None:
        make(self.compressor)  # a bad spec is one line now
        if self.alpha is not None:
            checks.positive("algorithm.alpha", self.alpha)
        if self.option not in (1, 2):
            raise ConfigError(f"algorithm.option must be 1 (projection onto H >= mu I) or 2 (H + l I), "
                              f"got {self.option!r}")
        if self.mu is not None:
            checks.nonnegative("algorithm.mu", self.mu)
        checks.one_of("algorithm.variant", self.variant, VARIANTS)
        if not 0 < self.ls_c <= 0.5:
            raise ConfigError(f"algorithm.ls_c must be in (0, 0.5], got {self.ls_c}")
        if not 0 < self.ls_gamma < 1:
            raise ConfigError(f"algorithm.ls_gamma must be in (0, 1), got {self.ls_gamma}")
        self.check_sampling()
        if self.variant != "pp":
            self.refuse_sampling(f"fednl algorithm.variant={self.variant}",
                                 "partial participation is FedNL-PP (algorithm.variant=pp)")
        if self.variant == "pp" and self.option != 2:
            raise ConfigError("algorithm.variant=pp steps with H + l I (the paper's FedNL-PP); set algorithm.option=2")
        checks.integer("algorithm.seed", self.seed)

    def build(self, problem: Problem, comm: Communicator) -> FedNL:
        return FedNL(problem, comm, compressor=self.compressor, alpha=self.alpha, option=self.option, mu=self.mu,
                     variant=self.variant, ls_c=self.ls_c, ls_gamma=self.ls_gamma, sampling=self, seed=self.seed)
