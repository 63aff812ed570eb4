r"""SVRG, the local solver of InexactDANE (Reddi et al. 2016), on the subproblem of `dane.numerics.local_solvers`:

.. math:: \phi(w) = D_i(w) + \frac{\lambda}{2}\|w\|^2 - \langle \ell, w\rangle + \frac{\mu}{2}\|w - a\|^2

``passes`` epochs of SVRG on the worker's rows, started at the anchor (``passes="auto"``: `svrg_passes`).  The ℓ2,
linear and proximal terms are deterministic and enter exactly; only the data term is sampled.  The step is 1 / L_max of
the per-row components unless ``lr`` is given (`svrg_step`).  ``variant`` (see `SVRG_VARIANTS`) says when the snapshot
is taken and how rows are drawn.  Compiled (`dane.numerics.svrg_kernels`) on the rows of a linear model;
`svrg_reference` is the same method in torch, one call per step, and the fast path is tested against it.  On a GPU
shard (``problem.device=cuda``) SVRG is `svrg_reference` on the device: the compiled kernels run on host arrays only.
The same row draws, so the same iterates to round-off, but one step is a few small kernel launches: slow where n_i is
large.

Beside the solver: its options' values (`SVRG_VARIANTS`, ``passes`` checked by `check_passes`), the nulls a solve
resolves and notes (`svrg_nulls`, `SVRG_NULLS`) and the kernel's load at set-up (`load_svrg`).  ``sub`` is a
`dane.numerics.local_solvers.Subproblem` and ``solver`` a `dane.numerics.local_solvers.LocalSolver` throughout, named
here and not imported: that module dispatches its solves here (`dane.numerics.local_solvers.prox_solve`) and so sits
above this one.
"""
from __future__ import annotations

import math
import warnings

import torch

from ..errors import ConfigError
from ..work import count, counting

#: ``epochs``: a full-gradient snapshot at the start of every pass (SVRG's outer loop, Johnson & Zhang
#: 2013, option I), then n_i / b steps on a fresh random permutation of the rows (every row once per pass).
#: ``matlab``: the public MATLAB/Octave reference's AIDE solver's (``AIDELinSVRG.m``): one snapshot (at the anchor)
#: per solve, then passes * n_i / b steps on rows drawn uniformly with replacement.  Its InexactDANE solver
#: (``InexactDANELinSVRG.m``) takes the same one snapshot but visits the rows in a fresh permutation each pass:
#: neither variant here.
SVRG_VARIANTS = ("epochs", "matlab")
PASSES_AUTO = "auto"
#: passes=auto (`svrg_passes`): SVRG steps per solve = AUTO_PASSES_CONTRACTION x κ, κ = 1 / (γ (λ + μ))
AUTO_PASSES_CONTRACTION = 1.0
AUTO_PASSES_MIN = 3      # the paper's (and the public MATLAB reference's) passes: auto never takes fewer
AUTO_PASSES_MAX = 1000   # a cap on one solve's cost where κ is far above n_i (ill-conditioned data, tiny λ + μ)


def check_passes(key: str, passes) -> int | str:
    """SVRG's passes: a positive integer or ``auto``; else one line naming the key and the value."""
    if passes == PASSES_AUTO:
        return passes
    if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
        raise ConfigError(f"{key} must be a positive integer or {PASSES_AUTO}, got {passes!r}")
    return passes


def svrg(sub, solver, generator: torch.Generator | None,
         anchor_grad: torch.Tensor | None = None) -> torch.Tensor:
    """`svrg_reference`'s iterate, compiled (`dane.numerics.svrg_kernels`) where the shard gives its rows.

    The same draws from ``generator`` as the reference, and the same first snapshot's gradient (``anchor_grad``);
    without numba installed, the reference itself (with a warning, once); on a GPU, the reference on the device.
    """
    if sub.anchor.device.type != "cpu":  # the compiled kernels read host arrays: torch SVRG where the rows are
        return svrg_reference(sub, solver, generator, anchor_grad)
    rows = sub.shard.svrg_rows() if sub.shard.svrg_rows is not None else None
    if rows is None:
        return svrg_reference(sub, solver, generator, anchor_grad)
    try:
        from . import svrg_kernels  # numba: imported on the first SVRG solve, never at ``import dane``
    except ImportError as exc:
        _warn_once(f"numba is not importable ({exc}); SVRG runs its torch reference, one call per step "
                   "(slow): pip install numba")
        return svrg_reference(sub, solver, generator, anchor_grad)
    lr, shrink, steps, b, passes = svrg_constants(sub, solver)
    order = torch.cat(svrg_schedule(sub.shard.n_local, b, steps, passes, solver.variant, generator))
    if steps == 0:  # no rows
        return sub.anchor.clone()
    w = sub.anchor.to(rows.dtype).numpy().copy()
    c0 = -sub.linear - sub.mu * sub.anchor
    # the first snapshot's c = ∇D_i(a) + c0 from the round's gradient; empty: the kernel computes it
    c_first = c0.new_empty(0) if anchor_grad is None else sub.data_grad_at_anchor(anchor_grad) + c0
    w = svrg_kernels.run(rows, lr=lr, shrink=shrink, scale=sub.shard.n_local / b, w=w,
                         c0=c0.to(rows.dtype).numpy(), c_first=c_first.to(rows.dtype).numpy(),
                         order=order.numpy(), steps=steps, b=b)
    return torch.from_numpy(w).to(sub.anchor.dtype)


def load_svrg(problem, solver) -> None:
    """At set-up: the compiled SVRG kernel ``problem``'s solves will run, loaded or compiled (`dane.numerics.svrg_kernels.load`),
    where `svrg` would take it (an SVRG solver, the shard's rows, on the CPU, numba importable)."""
    if solver is None or solver.method != "svrg" or getattr(problem, "svrg_rows", None) is None \
            or problem.initial_point().device.type != "cpu":
        return
    try:
        from . import svrg_kernels
    except ImportError:  # `svrg` warns at the first solve
        return
    svrg_kernels.load(problem.svrg_rows())


def svrg_constants(sub, solver) -> tuple[float, float, int, int, int]:
    """(step γ, deterministic curvature λ + μ, steps per snapshot, rows per step, passes) of an SVRG solve."""
    shard = sub.shard
    # the min: an empty shard (`dane.numerics.local_solvers.refuse_oversized_svrg` passes any batch there)
    n, b = shard.n_local, min(solver.batch_size, shard.n_local)
    shrink = sub.l2 + sub.mu  # the deterministic part's curvature: ∇R(w) = shrink·w − linear − μ·anchor
    lr = solver.lr if solver.lr is not None else svrg_step(n, shard.row_smoothness(), shrink)
    passes = svrg_passes(solver.passes, lr=lr, shrink=shrink, n=n, b=b, contraction=solver.contraction)
    steps = n // b if solver.variant == "epochs" else passes * n // b
    return lr, shrink, steps, b, passes


def svrg_passes(passes: int | str, *, lr: float, shrink: float, n: int, b: int,
                contraction: float = AUTO_PASSES_CONTRACTION) -> int:
    r"""The passes of one SVRG solve: ``passes`` as given, or for ``auto``

    .. math:: \text{passes} = \operatorname{clip}\Big(\Big\lceil c\,\kappa\,\frac{b}{n}\Big\rceil,
              P_{\min}, P_{\max}\Big),\qquad \kappa = \frac{1}{\gamma(\lambda + \mu)}

    (c = `AUTO_PASSES_CONTRACTION`, P_min = `AUTO_PASSES_MIN`, the paper's 3, P_max = `AUTO_PASSES_MAX`).
    With γ = 1/L_max (the default step), κ = L_max/(λ + μ) is the subproblem's condition number as
    SVRG sees it: a step shrinks the error along the flattest direction (curvature λ + μ) by
    1 − γ(λ + μ) at best, so c κ steps contract it by about e^{-c}, and a solve is equally accurate
    whatever κ/n_i.  SVRG's theory sets its inner loop in proportion to κ (Johnson & Zhang 2013,
    Theorem 1: m ∝ L/μ for a fixed rate); the paper's fixed 3 passes (Reddi et al. 2016, and their
    MATLAB reference) is this rule where κ ≤ 3 n_i/c.  With λ + μ = 0, or c = ∞, there is no such bound: P_max.
    ``contraction`` is c (a caller that needs a more accurate solve, AIDE's Catalyst loop, raises it).
    A step γ that is not a finite positive number, or a λ + μ of nan, is a caller's bug (a μ the caller failed to
    check): a ValueError that names it, not a κ of nan.
    """
    if passes != PASSES_AUTO:
        return int(passes)
    if n == 0:
        return AUTO_PASSES_MIN
    if not (0 < lr < math.inf) or math.isnan(shrink):
        raise ValueError(f"svrg_passes: passes=auto needs a finite step lr > 0 and a curvature shrink = lambda + mu "
                         f"that is a number, got lr={lr!r}, shrink={shrink!r}")
    if shrink <= 0 or contraction == math.inf:
        return AUTO_PASSES_MAX
    wanted = math.ceil(contraction * b / (lr * shrink * n))
    return min(max(wanted, AUTO_PASSES_MIN), AUTO_PASSES_MAX)


def row_shard(problem):
    """The shard whose rows a row-based solve (SVRG) runs on: a problem's ``rows`` where it keeps them beside itself
    (a ridge shard's linear-model shard of the same rows, `dane.problems.Problem.rows`), else the problem itself."""
    return problem.rows if getattr(problem, "rows", None) is not None else problem


def svrg_step(rows: int, row_smoothness: float, shrink: float) -> float:
    """SVRG's step where ``lr`` is null: γ = 1/L_max = 1/(n_i L_row + λ + μ), the inverse of the largest smoothness of
    the row terms n_i f_j + ((λ + μ)/2)‖·‖² whose mean the solve minimizes (the step of SAG's and SVRG's practice;
    Johnson & Zhang 2013's theorem asks γ < 1/(4 L_max) for its rate)."""
    return 1.0 / (rows * row_smoothness + shrink)


def svrg_nulls(sub, solver) -> dict:
    """`dane.numerics.local_solvers.svrg_resolved` of the subproblem ``sub`` (its own ℓ2 term and μ)."""
    shard = sub.shard
    lr, shrink, _, b, passes = svrg_constants(sub, solver)
    found = {}
    if solver.lr is None:
        found["lr"] = {"value": lr, "rows": shard.n_local, "row_smoothness": shard.row_smoothness(), "shrink": shrink}
    if solver.passes == PASSES_AUTO:
        found["passes"] = {"value": passes, "kappa": 1.0 / (lr * shrink) if shrink > 0 else math.inf,
                           "rows": shard.n_local, "batch_size": b, "contraction": solver.contraction}
    return found


#: an SVRG solve's nulls (`svrg_nulls`): the ``problem.*`` key and its rule
SVRG_NULLS = {"lr": ("problem.svrg_lr", "svrg_step"), "passes": ("problem.svrg_passes", "svrg_passes")}


def note_svrg(sub, solver) -> None:
    """An SVRG solve's ``problem.svrg_lr`` and ``problem.svrg_passes=auto``, noted at their first solve with the μ
    and the statistics they read (`dane.numerics.local_solvers.SolverNotes`)."""
    notes = getattr(sub.shard, "solver_notes", None)
    if notes is None or solver.keys != "problem" or not counting():
        return
    for name, found in svrg_nulls(sub, solver).items():
        key, rule = SVRG_NULLS[name]
        notes.note(key, found.pop("value"), rule, worker=notes.worker, mu=sub.mu, **found)


def svrg_schedule(n: int, b: int, steps: int, passes: int, variant: str,
                  generator: torch.Generator | None) -> list[torch.Tensor]:
    """The rows of every step, one tensor per snapshot (``steps`` x b rows each); see `SVRG_VARIANTS`."""
    if variant == "epochs":
        return [torch.randperm(n, generator=generator)[:steps * b] for _ in range(passes)]
    return [torch.randint(0, n, (steps * b,), generator=generator)]


def svrg_reference(sub, solver, generator: torch.Generator | None,
                   anchor_grad: torch.Tensor | None = None) -> torch.Tensor:
    r"""SVRG on φ = Σ_j weight f_j + R, in torch, one call per step (the reference of `svrg`):

    .. math:: w \leftarrow w - \gamma\Big(\tfrac{n_i}{b}\sum_{j\in B}(\nabla f_j(w) - \nabla f_j(\tilde w))
              + \nabla D_i(\tilde w) + \nabla R(w)\Big)

    with the snapshot :math:`\tilde w` the last iterate, taken once per pass (``epochs``) or
    once at the anchor (``matlab``), the rows B by `svrg_schedule`.  The first snapshot is the anchor a: with
    ``anchor_grad`` = ∇O_i(a) (the round's evaluation there, as `dane.numerics.local_solvers.newton` takes it) its
    full gradient is `dane.numerics.local_solvers.Subproblem.data_grad_at_anchor`, no pass; else one pass computes it.
    A solve of P passes then costs, in `dane.work`'s passes, P − 1 + 2P b⌊n_i/b⌋/n_i (``epochs``; 3P − 1 where b
    divides n_i) or 2b⌊P n_i/b⌋/n_i (``matlab``), one more without ``anchor_grad``."""
    shard = sub.shard
    lr, shrink, steps, b, passes = svrg_constants(sub, solver)
    scale = shard.n_local / b
    w = sub.anchor.clone()
    for k, order in enumerate(svrg_schedule(shard.n_local, b, steps, passes, solver.variant, generator)):
        order = order.to(w.device)  # drawn on the host (the same rows on every device), used where the rows are
        snapshot = w.clone()
        if k == 0 and anchor_grad is not None:
            full = sub.data_grad_at_anchor(anchor_grad)  # ∇D_i(a) from the round's evaluation: no second pass
        else:
            _, full = shard.data_value_grad(snapshot)
        constant = full - sub.linear - sub.mu * sub.anchor  # ∇D_i(w̃) + ∇R(w) − shrink·w, fixed per snapshot
        for start in range(0, steps * b, b):
            count("local_solver_iters")
            correction = shard.rows_grad_diff(w, snapshot, order[start:start + b])
            w = (1 - lr * shrink) * w - lr * (scale * correction + constant)
    return w


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)
