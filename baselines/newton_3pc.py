r"""Newton-3PC (Islamov, Qian, Hanzely, Safaryan & Richtárik, TMLR 2023): Newton steps with Hessians that a client
sends only when a three-point compressor (3PC, Richtárik et al. 2022) says so.

Client i keeps H_i (H_i⁰ = ∇²O_i(x⁰), sent whole before round 0) and Y_i, its Hessian at the previous iterate; the
server keeps H = mean_i H_i.  Round k at x_k, one allreduce:

.. math::
    H_i &\leftarrow \mathcal C^{3PC}_{H_i, Y_i}\big(\nabla^2 O_i(x_k)\big),\quad Y_i \leftarrow \nabla^2 O_i(x_k)
        &&\text{(client: sends } \nabla O_i(x_k) \text{ and, if it changed, } H_i\text{'s change)}\\
    x_{k+1} &= x_k - [H]_\mu^{-1}\nabla O(x_k) &&\text{(server, with the updated } H\text{)}

the paper's order (its H^{k+1} is learned at x^{k+1}, the point its next step leaves), so round 0 is a Newton step.
The 3PC of X = ∇²O_i(x_k), with h = H_i, y = Y_i (``mechanism``):

- ``lag`` (lazy aggregation): X if ‖X − h‖²_F > ζ‖X − y‖²_F, else h (nothing sent);
- ``clag``: h + C(X − h) under the same trigger, else h;
- ``bag`` (Bernoulli aggregation): X with probability p, else h;
- ``cbag``: h + C(X − h) with probability p, else h.

ζ = ``zeta``, p = ``p``, C = ``compressor`` (`dane.compress`, on the packed triangle as FedNL's).  The paper's
``clag`` and ``cbag`` take a contractive C (E‖C(x) − x‖² ≤ (1 − δ)‖x‖²: TopK); an unbiased one (RandK, natural,
dithering) is used as the contractive C/(ω + 1), ω of the packed triangle's length, as EF21 uses it (`baselines.ef21`;
the scale both take from `dane.compress.Compressor.contractive_divisor`): unscaled, its variance ω‖x‖² can
exceed ‖x‖² and H_i wanders off.  The coins come from
each client's own stream (NumPy's generator seeded by (seed, `COIN_STREAM`, client id, round)), the same whether a
client is alone or in the stack.  [H]_μ is FedNL's projection onto {H ⪰ μI} (μ = ``mu``; null: the
problem's ℓ2 weight; `baselines.fednl_server.newton_direction`).

*Bits* (record ``clients_uplink_bits``, cumulative; ``hessians_sent`` the clients that sent one this round):
64·d(d+1)/2 a client before round 0; a round 64·d per client (its gradient) and per sender 64·d(d+1)/2 (``lag``,
``bag``: the new Hessian, packed) or C's bits (``clag``, ``cbag``).  A silent client's absence is not counted.
*Work*: under ``lag``/``clag`` every client forms ∇O_i(x_k) and ∇²O_i(x_k) in one pass each round (the trigger
reads the Hessian); under ``bag``/``cbag`` every client makes one pass a round, the coin's winners forming
∇²O_i(x_k) with their gradient in it (records ``local_passes`` and ``local_hessians``, summed over clients).

Linear models with one output on rows (as FedNL), one client per worker or all m on the stacked rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dane import checks
from dane.algorithm import AlgorithmConfig, Column
from dane.comm import Communicator
from dane.comm.batched import stacked
from dane.compress import make
from dane.problems import Problem
from dane.problems.stacked_hessians import PackedRows, frobenius_norms, packed_size
from dane.sampling import SamplingKeys, sampled_mean

from .defaults import Resolution
from .federated import ClientBits, Federated
from .fednl import FedNLClients, message_entries
from .fednl_server import newton_direction
from .newton_star import VALUE_BITS, linear_rows

MECHANISMS = ("lag", "clag", "bag", "cbag")
#: the Bernoulli coins' stream tag, beside the run's seed (apart from the compressors' streams)
COIN_STREAM = 0x3C0


def coins(seed: int, ids: np.ndarray, draw: int) -> np.ndarray:
    """One uniform in [0, 1) per client id, from the generator seeded by (seed, `COIN_STREAM`, id, draw)."""
    return np.array([np.random.default_rng([seed, COIN_STREAM, int(i), draw]).random() for i in ids])


class Newton3PC(ClientBits, Federated):
    """Newton-3PC on one worker = one client, or all m on stacked rows (module docstring)."""

    name = "newton_3pc"
    needs_rows = True  # its clients' rows (`baselines.newton_star.linear_rows`)
    label = "Newton-3PC"
    batchable = True
    stacked_needs = "oracles"
    columns = (*Federated.columns, Column("hessians_sent", "{:>6d}"), Column("clients_uplink_bits", "{:>12.4g}"))
    summary_keys = (*Federated.summary_keys, "clients_uplink_bits")

    def __init__(self, problem: Problem, comm: Communicator, *, mechanism: str = "lag", zeta: float = 1.0,
                 p: float = 0.5, compressor: str = "none", mu: float | None = None, sampling: SamplingKeys,
                 seed: int = 0, defaults: tuple[dict, ...] = ()):
        super().__init__(problem, comm, sampling=sampling, seed=seed, defaults=defaults)
        self.compressor = make(compressor, "algorithm.compressor")
        clients = linear_rows(problem, comm, self.name)
        self.d, self.mechanism, self.zeta, self.p, self.seed = clients.d, mechanism, zeta, p, seed
        # C/(ω + 1) for an unbiased C, as EF21 takes it (docstring)
        self.shrink = 1.0 / self.compressor.contractive_divisor(message_entries(self.compressor, self.d))
        self.mu = float(problem.strong_convexity or 0.0) if mu is None else mu
        self.client = FedNLClients(clients, self.w.numpy(), compressor=self.compressor, alpha=1.0, option=1,
                                   variant="plain", seed=seed)                  # H_i⁰ = ∇²O_i(x⁰)
        self.Y = self.client.H_i.copy()
        (H,), _ = sampled_mean(comm, self.sampler.draw_all(), [self.packed(self.client.H_i)])
        self.H, self.rounds = H.numpy().copy(), 0
        self.uplink_bits = 0
        self.count(comm.size, VALUE_BITS * packed_size(self.d), down=0)

    def packed(self, compact: np.ndarray) -> torch.Tensor | PackedRows:
        clients = self.client.clients
        return PackedRows(clients, compact) if stacked(self.comm) else torch.from_numpy(clients.expand(compact)[0])

    def fires(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Which clients send this round, the Hessians X they hold, and every client's gradient, one pass each:
        under ``lag``/``clag`` every client's ∇O_i(x) and ∇²O_i(x) from one pass, and the trigger on it; under
        ``bag``/``cbag`` the coin first, its winners' ∇O_i(x) and ∇²O_i(x) from one pass and the others' ∇O_i(x)
        alone (their rows of X are their H_i: nothing to send, and no Hessian counted in ``local_hessians``)."""
        clients = self.client.clients
        if self.mechanism in ("bag", "cbag"):
            fired = coins(self.seed, clients.ids, self.rounds) < self.p
            X, grads = self.client.H_i.copy(), np.empty((len(fired), x.shape[0]))
            won, lost = np.flatnonzero(fired), np.flatnonzero(~fired)
            if won.size:
                grads[won], X[won] = clients.gradients_hessians(x, won)
            if lost.size:
                grads[lost] = clients.gradients(x, lost)
            return fired, X, grads
        grads, X = clients.gradients_hessians(x)
        weights = clients.weights
        change, last = frobenius_norms(X - self.client.H_i, weights), frobenius_norms(X - self.Y, weights)
        with np.errstate(over="ignore"):  # ζ‖X − Y_i‖² past the largest float is inf, which no finite ‖X − H_i‖²
            return change ** 2 > self.zeta * last ** 2, X, grads  # exceeds: the overflow is the trigger's answer

    def round(self) -> dict[str, float]:
        x = self.w.numpy()
        members = self.sampler.draw_all()
        fired, X, grads = self.fires(x)
        grad, payload = self.own(grads), self.payload(self.w)
        change = X - self.client.H_i
        if self.mechanism in ("clag", "cbag"):
            change = self.client.compress(change, None, self.rounds)
            if self.shrink != 1.0:  # an unbiased C, used as the contractive C/(ω + 1); a contractive one as it is
                change = change * self.shrink
        change[~fired] = 0.0
        self.client.H_i += change
        if self.mechanism in ("lag", "bag"):  # exactly X, not H_i + (X − H_i): LAG's next trigger then compares
            self.client.H_i[fired] = X[fired]  # ‖X' − H_i‖ = ‖X' − Y_i‖ exactly, not at round-off that paths differ in
        self.Y = X
        sent = [grad, self.packed(change), self.own(fired[:, None].astype(np.float64))]
        (g, dH, share), reduced = sampled_mean(self.comm, members, sent, payload, ride_kinds=self.ride_kinds())
        self.H += dH.numpy()
        direction = newton_direction(self.H, g.to(torch.float64).numpy(), 0.0, option=1, mu=self.mu)
        self.w = self.w + torch.from_numpy(direction).to(self.w.dtype)
        senders = round(float(share.reshape(-1)[0]) * len(members))
        whole = self.mechanism in ("lag", "bag")
        hessian = VALUE_BITS * packed_size(self.d) if whole else self.compressor.bits(
            message_entries(self.compressor, self.d), VALUE_BITS)
        self.count(len(members), VALUE_BITS * self.d, down=self.d)
        self.count(senders, hessian, down=0)
        self.rounds += 1
        return {**self.record(reduced, members), "hessians_sent": senders, "clients_uplink_bits": self.uplink_bits}


    def state_dict(self) -> dict:
        return {**super().state_dict(), "client": self.client.state_dict(), "Y": torch.from_numpy(self.Y.copy()),
                "H": torch.from_numpy(self.H.copy()), "rounds": self.rounds}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.client.load_state_dict(state["client"])
        self.Y, self.H = state["Y"].numpy().copy(), state["H"].numpy().copy()
        self.rounds = int(state["rounds"])


@dataclass(frozen=True)
class Newton3PCConfig(AlgorithmConfig, SamplingKeys):
    mechanism: str = "lag"
    zeta: float = 1.0
    p: float = 0.5
    compressor: str = "topk:0.1"
    mu: float | None = None
    seed: int = 0
    name: str = "newton_3pc"
    algorithm = Newton3PC
    mu_role = "damping"

    def __post_init__(self) -> None:
        checks.one_of("algorithm.mechanism", self.mechanism, MECHANISMS)
        checks.nonnegative("algorithm.zeta", self.zeta)
        checks.fraction("algorithm.p", self.p)
        make(self.compressor, "algorithm.compressor")
        if self.mu is not None:
            checks.nonnegative("algorithm.mu", self.mu)
        self.check_sampling()
        self.refuse_sampling("newton_3pc", "its step needs every client's gradient")
        checks.seed("algorithm.seed", self.seed)

    def build(self, problem: Problem, comm: Communicator) -> Newton3PC:
        """μ null: the problem's ℓ2 weight, noted in the summary's ``defaults``."""
        resolution, mu = Resolution(), self.mu
        if mu is None:
            mu = resolution.add("mu", float(problem.strong_convexity or 0.0), "the problem's")
        return Newton3PC(problem, comm, mechanism=self.mechanism, zeta=self.zeta, p=self.p, compressor=self.compressor,
                         mu=mu, sampling=self, seed=self.seed, defaults=resolution.entries)
