"""``algorithm=fednl`` on the batched simulator (the stacked rows, `dane.problems.stacked_rows`) against the per-worker
simulator (one thread a client), on sparse rows dealt in unequal shards, which the linear models' stacked form refuses:

- the records equal (every key but time_s: integers exactly, bits and bytes included; floats to 1e-12 relative) and
  so does the final iterate, for none, TopK, RandK and natural (a random compressor with a generator per client),
  FedNL-LS, option 2, FedNL-PP with 2 of 5 clients, a reference optimum (records with suboptimality), and the
  sources a user names (a LIBSVM file, a CSV table);
- ``sim.batched=auto`` takes the batched path from AUTO_FROM workers on, and says so in the summary;
- the stacked problem's per-client objective, gradient and suboptimality equal each shard's own, and `PackedRows`
  gives a batched allreduce the mean and bytes of the (m, T) triangles it stands for.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import scipy.sparse
import torch

from dane.problems.stacked_rows import StackedRows
from dane.loop.batching import AUTO_FROM, batched_path
from dane.problems.arrays import LogReg, Ridge
from dane.loop.reference import attach_all
from test_batched import assert_same_records, run


def sparse_rows(n: int = 203, d: int = 9, seed: int = 0):
    """Sparse real-valued rows with an intercept column, ±1 labels from a planted model (203 rows: 5 workers hold
    40 or 41, unequal)."""
    gen = np.random.default_rng(seed)
    X = scipy.sparse.random(n, d, density=0.35, random_state=seed, format="csr", data_rvs=gen.standard_normal)
    X = scipy.sparse.hstack([X, np.ones((n, 1))], format="csr")
    y = np.where(X @ gen.standard_normal(d + 1) + 0.3 * gen.standard_normal(n) > 0, 1.0, -1.0)
    return X, y


@pytest.fixture(scope="module")
def logreg():
    return LogReg(*sparse_rows(), lam=1e-3)


def test_the_linear_models_own_stacked_form_refuses_these_rows(logreg):
    # sparse, and unequal (203 rows over 5): the first reason is the one given; the stacked rows are what runs below
    assert logreg.stacked_form(5) == "sparse rows have no batched form"


def test_the_stacked_form_is_the_one_the_class_declares_it_needs(logreg):
    """``stacked_needs``: DANE (local solves, the default) gets the problem's own stacked form, which refuses these
    rows; FedNL ("oracles") gets the rows stacked, 203 rows over 5 workers, and a problem that is not a linear model
    with one output is refused in one clause; GD ("gradients") the rows stacked here too, and on dense equal shards
    the problem's own form."""
    from dane.api import algorithm_config
    from dane.problems import RidgeSyntheticConfig

    dane, gd, fednl = algorithm_config("dane"), algorithm_config("gd"), algorithm_config("fednl")
    assert [c.algorithm.stacked_needs for c in (dane, gd, fednl)] == ["solves", "gradients", "oracles"]
    assert dane.stacked_form(logreg, 5) == logreg.stacked_form(5) is not None
    assert fednl.stacked_form(logreg, 5) is None and gd.stacked_form(logreg, 5) is None
    for config in (fednl, gd):
        stacked = config.build_stacked(logreg, 5, torch.float64)
        assert isinstance(stacked, StackedRows) and stacked.stacked_workers == 5
        assert stacked.X.shape[0] == 203 and list(np.diff(stacked.start)) == [41, 41, 41, 40, 40]
    ridge = RidgeSyntheticConfig(n_samples=40, dim=4)
    assert "linear models with one output" in fednl.stacked_form(ridge, 5)
    assert gd.stacked_form(ridge, 5) is None and not isinstance(gd.build_stacked(ridge, 5, torch.float64), StackedRows)


@pytest.mark.parametrize("keys", [
    {},
    {"compressor": "topk:10"},
    {"compressor": "randk:10"},
    {"compressor": "natural"},
    {"compressor": "randk:10", "option": 2},
    {"compressor": "topk:10", "variant": "ls", "alpha": 1.0},
    {"compressor": "topk:10", "variant": "pp", "option": 2, "clients_per_round": 2},
    {"compressor": "randk:10", "variant": "pp", "option": 2, "clients_per_round": 2},
])
def test_batched_records_equal_the_per_worker_records(logreg, keys):
    batched, threads = run(logreg, "fednl", 5, "true", rounds=4, **keys), run(logreg, "fednl", 5, "false", rounds=4,
                                                                               **keys)
    assert_same_records(batched, threads)
    assert batched["records"][-1]["clients_uplink_bits"] > batched["records"][0]["clients_uplink_bits"]


def test_a_float32_fednl_ls_run_sends_the_per_worker_bytes(logreg):
    """FedNL-LS's trials allreduce each client's O_i(x), in the problem's dtype on both paths (the stacked rows'
    objective came back float64: 4 bytes a trial more than a float32 worker sends)."""
    problem = dataclasses.replace(logreg, dtype="float32")
    batched, threads = (run(problem, "fednl", 5, path, rounds=3, compressor="randk:10", variant="ls")
                        for path in ("true", "false"))
    assert batched["summary"]["simulator_path"] == "batched" and batched["w"].dtype == torch.float32
    for ours, theirs in zip(batched["records"], threads["records"], strict=True):
        counts = {key for key, value in theirs.items() if isinstance(value, int)}
        assert "bytes_sent" in counts and {key: ours[key] for key in counts} == {key: theirs[key] for key in counts}


def test_with_a_reference_optimum_and_a_quadratic_loss():
    """problem.optimum=auto (attached to the stacked shards as on the per-worker path) and ridge's quadratic
    suboptimality ½ eᵀ∇²O_i e."""
    X, y = sparse_rows(seed=1)
    Xd, n = X.toarray(), len(y)
    # the optima by hand: ridge ½ mean((Xw − y)²) + (λ/2)‖w‖², w* = H⁻¹Xᵀy/n and O* = ½ mean(y²) − ½ w*ᵀHw*;
    # logistic mean log(1 + exp(−y xᵀw)) + (λ/2)‖w‖² by 20 plain Newton steps from 0 (quadratic convergence)
    H = Xd.T @ Xd / n + 1e-2 * np.eye(Xd.shape[1])
    w_ridge = np.linalg.solve(H, Xd.T @ y / n)
    w = np.zeros(Xd.shape[1])
    for _ in range(20):
        p = 1 / (1 + np.exp(y * (Xd @ w)))  # σ(−y xᵀw)
        hessian = (Xd.T * (p * (1 - p))) @ Xd / n + 1e-3 * np.eye(Xd.shape[1])
        w = w - np.linalg.solve(hessian, -Xd.T @ (y * p) / n + 1e-3 * w)
    f_log = np.mean(np.logaddexp(0, -y * (Xd @ w))) + 0.5e-3 * w @ w
    f_ridge = 0.5 * np.mean(y * y) - 0.5 * w_ridge @ H @ w_ridge
    for problem, optimum in ((LogReg(X, y, lam=1e-3, optimum="auto"), f_log),
                             (Ridge(X, y, lam=1e-2, optimum="auto"), f_ridge)):
        batched, threads = run(problem, "fednl", 5, "true", rounds=3), run(problem, "fednl", 5, "false", rounds=3)
        assert_same_records(batched, threads)
        gaps = [r["objective"] - r["suboptimality"] for r in batched["records"]]
        assert gaps == pytest.approx([optimum] * 4, rel=0, abs=1e-13)


def test_auto_batches_fednl_from_auto_from_workers(logreg):
    from dane.api import algorithm_config
    from dane.loop.stopping import StopRule
    from dane.loop.spec import Communication, RunControl, RunSpec

    def spec(workers: int) -> RunSpec:
        return RunSpec(problem=logreg, algorithm=algorithm_config("fednl", compressor="topk:10"),
                       comm=Communication(backend="local", workers=workers, batched="auto"),
                       control=RunControl(stop=StopRule(rounds=1), quiet=True))

    assert batched_path(spec(AUTO_FROM - 1)) == (False, None)
    assert batched_path(spec(AUTO_FROM)) == (True, None)
    summary = run(logreg, "fednl", AUTO_FROM, "auto", rounds=2, compressor="topk:10")["summary"]
    assert summary["simulator_path"] == "batched"


def test_stacked_problem_answers_per_client_as_each_shard(logreg):
    m = 5
    config = dataclasses.replace(logreg, optimum="auto")
    shards = [config.build(rank, m) for rank in range(m)]
    attach_all(config, shards)
    stacked = StackedRows(shards)
    w = torch.linspace(-0.3, 0.4, shards[0].dim, dtype=torch.float64)
    grads, metrics = stacked.evaluate(w)
    for i, shard in enumerate(shards):
        grad, metric = shard.evaluate(w)
        torch.testing.assert_close(grads[i], grad, rtol=1e-13, atol=1e-16)
        torch.testing.assert_close(metrics[i], metric, rtol=1e-13, atol=1e-16)
        torch.testing.assert_close(stacked.objective(w)[i], shard.objective(w), rtol=1e-13, atol=0)


def test_a_libsvm_file_and_a_csv_file_run_batched_with_the_per_worker_records(tmp_path):
    """The user's sources: a LIBSVM file (kept sparse) and a CSV table (dense, standardized), each with its intercept,
    203 rows over 5 clients."""
    from sklearn.datasets import dump_svmlight_file

    from dane.data.files import CSVSource, LibSVMSource

    X, y = sparse_rows(seed=2)
    dump_svmlight_file(X[:, :-1], y, str(tmp_path / "rows.svm"))
    dense = np.column_stack([X[:, :-1].toarray(), (y > 0).astype(int)])
    np.savetxt(tmp_path / "rows.csv", dense, delimiter=",", header=",".join([*map("x{}".format, range(9)), "label"]),
               comments="")
    for source in (LibSVMSource(path=str(tmp_path / "rows.svm")), CSVSource(str(tmp_path / "rows.csv"), target="label")):
        problem = LogReg(data=source, lam=1e-3)
        keys = {"compressor": "topk:10", "rounds": 3}
        assert_same_records(run(problem, "fednl", 5, "true", **keys), run(problem, "fednl", 5, "false", **keys))


def test_packed_rows_stand_for_the_stacked_triangles_in_a_batched_allreduce(logreg):
    """`PackedRows` (compact rows) gives a batched communicator the (m, T) triangles' mean and byte count, also with
    only some clients' rows (FedNL-PP: the others send zeros)."""
    from dane.comm.batched import BatchedCommunicator, BatchedGroup
    from dane.problems.stacked_hessians import CompactHessians, PackedRows

    m = 5
    clients = CompactHessians(StackedRows([logreg.build(rank, m) for rank in range(m)]))
    compact = np.random.default_rng(0).standard_normal((m, clients.S)) * (clients.support < clients.T)
    for rows in (None, np.array([1, 3])):
        values = compact if rows is None else compact[rows]
        dense = torch.from_numpy(clients.expand(compact))
        if rows is not None:
            dense[np.setdiff1d(np.arange(m), rows)] = 0.0
        means, counted = [], []
        for message in (PackedRows(clients, values, rows), dense):
            comm = BatchedCommunicator(BatchedGroup(m))
            comm.begin()
            means.append(comm.allreduce_mean([message])[0])
            counted.append((comm.bytes_sent, comm.message_bytes))
        torch.testing.assert_close(means[0], means[1], rtol=1e-14, atol=1e-17)
        assert counted[0] == counted[1]
