r"""Local solvers for convex problems: the subproblem every DANE-type method solves on worker i.

.. math:: \phi(w) = D_i(w) + \frac{\lambda}{2}\|w\|^2 - \langle \ell, w\rangle + \frac{\mu}{2}\|w - a\|^2

where :math:`D_i` is the worker's data term and λ its ℓ2 weight (0 when ADMM asks for the
subproblem without the shared regularizer).  The methods (``problem.local_solver``):

- ``cholesky``: Newton's method with the dense Hessian factored by Cholesky.  On a
  quadratic (squared loss) one step is the exact minimizer and the factor of
  :math:`H_i + \mu I` is cached per μ: the reference path.
- ``cg``: Newton-CG, every Newton system solved by conjugate gradient on Hessian-vector
  products (`dane.linalg.cg`), warm-started at the anchor, to relative residual ``tol``
  (or a fixed ``max_iter`` products with ``tol=0``); no d x d matrix is formed, so sparse
  X stays sparse.  On a quadratic: one CG solve.
- ``svrg``: the local solver of InexactDANE (Reddi et al. 2016): ``passes`` epochs of
  SVRG on the worker's rows, started at the anchor, each epoch a full-gradient
  snapshot followed by n_i / batch_size variance-reduced steps.  The ℓ2, linear and
  proximal terms are deterministic and enter exactly; only the data term is sampled.
  The step is 1 / L_max of the per-row components unless ``lr`` is given.
- ``lbfgs``: scipy's L-BFGS-B on φ, to ``tol`` times the anchor's gradient (max norm).
- ``auto``: ``cholesky`` when the dimension is at most `AUTO_MAX_DIM` and X is dense,
  else ``cg``; the problem says which in its notes.

Newton steps on a non-quadratic φ take a backtracking (Armijo) line search and stop once
:math:`\|\nabla\phi(w)\| \le \text{tol}\,\|\nabla\phi(a)\|` or after ``newton_steps``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np
import scipy.optimize
import torch

from . import checks
from .errors import ConfigError

LOCAL_SOLVERS = ("auto", "cholesky", "cg", "svrg", "lbfgs")
AUTO_MAX_DIM = 2000  # a dense d x d Cholesky costs d^3/3 flops: ~3 Gflop at 2000, once per mu


@dataclass(frozen=True)
class LocalSolver:
    """How a worker solves its convex subproblem (see the module docstring)."""

    method: str = "auto"
    tol: float = 1e-10
    max_iter: int | None = None     # cg: products per linear solve (None: d); lbfgs: iterations (None: 1000)
    newton_steps: int = 50          # Newton iterations at most (non-quadratic losses)
    passes: int = 3                 # svrg: epochs per solve
    batch_size: int = 1             # svrg: rows per step
    lr: float | None = None         # svrg: step (None: 1 / L_max)

    def __post_init__(self) -> None:
        checks.one_of("problem.local_solver", self.method, LOCAL_SOLVERS)
        checks.nonnegative("problem.local_tol", self.tol)
        if self.max_iter is not None:
            checks.positive_int("problem.local_max_iter", self.max_iter)
        checks.positive_int("problem.newton_steps", self.newton_steps)
        checks.positive_int("problem.svrg_passes", self.passes)
        checks.positive_int("problem.svrg_batch_size", self.batch_size)
        if self.lr is not None:
            checks.positive("problem.svrg_lr", self.lr)
        if self.method == "cg" and self.tol == 0 and self.max_iter is None:
            raise ConfigError("problem.local_solver=cg with local_tol=0 needs problem.local_max_iter (a fixed count)")

    def resolve(self, dim: int, sparse: bool) -> "LocalSolver":
        """``auto`` made concrete for this problem."""
        if self.method != "auto":
            return self
        return replace(self, method="cholesky" if dim <= AUTO_MAX_DIM and not sparse else "cg")


class Shard(Protocol):
    """What the solvers need from a worker's convex shard."""

    dim: int
    l2: float
    quadratic: bool
    n_local: int

    def data_value_grad(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...
    def solve_hessian(self, r: torch.Tensor, *, at: torch.Tensor, shift: float, with_reg: bool,
                      solver: LocalSolver, rtol: float) -> torch.Tensor: ...
    def rows_grad_diff(self, w: torch.Tensor, snapshot: torch.Tensor, idx: torch.Tensor) -> torch.Tensor: ...
    def row_smoothness(self) -> float: ...


@dataclass(frozen=True)
class Subproblem:
    """φ(w) = D_i(w) + (l2/2)||w||² − <linear, w> + (μ/2)||w − anchor||² on ``shard``."""

    shard: Shard
    anchor: torch.Tensor
    linear: torch.Tensor
    mu: float
    l2: float

    def value_grad(self, w: torch.Tensor) -> tuple[float, torch.Tensor]:
        value, grad = self.shard.data_value_grad(w)
        diff = w - self.anchor
        value = float(value) + 0.5 * self.l2 * float(w @ w) - float(self.linear @ w) + 0.5 * self.mu * float(diff @ diff)
        return value, grad + self.l2 * w - self.linear + self.mu * diff


def prox_solve(shard: Shard, anchor: torch.Tensor, linear: torch.Tensor, mu: float, *, with_reg: bool,
               solver: LocalSolver, generator: torch.Generator | None = None,
               anchor_grad: torch.Tensor | None = None) -> torch.Tensor:
    """≈ argmin_w φ(w) by ``solver`` (already resolved), started at the anchor."""
    sub = Subproblem(shard, anchor, linear, float(mu), shard.l2 if with_reg else 0.0)
    if solver.method in ("cholesky", "cg"):
        return newton(sub, solver, anchor_grad=anchor_grad if with_reg else None)
    if solver.method == "svrg":
        return svrg(sub, solver, generator)
    return lbfgs(sub, solver)


def newton(sub: Subproblem, solver: LocalSolver, *, anchor_grad: torch.Tensor | None = None) -> torch.Tensor:
    """Newton's method on φ, directions by `Shard.solve_hessian` (Cholesky or CG)."""
    w = sub.anchor
    if anchor_grad is not None:  # ∇O_i(a) given by the caller (DANE has it): ∇φ(a) = ∇O_i(a) − linear
        grad, value = anchor_grad - sub.linear, None
    else:
        value, grad = sub.value_grad(w)
    grad0 = float(torch.linalg.vector_norm(grad))
    if grad0 == 0.0:
        return w.clone()
    shift = sub.mu + sub.l2
    for step in range(solver.newton_steps):
        rel = float(torch.linalg.vector_norm(grad)) / grad0
        if step > 0 and rel <= solver.tol:
            break
        # forcing term of an inexact Newton method: loose far from the solution, tight close to it
        rtol = solver.tol if sub.shard.quadratic else min(0.5, rel ** 0.5)
        direction = sub.shard.solve_hessian(-grad, at=w, shift=shift, with_reg=False, solver=solver, rtol=rtol)
        if sub.shard.quadratic:
            return w + direction  # φ is quadratic: the Newton step is the minimizer (to the solve's accuracy)
        if value is None:
            value, _ = sub.value_grad(w)
        slope = float(grad @ direction)
        # Near the solution the predicted decrease falls below the round-off of φ's value and Armijo
        # cannot tell a good step from a bad one: there a step that lowers the gradient norm is taken
        # (else the search halved t to 1e-10 and Newton stalled at ||∇φ|| ~ 1e-9)
        flat = abs(slope) <= 1e-12 * max(1.0, abs(float(value)))
        gnorm = float(torch.linalg.vector_norm(grad))
        t = 1.0
        while True:
            candidate = w + t * direction
            cand_value, cand_grad = sub.value_grad(candidate)
            if (cand_value <= value + 1e-4 * t * slope or t < 1e-10
                    or (flat and float(torch.linalg.vector_norm(cand_grad)) < gnorm)):
                break
            t *= 0.5
        w, value, grad = candidate, cand_value, cand_grad
    return w


def svrg(sub: Subproblem, solver: LocalSolver, generator: torch.Generator | None) -> torch.Tensor:
    r"""SVRG on φ = Σ_j weight f_j + R: ``passes`` epochs of n_i / b steps of

    .. math:: w \leftarrow w - \gamma\Big(\tfrac{n_i}{b}\sum_{j\in B}(\nabla f_j(w) - \nabla f_j(\tilde w))
              + \nabla D_i(\tilde w) + \nabla R(w)\Big)

    with the snapshot :math:`\tilde w` refreshed every epoch (option I, the last iterate).
    """
    shard = sub.shard
    n, b = shard.n_local, min(solver.batch_size, shard.n_local)
    shrink = sub.l2 + sub.mu  # the deterministic part's curvature: ∇R(w) = shrink·w − linear − μ·anchor
    lr = solver.lr if solver.lr is not None else 1.0 / (n * shard.row_smoothness() + shrink)
    w = sub.anchor.clone()
    scale = n / b
    for _ in range(solver.passes):
        snapshot = w.clone()
        _, full = shard.data_value_grad(snapshot)
        constant = full - sub.linear - sub.mu * sub.anchor  # ∇D_i(w̃) + ∇R(w) − shrink·w, fixed for the epoch
        order = torch.randperm(n, generator=generator)
        for start in range(0, n - b + 1, b):
            correction = shard.rows_grad_diff(w, snapshot, order[start:start + b])
            w = (1 - lr * shrink) * w - lr * (scale * correction + constant)
    return w


def lbfgs(sub: Subproblem, solver: LocalSolver) -> torch.Tensor:
    """scipy L-BFGS-B on φ, from the anchor, to tol x the anchor's gradient (max norm)."""
    dtype = sub.anchor.dtype

    def fun(x: np.ndarray):
        value, grad = sub.value_grad(torch.from_numpy(x).to(dtype))
        return value, grad.double().numpy()

    _, grad0 = fun(sub.anchor.double().numpy())
    gtol = solver.tol * float(np.abs(grad0).max())
    result = scipy.optimize.minimize(fun, sub.anchor.double().numpy(), jac=True, method="L-BFGS-B",
                                     options={"maxiter": solver.max_iter or 1000, "gtol": gtol, "ftol": 0.0,
                                              "maxcor": 20})
    return torch.from_numpy(result.x).to(dtype)
