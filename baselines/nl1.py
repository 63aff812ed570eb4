r"""NL1, Newton-Learn 1 (Islamov, Qian & Richtárik 2021): Newton's method for a generalized linear model whose
clients learn the coefficients of their Hessians, not the Hessians.

Client i's objective is O_i(x) = w Σ_{j∈S_i} φ_j(a_jᵀx) + (λ/2)‖x‖² (w = m/N, the package's row weight), its Hessian
w Σ_j α_j(x) a_j a_jᵀ + λI with α_j(x) = φ_j''(a_jᵀx) ≥ 0.  Client i keeps h_i ∈ ℝ^{n_i}, its estimate of α_i(x)
(h_i⁰ = α_i(x⁰)); the server keeps B = mean_i w Σ_{j∈S_i} h_j a_j a_jᵀ.  Round k, one allreduce:

.. math::
    h_i^{k+1} &= \big[h_i^k + \eta_i\,\mathcal C_i\big(\alpha_i(x_k) - h_i^k\big)\big]_+
        &&\text{(client: sends } \nabla O_i(x_k) \text{ and the rows } a_j \text{ and changes of the entries } \mathcal C_i \text{ kept)}\\
    x_{k+1} &= x_k - (B_k + \lambda I)^{-1}\,\nabla O(x_k),\qquad
        B_{k+1} = B_k + \tfrac1m\textstyle\sum_i w \sum_j (h^{k+1}_j - h^k_j)\, a_j a_j^\top &&\text{(server)}

C_i = RandK on n_i coefficients (unbiased, scaled by n_i/K; the indices from the client's own stream,
`dane.problems.stacked_compress.randk_indices`, drawn per round), [·]_+ the positive part; the step uses B_k, learned
from α at x_0..x_{k−1}, as FedNL's H_k (round 0 is a Newton step).  η_i = ``eta``; null: 1/(ω_i + 1) = K/n_i
(`baselines.defaults.nl1_step`, FedNL-Public's default η = K/m), at which a kept h_j becomes α_j(x_k).

*Messages and bits* (record ``clients_uplink_bits``, cumulative, FedNL's convention): before round 0 each client sends
its B_i⁰ as a packed triangle, 64·d(d+1)/2 bits; each round 64·d (its gradient) + 64·K·d (the K rows, dense) + 64·K
(the changes) bits.  FedNL-Public's ``NL1`` counts the same messages at 32-bit values (32·d + 32·K·d + 32·K a round,
32·d(d+1)/2 once).

Departures: none in the round (FedNL-Public's line search, off by default there, is not offered).  A given η at which
the changes are not finite (1e308) ends the run diverged on that round's record, x_k kept, naming η (`NL1.not_finite`).  The server's B is
the running sum of the changes the clients send, as the protocol has it.

Linear models with one output on rows (``problem=logreg``, or ``problem=ridge`` with data, where α is constant and
NL1 is Newton's method), one client per worker or all m on the batched simulator's stacked rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg
import torch

from dane import checks
from dane.algorithm import AlgorithmConfig, Column, Finished
from dane.comm import Communicator
from dane.comm.batched import stacked
from dane.problems import Problem
from dane.problems.stacked_compress import randk_indices
from dane.problems.stacked_hessians import pack, packed_size, unpack
from dane.sampling import SamplingKeys, sampled_mean

from .defaults import Resolution, nl1_step
from .federated import ClientBits, Federated
from .newton_star import VALUE_BITS, client_rows


class NL1(ClientBits, Federated):
    """NL1 on one worker = one client, or all m on stacked rows (module docstring); B is kept on every worker."""

    name = "nl1"
    needs_rows = True  # its clients' rows (`require_rows`)
    label = "NL1"
    batchable = True  # the stacked rows give all m clients' gradients and curvatures at once
    stacked_needs = "oracles"
    columns = (*Federated.columns, Column("clients_uplink_bits", "{:>12.4g}"))
    summary_keys = (*Federated.summary_keys, "clients_uplink_bits")

    def __init__(self, problem: Problem, comm: Communicator, *, k: int, eta: float | None = None,
                 sampling: SamplingKeys, seed: int = 0, defaults: tuple[dict, ...] = ()):
        super().__init__(problem, comm, sampling=sampling, seed=seed, defaults=defaults)
        self.rows = client_rows(problem, comm, self.name)
        self.ids = np.arange(self.rows.stacked_workers) if stacked(comm) else np.array([comm.rank])
        self.d, self.k, self.seed, self.draws = self.rows.dim, k, seed, 0
        sizes = np.diff(self.rows.start)
        self.eta = np.array([nl1_step(k, n) if eta is None else eta for n in sizes])
        self.given_eta = eta
        self.h = self.rows.rows_at(self.w.numpy(), curvature=True).curv.copy()     # h_i⁰ = α_i(x⁰)
        first = [self.coefficient_matrix(c, np.arange(n), self.h[self.rows.start[c]:self.rows.start[c + 1]])
                 for c, n in enumerate(sizes)]
        (B,), _ = sampled_mean(comm, self.sampler.draw_all(), [self.own(np.stack(first))])  # B_i⁰ up, once
        self.B = B.numpy().copy()
        self.uplink_bits = 0
        self.count(comm.size, VALUE_BITS * packed_size(self.d), down=0)

    def coefficient_matrix(self, c: int, local: np.ndarray, coefficients: np.ndarray) -> np.ndarray:
        """w Σ_j coefficients_j a_j a_jᵀ over client c's rows ``local`` (positions in its shard), packed."""
        A = self.rows.X[self.rows.start[c] + local]
        return pack((A.T @ A.multiply(self.rows.weight * coefficients[:, None])).toarray())

    def round(self) -> dict[str, float]:
        x = self.w.numpy()
        members = self.sampler.draw_all()
        grad, payload = self.grad_and_payload(self.w)
        alpha = self.rows.rows_at(x, curvature=True).curv
        changes = []
        for c, client in enumerate(self.ids):                                      # client: C_i, h_i, ΔB_i
            lo, hi = self.rows.start[c], self.rows.start[c + 1]
            n, kept = hi - lo, min(self.k, hi - lo)
            picked = randk_indices(self.seed, np.array([client]), self.draws, n, kept)[0]
            old = self.h[lo + picked]
            with np.errstate(over="ignore", invalid="ignore"):  # an η that overflows them ends the run (`not_finite`)
                new = np.maximum(old + self.eta[c] * (n / kept) * (alpha[lo + picked] - old), 0.0)
            self.h[lo + picked] = new
            changes.append(self.coefficient_matrix(c, picked, new - old))
        (g, dB), reduced = sampled_mean(self.comm, members, [grad, self.own(np.stack(changes))], payload,
                                        ride_kinds=self.ride_kinds())
        sent = max(min(self.k, int(n)) for n in np.diff(self.rows.start))
        if not np.isfinite(dB.numpy()).all():  # B_{k+1} would not be finite: the round keeps x_k and the run ends
            self.ended = self.not_finite()
            self.count(len(members), VALUE_BITS * (self.d + sent * self.d + sent), down=0)
            return {**self.record(reduced, members), "clients_uplink_bits": self.uplink_bits}
        H = unpack(self.B, self.d)
        H.flat[::self.d + 1] += self.rows.l2
        step = scipy.linalg.cho_solve(scipy.linalg.cho_factor(H, lower=True), g.to(torch.float64).numpy())
        self.w = self.w - torch.from_numpy(step).to(self.w.dtype)                   # server, with B_k
        self.B += dB.numpy()
        self.draws += 1
        self.count(len(members), VALUE_BITS * (self.d + sent * self.d + sent), down=self.d)
        return {**self.record(reduced, members), "clients_uplink_bits": self.uplink_bits}

    def not_finite(self) -> Finished:
        """The run's end where the clients' changes of B are not finite (the same mean, so the same verdict, on every
        worker): a given η scales each change η n_i/K (α_j − h_j), which overflows at a huge η; the remedy names η
        where it was given, else none (the divergence line's guesses)."""
        why = "NL1's learned Hessian coefficients are not finite (each change is η n_i/K (α_j − h_j)); the round kept x_k"
        remedy = None if self.given_eta is None else \
            f"set algorithm.eta below {self.given_eta:g}, or null (K/n_i, at which a kept h_j becomes α_j)"
        return Finished("diverged", why, remedy)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "h": torch.from_numpy(self.h.copy()), "B": torch.from_numpy(self.B.copy()),
                "draws": self.draws}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.h, self.B = state["h"].numpy().copy(), state["B"].numpy().copy()
        self.draws = int(state["draws"])


@dataclass(frozen=True)
class NL1Config(AlgorithmConfig, SamplingKeys):
    k: int = 1
    eta: float | None = None
    seed: int = 0
    name: str = "nl1"
    algorithm = NL1

    def __post_init__(self) -> None:
        checks.positive_int("algorithm.k", self.k)
        if self.eta is not None:
            checks.positive("algorithm.eta", self.eta)
        self.check_sampling()
        self.refuse_sampling("nl1", "its step needs every client's gradient")
        checks.seed("algorithm.seed", self.seed)

    def build(self, problem: Problem, comm: Communicator) -> NL1:
        """η null: `baselines.defaults.nl1_step` of each client's own n_i, min(K, n_i)/n_i (clients of unequal shards
        step differently), noted as that rule over the clients this worker holds: ``value`` its first client's η,
        ``rows`` the distinct n_i among them (ascending), ``etas`` the η each gives, ``clients`` how many, ``worker``
        its rank.  A worker knows its own rows only, and NL1 makes no collective that would tell it the others': the
        batched simulator's worker holds all m clients, so its run's summary gives every client's η, where a run of
        one client per worker (threads, a launcher) gives worker 0's; there the others' are min(K, n_i)/n_i of the
        sizes the summary's sharding note lists (where the rows were dealt from one table, not presharded parts)."""
        resolution = Resolution()
        if self.eta is None:
            sizes = np.diff(client_rows(problem, comm, self.name).start)
            rows = sorted({int(n) for n in sizes})
            resolution.add("eta", nl1_step(self.k, int(sizes[0])), "nl1_step", k=self.k, worker=comm.rank,
                           clients=len(sizes), rows=rows, etas=[nl1_step(self.k, n) for n in rows])
        return NL1(problem, comm, k=self.k, eta=self.eta, sampling=self, seed=self.seed,
                   defaults=resolution.entries)
