"""``data.standardize=numeric|all|none`` and ``problem.standardize_target`` (issue 23, item 6)."""
from __future__ import annotations

import numpy as np
import pytest

import dane
from dane.data.files import CSVSource
from dane.errors import ConfigError


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
