"""scripts/bench_defaults.py --quick: the JSON's arithmetic, and one tiny cell's numbers against numpy."""
from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from dane.synthetic.defaults_data import ill_conditioned, large_targets, rare_onehot
from tests.helpers import REPO


def load_script():
    spec = importlib.util.spec_from_file_location("bench_defaults", REPO / "scripts" / "bench_defaults.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    out.write_text(json.dumps({"other": {"kept": 1}}))
    bench = load_script()
    bench.main(["--quick", "--out", str(out), "--only", "gd", "dane"])
    return bench, json.loads(out.read_text())


def test_the_json_is_merged_and_its_arithmetic_holds(quick):
    bench, whole = quick
    assert whole["other"] == {"kept": 1}
    report = whole["defaults"]
    (key, cell), = report["cells"].items()
    assert key == "large_targets/ridge/lam=0.001/m=4" and set(cell["methods"]) == {"gd", "dane"}
    for method, row in cell["methods"].items():
        reached = [g for g in row["grid"] if g["reached"]]
        assert len(row["grid"]) == len(bench.METHODS[method][2]) and reached
        best = min(g["comm_rounds"] for g in reached)
        assert row["best"]["comm_rounds"] == best
        assert row["ratio"] == pytest.approx(row["default"]["comm_rounds"] / best)
        assert row["within_factor"] == (row["ratio"] <= bench.METHODS[method][3])
        assert row["no_divergence"] and row["default"]["status"] == "converged"
        for run in [row["default"], *row["grid"]]:
            if run["reached"]:
                assert run["best_rel_suboptimality"] <= 1e-8 and run["peak_rise"] >= 1.0
    assert report["misses"] == bench.misses(report)
    assert len(cell["methods"]["dane"]["grid"]) == 9  # the fixed-mu grid of issue 23


def test_gd_rounds_match_numpy_gradient_descent(quick):
    """GD at lr = c/L on the quick cell, replayed in numpy: the same round reaches relative 1e-8."""
    bench, whole = quick
    cell = whole["defaults"]["cells"]["large_targets/ridge/lam=0.001/m=4"]
    X, y, _ = large_targets("squared", n=400)
    Z = np.hstack([X, np.ones((400, 1))])
    lam, n = 1e-3, 400
    H, b = Z.T @ Z / n + lam * np.eye(Z.shape[1]), Z.T @ y / n
    objective = lambda w: 0.5 * np.mean((Z @ w - y) ** 2) + 0.5 * lam * w @ w  # noqa: E731
    f_star = objective(np.linalg.solve(H, b))
    L = np.linalg.eigvalsh(H)[-1]
    assert cell["L"] == pytest.approx(L, rel=1e-12)
    for run in cell["methods"]["gd"]["grid"]:
        w, rounds = np.zeros(Z.shape[1]), 0
        while (objective(w) - f_star) / abs(f_star) > 1e-8:
            w, rounds = w - run["settings"]["lr_times_L"] / L * (H @ w - b), rounds + 1
        assert run["rounds"] == rounds and run["comm_rounds"] == rounds  # one allreduce a round, lr given


@pytest.mark.parametrize("family", [rare_onehot, large_targets, ill_conditioned])
def test_the_families_have_the_property_they_are_named_for(family):
    X, y, _ = family("squared")
    if family is rare_onehot:
        counts = X[:, -4:].sum(0)
        assert counts[-1] == 3 and counts[:-1].min() > 500  # 3 rows of 2000: some of 4 or 8 shards hold none
    elif family is large_targets:
        assert 1e5 < np.abs(y).mean() < 1e6
    else:
        eig = np.linalg.eigvalsh(X.T @ X / len(X))
        assert 3e5 < eig[-1] / eig[0] < 3e6  # condition number ~1e6 (a sample of 2000 rows of d = 20)


def test_the_readme_table_is_generated_from_the_json(quick, tmp_path):
    from dane.paper_figs.defaults_table import BEGIN, END, main, render

    _, whole = quick
    report = whole["defaults"]
    row = report["cells"]["large_targets/ridge/lam=0.001/m=4"]["methods"]["gd"]
    text = render(report)
    assert f"| {row['default']['comm_rounds']} ({row['best']['comm_rounds']}) |" in text
    assert f"| GD | 1/1 | 0 | {int(row['within_factor'])}/1 | 2x | {row['ratio']:.2f} |" in text
    assert "| DANE (safeguarded) | 1/1 | 0 |" in text
    readme, bench = tmp_path / "README.md", tmp_path / "bench.json"
    bench.write_text(json.dumps(whole))
    readme.write_text(f"before\n{BEGIN}\nold numbers\n{END}\nafter\n")
    main(["--json", str(bench), "--readme", str(readme)])
    assert readme.read_text() == f"before\n{BEGIN}\n{text}\n{END}\nafter\n"


def test_each_method_row_records_the_code_it_ran(quick):
    _, whole = quick
    report = whole["defaults"]
    rows = [row for cell in report["cells"].values() for row in cell["methods"].values()]
    assert all(row["code"] == report["code"] and set(row["code"]) == {"git_commit", "git_dirty"} for row in rows)
