r"""Extreme eigenvalues of Hessians from Hessian-vector products, for step sizes (1/L) and penalties.

`lanczos_max_eig` spends ``iters`` products on the Krylov space of a random start vector
(the space a power iteration of the same length explores) and returns its largest Ritz
value.  That is never below the power iteration's Rayleigh quotient, usually far more
accurate (Lanczos converges with the square root of the eigenvalue gap where the power
iteration converges with the gap itself), and exact after d products
(``tests/test_baselines.py::test_lanczos_is_exact_after_dim_products_and_beats_power_iteration``).
Ritz values lie within [λ_min, λ_max] (`lanczos_extremes` gives both ends), so a step
1/L_est errs on the long side, by that relative error.

The estimates here are of each worker's own Hessian H_i, whose products cost no
communication; the baselines combine them with one scalar in an allreduce they make
anyway (GD) or one allreduce at the start (ADMM), through the bounds
λ_max(H) ≤ mean_i λ_max(H_i) and λ_min(H) ≥ mean_i λ_min(H_i) for H = mean_i H_i
(λ_max is convex and λ_min concave on symmetric matrices).
"""
from __future__ import annotations

from functools import partial
from typing import Callable

import torch

from dane.comm import Communicator
from dane.errors import ConfigError
from dane.problems import Problem


def lanczos_max_eig(matvec: Callable[[torch.Tensor], torch.Tensor], v0: torch.Tensor, iters: int) -> float:
    """Largest Ritz value of a symmetric operator after ``iters`` products (full reorthogonalisation)."""
    return lanczos_extremes(matvec, v0, iters)[1]


def lanczos_extremes(matvec: Callable[[torch.Tensor], torch.Tensor], v0: torch.Tensor,
                     iters: int) -> tuple[float, float]:
    """Smallest and largest Ritz values after ``iters`` products: within [λ_min, λ_max], exact after dim products."""
    Q = [v0 / torch.linalg.vector_norm(v0)]
    alphas: list[float] = []
    betas: list[float] = []
    for k in range(iters):
        z = matvec(Q[-1])
        alphas.append(float(Q[-1] @ z))
        basis = torch.stack(Q, 1)
        for _ in range(2):  # Gram-Schmidt twice keeps the basis orthogonal to round-off
            z = z - basis @ (basis.T @ z)
        beta = float(torch.linalg.vector_norm(z))
        if k == iters - 1 or beta <= 1e-12 * max(abs(a) for a in alphas):
            break  # the last product, or the Krylov space is invariant: the Ritz values are exact
        betas.append(beta)
        Q.append(z / beta)
    T = torch.diag(torch.tensor(alphas, dtype=torch.float64))
    off = torch.tensor(betas, dtype=torch.float64)
    T = T + torch.diag(off, 1) + torch.diag(off, -1)
    ritz = torch.linalg.eigvalsh(T)
    return float(ritz[0]), float(ritz[-1])


def start_vector(dim: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """The same random vector on every worker (same seed), so their Krylov spaces agree."""
    return torch.randn(dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def require_hessian_vector(problem: Problem, key: str) -> None:
    if problem.hessian_vector is None:
        raise ConfigError(
            f"{key}=null is estimated from Hessian-vector products, which {type(problem).__name__} does not provide; "
            f"set {key} to a number"
        )


def local_smoothness(problem: Problem, *, iters: int, seed: int) -> float:
    """λ_max(H_i) of this worker's own Hessian from ``iters`` local products: no communication."""
    return local_spectrum(problem, iters=iters, seed=seed, key="algorithm.lr")[1]


def local_spectrum(problem: Problem, *, iters: int, seed: int, key: str,
                   at: torch.Tensor | None = None) -> tuple[float, float]:
    """(smallest, largest) Ritz values of this worker's own Hessian (at ``at``; None: the problem's default, a
    majorant for a GLM) from ``iters`` local products: no communication."""
    require_hessian_vector(problem, key)
    hv = problem.hessian_vector if at is None else partial(problem.hessian_vector, at=at)
    return lanczos_extremes(hv, start_vector(problem.dim, problem.dtype, seed), iters)


def largest_local_smoothness(problem: Problem, comm: Communicator, *, iters: int, seed: int,
                             per: torch.Tensor | None = None) -> float:
    """max_i λ_max(H_i) (``per``: max_i λ_max(H_i) / per_i, this worker's divisor): local products cost nothing;
    one collective gathers the m estimates (`dane.comm.Communicator.gather`)."""
    L_local = local_smoothness(problem, iters=iters, seed=seed) / (1.0 if per is None else float(per))
    every, _ = comm.gather(torch.tensor([L_local], dtype=problem.dtype))
    return float(every.max())


def one_hot(value: float, rank: int, size: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """``value`` at position ``rank`` of a zero m-vector: its allreduced mean, times m, gathers every worker's value."""
    out = torch.zeros(size, dtype=dtype)
    out[rank] = value
    return out
