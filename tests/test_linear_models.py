"""Linear models on data: derivatives against autograd, every local solver against the Cholesky path,
sparse against dense, the reference optimum against scipy, and the Python API end to end."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.optimize
import scipy.sparse
import torch

import dane
from dane.errors import ConfigError
from dane.numerics.local_solvers import LocalSolver
from dane.losses import LOGISTIC, SOFTMAX, SQUARED
from dane.problems.glm import LinearModelShard, to_torch
from dane.problems.optimum import solve as solve_reference
from dane.loop.reference import attach_all


def data(n=240, d=12, *, classes=None, sparse=False, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)) * np.linspace(1.0, 0.2, d)
    if sparse:
        X = scipy.sparse.random(n, d, density=0.3, format="csr", random_state=seed, data_rvs=rng.standard_normal)
    w = rng.standard_normal(d)
    z = X @ w
    if classes is None:
        return X, z + 0.1 * rng.standard_normal(n)
    if classes == 2:
        return X, np.where(z + 0.5 * rng.standard_normal(n) > 0, 1.0, -1.0)
    return X, rng.integers(0, classes, n)


def shard(X, y, loss, *, classes=1, l2=0.01, weight=None, **kw):
    yt = torch.as_tensor(y, dtype=torch.int64 if loss is SOFTMAX else torch.float64)
    return LinearModelShard(to_torch(X), yt, loss, l2=l2, weight=weight or 1 / X.shape[0], classes=classes, **kw)


CASES = [(SQUARED, None, 1), (LOGISTIC, 2, 1), (SOFTMAX, 4, 4)]


@pytest.mark.parametrize("loss, labels, classes", CASES, ids=lambda c: getattr(c, "name", None))
def test_gradient_and_hessian_vector_equal_autograd(loss, labels, classes):
    X, y = data(classes=labels)
    p = shard(X, y, loss, classes=classes)
    gen = torch.Generator().manual_seed(1)
    w, v = torch.randn(p.dim, generator=gen, dtype=torch.float64), torch.randn(p.dim, generator=gen, dtype=torch.float64)
    grad_auto = torch.func.grad(p.objective)(w)
    hvp_auto = torch.func.jvp(torch.func.grad(p.objective), (w,), (v,))[1]
    grad, metrics = p.evaluate(w)
    torch.testing.assert_close(grad, grad_auto, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(p.hessian_vector(v, at=w), hvp_auto, rtol=1e-11, atol=1e-13)
    torch.testing.assert_close(metrics[0], p.objective(w), rtol=0, atol=1e-14)
    torch.testing.assert_close(p.dense_hessian(w) @ v + p.l2 * v, hvp_auto, rtol=1e-11, atol=1e-13)
    # without a point: the majorant c_f X^T X / N + l2 I dominates every Hessian
    H_major = torch.stack([p.hessian_vector(e) for e in torch.eye(p.dim, dtype=torch.float64)])
    gap = torch.linalg.eigvalsh(H_major - p.dense_hessian(w) - p.l2 * torch.eye(p.dim, dtype=torch.float64))
    assert float(gap.min()) >= -1e-12


@pytest.mark.parametrize("loss, labels, classes", CASES, ids=lambda c: getattr(c, "name", None))
# SVRG's bound is loose on purpose: 3 epochs at step 1/L_max contract the error of this
# subproblem (condition number ~10) to 0.077 / 0.017 / 0.0027 (squared / logistic / softmax);
# its rate is what the next assertion checks.
@pytest.mark.parametrize("method, tol", [("cg", 1e-9), ("lbfgs", 1e-7), ("svrg", 0.1)])
def test_local_solvers_agree_with_the_cholesky_path(loss, labels, classes, method, tol):
    # A DANE subproblem (linear term and prox weight) on one of 4 shards.
    X, y = data(classes=labels)
    p = shard(X[:60], y[:60], loss, classes=classes, weight=4 / 240, seed=3)
    gen = torch.Generator().manual_seed(2)
    anchor = 0.3 * torch.randn(p.dim, generator=gen, dtype=torch.float64)
    linear = 0.1 * torch.randn(p.dim, generator=gen, dtype=torch.float64)
    mu = 0.5  # well conditioned: SVRG's 3 passes get close; its error is what we bound
    reference = p.prox_solve(anchor, linear, mu, solver=LocalSolver("cholesky", tol=1e-14))
    stationarity = p.evaluate(reference)[0] - linear + mu * (reference - anchor)
    assert float(stationarity.norm()) <= 1e-12
    solver = LocalSolver(method, tol=1e-12, passes=3 if method == "svrg" else 3)
    w = p.prox_solve(anchor, linear, mu, solver=solver)
    err = float((w - reference).norm() / (reference - anchor).norm())
    assert err <= tol
    if method == "svrg":  # more passes get closer: 7 more epochs gain more than 1000x (measured 5000x and more)
        w10 = p.prox_solve(anchor, linear, mu, solver=LocalSolver("svrg", passes=10))
        assert float((w10 - reference).norm() / (reference - anchor).norm()) <= 1e-3 * err


def test_cg_with_a_fixed_iteration_count_stops_there():
    X, y = data(d=40)
    p = shard(X, y, SQUARED)
    g = torch.ones(p.dim, dtype=torch.float64)
    one = p.solve_hessian(g, at=g, shift=0.0, with_reg=True, solver=LocalSolver("cg", tol=0, max_iter=1))
    # one CG step from 0 is the exact line minimizer along g: alpha = g.g / g.Hg
    Hg = p.hessian_vector(g, at=g)
    torch.testing.assert_close(one, (g @ g) / (g @ Hg) * g, rtol=1e-12, atol=0)


@pytest.mark.parametrize("loss, labels, classes", CASES, ids=lambda c: getattr(c, "name", None))
def test_sparse_design_matrix_gives_the_dense_iterates(loss, labels, classes):
    X, y = data(sparse=True, classes=labels)
    cfg_sparse = dane.problems.Ridge if loss is SQUARED else dane.problems.LogReg if loss is LOGISTIC else dane.problems.Softmax
    runs = {}
    for name, matrix in (("sparse", X), ("dense", X.toarray())):
        result = dane.fit(cfg_sparse(matrix, y, lam=0.05, local_solver="cg", optimum="auto"), "dane", workers=3, rounds=4)
        runs[name] = result
    assert "sparse X" in " ".join(runs["sparse"].summary["notes"]) and "dense X" in " ".join(runs["dense"].summary["notes"])
    # The sparse and dense kernels sum in different orders, and Newton-CG stops at a relative
    # gradient of 1e-10 with a sqrt forcing term, so the two agree to ~1e-9, not to the last bit.
    for a, b in zip(runs["sparse"].records, runs["dense"].records):
        assert a["suboptimality"] == pytest.approx(b["suboptimality"], rel=1e-7, abs=1e-14)
    torch.testing.assert_close(runs["sparse"].w, runs["dense"].w, rtol=0, atol=1e-8)


def test_sparse_shard_stays_sparse():
    X, y = data(n=100, d=5000, sparse=True)
    p = shard(X, y, SQUARED)
    assert p.X.layout == torch.sparse_csr and p.solver.method == "cg"  # auto: no d x d matrix for sparse X
    assert p.X.values().numel() == X.nnz


@pytest.mark.parametrize("loss, labels, classes", CASES[1:], ids=lambda c: getattr(c, "name", None))
def test_reference_optimum_matches_scipy(loss, labels, classes):
    X, y = data(classes=labels)
    full = shard(X, y, loss, classes=classes)
    w = solve_reference([full]).w

    def fun(x):
        wt = torch.from_numpy(x)
        return float(full.objective(wt)), full.evaluate(wt)[0].numpy()

    ref = scipy.optimize.minimize(fun, np.zeros(full.dim), jac=True, method="BFGS", options={"gtol": 1e-10})
    assert float(full.objective(w)) <= ref.fun + 1e-14
    assert float(full.evaluate(w)[0].norm()) <= 1e-12
    np.testing.assert_allclose(w.numpy(), ref.x, rtol=0, atol=1e-6)


def test_ridge_optimum_is_the_closed_form():
    X, y = data()
    cfg = dane.problems.Ridge(X, y, lam=0.02)
    w_star = solve_reference([cfg.build(rank, 2) for rank in range(2)]).w
    n, d = X.shape
    closed = np.linalg.solve(X.T @ X / n + 0.02 * np.eye(d), X.T @ y / n)
    np.testing.assert_allclose(w_star.numpy(), closed, rtol=0, atol=1e-12)


def test_fit_runs_dane_to_the_optimum_and_returns_records():
    X, y = data(n=400, d=10, classes=2)
    result = dane.fit(dane.problems.LogReg(X, y, lam=0.01, optimum="auto"), "dane", workers=4, rounds=30, tol=1e-10)
    assert result.status == "converged"
    assert result.records[-1]["suboptimality"] <= 1e-10
    assert result.table["round"] == list(range(len(result.records)))
    assert result.w.shape == (10,)
    assert result.records[-1]["comm_rounds"] == 2 * result.records[-1]["round"]


def test_fit_rejects_bad_input_with_one_line():
    X, y = data()
    with pytest.raises(ConfigError) as err:
        dane.problems.Ridge(X, y[:-1])
    assert str(err.value) == f"X has {len(X)} rows but y has {len(X) - 1} entries; give one label per row"
    with pytest.raises(ConfigError, match="^algorithm 'nope' is unknown; choose one of: acc_sdane, adiana, "):
        dane.fit(dane.problems.Ridge(X, y), "nope")
    with pytest.raises(ConfigError) as err:
        dane.fit(dane.problems.Ridge(X, y), "dane", etaa=1.0)
    assert str(err.value) == "algorithm dane has no key(s) etaa; its keys: eta, mu, safeguard"
    with pytest.raises(ConfigError) as err:
        dane.fit(dane.problems.Ridge(X, y), "dane", eta=-1.0)
    assert str(err.value) == "algorithm.eta must be > 0, got -1.0"
    with pytest.raises(ConfigError) as err:
        dane.problems.Ridge(X, y, local_solver="qr")
    assert str(err.value) == "problem.local_solver must be one of auto|cholesky|cg|svrg|lbfgs, got 'qr'"


@pytest.mark.parametrize("name, data, dim", [("ridge", "diabetes", 11), ("logreg", "breast_cancer", 31),
                                             ("softmax", "digits", 650)])
def test_every_linear_model_config_builds_with_its_default_data(name, data, dim):
    from helpers import composed

    from dane.api import build
    from dane.problems.linear_models import LinearModelConfig

    cfg = composed(f"problem={name}", "problem.optimum=auto")
    assert cfg.data.get("name") == data or cfg.data.get("dataset") == data
    problem = build(cfg, "problem")
    assert isinstance(problem, LinearModelConfig) and problem.name == name
    problem.check_workers(3)
    shards = [problem.build(rank, 3) for rank in range(3)]
    assert shards[0].metric_names == ("objective",)  # no reference unless asked for
    attach_all(problem, shards)
    assert shards[0].dim == dim and shards[0].metric_names == ("objective", "suboptimality")
    w_star = shards[0].w_star
    grads, metrics = zip(*(s.evaluate(w_star) for s in shards))
    assert float(sum(m[1] for m in metrics)) / 3 == pytest.approx(0.0, abs=1e-12)  # O(w*) - O* = 0
    assert float(torch.linalg.vector_norm(sum(grads) / 3)) <= 1e-10


def test_shards_are_the_rows_each_worker_holds():
    X, y = data(n=101, d=5)
    cfg = dane.problems.Ridge(X, y, lam=0.1, seed=7)
    rows = dane.shards(101, 3, seed=7)
    assert sorted(np.concatenate(rows).tolist()) == list(range(101)) and [len(r) for r in rows] == [34, 34, 33]
    for rank in range(3):
        torch.testing.assert_close(cfg.build(rank, 3).X, torch.from_numpy(X[rows[rank]]), rtol=0, atol=0)


def test_one_source_read_for_two_configs_gives_each_its_own_rows():
    """The per-process table cache is keyed by what `table` does to the rows too: one source with and without an
    intercept, then as ridge and as logistic regression, gives each config its own X and labels."""
    from dane.data.builtin_source import BuiltinSource
    from dane.problems.linear_models import LinearModelConfig

    source = BuiltinSource(dataset="breast_cancer")
    plain, with_one = (LinearModelConfig(data=source, loss="logistic", lam=0.1, fit_intercept=f).table()
                       for f in (False, True))
    assert (plain.d, with_one.d) == (30, 31) and np.all(with_one.X[:, -1] == 1.0)
    squared = LinearModelConfig(data=source, loss="squared", lam=0.1, fit_intercept=False).table()
    logistic = LinearModelConfig(data=source, loss="logistic", lam=0.1, fit_intercept=False).table()
    assert set(np.unique(squared.y)) == {0.0, 1.0} and set(np.unique(logistic.y)) == {-1.0, 1.0}


def test_svrg_runs_on_a_sparse_shard_and_matches_the_dense_one():
    X, y = data(sparse=True, classes=2)
    sparse, dense = (shard(M[:60], y[:60], LOGISTIC, weight=4 / 240, seed=5) for M in (X, X.toarray()))
    assert sparse.row_smoothness() == pytest.approx(dense.row_smoothness(), rel=1e-14)
    anchor, linear = torch.zeros(sparse.dim, dtype=torch.float64), torch.full((sparse.dim,), 0.05, dtype=torch.float64)
    w_sparse, w_dense = (p.prox_solve(anchor, linear, 0.5, solver=LocalSolver("svrg", passes=2)) for p in (sparse, dense))
    torch.testing.assert_close(w_sparse, w_dense, rtol=0, atol=1e-12)  # same seeded row order, same steps


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("loss, labels, classes", CASES, ids=lambda c: getattr(c, "name", None))
def test_local_metrics_are_evaluates_metrics_bit_for_bit(loss, labels, classes, sparse):
    """The forward-only metric vector (the records' payload where no gradient rides) equals `evaluate`'s, bit for
    bit, with and without a reference optimum (a quadratic's suboptimality is ½ eᵀHe), and counts no local work."""
    from dane import work

    X, y = data(classes=labels, sparse=sparse)
    p = shard(X, y, loss, classes=classes)
    gen = torch.Generator().manual_seed(3)
    points = [torch.randn(p.dim, generator=gen, dtype=torch.float64) for _ in range(5)]
    for with_optimum in (False, True):
        if with_optimum:
            p.set_reference(points[0] / 3, float(p.objective(points[0] / 3)))
        ledger = work.Ledger(range(1), np.ones(len(work.COUNTS)))
        with work.opened(ledger):
            for w in points:
                metrics = p.local_metrics(w)
                assert len(metrics) == 1 + with_optimum and torch.equal(metrics, p.evaluate(w)[1])
        passes = ledger.counts[0, work.COUNTS.index("local_passes")]
        assert passes == len(points) and ledger.counts.sum() == len(points)  # evaluate's passes alone



def _bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit (torch.equal takes −0 for 0)."""
    return a.shape == b.shape and torch.equal(a.view(torch.int64), b.view(torch.int64))


def _uncached_product(p: LinearModelShard, v: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """∇²D_i(at) v by the loss's ``hess`` at margins made afresh: `hessian_vector`'s formula before its curvature cache."""
    return p.weight * (p.XT @ p.loss.hess(p.margins(at), p.y, p.margins(v))).reshape(-1)


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("loss, labels, classes", CASES, ids=lambda c: getattr(c, "name", None))
def test_hessian_products_from_the_cached_curvature_are_the_uncached_formulas_bits(loss, labels, classes, sparse):
    """`hessian_vector` at a point keeps f'' there (the loss's ``second_derivative``; softmax: the margins, for
    ``hess``) for the products after the first: each is the uncached formula's result bit for bit, and f'' dz is
    ``hess(z, y, dz)`` bit for bit (σ(z)σ(−z)dz is evaluated (σ(z)σ(−z))dz either way)."""
    X, y = data(classes=labels, sparse=sparse)
    p = shard(X, y, loss, classes=classes)
    gen = torch.Generator().manual_seed(4)
    at = torch.randn(p.dim, generator=gen, dtype=torch.float64)
    for _ in range(4):  # the first product fills the cache, the others read it
        v = torch.randn(p.dim, generator=gen, dtype=torch.float64)
        assert _bits(p.hessian_vector(v, at=at, with_reg=False), _uncached_product(p, v, at))
        assert _bits(p.hessian_vector(v, at=at), _uncached_product(p, v, at) + p.l2 * v)
    assert (loss.second_derivative is None) == (loss is SOFTMAX)
    if loss.second_derivative is not None:
        z, dz = p.margins(at), p.margins(torch.randn(p.dim, generator=gen, dtype=torch.float64))
        assert _bits(loss.second_derivative(z, p.y) * dz, loss.hess(z, p.y, dz))


@pytest.mark.parametrize("loss, labels, classes", CASES, ids=lambda c: getattr(c, "name", None))
def test_a_hessian_product_at_a_new_point_takes_the_new_points_curvature(loss, labels, classes):
    """The curvature cache is keyed by the point's value: a product at another point, at the first point again, or at
    the caller's own tensor changed in place after a product, is made with the curvature there, not the one kept."""
    X, y = data(classes=labels)
    p = shard(X, y, loss, classes=classes)
    gen = torch.Generator().manual_seed(5)
    w1, w2, v = (torch.randn(p.dim, generator=gen, dtype=torch.float64) for _ in range(3))
    for point in (w1, w2, w1):
        assert _bits(p.hessian_vector(v, at=point, with_reg=False), _uncached_product(p, v, point))
    at = w2.clone()
    p.hessian_vector(v, at=at, with_reg=False)  # the cache now at this tensor's point (w2)
    at.copy_(w1)  # the same tensor, now another point
    got = p.hessian_vector(v, at=at, with_reg=False)
    assert _bits(got, _uncached_product(p, v, w1))
    if loss is not SQUARED:  # its curvature is the same everywhere: a stale one would go unseen
        assert not torch.equal(got, _uncached_product(p, v, w2))


def _ridge_closed_form(X, y, lam):
    """w* and O* of ridge with an intercept column (penalized, as `LinearModelConfig` fits it), in float64."""
    A = np.hstack([X, np.ones((len(y), 1))])
    w = np.linalg.solve(A.T @ A / len(y) + lam * np.eye(A.shape[1]), A.T @ y / len(y))
    return w, 0.5 * np.mean((A @ w - y) ** 2) + 0.5 * lam * w @ w


@pytest.mark.parametrize("kind", ["csv", "npz"])
def test_a_data_file_rewritten_in_the_process_is_read_again(tmp_path, kind):
    """The process keeps the table it read, keyed by the file's stamp (path, size, mtime, inode), not by the source's
    repr alone: a notebook that rewrites its file and fits the same problem again fits the new rows (it fitted the
    old ones), while an unchanged file is not read again.  The npz is rewritten with arrays of the same shapes, so
    the file's size is the same."""
    from dane.data.files import CSVSource, NPZSource, save_npz

    rng = np.random.default_rng(3)
    X = rng.standard_normal((40, 3))
    path = tmp_path / f"rows.{kind}"

    def write(y):
        if kind == "npz":
            save_npz(path, X, y)
        else:
            lines = ["a,b,c,t"] + [",".join(repr(float(v)) for v in (*row, t)) for row, t in zip(X, y)]
            path.write_text("\n".join(lines) + "\n")

    source = (NPZSource(str(path)) if kind == "npz" else CSVSource(str(path), target="t", standardize="none"))
    problem = dane.problems.Ridge(data=source, lam=1e-2)
    for y in (X @ [1.0, 2.0, 3.0], 10 * X @ [1.0, -2.0, 0.5] + 5):
        write(y)
        result = dane.fit(problem, "dane", workers=2, rounds=20, tol=1e-14)
        w_star, objective = _ridge_closed_form(X, y, 1e-2)
        np.testing.assert_allclose(result.w, w_star, rtol=0, atol=1e-10)
        assert result.records[-1]["objective"] == pytest.approx(objective, rel=1e-12)
        assert problem.table() is problem.table()  # unchanged since: kept, not read again


def test_a_source_of_ones_own_without_a_repr_is_not_taken_for_the_one_before_it_at_its_address():
    """A source of one's own (docs/extending.md: ``name``, ``presharded``, ``load()``) without a ``__repr__`` is keyed
    by its address; the cache holds the source, so a new source cannot take the address of the one whose table
    it keeps (CPython gave the next object the freed one's address, and the new source was served the old rows)."""
    from dane.data.table import Table

    class Scaled:
        presharded, name = False, "scaled"

        def __init__(self, scale):
            self.scale = scale

        def load(self):
            X = np.arange(12.0).reshape(6, 2)
            return Table(X, self.scale * X.sum(1), self.name, [])

    for scale in (1.0, 2.0, 3.0):
        source = Scaled(scale)
        y = dane.problems.Ridge(data=source, fit_intercept=False).table().y
        np.testing.assert_array_equal(y, scale * np.arange(12.0).reshape(6, 2).sum(1))
        del source  # its address free for the next one, but for the cache's hold on it


def test_a_builtin_data_file_rewritten_in_the_process_is_read_again(tmp_path):
    """The built-in sets read from files (admissions here) are kept per process by the files' stamps too, by the
    convex problems (``data=builtin``) and by the networks."""
    from dane.data.builtin_source import BuiltinSource
    from dane.problems.neural import DataConfig, NeuralProblemConfig

    def write(admit):
        rows = [f"{a},{400 + 10 * k},{3.0 + k / 100},{1 + k % 4}" for k, a in enumerate(admit)]
        (tmp_path / "admissions.csv").write_text("admit,gre,gpa,rank\n" + "\n".join(rows) + "\n")

    network = NeuralProblemConfig(data=DataConfig(dataset="admissions", data_dir=str(tmp_path)))
    convex = dane.problems.LogReg(data=BuiltinSource(dataset="admissions", data_dir=str(tmp_path)))
    for admit in ([0, 1] * 10, [1, 1, 0, 1] * 5):
        write(admit)
        data = network.dataset()
        assert sorted(data.train_y.tolist() + data.test_y.tolist()) == sorted(admit)
        np.testing.assert_array_equal(convex.table().y, 2.0 * np.array(admit) - 1.0)  # the logistic loss's ±1
