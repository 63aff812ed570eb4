r"""FedNL's client side (`baselines.fednl`): the clients' learned Hessians H_i, their compressed messages, and the
Hessian learning rate α and the bits a round sends, which follow from the compressor.

`FedNLClients` holds the clients of a stack (`dane.problems.stacked_hessians.CompactHessians`): one in a worker's
`baselines.fednl.FedNL`, all m in `baselines.fednl_stacked.StackedFedNL`; every client draws its compressor's
randomness from its own stream, so that it draws alike alone or in the stack.
"""
from __future__ import annotations

import math
import time

import numpy as np
import torch

from dane.compress import Compressor, RandK, TopK
from dane.errors import ConfigError
from dane.problems.stacked_compress import compress_rows
from dane.problems.stacked_hessians import CompactHessians, frobenius_norms, packed_size

from .federated import VALUE_BITS

#: the phases of a round `StackedFedNL.seconds` times: the clients' gradients and Hessians, the compression of the
#: Hessian differences, the clients' and server's updates of H_i and H, the server's Newton step (line search included)
PHASES = ("oracles", "compress", "update", "newton")


def hessian_step(compressor: Compressor, d: int, alpha: float | None) -> float:
    """α: ``alpha``, or by the class of ``compressor`` on a d x d Hessian difference (module docstring): 1/(ω + 1)
    for an unbiased one, 1 for a contractive one."""
    bound = 1.0 / (compressor.omega(message_entries(compressor, d)) + 1.0) if compressor.unbiased else 1.0
    if alpha is not None and alpha > bound:  # above the theory's bound H_i overshoots ∇²O_i and the run stalls
        raise ConfigError(f"algorithm.alpha must be <= 1/(omega + 1) = {bound:.4g} for the unbiased compressor "
                          f"{compressor.spec} on d = {d} (Safaryan et al. 2022, FedNL's Hessian learning rate), got "
                          f"{alpha}; leave it null for that bound")
    return bound if alpha is None else float(alpha)


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
    return hessian + VALUE_BITS * d + (VALUE_BITS if option == 2 else 0)


class FedNLClients:
    """The client side of FedNL for the clients of ``clients`` (all m in `StackedFedNL`, one in a worker's `FedNL`).

    State, one row per client, Hessians compact (`dane.problems.stacked_hessians`): H_i, and for FedNL-PP l_i and
    g_i.
    The random compressors other than RandK (natural, dithering) draw from a generator per client, seeded by
    the client's id, so that a client draws alike alone or in the stack.
    ``seconds`` accumulates the wall time of the phases ``oracles``, ``compress`` and ``update``.  ``threads``: the
    Hessians' product and TopK's selection split over that many threads by clients, the same numbers (1 where a
    simulated worker holds the clients: the simulator's clock reads its thread's CPU time)."""

    def __init__(self, clients: CompactHessians, x0: np.ndarray, *, compressor: Compressor, alpha: float,
                 option: int, variant: str, seed: int, threads: int = 1):
        self.clients, self.compressor, self.alpha, self.option, self.seed = clients, compressor, alpha, option, seed
        self.threads = threads
        self.generators = [torch.Generator().manual_seed(seed * 1_000_003 + int(i)) for i in clients.ids]
        grads, self.H_i = clients.gradients_hessians(x0, threads=threads)       # H_i⁰ = ∇²O_i(x⁰)
        self.l_i = np.zeros(clients.m)
        self.g_i = clients.matvec(self.H_i, x0) - grads if variant == "pp" else None  # FedNL-PP's g_i⁰ (l_i⁰ = 0)
        self.seconds = dict.fromkeys(PHASES, 0.0)

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
