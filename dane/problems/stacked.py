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
identity on the (m, n, n) matrices sI + 2 scale X_iX_iᵀ, as `RidgeShard` does, through
one eigendecomposition of the X_iX_iᵀ for every shift.  Departures from the per-worker
path, whose solves are exact too, so that the iterates agree to round-off (the batched
path's promise): the low-rank path's eigendecomposition where a shard factors sI + 2 scale
X_iX_iᵀ by Cholesky per shift, and ``factorization=eigh`` (and ``auto``'s switch to an
eigendecomposition after many shifts) served by Cholesky on the d x d path.
"""
from __future__ import annotations

import copy
from typing import Callable

import torch

from ..numerics.local_solvers import LocalSolver, SolverNotes, flat_slope, round_off_floor
from ..losses import ROW_VALUES, Loss
from ..work import count, count_once, counted, rows_fraction, uncounted
from .base import Problem, SharedL2
from .quadratic import QuadraticProblem, not_positive_definite, note_factorization

FACTORS_KEPT = 8  # shifts whose batched factors are kept: DANE's safeguard visits a handful of μ
ONE_PASS_FROM = 131_072  # rows of a stack from which `StackedLinearModel.one_pass` reads X once (above the caches)


def rows_of(v: torch.Tensor, m: int) -> torch.Tensor:
    """``v`` as one row per worker, shape (m, d): a shared (d,) vector broadcast (a view, no copy)."""
    return v.expand(m, -1) if v.dim() == 1 else v


def matvec(M: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """M_i v_i for stacked matrices M (m, a, b) and vectors v (m, b), or a shared v (b,) (one product over all rows).
    One per worker on the CPU in float64: `dane.problems.stacked_kernels.per_worker_matvec`, torch's bits in one pass
    (`compiled`)."""
    if v.dim() == 1:
        return M @ v
    if compiled(M, v, 2):
        from .stacked_kernels import per_worker_matvec

        out = torch.empty(M.shape[:2], dtype=M.dtype)
        per_worker_matvec(M.numpy(), v.contiguous().numpy(), out.numpy())
        return out
    return (M @ v.unsqueeze(-1)).squeeze(-1)


def rmatvec(M: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """M_iᵀ u_i for stacked matrices M (m, a, b) and vectors u (m, a), or a shared u (a,): as the row vector uᵀM_i,
    which reads M in its own layout (a product with the transposed view copies M first); one u per worker on the
    CPU in float64 by `dane.problems.stacked_kernels.per_worker_rmatvec`, torch's bits in one pass (`compiled`)."""
    if compiled(M, u, 1):
        from .stacked_kernels import per_worker_rmatvec

        out = torch.empty(M.shape[0], M.shape[2], dtype=M.dtype)
        per_worker_rmatvec(M.numpy(), u.contiguous().numpy(), out.numpy())
        return out
    return (u.unsqueeze(-2) @ M).squeeze(-2)


def compiled(M: torch.Tensor, v: torch.Tensor, axis: int) -> bool:
    """Whether the product of M (m, a, b) with one vector per worker v (m, M.shape[axis]) runs compiled: float64
    on the CPU, M contiguous, no autograd, and the kernels agreeing with torch here bit for bit
    (`dane.problems.stacked_kernels.exact_products`, checked once per shape)."""
    if not (M.dim() == 3 and v.dim() == 2 and v.shape == (M.shape[0], M.shape[axis]) and M.device.type == "cpu"
            and M.dtype == v.dtype == torch.float64 and M.is_contiguous()
            and not (M.requires_grad or v.requires_grad)):
        return False
    from .stacked_kernels import exact_products

    return exact_products(M.shape[1], M.shape[2])


def rows_at(M: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Each worker's rows ``idx[i]`` of its own stacked block: M (m, n, ...) and idx (m, B) give (m, B, ...)."""
    return M[torch.arange(M.shape[0], device=M.device)[:, None], idx]


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


def backtrack(value_grad: Callable, w: torch.Tensor, value: torch.Tensor, grad: torch.Tensor, direction: torch.Tensor,
              active: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each ``active`` worker's backtracking (Armijo) line search along its row of ``direction`` from its row of w, as
    `dane.numerics.local_solvers.newton` searches: t halved from 1 until
    φ_i(w_i + t d_i) ≤ φ_i(w_i) + 1e-4 t ⟨∇φ_i, d_i⟩, or t < 1e-10, or, where the predicted decrease is within φ_i's
    round-off (`dane.numerics.local_solvers.flat_slope`), until ‖∇φ_i‖ falls.  ``value_grad(points, rows)`` gives φ and
    ∇φ of every row, counting a pass over the ``rows`` (a mask) of the workers still searching.  (w, φ, ∇φ, t) after
    the search, an inactive worker's row as it was, its t 1."""
    slope = (grad * direction).sum(-1)
    flat = slope.abs() <= flat_slope(w.dtype) * value.abs().clamp(min=1.0)
    gnorm = torch.linalg.vector_norm(grad, dim=-1)
    t = torch.ones(w.shape[0], dtype=w.dtype, device=w.device)
    searching = active.clone()
    new_w, new_value, new_grad = w.clone(), value.clone(), grad.clone()
    while bool(searching.any()):
        candidate = w + t.unsqueeze(-1) * direction
        cand_value, cand_grad = value_grad(candidate, searching.double().numpy())
        accept = searching & ((cand_value <= value + 1e-4 * t * slope) | (t < 1e-10)
                              | (flat & (torch.linalg.vector_norm(cand_grad, dim=-1) < gnorm)))
        new_w[accept], new_value[accept] = candidate[accept], cand_value[accept]
        new_grad[accept] = cand_grad[accept]
        searching &= ~accept
        t = torch.where(searching, 0.5 * t, t)
    return new_w, new_value, new_grad, t


def participants_of(problem: Problem, idx: torch.Tensor, stacked: tuple[str, ...], caches: dict) -> Problem:
    """``problem`` (stacked) restricted to the workers ``idx``: a shallow copy whose per-worker tensors ``stacked``
    (leading axis m) hold those workers' rows, in that order, and whose ``caches`` (factors of the m workers) start
    empty; the data of the |idx| workers is copied, the rest shared."""
    view = copy.copy(problem)
    for name in stacked:
        value = getattr(problem, name)
        if value is not None:
            setattr(view, name, value.index_select(0, idx.to(value.device)))
    for name, empty in caches.items():
        setattr(view, name, empty)
    view.stacked_workers = len(idx)
    return view


class StackedRidge(Problem):
    """m equal ridge shards stacked (module docstring); the batched form of `dane.problems.ridge.RidgeShard`."""

    convex = True
    quadratic = True

    def __init__(self, X: torch.Tensor, y: torch.Tensor, lam: float, *, scale: float, w_star=None,
                 low_rank: bool = False, device: str | torch.device = "cpu", solver_notes: SolverNotes | None = None,
                 factorization: str = "cholesky"):
        self.device = torch.device(device)
        self.X, self.y = X.to(self.device).contiguous(), y.to(self.device)
        self.stacked_workers, self.n_local, self.dim = X.shape
        self.row_nonzeros = self.n_local * self.dim
        self.dtype = X.dtype
        self.lam, self.scale = float(lam), float(scale)
        self.strong_convexity = 2 * self.lam
        self.low_rank = low_rank
        self.solver = LocalSolver("cholesky")
        # the problem.* nulls the solves use, as worker 0's shard notes them (`dane.problems.ridge.RidgeShard`); the
        # asked ``factorization`` for its note alone (``low_rank`` is what it chose)
        self.solver_notes, self.factorization = solver_notes or SolverNotes(), factorization
        self.w_star = None if w_star is None else w_star.to(self.device)
        self.metric_names = ("objective", "suboptimality") if w_star is not None else ("objective",)
        self.notes = [f"sim.batched: the {self.stacked_workers} workers ran as one stacked computation, each "
                      "charged 1/m of its measured compute (dane/comm/batched.py)"]
        self.A = None if low_rank else 2 * self.scale * (self.X.mT @ self.X)  # (m, d, d)
        self.b = 2 * self.scale * rmatvec(self.X, self.y)                       # (m, d)
        self.c = self.scale * (self.y * self.y).sum(-1)                         # (m,)
        self._factors: dict[float, torch.Tensor] = {}
        self._eigen: tuple[torch.Tensor, torch.Tensor] | None = None
        self._H_w_star = None if w_star is None else self.hessian_vector(self.w_star)

    def initial_point(self) -> torch.Tensor:
        return torch.zeros(self.dim, dtype=self.dtype)

    def participants(self, idx: torch.Tensor) -> "StackedRidge":
        """The workers ``idx`` alone (`dane.problems.Problem.participants`): their rows of X, y, A, b, c."""
        return participants_of(self, idx, ("X", "y", "A", "b", "c", "_H_w_star"), {"_factors": {}, "_eigen": None})

    # ------------------------------------------------------------------ values and derivatives, per worker
    @counted("local_hvps")
    def hessian_vector(self, v: torch.Tensor, *, with_reg: bool = True, at: torch.Tensor | None = None) -> torch.Tensor:
        """H_i v (A_i v without the regularizer) for every worker: (m, d)."""
        where, v = v.device, v.to(self.device)
        Av = matvec(self.A, v) if self.A is not None else 2 * self.scale * self.gram_vector(v)
        return (Av + 2 * self.lam * v if with_reg else Av).to(where)

    def gram_vector(self, v: torch.Tensor) -> torch.Tensor:
        """X_iᵀX_i v_i for every worker (v shared, (d,), or one per worker, (m, d)): (m, d); on the CPU by
        `dane.problems.stacked_kernels`, which reads X once instead of twice."""
        if self.device.type != "cpu":
            return rmatvec(self.X, matvec(self.X, v))
        from .stacked_kernels import gram_vector

        out = torch.empty(self.stacked_workers, self.dim, dtype=self.dtype)
        gram_vector(self.X.numpy(), v.reshape(-1, self.dim).contiguous().numpy(), out.numpy())
        return out

    @counted("local_passes")
    def grad(self, w: torch.Tensor, *, with_reg: bool = True) -> torch.Tensor:
        return self.hessian_vector(w, with_reg=with_reg) - self.b.to(w.device)

    @counted("local_passes", rows_fraction)
    def batch_grad(self, w: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Each worker's unbiased estimate of ∇O_i(w) from its rows ``idx[i]`` (idx (m, B)): (m, d), row i
        `dane.problems.ridge.RidgeShard.batch_grad` of worker i."""
        where, w, idx = w.device, w.to(self.device), idx.to(self.device)
        X, y = rows_at(self.X, idx), rows_at(self.y, idx)
        scale = 2 * self.scale * self.n_local / idx.shape[-1]
        return (scale * rmatvec(X, matvec(X, w) - y) + 2 * self.lam * w).to(where)

    @counted("local_passes")
    def objective(self, w: torch.Tensor) -> torch.Tensor:
        """O_i(w) for every worker: (m,)."""
        where, w = w.device, w.to(self.device)
        Aw = self.hessian_vector(w, with_reg=False)
        return (0.5 * (w * Aw).sum(-1) - (self.b * w).sum(-1) + self.c + self.lam * (w * w).sum(-1)).to(where)

    @counted("local_passes")
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
        """(A_i + shift I)⁻¹ r_i for every worker: Cholesky of A_i + sI, or Woodbury's n x n matrices
        (``factorization=auto``'s choice noted as a shard notes it: `dane.problems.quadratic.note_factorization`)."""
        note_factorization(self.solver_notes, self.factorization, self.n_local, self.dim)
        r = rows_of(r, self.stacked_workers)
        if not self.low_rank:
            return cholesky_solve_stacked(self._factor(float(shift)), r)
        if not shift > 0:
            raise not_positive_definite(shift)
        weight = 2 * self.scale
        # counted as each worker's Woodbury path makes them (`dane.problems.ridge.RidgeShard`): the row Gram once, a
        # factor per shift; the stack's one eigendecomposition serves every shift
        count_once(("row_gram",), ("local_hessians",))
        count_once(("capacitance", float(shift)), ("local_factorizations",))
        values, Q = self._row_eigen()
        shifted = shift + weight * values
        if not bool((shifted > 0).all()):
            raise not_positive_definite(shift)
        return (r - weight * self.woodbury_products(r, Q, shifted)) / shift

    def woodbury_products(self, r: torch.Tensor, Q: torch.Tensor, shifted: torch.Tensor) -> torch.Tensor:
        """X_iᵀ(sI + weight X_iX_iᵀ)⁻¹X_i r_i for every worker, Q_i diag(shifted_i) Q_iᵀ that n x n matrix: (m, d);
        on the CPU by `dane.problems.stacked_kernels`, which reads X once instead of twice."""
        if self.device.type != "cpu":
            return rmatvec(self.X, matvec(Q, rmatvec(Q, matvec(self.X, r)) / shifted))
        from .stacked_kernels import woodbury_products

        out = torch.empty(self.stacked_workers, self.dim, dtype=self.dtype)
        rows = r[:1] if r.stride(0) == 0 else r.contiguous()  # a shared r, broadcast by `rows_of`: one row
        woodbury_products(self.X.numpy(), Q.numpy(), shifted.contiguous().numpy(), rows.numpy(), out.numpy())
        return out

    def _row_eigen(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(ℓ, Q) of the row Gram matrices X_iX_iᵀ = Q diag(ℓ) Qᵀ, (m, n) and (m, n, n), once for every shift:
        DANE's safeguard moves μ most rounds, and a new shift then costs two products, no factorization."""
        if self._eigen is None:
            values, Q = torch.linalg.eigh(self.X @ self.X.mT)
            self._eigen = values, Q.contiguous()
        return self._eigen

    def _factor(self, shift: float) -> torch.Tensor:
        if shift not in self._factors:
            if len(self._factors) >= FACTORS_KEPT:
                self._factors.pop(next(iter(self._factors)))
            self._factors[shift] = stacked_cholesky(self.A.clone(), shift)
        # once in the rounds, wherever made: the Gram A_i (formed with the stack) and its factor, as each worker's shard
        count_once(("gram",), ("local_hessians",))
        count_once(("cholesky", float(shift)), ("local_factorizations",))
        return self._factors[shift]

    def solve_hessian(self, r: torch.Tensor, *, at: torch.Tensor | None = None, shift: float, with_reg: bool,
                      solver: LocalSolver | None = None, rtol: float | None = None) -> torch.Tensor:
        """(A_i [+ 2λI] + shift I)⁻¹ r_i for every worker, exactly (a solve handed no ``solver`` is by the
        problem's: ``auto``'s choice noted, as `dane.problems.quadratic.QuadraticProblem.solve_hessian` notes it)."""
        if solver is None:
            self.solver_notes.own(self.solver, self.dim, False)
        where, r = r.device, r.to(self.device)
        return self.shifted_solve(r, shift + (2 * self.lam if with_reg else 0.0)).to(where)

    #: `dane.problems.quadratic.QuadraticProblem`'s, for every worker at once: the step solved for by `solve_hessian`,
    #: and the prox of λ‖z‖²
    prox_solve = QuadraticProblem.prox_solve
    prox_regularizer = QuadraticProblem.prox_regularizer

    def state_dict(self) -> dict:
        """The ``problem.*`` nulls the solves used so far (none: no state), as a shard keeps them."""
        return self.solver_notes.kept({})

    def load_state_dict(self, state: dict) -> None:
        self.solver_notes.restore(state)



class StackedLinearModel(SharedL2, Problem):
    r"""m equal shards of a linear model with one output stacked: the batched form of
    `dane.problems.glm.LinearModelShard` (``problem=ridge`` and ``logreg``),

    .. math:: O_i(w) = \frac{m}{N}\sum_{j\in S_i} f(x_j^\top w, y_j) + \frac{\lambda}{2}\|w\|^2,

    X of shape (m, n, d), dense.  The exact local solve is `dane.numerics.local_solvers.newton` for all
    m workers at once: each Newton direction from one batched Cholesky of the (m, d, d)
    Hessians plus shift, then each worker's own Armijo backtracking (`backtrack`), and each worker stops
    where the per-worker solve stops (its relative gradient norm, or the step cap); a worker
    that has stopped keeps its point while the others go on.  A quadratic f (the squared
    loss) takes one step, the minimizer, and factors its constant Hessians once per shift.
    """

    convex = True

    def __init__(self, X: torch.Tensor, y: torch.Tensor, loss: Loss, *, l2: float, weight: float,
                 solver: LocalSolver, notes=(), device: str | torch.device = "cpu",
                 solver_notes: SolverNotes | None = None):
        self.device = torch.device(device)
        self.X, self.y, self.loss = X.to(self.device), y.to(self.device), loss
        self.row_value = ROW_VALUES[loss.name]
        self.stacked_workers, self.n_local, self.dim = X.shape
        self.row_nonzeros = self.n_local * self.dim
        self.dtype = X.dtype
        self.l2, self.weight = float(l2), float(weight)
        self.quadratic = loss.quadratic
        self.strong_convexity = self.l2
        self.solver = solver
        self.solver_notes = solver_notes or SolverNotes()  # the problem.* nulls the solves use, as worker 0's shard's
        self.metric_names = ("objective",)
        self.notes = [*notes, f"sim.batched: the {self.stacked_workers} workers ran as one stacked computation, "
                              "each charged 1/m of its measured compute (dane/comm/batched.py)"]
        self._factors: dict[float, torch.Tensor] = {}  # quadratic: per shift
        self._gram: torch.Tensor | None = None
        self._one_pass: dict[int, bool] = {}  # torch's threads -> whether `one_pass` reproduced `three_passes` here
        self.solving = 1.0  # the workers a factor made now counts for (`dane.work`): all, or prox_solve's active
        self._last_objective: tuple[torch.Tensor, torch.Tensor] | None = None  # (point, O_i(point)) of `evaluate`

    def initial_point(self) -> torch.Tensor:
        return torch.zeros(self.dim, dtype=self.dtype)

    def _count_quadratic(self, shift: float) -> None:
        """`dane.problems.glm.LinearModelShard`'s count of a quadratic's Hessian and factor, for the solving workers."""
        count_once(("hessian",), ("local_hessians",), self.solving)
        count_once(("cholesky", float(shift)), ("local_factorizations",), self.solving)

    def participants(self, idx: torch.Tensor) -> "StackedLinearModel":
        """The workers ``idx`` alone (`dane.problems.Problem.participants`): their rows of X and y."""
        return participants_of(self, idx, ("X", "y"),
                               {"_factors": {}, "_gram": None, "_one_pass": {}, "_last_objective": None})

    # ------------------------------------------------------------------ values and derivatives, per worker
    @counted("local_passes")
    def data_value_grad(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(D_i(w), ∇D_i(w)) for every worker: (m,) and (m, d); at a shared w on a large CPU stack in one pass over X
        (`one_pass`), the same bits."""
        values, grads = self.one_pass(w) or self.three_passes(w)
        # the (m, d) gradients scaled in place: the same products, no second (m, d) array (40 MB at 100,000 clients,
        # which glibc maps and unmaps each time)
        return self.weight * values, grads.mul_(self.weight)

    def three_passes(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(Σ_{j∈i} f(x_jᵀw, y_j), X_iᵀf'(X_i w)) for every worker by z = Xw, then f and f' of all rows, then the
        products X_iᵀf'_i."""
        z = matvec(self.X, w)
        return self.row_value(z, self.y), rmatvec(self.X, self.loss.dz(z, self.y))

    def one_pass(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """`dane.problems.row_losses.one_pass` at a shared w on a CPU stack of at least `ONE_PASS_FROM` rows (fewer
        stay in cache between the passes), once its bits are seen equal to `three_passes`' on these rows at a seeded
        point (per thread count: the whole-array calls split by threads); else None."""
        if w.dim() != 1 or self.device.type != "cpu" or self.dtype != torch.float64 or \
                self.stacked_workers * self.n_local < ONE_PASS_FROM or w.requires_grad:
            return None
        from .row_losses import one_pass

        threads = torch.get_num_threads()
        if threads not in self._one_pass:
            probe = torch.randn(self.dim, generator=torch.Generator().manual_seed(0), dtype=self.dtype)
            fused = one_pass(self.loss, self.X, self.y, probe)
            self._one_pass[threads] = fused is not None and all(
                torch.equal(a, b) for a, b in zip(fused, self.three_passes(probe)))
        return one_pass(self.loss, self.X, self.y, w) if self._one_pass[threads] else None

    @counted("local_passes")
    def evaluate(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(∇O_i(w), [O_i(w)]) for every worker: (m, d) and (m, 1)."""
        where, w = w.device, w.to(self.device)
        value, grad = self.data_value_grad(w)
        objective = value + 0.5 * self.l2 * (w * w).sum(-1)
        self._last_objective = (w.detach().clone(), objective)  # `prox_solve` at this anchor reads it
        return grad.add_(self.l2 * w).to(where), torch.stack([objective], -1).to(where)

    def objective(self, w: torch.Tensor) -> torch.Tensor:
        return self.evaluate(w)[1][:, 0]

    @counted("local_passes")
    def validation_objective(self, w: torch.Tensor) -> torch.Tensor:
        """Local SGD's election score for every worker (`dane.problems.Problem.validation_objective`): its mean loss
        per row plus (λ/2)‖w_i‖², (1/n) Σ_{j∈i} f(x_jᵀw_i, y_j) + (λ/2)‖w_i‖², (m,), by `three_passes`' forward pass
        alone.  The shards are equal (m n = N), so 1/n is the row weight m/N, the same number, and this is
        `evaluate`'s O_i bit for bit."""
        where, w = w.device, w.to(self.device)
        values = (1.0 / self.n_local) * self.row_value(matvec(self.X, w), self.y)
        return (values + 0.5 * self.l2 * (w * w).sum(-1)).to(where)

    @counted("local_passes", rows_fraction)
    def batch_grad(self, w: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Each worker's unbiased estimate of ∇O_i(w) from its rows ``idx[i]`` (idx (m, B)): (m, d), row i
        `dane.problems.glm.LinearModelShard.batch_grad` of worker i."""
        where, w, idx = w.device, w.to(self.device), idx.to(self.device)
        X, y = rows_at(self.X, idx), rows_at(self.y, idx)
        data = self.weight * rmatvec(X, self.loss.dz(matvec(X, w), y))
        return ((self.n_local / idx.shape[-1]) * data + self.l2 * w).to(where)

    @counted("local_hvps")
    def hessian_vector(self, v: torch.Tensor, *, at: torch.Tensor | None = None, with_reg: bool = True) -> torch.Tensor:
        """∇²O_i(at) v for every worker; without ``at``, the majorant (m/N) c_f X_iᵀX_i v + λv (as per worker)."""
        where, v = v.device, v.to(self.device)
        xv = matvec(self.X, v)
        if at is None:
            curv = self.loss.curvature * xv
        else:
            curv = self.loss.hess(matvec(self.X, at.to(self.device)), self.y, xv)
        Hv = self.weight * rmatvec(self.X, curv)
        return (Hv + self.l2 * v if with_reg else Hv).to(where)

    def _factor(self, at: torch.Tensor, shift: float) -> torch.Tensor:
        """Lower factors of ∇²D_i(at) + shift I for every worker (a quadratic's kept per shift)."""
        if self.quadratic and shift in self._factors:  # one made before the rounds counts at its first use in them
            self._count_quadratic(shift)
            return self._factors[shift]
        if self.quadratic:
            if self._gram is None:
                ones = torch.ones_like(self.y)
                self._gram = self.weight * ((self.X.mT * self.loss.hess(ones, self.y, ones).unsqueeze(-2)) @ self.X)
            H = self._gram.clone()
        else:
            d2 = self.loss.hess(matvec(self.X, at), self.y, torch.ones_like(self.y))
            H = self.weight * ((self.X.mT * d2.unsqueeze(-2)) @ self.X)
        L = stacked_cholesky(H, shift)
        if self.quadratic:  # as the per-worker shard counts them: the Gram once, a factor per shift
            self._count_quadratic(shift)
        else:
            count("local_hessians", self.solving)
            count("local_factorizations", self.solving)
        if self.quadratic:
            if len(self._factors) >= FACTORS_KEPT:
                self._factors.pop(next(iter(self._factors)))
            self._factors[shift] = L
        return L

    def solve_hessian(self, r: torch.Tensor, *, at: torch.Tensor | None = None, shift: float, with_reg: bool,
                      solver: LocalSolver | None = None, rtol: float | None = None) -> torch.Tensor:
        """(∇²D_i(at) [+ λI] + shift I)⁻¹ r_i for every worker, by batched Cholesky (handed no ``solver``: the
        problem's, ``auto``'s choice noted as `dane.problems.glm.LinearModelShard.solve_hessian` notes it)."""
        if solver is None:
            self.solver_notes.own(self.solver, self.dim, False)
        where, r = r.device, r.to(self.device)
        at = torch.zeros(self.dim, dtype=self.dtype, device=self.device) if at is None else at.to(self.device)
        L = self._factor(at, float(shift + (self.l2 if with_reg else 0.0)))
        return cholesky_solve_stacked(L, rows_of(r, self.stacked_workers)).to(where)

    # ------------------------------------------------------------------ the exact local solve, batched
    def prox_solve(self, anchor: torch.Tensor, linear: torch.Tensor, mu: float, *, with_reg: bool = True,
                   anchor_grad: torch.Tensor | None = None, solver: LocalSolver | None = None) -> torch.Tensor:
        """≈ argmin_w O_i(w) − <linear_i, w> + (μ/2)‖w − anchor‖² for every worker: `dane.numerics.local_solvers.newton`,
        row by row (class docstring)."""
        if solver is None:  # the problem's, as `dane.problems.glm.LinearModelShard.prox_solve` notes it
            self.solver_notes.own(self.solver, self.dim, False)
        where = anchor.device
        anchor, linear = anchor.to(self.device), linear.to(self.device)
        l2 = self.l2 if with_reg else 0.0
        m = self.stacked_workers

        def value_grad(w: torch.Tensor, rows=1.0) -> tuple[torch.Tensor, torch.Tensor]:  # `Subproblem.value_grad`
            count("local_passes", rows)  # the rows the per-worker solve evaluates here (``rows``: a mask)
            with uncounted():
                value, grad = self.data_value_grad(w)
            diff = w - anchor
            value = value + 0.5 * l2 * (w * w).sum(-1) - (linear * w).sum(-1) + 0.5 * mu * (diff * diff).sum(-1)
            return value, grad + l2 * w - linear + mu * diff

        w = rows_of(anchor, m).clone()
        if anchor_grad is not None and with_reg:  # φ(a) from `evaluate`'s O_i(a) where it last ran at the anchor
            grad, value, last = rows_of(anchor_grad.to(self.device), m) - linear, None, self._last_objective
            if last is not None and torch.equal(last[0], anchor):  # another shape is another point
                value = last[1] - (linear * w).sum(-1)
        else:
            value, grad = value_grad(w)
        grad0 = torch.linalg.vector_norm(grad, dim=-1)
        active = grad0 != 0.0
        floor = round_off_floor(grad, linear)  # per worker, as `newton`'s
        shift = mu + l2
        tol = (solver or self.solver).tol
        for step in range(self.solver.newton_steps):
            gnorm = torch.linalg.vector_norm(grad, dim=-1)
            rel = gnorm / torch.where(active, grad0, torch.ones_like(grad0))
            if step > 0:
                active &= ~((rel <= tol) | (gnorm <= floor))
            if not bool(active.any()):
                break
            self.solving = active.double().numpy()  # a factor made now is made by the active workers only
            try:
                direction = self.solve_hessian(-grad, at=w, shift=shift, with_reg=False, solver=self.solver)
            finally:
                self.solving = 1.0
            if self.quadratic:  # φ is quadratic: the Newton step is the minimizer
                return torch.where(active.unsqueeze(-1), w + direction, w).to(where)
            if value is None:
                value, _ = value_grad(w, active.double().numpy())
            w, value, grad, t = backtrack(value_grad, w, value, grad, direction, active)
            if w.dtype != torch.float64:
                active &= ~(t < 1e-10)  # float32: at the dtype's round-off (the per-worker solve stops there)
        return w.to(where)

    def state_dict(self) -> dict:
        """The ``problem.*`` nulls the solves used so far (none: no state), as a shard keeps them."""
        return self.solver_notes.kept({})

    def load_state_dict(self, state: dict) -> None:
        self.solver_notes.restore(state)
