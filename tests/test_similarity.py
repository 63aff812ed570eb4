"""Hessian dissimilarity δ (dane.numerics.similarity) against dense numpy: max_i ||H_i − H||_2 by eigvalsh."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse
import torch

from dane.comm import ThreadGroup, ring_allreduce_bytes
from dane.errors import ConfigError
from dane.losses import LOGISTIC, SQUARED
from dane.problems.glm import LinearModelShard, to_torch
from dane.numerics.similarity import hessian_dissimilarity, measure, offered

M, N, D, LAM = 4, 160, 7, 0.01


def data(seed: int = 0, *, skewed: bool = True):
    """Rows whose scale grows with the row index, cut into M contiguous (so unlike) shards, and labels."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, D)) * np.linspace(0.4, 2.0, D)
    if skewed:
        X *= np.linspace(0.5, 2.0, N)[:, None]
    z = X @ rng.standard_normal(D)
    return X, z + 0.3 * rng.standard_normal(N), np.where(z + 0.5 * rng.standard_normal(N) > 0, 1.0, -1.0)


def shards(loss: str, X, y, bounds=None, *, sparse: bool = False) -> list[LinearModelShard]:
    bounds = np.linspace(0, N, M + 1).astype(int) if bounds is None else bounds
    f = SQUARED if loss == "squared" else LOGISTIC
    out = []
    for a, b in zip(bounds, bounds[1:]):
        rows = scipy.sparse.csr_matrix(X[a:b]) if sparse else X[a:b]
        out.append(LinearModelShard(to_torch(rows), torch.from_numpy(y[a:b]), f, l2=LAM, weight=M / N))
    return out


def dense_hessians(loss: str, X, y, w, bounds) -> list[np.ndarray]:
    """∇²O_i(w) without the regularizer, written out: (M/N) X_iᵀ diag(c) X_i, c = 1 (squared) or σ(1 − σ)."""
    out = []
    for a, b in zip(bounds, bounds[1:]):
        Xi = X[a:b]
        if loss == "squared":
            c = np.ones(b - a)
        else:
            s = 1 / (1 + np.exp(-y[a:b] * (Xi @ w)))
            c = s * (1 - s)
        out.append(M / N * (Xi.T * c) @ Xi)
    return out


def reference(hessians: list[np.ndarray]) -> dict:
    H = np.mean(hessians, axis=0)
    spectral = [np.abs(np.linalg.eigvalsh(Hi - H)).max() for Hi in hessians]
    frobenius = [np.sum((Hi - H) ** 2) for Hi in hessians]
    return {"delta": max(spectral), "delta_mean_square": np.sqrt(np.mean(np.square(spectral))),
            "delta_frobenius": np.sqrt(np.mean(frobenius)), "hessian_norm": np.abs(np.linalg.eigvalsh(H)).max(),
            "per_worker": spectral}


@pytest.mark.parametrize("loss", ["squared", "logistic"])
@pytest.mark.parametrize("method", ["exact", "lanczos"])
def test_delta_equals_the_dense_eigenvalue_computation(loss, method):
    X, y_reg, y_cls = data()
    y = y_reg if loss == "squared" else y_cls
    bounds = np.array([0, 20, 70, 100, 160])  # unequal shards: H_i carries its size too
    w = 0.3 * np.random.default_rng(1).standard_normal(D)
    got = measure(shards(loss, X, y, bounds), torch.from_numpy(w), method=method, iters=D)
    want = reference(dense_hessians(loss, X, y, w, bounds))
    assert want["delta"] > 0.1 * want["hessian_norm"]  # far from IID: a test that δ = 0 would fail
    for key in ("delta", "delta_mean_square", "hessian_norm"):
        assert got[key] == pytest.approx(want[key], rel=1e-8, abs=1e-12), key
    assert got["per_worker"] == pytest.approx(want["per_worker"], rel=1e-8)
    assert got["method"] == method
    if method == "exact":
        assert got["delta_frobenius"] == pytest.approx(want["delta_frobenius"], rel=1e-8)
        assert got["allreduces"] == 2
    else:
        assert got["allreduces"] == D + 1  # one per iteration, one to gather the Frobenius estimates


def test_lanczos_on_sparse_rows_below_d_products_bounds_delta_from_below():
    X, y_reg, _ = data(seed=3)
    bounds = np.linspace(0, N, M + 1).astype(int)
    w = torch.zeros(D, dtype=torch.float64)
    want = reference(dense_hessians("squared", X, y_reg, w.numpy(), bounds))
    got = measure(shards("squared", X, y_reg, bounds, sparse=True), w, method="lanczos", iters=4)
    assert all(g <= v * (1 + 1e-12) for g, v in zip(got["per_worker"], want["per_worker"]))  # Ritz values
    assert got["delta"] >= 0.9 * want["delta"]  # 4 of 7 products already find the largest to 10%


def test_hutchinson_frobenius_is_unbiased():
    """Averaged over seeds, the probe estimate of mean_i ||H_i − H||_F² approaches the exact value."""
    X, y_reg, _ = data()
    problems = shards("squared", X, y_reg)
    w = torch.zeros(D, dtype=torch.float64)
    exact = measure(problems, w, method="exact")["delta_frobenius"] ** 2
    estimates = [measure(problems, w, method="lanczos", iters=2, probes=64, seed=s)["delta_frobenius"] ** 2
                 for s in range(10)]
    # 640 Rademacher probes in all: the standard error of their mean is below 5% here
    assert np.mean(estimates) == pytest.approx(exact, rel=0.1)


@pytest.mark.parametrize("method", ["exact", "lanczos"])
def test_identical_shards_have_delta_zero(method):
    X, _, y_cls = data(skewed=False)
    same = [shards("logistic", X[:40], y_cls[:40], np.array([0, 40]))[0] for _ in range(M)]
    got = measure(same, torch.full((D,), 0.1, dtype=torch.float64), method=method, iters=D)
    assert got["hessian_norm"] > 0.1
    assert got["delta"] <= 1e-13 * got["hessian_norm"]
    assert got["delta_frobenius"] <= 1e-13 * got["hessian_norm"]


def test_counters_are_restored_and_every_worker_gets_the_same_numbers_rank_0_the_per_worker_list():
    X, y_reg, _ = data()
    problems = shards("squared", X, y_reg)

    def worker(comm):
        comm.bytes_sent, comm.calls = 123, 4
        out = hessian_dissimilarity(problems[comm.rank], comm, torch.zeros(D, dtype=torch.float64),
                                    method="lanczos", iters=3)
        return out, comm.bytes_sent, comm.calls

    results = ThreadGroup(M).run(worker)
    assert all((b, c) == (123, 4) for _, b, c in results)
    first = results[0][0]
    assert all(r[0] == {k: v for k, v in first.items() if k != "per_worker"} for r in results[1:])
    assert len(first["per_worker"]) == M  # rank 0's alone: m simulated workers would hold m lists of m
    # what the measurement cost, by hand: 3 Lanczos allreduces of the m + 1 products and the m-block of own ones,
    # the first with the 8 probes' products too, then the gather of one value a worker (float64, ring shares)
    products = 8 * (2 * M + 1) * D
    assert first["allreduces"] == 4
    assert first["bytes_sent"] == (ring_allreduce_bytes(products + 8 * 8 * D, M) + 2 * ring_allreduce_bytes(products, M)
                                   + ring_allreduce_bytes(8 * M, M))


def test_auto_picks_exact_for_small_d_and_bad_arguments_are_one_line():
    X, y_reg, _ = data()
    problems = shards("squared", X, y_reg)
    w = torch.zeros(D, dtype=torch.float64)
    assert measure(problems, w)["method"] == "exact"
    assert offered(problems[0]) and not offered(object())
    assert measure(problems, w, exact_dim=D - 1)["method"] == "lanczos"
    with pytest.raises(ConfigError, match="similarity method must be one of auto|exact|lanczos, got 'qr'"):
        measure(problems, w, method="qr")
    with pytest.raises(ConfigError, match="similarity iters must be a positive integer, got 0"):
        measure(problems, w, iters=0)



def test_similarity_true_puts_delta_at_the_start_and_end_into_the_summary_and_changes_no_record(tmp_path):
    """``similarity=true`` (`dane.loop.callbacks.Similarity`): the summary's δ equals `measure` on the run's own shards at
    w_0 and at the final iterate; a quadratic's Hessian is constant, so start and end agree to round-off; the
    records (time aside) are those of the same run without it."""
    from dataclasses import replace

    from helpers import composed

    from dane.experiments.config import run_spec
    from dane.loop.launch import execute
    from dane.records.results import read_rounds

    cfg = composed("problem=ridge_synthetic", "problem.n_samples=600", "problem.dim=12", "workers=3", "rounds=4",
                   "tol=null", "quiet=true", "similarity=true")
    spec = run_spec(cfg)
    summary = execute(spec, str(tmp_path / "on"))
    plain = execute(replace(spec, control=replace(spec.control, similarity=False)), str(tmp_path / "off"))
    problems = [spec.problem.build(rank, 3, torch.float64) for rank in range(3)]
    start, end = summary["similarity"]["start"], summary["similarity"]["end"]
    expected = measure(problems, problems[0].initial_point())
    assert start["delta"] == pytest.approx(expected["delta"], rel=1e-10) and start["delta"] > 0
    assert start["per_worker"] == pytest.approx(expected["per_worker"], rel=1e-10)
    assert end["delta"] == pytest.approx(start["delta"], rel=1e-10)  # ridge: ∇²O_i does not depend on w
    assert start["allreduces"] == 2 and "similarity" not in plain
    strip = [{k: v for k, v in r.items() if k != "time_s"} for r in read_rounds(tmp_path / "off")]
    assert [{k: v for k, v in r.items() if k != "time_s"} for r in read_rounds(tmp_path / "on")] == strip
    assert summary["comm_rounds"] == plain["comm_rounds"] and summary["total_bytes"] == plain["total_bytes"]
