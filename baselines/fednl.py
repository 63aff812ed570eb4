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
(null: the problem's ℓ2 weight λ, as the paper's code).  α = ``alpha``; null: by the class of C
(`dane.compress`): 1/(ω + 1) for an unbiased one (RandK, natural, dithering), 1 for a contractive
one (TopK, rank-R, ``none``: the paper's option α = 1 for C ∈ C(δ), FedNL-Public's ``upd_rule=2``).
Its other option for C(δ), α = 1 − sqrt(1 − δ) with δ = k/T, is tiny at the benchmark's k = 8d
(k/T = 16/(d+1)); the learned H_i then trail ∇²O_i for hundreds of rounds, and FedNL-PP, whose
step (H + lI)⁻¹g is damped by their error l, crawls (``make bench`` section ``fednl``'s ``w8a_pp``
records the gradient norm either way; ``algorithm.alpha`` sets it).

``variant=ls`` (FedNL-LS, Algorithm 2): the step is x_k + t d_k, d_k = −[H]_μ⁻¹∇O(x_k), t the first
of 1, γ, γ², … with O(x_k + t d_k) ≤ O(x_k) + c t ⟨∇O(x_k), d_k⟩ (c = ``ls_c``, γ = ``ls_gamma``),
one more allreduce (the clients' objective values) per trial.  The paper searches without end; here at most
60 trials (γ⁶⁰ ≈ 1e-18 at γ = 1/2), and where none passes (a direction that is no descent at round-off) the
round keeps x_k (t = 0, recorded as ``step_size``) rather than take a step no trial tested.

``variant=cr`` (FedNL-CR, the paper's cubic-regularized FedNL): option 2's round, the server step the minimizer of
the cubic model ⟨∇O(x_k), s⟩ + ½ sᵀ(H + l_k I)s + (M/6)‖s‖³, x_{k+1} = x_k + s (`baselines.fednl_server.cubic_newton`),
convergent from any start.  M = ``cubic``; null: L_*, the Lipschitz constant of ∇²O, max|f⁽³⁾|·(1/N)Σ_j ‖a_j‖³
(`baselines.defaults.cubic_constant`, measured before round 0 by one allreduce, `baselines.measure.mean_row_cubes`,
and listed in the summary's ``defaults``); 0 for the squared loss, where the step is option 2's.  The same messages
and bits as option 2.  FedNL-Public's ``FedNL_CR`` departs from its paper in three places, which the package does not
follow: its update of the H_i runs outside the loop over the clients (only the last client's H_i learns), and its
subproblem solver pairs the shift M t/2 in its equation for t with M√t/2 in its step, and rotates g by U, not Uᵀ.

``variant=pp`` (FedNL-PP, Algorithm 3): s = ``clients_per_round`` clients a round
(`dane.sampling`; the paper draws them uniformly, and ``sampling=size`` is kept: the step below reads every client's
stored state, so a draw by size changes only how often each client refreshes it).  Client i keeps w_i, H_i,
l_i = ‖H_i − ∇²O_i(w_i)‖_F and g_i = (H_i + l_i I) w_i − ∇O_i(w_i); the server keeps their means H, l, g and steps
first:

.. math::
    x_{k+1} &= (H + l I)^{-1} g;\qquad i\in S_k:\ w_i = x_{k+1},\
    H_i \mathrel{+}= \alpha\,\mathcal C(\nabla^2 O_i(w_i) - H_i),\ \text{new } l_i, g_i;\\
    (H, l, g) &\mathrel{+}= \tfrac1m\textstyle\sum_{i\in S_k}\Delta(\alpha S_i, l_i, g_i).

With every client sampled and C = ``none``, FedNL-PP is Newton's method (its H is learned at the
point it steps from); plain FedNL then lags one round behind, so the two differ.  The server's H, l, g are
running sums of the changes the clients send, as the protocol has them; they drift from the means
of the clients' states by round-off that grows with the total change (a compensated sum of the
received changes does not help: each change is itself rounded), and the step (H + lI)⁻¹g, with l
near 0 and a small λ, passes the drift to the iterate, so FedNL-PP's gradient norm levels off
somewhat above plain FedNL's (``make bench`` section ``fednl``, ``w8a_pp``).

What a client sends a round, in bits (records: ``clients_uplink_bits``, cumulative, summed over the
participants as ``uplink_bytes`` is, by the compressor's exact `dane.compress.Compressor.bits`; not
``comm.compress``'s per-worker ``uplink_bits``, which FedNL, compressing its own message, does not
use): FedNL 64·d (its gradient) + bits(S_i) (+ 64 for l_i under option 2); FedNL-LS also 64 for f_i(x_k), the
value its search starts from, and 64 per trial; FedNL-PP bits(S_i) + 64·d (Δg_i) + 64 (Δl_i).  Before round 0 each client sends
H_i⁰ whole (64·d(d+1)/2 bits), which round 0's record holds (a record counts what reaching its
iterate cost, `dane.algorithm.Algorithm.spent`).  S_i travels as the packed upper
triangle of the symmetric difference (d(d+1)/2 entries: what u-FedNL sends), so TopK/RandK's k counts
entries of that triangle and δ, ω are those of the packed vector; ``rank:R`` compresses the d x d
matrix.

Departures: the paper's option-2 code uses the spectral norm, we use the Frobenius norm its text
states; [H]_μ takes a Cholesky factor of H − (μ − ε)I first (ε: 64·d·machine epsilon·max H_aa) and
when that exists uses H itself, the projection changing only eigenvalues within ε of μ.

Both forms share one client side, `FedNLClients`, over the package's stacked engine: the clients' rows
(`dane.problems.stacked_rows.StackedRows`) and their Hessians on their supports
(`dane.problems.stacked_hessians.CompactHessians`).  `FedNL` holds one client per worker (a launched process, or a
thread of the per-worker simulator), the means by allreduce, and on the batched simulator (``sim.batched``,
`dane.comm.batched`) all m clients at once, on the stacked rows (sparse rows and unequal shards stack alike: FedNL
asks its problem for values, gradients and Hessians only, ``stacked_needs = "oracles"``), its messages stacked;
`batched` builds that form outside a run, for a caller that steps it itself (``make bench`` section ``fednl`` times
its rounds beside the simulator's).  Their iterates agree to round-off, for every compressor: RandK
draws each client's indices from that client's own stream (`dane.problems.stacked_compress.randk_indices`), natural
and dithering from a generator per client.  The clients keep H_i on its support only
(`dane.problems.stacked_hessians`), which changes no iterate.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from dane import checks
from dane.algorithm import AlgorithmConfig, Column, metrics_message, metrics_received
from dane.comm import Communicator
from dane.comm.batched import BatchedCommunicator, BatchedGroup, stacked
from dane.compress import Compressor, RandK, TopK, make
from dane.errors import ConfigError
from dane.problems import Problem, ProblemConfig
from dane.problems.stacked_compress import compress_rows, load as load_kernels
from dane.problems.stacked_hessians import CompactHessians, PackedRows, frobenius_norms, packed_size, unpack
from dane.problems.stacked_rows import StackedRows
from dane.sampling import SamplingKeys, sampled_mean

from .defaults import THIRD_DERIVATIVE_BOUND, Resolution, cubic_constant, fednl_option, hessian_learning_rate
from .federated import VALUE_BITS, ClientBits, Federated
from .measure import mean_row_cubes
from .newton_star import require_rows
from .fednl_server import armijo_backtrack, newton_direction, shifted_newton

VARIANTS = ("plain", "ls", "pp", "cr")
#: the phases of a round `FedNL` times into its clients' ``seconds`` (`FedNLClients`): the clients' gradients and
#: Hessians (and the record's metrics), the compression of the Hessian differences, the clients' and server's updates
#: of H_i and H (the means over the clients included), the server's Newton step (line search included)
PHASES = ("oracles", "compress", "update", "newton")


def hessian_step(compressor: Compressor, d: int, alpha: float | None) -> float:
    """α: ``alpha``, or by the class of ``compressor`` on a d x d Hessian difference (module docstring): 1/(ω + 1)
    for an unbiased one, 1 for a contractive one."""
    bound = hessian_learning_rate(hessian_omega(compressor, d))
    if alpha is not None and alpha > bound:  # above the theory's bound H_i overshoots ∇²O_i and the run stalls
        raise ConfigError(f"algorithm.alpha must be <= 1/(omega + 1) = {bound:.4g} for the unbiased compressor "
                          f"{compressor.spec} on d = {d} (Safaryan et al. 2022, FedNL's Hessian learning rate), got "
                          f"{alpha}; leave it null for that bound")
    return bound if alpha is None else float(alpha)


def hessian_omega(compressor: Compressor, d: int) -> float | None:
    """ω of ``compressor`` on FedNL's Hessian-difference message; None for a contractive one."""
    return compressor.unbiased_omega(message_entries(compressor, d))


def theoretical_alpha(compressor: Compressor, d: int) -> float:
    """The paper's other α for a contractive compressor, 1 − sqrt(1 − δ) (module docstring)."""
    return 1.0 - math.sqrt(max(0.0, 1.0 - compressor.delta(message_entries(compressor, d))))


def message_entries(compressor: Compressor, d: int) -> int:
    """Entries of the Hessian-difference message: d² for a matrix compressor, else the packed triangle."""
    return d * d if compressor.matrices else packed_size(d)


def uplink_bits(compressor: Compressor, d: int, *, variant: str, option: int) -> int:
    """One participant's uplink bits of a round (the module docstring), line-search trials aside."""
    hessian = compressor.bits(message_entries(compressor, d), VALUE_BITS)
    if variant == "pp":
        return hessian + VALUE_BITS * d + VALUE_BITS
    return hessian + VALUE_BITS * d + (VALUE_BITS if option == 2 else 0) + (VALUE_BITS if variant == "ls" else 0)


class FedNLClients:
    """The client side of FedNL for the clients of ``clients`` (all m in `FedNL` on a batched communicator, one in a
    worker's).

    State, one row per client, Hessians compact (`dane.problems.stacked_hessians`): H_i, and for FedNL-PP l_i and
    g_i.
    The random compressors other than RandK (natural, dithering) draw from a generator per client, seeded by
    the client's id, so that a client draws alike alone or in the stack.
    ``seconds`` accumulates the wall time of the phases (`PHASES`; `FedNL` adds the server's).  ``threads``: the
    Hessians' product and TopK's selection split over that many threads by clients, the same numbers (1 where a
    simulated worker holds the clients: the simulator's clock reads its thread's CPU time)."""

    def __init__(self, clients: CompactHessians, x0: np.ndarray, *, compressor: Compressor, alpha: float,
                 option: int, variant: str, seed: int, threads: int = 1):
        compressor.check_fits(message_entries(compressor, clients.d))  # a K or R too large: refused before round 0
        self.clients, self.compressor, self.alpha, self.option, self.seed = clients, compressor, alpha, option, seed
        self.threads = threads
        self.generators = [torch.Generator().manual_seed(seed * 1_000_003 + int(i)) for i in clients.ids]
        grads, self.H_i = clients.gradients_hessians(x0, threads=threads)       # H_i⁰ = ∇²O_i(x⁰)
        self.l_i = np.zeros(clients.m)
        self.g_i = clients.matvec(self.H_i, x0) - grads if variant == "pp" else None  # FedNL-PP's g_i⁰ (l_i⁰ = 0)
        self.seconds = dict.fromkeys(PHASES, 0.0)
        load_kernels(compressor, clients)  # its numba kernels loaded now, not in round 0

    def clock(self, phase: str, since: float) -> float:
        now = time.perf_counter()
        self.seconds[phase] += now - since
        return now

    def compress(self, diff: np.ndarray, members: np.ndarray | None, draw: int) -> np.ndarray:
        """C of each row of ``diff`` (the rows of ``members``; None: all), every client on its own stream."""
        if self.compressor.name == "none" or isinstance(self.compressor, (TopK, RandK)):  # no torch generator
            return compress_rows(self.compressor, diff, self.clients, members, seed=self.seed, draw=draw,
                                 threads=self.threads)
        rows = np.arange(len(diff)) if members is None else members
        if not len(rows):
            return diff.copy()
        return np.concatenate([compress_rows(self.compressor, diff[k:k + 1], self.clients, rows[k:k + 1],
                                             seed=self.seed, draw=draw, generator=self.generators[c])
                               for k, c in enumerate(rows)])

    def round(self, x: np.ndarray, draw: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """FedNL's client step at x: (∇O_i(x), α S_i compact, ‖∇²O_i(x) − H_i‖_F (option 2; else 0)) per client,
        H_i ← H_i + α S_i with S_i = C(∇²O_i(x) − H_i)."""
        now = time.perf_counter()
        grads, diff = self.clients.gradients_hessians(x, threads=self.threads)
        now = self.clock("oracles", now)
        diff -= self.H_i                                                          # ∇²O_i(x) − H_i, in place
        l_i = frobenius_norms(diff, self.clients.weights) if self.option == 2 else np.zeros(len(diff))
        now = self.clock("update", now)
        S = self.compress(diff, None, draw)                                       # S_i = C(...)
        now = self.clock("compress", now)
        if self.alpha != 1.0:
            S = S * self.alpha if S is diff else np.multiply(S, self.alpha, out=S)
        self.H_i += S
        self.clock("update", now)
        return grads, S, l_i

    def round_pp(self, x: np.ndarray, members: np.ndarray, draw: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """FedNL-PP's client step for the sampled ``members`` (w_i = x): the changes (α S_i, Δl_i, Δg_i) of H_i, l_i
        and g_i = (H_i + l_i I) x − ∇O_i(x), per member."""
        now = time.perf_counter()
        grads, hess = self.clients.gradients_hessians(x, members, threads=self.threads)
        now = self.clock("oracles", now)
        S = self.compress(hess - self.H_i[members], members, draw)
        now = self.clock("compress", now)
        S *= self.alpha
        H_new = self.H_i[members] + S
        l_new = frobenius_norms(H_new - hess, self.clients.weights[members])
        g_new = self.clients.matvec(H_new, x, members) + l_new[:, None] * x - grads
        dl, dg = l_new - self.l_i[members], g_new - self.g_i[members]
        self.H_i[members], self.l_i[members], self.g_i[members] = H_new, l_new, g_new
        self.clock("update", now)
        return S, dl, dg

    def state_dict(self) -> dict:
        state = {"H_i": torch.from_numpy(self.H_i.copy()), "l_i": torch.from_numpy(self.l_i.copy()),
                 "generators": [generator.get_state() for generator in self.generators]}
        return state if self.g_i is None else {**state, "g_i": torch.from_numpy(self.g_i.copy())}

    def load_state_dict(self, state: dict) -> None:
        self.H_i, self.l_i = state["H_i"].numpy().copy(), state["l_i"].numpy().copy()
        if self.g_i is not None:
            self.g_i = state["g_i"].numpy().copy()
        for generator, saved in zip(self.generators, state["generators"]):
            generator.set_state(saved)


class FedNL(ClientBits, Federated):
    """FedNL on one worker = one client (module docstring); the server's H, l, g are kept on every worker.

    On the batched simulator's communicator (`dane.comm.batched`) the one worker holds all m clients, on their
    stacked rows (`dane.problems.stacked_rows.StackedRows`): the same round, its messages stacked (`batched` builds
    it outside a run).  A round's wall time is clocked by phase (`PHASES`) into ``client.seconds``; on a per-worker
    communicator its ``update`` holds the allreduce's wait.  ``threads``: the clients' (`FedNLClients`)."""

    name = "fednl"
    needs_rows = True  # its clients' rows (`require_rows`)
    label = "FedNL"
    batchable = True  # its clients are rows of one stack whether it holds one or all m (`FedNLClients`)
    stacked_needs = "oracles"  # gradients, Hessians and values at the server's iterate: any rows stack
    columns = (*Federated.columns, Column("step_size", "{:>9.3g}"), Column("clients_uplink_bits", "{:>12.4g}"))
    summary_keys = (*Federated.summary_keys, "clients_uplink_bits")  # its own exact bit count

    def __init__(self, problem: Problem, comm: Communicator, *, compressor: str = "none", alpha: float | None = None,
                 option: int = 1, mu: float | None = None, variant: str = "plain", ls_c: float = 0.5,
                 ls_gamma: float = 0.5, sampling: SamplingKeys, seed: int = 0, cubic: float = 0.0,
                 defaults: tuple[dict, ...] = (), threads: int = 1):
        super().__init__(problem, comm, sampling=sampling, seed=seed, defaults=defaults)
        self.cubic = cubic  # FedNL-CR's M (0: no cubic term)
        require_rows(problem, comm, "fednl")
        self.compressor = make(compressor, "algorithm.compressor")
        if stacked(comm):  # the clients' Hessians built with their rows (`FedNLConfig.build_stacked`)
            clients = CompactHessians.kept(problem, whole=self.compressor.matrices)
        else:
            clients = CompactHessians(StackedRows([problem]), ids=[comm.rank], whole=self.compressor.matrices)
        self.d = clients.d
        self.T = clients.T
        self.alpha = hessian_step(self.compressor, self.d, alpha)
        self.option, self.variant, self.ls_c, self.ls_gamma = option, variant, ls_c, ls_gamma
        self.mu = float(problem.strong_convexity or 0.0) if mu is None else mu
        self.client = FedNLClients(clients, self.w.numpy(), compressor=self.compressor, alpha=self.alpha,
                                   option=option, variant=variant, seed=seed, threads=threads)
        self.uplink_bits, self.step_size, self.rounds = 0, 1.0, 0
        sent = [self.packed(self.client.H_i)] + ([self.own(self.client.g_i)] if variant == "pp" else [])
        reduced, _ = sampled_mean(comm, self.sampler.draw_all(), sent)                 # H_i⁰ (and g_i⁰) up, once
        self.H = reduced[0].numpy().copy()
        self.g = reduced[1].numpy().copy() if variant == "pp" else None
        self.l = np.zeros(1)
        self.count(comm.size, VALUE_BITS * (packed_size(self.d) + (self.d if variant == "pp" else 0)), down=0)

    def server(self) -> dict[str, np.ndarray]:
        """The server's running sums (module docstring): H, l, and FedNL-PP's g."""
        return {"H": self.H, "l": self.l} if self.g is None else {"H": self.H, "l": self.l, "g": self.g}

    def held(self, members: torch.Tensor) -> np.ndarray:
        """The rows, in this worker's stack of clients, of those in ``members``, in order."""
        if stacked(self.comm):  # the stack holds clients 0..m-1 in order (`StackedRows`)
            return np.sort(members.numpy())
        return np.flatnonzero(np.isin(self.client.clients.ids, members.numpy()))

    def packed(self, compact: np.ndarray, rows: np.ndarray | None = None) -> torch.Tensor | PackedRows:
        """The packed triangles the clients send (the decoded messages, as `own`), from compact rows: row k of
        ``compact`` is the client at row ``rows[k]`` of the stack (None: every client in order); a client not in
        ``rows`` sends zeros.  On a batched communicator a `PackedRows`, which it sums without the (m, T) array."""
        if stacked(self.comm):
            return PackedRows(self.client.clients, compact, rows)
        if rows is not None and not len(rows):
            return torch.zeros(self.T, dtype=torch.float64)
        return torch.from_numpy(self.client.clients.expand(compact, rows)[0])

    def step(self) -> dict[str, float]:
        record = self.step_pp() if self.variant == "pp" else self.step_plain()
        self.rounds += 1
        return record

    def step_plain(self) -> dict[str, float]:
        x = self.w.numpy()
        members = self.sampler.draw_all()
        grads, S, l_i = self.client.round(x, self.rounds)                              # client: ∇O_i, α S_i
        now = time.perf_counter()
        metrics, *grad = self.payload(self.w)
        now = self.client.clock("oracles", now)
        sent = [self.own(grads), self.packed(S), self.own(l_i[:, None])]
        reads = self.variant == "ls"  # FedNL-LS's search starts from O(x_k): that value is its message (counted)
        parts, kinds = metrics_message(metrics, reads_objective=reads)
        (g, S_mean, l), means = sampled_mean(self.comm, members, sent, [*parts, *grad],
                                             ride_kinds=(*kinds, *self.ride_kinds()[1:]))
        reduced = [metrics_received(means[:len(parts)], reads_objective=reads)[0], *means[len(parts):]]
        now = self.client.clock("update", now)
        g = g.numpy()
        direction = newton_direction(self.H, g, float(l), option=self.option, mu=self.mu,  # server, with H_k
                                     cubic=self.cubic)
        trials = 0
        if self.variant == "ls":
            self.step_size, trials = armijo_backtrack(self.global_objective, x, float(reduced[0][0]), g, direction,
                                                      c=self.ls_c, gamma=self.ls_gamma)
        self.w = torch.from_numpy(x + self.step_size * direction).to(self.w.dtype)  # the server's float64, cast back
        now = self.client.clock("newton", now)
        self.H += S_mean.numpy()                                                        # H ← H + α mean S_i
        self.client.clock("update", now)
        self.count(len(members), uplink_bits(self.compressor, self.d, variant=self.variant, option=self.option)
                   + VALUE_BITS * trials, down=self.d * (1 + trials))
        return {**self.record(reduced, members), "step_size": self.step_size,
                "clients_uplink_bits": self.uplink_bits}

    def step_pp(self) -> dict[str, float]:
        now = time.perf_counter()
        x_next = shifted_newton(unpack(self.H, self.d), self.g, float(self.l[0]))      # server: (H + lI)⁻¹ g
        self.client.clock("newton", now)
        members = self.sampler.draw()                                                  # S_k
        rows = self.held(members)
        n = self.client.clients.m
        S, dl, dg = np.zeros((0, self.client.clients.S)), np.zeros((n, 1)), np.zeros((n, self.d))
        if len(rows):
            S, dl[rows, 0], dg[rows] = self.client.round_pp(x_next, rows, self.rounds)
        sent = [self.packed(S, rows), self.own(dl), self.own(dg)]                      # zero outside S_k
        if len(members) < self.comm.size:
            self.comm.next_participants(members.tolist())  # the simulator charges the participants only
        now = time.perf_counter()
        payload = self.payload(self.w)
        now = self.client.clock("oracles", now)
        S_mean, l, g, *reduced = self.comm.allreduce_mean(sent + payload,              # uplink: (1/m) Σ_{S_k}
                                                          kinds=(None, None, None, *self.ride_kinds()))
        for key, delta in (("H", S_mean), ("l", l), ("g", g)):
            getattr(self, key)[...] += delta.numpy()
        self.client.clock("update", now)
        self.w = torch.from_numpy(x_next).to(self.w.dtype)
        self.count(len(members), uplink_bits(self.compressor, self.d, variant="pp", option=2), down=self.d)
        return {**self.record(reduced, members), "step_size": 1.0, "clients_uplink_bits": self.uplink_bits}


    def global_objective(self, x: np.ndarray) -> float:
        """O(x): one allreduce of the clients' O_i(x) (FedNL-LS's trials)."""
        (value,) = self.comm.allreduce_mean([self.problem.objective(torch.from_numpy(x).to(self.w.dtype)).reshape(-1)])
        return float(value)

    def state_dict(self) -> dict:
        server = {key: torch.from_numpy(value.copy()) for key, value in self.server().items()}
        return {**super().state_dict(), **server, "client": self.client.state_dict(),
                "step_size": self.step_size, "rounds": self.rounds}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        for key in self.server():
            setattr(self, key, state[key].numpy().copy())
        self.client.load_state_dict(state["client"])
        self.step_size, self.rounds = float(state["step_size"]), int(state["rounds"])


@dataclass(frozen=True)
class FedNLConfig(AlgorithmConfig, SamplingKeys):
    compressor: str = "none"
    alpha: float | None = None
    option: int | None = None  # null: 1 for FedNL-LS (its projected direction), else 2
    mu: float | None = None
    variant: str = "plain"
    ls_c: float = 0.5
    ls_gamma: float = 0.5
    cubic: float | None = None  # FedNL-CR's M; null: L_* (module docstring)
    seed: int = 0
    name: str = "fednl"
    algorithm = FedNL
    mu_role = "damping"
    #: FedNL-PP's step (H + lI)⁻¹g reads every client's stored H_i, l_i, g_i through the server's means over all m
    #: clients, and the draw decides only which clients refresh theirs: a draw by size changes how often each client
    #: refreshes, not the point the step aims at (`dane.sampling`; the other variants refuse sampling)
    size_sampling = True

    def __post_init__(self) -> None:
        make(self.compressor, "algorithm.compressor")  # a bad spec is one line now
        if self.alpha is not None and not 0 < checks.positive("algorithm.alpha", self.alpha) <= 1:
            raise ConfigError(f"algorithm.alpha must be in (0, 1], got {self.alpha}: FedNL's theory (Safaryan et al. "
                              f"2022) takes alpha <= 1/(omega + 1) for an unbiased compressor, 1 - sqrt(1 - delta) or 1 "
                              f"for a contractive one; null picks that bound")
        if self.option is not None and (isinstance(self.option, bool) or self.option not in (1, 2)):
            raise ConfigError(f"algorithm.option must be 1 (projection onto H >= mu I) or 2 (H + l I), "
                              f"got {self.option!r}")
        if self.mu is not None:
            checks.nonnegative("algorithm.mu", self.mu)
        checks.one_of("algorithm.variant", self.variant, VARIANTS)
        if not 0 < checks.number("algorithm.ls_c", self.ls_c) <= 0.5:  # null: "must be a number", not a TypeError
            raise ConfigError(f"algorithm.ls_c must be in (0, 0.5], got {self.ls_c}")
        if not 0 < checks.number("algorithm.ls_gamma", self.ls_gamma) < 1:
            raise ConfigError(f"algorithm.ls_gamma must be in (0, 1), got {self.ls_gamma}")
        self.check_sampling()
        if self.variant != "pp":
            self.refuse_sampling(f"fednl algorithm.variant={self.variant}",
                                 "partial participation is FedNL-PP (algorithm.variant=pp)")
        if self.variant in ("pp", "cr") and self.chosen_option != 2:
            raise ConfigError(f"algorithm.variant={self.variant} steps with H + l I (the paper's "
                              f"{'FedNL-PP' if self.variant == 'pp' else 'FedNL-CR'}); set algorithm.option=2")
        if self.cubic is not None:
            checks.nonnegative("algorithm.cubic", self.cubic)
            if self.variant != "cr":
                raise ConfigError(f"algorithm.cubic is FedNL-CR's cubic weight (algorithm.variant=cr), got "
                                  f"algorithm.variant={self.variant}; set algorithm.cubic=null")
        checks.seed("algorithm.seed", self.seed)

    @property
    def chosen_option(self) -> int:
        """``option``, or where it is null the package's choice: 1 for FedNL-LS (its projected direction), else 2
        (`recovery` says why)."""
        return self.option if self.option is not None else fednl_option(self.variant)

    def numbers(self, problem: Problem, resolution: Resolution) -> dict:
        """α, μ and the option, each null resolved and noted in ``resolution``: α by
        `baselines.defaults.hessian_learning_rate` (the paper's bound for the compressor's class), option 1's μ the
        problem's strong-convexity bound (its ℓ2 weight), the option by `chosen_option`."""
        compressor = make(self.compressor, "algorithm.compressor")
        alpha = hessian_step(compressor, problem.dim, self.alpha)
        if self.alpha is None:
            resolution.add("alpha", alpha, "hessian_learning_rate", omega=hessian_omega(compressor, problem.dim))
        mu = self.mu if self.mu is not None else float(problem.strong_convexity or 0.0)
        if self.mu is None and self.chosen_option == 1:  # option 2 reads no μ
            resolution.add("mu", mu, "the problem's")
        if self.option is None:
            resolution.add("option", self.chosen_option, "fednl_option", variant=self.variant)
        return {"alpha": alpha, "mu": mu, "option": self.chosen_option}

    def recovery(self) -> list[str]:
        """Plain FedNL converges locally (the paper's theory): far from x*, a learned H that a compressor left
        short along some direction gives a long step there, and the run can diverge; FedNL-LS and option 2's
        shift are the paper's remedies.  Option 2 is the default for that reason (``option`` null): from x⁰ = 0
        option 1 diverged on LIBSVM's mushrooms with TopK and RandK at k = 8d and wandered on a9a with RandK
        (scripts/bench_fednl.py's ``OPTION``), where option 2 and FedNL-LS converged."""
        if self.variant != "plain":
            return []
        hints = ["algorithm.variant=ls (FedNL-LS: a line search on O, convergent from any start)"]
        if self.chosen_option == 1:
            hints.append("algorithm.option=2 (the step shifted by the learned Hessians' error)")
        return hints

    def stacked_form(self, problem: ProblemConfig, size: int) -> str | None:
        """The stacked rows (``stacked_needs``, `dane.algorithm.AlgorithmConfig.stacked_form`), unless the sampler needs
        the shard sizes."""
        why = super().stacked_form(problem, size)
        sampled = self.clients_per_round is not None and self.clients_per_round < size
        if why is None and self.sampling == "size" and sampled:
            return "algorithm.sampling=size allreduces each worker's shard size as it builds its sampler"
        return why

    def build_stacked(self, problem: ProblemConfig, size: int, dtype: torch.dtype) -> StackedRows:
        """The base's stacked rows (`dane.problems.stacked_rows.build_rows`), with the clients' Hessians on their
        supports built in the run's set-up (counted in the summary's ``setup_s``), whole triangles for ``rank:R``."""
        rows = super().build_stacked(problem, size, dtype)
        CompactHessians.kept(rows, whole=make(self.compressor).matrices)
        return rows

    def build(self, problem: Problem, comm: Communicator, *, threads: int = 1) -> FedNL:
        """FedNL-CR's M null resolved first (`baselines.defaults.cubic_constant`, one allreduce).  ``threads``: the
        clients' (`FedNLClients`; a run's are 1)."""
        resolution, cubic = Resolution(), self.cubic or 0.0
        if self.variant == "cr" and self.cubic is None:
            require_rows(problem, comm, self.name)  # before its rows' loss is read
            third, cubes = THIRD_DERIVATIVE_BOUND.get(problem.loss.name), None
            if third is None:
                raise ConfigError(f"algorithm.cubic=null is L_* for the logistic or squared loss, got "
                                  f"{problem.loss.name}; set algorithm.cubic to a number")
            cubes = mean_row_cubes(problem, comm)
            cubic = resolution.add("cubic", cubic_constant(third, cubes), "cubic_constant", third=third,
                                   mean_row_cubes=cubes)
        return FedNL(problem, comm, compressor=self.compressor, **self.numbers(problem, resolution),
                     variant=self.variant, ls_c=self.ls_c, ls_gamma=self.ls_gamma, sampling=self, seed=self.seed,
                     cubic=cubic, defaults=resolution.entries, threads=threads)


def batched(rows: StackedRows, *, threads: int = 1, **keys) -> FedNL:
    """`FedNL` with all m clients of ``rows`` in this process, for a caller that steps it itself: `FedNLConfig` of
    ``keys`` (its fields; each null resolved as in a run, `FedNLConfig.numbers`) built on a batched communicator of m
    workers (`dane.comm.batched`), as the batched simulator builds it.  ``threads``: the clients' (`FedNLClients`),
    which change no iterate."""
    comm = BatchedCommunicator(BatchedGroup(rows.stacked_workers))
    comm.begin()  # compute phases metered from here, as `dane.comm.batched.run_batched` meters a run's
    return FedNLConfig(**keys).build(rows, comm, threads=threads)
