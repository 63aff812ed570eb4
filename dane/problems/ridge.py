r"""Ridge regression, synthetic (DESIGN.md section 4) or from given data.

.. math:: O(w) = \frac1N \sum_{j=1}^N (\langle x_j, w\rangle - y_j)^2 + \lambda\|w\|^2

Worker i's shard S_i enters its local objective with weight m/N,
:math:`O_i(w) = \frac{m}{N}\sum_{j\in S_i}(\langle x_j, w\rangle - y_j)^2 + \lambda\|w\|^2`,
so that the mean of the O_i is exactly O even when N is not a multiple of m.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from .. import checks
from ..errors import ConfigError
from ..linalg import cg
from ..local_solvers import AUTO_MAX_DIM, LocalSolver
from ..losses import SQUARED
from ..inner import worker_seed
from .glm import SOLVER_STREAM, LinearModelShard, SolverOptions
from .quadratic import QuadraticProblem

COVARIANCES = ("iso", "decay")


@dataclass(frozen=True)
class RidgeSyntheticConfig(SolverOptions):
    """y = <x, w*> + noise, x ~ N(0, Σ), w* = all ones; Σ = I (iso) or diag(j^-1.2) (decay: feature j scaled by j^-0.6)."""

    n_samples: int = 18000
    dim: int = 500
    lam: float = 0.005
    covariance: str = "iso"
    noise_std: float = 1.0
    seed: int = 0
    name: str = "ridge_synthetic"

    def __post_init__(self) -> None:
        checks.positive_int("problem.n_samples", self.n_samples)
        checks.positive_int("problem.dim", self.dim)
        checks.nonnegative("problem.lam", self.lam)
        checks.one_of("problem.covariance", self.covariance, COVARIANCES)
        checks.nonnegative("problem.noise_std", self.noise_std)
        self.solver  # validates the local-solver keys now

    def check_workers(self, workers: int) -> None:
        if self.n_samples < workers:
            raise ConfigError(
                f"problem.n_samples={self.n_samples} is fewer than workers={workers}; "
                f"every worker needs at least one sample: raise n_samples or use fewer workers"
            )

    def prepare(self) -> None:
        """Make (and cache) the full data set and its optimum, so that `build` does only a worker's own work."""
        generate(self.n_samples, self.dim, self.covariance, self.noise_std, self.seed)
        _optimum_cached(self.n_samples, self.dim, self.covariance, self.noise_std, self.seed, self.lam)

    def build(self, rank: int, size: int, dtype: torch.dtype = torch.float64) -> QuadraticProblem:
        self.check_workers(size)
        X, y = generate(self.n_samples, self.dim, self.covariance, self.noise_std, self.seed)
        w_star = _optimum_cached(self.n_samples, self.dim, self.covariance, self.noise_std, self.seed, self.lam)
        idx = shard(self.n_samples, size, self.seed)[rank]
        X, y, w_star = X[idx].to(dtype), y[idx].to(dtype), w_star.to(dtype)
        return RidgeShard(X, y, self.lam, scale=size / self.n_samples, w_star=w_star, solver=self.solver,
                          seed=worker_seed(self.seed, rank, SOLVER_STREAM))


@lru_cache(maxsize=4)
def generate(n_samples: int, dim: int, covariance: str, noise_std: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The full data set, identical in every process for the same arguments (float64)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n_samples, dim))
    if covariance == "decay":
        X *= np.arange(1, dim + 1) ** -0.6
    y = X @ np.ones(dim) + noise_std * rng.standard_normal(n_samples)
    return torch.from_numpy(X), torch.from_numpy(y)


@lru_cache(maxsize=16)
def shard(n_samples: int, size: int, seed: int) -> list[torch.Tensor]:
    """Equal random shards (sizes differ by at most one), the same on every backend."""
    perm = np.random.default_rng([seed, 1]).permutation(n_samples)
    return [torch.from_numpy(np.sort(p)) for p in np.array_split(perm, size)]


@lru_cache(maxsize=4)
def _optimum_cached(n_samples, dim, covariance, noise_std, seed, lam):
    return ridge_optimum(*generate(n_samples, dim, covariance, noise_std, seed), lam)


def ridge_optimum(X: torch.Tensor, y: torch.Tensor, lam: float) -> torch.Tensor:
    """argmin (1/n)||Xw - y||² + λ||w||²: a dense solve up to d = AUTO_MAX_DIM, else CG to 1e-14 (no d x d matrix)."""
    n, d = X.shape
    rhs = (2.0 / n) * (X.T @ y)
    if d > AUTO_MAX_DIM:
        return cg(lambda v: (2.0 / n) * (X.T @ (X @ v)) + 2 * lam * v, rhs, rtol=1e-14, max_iter=20 * d).x
    H = (2.0 / n) * (X.T @ X) + 2 * lam * torch.eye(d, dtype=X.dtype)
    return torch.linalg.solve(H, rhs)


def quadratic_shard(X: torch.Tensor, y: torch.Tensor, lam: float, *, scale: float, w_star=None) -> "RidgeShard":
    """O_i(w) = scale * ||X w - y||^2 + lam ||w||^2 as a `QuadraticProblem` that keeps its rows."""
    return RidgeShard(X, y, lam, scale=scale, w_star=w_star)


class RidgeShard(QuadraticProblem):
    r"""A ridge shard that keeps its rows X_i, y_i, for minibatch gradients and row-based local solvers.

    A minibatch B of the n_i local rows gives the unbiased estimate

    .. math:: \widehat{\nabla O_i}(w) = 2\,\text{scale}\,\frac{n_i}{|B|} X_B^\top (X_B w - y_B) + 2\lambda w,

    which equals ∇O_i(w) when B is the whole shard.  A_i = 2 scale X_iᵀX_i is formed only
    when the local solver is Cholesky (or something asks for ``A``); otherwise every
    product goes through X_i, and the cg, svrg and lbfgs local solvers run on the
    squared-loss view of the same rows (`dane.problems.glm.LinearModelShard` with row
    weight 2 scale and ℓ2 weight 2λ, the same O_i).
    """

    def __init__(self, X: torch.Tensor, y: torch.Tensor, lam: float, *, scale: float, w_star=None,
                 solver: LocalSolver = LocalSolver("cholesky"), seed: int = 0):
        self.X, self.y, self.scale = X, y, float(scale)
        self._A = None
        self.rows = LinearModelShard(X, y, SQUARED, l2=2 * lam, weight=2 * scale, solver=solver, seed=seed)
        if self.rows.solver.method == "cholesky":
            self._A = 2 * scale * (X.T @ X)
        super().__init__(self._A, 2 * scale * (X.T @ y), scale * float(y @ y), lam, w_star=w_star)
        self.solver = self.rows.solver

    @property
    def A(self) -> torch.Tensor:
        if self._A is None:
            self._A = 2 * self.scale * (self.X.T @ self.X)
        return self._A

    @A.setter
    def A(self, value) -> None:
        self._A = value

    def hessian_vector(self, v: torch.Tensor, *, with_reg: bool = True, at: torch.Tensor | None = None) -> torch.Tensor:
        if self._A is not None:
            return super().hessian_vector(v, with_reg=with_reg)
        return self.rows.hessian_vector(v, at=v, with_reg=False) + (2 * self.lam * v if with_reg else 0.0)

    def prox_solve(self, anchor: torch.Tensor, linear: torch.Tensor, mu: float, *, with_reg: bool = True,
                   anchor_grad: torch.Tensor | None = None, solver: LocalSolver | None = None) -> torch.Tensor:
        method = (solver or self.solver).resolve(self.dim, sparse=False).method
        if method in ("cholesky", "cg"):
            return super().prox_solve(anchor, linear, mu, with_reg=with_reg, anchor_grad=anchor_grad, solver=solver)
        return self.rows.prox_solve(anchor, linear, mu, with_reg=with_reg, anchor_grad=anchor_grad, solver=solver)

    @property
    def n_local(self) -> int:
        return self.X.shape[0]

    def state_dict(self) -> dict:
        return self.rows.state_dict()  # the SVRG solver's generator

    def load_state_dict(self, state: dict) -> None:
        self.rows.load_state_dict(state)

    def batch_grad(self, w: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        X, y = self.X[idx], self.y[idx]
        return (2 * self.scale * self.n_local / idx.numel()) * (X.T @ (X @ w - y)) + 2 * self.lam * w
