"""The command line on a user's own data: real launches on a sparse LIBSVM file, CSV, --config-dir, bad input."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse
import torch
from sklearn.datasets import dump_svmlight_file

from dane.records.results import read_rounds, read_summary
import runs
from helpers import horovodrun, torchrun, train


def write_sparse_logistic(path, n=400, d=3000, density=0.01, seed=0):
    rng = np.random.default_rng(seed)
    X = scipy.sparse.random(n, d, density=density, format="csr", random_state=seed)
    X.data = np.round(rng.standard_normal(X.nnz), 6)  # dump_svmlight_file writes %.16g: keep values exact
    w = rng.standard_normal(d)
    y = np.where(X @ w + 0.3 * rng.standard_normal(n) > 0, 1, 0)
    dump_svmlight_file(X, y, str(path), zero_based=False)
    return X, y


def sparse_args(path, out, algorithm: str, simulated: bool) -> list[str]:
    return ["problem=logreg", "data=libsvm", f"data.path={path}", "data.zero_based=false", "problem.lam=0.01",
            f"algorithm={algorithm}", "rounds=4", "quiet=true", "save_iterate=true", f"out_dir={out}",
            "problem.optimum=auto", *(["workers=2"] if simulated else [])]


def sparse_run(path, out, algorithm="dane", launcher=None):
    return train(*sparse_args(path, out, algorithm, launcher is None), launcher=launcher)


def sparse_svm(tmp) -> None:
    """{tmp}/convex_cli/sparse.svm: `write_sparse_logistic`'s data, what the simulated rows below read."""
    (tmp / "convex_cli").mkdir(exist_ok=True)
    write_sparse_logistic(tmp / "convex_cli" / "sparse.svm")


SPARSE = {algorithm: runs.command(f"convex_cli:sparse:{algorithm}",
                                  *sparse_args("{tmp}/convex_cli/sparse.svm", "{tmp}/convex_cli/sim_" + algorithm,
                                               algorithm, simulated=True))
          for algorithm in ("dane", "disco")}


@pytest.fixture(scope="module")
def sparse_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "sparse.svm"
    write_sparse_logistic(path)
    return path


@pytest.fixture(scope="module", params=["dane", "disco"])
def simulated(request, commands):
    """The simulator's run of DANE, and of DiSCO (whose preconditioner is a broadcast from worker 0): rows of the
    session's batch, on `sparse_svm`'s file (the same data as `sparse_file`'s)."""
    proc = commands[SPARSE[request.param]]
    assert proc["rc"] == 0, proc["stderr"]
    return request.param, commands.tmp / "convex_cli" / f"sim_{request.param}"


def test_sparse_run_keeps_x_sparse_and_converges(simulated):
    _, simulated = simulated
    summary = read_summary(simulated)
    assert any("cg (d=3001, sparse X" in note for note in summary["notes"])  # auto picked CG: no d x d matrix
    records = read_rounds(simulated)
    assert records[-1]["suboptimality"] < 1e-3 * records[0]["suboptimality"]


@pytest.mark.parametrize("launch", [horovodrun, torchrun], ids=["horovodrun", "torchrun"])
@pytest.mark.slow
def test_sparse_problem_under_a_launcher_equals_the_simulator(launch, sparse_file, simulated, tmp_path):
    algorithm, simulated = simulated
    proc = sparse_run(sparse_file, tmp_path, algorithm, launch(2))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    real, sim = read_rounds(tmp_path), read_rounds(simulated)
    assert len(real) == len(sim) == 5
    for a, b in zip(real, sim):
        assert a["comm_rounds"] == b["comm_rounds"] and a["bytes_sent"] == b["bytes_sent"]
        assert abs(a["suboptimality"] - b["suboptimality"]) <= 1e-10 * max(1.0, b["suboptimality"])
    torch.testing.assert_close(torch.load(tmp_path / "iterate.pt"), torch.load(simulated / "iterate.pt"),
                               rtol=0, atol=1e-10)


def categorical_csv(tmp) -> None:
    """{tmp}/convex_cli/mine.csv: y = 2 x1 - x2 + [group = b] + noise, one x2 missing, 300 rows."""
    tmp_path = tmp / "convex_cli"
    tmp_path.mkdir(exist_ok=True)
    rng = np.random.default_rng(1)
    n = 300
    x1, x2 = rng.standard_normal(n), rng.standard_normal(n)
    group = rng.choice(["a", "b", "c"], n)
    y = 2 * x1 - x2 + (group == "b") + 0.1 * rng.standard_normal(n)
    lines = ["x1,x2,group,y"] + [f"{a:.6f},{'' if i == 7 else f'{b:.6f}'},{g},{t:.6f}"
                                  for i, (a, b, g, t) in enumerate(zip(x1, x2, group, y))]
    (tmp_path / "mine.csv").write_text("\n".join(lines) + "\n")


runs.prepare(categorical_csv)
runs.prepare(sparse_svm)
CATEGORICAL = runs.command("convex_cli:categorical", "problem=ridge", "data=csv", "data.path={tmp}/convex_cli/mine.csv",
                           "data.target=y", "data.categorical=[group]", "workers=3", "tol=1e-10", "rounds=30",
                           "quiet=true", "out_dir={tmp}/convex_cli/run", "problem.optimum=auto")


def test_csv_with_a_categorical_column_runs_to_the_optimum(commands):
    proc = commands[CATEGORICAL]
    assert proc["rc"] == 0, proc["stderr"]
    summary = read_summary(commands.tmp / "convex_cli" / "run")
    assert summary["status"] == "converged" and summary["final_suboptimality"] <= 1e-10
    notes = " ".join(summary["notes"])
    assert "imputed" in notes and "group" in notes  # the one missing x2 and the one-hot column are in the log


@pytest.mark.slow
def test_a_users_own_config_dir_adds_a_problem_and_a_data_set(tmp_path):
    rng = np.random.default_rng(2)
    X = rng.standard_normal((120, 4))
    np.savez(tmp_path / "arrays.npz", X=X, y=X @ np.arange(1, 5) + 0.01 * rng.standard_normal(120))
    (tmp_path / "conf" / "problem").mkdir(parents=True)
    (tmp_path / "conf" / "data").mkdir()
    (tmp_path / "conf" / "data" / "mine.yaml").write_text(
        f"_target_: dane.data.files.NPZSource\npath: {tmp_path / 'arrays.npz'}\nname: mine\n")
    (tmp_path / "conf" / "problem" / "my_ridge.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /data: mine\nproblem:\n"
        "  _target_: dane.problems.linear_models.LinearModelConfig\n  name: my_ridge\n  loss: squared\n"
        "  data: ${data}\n  lam: 0.1\n  optimum: auto\n")
    out = tmp_path / "run"
    proc = train("--config-dir", str(tmp_path / "conf"), "problem=my_ridge", "workers=2", "tol=1e-10",
                 "quiet=true", f"out_dir={out}")
    assert proc.returncode == 0, proc.stderr
    summary = read_summary(out)
    assert summary["problem"] == "my_ridge" and summary["final_suboptimality"] <= 1e-10
    # an unknown choice is still one line, naming the folders searched
    proc = train("--config-dir", str(tmp_path / "conf"), "problem=nope", "quiet=true")
    assert proc.returncode == 2 and "problem=nope is unknown" in proc.stderr and "my_ridge" in proc.stderr


# Bad data and solver choices (a missing CSV, digits for logreg, an unknown local solver, data= with
# ridge_synthetic) are rows of tests/test_bad_input.py's table, run in one process there.


@pytest.mark.slow
def test_presharded_parts_reach_the_optimum_of_the_whole_file(tmp_path):
    X, y = write_sparse_logistic(tmp_path / "whole.svm", n=300, d=2000, seed=4)
    for rank, rows in enumerate(np.array_split(np.arange(300), 2)):
        dump_svmlight_file(X[rows], y[rows], str(tmp_path / f"part-{rank}.svm"), zero_based=False)
    common = ["problem=logreg", "data=libsvm", "data.zero_based=false", "data.n_features=2000",
              "problem.lam=0.01", "workers=2", "rounds=40", "quiet=true"]
    whole = train(*common, f"data.path={tmp_path / 'whole.svm'}", "tol=1e-12", f"out_dir={tmp_path / 'whole'}")
    assert whole.returncode == 0, whole.stderr
    parts = train(*common, f"data.path='{tmp_path}/part-{{rank}}.svm'", "tol=1e-9", f"out_dir={tmp_path / 'parts'}")
    assert parts.returncode == 0, parts.stderr
    optimum = read_summary(tmp_path / "whole")["final_objective"]
    summary = read_summary(tmp_path / "parts")
    assert summary["status"] == "converged" and summary["final_suboptimality"] is None
    assert summary["stop_rule"] == "grad_norm <= 1e-09 x grad_norm at round 0"
    first = read_rounds(tmp_path / "parts")[0]
    assert summary["final_grad_norm"] <= 1e-9 * first["grad_norm"]
    assert summary["final_objective"] == pytest.approx(optimum, rel=1e-12)  # the same objective, sharded by file
    # A reference optimum made by the two workers, each holding only its own file, is the whole file's optimum.
    ref = train(*common, f"data.path='{tmp_path}/part-{{rank}}.svm'", "rounds=1", "problem.optimum=auto",
                f"out_dir={tmp_path / 'ref'}", extra_env={"DANE_CACHE_DIR": str(tmp_path / "cache")})
    assert ref.returncode == 0, ref.stderr
    notes = " ".join(read_summary(tmp_path / "ref")["notes"])
    assert "reference optimum from distributed Newton-CG" in notes
    o_star = float(notes.split("O* = ")[1].split(",")[0])
    assert o_star == pytest.approx(optimum, rel=1e-13)
