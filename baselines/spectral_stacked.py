r"""`baselines.spectral`'s local Lanczos estimates for every worker of a stacked problem at once (`dane.comm.batched`).

`stacked_lanczos_extremes` runs the Lanczos iteration of `baselines.spectral.lanczos_extremes`
on m operators together: the Krylov bases are (m, d, k), the products one stacked
Hessian-vector product a step, and each worker stops where the per-worker iteration would
(its last product, or an invariant Krylov space), so worker i's Ritz values equal the
per-worker ones to round-off.  `local_spectra` is what an algorithm calls: the per-worker
estimate on one shard, the stacked (m, 2) one on a stacked problem.
"""
from __future__ import annotations

from functools import partial
from typing import Callable

import torch

from dane.problems import Problem

from .spectral import local_spectrum, require_hessian_vector, start_vector


def stacked_lanczos_extremes(matvec: Callable[[torch.Tensor], torch.Tensor], v0: torch.Tensor, iters: int,
                             workers: int) -> torch.Tensor:
    """(m, 2): each worker's smallest and largest Ritz values after ``iters`` products of its operator, all
    started at the shared ``v0`` (`baselines.spectral.lanczos_extremes`, row by row)."""
    q = (v0 / torch.linalg.vector_norm(v0)).expand(workers, -1)
    Q = [q]
    alphas: list[torch.Tensor] = []
    betas: list[torch.Tensor] = []
    length = torch.full((workers,), iters, dtype=torch.long)  # the Ritz problem's order per worker
    active = torch.ones(workers, dtype=torch.bool)
    for k in range(iters):
        z = matvec(Q[-1])
        alphas.append((Q[-1] * z).sum(-1))
        basis = torch.stack(Q, -1)  # (m, d, k + 1)
        for _ in range(2):  # Gram-Schmidt twice keeps each basis orthogonal to round-off
            z = z - (basis @ (basis.mT @ z.unsqueeze(-1))).squeeze(-1)
        beta = torch.linalg.vector_norm(z, dim=-1)
        scale = torch.stack(alphas, -1).abs().amax(-1)
        stops = active & ((beta <= 1e-12 * scale) | (k == iters - 1))
        length[stops] = k + 1
        active &= ~stops
        if not bool(active.any()):
            break
        betas.append(beta)
        Q.append(z / torch.where(active, beta, torch.ones_like(beta)).unsqueeze(-1))  # a stopped worker's row is unused
    out = torch.empty(workers, 2, dtype=torch.float64)
    A = torch.stack(alphas, -1).to(torch.float64)
    B = torch.stack(betas, -1).to(torch.float64) if betas else A[:, :0]
    for size in length.unique().tolist():
        rows = (length == size).nonzero().squeeze(-1)
        T = torch.diag_embed(A[rows, :size])
        if size > 1:
            off = B[rows, : size - 1]
            T = T + torch.diag_embed(off, 1) + torch.diag_embed(off, -1)
        ritz = torch.linalg.eigvalsh(T)
        out[rows, 0], out[rows, 1] = ritz[:, 0], ritz[:, -1]
    return out


def local_spectra(problem: Problem, *, iters: int, seed: int, key: str,
                  at: torch.Tensor | None = None) -> tuple[float, float] | torch.Tensor:
    """`baselines.spectral.local_spectrum` of one shard, or (m, 2) for a stacked problem (row i: worker i's)."""
    if problem.stacked_workers is None:
        return local_spectrum(problem, iters=iters, seed=seed, key=key, at=at)
    require_hessian_vector(problem, key)
    hv = problem.hessian_vector if at is None else partial(problem.hessian_vector, at=at)
    return stacked_lanczos_extremes(hv, start_vector(problem.dim, problem.dtype, seed), iters, problem.stacked_workers)
