r"""Local solvers for convex problems: the subproblem every DANE-type method solves on worker i.

.. math:: \phi(w) = D_i(w) + \frac{\lambda}{2}\|w\|^2 - \langle \ell, w\rangle + \frac{\mu}{2}\|w - a\|^2

where :math:`D_i` is the worker's data term and λ its ℓ2 weight (0 when ADMM asks for the
subproblem without the shared regularizer).  The methods (``problem.local_solver``):

- ``cholesky``: Newton's method with the dense Hessian factored by Cholesky.  On a
  quadratic (squared loss) one step is the exact minimizer and the factor of
  :math:`H_i + \mu I` is cached per μ: the reference path.
- ``cg``: Newton-CG, every Newton system solved by conjugate gradient on Hessian-vector
  products (`dane.numerics.linalg.cg`), warm-started at the anchor, to relative residual ``tol``
  (or a fixed ``max_iter`` products with ``tol=0``); no d x d matrix is formed, so sparse
  X stays sparse.  On a quadratic: one CG solve.
- ``svrg``: the local solver of InexactDANE (Reddi et al. 2016): ``passes`` epochs of
  SVRG on the worker's rows, started at the anchor, compiled where the shard gives its rows
  (`dane.numerics.svrg`: the solver, its options and the nulls it resolves).
- ``lbfgs``: scipy's L-BFGS-B on φ, to ``tol`` times the anchor's gradient (max norm), or until φ's value
  stops decreasing in floating point, whichever comes first (see `lbfgs`).
- ``auto``: ``cholesky`` when the dimension is at most `AUTO_MAX_DIM` and X is dense,
  else ``cg``; the problem says which in its notes.

Newton steps on a non-quadratic φ take a backtracking (Armijo) line search and stop once
:math:`\|\nabla\phi(w)\| \le \text{tol}\,\|\nabla\phi(a)\|`, or once ∇φ(w) is round-off (`round_off_floor`), or
after ``newton_steps``.

Every solver runs on the device of the anchor it is given (the shard's, `dane.problems.glm`);
``lbfgs`` keeps scipy's own vectors on the host and evaluates φ on the device.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Protocol

import numpy as np
import torch

from .. import checks
from ..comm.meters import start_up
from ..errors import ConfigError
from .inner import refuse_oversized
from .linalg import CG_PRODUCTS_PER_DIM
from .svrg import (AUTO_PASSES_CONTRACTION, PASSES_AUTO, SVRG_NULLS, SVRG_VARIANTS, check_passes, note_svrg, row_shard,
                   svrg, svrg_constants, svrg_nulls)
from ..work import count, counting

LOCAL_SOLVERS = ("auto", "cholesky", "cg", "svrg", "lbfgs")
"""The values ``problem.local_solver`` takes (`LocalSolver`'s ``method``), each described in the module docstring."""
#: L-BFGS-B's iterations per solve where ``max_iter`` is null
LBFGS_MAX_ITER = 1000
AUTO_MAX_DIM = 2000  # a dense d x d Cholesky costs d^3/3 flops: ~3 Gflop at 2000, once per mu


@dataclass(frozen=True)
class LocalSolver:
    """How a worker solves its convex subproblem (see the module docstring)."""

    method: str = "auto"
    tol: float = 1e-10
    max_iter: int | None = None     # cg: products per linear solve (None: `cg_products`); lbfgs: iterations
                                    # (None: `LBFGS_MAX_ITER`)
    newton_steps: int = 50          # Newton iterations at most (non-quadratic losses)
    passes: int | str = 3           # svrg: epochs per solve, or "auto" (`dane.numerics.svrg.svrg_passes`)
    batch_size: int = 1             # svrg: rows per step
    lr: float | None = None         # svrg: step (None: 1 / L_max)
    variant: str = "epochs"         # svrg: SVRG_VARIANTS
    contraction: float = AUTO_PASSES_CONTRACTION  # svrg, passes=auto: c of `dane.numerics.svrg.svrg_passes` (the
                                                  # solve contracts by e^-c)
    #: whose keys set the nulls above: ``problem`` (problem.local_max_iter, svrg_lr, svrg_passes: noted where a solve
    #: uses them, `SolverNotes`) or ``algorithm`` (a method's own solver, whose build notes them)
    keys: str = field(default="problem", compare=False)

    def __post_init__(self) -> None:
        checks.one_of("problem.local_solver", self.method, LOCAL_SOLVERS)
        checks.relative_tolerance("problem.local_tol", self.tol, zero=True)  # 0: a fixed count (cg: local_max_iter)
        if self.max_iter is not None:
            checks.positive_int("problem.local_max_iter", self.max_iter)
        checks.positive_int("problem.newton_steps", self.newton_steps)
        check_passes("problem.svrg_passes", self.passes)
        checks.positive_int("problem.svrg_batch_size", self.batch_size)
        if self.lr is not None:
            checks.positive("problem.svrg_lr", self.lr)
        checks.one_of("problem.svrg_variant", self.variant, SVRG_VARIANTS)
        if self.contraction != math.inf:  # ∞: an exact solve asked for (AIDE's q = 0), the cap P_max
            checks.positive("problem.svrg_contraction", self.contraction)
        if self.method == "cg" and self.tol == 0 and self.max_iter is None:
            raise ConfigError("problem.local_solver=cg with local_tol=0 needs problem.local_max_iter (a fixed count)")

    def resolve(self, dim: int, sparse: bool) -> "LocalSolver":
        """``auto`` made concrete for this problem."""
        if self.method != "auto":
            return self
        return replace(self, method=auto_local_solver(dim, sparse))


def auto_local_solver(dim: int, sparse: bool) -> str:
    """``local_solver=auto``: ``cholesky`` where d ≤ `AUTO_MAX_DIM` and X is dense (a dense d x d factor costs d³/3
    flops, once per μ on a quadratic), else ``cg`` (Hessian-vector products, no d x d matrix).  This package's rule
    (not swept)."""
    return "cholesky" if dim <= AUTO_MAX_DIM and not sparse else "cg"


class SolverNotes:
    """The nulls of a shard's ``problem.*`` solver keys that the run's local solves used, each noted at its first use
    inside the rounds (`dane.work.counting`: not the reference optimum's solve, nor a measurement), as a method's
    defaults are ({"key", "value", "rule", "stats"}, `baselines.defaults.Resolution`): what ``local_solver=auto`` chose
    (`auto_local_solver`), ``local_max_iter``'s cap (`cg_products`, `LBFGS_MAX_ITER`), ``svrg_lr``
    (`dane.numerics.svrg.svrg_step`) and ``svrg_passes=auto`` (`dane.numerics.svrg.svrg_passes`).  The last two are this
    worker's (``worker``: set by the problem's build) at the proximal weight ``mu`` of that first solve; a μ that moves
    later re-derives them (DANE records each re-derivation as an ``adapted`` event).  A problem notes its own keys'
    nulls here too, where its solves use them (``also``: key -> rule, what the first lines name before round 0):
    ridge_synthetic's ``factorization=auto`` (`dane.problems.quadratic.auto_factorization`), a network's ``inner_steps``
    and ``inner_batch_size`` (`dane.numerics.inner.one_pass_steps`, `dane.numerics.inner.whole_shard`).  The batched
    path's stacked problem notes what worker 0's shard would (``worker`` 0).  A resumed run keeps them (the shard's
    ``state_dict``)."""

    def __init__(self, asked: LocalSolver | None = None, also: dict[str, str] | None = None):
        self.auto = asked is not None and asked.method == "auto"
        self.also = dict(also or {})
        self.worker: int | None = None
        self.entries: dict[str, dict] = {}

    def note(self, key: str, value, rule: str, **stats) -> None:
        if key not in self.entries and counting():
            self.entries[key] = {"key": key, "value": value, "rule": rule,
                                 "stats": {k: v for k, v in stats.items() if v is not None}}

    def own(self, solver: LocalSolver, dim: int, sparse: bool) -> LocalSolver:
        """The shard's own (resolved) ``solver``, used by a solve: ``auto``'s choice noted."""
        if self.auto:
            self.note("problem.local_solver", solver.method, "auto_local_solver", dim=dim, sparse=sparse)
        return solver

    def open_keys(self, solver: LocalSolver | None) -> dict[str, str]:
        """The keys a solve by the shard's own (resolved) ``solver`` (None: it has none) notes, key -> rule: what the
        first lines say before round 0."""
        keys = {"problem.local_solver": "auto_local_solver"} if self.auto else {}
        if solver is None:
            return {**keys, **self.also}
        if solver.max_iter is None and solver.method in ("cg", "lbfgs"):
            keys["problem.local_max_iter"] = "cg_products" if solver.method == "cg" else "LBFGS_MAX_ITER"
        if solver.method == "svrg":
            keys.update({SVRG_NULLS["lr"][0]: SVRG_NULLS["lr"][1]} if solver.lr is None else {})
            keys.update({SVRG_NULLS["passes"][0]: SVRG_NULLS["passes"][1]} if solver.passes == PASSES_AUTO else {})
        return {**keys, **self.also}

    def kept(self, state: dict) -> dict:
        """A problem's checkpoint ``state`` with these notes (``solver_notes``: none noted, no key)."""
        return {**state, "solver_notes": list(self.entries.values())} if self.entries else state

    def restore(self, state: dict) -> None:
        """The notes `kept` put in ``state`` (none there: none)."""
        self.entries = {entry["key"]: entry for entry in state.get("solver_notes", [])}


def noted(shard, solver: LocalSolver, key: str, value, rule: str, **stats):
    """``value``, noted on ``shard``'s `SolverNotes` where ``solver``'s nulls are the problem's keys."""
    notes = getattr(shard, "solver_notes", None)
    if notes is not None and solver.keys == "problem":
        notes.note(key, value, rule, **stats)
    return value


def cg_cap(shard, solver: LocalSolver) -> int:
    """CG's products per solve: ``solver.max_iter``, or where null `cg_products` (noted, `noted`)."""
    if solver.max_iter is not None:
        return solver.max_iter
    return noted(shard, solver, "problem.local_max_iter", cg_products(shard), "cg_products", dim=shard.dim)


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

    #: ``svrg_rows()``: the rows in the compiled kernels' layout; None (`dane.problems.Problem`'s default): the
    #: torch reference loop
    svrg_rows: Callable[[], Any] | None


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

    def at_anchor(self, anchor_grad: torch.Tensor, anchor_value=None) -> tuple[float | None, torch.Tensor]:
        """(φ(a), ∇φ(a)) from the caller's ∇O_i(a) and O_i(a) (with the ℓ2 term; None: φ(a) unknown): ∇O_i(a) − linear
        and O_i(a) − ⟨linear, a⟩, the numbers `value_grad` computes at the anchor, without a pass over the rows."""
        value = None if anchor_value is None else float(anchor_value) - float(self.linear @ self.anchor)
        return value, anchor_grad - self.linear

    def data_grad_at_anchor(self, anchor_grad: torch.Tensor) -> torch.Tensor:
        """∇D_i(a) = ∇O_i(a) − l2·a from the caller's ∇O_i(a) (with the ℓ2 term, as `at_anchor` takes it): SVRG's first
        snapshot's full gradient, at the anchor, without a pass over the rows."""
        return anchor_grad - self.l2 * self.anchor


def prox_solve(shard: Shard, anchor: torch.Tensor, linear: torch.Tensor, mu: float, *, with_reg: bool,
               solver: LocalSolver, generator: torch.Generator | None = None,
               anchor_grad: torch.Tensor | None = None, anchor_value=None) -> torch.Tensor:
    """≈ argmin_w φ(w) by ``solver`` (already resolved), started at the anchor; ``anchor_grad`` and ``anchor_value``:
    ∇O_i(anchor) and O_i(anchor) where the caller has them (`newton`, `lbfgs`; SVRG's first snapshot takes
    ``anchor_grad``, `dane.numerics.svrg.svrg_reference`)."""
    sub = Subproblem(shard, anchor, linear, float(mu), shard.l2 if with_reg else 0.0)
    known = dict(anchor_grad=anchor_grad, anchor_value=anchor_value) if with_reg else {}
    if solver.method in ("cholesky", "cg"):
        return newton(sub, solver, **known)
    if solver.method == "svrg":
        note_svrg(sub, solver)
        return svrg(sub, solver, generator, anchor_grad=known.get("anchor_grad"))
    return lbfgs(sub, solver, **known)


def newton(sub: Subproblem, solver: LocalSolver, *, anchor_grad: torch.Tensor | None = None,
           anchor_value=None) -> torch.Tensor:
    """Newton's method on φ, directions by `Shard.solve_hessian` (Cholesky or CG).

    ``anchor_grad`` = ∇O_i(a) and ``anchor_value`` = O_i(a), where the caller has them (DANE's round evaluated them),
    give φ and ∇φ at the anchor without a pass (`Subproblem.at_anchor`); without the value, the first line search
    evaluates φ(a).

    A gradient or direction that is not finite (a linear term η g that overflowed, an anchor that is not finite) ends
    the solve at a point that is not finite, with no factorization there (which would fail as if the local Hessian
    were singular): the method's round sees it, DANE's safeguard rejecting the trial and naming η
    (`dane.dane.DANE.remedy`), a method without one diverging on its next objective."""
    w = sub.anchor
    value, grad = sub.value_grad(w) if anchor_grad is None else sub.at_anchor(anchor_grad, anchor_value)
    grad0 = float(torch.linalg.vector_norm(grad))
    if grad0 == 0.0:
        return w.clone()
    floor = round_off_floor(grad, sub.linear)
    shift = sub.mu + sub.l2
    for step in range(solver.newton_steps):
        gnorm = float(torch.linalg.vector_norm(grad))
        rel = gnorm / grad0
        if step > 0 and (rel <= solver.tol or gnorm <= floor):
            break
        # forcing term of an inexact Newton method: loose far from the solution, tight close to it; tol = 0 asks a
        # fixed count of products per system (cg's max_iter), which no forcing term may cut short
        rtol = solver.tol if sub.shard.quadratic or solver.tol == 0 else min(0.5, rel ** 0.5)
        if not sub.shard.quadratic and not bool(torch.isfinite(grad).all()):
            return torch.full_like(w, math.nan)  # no Hessian at w to step by: the solve has no finite answer
        direction = sub.shard.solve_hessian(-grad, at=w, shift=shift, with_reg=False, solver=solver, rtol=rtol)
        if sub.shard.quadratic:
            return w + direction  # φ is quadratic: the Newton step is the minimizer (to the solve's accuracy)
        if not bool(torch.isfinite(direction).all()):
            return w + direction  # no step along it is finite: the line search would end at t = 1e-10 there
        if value is None:
            value, _ = sub.value_grad(w)
        slope = float(grad @ direction)
        # Near the solution the predicted decrease falls below the round-off of φ's value and Armijo
        # cannot tell a good step from a bad one: there a step that lowers the gradient norm is taken
        # (else the search halved t to 1e-10 and Newton stalled at ||∇φ|| ~ 1e-9); the bound scales with the
        # dtype's round-off (float32: `FLAT_SLOPE` x eps32 / eps64)
        flat = abs(slope) <= flat_slope(w.dtype) * max(1.0, abs(float(value)))
        gnorm = float(torch.linalg.vector_norm(grad))
        t = 1.0
        while True:
            candidate = w + t * direction
            cand_value, cand_grad = sub.value_grad(candidate)
            if (cand_value <= value + 1e-4 * t * slope or t < 1e-10
                    or (flat and float(torch.linalg.vector_norm(cand_grad)) < gnorm)):
                break
            t *= 0.5
        if t < 1e-10 and w.dtype != torch.float64:
            break  # float32: no step lowers φ or its gradient any more, the solve is at the dtype's round-off
        w, value, grad = candidate, cand_value, cand_grad
    return w


#: |predicted decrease| / max(1, |φ|) below which float64's Armijo test cannot tell steps apart (`newton`), and a
#: rise of φ within its round-off; GIANT's line search (`baselines.giant`) and the reference optimum's
#: (`dane.problems.optimum`) take this value in any dtype, `flat_slope` scales it to the dtype's
FLAT_SLOPE = 1e-12
#: ‖∇φ‖ at most this many machine epsilons of the size of its terms is round-off (`round_off_floor`)
ROUND_OFF_GRADIENT = 16


def round_off_floor(grad: torch.Tensor, linear: torch.Tensor) -> torch.Tensor | float:
    """`ROUND_OFF_GRADIENT` · eps · (‖∇O_i(a)‖ + ‖linear‖), from ∇φ(a) = ∇O_i(a) − linear (per row where stacked): the
    gradient norm below which ∇φ = ∇O_i(w) − linear + μ(w − a) is round-off, so Newton stops there.

    The tolerance is relative to ‖∇φ(a)‖; near the optimum that is itself near round-off (DANE's ∇φ(w_t) = η g), and
    tol·‖∇φ(a)‖ then lies below what float arithmetic attains (about 1-3 eps of the terms' size): without the floor
    each solve ran all ``newton_steps``, a factorization each, changing w by round-off only."""
    scale = torch.linalg.vector_norm(grad + linear, dim=-1) + torch.linalg.vector_norm(linear, dim=-1)
    floor = ROUND_OFF_GRADIENT * torch.finfo(grad.dtype).eps * scale
    return float(floor) if floor.dim() == 0 else floor


def flat_slope(dtype: torch.dtype) -> float:
    """`FLAT_SLOPE` in ``dtype``'s round-off: itself in float64, scaled by the ratio of machine epsilons otherwise."""
    if dtype == torch.float64:
        return FLAT_SLOPE
    return FLAT_SLOPE * torch.finfo(dtype).eps / torch.finfo(torch.float64).eps


def refuse_oversized_svrg(key: str, solver: LocalSolver | None, n: int) -> None:
    """An SVRG solver's rows per step (``key``) beyond this worker's ``n`` rows: refused in one line, as sync_sgd's and
    local_sgd's batches are (`dane.numerics.inner.refuse_oversized`), not cut to the shard, a smaller batch than the
    one asked for (an empty shard takes no step, so any batch passes there)."""
    if isinstance(solver, LocalSolver) and solver.method == "svrg" and n:
        refuse_oversized(key, solver.batch_size, n, null=False)


def svrg_passes_at(shard: Shard, solver: LocalSolver, mu: float) -> int:
    """The passes an SVRG solve by ``solver`` runs on ``shard``'s rows (`row_shard`) at the proximal weight ``mu``, with
    their ℓ2 term (`prox_solve` with ``with_reg``): ``passes`` as given, or what ``auto`` resolves to there
    (`dane.numerics.svrg.svrg_passes`)."""
    rows = row_shard(shard)
    return svrg_constants(Subproblem(rows, anchor=None, linear=None, mu=float(mu), l2=rows.l2), solver)[4]


def cg_products(shard) -> int:
    """CG's Hessian-vector products per solve where ``max_iter`` is null, `CG_PRODUCTS_PER_DIM` × d: what a convex
    shard's CG takes (`dane.problems.glm`, `dane.problems.quadratic`) and the null caps of InexactDANE, AIDE, GIANT
    and DiSCO's PCG (their summaries note it)."""
    return CG_PRODUCTS_PER_DIM * shard.dim


def lbfgs_cap(shard, solver: LocalSolver) -> int:
    """L-BFGS-B's iterations per solve: ``solver.max_iter``, or where null `LBFGS_MAX_ITER` (noted, `noted`)."""
    if solver.max_iter is not None:
        return solver.max_iter
    return noted(shard, solver, "problem.local_max_iter", LBFGS_MAX_ITER, "LBFGS_MAX_ITER")


def svrg_resolved(shard: Shard, solver: LocalSolver, mu: float) -> dict:
    """What an SVRG solve's nulls resolve to on ``shard`` at the proximal weight ``mu`` (with the shard's ℓ2 term, as
    DANE's round solves): ``lr`` (`dane.numerics.svrg.svrg_step`, where ``solver.lr`` is None) and ``passes``
    (`dane.numerics.svrg.svrg_passes`, where ``passes=auto``), each with what it read; {} for another solver or where
    both are given."""
    if solver.method != "svrg":
        return {}
    return svrg_nulls(Subproblem(shard, anchor=None, linear=None, mu=float(mu), l2=shard.l2), solver)


def svrg_moved(shard, solver: LocalSolver | None, before: float,
               after: float) -> list[tuple[str, str, str, Any, Any]]:
    """The nulls of an SVRG ``solver`` on ``shard``'s rows (`row_shard`) that a move of the local solve's proximal
    weight from ``before`` to ``after`` re-derives (`svrg_resolved`): (name, key, rule, value at ``before``, value at
    ``after``) for each whose value changed, under the key that left it null (``SVRG_NULLS``' ``problem.*`` where the
    problem's keys set the solver, else ``algorithm.<name>``); none for another solver, given numbers, or rows without
    a row smoothness.  DANE's μ safeguard and S-DANE's and FedDANE's weight doubling record each as an ``adapted``
    event (`dane.dane.DANE.rederived`, `dane.baselines.adaptive.WeightDoubling`)."""
    rows = row_shard(shard)
    if not isinstance(solver, LocalSolver) or solver.method != "svrg" \
            or getattr(rows, "row_smoothness", None) is None:
        return []
    old, new = svrg_resolved(rows, solver, before), svrg_resolved(rows, solver, after)
    moved = []
    for name, found in new.items():
        key, rule = SVRG_NULLS[name]
        if found["value"] != old[name]["value"]:
            moved.append((name, key if solver.keys == "problem" else f"algorithm.{name}", rule, old[name]["value"],
                          found["value"]))
    return moved


def lbfgs(sub: Subproblem, solver: LocalSolver, *, anchor_grad: torch.Tensor | None = None,
          anchor_value=None) -> torch.Tensor:
    """scipy L-BFGS-B on φ, from the anchor, to tol x the anchor's gradient (max norm); with both ``anchor_grad`` and
    ``anchor_value`` (as `newton` takes them) its first evaluation, at the anchor, makes no pass.

    Departure from that contract, and why two devices' answers differ by more than round-off: L-BFGS-B also
    stops where φ's value no longer decreases (its factr test, with ftol=0, fires on φ's round-off), which
    usually comes first near tol=1e-10: φ − φ* ≈ ½ gᵀH⁻¹g falls below φ's round-off once ‖∇φ‖ is about
    √(u L |φ|), so the answer is accurate to about √u (relative), and which iterate it stops at depends on
    round-off (another summation order, a GPU's, moves it by far more than round-off).  What holds on every device is
    the certificate of a σ-strongly convex φ (σ = λ + μ): ‖w − w*‖ ≤ ‖∇φ(w)‖ / σ (`tests/test_device.py`).
    For answers equal to round-off across devices, use ``cholesky`` or ``cg`` (quadratic convergence stops
    them at round-off) or ``svrg`` (a fixed number of steps).
    """
    with start_up():  # an import at first use: start-up, not this worker's solve (`dane.comm.meters`)
        import scipy.optimize  # here, not at import: a run that never asks for L-BFGS does not pay for it

    dtype, device = sub.anchor.dtype, sub.anchor.device
    last: dict = {}

    def fun(x: np.ndarray):
        """φ and ∇φ at x, a pass over the rows; at the point just evaluated (x0 for the tolerance then for scipy, a line
        search's last trial) the same numbers again, no pass."""
        if last.get("x") is None or not np.array_equal(last["x"], x):
            value, grad = sub.value_grad(torch.from_numpy(x).to(device, dtype))
            last.update(x=x.copy(), value=value, grad=grad.double().cpu().numpy())
        return last["value"], last["grad"].copy()

    x0 = sub.anchor.double().cpu().numpy()
    if anchor_grad is not None and anchor_value is not None:  # φ(a) and ∇φ(a) without a pass (`Subproblem.at_anchor`)
        value, grad = sub.at_anchor(anchor_grad, anchor_value)
        last.update(x=x0.copy(), value=value, grad=grad.double().cpu().numpy())
    _, grad0 = fun(x0)
    gtol = solver.tol * float(np.abs(grad0).max())
    result = scipy.optimize.minimize(fun, x0, jac=True, method="L-BFGS-B",
                                     options={"maxiter": lbfgs_cap(sub.shard, solver), "gtol": gtol, "ftol": 0.0,
                                              "maxcor": 20})
    count("local_solver_iters", result.nit)  # its evaluations of φ are counted as passes
    return torch.from_numpy(result.x).to(device, dtype)
