r"""All m workers' ridge shards as one stacked problem, for the batched simulator (`dane.comm.batched`).

`StackedRidge` holds the m equal shards of a ridge problem, X of shape (m, n, d) and y of
shape (m, n), and the local objectives

.. math:: O_i(w) = \text{scale}\,\|X_i w - y_i\|^2 + \lambda\|w\|^2,
          \qquad H_i = A_i + 2\lambda I,\quad A_i = 2\,\text{scale}\,X_i^\top X_i,

of `dane.problems.ridge.RidgeShard`, row i of every result being worker i's.  Its methods
take a point shared by the workers, shape (d,), or one per worker, shape (m, d).

*Exact local solves, batched.*  (A_i + sI)⁻¹ r_i for all i at once: with n ≥ d, one batched
Cholesky factorization of the (m, d, d) matrices per shift s (kept for the last
`FACTORS_KEPT` shifts); with n < d (``factorization=auto``, or ``woodbury``) the Woodbury
identity on the (m, n, n) matrices sI + 2 scale X_iX_iᵀ, as `RidgeShard` does.
Departure from the per-worker path: ``factorization=eigh`` (and ``auto``'s switch to an
eigendecomposition after many shifts) is served by Cholesky here; both are exact solves, so
the iterates agree to round-off, which is the batched path's promise.
"""
from __future__ import annotations

import torch

from ..local_solvers import LocalSolver
from .base import Problem
from .quadratic import not_positive_definite

FACTORS_KEPT = 8  # shifts whose batched factors are kept: DANE's safeguard visits a handful of μ


def rows_of(v: torch.Tensor, m: int) -> torch.Tensor:
    """``v`` as one row per worker, shape (m, d): a shared (d,) vector broadcast (a view, no copy)."""
    return v.expand(m, -1) if v.dim() == 1 else v


def matvec(M: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """M_i v_i for stacked matrices M (m, a, b) and vectors v (m, b), or a shared v (b,)."""
    if v.dim() == 1:
        return M @ v
    return (M @ v.unsqueeze(-1)).squeeze(-1)


def rmatvec(M: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """M_iᵀ u_i for stacked matrices M (m, a, b) and vectors u (m, a), or a shared u (a,): as the row vector uᵀM_i,
    which reads M in its own layout (a product with the transposed view copies M first)."""
    return (u.unsqueeze(-2) @ M).squeeze(-2)


def cholesky_solve_stacked(L: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """(L_i L_iᵀ)⁻¹ r_i for stacked lower factors L (m, k, k) and right-hand sides r (m, k)."""
    y = torch.linalg.solve_triangular(L, r.unsqueeze(-1), upper=False)
    return torch.linalg.solve_triangular(L.mT, y, upper=True).squeeze(-1)


def stacked_cholesky(M: torch.Tensor, shift: float) -> torch.Tensor:
    """Lower factors of M_i + shift I for every i (M is overwritten); a shard where that is not positive definite
    is refused."""
    M.diagonal(dim1=-2, dim2=-1).add_(shift)
    L, info = torch.linalg.cholesky_ex(M)
    if bool((info != 0).any()):
        raise not_positive_definite(shift)
    return L


class StackedRidge(Problem):
    """m equal ridge shards stacked (module docstring); the batched form of `dane.problems.ridge.RidgeShard`."""

    convex = True
    quadratic = True

    def __init__(self, X: torch.Tensor, y: torch.Tensor, lam: float, *, scale: float, w_star=None,
                 low_rank: bool = False, device: str | torch.device = "cpu"):
        self.device = torch.device(device)
        self.X, self.y = X.to(self.device), y.to(self.device)
        self.stacked_workers, self.n_local, self.dim = X.shape
        self.dtype = X.dtype
        self.lam, self.scale = float(lam), float(scale)
        self.strong_convexity = 2 * self.lam
        self.low_rank = low_rank
        self.solver = LocalSolver("cholesky")
        self.w_star = None if w_star is None else w_star.to(self.device)
        self.metric_names = ("objective", "suboptimality") if w_star is not None else ("objective",)
        self.notes = [f"sim.batched: the {self.stacked_workers} workers ran as one stacked computation, each "
                      "charged 1/m of its measured compute (dane/comm/batched.py)"]
        self.A = None if low_rank else 2 * self.scale * (self.X.mT @ self.X)  # (m, d, d)
        self.b = 2 * self.scale * rmatvec(self.X, self.y)                       # (m, d)
        self.c = self.scale * (self.y * self.y).sum(-1)                         # (m,)
        self._factors: dict[float, torch.Tensor] = {}
        self._row_gram: torch.Tensor | None = None
        self._H_w_star = None if w_star is None else self.hessian_vector(self.w_star)

    def initial_point(self) -> torch.Tensor:
        return torch.zeros(self.dim, dtype=self.dtype)

    # ------------------------------------------------------------------ values and derivatives, per worker
    def hessian_vector(self, v: torch.Tensor, *, with_reg: bool = True, at: torch.Tensor | None = None) -> torch.Tensor:
        """H_i v (A_i v without the regularizer) for every worker: (m, d)."""
        where, v = v.device, v.to(self.device)
        Av = matvec(self.A, v) if self.A is not None else 2 * self.scale * rmatvec(self.X, matvec(self.X, v))
        return (Av + 2 * self.lam * v if with_reg else Av).to(where)

    def grad(self, w: torch.Tensor, *, with_reg: bool = True) -> torch.Tensor:
        return self.hessian_vector(w, with_reg=with_reg) - self.b.to(w.device)

    def objective(self, w: torch.Tensor) -> torch.Tensor:
        """O_i(w) for every worker: (m,)."""
        where, w = w.device, w.to(self.device)
        Aw = self.hessian_vector(w, with_reg=False)
        return (0.5 * (w * Aw).sum(-1) - (self.b * w).sum(-1) + self.c + self.lam * (w * w).sum(-1)).to(where)

    def evaluate(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(∇O_i(w), [O_i(w), ½ (w − w*)ᵀH_i(w − w*)]) for every worker: (m, d) and (m, k)."""
        where, w = w.device, w.to(self.device)
        Hw = self.hessian_vector(w)
        grad = Hw - self.b
        dot = lambda a, b: (a * b).sum(-1)  # noqa: E731 - a row-wise inner product, (d,) or (m, d) alike
        objective = 0.5 * dot(w, Hw - 2 * self.lam * w) - dot(self.b, w) + self.c + self.lam * dot(w, w)
        metrics = [objective]
        if self.w_star is not None:
            metrics.append(0.5 * dot(w - self.w_star, Hw - self._H_w_star))
        return grad.to(where), torch.stack(metrics, -1).to(where)

    # ------------------------------------------------------------------ exact local solves, batched
    def shifted_solve(self, r: torch.Tensor, shift: float) -> torch.Tensor:
        """(A_i + shift I)⁻¹ r_i for every worker: Cholesky of A_i + sI, or Woodbury's n x n matrices."""
        r = rows_of(r, self.stacked_workers)
        L = self._factor(float(shift))
        if not self.low_rank:
            return cholesky_solve_stacked(L, r)
        weight = 2 * self.scale
        u = cholesky_solve_stacked(L, matvec(self.X, r))
        return (r - weight * rmatvec(self.X, u)) / shift

    def _factor(self, shift: float) -> torch.Tensor:
        if shift not in self._factors:
            if self.low_rank:
                if self._row_gram is None:
                    self._row_gram = self.X @ self.X.mT
                if not shift > 0:
                    raise not_positive_definite(shift)
                L = stacked_cholesky(self._row_gram * (2 * self.scale), shift)
            else:
                L = stacked_cholesky(self.A.clone(), shift)
            if len(self._factors) >= FACTORS_KEPT:
                self._factors.pop(next(iter(self._factors)))
            self._factors[shift] = L
        return self._factors[shift]

    def solve_hessian(self, r: torch.Tensor, *, at: torch.Tensor | None = None, shift: float, with_reg: bool,
                      solver: LocalSolver | None = None, rtol: float | None = None) -> torch.Tensor:
        """(A_i [+ 2λI] + shift I)⁻¹ r_i for every worker, exactly."""
        where, r = r.device, r.to(self.device)
        return self.shifted_solve(r, shift + (2 * self.lam if with_reg else 0.0)).to(where)

    def prox_solve(self, anchor: torch.Tensor, linear: torch.Tensor, mu: float, *, with_reg: bool = True,
                   anchor_grad: torch.Tensor | None = None, solver: LocalSolver | None = None) -> torch.Tensor:
        """argmin_w O_i(w) − <linear_i, w> + (μ/2)‖w − anchor‖² for every worker, solved for the step as
        `dane.problems.quadratic.QuadraticProblem.prox_solve` does."""
        if anchor_grad is None:
            anchor_grad = self.grad(anchor, with_reg=with_reg)
        return anchor + self.solve_hessian(linear - anchor_grad, shift=mu, with_reg=with_reg)

    def prox_regularizer(self, v: torch.Tensor, rho: float) -> torch.Tensor:
        return (rho / (rho + 2 * self.lam)) * v



class StackedLeastSquares(Problem):
    r"""m equal least-squares shards of a linear model stacked: the batched form of
    `dane.problems.glm.LinearModelShard` with the squared loss (``problem=ridge``),

    .. math:: O_i(w) = \frac{m}{N}\,\tfrac12\|X_i w - y_i\|^2 + \frac{\lambda}{2}\|w\|^2,

    X of shape (m, n, d), dense.  The exact local solve factors the (m, d, d) Hessians
    (m/N) X_iᵀX_i + sI by one batched Cholesky per shift, as the per-worker Newton step
    of a quadratic does (`dane.local_solvers.newton`: one step, the minimizer).
    """

    convex = True
    quadratic = True

    def __init__(self, X: torch.Tensor, y: torch.Tensor, *, l2: float, weight: float, notes=(),
                 device: str | torch.device = "cpu"):
        self.device = torch.device(device)
        self.X, self.y = X.to(self.device), y.to(self.device)
        self.stacked_workers, self.n_local, self.dim = X.shape
        self.dtype = X.dtype
        self.l2, self.weight = float(l2), float(weight)
        self.strong_convexity = self.l2
        self.solver = LocalSolver("cholesky")
        self.metric_names = ("objective",)
        self.notes = [*notes, f"sim.batched: the {self.stacked_workers} workers ran as one stacked computation, "
                              "each charged 1/m of its measured compute (dane/comm/batched.py)"]
        self._factors: dict[float, torch.Tensor] = {}
        self._gram: torch.Tensor | None = None

    def initial_point(self) -> torch.Tensor:
        return torch.zeros(self.dim, dtype=self.dtype)

    def evaluate(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(∇O_i(w), [O_i(w)]) for every worker: (m, d) and (m, 1)."""
        where, w = w.device, w.to(self.device)
        dz = matvec(self.X, w) - self.y
        value = self.weight * (0.5 * dz.square().sum(-1))
        grad = self.weight * rmatvec(self.X, dz)
        objective = value + 0.5 * self.l2 * (w * w).sum(-1)
        return (grad + self.l2 * w).to(where), torch.stack([objective], -1).to(where)

    def objective(self, w: torch.Tensor) -> torch.Tensor:
        return self.evaluate(w)[1][:, 0]

    def hessian_vector(self, v: torch.Tensor, *, at: torch.Tensor | None = None, with_reg: bool = True) -> torch.Tensor:
        """∇²O_i v = (m/N) X_iᵀX_i v (+ λv) for every worker: (m, d); the same at every point ``at``."""
        where, v = v.device, v.to(self.device)
        Hv = self.weight * rmatvec(self.X, matvec(self.X, v))
        return (Hv + self.l2 * v if with_reg else Hv).to(where)

    def solve_hessian(self, r: torch.Tensor, *, at: torch.Tensor | None = None, shift: float, with_reg: bool,
                      solver: LocalSolver | None = None, rtol: float | None = None) -> torch.Tensor:
        """((m/N) X_iᵀX_i [+ λI] + shift I)⁻¹ r_i for every worker, by batched Cholesky."""
        where, r = r.device, r.to(self.device)
        key = float(shift + (self.l2 if with_reg else 0.0))
        if key not in self._factors:
            if self._gram is None:
                self._gram = self.weight * (self.X.mT @ self.X)
            if len(self._factors) >= FACTORS_KEPT:
                self._factors.pop(next(iter(self._factors)))
            self._factors[key] = stacked_cholesky(self._gram.clone(), key)
        return cholesky_solve_stacked(self._factors[key], rows_of(r, self.stacked_workers)).to(where)

    def prox_solve(self, anchor: torch.Tensor, linear: torch.Tensor, mu: float, *, with_reg: bool = True,
                   anchor_grad: torch.Tensor | None = None, solver: LocalSolver | None = None) -> torch.Tensor:
        """argmin_w O_i(w) − <linear_i, w> + (μ/2)‖w − anchor‖²: one Newton step from the anchor, exact."""
        if anchor_grad is None or not with_reg:
            grad = self.evaluate(anchor)[0] - (0.0 if with_reg else self.l2 * anchor)
        else:
            grad = anchor_grad
        l2 = self.l2 if with_reg else 0.0
        return anchor + self.solve_hessian(-(grad - linear), shift=mu + l2, with_reg=False)

    def prox_regularizer(self, v: torch.Tensor, rho: float) -> torch.Tensor:
        return (rho / (rho + self.l2)) * v
