"""The compiled SVRG (dane.numerics.svrg_kernels) against its torch reference, and the two sampling variants.

Both paths draw the rows from the same seeded generator, so their iterates agree to
round-off; the ``matlab`` variant is checked against a loop written out here in numpy.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse
import torch

from dane.errors import ConfigError
from dane.numerics.local_solvers import LocalSolver, Subproblem
from dane.numerics.svrg import (AUTO_PASSES_CONTRACTION, AUTO_PASSES_MAX, AUTO_PASSES_MIN, svrg, svrg_constants, svrg_passes,
                                svrg_reference)
from dane.losses import LOGISTIC, SOFTMAX, SQUARED
from dane.problems.glm import LinearModelShard, to_torch
import runs

LOSSES = {"squared": (SQUARED, 1), "logistic": (LOGISTIC, 1), "softmax": (SOFTMAX, 3)}


def shard(loss: str, *, sparse: bool, n: int = 150, d: int = 9, seed: int = 0) -> LinearModelShard:
    rng = np.random.default_rng(seed)
    f, classes = LOSSES[loss]
    X = rng.standard_normal((n, d)) * np.linspace(1.5, 0.3, d)
    if sparse:
        X = scipy.sparse.random(n, d, density=0.3, format="csr", random_state=seed, data_rvs=rng.standard_normal)
    z = X @ rng.standard_normal(d)
    if loss == "squared":
        y = torch.from_numpy(z + 0.3 * rng.standard_normal(n))
    elif loss == "logistic":
        y = torch.from_numpy(np.where(z + 0.5 * rng.standard_normal(n) > 0, 1.0, -1.0))
    else:
        y = torch.from_numpy(rng.integers(0, classes, n))
    return LinearModelShard(to_torch(X), y, f, l2=0.02, weight=2.0 / n, classes=classes)


def subproblem(problem: LinearModelShard, mu: float = 0.3) -> Subproblem:
    gen = torch.Generator().manual_seed(5)
    anchor = 0.3 * torch.randn(problem.dim, generator=gen, dtype=torch.float64)
    linear = 0.1 * torch.randn(problem.dim, generator=gen, dtype=torch.float64)
    return Subproblem(problem, anchor, linear, mu, problem.l2)


@pytest.mark.parametrize("variant", ["epochs", "matlab"])
@pytest.mark.parametrize("layout", ["dense", "sparse"])
@pytest.mark.parametrize("loss", list(LOSSES))
def test_compiled_svrg_equals_the_torch_reference(loss, layout, variant):
    problem = shard(loss, sparse=layout == "sparse")
    for batch_size, mu in ((1, 0.3), (4, 0.0)):
        sub = subproblem(problem, mu)
        solver = LocalSolver("svrg", passes=3, batch_size=batch_size, variant=variant)
        fast = svrg(sub, solver, torch.Generator().manual_seed(11))
        reference = svrg_reference(sub, solver, torch.Generator().manual_seed(11))
        moved = float(torch.linalg.vector_norm(reference - sub.anchor))
        assert moved > 0.1  # the solve went somewhere
        assert float(torch.linalg.vector_norm(fast - reference)) <= 1e-12 * float(torch.linalg.vector_norm(reference))


@pytest.mark.parametrize("variant, passes", [("epochs", 3 * (1 + 2) - 1), ("matlab", 1 + 2 * 3 - 1)])
@pytest.mark.parametrize("layout", ["dense", "sparse"])
@pytest.mark.parametrize("loss", ["logistic", "softmax"])
def test_the_first_snapshot_takes_the_anchors_gradient_from_the_caller(loss, layout, variant, passes):
    """The first snapshot is the anchor a, where the caller's round evaluated ∇O_i(a): with it (``anchor_grad``) neither
    path computes ∇D_i(a) again, so a solve of 3 passes of b = 1 costs 3·(1 + 2) − 1 = 8 passes (``epochs``: a full
    gradient and n_i two-row corrections a pass, the first gradient the caller's) and 1 + 2·3 − 1 = 6 (``matlab``: one
    snapshot, 3 n_i corrections), one fewer than without it (it was 9 and 7 in a DANE round), with the same iterates
    to round-off (∇D_i(a) = ∇O_i(a) − l2·a, another summation order)."""
    from dane import work

    problem = shard(loss, sparse=layout == "sparse", n=40)  # few rows: the reference takes one call a step
    sub = subproblem(problem)
    anchor_grad = problem.grad(sub.anchor)  # ∇O_i(a), with the ℓ2 term, as `evaluate` gives it
    solver = LocalSolver("svrg", passes=3, variant=variant)
    for solve in (svrg, svrg_reference):
        counted = []
        for given in (anchor_grad, None):
            ledger = work.Ledger(range(1), np.ones(len(work.COUNTS)))
            with work.opened(ledger):
                counted.append(solve(sub, solver, torch.Generator().manual_seed(11), given))
            counted.append(ledger.counts[0, work.COUNTS.index("local_passes")])
        taken, taken_passes, computed, computed_passes = counted
        assert (taken_passes, computed_passes) == pytest.approx((passes, passes + 1), abs=1e-12)
        assert float(torch.linalg.vector_norm(taken - computed)) <= 1e-12 * float(torch.linalg.vector_norm(computed))
        assert float(torch.linalg.vector_norm(computed - sub.anchor)) > 0.1  # the solve went somewhere


def test_the_reference_reads_the_anchors_gradient_and_evaluates_only_later_snapshots(monkeypatch):
    """`svrg_reference` with ``anchor_grad``: the data gradient at the anchor is ∇O_i(a) − l2·a, no evaluation there;
    the ``epochs`` variant's later snapshots (2 of 3 passes) are evaluated at their own points."""
    problem = shard("logistic", sparse=False, n=20)
    sub = subproblem(problem)
    anchor_grad = problem.grad(sub.anchor)
    torch.testing.assert_close(sub.data_grad_at_anchor(anchor_grad), problem.data_value_grad(sub.anchor)[1],
                               rtol=0, atol=1e-15)
    seen, data_value_grad = [], LinearModelShard.data_value_grad

    def spy(self, w):
        seen.append(torch.equal(w, sub.anchor))
        return data_value_grad(self, w)

    monkeypatch.setattr(LinearModelShard, "data_value_grad", spy)
    svrg_reference(sub, LocalSolver("svrg", passes=3), torch.Generator().manual_seed(11), anchor_grad)
    assert seen == [False, False]
    seen.clear()
    svrg_reference(sub, LocalSolver("svrg", passes=3), torch.Generator().manual_seed(11))
    assert seen == [True, False, False]


def test_sparse_rescaling_keeps_the_iterates_when_the_prox_weight_dominates():
    # mu = 50 against row smoothness ~1: 1 - lr (l2 + mu) ~ 0.02, so the kernel folds alpha into u every step or two
    problem = shard("logistic", sparse=True)
    sub = subproblem(problem, mu=50.0)
    solver = LocalSolver("svrg", passes=2)
    fast = svrg(sub, solver, torch.Generator().manual_seed(3))
    reference = svrg_reference(sub, solver, torch.Generator().manual_seed(3))
    torch.testing.assert_close(fast, reference, rtol=1e-12, atol=1e-14)


def test_matlab_variant_is_one_snapshot_and_rows_drawn_with_replacement():
    # A tiny ridge shard: 6 rows, d = 2, squared loss, written out by hand in numpy.
    rng = np.random.default_rng(2)
    X, y = rng.standard_normal((6, 2)), rng.standard_normal(6)
    n, weight, l2, mu, passes = 6, 1 / 6, 0.1, 0.2, 2
    problem = LinearModelShard(torch.from_numpy(X), torch.from_numpy(y), SQUARED, l2=l2, weight=weight)
    anchor, linear = np.array([0.5, -0.2]), np.array([0.1, 0.3])
    sub = Subproblem(problem, torch.from_numpy(anchor), torch.from_numpy(linear), mu, l2)

    draws = torch.randint(0, n, (passes * n,), generator=torch.Generator().manual_seed(4)).numpy()
    assert len(set(draws.tolist())) < len(draws)  # with replacement: this seed repeats a row
    lr = 1.0 / (n * weight * float((X * X).sum(1).max()) + l2 + mu)
    snapshot = anchor.copy()  # the only snapshot
    full = weight * X.T @ (X @ snapshot - y)
    w = anchor.copy()
    for j in draws:
        correction = weight * X[j] * (X[j] @ w - X[j] @ snapshot)
        w = w - lr * (n * correction + full + l2 * w - linear + mu * (w - anchor))

    solver = LocalSolver("svrg", passes=passes, variant="matlab")
    for solve in (svrg, svrg_reference):
        got = solve(sub, solver, torch.Generator().manual_seed(4)).numpy()
        np.testing.assert_allclose(got, w, rtol=1e-13, atol=1e-15)
    epochs = svrg(sub, LocalSolver("svrg", passes=passes), torch.Generator().manual_seed(4)).numpy()
    assert np.abs(epochs - w).max() > 1e-6  # the default variant is a different method


def test_bad_variant_names_the_key_and_value():
    with pytest.raises(ConfigError, match=r"problem\.svrg_variant must be one of epochs\|matlab, got 'jakub'"):
        LocalSolver("svrg", variant="jakub")


def test_auto_passes_are_c_kappa_steps_between_the_papers_three_and_the_cap():
    # passes = ceil(c * b / (lr * (lam + mu) * n)), clipped to [3, 1000]: c kappa steps of b rows
    c = AUTO_PASSES_CONTRACTION
    assert svrg_passes("auto", lr=1e-2, shrink=1e-2, n=100, b=1) == math.ceil(c * 1e4 / 100) == round(100 * c)  # kappa = 1e4
    assert svrg_passes("auto", lr=1e-2, shrink=1e-2, n=100, b=4) == math.ceil(4 * c * 1e4 / 100) == round(400 * c)
    assert svrg_passes("auto", lr=0.5, shrink=0.5, n=100, b=1) == AUTO_PASSES_MIN == 3  # kappa = 4 < n: the paper's
    assert svrg_passes("auto", lr=1e-6, shrink=1e-6, n=10, b=1) == AUTO_PASSES_MAX  # kappa = 1e12: the cap
    assert svrg_passes("auto", lr=1.0, shrink=0.0, n=10, b=1) == AUTO_PASSES_MAX  # no strong convexity: the cap
    assert svrg_passes(7, lr=1e-6, shrink=1e-6, n=10, b=1) == 7  # a number is used as given
    # on a shard: lr = 1 / (n L_row + lam + mu), so kappa = 1 + n L_row / (lam + mu)
    problem = shard("logistic", sparse=False)
    sub = subproblem(problem, mu=1e-4)
    lr, shrink, steps, b, passes = svrg_constants(sub, LocalSolver("svrg", passes="auto"))
    kappa = 1 + problem.n_local * problem.row_smoothness() / (problem.l2 + 1e-4)
    assert lr * shrink == pytest.approx(1 / kappa, rel=1e-12) and steps == problem.n_local and b == 1
    assert passes == min(max(math.ceil(c * kappa / problem.n_local), 3), AUTO_PASSES_MAX) > 3


@pytest.mark.parametrize("lr, shrink", [(1e-2, math.nan), (math.nan, 1e-2), (0.0, math.inf), (math.inf, 1e-2),
                                        (-1e-2, 1e-2)])
def test_auto_passes_of_a_nan_curvature_or_a_step_that_is_no_step_name_it(lr, shrink):
    """A λ + μ of nan (DANE's safeguard's μ was nan) raised "cannot convert float NaN to integer" from math.ceil;
    γ = 1/(n L_row + inf) = 0 the same; a step of inf or below 0 gave the paper's 3 passes silently."""
    with pytest.raises(ValueError, match=rf"^svrg_passes: passes=auto needs a finite step lr > 0 and a curvature "
                                         rf"shrink = lambda \+ mu that is a number, got lr={lr!r}, shrink={shrink!r}$"):
        svrg_passes("auto", lr=lr, shrink=shrink, n=100, b=1)
    assert svrg_passes(7, lr=lr, shrink=shrink, n=100, b=1) == 7  # a number is used as given
    assert svrg_passes("auto", lr=lr, shrink=shrink, n=0, b=1) == AUTO_PASSES_MIN  # no rows: no step taken


def test_local_tol_is_a_relative_tolerance_in_0_1():
    """``problem.local_tol`` >= 1 stopped CG, Newton and L-BFGS at once (0 products, no progress, exit 0); 0 is a
    fixed count (`LocalSolver`'s check)."""
    for bad in (1, 1.0, 5):
        with pytest.raises(ConfigError, match=rf"^problem\.local_tol must be in \[0, 1\), got {bad}$"):
            LocalSolver("cg", tol=bad)
    assert LocalSolver("cg", tol=0, max_iter=4).tol == 0 and LocalSolver("lbfgs", tol=0.999).tol == 0.999


def test_auto_passes_solve_the_subproblem_to_a_fixed_accuracy_where_three_do_not():
    # From w = 0, the error relative to the start is ||w - w*|| / ||w*||; auto promises about e^-c whatever
    # kappa / n_i (~5 and ~50 here, 6 and 53 passes), three passes do not where kappa >> n_i.
    # Measured (c = 1): auto 0.10 and 0.30, three passes 0.26 and 0.87
    problem = shard("logistic", sparse=False, n=150)
    for l2, three_misses in ((0.02, False), (0.002, True)):
        sub = Subproblem(problem, torch.zeros(problem.dim, dtype=torch.float64),
                         0.1 * torch.ones(problem.dim, dtype=torch.float64), 0.0, l2)
        exact = svrg(sub, LocalSolver("svrg", passes=1000), torch.Generator().manual_seed(1))

        def error(passes) -> float:
            w = svrg(sub, LocalSolver("svrg", passes=passes), torch.Generator().manual_seed(2))
            return float(torch.linalg.vector_norm(w - exact) / torch.linalg.vector_norm(exact))

        assert error("auto") <= math.exp(-AUTO_PASSES_CONTRACTION), l2
        assert (error(3) > math.exp(-AUTO_PASSES_CONTRACTION)) == three_misses, l2


def test_bad_passes_name_the_key_and_value():
    for bad in (0, "fast", True, 2.5):
        with pytest.raises(ConfigError, match=rf"problem\.svrg_passes must be a positive integer or auto, got {bad!r}"):
            LocalSolver("svrg", passes=bad)


def test_numba_is_imported_by_the_first_svrg_solve_not_by_import_dane(fresh):
    """The session's fresh interpreter (`runs.FRESH_IMPORTS`): numba absent after importing dane, its GLMs and
    local solvers, present after the first svrg solve."""
    (imported, absent, _), (solve, _, present) = runs.FRESH_IMPORTS[2:4]
    assert imported == "import torch, dane.problems.glm, dane.numerics.local_solvers" and absent == ("numba",)
    assert "ls.svrg(subproblem(shard('squared', sparse=False))" in solve and present == ("numba",)
    assert "numba" not in fresh["imports"][2], "import dane imported numba"
    assert "numba" in fresh["imports"][3]
