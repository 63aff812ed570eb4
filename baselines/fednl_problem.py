r"""FedNL's own stacked form for the batched simulator: the m clients' linear-model shards as one stacked problem.

The batched simulator (``sim.batched``, `dane.comm.batched`) runs an algorithm's ordinary step once, on a
problem whose methods answer for all m workers, row i worker i's.  The linear models' stacked form
(`dane.problems.stacked.StackedLinearModel`) carries their exact local solves and so needs dense rows
dealt in equal shards.  FedNL solves nothing locally: a client needs its gradient, Hessian and objective
only, which `baselines.fednl_kernels.StackedClients` gives for sparse rows and unequal shards alike.
`FedNLConfig` declares this form through the `dane.algorithm.AlgorithmConfig` hooks (``stacked_form``,
``build_stacked``), so ``algorithm=fednl`` runs stacked on every source its per-worker form runs on
(LIBSVM, CSV, NPZ, arrays, built-ins, presharded parts) and under every ``data.sharding``.

`StackedShards` keeps the m built shards (`dane.problems.glm.LinearModelShard`), with the reference optimum
attached to them as the per-worker simulator attaches it (`dane.reference.attach_all`), so that its records
carry the same metrics.  Its methods take the shared iterate (d,) only (FedNL's iterate is the server's):

.. math:: O_i(x) = w\sum_{j\in S_i} f(x_j^\top x, y_j) + \tfrac{\lambda}{2}\|x\|^2,\qquad
          \nabla O_i(x) = w\,X_i^\top f'(X_i x) + \lambda x

for every client from one pass over all rows (w = m/N the row weight; `baselines.fednl_rows`), and the suboptimality
O_i(x) − O* (a quadratic f: ½ eᵀ∇²O_i e, e = x − x*, as the shard computes it).  The sums run over the
rows in another order than a shard's own, so the records agree with the per-worker run's to round-off.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from dane.problems import Problem
from dane.work import counted

from .fednl_kernels import StackedClients
from .fednl_rows import row_pass

NOTE = ("sim.batched: the {m} FedNL clients ran as one stacked computation, each charged 1/m of its measured "
        "compute (dane/comm/batched.py)")


class StackedShards(Problem):
    """The m linear-model shards of one problem, stacked on their `StackedClients` (module docstring).

    ``whole``: every client's Hessian support the whole triangle (FedNL's ``rank:R`` compressor)."""

    convex = True

    def __init__(self, shards: Sequence, *, whole: bool = False):
        first = shards[0]
        self.shards = list(shards)
        self.clients = StackedClients(self.shards, whole=whole)
        self.stacked_workers = m = len(self.shards)
        self.dim, self.dtype = first.dim, first.dtype
        self.quadratic, self.strong_convexity = first.quadratic, first.strong_convexity
        self.metric_names = first.metric_names
        self.w_star, self.f_star = first.w_star, first.f_star
        self.notes = [*first.notes, NOTE.format(m=m)]
        self.target_units, self.data_info = first.target_units, first.data_info
        self.loss, self.l2, self.weight = first.loss, first.l2, self.clients.weight
        self.row_client = np.repeat(np.arange(m), np.diff(self.clients.start))
        self.row_nonzeros = np.diff(self.clients.X.indptr[self.clients.start])  # each client's, for `dane.work`

    def initial_point(self) -> torch.Tensor:
        return torch.zeros(self.dim, dtype=self.dtype)

    def client_sums(self, row_values: torch.Tensor) -> np.ndarray:
        """Σ_{j ∈ S_i} of per-row values, for every client i: (m,)."""
        return np.bincount(self.row_client, weights=row_values.numpy(), minlength=self.stacked_workers)

    @counted("local_passes")
    def objective(self, w: torch.Tensor) -> torch.Tensor:
        """O_i(w) for every client: (m,)."""
        x = w.detach().to(torch.float64).numpy()
        clients = self.clients
        values = row_pass(clients.X, clients.y, clients.start, x, self.loss, self.weight, gradients=False,
                          unit=clients.unit).values
        return torch.from_numpy(values + 0.5 * self.l2 * float(x @ x))

    def evaluate(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(∇O_i(w), [O_i(w), suboptimality]) for every client: (m, d) and (m, k), from one pass over the rows (kept:
        under full participation FedNL's round has just read the same point)."""
        x = w.detach().to(torch.float64).numpy()
        at = self.clients.rows_at(x)
        grads = at.grads + self.l2 * x
        values = at.values + 0.5 * self.l2 * float(x @ x)
        metrics = [values]
        if self.w_star is not None:
            metrics.append(self.suboptimality(x, values))
        return torch.from_numpy(grads).to(self.dtype), torch.from_numpy(np.stack(metrics, -1)).to(self.dtype)

    def suboptimality(self, x: np.ndarray, values: np.ndarray) -> np.ndarray:
        """Each client's share of O(x) − O*: O_i(x) − O*, or ½ eᵀ∇²O_i e for a quadratic f (the shard's rule)."""
        if not self.quadratic:
            return values - self.f_star
        e = x - self.w_star.detach().to(torch.float64).cpu().numpy()
        ze = torch.from_numpy(self.clients.X @ e)
        curvature = ze * self.loss.hess(ze, torch.from_numpy(self.clients.y), ze)
        return 0.5 * (self.weight * self.client_sums(curvature) + self.l2 * float(e @ e))
