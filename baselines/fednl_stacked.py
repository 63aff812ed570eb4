"""FedNL with all m clients stacked in one process and no communicator (`baselines.fednl`'s module docstring): the
mean over clients a sum over the stack.  ``make bench`` section ``fednl`` (scripts/bench_fednl.py) times it.
"""
from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import torch

from dane.compress import make
from dane.problems.stacked_hessians import CompactHessians, unpack
from dane.problems.stacked_rows import StackedRows
from dane.sampling import ClientSampler

from .federated import VALUE_BITS
from .fednl_clients import FedNLClients, hessian_step, uplink_bits
from .fednl_server import armijo_backtrack, newton_direction, shifted_newton


class StackedFedNL:
    """All m clients' FedNL in one process, stacked (module docstring), on the clients' rows ``rows`` (their Hessians'
    supports built once per rows, `dane.problems.stacked_hessians.CompactHessians.kept`); `step` runs one round.  No
    communicator: the mean over clients is a sum over the stack's first axis.  ``seconds``: wall time per phase
    (`PHASES`).  ``threads``: the clients' (`FedNLClients`; None: torch's intra-op threads, ``torch.get_num_threads``,
    which ``make bench``'s ``--threads`` sets); the iterates do not depend on it."""

    def __init__(self, rows: StackedRows, *, compressor: str = "none", alpha: float | None = None,
                 option: int = 1, mu: float | None = None, variant: str = "plain", clients_per_round: int | None = None,
                 ls_c: float = 0.5, ls_gamma: float = 0.5, seed: int = 0, x0: np.ndarray | None = None,
                 threads: int | None = None, cubic: float = 0.0):
        self.compressor = make(compressor)
        self.rows, self.clients = rows, CompactHessians.kept(rows, whole=self.compressor.matrices)
        clients = self.clients
        self.m, self.d, self.T = clients.m, clients.d, clients.T
        self.alpha = hessian_step(self.compressor, self.d, alpha)
        self.option, self.variant, self.ls_c, self.ls_gamma = option, variant, ls_c, ls_gamma
        self.mu, self.cubic = clients.l2 if mu is None else mu, cubic
        self.sampler = ClientSampler(SimpleNamespace(size=self.m, rank=0), clients_per_round, seed=seed)
        self.x = np.zeros(self.d) if x0 is None else np.array(x0, dtype=np.float64)
        self.client = FedNLClients(clients, self.x, compressor=self.compressor, alpha=self.alpha, option=option,
                                   variant=variant, seed=seed,
                                   threads=torch.get_num_threads() if threads is None else threads)
        self.H = clients.packed_sum(self.client.H_i) / self.m
        self.g = self.client.g_i.mean(0) if variant == "pp" else None
        self.l = np.zeros(1)
        self.uplink_bits = self.m * VALUE_BITS * (self.T + (self.d if variant == "pp" else 0))
        self.step_size, self.rounds = 1.0, 0
        self.seconds = self.client.seconds

    def step(self) -> dict[str, float]:
        """One round; returns ``grad_norm`` at the iterate it started from (FedNL, FedNL-LS; FedNL-PP computes no
        full gradient: nan), ``step_size`` and the cumulative ``clients_uplink_bits``."""
        record = self.step_pp() if self.variant == "pp" else self.step_plain()
        self.rounds += 1
        return {**record, "step_size": self.step_size, "clients_uplink_bits": self.uplink_bits}

    def step_plain(self) -> dict[str, float]:
        x = self.x
        grads, S, l_i = self.client.round(x, self.rounds)
        g = grads.mean(0)
        now = time.perf_counter()
        direction = newton_direction(self.H, g, float(l_i.mean()), option=self.option, mu=self.mu, cubic=self.cubic)
        trials = 0
        if self.variant == "ls":
            self.step_size, trials = armijo_backtrack(self.rows.mean_objective, x, self.rows.mean_objective(x), g,
                                                      direction, c=self.ls_c, gamma=self.ls_gamma)
        self.x = x + self.step_size * direction
        now = self.client.clock("newton", now)
        self.H += self.clients.packed_sum(S) / self.m                                  # H ← H + α mean S_i
        self.client.clock("update", now)
        self.uplink_bits += self.m * (uplink_bits(self.compressor, self.d, variant="plain", option=self.option)
                                      + VALUE_BITS * trials)
        return {"grad_norm": float(np.linalg.norm(g))}

    def step_pp(self) -> dict[str, float]:
        now = time.perf_counter()
        x_next = shifted_newton(unpack(self.H, self.d), self.g, float(self.l[0]))
        self.client.clock("newton", now)
        members = self.sampler.draw().numpy()
        S, dl, dg = self.client.round_pp(x_next, members, self.rounds)
        now = time.perf_counter()
        self.H += self.clients.packed_sum(S, members) / self.m
        self.l += dl.sum(keepdims=True) / self.m
        self.g += dg.sum(0) / self.m
        self.x = x_next
        self.client.clock("update", now)
        self.uplink_bits += len(members) * uplink_bits(self.compressor, self.d, variant="pp", option=2)
        return {"grad_norm": float("nan")}

    def grad_norm(self) -> float:
        """‖∇O(x)‖ at the current iterate (gradients only; not part of a round)."""
        return float(np.linalg.norm(self.rows.mean_gradient(self.x)))
