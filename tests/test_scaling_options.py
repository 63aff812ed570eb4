"""``data.standardize=numeric|all|none`` (CSV, dense and sparse NPZ, LIBSVM) and ``problem.standardize_target``
(issue 23, item 6)."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse
import yaml

import dane
from dane.data.files import CSVSource, LibSVMSource, NPZSource, save_npz
from dane.errors import ConfigError
from dane.problems.linear_models import LinearModelConfig


def write_table(path, n=60, seed=0):
    """Two numeric columns, a categorical column with one rare value, and a target of scale 1e5."""
    rng = np.random.default_rng(seed)
    a, b = rng.normal(5.0, 3.0, n), rng.normal(-2.0, 0.1, n)
    color = np.array(["red"] * (n - 3) + ["blue"] * 3)
    y = 1e5 * (1.0 + 0.5 * a + b) + rng.normal(0, 10.0, n)
    lines = ["a,color,b,y"] + [f"{a[i]:.17g},{color[i]},{b[i]:.17g},{y[i]:.17g}" for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return a, b, color, y


@pytest.mark.parametrize("mode,alias", [("numeric", True), ("none", False), ("all", None)])
def test_standardize_modes_and_their_boolean_aliases(tmp_path, mode, alias):
    a, b, color, _ = write_table(tmp_path / "t.csv")
    table = CSVSource(str(tmp_path / "t.csv"), target="y", categorical=("color",), standardize=mode).load()
    assert table.feature_names == ["a", "color=blue", "color=red", "b"]
    onehot = np.column_stack([color == "blue", color == "red"]).astype(float)
    if mode == "none":
        np.testing.assert_array_equal(table.X, np.column_stack([a, onehot, b]))
    else:
        z = lambda c: (c - c.mean()) / c.std()  # noqa: E731
        np.testing.assert_allclose(table.X[:, [0, 3]], np.column_stack([z(a), z(b)]), rtol=1e-12, atol=1e-12)
        expected = np.column_stack([z(onehot[:, 0]), z(onehot[:, 1])]) if mode == "all" else onehot
        np.testing.assert_allclose(table.X[:, 1:3], expected, rtol=1e-12, atol=1e-12)
        # the rare value's column: 3 of 60 rows at sqrt(57/3) = 4.36 after standardizing, 1 before
        assert table.X[:, 1].max() == pytest.approx(np.sqrt(57 / 3) if mode == "all" else 1.0, rel=1e-12)
    if alias is not None:
        same = CSVSource(str(tmp_path / "t.csv"), target="y", categorical=("color",), standardize=alias)
        assert same.standardize == mode
        np.testing.assert_array_equal(same.load().X, table.X)


def test_a_bad_standardize_value_is_one_line():
    with pytest.raises(ConfigError, match=r"data.standardize must be one of numeric\|all\|none, got 'yes'"):
        CSVSource("t.csv", target="y", standardize="yes")
    with pytest.raises(ConfigError, match="set data.standardize=none"):
        CSVSource("p-{rank}.csv", target="y", standardize="all")


def test_a_standardized_target_reports_in_the_targets_units(tmp_path):
    """GIANT is equivariant under y -> y/s (w_t -> w_t/s: its Newton directions, Armijo test and Hessian shift
    gᵀp/‖p‖² all are), so a run on the standardized target and one on the centred raw target describe the same
    iterates: O(w) = s² O'(w/s) record by record.  (Plain DANE diverges here: the rare value.)"""
    write_table(tmp_path / "t.csv")
    source = CSVSource(str(tmp_path / "t.csv"), target="y", categorical=("color",))
    table = source.load()
    X, y = table.X, table.y
    centred = dane.problems.Ridge(X, y - y.mean(), lam=1e-3, optimum="auto")
    scaled = dane.problems.Ridge(X, y, lam=1e-3, optimum="auto", standardize_target=True)
    runs = [dane.fit(p, "giant", workers=2, rounds=40, tol=1e-10) for p in (centred, scaled)]
    raw, std = runs
    assert std.status == raw.status == "converged"
    assert std.summary["rounds"] == raw.summary["rounds"] >= 2
    np.testing.assert_allclose(std.table["objective"], raw.table["objective"], rtol=1e-9)
    np.testing.assert_allclose(std.table["grad_norm"], raw.table["grad_norm"], rtol=1e-7)
    np.testing.assert_allclose(std.table["suboptimality"][:3], raw.table["suboptimality"][:3], rtol=1e-7)
    np.testing.assert_allclose(std.w.numpy(), raw.w.numpy(), rtol=1e-8)
    # against numpy: the centred ridge optimum, in y's units (objective 1e10-scale: an absolute 1e-8 means nothing)
    n = len(y)
    w_star = np.linalg.solve(X.T @ X / n + 1e-3 * np.eye(X.shape[1]), X.T @ (y - y.mean()) / n)
    objective = lambda w: 0.5 * np.mean((X @ w - (y - y.mean())) ** 2) + 0.5e-3 * w @ w  # noqa: E731
    assert objective(std.w.numpy()) == pytest.approx(std.summary["final_objective"], rel=1e-12)
    assert 0 <= objective(std.w.numpy()) - objective(w_star) <= 1e-10 * objective(w_star)  # tol=1e-10 relative
    assert any(f"prediction is {y.mean():.10g} + x.w" in note for note in std.summary["notes"])


def test_standardize_target_is_for_regression_only():
    X, y = np.eye(4), np.array([0.0, 1.0, 0.0, 1.0])
    with pytest.raises(ConfigError, match="problem.standardize_target=true scales a regression target"):
        dane.problems.LogReg(X, y, standardize_target=True)


# ---------------------------------------------------------------- data=npz and data=libsvm (dane/data/scaling.py)
def table_matrix(tmp_path, n=60):
    """write_table's features as a plain matrix: columns a, color=blue, color=red, b (as the CSV source orders them)."""
    a, b, color, y = write_table(tmp_path / "t.csv", n=n)
    onehot = np.column_stack([color == "blue", color == "red"]).astype(float)
    return np.column_stack([a, onehot, b]), y


@pytest.mark.parametrize("mode", ["numeric", "all", True])
def test_dense_npz_is_standardized_exactly_as_the_csv_path(tmp_path, mode):
    """numeric on a matrix = the columns with a value other than 0/1, which on this table are CSV's numeric columns
    (the one-hot ones are 0/1): the same statistics and the same arithmetic, so the same bits."""
    X, y = table_matrix(tmp_path)
    save_npz(tmp_path / "t.npz", X, y)
    npz = NPZSource(str(tmp_path / "t.npz"), standardize=mode).load()
    csv = CSVSource(str(tmp_path / "t.csv"), target="y", categorical=("color",), standardize=mode).load()
    np.testing.assert_array_equal(npz.X, csv.X)
    np.testing.assert_array_equal(npz.y, y)
    kept = "(the 2 with only 0/1 values kept as they are)" if mode != "all" else "to mean 0"
    assert any(kept in note for note in npz.notes), npz.notes


def test_dense_npz_constant_columns_and_the_default(tmp_path):
    """A constant column is centred to 0, not divided (as CSV's); the default (none) keeps X as saved."""
    X, y = table_matrix(tmp_path)
    X = np.column_stack([X, np.full(len(y), 0.1)])  # its std is 1.4e-17 from rounding: tested exactly, not by std
    save_npz(tmp_path / "t.npz", X, y)
    np.testing.assert_array_equal(NPZSource(str(tmp_path / "t.npz")).load().X, X)
    table = NPZSource(str(tmp_path / "t.npz"), standardize="all").load()
    np.testing.assert_array_equal(table.X[:, 4], 0.0)
    z = (X[:, :4] - X[:, :4].mean(0)) / X[:, :4].std(0)
    np.testing.assert_allclose(table.X[:, :4], z, rtol=1e-12, atol=1e-12)
    assert any("1 constant column(s) centred to 0, not scaled: 4" in note for note in table.notes)


def sparse_matrix(n=50, seed=1):
    """Sparse columns: real values (one of them with mean 40 and std 0.5, where E[x²] − m² would cancel), 0/1
    indicators (one rare), one all-zero column, one with a single stored value."""
    rng = np.random.default_rng(seed)
    real = scipy.sparse.random(n, 3, density=0.4, random_state=seed, format="csr",
                               data_rvs=lambda k: np.round(rng.normal(2.0, 3.0, k), 6)).toarray()
    shifted = np.round(40.0 + 0.5 * rng.standard_normal(n), 6)
    indicator = (rng.random((n, 2)) < [[0.3, 0.04]]).astype(float)
    single = np.zeros(n)
    single[7] = 2.5
    dense = np.column_stack([real[:, 0], indicator[:, 0], shifted, np.zeros(n), real[:, 1], indicator[:, 1],
                             single, real[:, 2]])
    return scipy.sparse.csr_matrix(dense), rng.standard_normal(n)


@pytest.mark.parametrize("kind", ["libsvm", "npz"])
@pytest.mark.parametrize("mode", ["all", "numeric"])
def test_sparse_columns_are_divided_by_their_std_not_centred(tmp_path, kind, mode):
    """Against scikit-learn's StandardScaler(with_mean=False) (which leaves zero-variance columns as they are) and
    numpy's std of the densified column: X stays CSR with the file's pattern; numeric keeps the 0/1 columns."""
    from sklearn.datasets import dump_svmlight_file
    from sklearn.preprocessing import StandardScaler

    X, y = sparse_matrix()
    if kind == "libsvm":
        dump_svmlight_file(X, np.round(y, 6), str(tmp_path / "s.svm"), zero_based=True)
        source = LibSVMSource(str(tmp_path / "s.svm"), n_features=X.shape[1], zero_based=True, standardize=mode)
    else:
        save_npz(tmp_path / "s.npz", X, y)
        source = NPZSource(str(tmp_path / "s.npz"), standardize=mode)
    table = source.load()
    assert scipy.sparse.isspmatrix_csr(table.X)
    np.testing.assert_array_equal(table.X.indptr, X.indptr)
    np.testing.assert_array_equal(table.X.indices, X.indices)
    expected = StandardScaler(with_mean=False).fit_transform(X).toarray()
    numpy_std = X.toarray().std(0)
    np.testing.assert_allclose(expected[:, [0, 2, 4, 7]], X.toarray()[:, [0, 2, 4, 7]] / numpy_std[[0, 2, 4, 7]],
                               rtol=1e-13)
    if mode == "numeric":
        expected[:, [1, 5]] = X.toarray()[:, [1, 5]]
    np.testing.assert_allclose(table.X.toarray(), expected, rtol=1e-13, atol=0)
    if mode == "all":  # under numeric the all-zero column is a 0/1 column, not chosen
        assert any("1 constant column(s) left as they are: 3" in note for note in table.notes), table.notes
    assert any("not centred" in note and "unpenalized intercept" in note for note in table.notes)


def ridge_optimum(X, y, lam, *, penalize_intercept):
    """argmin (1/2N)‖Xw + b − y‖² + (λ/2)(‖w‖² + [b²]) by a linear solve: (w, b, objective)."""
    n, d = X.shape
    A = np.column_stack([X, np.ones(n)])
    penalty = lam * np.diag(np.r_[np.ones(d), 1.0 if penalize_intercept else 0.0])
    v = np.linalg.solve(A.T @ A / n + penalty, A.T @ y / n)
    objective = 0.5 * np.mean((A @ v - y) ** 2) + 0.5 * v @ penalty @ v
    return v[:d], v[d], objective


def test_scaled_sparse_fit_is_the_standardized_fit_exactly_when_the_intercept_is_free(tmp_path):
    """w·(x − m)/s + b = w·x/s + (b − w·m/s): with an unpenalized intercept the scaled-only sparse problem and the
    densified, centred and scaled one have the same w and objective; with a penalized intercept (this package's
    problem.fit_intercept) they differ, as the note says. The package's fit (λ = 0, where its intercept is free)
    reaches the common optimum, w and objective to round-off."""
    X, _ = sparse_matrix()
    X = X[:, [0, 1, 2, 4, 5, 6, 7]]  # without the all-zero column, so that λ = 0 has one minimizer
    rng = np.random.default_rng(3)
    y = X @ rng.standard_normal(X.shape[1]) + 3.0 + 0.1 * rng.standard_normal(X.shape[0])
    save_npz(tmp_path / "s.npz", X, y)
    save_npz(tmp_path / "d.npz", X.toarray(), y)
    scaled = NPZSource(str(tmp_path / "s.npz"), standardize="all")
    full = NPZSource(str(tmp_path / "d.npz"), standardize="all").load().X
    Xs = scaled.load().X.toarray()
    shift = Xs.mean(0)  # m/s: what centring the scaled columns would subtract
    for lam in (1e-2, 1e-5, 0.0):
        w_s, b_s, o_s = ridge_optimum(Xs, y, lam, penalize_intercept=False)
        w_f, b_f, o_f = ridge_optimum(full, y, lam, penalize_intercept=False)
        np.testing.assert_allclose(w_s, w_f, rtol=1e-10)
        assert o_s == pytest.approx(o_f, rel=1e-12)
        assert b_s == pytest.approx(b_f - w_f @ shift, rel=1e-10)
        if lam > 0:  # a penalized intercept: not the same fit
            w_sp, _, _ = ridge_optimum(Xs, y, lam, penalize_intercept=True)
            w_fp, _, _ = ridge_optimum(full, y, lam, penalize_intercept=True)
            assert np.abs(w_sp - w_fp).max() > 1e-3 * lam * np.abs(w_fp).max()
    problem = LinearModelConfig(data=scaled, loss="squared", lam=0.0, fit_intercept=True)
    # DiSCO: its PCG needs no shard's Hessian to be invertible, as λ = 0 with a rare 0/1 column does not give, but
    # its preconditioner (worker 0's Hessian + μI) does: μ > 0, as the paper takes it (at μ = 0 the preconditioner's
    # CG on a singular system only got there by stopping at d products)
    result = dane.fit(problem, "disco", workers=2, rounds=20, tol=1e-12, mu=1e-3)
    assert result.status == "converged"
    np.testing.assert_allclose(result.w.numpy(), np.r_[w_f, b_f - w_f @ shift], rtol=1e-8)
    assert result.summary["final_objective"] == pytest.approx(o_f, rel=1e-10)


@pytest.mark.parametrize("workers", [1, 3])
def test_sparse_statistics_are_the_whole_files_whatever_the_workers(tmp_path, workers):
    """Every worker's rows are scaled by the whole file's std (read before the rows are dealt), so m = 1 and m = 3
    solve the same problem: both reach the numpy optimum of the globally scaled matrix."""
    from sklearn.datasets import dump_svmlight_file
    from sklearn.preprocessing import StandardScaler

    X, y = sparse_matrix()
    y = np.round(y, 6)
    dump_svmlight_file(X, y, str(tmp_path / "s.svm"), zero_based=True)
    source = LibSVMSource(str(tmp_path / "s.svm"), n_features=X.shape[1], zero_based=True, standardize="all")
    problem = LinearModelConfig(data=source, loss="squared", lam=1e-2, fit_intercept=True)
    result = dane.fit(problem, "disco", workers=workers, rounds=20, tol=1e-12)  # ~17 rows a shard, d = 9: DiSCO
    assert result.status == "converged"
    Xs = StandardScaler(with_mean=False).fit_transform(X).toarray()
    w, b, objective = ridge_optimum(Xs, y, 1e-2, penalize_intercept=True)
    np.testing.assert_allclose(result.w.numpy(), np.r_[w, b], rtol=1e-8, atol=1e-12)
    assert result.summary["final_objective"] == pytest.approx(objective, rel=1e-10)


def test_npz_and_libsvm_standardize_errors_are_one_line():
    for make in (lambda **k: NPZSource("t.npz", **k), lambda **k: LibSVMSource("t.svm", **k)):
        with pytest.raises(ConfigError, match=r"^data.standardize must be one of numeric\|all\|none, got 'yes'$"):
            make(standardize="yes")
        assert make(standardize=False).standardize == "none" and make(standardize=True).standardize == "numeric"
    with pytest.raises(ConfigError, match="own statistics; standardize when you write the parts and set "
                                          "data.standardize=none"):
        NPZSource("p-{rank}.npz", standardize="all")
    with pytest.raises(ConfigError, match="set data.standardize=none"):
        LibSVMSource("p-{rank}.svm", n_features=3, zero_based=True, standardize="numeric")


@pytest.mark.parametrize("name", ["npz", "libsvm"])
def test_the_data_configs_default_to_none_and_accept_the_modes(tmp_path, name):
    """conf/data/{npz,libsvm}.yaml build their source with standardize: none, and data.standardize=all is a key."""
    from dane.api import CONF_DIR

    keys = yaml.safe_load((CONF_DIR / "data" / f"{name}.yaml").read_text())
    target = keys.pop("_target_").rsplit(".", 1)[1]
    assert keys["standardize"] == "none"
    X, y = table_matrix(tmp_path)
    save_npz(tmp_path / "t.npz", X, y)
    from sklearn.datasets import dump_svmlight_file

    dump_svmlight_file(X, y, str(tmp_path / "t.svm"), zero_based=True)
    keys.update(path=str(tmp_path / f"t.{'npz' if name == 'npz' else 'svm'}"), data_dir=None, standardize="all")
    table = {"NPZSource": NPZSource, "LibSVMSource": LibSVMSource}[target](**keys).load()
    dense = table.X.toarray() if scipy.sparse.issparse(table.X) else table.X
    divided = X / X.std(0)
    expected = divided if name == "libsvm" else divided - divided.mean(0)
    np.testing.assert_allclose(dense, expected, rtol=1e-9, atol=1e-12)
