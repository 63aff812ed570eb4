r"""Quadratic local objectives with exact (Cholesky) local solves.

Worker i holds

.. math:: O_i(w) = \tfrac12 w^\top A_i w - b_i^\top w + c_i + \lambda \|w\|^2,
          \qquad H_i = A_i + 2\lambda I,

and the global objective is the mean of the O_i.  When the global optimum w* is known,
suboptimality is computed as the exact quadratic identity

.. math:: O(w) - O(w^*) = \tfrac12 (w - w^*)^\top H (w - w^*),

each worker contributing :math:`\tfrac12 e^\top H_i e`, so it stays accurate to
round-off far below the objective's own cancellation error.

*Exact local solves for every μ.*  DANE and its safeguard ask for
:math:`(A_i + s I)^{-1} r` at a handful of shifts s = μ (+ 2λ).  Two factorizations serve
them (``factorization``):

- ``cholesky``: :math:`A_i + sI = LL^\top` for each new s (d³/3 flops per shift), cached;
- ``eigh``: :math:`A_i = Q\,\mathrm{diag}(\ell)\,Q^\top` once, after which every shift
  costs two matrix-vector products, :math:`(A_i + sI)^{-1} r = Q\,\mathrm{diag}(1/(\ell + s))\,Q^\top r`;
- ``auto`` (ski rental): Cholesky for the first `EIGH_BREAK_EVEN` distinct shifts, then
  one eigendecomposition for all later ones, so the total is at most about twice the
  cheaper of the two choices made in hindsight.

*Low rank.*  A shard that keeps its n_i rows (`dane.problems.ridge.RidgeShard`,
:math:`A_i = cX_i^\top X_i`) has a fourth choice, ``woodbury``: the Woodbury identity
(`dane.numerics.linalg.woodbury_solve`) factors the n_i x n_i matrix :math:`sI + cX_iX_i^\top`
instead of the d x d one, O(n_i² d + n_i³/3) per shift and O(n_i d) per solve, and no
d x d matrix is ever formed.  ``auto`` takes it when n_i < d (a worker of a federated-scale
run holds a handful of rows); the d x d Cholesky path stays the reference and the default
when n_i ≥ d.  A bare `QuadraticProblem` has only A_i, so ``woodbury`` is an error there.
"""
from __future__ import annotations

import torch

from .. import checks
from ..errors import ConfigError, NotPositiveDefinite
from ..numerics.linalg import cg, cholesky_solve
from ..numerics.local_solvers import LocalSolver, SolverNotes, cg_cap
from ..work import count_once, counted
from .base import Problem

FACTORIZATIONS = ("auto", "cholesky", "eigh", "woodbury")
#: An eigendecomposition of a d x d matrix costs about this many Cholesky factorizations
#: (torch/LAPACK, d=2000, one core; scripts/bench_scaling.py records both times).
EIGH_BREAK_EVEN = 16


class QuadraticProblem(Problem):
    """Worker i's quadratic shard; the exact local solve factors A_i once per μ or once for all μ (module docstring).

    Local solves use those factors (``cholesky``) or conjugate gradient on
    Hessian-vector products (``cg``, `dane.numerics.linalg.cg`); `RidgeShard`, which keeps its
    rows, also offers ``svrg`` and ``lbfgs`` and does not form A_i unless Cholesky needs it.
    """

    convex = True
    quadratic = True
    keeps_rows = False  # the low-rank (``woodbury``) path needs the shard's rows, not only A_i

    def __init__(self, A: torch.Tensor, b: torch.Tensor, c: float, lam: float, w_star: torch.Tensor | None = None,
                 *, factorization: str = "auto"):
        self.A, self.b, self.c, self.lam = A, b, float(c), float(lam)
        self.dim = b.numel()
        self.dtype = b.dtype
        self.strong_convexity = 2 * self.lam
        self.solver = LocalSolver("cholesky")
        self.w_star = w_star
        self.metric_names = ("objective", "suboptimality") if w_star is not None else ("objective",)
        self._H_w_star = self.hessian_vector(w_star) if w_star is not None else None
        self.factorization = checks.one_of("problem.factorization", factorization, FACTORIZATIONS)
        if self.factorization == "woodbury" and not self.keeps_rows:
            raise ConfigError(f"problem.factorization=woodbury needs the shard's rows; {type(self).__name__} has "
                              f"only its Hessian: use auto, cholesky or eigh")
        self._factors: dict[float, torch.Tensor] = {}  # Cholesky factor of A_i + sI, by total shift s
        self._choleskys = 0  # distinct shifts factored so far (the ski-rental count of ``auto``)
        self._eigen: tuple[torch.Tensor, torch.Tensor] | None = None  # (ℓ, Q) of A_i

    def initial_point(self) -> torch.Tensor:
        return torch.zeros(self.dim, dtype=self.dtype)

    @counted("local_hvps")
    def hessian_vector(self, v: torch.Tensor, *, with_reg: bool = True, at: torch.Tensor | None = None) -> torch.Tensor:
        """H_i v (A_i v without the regularizer); a quadratic's Hessian is the same at every point ``at``."""
        Av = self.A @ v
        return Av + 2 * self.lam * v if with_reg else Av

    @counted("local_passes")
    def objective(self, w: torch.Tensor) -> torch.Tensor:
        """O_i(w) alone: line searches evaluate several of these."""
        return 0.5 * (w @ self.hessian_vector(w, with_reg=False)) - self.b @ w + self.c + self.lam * (w @ w)

    @counted("local_passes")
    def grad(self, w: torch.Tensor, *, with_reg: bool = True) -> torch.Tensor:
        return self.hessian_vector(w, with_reg=with_reg) - self.b

    @counted("local_passes")
    def evaluate(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        Hw = self.hessian_vector(w)
        grad = Hw - self.b
        objective = 0.5 * (w @ (Hw - 2 * self.lam * w)) - self.b @ w + self.c + self.lam * (w @ w)
        metrics = [objective]
        if self.w_star is not None:
            metrics.append(0.5 * ((w - self.w_star) @ (Hw - self._H_w_star)))
        return grad, torch.stack(metrics)

    def factor(self, mu: float, *, with_reg: bool = True) -> torch.Tensor:
        """Lower Cholesky factor of A_i (+ 2λI) + μI, cached per total shift."""
        return self._cholesky(mu + (2 * self.lam if with_reg else 0.0))

    def _cholesky(self, shift: float) -> torch.Tensor:
        key = float(shift)
        if key not in self._factors:
            M = self.A.clone()
            M.diagonal().add_(shift)  # A_i + sI without a d x d identity
            L, info = torch.linalg.cholesky_ex(M)
            if info.item() != 0:
                raise not_positive_definite(shift)
            if len(self._factors) >= 8:  # the safeguard visits a handful of μ values; keep memory bounded
                self._factors.pop(next(iter(self._factors)))
            self._factors[key] = L
            self._choleskys += 1
        count_once(("cholesky", key), ("local_factorizations",))  # once in the rounds, wherever it was made
        return self._factors[key]

    def eigen(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(ℓ, Q) with A_i = Q diag(ℓ) Qᵀ, computed once."""
        if self._eigen is None:
            self._eigen = torch.linalg.eigh(self.A)
            count_once(("eigh",), ("local_factorizations",))
        return self._eigen

    def _uses_eigh(self, shift: float) -> bool:
        if self.factorization == "auto":
            return float(shift) not in self._factors and (
                self._eigen is not None or self._choleskys >= EIGH_BREAK_EVEN)
        return self.factorization == "eigh"

    def shifted_solve(self, r: torch.Tensor, shift: float) -> torch.Tensor:
        """(A_i + shift I)⁻¹ r, exactly: by a Cholesky factor of this shift or by the eigendecomposition."""
        if not self._uses_eigh(shift):
            return cholesky_solve(self._cholesky(shift), r)
        values, Q = self.eigen()
        shifted = values + shift
        if not float(shifted.min()) > 0:
            raise not_positive_definite(shift)
        return Q @ ((Q.T @ r) / shifted)

    def prox_regularizer(self, v: torch.Tensor, rho: float) -> torch.Tensor:
        r"""argmin_z λ||z||^2 + (ρ/2)||z - v||^2 = ρ v / (ρ + 2λ): the prox of the shared regulariser (ADMM's z-step);
        `dane.problems.stacked.StackedRidge`'s too."""
        return (rho / (rho + 2 * self.lam)) * v

    def solve_hessian(self, r: torch.Tensor, *, at: torch.Tensor | None = None, shift: float, with_reg: bool,
                      solver: LocalSolver | None = None, rtol: float | None = None) -> torch.Tensor:
        """(A_i [+ 2λI] + shift I)⁻¹ r, exactly (``cholesky``: `shifted_solve`) or by CG on Hessian-vector products."""
        notes = getattr(self, "solver_notes", None)  # a shard with problem.* solver keys (`dane.problems.ridge`)
        solver = solver.resolve(self.dim, sparse=False) if solver is not None else \
            self.solver if notes is None else notes.own(self.solver, self.dim, False)
        if solver.method == "cholesky":
            return self.shifted_solve(r, shift + (2 * self.lam if with_reg else 0.0))
        if solver.method != "cg":  # the key that chose it: the problem's, or a method's own (InexactDANE's svrg)
            raise ConfigError(f"{solver.keys}.local_solver={solver.method} needs the shard's rows; "
                              f"{type(self).__name__} has only its Hessian: use {solver.keys}.local_solver=cholesky "
                              f"or cg")
        return cg(lambda v: self.hessian_vector(v, with_reg=with_reg) + shift * v, r,
                  rtol=solver.tol if rtol is None else rtol,
                  max_iter=cg_cap(self, solver)).x

    def prox_solve(self, anchor: torch.Tensor, linear: torch.Tensor, mu: float, *, with_reg: bool = True,
                   anchor_grad: torch.Tensor | None = None, solver: LocalSolver | None = None) -> torch.Tensor:
        """argmin_w O_i(w) − <linear, w> + (μ/2)‖w − anchor‖², from stationarity (H_i + μI)(w − anchor) = linear −
        ∇O_i(anchor): solved for the step rather than for w, which keeps w accurate when the step is tiny;
        `dane.problems.stacked.StackedRidge`'s too, every worker at once."""
        if anchor_grad is None:
            anchor_grad = self.grad(anchor, with_reg=with_reg)
        return anchor + self.solve_hessian(linear - anchor_grad, shift=mu, with_reg=with_reg, solver=solver)


def auto_factorization(rows: int, dim: int) -> str:
    """``factorization=auto`` on a shard that keeps its ``rows`` rows (`dane.problems.ridge.RidgeShard`) in
    d = ``dim``: ``woodbury`` where rows < d (n_i x n_i factors, no d x d matrix), else ``cholesky``, a factor per
    shift until `EIGH_BREAK_EVEN` shifts, then one eigendecomposition for every later shift (`QuadraticProblem`'s ski
    rental).  This package's rule (not swept)."""
    return "woodbury" if rows < dim else "cholesky"


def note_factorization(notes: SolverNotes, factorization: str, rows: int, dim: int) -> None:
    """``factorization=auto``'s choice (`auto_factorization`) on ``notes`` at an exact solve: worker ``notes.worker``'s,
    from its ``rows``; with ``cholesky``, the shift count from which the eigendecomposition serves (``eigh_after``)."""
    if factorization == "auto":
        choice = auto_factorization(rows, dim)
        notes.note("problem.factorization", choice, "auto_factorization", worker=notes.worker, rows=rows, dim=dim,
                   eigh_after=EIGH_BREAK_EVEN if choice == "cholesky" else None)


def not_positive_definite(shift: float) -> NotPositiveDefinite:
    return NotPositiveDefinite(f"the local Hessian plus {shift} I is not positive definite on this shard; use a "
                               f"strongly convex problem (problem.lam > 0; controlled_quadratic: problem.mu > 0)")
