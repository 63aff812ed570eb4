r"""Conjugate gradient on a linear operator: one solver for dense, sparse and Hessian-free systems.

`cg` needs only ``matvec(v) = A v`` for a symmetric positive definite A, so the same code
solves a worker's local Newton system with a dense Hessian, with a sparse design matrix
(:math:`H v = c X^\top D X v + \lambda v` without forming H), or with the global Hessian
whose every product is one allreduce (DiSCO).  ``precond(r)`` applies :math:`P^{-1}`.

Stopping: :math:`\|b - A x_k\| \le \text{rtol}\,\|b\|` or ``max_iter`` products.  The
residual is updated by the recurrence, as in every textbook CG; in float64 on the
systems here it tracks the true residual to well below the tolerances used.

`cholesky_solve` is the exact path's other half: :math:`(LL^\top)^{-1} r` by two triangular
solves.  `capacitance_factor` and `woodbury_solve` are the exact path for a low-rank
Hessian :math:`cX^\top X + sI` with fewer rows than columns (a worker with n_i < d rows):
by the Woodbury identity

.. math:: (cX^\top X + sI)^{-1} r = \tfrac1s\big(r - c\,X^\top (sI + cXX^\top)^{-1} X r\big),

which factors the n_i x n_i capacitance matrix :math:`sI + cXX^\top` instead of a d x d one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..work import count

#: CG products per solve without a cap given, per dimension: CG ends in d products in exact arithmetic (Hestenes &
#: Stiefel 1952), but round-off breaks that termination on an ill-conditioned system, in float64 too, and d products
#: then stop short of the tolerance; 10 d, scipy's cg's cap.  Every CG cap of the package reads it: `cg`'s own
#: default and `dane.numerics.local_solvers.cg_products` (the shards' CG, InexactDANE, AIDE, GIANT, DiSCO's PCG)
CG_PRODUCTS_PER_DIM = 10

MatVec = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class CGResult:
    x: torch.Tensor
    iters: int               # operator products spent (one per iteration)
    rel_residual: float      # ||b - A x|| / ||b|| by the recurrence (0 for b = 0)


def cg(matvec: MatVec, b: torch.Tensor, *, x0: torch.Tensor | None = None, rtol: float = 1e-10,
       max_iter: int | None = None, precond: MatVec | None = None) -> CGResult:
    """Solve A x = b by (preconditioned) conjugate gradient, warm-started at ``x0``."""
    max_iter = CG_PRODUCTS_PER_DIM * b.numel() if max_iter is None else max_iter
    b_norm = float(torch.linalg.vector_norm(b))
    x = torch.zeros_like(b) if x0 is None else x0.clone()
    if b_norm == 0.0:
        return CGResult(torch.zeros_like(b), 0, 0.0)
    r = b - matvec(x) if x0 is not None else b.clone()
    iters = 1 if x0 is not None else 0
    z = precond(r) if precond is not None else r
    p = z.clone()
    rz = float(r @ z)
    res = float(torch.linalg.vector_norm(r))
    while res > rtol * b_norm and iters < max_iter:
        Ap = matvec(p)
        iters += 1
        pAp = float(p @ Ap)
        if pAp <= 0.0:  # not positive definite along p (round-off at convergence, or a bad operator): stop here
            break
        alpha = rz / pAp
        x = x + alpha * p
        r = r - alpha * Ap
        res = float(torch.linalg.vector_norm(r))
        z = precond(r) if precond is not None else r
        rz_next = float(r @ z)
        p = z + (rz_next / rz) * p
        rz = rz_next
    count("local_solver_iters", iters)  # its products are counted where they are made (Hessian-vector products)
    return CGResult(x, iters, res / b_norm)


def cholesky_solve(L: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """(L Lᵀ)⁻¹ r for a lower Cholesky factor L and a vector r: a forward then a backward triangular solve.

    The same two solves as ``torch.cholesky_solve``, which copies a row-major L into
    column-major order on every call; for one right-hand side that copy costs more than the
    solves (``factorization`` in scripts/bench_scaling.py times both).
    """
    y = torch.linalg.solve_triangular(L, r.unsqueeze(1), upper=False)
    return torch.linalg.solve_triangular(L.mT, y, upper=True).squeeze(1)


def capacitance_factor(row_gram: torch.Tensor, weight: float, shift: float) -> tuple[torch.Tensor, bool]:
    """Lower Cholesky factor of shift·I + weight·XXᵀ from the row Gram matrix XXᵀ (n x n), and whether it exists."""
    M = row_gram * weight
    M.diagonal().add_(shift)
    L, info = torch.linalg.cholesky_ex(M)
    return L, info.item() == 0 and shift > 0


def woodbury_solve(X: torch.Tensor, weight: float, shift: float, L: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    r"""(weight·XᵀX + shift·I)⁻¹ r by the Woodbury identity (module docstring), ``L`` from `capacitance_factor`.

    Two products with X (n x d) and two triangular solves of order n: O(n d) per right-hand
    side, and no d x d matrix anywhere.
    """
    u = cholesky_solve(L, X @ r)
    return (r - weight * (X.T @ u)) / shift
