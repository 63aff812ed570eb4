r"""MARINA: compressed gradient differences, a shared coin for full rounds (Gorbunov, Burlachenko, Li & Richtárik 2021).

The server steps with an estimate g_k of ∇O(x_k); every worker knows it.  Round 0 sends the full gradients,
g_0 = mean_i ∇O_i(x_0); round k ≥ 1, one allreduce, with c_k ~ Bernoulli(p) drawn alike on every worker:

.. math::
    g_k = \begin{cases} \tfrac1m\sum_i \nabla O_i(x_k) & c_k = 1 \text{ (each worker sends its gradient)}\\
        g_{k-1} + \tfrac1m\sum_i Q\big(\nabla O_i(x_k) - \nabla O_i(x_{k-1})\big) & c_k = 0\end{cases}
    \qquad x_{k+1} = x_k - \gamma\, g_k

(the paper's x^{k+1} = x^k − γg^k, then g^{k+1} from c_k, written one round on).  Q = ``compressor``, unbiased
with variance ω (RandK, natural, dithering, ``none``; TopK is refused, as in DIANA, `baselines.diana`).  With
p = 1 every round is full and MARINA is GD at step γ, bit for bit.  The coin draws from a generator seeded by
the run's seed alone (`COIN_STREAM`), so every rank (and the simulator's workers) flips the same coins; records
carry ``full_round`` (1 where c_k = 1 or k = 0).

*Defaults* (`baselines.defaults`, resolved by the config's ``build``, in the summary's ``defaults``):

- p = ``p`` null: ζ_Q/d (`baselines.defaults.marina_probability`), ζ_Q the compressor's nonzeros of a d-vector
  (K for RandK; d for a dense quantizer, where p = 1: set ``p`` to run its compressed rounds);
- γ = ``lr`` null: 1/(L̄ + L₊ sqrt((1 − p)ω/(pm))) (`baselines.defaults.marina_step`, their Theorem 2.1), L̄ = mean_i
  L_i ≥ L₋ (GD's bound, `baselines.gd`) and L₊ = sqrt(mean_i L_i²), from the local Lanczos and one allreduce
  before round 0 (`baselines.measure.smoothness_moments`).

*Messages and bits* as DIANA's: MARINA draws Q itself (its own compressor, ``comm.compress`` refused) and the
communicator counts the message (`dane.comm.compression`, ``precompressed``): a compressed round bits(Q) per
worker, a full round 64 d; the downlink, g_k, dense, 64 d (the logged metrics, riding along, are not counted:
`dane.comm.compression.METRICS`).  The logged ``grad_norm`` is ‖g_k‖.
It runs on the batched simulator as DIANA does.

*PP-MARINA* (their Algorithm 4, partial participation: ``clients_per_round=r``; null, the default: MARINA above,
every number as before).  A full round (c_k = 1, and round 0) is MARINA's: every client sends its gradient.  A
compressed round draws I'_k, r i.i.d. uniform draws of a client with replacement (as the paper; a client drawn twice
counts twice), from the shared `dane.sampling.ClientSampler` (`ClientSampler.draw_with_replacement`: seeded from the
run's seed alone, alike on every rank, checkpointed), and only the clients drawn send Q(∇O_i(x_k) − ∇O_i(x_{k−1})),
one message a draw, each with its own Q (as the paper's, whose variance (1 + ω)/r the step rule reads): a client
drawn c_i times draws c_i independent Q in turn from its own stream (the others draw nothing):

.. math:: g_k = g_{k-1} + \tfrac1r\textstyle\sum_{j=1}^{r} Q_j\big(\nabla O_{i_j}(x_k) - \nabla O_{i_j}(x_{k-1})\big)
    = g_{k-1} + \tfrac mr\cdot\tfrac1m\sum_i \textstyle\sum_{l=1}^{c_i} Q_i^l

(c_i the multiplicity of client i in I'_k, Q_i^l its l-th draw): every worker enters the allreduce with
Q_i^1 + … + Q_i^{c_i}, zeros when not drawn, and the mean is rescaled by m/r (as `dane.sampling.sampled_mean`, with
multiplicities; on the batched path the drawn clients' rows, drawn from the same streams in the same order, are
placed among the others' zeros).  With p = 1 every round is full: PP-MARINA is GD at step γ, at
any r.  ``sampling=size`` is refused (the paper samples uniformly), and r ≤ m (the sampler's bound).  Defaults
under sampling: p = ζ_Q r/(d m) (`baselines.defaults.pp_marina_probability`, their Corollary 4.1) and
γ = 1/(L̄ + L₊ sqrt((1 − p)(1 + ω)/(p r))) (`baselines.defaults.pp_marina_step`, their Theorem 4.1).

Its traffic, participants only (records under sampling, cumulative): ``clients_uplink_bits``, what the clients sent
(a full round m · 64 d, a compressed round bits(Q on d entries) per draw, r messages: a client drawn twice sends
two), ``uplink_bytes`` (the same at ⌈bits/8⌉ per message), ``downlink_bytes`` (g_k to every client each round, as
the paper's broadcast: every client keeps x_k) and ``clients`` (the distinct clients that sent).  The communicator's
``uplink_bits`` still count the collective as run, every rank's message (`dane.sampling`).

Departures: the theorem is for non-convex f (MARINA's main setting); the package runs it on every problem with
Hessian-vector products for the step rule, or with a given ``lr`` on any.  Under sampling every client evaluates
∇O_i at every iterate (the record's metrics need it) and keeps it, where the paper's drawn client evaluates
∇O_i(x_k) and ∇O_i(x_{k−1}) then: the same numbers.  ``local_passes`` counts the paper's: a full round one a client,
a compressed round two a distinct drawn client (a client drawn twice compresses the same difference twice), none for
the others.  The draw I'_k is taken on compressed rounds only (the paper draws it every round and uses it on
compressed ones; the draws being independent of the coin, the law is the same).
"""
from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch

from dane import checks
from dane.algorithm import Algorithm, AlgorithmConfig, Column
from dane.comm import Communicator
from dane.comm.batched import stacked
from dane.comm.compression import METRICS
from dane.compress import Compressor, Sparsifier
from dane.errors import ConfigError
from dane.problems import Problem
from dane.sampling import ClientSampler, SamplingKeys, Traffic
from dane.seeds import STREAMS
from dane.work import count, uncounted

from .defaults import Resolution, marina_probability, marina_step, pp_marina_probability, pp_marina_step
from .diana import (SENT, CompressedKeys, compress_each, load_streams, own_compression, streams_state,
                    unbiased_compressor, worker_streams)

COIN_STREAM = STREAMS["marina_coin"].number  # the shared coin


def coin_generator(seed: int) -> np.random.Generator:
    """The coin's generator: the run's seed alone, alike on every rank."""
    return np.random.default_rng(np.random.SeedSequence([seed, COIN_STREAM]))


def density(compressor: Compressor, dim: int) -> int:
    """ζ_Q: the nonzeros of Q(x) for a d-vector, at most (K for a sparsifier, else d)."""
    return compressor.k_of(dim) if isinstance(compressor, Sparsifier) else dim


class MARINA(Algorithm):
    name = "marina"
    label = "MARINA"
    compressed_messages = True  # its own Q, its bits counted in the communicator (module docstring)
    synchronous_because = "MARINA's server averages every worker's message at the same iterate"
    columns = (Column("full_round", "{:>5.0f}"),)
    summary_keys = (*Algorithm.summary_keys, "clients_uplink_bits", "uplink_bytes", "downlink_bytes")  # PP-MARINA's
    batchable = True  # its round reads the same on stacked tensors, each worker's Q from its own stream
    stacked_needs = "gradients"  # gradients at the iterate (and the defaults' Hessian products): any rows stack

    def __init__(self, problem: Problem, comm: Communicator, *, compressor: str = "none", lr: float, p: float,
                 seed: int = 0, sampling: SamplingKeys | None = None, defaults: tuple[dict, ...] = ()):
        super().__init__(problem, comm)
        self.compressor = unbiased_compressor(compressor, self.name)
        self.lr, self.p, self.defaults = lr, p, tuple(defaults)
        self.coin = coin_generator(seed)
        self.counter = own_compression(comm, self.compressor, seed=seed)
        self.generators = worker_streams(comm, self.counter, seed)
        self.g: torch.Tensor | None = None           # g_{k-1}, every worker's copy
        self.last_grad: torch.Tensor | None = None   # ∇O_i(x_{k-1})
        self.sampler = None  # PP-MARINA's (module docstring); None: MARINA, every client every round
        if sampling is not None and sampling.clients_per_round is not None:
            self.sampler = ClientSampler(comm, sampling.clients_per_round, seed=seed)
            self.traffic, self.uplink_bits = Traffic(), 0

    def step(self) -> dict[str, float]:
        with uncounted() if self.sampler is not None else nullcontext():  # PP-MARINA: counted as the paper spends it
            grad, metrics = self.problem.evaluate(self.w)
        full = self.g is None or bool(self.coin.random() < self.p)   # round 0, or c_k = 1
        members = None
        if full:
            sent, kinds = grad, (None,)                               # the whole gradient, counted dense
            if self.sampler is not None:
                count("local_passes", 1.0)                            # every client's ∇O_i(x_k)
        elif self.sampler is None:
            sent, kinds = compress_each(self.compressor, grad - self.last_grad, self.generators), (SENT,)
        else:
            members, counts = self.sampler.draw_with_replacement()   # I'_k
            count("local_passes", 2.0)                                # a drawn client's ∇O_i(x_k) and ∇O_i(x_{k−1})
            sent, kinds = self.drawn_differences(grad - self.last_grad, members, counts), (SENT,)
            if len(members) < self.comm.size:
                self.comm.next_participants(members.tolist())  # the simulator charges the drawn clients only
        self.last_grad = grad
        mean, metrics = self.comm.allreduce_mean([sent, metrics], kinds=(*kinds, METRICS))
        if members is not None:
            mean = mean * (self.comm.size / self.sampler.s)           # (1/m) Σ_i Σ_l Q_i^l into (1/r) Σ_j Q_j
        self.g = mean if full else self.g + mean
        self.w = self.w - self.lr * self.g
        out = {**self.metrics(self.g, metrics), "lr": self.lr, "full_round": float(full)}
        return out if self.sampler is None else {**out, **self.count(grad, members)}

    def drawn_differences(self, diff: torch.Tensor, members: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Q¹(diff_i) + … + Q^{c_i}(diff_i) for each drawn client i (c_i its multiplicity in I'_k, one independent Q
        a draw, in turn from the client's own stream), zeros for the others: this worker's, or the stack's rows; only
        the drawn clients draw Q."""
        if not stacked(self.comm):
            total = torch.zeros_like(diff)
            for draw in range(int(counts[self.comm.rank])):
                q = compress_each(self.compressor, diff, self.generators)
                total = q if draw == 0 else total + q
            return total
        total, multiplicity = diff.new_zeros(diff.shape), counts.index_select(0, members)
        for draw in range(int(multiplicity.max())):   # the clients drawn more than `draw` times draw their next Q
            rows = members[multiplicity > draw]
            index = rows.to(diff.device)
            q = compress_each(self.compressor, diff.index_select(0, index), [self.generators[i] for i in rows.tolist()])
            total = total.index_copy_(0, index, q) if draw == 0 else total.index_add_(0, index, q)
        return total

    def count(self, grad: torch.Tensor, members: torch.Tensor | None) -> dict[str, int]:
        """PP-MARINA's traffic of the round (``members`` None: a full round, every client sent its gradient)."""
        d, width = self.w.numel(), grad.element_size() * 8
        clients = self.comm.size if members is None else len(members)
        messages = clients if members is None else self.sampler.s    # one a draw: a client drawn twice sends two
        bits = d * width if members is None else self.compressor.bits(d, width)
        self.uplink_bits += messages * bits
        self.traffic.uplink += messages * math.ceil(bits / 8)
        self.traffic.downlink += self.comm.size * d * width // 8  # g_k to every client
        return {**self.traffic.record(clients), "clients_uplink_bits": self.uplink_bits}

    def spent(self) -> dict[str, int]:
        if self.sampler is None:
            return super().spent()
        return {**super().spent(), **self.traffic.spent(), "clients_uplink_bits": self.uplink_bits}

    def evaluate(self) -> dict[str, float]:
        out = super().evaluate()
        if self.sampler is None:
            return out
        return {**out, **self.traffic.record(self.sampler.s), "clients_uplink_bits": self.uplink_bits}

    def state_dict(self) -> dict:
        state = {**super().state_dict(), "g": self.g, "last_grad": self.last_grad,
                 "coin": self.coin.bit_generator.state, **streams_state(self.comm, self.generators)}
        if self.sampler is not None:
            state.update(sampler=self.sampler.state_dict(), traffic=self.traffic.state_dict(),
                         clients_uplink_bits=self.uplink_bits)
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.g, self.last_grad = state["g"], state["last_grad"]
        self.coin.bit_generator.state = state["coin"]
        load_streams(self.generators, state)
        if self.sampler is not None:
            self.sampler.load_state_dict(state["sampler"])
            self.traffic.load_state_dict(state["traffic"])
            self.uplink_bits = int(state["clients_uplink_bits"])


@dataclass(frozen=True)
class MARINAConfig(AlgorithmConfig, CompressedKeys, SamplingKeys):
    p: float | None = None
    name: str = "marina"
    algorithm = MARINA

    def __post_init__(self) -> None:
        self.check_keys()
        self.check_sampling()
        unbiased_compressor(self.compressor, self.name)
        if self.p is not None:
            checks.fraction("algorithm.p", self.p, "the probability of a full round")
        if self.clients_per_round is not None and self.sampling != "uniform":
            raise ConfigError(f"algorithm=marina samples clients uniformly with replacement (PP-MARINA), got "
                              f"algorithm.sampling={self.sampling}; set algorithm.sampling=uniform")

    def build(self, problem: Problem, comm: Communicator) -> MARINA:
        """The nulls resolved (`baselines.defaults`): p from the compressor's density, γ from L̄, L₊, ω, p and m
        (PP-MARINA's rules, with r, under ``clients_per_round``)."""
        resolution, compressor, d = Resolution(), self.compressor_built(), problem.dim
        omega, r = compressor.omega(d), self.clients_per_round
        p = self.p
        if p is None:
            zeta = density(compressor, d)
            p = resolution.add("p", marina_probability(zeta, d), "marina_probability", density=zeta, dim=d) \
                if r is None else \
                resolution.add("p", pp_marina_probability(zeta, d, r, comm.size), "pp_marina_probability",
                               density=zeta, dim=d, clients=r, workers=comm.size)
        lr = self.lr
        if lr is None:
            found = self.moments(problem, comm)
            if r is None:
                lr = resolution.add("lr", marina_step(found["mean"], found["rms"], omega, p, comm.size),
                                    "marina_step", smoothness=found["mean"], smoothness_rms=found["rms"], omega=omega,
                                    p=p, workers=comm.size)
            else:
                lr = resolution.add("lr", pp_marina_step(found["mean"], found["rms"], omega, p, r), "pp_marina_step",
                                    smoothness=found["mean"], smoothness_rms=found["rms"], omega=omega, p=p, clients=r)
        return MARINA(problem, comm, compressor=self.compressor, lr=lr, p=p, seed=self.seed, sampling=self,
                      defaults=resolution.entries)
