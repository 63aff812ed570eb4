r"""Convex linear models on a user's data: ridge, binary logistic and multinomial (softmax) regression.

Worker i holds the rows S_i of the N rows of X (dense, or sparse and kept sparse as torch
CSR) and

.. math:: O_i(w) = D_i(w) + \frac{\lambda}{2}\|w\|^2,\qquad
          D_i(w) = \frac{m}{N}\sum_{j\in S_i} f(x_j^\top W, y_j),

so the mean of the O_i is exactly :math:`O(w) = \frac1N\sum_j f(x_j^\top W, y_j) +
\frac{\lambda}{2}\|w\|^2` for any shard sizes.  f is a `dane.losses.Loss`; W is w for one
output and w viewed as d x K for softmax (w has d·K entries, feature-major).
Note the ℓ2 convention: (λ/2)‖w‖², as in the GIANT, DiSCO and AIDE papers; the
paper-reproduction problem ``ridge_synthetic`` keeps the source paper's λ‖w‖².

Curvature: :math:`\nabla^2 D_i(w)\,v = \frac mN X_i^\top (f''(z) \odot X_i v)` with z the
margins at w, computed from products with X_i and X_iᵀ only (no d x d matrix unless the
Cholesky solver asks for one).  ``hessian_vector(v)`` without a point applies the
majorant :math:`\frac mN c_f X_i^\top X_i + \lambda I` (c_f the loss's curvature bound),
so that step sizes 1/L built from it are safe everywhere.

Suboptimality, when the run asks for a reference optimum (`dane.problems.optimum`), is
:math:`O_i(w) - O^*` per worker (mean O(w) − O*); for the squared loss it is the exact
quadratic identity :math:`\tfrac12 e^\top H_i e`, e = w − w*.

*Device* (``problem.device``): X_i, y_i and every local solve live on the shard's device
(a GPU, or the CPU); its methods take tensors from anywhere and return each result on
the device its input came from, so the algorithms, the communicators and the records
keep their vectors in host memory, as the network problems do (`dane.problems.neural`).
On the CPU every such move is a no-op: the records are bit-identical to a shard built
without a device.  Minibatch and SVRG row draws come from a CPU generator, so they are
the same on every device.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import scipy.sparse
import torch

from ..errors import ConfigError, NotPositiveDefinite
from ..numerics.linalg import cg, cholesky_solve
from ..numerics.local_solvers import LocalSolver, SolverNotes, cg_cap, prox_solve, refuse_oversized_svrg
from ..losses import Loss
from ..seeds import STREAMS
from ..work import count, count_once, counted, rows_fraction, uncounted
from .base import Problem, SharedL2

warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")
SOLVER_STREAM = STREAMS["svrg"].number  # the SVRG local solver's generator


@dataclass(frozen=True)
class SolverOptions:
    """The ``problem.local_solver`` keys shared by every convex problem (see `dane.numerics.local_solvers`)."""

    local_solver: str = "auto"
    local_tol: float = 1e-10
    local_max_iter: int | None = None
    newton_steps: int = 50
    svrg_passes: int = 3
    svrg_batch_size: int = 1
    svrg_lr: float | None = None
    svrg_variant: str = "epochs"

    @property
    def solver(self) -> LocalSolver:
        return LocalSolver(self.local_solver, self.local_tol, self.local_max_iter, self.newton_steps,
                           self.svrg_passes, self.svrg_batch_size, self.svrg_lr, self.svrg_variant)


class SVRGRows(NamedTuple):
    """A shard's rows for the compiled SVRG: dense ``X`` (n x F), or CSR ``indptr``, ``indices``, ``data``."""

    X: np.ndarray | None
    indptr: np.ndarray | None
    indices: np.ndarray | None
    data: np.ndarray | None
    y: np.ndarray
    loss: str
    classes: int
    weight: float
    dtype: torch.dtype


def to_torch(X, dtype: torch.dtype = torch.float64):
    """A numpy array as a dense tensor, a scipy sparse matrix as a torch CSR tensor (never densified)."""
    if scipy.sparse.issparse(X):
        X = scipy.sparse.csr_matrix(X)
        return torch.sparse_csr_tensor(torch.from_numpy(X.indptr.astype(np.int64)),
                                       torch.from_numpy(X.indices.astype(np.int64)),
                                       torch.from_numpy(X.data).to(dtype), size=X.shape)
    return torch.as_tensor(np.ascontiguousarray(X)).to(dtype)


def transposed(X: torch.Tensor, classes: int) -> torch.Tensor:
    """Xᵀ for the products Xᵀ u (gradients, Hessian-vector products) of a dense shard: a view, except with several
    classes on the CPU, where it is a contiguous copy, for the memory of a second X, so that Xᵀ times a matrix u (one
    column a class) reads its rows in memory order rather than strided; the product is the same to round-off (most
    shapes bit for bit).  A vector u (one class) and a GPU's products take the view."""
    if classes > 1 and X.device.type == "cpu":
        return X.T.contiguous()
    return X.T


def add_intercept(X):
    """X with a trailing column of ones (sparse stays sparse)."""
    if scipy.sparse.issparse(X):
        return scipy.sparse.hstack([X, np.ones((X.shape[0], 1))], format="csr")
    return np.hstack([X, np.ones((X.shape[0], 1))])


def select_rows(X: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Rows ``idx`` of a dense or CSR tensor (torch CSR has no index_select), on X's device."""
    idx = idx.to(X.device)
    if X.layout != torch.sparse_csr:
        return X[idx]
    crow, col, val = X.crow_indices(), X.col_indices(), X.values()
    starts, lengths = crow[idx], crow[idx + 1] - crow[idx]
    new_crow = torch.zeros(len(idx) + 1, dtype=crow.dtype, device=X.device)
    new_crow[1:] = torch.cumsum(lengths, 0)
    offsets = torch.repeat_interleave(starts - new_crow[:-1], lengths)
    pos = torch.arange(int(new_crow[-1]), dtype=crow.dtype, device=X.device) + offsets
    return torch.sparse_csr_tensor(new_crow, col[pos], val[pos], size=(len(idx), X.shape[1]))


def transposed_product(X: torch.Tensor, u: torch.Tensor, *, scatter: bool | None = None) -> torch.Tensor:
    """Xᵀu for a few selected rows X (dense or CSR) and u (one entry, or one row of K, per row).

    On the CPU (``scatter`` None) the product with the transposed view, as ever; for CSR rows on another device,
    or with ``scatter=True``, each non-zero x_jk u_j added into entry k (``index_add_``): a product every device
    has, where the transposed view of a CSR tensor is compressed by columns.
    """
    if scatter is None:
        scatter = X.layout == torch.sparse_csr and X.device.type != "cpu"
    if not scatter:
        return X.t() @ u
    crow, col, val = X.crow_indices(), X.col_indices(), X.values()
    rows = torch.repeat_interleave(torch.arange(X.shape[0], device=X.device), crow[1:] - crow[:-1])
    terms = val.unsqueeze(1) * u[rows].reshape(len(rows), -1)
    out = torch.zeros(X.shape[1], terms.shape[1], dtype=terms.dtype, device=X.device).index_add_(0, col, terms)
    return out.reshape(X.shape[1], *u.shape[1:])


class LinearModelShard(SharedL2, Problem):
    """Worker i's rows of a linear model; see the module docstring for O_i and its derivatives.

    ``device``: where X_i, y_i and the local solves live (module docstring, *Device*).
    """

    convex = True

    def __init__(self, X: torch.Tensor, y: torch.Tensor, loss: Loss, *, l2: float, weight: float, classes: int = 1,
                 solver: LocalSolver = LocalSolver(), w_star: torch.Tensor | None = None,
                 f_star: float | None = None, seed: int = 0, notes=(), device: str | torch.device = "cpu"):
        self.device = torch.device(device)
        # the CSR transpose is made on the host, then moved: one conversion path on every device
        XT = X.t().to_sparse_csr().to(self.device) if X.layout == torch.sparse_csr else None
        self.X, self.y, self.loss = X.to(self.device), y.to(self.device), loss
        self.XT = XT if XT is not None else transposed(self.X, classes)
        self.sparse = X.layout == torch.sparse_csr
        self.features, self.classes = X.shape[1], classes
        self.dim = self.features * classes
        self.dtype = X.dtype
        self.l2, self.weight = float(l2), float(weight)
        self.quadratic = loss.quadratic
        self.strong_convexity = self.l2
        self.solver = solver.resolve(self.dim, self.sparse)
        self.solver_notes = SolverNotes(solver)  # the problem.* nulls its solves use, for the summary
        refuse_oversized_svrg("problem.svrg_batch_size", self.solver, X.shape[0])
        self.generator = torch.Generator().manual_seed(seed)
        self.w_star, self.f_star = None if w_star is None else self._here(w_star), f_star
        self.metric_names = ("objective", "suboptimality") if w_star is not None else ("objective",)
        self.notes = list(notes)
        self._factors: dict[float, torch.Tensor] = {}  # quadratic: the factor per shift (the Hessian is constant)
        self._hessian: torch.Tensor | None = None  # quadratic: ∇²D_i, formed at the first factor
        self._last_factor: tuple[float, torch.Tensor, torch.Tensor] | None = None  # (shift, point, factor)
        self._row_smoothness: float | None = None
        self._last_curvature: tuple | None = None  # (point, X_i point, f'' there or None): `_curvature_at`
        self._last_objective: tuple[torch.Tensor, torch.Tensor] | None = None  # (point, O_i(point)) of `evaluate`
        self._svrg_rows: SVRGRows | None = None

    # ------------------------------------------------------------------ the Problem protocol
    @property
    def n_local(self) -> int:
        return self.X.shape[0]

    def initial_point(self) -> torch.Tensor:
        return torch.zeros(self.dim, dtype=self.dtype)  # in host memory, where the algorithms keep their vectors

    def _here(self, t: torch.Tensor) -> torch.Tensor:
        """A caller's tensor on this shard's device (the same tensor when it is there already)."""
        return t.to(self.device)

    def margins(self, w: torch.Tensor, X: torch.Tensor | None = None) -> torch.Tensor:
        X = self.X if X is None else X
        return X @ (w.view(self.features, self.classes) if self.classes > 1 else w)

    @property
    def row_nonzeros(self) -> int:
        return (self.X._nnz() if self.sparse else self.X.numel()) * self.classes

    @counted("local_passes")
    def data_value_grad(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(D_i(w), ∇D_i(w)), on w's device."""
        where, w = w.device, self._here(w)
        z = self.margins(w)
        value = self.weight * self.loss.value(z, self.y)
        return value.to(where), (self.weight * (self.XT @ self.loss.dz(z, self.y)).reshape(-1)).to(where)

    @counted("local_passes")
    def evaluate(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        where, w = w.device, self._here(w)
        value, grad = self.data_value_grad(w)
        objective = value + 0.5 * self.l2 * (w @ w)
        self._last_objective = (w.detach().clone(), objective)  # `prox_solve` at this anchor reads it
        return (grad + self.l2 * w).to(where), self._metrics(w, objective).to(where)

    def local_metrics(self, w: torch.Tensor) -> torch.Tensor:
        """`evaluate`'s metric vector without its gradient (`objective`'s forward pass): the same numbers, bit for bit
        (the same operations in the same order).  A measurement: not counted."""
        where, w = w.device, self._here(w)
        with uncounted():
            return self._metrics(w, self.objective(w)).to(where)

    def _metrics(self, w: torch.Tensor, objective: torch.Tensor) -> torch.Tensor:
        """The metric vector at ``w`` (on this shard's device) of O_i(w) = ``objective``: it, and the
        suboptimality where a reference is set."""
        return torch.stack([objective, self._suboptimality(w, objective)] if self.w_star is not None else [objective])

    @counted("local_passes")
    def objective(self, w: torch.Tensor) -> torch.Tensor:
        """O_i(w) alone (forward pass only): line searches evaluate several of these."""
        where, w = w.device, self._here(w)
        return (self.weight * self.loss.value(self.margins(w), self.y) + 0.5 * self.l2 * (w @ w)).to(where)

    @counted("local_passes")
    def validation_objective(self, w: torch.Tensor) -> torch.Tensor:
        """Local SGD's election score (`dane.problems.Problem.validation_objective`): the mean loss per row on this
        shard plus the regularizer, (1/n_i) Σ_j f(x_jᵀw, y_j) + (λ/2)‖w‖², by `objective`'s forward pass.  On equal
        shards (row weight m/N with m n_i = N) it is O_i(w) bit for bit: 1/n_i and m/N round to the same number.  An
        empty shard scores inf (no rows to judge its model by)."""
        where, w = w.device, self._here(w)
        if not self.n_local:
            return torch.tensor(float("inf"), dtype=self.dtype, device=where)
        return ((1.0 / self.n_local) * self.loss.value(self.margins(w), self.y) + 0.5 * self.l2 * (w @ w)).to(where)

    @counted("local_hvps")
    def hessian_vector(self, v: torch.Tensor, *, at: torch.Tensor | None = None, with_reg: bool = True) -> torch.Tensor:
        """∇²O_i(at) v; without ``at``, the majorant (m/N) c_f X_iᵀX_i v + λ v (see the module docstring)."""
        where, v = v.device, self._here(v)
        xv = self.margins(v)
        if at is None:
            curv = self.loss.curvature * xv
        else:
            z, d2 = self._curvature_at(self._here(at))
            curv = d2 * xv if d2 is not None else self.loss.hess(z, self.y, xv)
        Hv = self.weight * (self.XT @ curv).reshape(-1)
        return (Hv + self.l2 * v if with_reg else Hv).to(where)

    def _curvature_at(self, at: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(X_i at, f'' row by row there), kept for the point of the last call: CG makes many Hessian products at one
        point.  f'' is the loss's ``second_derivative`` (None for softmax, whose products apply ``hess`` to the
        margins); d2 * xv is ``hess(z, y, xv)`` bit for bit (`dane.losses`)."""
        cached = self._last_curvature
        if cached is None or cached[0].shape != at.shape or not torch.equal(cached[0], at):
            z = self.margins(at)
            d2 = None if self.loss.second_derivative is None else self.loss.second_derivative(z, self.y)
            cached = self._last_curvature = (at.detach().clone(), z, d2)
        return cached[1], cached[2]

    def grad(self, w: torch.Tensor, *, with_reg: bool = True) -> torch.Tensor:
        _, grad = self.data_value_grad(w)  # on w's device
        return grad + self.l2 * w if with_reg else grad

    def batch_grad(self, w: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Unbiased estimate of ∇O_i(w) from the local rows ``idx`` (local SGD)."""
        return (self.n_local / len(idx)) * self.rows_grad(w, idx) + self.l2 * w

    def prox_solve(self, anchor: torch.Tensor, linear: torch.Tensor, mu: float, *, with_reg: bool = True,
                   anchor_grad: torch.Tensor | None = None, solver: LocalSolver | None = None) -> torch.Tensor:
        r"""≈ argmin_w O_i(w) − <linear, w> + (μ/2)||w − anchor||² by the local solver (or ``solver``).

        Where the caller gives ``anchor_grad`` and `evaluate` last ran at the anchor (DANE's round), that evaluation's
        O_i(anchor) is the Newton line search's first value (`dane.numerics.local_solvers.newton`): no second pass."""
        solver = self.own_solver() if solver is None else solver.resolve(self.dim, self.sparse)
        where, anchor = anchor.device, self._here(anchor)
        anchor_grad = None if anchor_grad is None else self._here(anchor_grad)
        last = self._last_objective
        known = anchor_grad is not None and last is not None and torch.equal(last[0], anchor)
        return prox_solve(self, anchor, self._here(linear), mu, with_reg=with_reg, solver=solver,
                          generator=self.generator, anchor_grad=anchor_grad,
                          anchor_value=last[1] if known else None).to(where)

    # ------------------------------------------------------------------ what the local solvers use
    def solve_hessian(self, r: torch.Tensor, *, at: torch.Tensor, shift: float, with_reg: bool,
                      solver: LocalSolver | None = None, rtol: float | None = None) -> torch.Tensor:
        """(∇²D_i(at) [+ λI] + shift I)⁻¹ r, by Cholesky (dense Hessian) or CG on Hessian-vector products."""
        solver = self.own_solver() if solver is None else solver.resolve(self.dim, self.sparse)
        shift = shift + (self.l2 if with_reg else 0.0)
        where, r, at = r.device, self._here(r), self._here(at)
        if solver.method == "cholesky":
            return cholesky_solve(self._factor(at, shift), r).to(where)
        result = cg(lambda v: self.hessian_vector(v, at=at, with_reg=False) + shift * v, r,
                    rtol=solver.tol if rtol is None else rtol, max_iter=cg_cap(self, solver))
        return result.x.to(where)

    @counted("local_passes", rows_fraction)
    def rows_grad(self, w: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Σ_{j ∈ idx} (m/N) ∇f_j(w): the data term of rows ``idx`` (SVRG)."""
        where, w, idx = w.device, self._here(w), self._here(idx)
        X = select_rows(self.X, idx)
        dz = self.loss.dz(self.margins(w, X), self.y[idx])
        return (self.weight * transposed_product(X, dz).reshape(-1)).to(where)

    @counted("local_passes", lambda self, w, snapshot, idx: 2 * idx.shape[-1] / self.n_local)
    def rows_grad_diff(self, w: torch.Tensor, snapshot: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """rows_grad(w, idx) − rows_grad(snapshot, idx), with one row selection and one product each way (SVRG)."""
        idx = self._here(idx)  # w and snapshot are the solver's, on this device already
        X = select_rows(self.X, idx)
        y = self.y[idx]
        both = X @ torch.cat([w.view(self.features, -1), snapshot.view(self.features, -1)], 1)  # [X W | X W̃]
        z, z_snap = both.split(self.classes, dim=1)
        if self.classes == 1:
            z, z_snap = z.squeeze(1), z_snap.squeeze(1)
        return self.weight * transposed_product(X, self.loss.dz(z, y) - self.loss.dz(z_snap, y)).reshape(-1)

    def svrg_rows(self) -> "SVRGRows":
        """This shard's rows as numpy arrays for the compiled SVRG (`dane.numerics.svrg_kernels`), made once (views on the
        CPU; a host copy of a GPU shard's rows, which AIDE's column curvature reads)."""
        if self._svrg_rows is None:
            y = self.y.detach().to(self.dtype).cpu().numpy()  # softmax: the class index as a float
            if self.sparse:
                self._svrg_rows = SVRGRows(None, self.X.crow_indices().cpu().numpy(),
                                           self.X.col_indices().cpu().numpy(), self.X.values().detach().cpu().numpy(),
                                           y, self.loss.name, self.classes, self.weight, self.dtype)
            else:
                self._svrg_rows = SVRGRows(np.ascontiguousarray(self.X.detach().cpu().numpy()), None, None, None, y,
                                           self.loss.name, self.classes, self.weight, self.dtype)
        return self._svrg_rows

    def row_smoothness(self) -> float:
        """max_j (m/N) c_f ||x_j||²: the smoothness of one row's term (SVRG's step is 1/(n_i · this + λ + μ))."""
        if self._row_smoothness is None:
            if self.sparse:  # torch has no row reduction on CSR: sum the squared values row by row
                crow = self.X.crow_indices()
                rows = torch.repeat_interleave(torch.arange(self.n_local, device=self.device), crow[1:] - crow[:-1])
                sq = torch.zeros(self.n_local, dtype=self.dtype, device=self.device).index_add_(
                    0, rows, self.X.values().square())
            else:
                sq = (self.X * self.X).sum(1)
            self._row_smoothness = self.weight * self.loss.curvature * float(sq.max()) if self.n_local else 0.0
        return self._row_smoothness

    @counted("local_hessians")
    def dense_hessian(self, at: torch.Tensor) -> torch.Tensor:
        """∇²D_i(at) as a dense matrix (the Cholesky path; d·K x d·K)."""
        X = self.X.to_dense() if self.sparse else self.X
        if self.classes == 1:
            d2 = self.loss.hess(self.margins(at), self.y, torch.ones(self.n_local, dtype=self.dtype, device=self.device))
            return self.weight * (X.T * d2) @ X
        # softmax: blocks (k, l) = Xᵀ diag(p_k δ_kl − p_k p_l) X, assembled feature-major like w
        p = torch.softmax(self.margins(at), 1)
        K, d = self.classes, self.features
        H = torch.empty(d, K, d, K, dtype=self.dtype, device=self.device)
        for k in range(K):
            for l in range(k, K):
                coeff = p[:, k] * (float(k == l) - p[:, l])
                block = self.weight * (X.T * coeff) @ X
                H[:, k, :, l] = block
                H[:, l, :, k] = block.T
        return H.reshape(d * K, d * K)

    def _factor(self, at: torch.Tensor, shift: float) -> torch.Tensor:
        key = float(shift)
        if self.quadratic and key in self._factors:  # a quadratic's Hessian does not depend on the point
            self._count_quadratic(key)
            return self._factors[key]
        last = self._last_factor
        if last is not None and last[0] == float(shift) and torch.equal(last[1], at):
            return last[2]  # the same point again (DiSCO's preconditioner, once per PCG iteration)
        if self.quadratic:  # its one Hessian, formed once and kept, and a factor per shift
            if self._hessian is None:
                with uncounted():
                    self._hessian = self.dense_hessian(at)
            H = self._hessian.clone()
            self._count_quadratic(key)
        else:
            H = self.dense_hessian(at)
            count("local_factorizations")
        H.diagonal().add_(shift)
        L, info = torch.linalg.cholesky_ex(H)
        if info.item() != 0:
            raise NotPositiveDefinite(f"the local Hessian plus {shift} I is not positive definite on this shard; "
                                      "use problem.lam > 0")
        if self.quadratic:
            if len(self._factors) >= 8:
                self._factors.pop(next(iter(self._factors)))
            self._factors[key] = L
        else:
            self._last_factor = (float(shift), at.clone(), L)
        return L

    @staticmethod
    def _count_quadratic(shift: float) -> None:
        """A quadratic's Hessian once and its factor once per shift, each counted at its first use in the rounds
        (also one made before them, by the reference solve), however often it is used or made again."""
        count_once(("hessian",), ("local_hessians",))
        count_once(("cholesky", shift), ("local_factorizations",))

    def set_reference(self, w_star: torch.Tensor, f_star: float) -> None:
        """From now on, records carry suboptimality against (w*, O*) (`dane.problems.optimum.attach`)."""
        self.w_star, self.f_star = w_star.to(self.device, self.dtype), float(f_star)
        self.metric_names = ("objective", "suboptimality")

    def with_dtype(self, dtype: torch.dtype) -> LinearModelShard:
        """These rows, labels, loss, λ, row weight, classes and local solver in ``dtype``, on this shard's device;
        the shard itself when it is in ``dtype`` already (`dane.problems.optimum.attach` solves a float32 run's
        reference on a float64 copy, released after it)."""
        if dtype == self.dtype:
            return self
        y = self.y.to(dtype) if self.y.is_floating_point() else self.y  # softmax's class indices stay int64
        # built from the host copy, as the shard itself was: one CSR-transpose path on every device
        return LinearModelShard(self.X.cpu().to(dtype), y.cpu(), self.loss, l2=self.l2, weight=self.weight,
                                classes=self.classes, solver=self.solver, seed=self.generator.initial_seed(),
                                device=self.device)

    def _suboptimality(self, w: torch.Tensor, objective: torch.Tensor) -> torch.Tensor:
        if self.quadratic:
            e = w - self.w_star
            return 0.5 * (e @ self.hessian_vector(e, at=e))
        return objective - self.f_star

    # ------------------------------------------------------------------ checkpointing
    def own_solver(self) -> LocalSolver:
        """The local solver of ``problem.*``, for a solve that is handed none (``auto``'s choice noted)."""
        return self.solver_notes.own(self.solver, self.dim, self.sparse)

    def state_dict(self) -> dict:
        """The SVRG solver's generator, and the ``problem.*`` nulls the solves used so far (none: no key)."""
        return self.solver_notes.kept({"generator": self.generator.get_state()})

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
        self.solver_notes.restore(state)
