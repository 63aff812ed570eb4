r"""``problem=ridge | logreg | softmax``: a linear model on any data source, and its reference optimum.

The data comes from a source in ``conf/data/`` (CSV, LIBSVM, NPZ, or a built-in set,
`dane.data.files`).  Rows are dealt to workers by a seeded permutation, identical on
every backend; a presharded source (``data.path`` with ``{rank}``) gives each process
only its own file, so no process holds more than its shard.

The reference optimum is computed once per process on the full data, before any round:
the closed form for the squared loss (a dense solve, or CG to 1e-14 when X is sparse or
d is large), and for logistic and softmax scipy's L-BFGS followed by Newton-CG steps
until the gradient norm stops falling (its final value is in the run's notes).  With a
presharded source no process sees all rows, so no optimum is computed and ``tol``
applies to the gradient norm.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.optimize
import torch

from .. import checks
from ..errors import ConfigError
from ..inner import worker_seed
from ..local_solvers import LocalSolver
from ..losses import LOSSES
from .glm import SOLVER_STREAM, LinearModelShard, SolverOptions, add_intercept, to_torch

PROBLEM_LOSSES = {"ridge": "squared", "logreg": "logistic", "softmax": "softmax"}
_TABLES: dict[str, Any] = {}
_OPTIMA: dict[tuple, tuple[torch.Tensor, float, float]] = {}


@dataclass(frozen=True)
class LinearModelConfig(SolverOptions):
    """A linear model (``loss``: squared | logistic | softmax) with (λ/2)||w||² on ``data``."""

    data: Any = None
    loss: str = "squared"
    lam: float = 1e-3
    fit_intercept: bool = False
    classes: int | None = None   # softmax with presharded data: the number of classes (a part may lack some)
    optimum: bool = True         # compute the reference optimum once (records then carry suboptimality)
    seed: int = 0
    name: str = "ridge"

    def __post_init__(self) -> None:
        checks.one_of("problem.loss", self.loss, tuple(LOSSES))
        checks.nonnegative("problem.lam", self.lam)
        checks.boolean("problem.fit_intercept", self.fit_intercept)
        checks.boolean("problem.optimum", self.optimum)
        if self.classes is not None:
            checks.positive_int("problem.classes", self.classes)
        if self.data is None:
            raise ConfigError(f"problem={self.name} needs data: data=csv data.path=... data.target=..., "
                              "data=libsvm data.path=..., data=npz data.path=..., or data=builtin data.dataset=...")
        self.solver  # validates the local-solver keys now
        if self.loss != "squared" and self.lam == 0:
            raise ConfigError(f"problem.lam must be > 0 for problem={self.name} (the {self.loss} loss alone may "
                              "have no minimizer, e.g. on separable data), got 0")

    @property
    def source(self):
        from .neural import DataConfig

        if isinstance(self.data, DataConfig):  # a built-in set named by the neural problems' data group
            from ..data.files import BuiltinSource

            return BuiltinSource(dataset=self.data.dataset, data_dir=self.data.data_dir)
        return self.data

    # ------------------------------------------------------------------ full data, labels, optimum
    def table(self):
        """The whole data set, labels checked for the loss (cached per process)."""
        from ..data.labels import check_labels

        key = repr(self.source)
        if key not in _TABLES:
            table = self.source.load()
            table.y = check_labels(table.y, self.loss, table.name)
            if self.fit_intercept:
                table.X = add_intercept(table.X)
            _TABLES.clear()  # one data set at a time: a sweep over problems must not pile them up
            _TABLES[key] = table
        return _TABLES[key]

    def num_classes(self, y: np.ndarray) -> int:
        if self.loss != "softmax":
            return 1
        return self.classes if self.classes is not None else int(y.max()) + 1

    def prepare(self) -> None:
        """Load the data and compute the reference optimum (cached), so that `build` does only a worker's own work."""
        if not self.source.presharded:
            self.table()
            if self.optimum:
                self.reference_optimum()

    def reference_optimum(self) -> tuple[torch.Tensor, float, float]:
        """(w*, O(w*), ||∇O(w*)||) on the full data, float64."""
        key = (repr(self.source), self.loss, self.lam, self.fit_intercept)
        if key not in _OPTIMA:
            table = self.table()
            full = self._shard(table.X, table.y, size=1, n_total=len(table.y), rank=0, dtype=torch.float64)
            w = solve_optimum(full)
            grad, metrics = full.evaluate(w)
            _OPTIMA[key] = (w, float(metrics[0]), float(torch.linalg.vector_norm(grad)))
        return _OPTIMA[key]

    def release(self) -> None:
        """Drop the cached full table: a process that runs one worker keeps only that worker's rows."""
        _TABLES.clear()

    def check_workers(self, workers: int) -> None:
        if self.source.presharded:
            return  # each part is checked by the process that reads it
        n = len(self.table().y)
        if workers > n:
            raise ConfigError(f"workers={workers} exceeds the {n} rows of {self.table().name}; use fewer workers")

    # ------------------------------------------------------------------ one worker
    def build(self, rank: int, size: int, dtype: torch.dtype = torch.float64) -> LinearModelShard:
        from ..data.labels import check_labels
        from .ridge import shard

        notes = []
        if self.source.presharded:
            if self.loss == "softmax" and self.classes is None:
                raise ConfigError("problem=softmax on presharded data needs problem.classes (a part may lack a class)")
            part, n_total = self.source.load_part(rank, size)
            # every part codes the labels against the same class list, even one that lacks a class
            classes = np.arange(self.classes) if self.loss == "softmax" else None
            X, y = part.X, check_labels(part.y, self.loss, part.name, classes=classes)
            if self.fit_intercept:
                X = add_intercept(X)
            notes += part.notes
        else:
            table = self.table()
            n_total = len(table.y)
            idx = shard(n_total, size, self.seed)[rank].numpy()
            X, y = table.X[idx], table.y[idx]
            notes += table.notes
        problem = self._shard(X, y, size=size, n_total=n_total, rank=rank, dtype=dtype, notes=notes)
        if self.optimum and not self.source.presharded:
            w_star, f_star, grad_norm = self.reference_optimum()
            problem.w_star, problem.f_star = w_star.to(dtype), f_star
            problem.metric_names = ("objective", "suboptimality")
            problem.notes.append(f"reference optimum: O* = {f_star:.17g}, ||grad O(w*)|| = {grad_norm:.2e}")
        return problem

    def _shard(self, X, y, *, size: int, n_total: int, rank: int, dtype: torch.dtype, notes=()) -> LinearModelShard:
        classes = self.num_classes(y)
        y_t = torch.as_tensor(y, dtype=torch.int64 if self.loss == "softmax" else dtype)
        if self.loss == "softmax" and len(y) and int(y.max()) >= classes:
            raise ConfigError(f"problem.classes={classes} but the labels go up to {int(y.max())}; raise problem.classes")
        problem = LinearModelShard(to_torch(X, dtype), y_t, LOSSES[self.loss], l2=self.lam, weight=size / n_total,
                                   classes=classes, solver=self.solver,
                                   seed=worker_seed(self.seed, rank, SOLVER_STREAM), notes=notes)
        problem.notes.append(f"local solver: {self.local_solver} -> {problem.solver.method} (d={problem.dim}, "
                             f"{'sparse' if problem.sparse else 'dense'} X, {len(y)} rows on this worker)")
        return problem


def solve_optimum(full: LinearModelShard) -> torch.Tensor:
    """argmin O on the full data (``full`` is the one-worker shard holding every row)."""
    exact = LocalSolver("cholesky" if full.dim <= 5000 and not full.sparse else "cg", tol=1e-14,
                        max_iter=20 * full.dim, newton_steps=100)
    w0 = full.initial_point()
    if full.quadratic:  # one Newton step from 0 is the minimizer
        return w0 + full.solve_hessian(-full.grad(w0), at=w0, shift=0.0, with_reg=True, solver=exact, rtol=1e-14)

    def fun(x: np.ndarray):
        grad, metrics = full.evaluate(torch.from_numpy(x))
        return float(metrics[0]), grad.numpy()

    result = scipy.optimize.minimize(fun, w0.numpy(), jac=True, method="L-BFGS-B",
                                     options={"maxiter": 20000, "gtol": 1e-12, "ftol": 0.0, "maxcor": 30})
    w = torch.from_numpy(result.x)
    best = float(torch.linalg.vector_norm(full.evaluate(w)[0]))
    for _ in range(20):  # Newton-CG polish: quadratic convergence from where L-BFGS stopped
        grad = full.evaluate(w)[0]
        step = full.solve_hessian(-grad, at=w, shift=0.0, with_reg=True, solver=exact, rtol=1e-14)
        candidate = w + step
        norm = float(torch.linalg.vector_norm(full.evaluate(candidate)[0]))
        if not norm < best:
            break
        w, best = candidate, norm
    return w
