"""scripts/bench_defaults.py: a --quick run's JSON (canned, tests/data/bench/defaults.json) and its arithmetic, one
tiny cell's numbers against numpy, the grid's knobs and verdicts on hand-made runs."""
from __future__ import annotations

import json

import numpy as np
import pytest

from dane.synthetic.defaults_data import ill_conditioned, large_targets, rare_onehot
from tests.helpers import REPO


def load_script():
    from scripts import bench_defaults

    return bench_defaults


@pytest.fixture(scope="module")
def quick():
    """``python -m scripts.bench defaults --quick`` (make bench-smoke runs it), cut to gd and dane."""
    return load_script(), json.loads((REPO / "tests" / "data" / "bench" / "defaults.json").read_text())


def test_the_json_holds_its_arithmetic(quick):
    bench, whole = quick
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


def test_federated_grid_settings_are_multiples_of_what_the_default_chose():
    """``X_times_default: c`` is c times the X of the default run's first record; ``lr_times_L`` is c/L."""
    bench = load_script()
    chosen = {"lam": 0.02, "p": 0.1, "lr": 0.5}
    assert bench.resolve({"lam_times_default": 0.25}, 4.0, chosen) == {"lam": 0.005}
    assert bench.resolve({"lr_times_default": 0.5, "p_times_default": 4.0}, 4.0, chosen) == {"lr": 0.25, "p": 0.4}
    assert bench.resolve({"lr_times_L": 1.5, "local_steps": 3}, 4.0, None) == {"lr": 0.375, "local_steps": 3}
    with pytest.raises(ValueError, match="mu_times_default: the default run logged no mu"):
        bench.resolve({"mu_times_default": 2.0}, 4.0, chosen)
    for method in ("sdane", "acc_sdane", "feddane", "fedred", "fedprox", "fedavg", "scaffold", "scaffnew"):
        algorithm, default, grid, factor = bench.METHODS[method]
        assert algorithm == method and default == {} and factor == 2.0 and 2 <= len(grid) <= 5


def test_a_grid_holds_its_default_local_work_and_variant():
    """The cost counted is allreduces, in which local steps are free: no grid setting changes the local steps per
    round or the control variate of the default it is judged against (those are rows of their own)."""
    bench = load_script()
    for method, (algorithm, default, grid, factor) in bench.METHODS.items():
        for setting in grid:
            for key in ("local_steps", "option"):
                assert setting.get(key) == default.get(key), (method, setting)
    assert {m for m, row in bench.METHODS.items() if row[0] == "scaffold"} == \
        {"scaffold", "scaffold_option1", "scaffold_k3", "scaffold_k30"}


def test_a_variant_default_keeps_what_it_chose_for_its_grid():
    """A default with keys of its own (``scaffold_option1``) logs the η_l it chose, which its grid's
    ``lr_times_default`` multiplies."""
    from dane.problems import Ridge

    bench = load_script()
    X, y = np.random.default_rng(0).standard_normal((80, 5)), np.random.default_rng(1).standard_normal(80)
    problem = Ridge(X, y, lam=1e-2, fit_intercept=False, optimum="auto")
    L = bench.smoothness(X, "squared", 1e-2, False)
    default = bench.run_setting(problem, "scaffold_option1", {"option": 1}, 2, L, 3, is_default=True)
    lr = default["first_record"]["lr"]
    assert 0 < lr <= 1.9 / L * (1 + 1e-9)  # lr <= 1.9/max_i L_i <= 1.9/L: L = λ_max(mean_i H_i) <= max_i λ_max(H_i)
    run = bench.run_setting(problem, "scaffold_option1", {"option": 1, "lr_times_default": 0.25}, 2, L, 3,
                            default["first_record"])
    assert run["keys"] == {"option": 1, "lr": 0.25 * lr}


def test_a_floored_method_passes_at_its_drift_floor_and_misses_at_the_cap():
    """FedProx/FedAvg: reaching nothing is no miss when the default ended at its client-drift floor
    (status client_drift); running to the cap instead is one, named."""
    bench = load_script()
    run = lambda status, comm=None: {"settings": {}, "status": status, "reached": comm is not None,  # noqa: E731
                                     "comm_rounds": comm, "rounds": comm}
    floor = bench.judge("fedavg", run("client_drift"), [run("client_drift"), run("max_rounds")])
    assert floor["diagnosed"] and floor["within_factor"] is None and floor["no_divergence"]
    capped = bench.judge("fedprox", run("max_rounds"), [run("client_drift")])
    assert capped["diagnosed"] is False
    reached = bench.judge("fedprox", run("converged", 12), [run("converged", 8)])
    assert reached["diagnosed"] and reached["ratio"] == 1.5 and reached["within_factor"]
    report = {"cells": {"c": {"methods": {"fedavg": {**floor, "default": run("client_drift")},
                                          "fedprox": {**capped, "default": run("max_rounds")}}}}}
    assert bench.misses(report) == ["c fedprox: default ran to the cap without reaching the target or its floor "
                                    "(max_rounds)"]


def test_the_federated_methods_have_their_own_block(tmp_path):
    """defaults_table renders the federated line into its own block, and leaves a block whose methods the JSON
    lacks as it is (the older methods' numbers come from another run)."""
    from dane.paper_figs.defaults_table import BEGIN, END, FEDERATED, FEDERATED_BEGIN, FEDERATED_END, main, render

    row = lambda status, comm, best: {  # noqa: E731
        "default": {"status": status, "reached": comm is not None, "comm_rounds": comm},
        "best": {"comm_rounds": best}, "ratio": None if comm is None else comm / best, "factor": 2.0,
        "no_divergence": True, "within_factor": None if comm is None else comm / best <= 2}
    report = {"started_at": "t", "machine": {"load_avg": [1.0]}, "target": "relative 1e-8",
              "cells": {"c/ridge": {"methods": {"sdane": row("converged", 12, 8), "fedavg": row("client_drift", None, 5)}}}}
    text = render(report, ("sdane", "fedavg"))
    assert "| S-DANE | 1/1 | 0 | 1/1 | 2x | 1.50 | 1.50 (c/ridge) |" in text
    assert "| FedAvg | 0/1 (+1 at its drift floor) | 0 | 0/0 | 2x | — | — |" in text
    assert "| c/ridge | 12 (8) | floor (5) |" in text
    page, data = tmp_path / "page.md", tmp_path / "bench.json"
    page.write_text(f"a\n{BEGIN}\nold\n{END}\nb\n{FEDERATED_BEGIN}\nold\n{FEDERATED_END}\n")
    data.write_text(json.dumps({"defaults": report}))
    main(["--json", str(data), "--page", str(page)])
    assert page.read_text() == f"a\n{BEGIN}\nold\n{END}\nb\n{FEDERATED_BEGIN}\n{render(report, FEDERATED)}\n{FEDERATED_END}\n"
    other = {**report, "started_at": "u", "cells": {"c/ridge": {"methods": {"scaffold": row("converged", 30, 20)}}}}
    (tmp_path / "other.json").write_text(json.dumps({"defaults": other}))
    main(["--json", str(data), str(tmp_path / "other.json"), "--page", str(page)])  # runs split by --only
    text = page.read_text()
    assert "| c/ridge | 12 (8) | floor (5) | 30 (20) |" in text and "(t, load average [1.0]; u, load average" in text
