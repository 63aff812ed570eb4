r"""FedNL-BC: FedNL with the model broadcast compressed (Safaryan, Islamov, Qian & Richtárik, ICML 2022, the
bidirectional variant, Algorithm FedNL-BC).

The server keeps the model x and the learned H = mean_i H_i; the clients keep H_i and w, the model the server's
compressed messages built (w_0 = x_0); z is the last point where the clients sent gradients and G = ∇O(z).  A
shared coin ξ_k (ξ_0 = 1, then Bernoulli(``p``)) says whether the clients send gradients.  Round k, one allreduce:

.. math::
    S_i &= \mathcal C\big(\nabla^2 O_i(w_k) - H_i\big),\ H_i \leftarrow H_i + \alpha S_i
        &&\text{(client: sends } S_i\text{, and } \nabla O_i(w_k) \text{ if } \xi_k = 1\text{)}\\
    g_k &= \nabla O(w_k),\ z \leftarrow w_k\ \ \text{if } \xi_k = 1,\quad\text{else}\quad
        g_k = \mathbf H_k (w_k - z) + \nabla O(z) &&\text{(server)}\\
    x_{k+1} &= w_k - \mathbf H_k^{-1} g_k,\qquad s_k = \mathcal C_M(x_{k+1} - w_k),\qquad
        H \leftarrow H + \alpha\,\tfrac1m\textstyle\sum_i S_i &&\text{(server: sends } s_k\text{)}\\
    w_{k+1} &= w_k + \eta\, s_k &&\text{(every client, and the server)}

with **H**_k = [H]_μ (option 1) or H + l_k I, l_k = mean_i ‖H_i − ∇²O_i(w_k)‖_F (option 2), H before this round's
update, as `baselines.fednl` (whose round FedNL-BC is at C_M = ``none``, η = 1, p = 1: w = x, to round-off).
C = ``compressor`` and α as FedNL's; C_M = ``model_compressor`` (vectors: topk, randk, natural, dither, none) and
η = ``model_lr``, null: 1 for a contractive C_M, 1/(ω + 1) for an unbiased one (FedNL-Public's ``iter_upd_rule``
2 and 3; a larger η for an unbiased C_M is refused).  C_M draws from the server's generator, seeded from the run's
seed alone (`dane.comm.compression.downlink_seed`), and the coin from its own stream of that seed: every worker
holds both, so every worker computes the same s_k and ξ_k from the same means.

*Bits*, per client a round (records, cumulative, summed over the clients): ``clients_uplink_bits`` += bits(S_i)
+ 64·d if ξ_k (the gradient) + 64 under option 2 (l_i); ``clients_downlink_bits`` += bits(C_M on d) (the model's
shift; the coin is drawn from the seed, not sent).  ``uplink_bytes`` and ``downlink_bytes`` are the same at
⌈bits/8⌉.  Before round 0 each client sends H_i⁰ whole, as FedNL.  The simulator's clock prices the round's dense
allreduce as FedNL's does.

Departures: FedNL-Public measures option 2's l at the server's previous x, which the clients do not hold; here at
w_k, where the clients compute their Hessians (the paper's FedNL takes l at the point of its Hessians).  [H]_μ's
product with w − z is H's itself when its eigenvalues are at least μ − ε (ε as `baselines.fednl_server`), else
that of the eigenvalues raised to μ.  The records' objective is that at w_k, and the last iterate is w.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from dane import checks
from dane.algorithm import Column
from dane.comm import Communicator
from dane.comm.compression import downlink_seed
from dane.compress import Compressor, make
from dane.errors import ConfigError
from dane.problems import Problem
from dane.problems.stacked_hessians import unpack
from dane.sampling import SamplingKeys, sampled_mean
from dane.seeds import STREAMS

from .defaults import Resolution, model_learning_rate
from .federated import Federated
from .fednl import VALUE_BITS, FedNL, FedNLConfig, uplink_bits
from .fednl_server import newton_direction

COIN_STREAM = STREAMS["fednl_bc_coin"].number  # FedNL-BC's shared coin


def model_step(compressor: Compressor, d: int, eta: float | None) -> float:
    """η: ``eta``, or `baselines.defaults.model_learning_rate` of C_M on d entries (module docstring)."""
    bound = model_learning_rate(compressor.unbiased_omega(d))
    if eta is not None and compressor.unbiased and eta > bound * (1 + 1e-12):
        raise ConfigError(f"algorithm.model_lr must be <= 1/(omega + 1) = {bound:.4g} for the unbiased model "
                          f"compressor {compressor.spec} on d = {d}, got {eta}; leave it null for that bound")
    return bound if eta is None else float(eta)


def server_matrix_product(H: np.ndarray, v: np.ndarray, l: float, *, option: int, mu: float) -> np.ndarray:
    """**H**_k v: [H]_μ v (option 1) or (H + l I) v (option 2), H the packed H_k (module docstring)."""
    full = unpack(H, len(v))
    if option == 2:
        return full @ v + l * v
    evals, evecs = np.linalg.eigh(full)
    eps = 64 * len(v) * np.finfo(full.dtype).eps * max(float(np.abs(np.diag(full)).max()), mu)
    if evals.min() >= mu - eps:
        return full @ v
    return evecs @ (np.maximum(evals, mu) * (evecs.T @ v))


class FedNLBC(FedNL):
    """FedNL-BC on one worker = one client (module docstring); the server's state is kept on every worker."""

    name = "fednl_bc"
    label = "FedNL-BC"
    columns = (*Federated.columns, Column("full_round", "{:>5.0f}"), Column("clients_uplink_bits", "{:>12.4g}"),
               Column("clients_downlink_bits", "{:>12.4g}"))
    summary_keys = (*FedNL.summary_keys, "clients_downlink_bits")

    def __init__(self, problem: Problem, comm: Communicator, *, compressor: str = "none", alpha: float | None = None,
                 option: int = 2, mu: float | None = None, model_compressor: str = "topk:0.1",
                 model_lr: float | None = None, p: float = 0.5, sampling: SamplingKeys, seed: int = 0,
                 defaults: tuple[dict, ...] = ()):
        super().__init__(problem, comm, compressor=compressor, alpha=alpha, option=option, mu=mu, variant="plain",
                         sampling=sampling, seed=seed, defaults=defaults)
        self.model_compressor = make(model_compressor, "algorithm.model_compressor")
        self.eta, self.p = model_step(self.model_compressor, self.d, model_lr), p
        self.server_generator = torch.Generator().manual_seed(downlink_seed(seed))
        self.coin = np.random.default_rng(np.random.SeedSequence([seed, COIN_STREAM]))
        self.full = True                                  # ξ_0 = 1
        self.z, self.G = None, None                       # the last gradient point and ∇O there
        self.downlink_bits = 0

    def spent(self) -> dict[str, int]:
        return {**super().spent(), "clients_downlink_bits": self.downlink_bits}

    def step(self) -> dict[str, float]:
        w = self.w.numpy()
        members, full = self.sampler.draw_all(), self.full
        grads, S, l_i = self.client.round(w, self.rounds)                              # clients, at w_k
        sent = ([self.own(grads)] if full else []) + [self.packed(S), self.own(l_i[:, None])]
        means, reduced = sampled_mean(self.comm, members, sent, self.payload(self.w), ride_kinds=self.ride_kinds())
        S_mean, l = means[-2], float(means[-1])
        if full:
            self.z, self.G = w.copy(), means[0].numpy().copy()                        # z ← w_k, G = ∇O(w_k)
        g = self.G if full else server_matrix_product(self.H, w - self.z, l, option=self.option,
                                                      mu=self.mu) + self.G
        x_next = w + newton_direction(self.H, g, l, option=self.option, mu=self.mu)  # server: w_k − H_k⁻¹ g_k
        s = self.model_compressor(torch.from_numpy(x_next - w), self.server_generator)  # s_k = C_M(x − w_k)
        self.w = (torch.from_numpy(w) + self.eta * s).to(self.w.dtype)                 # w_{k+1} = w_k + η s_k
        self.H += S_mean.numpy()                                                       # H ← H + α mean S_i
        self.count_bc(len(members), full)
        self.rounds += 1
        self.full = bool(self.coin.random() < self.p)                                  # ξ_{k+1}
        return {**self.record(reduced, members), "full_round": float(full),
                "clients_uplink_bits": self.uplink_bits, "clients_downlink_bits": self.downlink_bits}

    def count_bc(self, clients: int, full: bool) -> None:
        up = uplink_bits(self.compressor, self.d, variant="plain", option=self.option) - (0 if full else
                                                                                          VALUE_BITS * self.d)
        down = self.model_compressor.bits(self.d, VALUE_BITS)
        self.uplink_bits += clients * up
        self.downlink_bits += clients * down
        self.traffic.uplink += clients * math.ceil(up / 8)
        self.traffic.downlink += clients * math.ceil(down / 8)

    def evaluate(self) -> dict[str, float]:
        return {**super().evaluate(), "clients_downlink_bits": self.downlink_bits}

    def state_dict(self) -> dict:
        gradient_point = {} if self.z is None else {"z": torch.from_numpy(self.z.copy()),
                                                    "G": torch.from_numpy(self.G.copy())}
        return {**super().state_dict(), **gradient_point, "full": self.full, "down_bits": self.downlink_bits,
                "coin": self.coin.bit_generator.state, "server_generator": self.server_generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if "z" in state:
            self.z, self.G = state["z"].numpy().copy(), state["G"].numpy().copy()
        self.full, self.downlink_bits = bool(state["full"]), int(state["down_bits"])
        self.coin.bit_generator.state = state["coin"]
        self.server_generator.set_state(state["server_generator"])


@dataclass(frozen=True)
class FedNLBCConfig(FedNLConfig):
    model_compressor: str = "topk:0.1"
    model_lr: float | None = None
    p: float = 0.5
    name: str = "fednl_bc"
    algorithm = FedNLBC

    def __post_init__(self) -> None:
        if self.variant != "plain":
            raise ConfigError(f"algorithm=fednl_bc runs FedNL's plain round with a compressed broadcast, got "
                              f"algorithm.variant={self.variant}; use algorithm=fednl for ls and pp")
        self.check_sampling()
        self.refuse_sampling("fednl_bc", "FedNL-BC's round takes every client; partial participation is FedNL-PP "
                                         "(use algorithm=fednl algorithm.variant=pp)")  # before FedNL's own line
        super().__post_init__()
        compressor = make(self.model_compressor, "algorithm.model_compressor")
        if compressor.matrices:
            raise ConfigError(f"algorithm.model_compressor={self.model_compressor} compresses d×d matrices; the "
                              f"model is a vector: topk:K, randk:K, natural, dither:S or none")
        if self.model_lr is not None:
            checks.fraction("algorithm.model_lr", self.model_lr)
        checks.fraction("algorithm.p", self.p, "the probability that the clients send gradients")

    def recovery(self) -> list[str]:
        """FedNL's remedies that apply to its plain round (the line search is algorithm=fednl's), and fresh
        gradients every round."""
        hints = ["algorithm.p=1 (the clients' gradients every round)",
                 "algorithm=fednl (algorithm.variant=ls: FedNL-LS, a line search on O, with an exact broadcast)"]
        return hints if self.chosen_option == 2 else hints + ["algorithm.option=2 (the step shifted by the learned "
                                                       "Hessians' error)"]

    def build(self, problem: Problem, comm: Communicator) -> FedNLBC:
        """FedNL's nulls (`baselines.fednl.FedNLConfig.numbers`), then η (`model_step`)."""
        resolution = Resolution()
        numbers = self.numbers(problem, resolution)
        model_lr = self.model_lr
        if model_lr is None:
            compressor, d = make(self.model_compressor, "algorithm.model_compressor"), problem.dim
            model_lr = resolution.add("model_lr", model_step(compressor, d, None), "model_learning_rate",
                                      omega=compressor.unbiased_omega(d), d=d)
        return FedNLBC(problem, comm, compressor=self.compressor, **numbers, model_compressor=self.model_compressor,
                       model_lr=model_lr, p=self.p, sampling=self, seed=self.seed, defaults=resolution.entries)
