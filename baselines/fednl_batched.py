r"""FedNL, FedNL-LS and FedNL-PP for m clients in one process, on arrays stacked by client (`baselines.fednl`).

`StackedFedNL` runs the rounds of `baselines.fednl.FedNL` (the same update rules, the same helper
functions) with every client's state a row of one array: the m Hessians come from one sparse
product (`baselines.fednl_stacked.StackedClients`), the m Hessian differences are compressed by one
call of the compressor on the (m, d(d+1)/2) stack, and the server's Newton step is one d x d
Cholesky factorization.  No Python loop runs over the clients, except over the s sampled ones of
FedNL-PP (a product with each one's row block).  It has no communicator: the mean over clients
is a sum over the stack's first axis.  Iterates equal the worker-level method's (one worker per
client) for deterministic compressors; a random compressor draws all rows from one generator here
and from one per worker there (the same distribution, other draws).
"""
from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import torch

from dane.compress import make
from dane.sampling import ClientSampler

from .fednl import (VALUE_BITS, armijo_backtrack, compress_packed, hessian_step, projected_newton, shifted_newton,
                    uplink_bits)
from .fednl_stacked import StackedClients, frobenius_norms, unpack


#: the phases of a round `StackedFedNL.seconds` times: the clients' gradients and Hessians, the compression of the
#: Hessian differences, the clients' and server's updates of H_i and H, the server's Newton step (line search included)
PHASES = ("oracles", "compress", "update", "newton")


class StackedFedNL:
    """All m clients' FedNL state, stacked; `step` runs one round (the module docstring of `baselines.fednl`)."""

    def __init__(self, clients: StackedClients, *, compressor: str = "none", alpha: float | None = None,
                 option: int = 1, mu: float | None = None, variant: str = "plain", clients_per_round: int | None = None,
                 ls_c: float = 0.5, ls_gamma: float = 0.5, seed: int = 0, x0: np.ndarray | None = None):
        self.clients, self.m, self.d, self.T = clients, clients.m, clients.d, clients.T
        self.compressor = make(compressor)
        self.alpha = hessian_step(self.compressor, self.d, alpha)
        self.option, self.variant, self.ls_c, self.ls_gamma = option, variant, ls_c, ls_gamma
        self.mu = clients.l2 if mu is None else mu
        self.generator = torch.Generator().manual_seed(seed)
        self.sampler = ClientSampler(SimpleNamespace(size=self.m, rank=0), clients_per_round, seed=seed)
        self.x = np.zeros(self.d) if x0 is None else np.array(x0, dtype=np.float64)
        grads, hess = clients.gradients_hessians(self.x)
        self.H_i = hess                                                   # H_i⁰ = ∇²O_i(x⁰)
        self.H = self.H_i.mean(0)
        self.l_i = np.zeros(self.m)
        self.g_i = np.einsum("cab,b->ca", unpack(self.H_i, self.d), self.x) - grads if variant == "pp" else None
        self.g, self.l = (self.g_i.mean(0) if variant == "pp" else None), 0.0
        self.uplink_bits = self.m * VALUE_BITS * (self.T + (self.d if variant == "pp" else 0))
        self.step_size, self.rounds = 1.0, 0
        #: wall seconds spent so far in each phase of the rounds (``make bench`` section ``fednl`` reports them)
        self.seconds = dict.fromkeys(PHASES, 0.0)

    def clock(self, phase: str, since: float) -> float:
        now = time.perf_counter()
        self.seconds[phase] += now - since
        return now

    def step(self) -> dict[str, float]:
        """One round; returns ``grad_norm`` at the iterate it started from (FedNL, FedNL-LS; FedNL-PP computes no
        full gradient: nan), ``step_size`` and the cumulative ``clients_uplink_bits``."""
        record = self.step_pp() if self.variant == "pp" else self.step_plain()
        self.rounds += 1
        return {**record, "step_size": self.step_size, "clients_uplink_bits": self.uplink_bits}

    def step_plain(self) -> dict[str, float]:
        x, now = self.x, time.perf_counter()
        grads, hess = self.clients.gradients_hessians(x)
        g = grads.mean(0)
        now = self.clock("oracles", now)
        hess -= self.H_i                                                  # ∇²O_i(x) − H_i, in place
        l = float(frobenius_norms(hess, self.d).mean()) if self.option == 2 else 0.0
        now = self.clock("update", now)
        S = compress_packed(self.compressor, hess, self.d, self.generator)
        now = self.clock("compress", now)
        if self.alpha != 1.0:
            S *= self.alpha
        self.H_i += S
        H = unpack(self.H, self.d)
        self.H += S.mean(0)                                               # after unpacking: the step uses H_k
        now = self.clock("update", now)
        direction = -(projected_newton(H, g, self.mu) if self.option == 1 else shifted_newton(H, g, l))
        trials = 0
        if self.variant == "ls":
            self.step_size, trials = armijo_backtrack(self.clients.objective, x, self.clients.objective(x), g,
                                                      direction, c=self.ls_c, gamma=self.ls_gamma)
        self.x = x + self.step_size * direction
        self.clock("newton", now)
        self.uplink_bits += self.m * (uplink_bits(self.compressor, self.d, variant="plain", option=self.option)
                                      + VALUE_BITS * trials)
        return {"grad_norm": float(np.linalg.norm(g))}

    def step_pp(self) -> dict[str, float]:
        now = time.perf_counter()
        x_next = shifted_newton(unpack(self.H, self.d), self.g, self.l)
        now = self.clock("newton", now)
        members = self.sampler.draw().numpy()
        grads, hess = self.clients.gradients_hessians(x_next, members)
        now = self.clock("oracles", now)
        S = compress_packed(self.compressor, hess - self.H_i[members], self.d, self.generator)
        now = self.clock("compress", now)
        S *= self.alpha
        H_new = self.H_i[members] + S
        l_new = frobenius_norms(H_new - hess, self.d)
        g_new = np.einsum("cab,b->ca", unpack(H_new, self.d), x_next) + l_new[:, None] * x_next - grads
        self.H += S.sum(0) / self.m
        self.l += float((l_new - self.l_i[members]).sum()) / self.m
        self.g += (g_new - self.g_i[members]).sum(0) / self.m
        self.H_i[members], self.l_i[members], self.g_i[members] = H_new, l_new, g_new
        self.x = x_next
        self.clock("update", now)
        self.uplink_bits += len(members) * uplink_bits(self.compressor, self.d, variant="pp", option=2)
        return {"grad_norm": float("nan")}

    def grad_norm(self) -> float:
        """‖∇O(x)‖ at the current iterate (gradients only; not part of a round)."""
        return float(np.linalg.norm(self.clients.gradient(self.x)))

