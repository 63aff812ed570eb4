"""The synthetic ridge made per worker: each worker's rows, the reference optimum, and the
eigendecomposition local solve (`dane.problems.ridge`, `dane.problems.quadratic`)."""
from __future__ import annotations

import re

import pytest
import scipy.linalg
import torch

from dane.dane import DANEConfig
from dane.data.sharding import iid_shards
from dane.errors import ConfigError
from dane.numerics.linalg import cholesky_solve
from dane.problems import RidgeSyntheticConfig
from dane.problems import quadratic, ridge
from dane.problems.ridge import generate, gram, reference_optimum, shard_positions, synthesize
from helpers import ridge_shards, simulate


def closed_form(n_samples, dim, covariance, noise_std, seed, lam):
    """argmin (1/N)||Xw - y||² + λ||w||² on the whole generated data set, by a dense solve of the normal equations."""
    X, y = generate(n_samples, dim, covariance, noise_std, seed)
    H = (2.0 / n_samples) * (X.T @ X) + 2 * lam * torch.eye(dim, dtype=X.dtype)
    return torch.linalg.solve(H, (2.0 / n_samples) * (X.T @ y))


def relative(a, b):
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


@pytest.mark.parametrize("n_samples,dim,cov,seed", [(1000, 37, "decay", 3), (777, 300, "iso", 1), (600, 5, "iso", 0)])
def test_each_worker_makes_exactly_its_rows_of_the_full_data_set(n_samples, dim, cov, seed):
    X, y = generate(n_samples, dim, cov, 1.0, seed)
    for m in (1, 2, 3, 7):
        for rank in range(m):
            X_r, y_r = synthesize(n_samples, dim, cov, 1.0, seed, *shard_positions(n_samples, m, rank))
            idx = iid_shards(n_samples, m, seed)[rank]
            assert torch.equal(X_r, X[idx]) and torch.equal(y_r, y[idx]), (m, rank)


def test_shard_positions_are_the_parts_that_shard_deals():
    for n_samples, m in ((10, 3), (18000, 2), (18000, 7), (5, 5)):
        parts = [shard_positions(n_samples, m, r) for r in range(m)]
        assert parts[0][0] == 0 and parts[-1][1] == n_samples
        assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
        assert [stop - start for start, stop in parts] == [len(s) for s in iid_shards(n_samples, m, 0)]


def test_a_built_shard_holds_its_rows_and_the_full_hessian_piece():
    config = RidgeSyntheticConfig(n_samples=900, dim=30, covariance="decay", seed=4)
    X, y = generate(900, 30, "decay", 1.0, 4)
    problems = ridge_shards(3, config)
    for rank, problem in enumerate(problems):
        idx = iid_shards(900, 3, 4)[rank]
        assert torch.equal(problem.X, X[idx]) and torch.equal(problem.y, y[idx])
        torch.testing.assert_close(problem.A, (2 * 3 / 900) * (X[idx].T @ X[idx]), rtol=1e-13, atol=1e-13)
    # the mean of the local Hessians is the global one
    torch.testing.assert_close(sum(p.A for p in problems) / 3, (2 / 900) * (X.T @ X), rtol=1e-13, atol=1e-13)


def test_gram_is_exactly_symmetric_and_equals_xtx():
    X = torch.randn(700, 600, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    G = gram(X)
    assert torch.equal(G, G.T)
    torch.testing.assert_close(G, X.T @ X, rtol=1e-13, atol=1e-11)


@pytest.mark.parametrize("cov", ["iso", "decay"])
def test_chunked_optimum_equals_the_closed_form(cov):
    key = (5000, 40, cov, 1.0, 2, 0.005)  # more rows than one chunk of the stream
    assert key[0] > ridge.OPTIMUM_CHUNK
    assert relative(ridge.synthetic_optimum(*key), closed_form(*key)) <= 1e-10


def test_optimum_is_cached_on_disk_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("DANE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(ridge, "DISK_CACHE_MIN_WORK", 0)
    key = (800, 25, "decay", 1.0, 6, 0.01)
    reference_optimum.cache_clear()
    first = reference_optimum(*key)
    files = list((tmp_path / "ridge_optimum").glob("*.pt"))
    assert len(files) == 1 and not list((tmp_path / "ridge_optimum").glob("*.tmp"))

    def must_not_recompute(*args):
        raise AssertionError("the cached optimum was recomputed")

    reference_optimum.cache_clear()
    monkeypatch.setattr(ridge, "synthetic_optimum", must_not_recompute)
    again = reference_optimum(*key)
    assert torch.equal(again, first)
    assert relative(again, closed_form(*key)) <= 1e-10
    # another key has another file; a damaged file is recomputed, not trusted
    monkeypatch.undo()
    monkeypatch.setenv("DANE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(ridge, "DISK_CACHE_MIN_WORK", 0)
    files[0].write_bytes(b"not a tensor")
    reference_optimum.cache_clear()
    assert relative(reference_optimum(*key), closed_form(*key)) <= 1e-10
    reference_optimum.cache_clear()


@pytest.mark.parametrize("optimum", [False, "none"])
def test_optimum_none_skips_it_and_tol_applies_to_the_relative_gradient_norm(optimum):
    config = RidgeSyntheticConfig(n_samples=600, dim=20, seed=3, optimum=optimum)
    assert config.optimum == "none"
    problems = ridge_shards(2, config)
    assert all(p.w_star is None and p.metric_names == ("objective",) for p in problems)
    (_, records, iterates), _ = simulate(DANEConfig(), problems, rounds=30, tol=1e-9)
    assert "suboptimality" not in records[-1] and records[-1]["grad_norm"] <= 1e-9 * records[0]["grad_norm"]
    assert relative(iterates[-1], closed_form(600, 20, "iso", 1.0, 3, 0.005)) <= 1e-8


@pytest.mark.parametrize("dim", [1, 7, 300])
def test_cholesky_solve_by_two_triangular_solves_matches_lapack(dim):
    """`dane.numerics.linalg.cholesky_solve` against scipy's cho_solve (LAPACK potrs) and against the system it solves."""
    gen = torch.Generator().manual_seed(dim)
    X = torch.randn(2 * dim + 3, dim, dtype=torch.float64, generator=gen)
    M = X.T @ X + 0.01 * torch.eye(dim, dtype=torch.float64)
    r = torch.randn(dim, dtype=torch.float64, generator=gen)
    L = torch.linalg.cholesky(M)
    x = cholesky_solve(L, r)
    reference = torch.from_numpy(scipy.linalg.cho_solve((L.numpy(), True), r.numpy()))
    assert x.shape == r.shape
    assert relative(x, reference) <= 1e-12
    # backward stable: the residual is round-off times ||M|| ||x||
    assert float(torch.linalg.vector_norm(M @ x - r)) <= 1e-12 * float(torch.linalg.matrix_norm(M, 2)
                                                                        * torch.linalg.vector_norm(x))


def test_eigh_solve_equals_cholesky_solve_on_the_same_subproblem():
    by_cholesky = RidgeSyntheticConfig(n_samples=1500, dim=120, covariance="decay", seed=9, factorization="cholesky")
    by_eigh = RidgeSyntheticConfig(n_samples=1500, dim=120, covariance="decay", seed=9, factorization="eigh")
    (chol,), (eig,) = ridge_shards(1, by_cholesky), ridge_shards(1, by_eigh)
    gen = torch.Generator().manual_seed(1)
    anchor, linear = torch.randn(120, dtype=torch.float64, generator=gen), torch.randn(120, dtype=torch.float64, generator=gen)
    for mu in (0.0, 0.1, 0.297, 3.0):
        for with_reg in (True, False):
            a = chol.prox_solve(anchor, linear, mu, with_reg=with_reg)
            b = eig.prox_solve(anchor, linear, mu, with_reg=with_reg)
            assert relative(b - anchor, a - anchor) <= 1e-12, (mu, with_reg)
    assert chol._eigen is None and not eig._factors  # each took its own path


def test_auto_factorization_switches_to_eigh_after_the_break_even_count():
    (problem,) = ridge_shards(1, RidgeSyntheticConfig(n_samples=400, dim=30, seed=2))
    r = torch.randn(30, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    shifts = [0.01 * 2 ** k for k in range(quadratic.EIGH_BREAK_EVEN + 3)]
    for k, shift in enumerate(shifts):
        x = problem.shifted_solve(r, shift)
        reference = torch.linalg.solve(problem.A + shift * torch.eye(30, dtype=torch.float64), r)
        assert relative(x, reference) <= 1e-12
        assert (problem._eigen is not None) == (k >= quadratic.EIGH_BREAK_EVEN)
    assert len(problem._factors) <= 8
    # a shift factored earlier keeps its Cholesky factor
    assert problem._uses_eigh(shifts[-1]) and not problem._uses_eigh(next(iter(problem._factors)))


def test_dane_with_eigh_follows_dane_with_cholesky():
    def run(factorization):
        config = RidgeSyntheticConfig(n_samples=1200, dim=60, covariance="decay", seed=5, factorization=factorization)
        (_, records, _), _ = simulate(DANEConfig(), ridge_shards(2, config), rounds=8)
        return records

    for a, b in zip(run("cholesky"), run("eigh")):
        assert a.get("mu") == b.get("mu")
        assert abs(a["suboptimality"] - b["suboptimality"]) <= 1e-10 * max(1.0, b["suboptimality"])


def test_invalid_factorization_names_the_key():
    with pytest.raises(ConfigError, match=re.escape("problem.factorization must be one of auto|cholesky|eigh|woodbury, got 'lu'")):
        RidgeSyntheticConfig(factorization="lu")


def test_the_ridge_cache_and_the_reference_cache_are_one_folders_parts(tmp_path, monkeypatch):
    """`dane.problems.optimum.cache_dir`: $DANE_CACHE_DIR, else $XDG_CACHE_HOME/dane, else ~/.cache/dane."""
    from dane.problems.optimum import cache_dir

    key = (800, 25, "decay", 1.0, 6, 0.01)
    monkeypatch.delenv("DANE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert ridge.optimum_cache_path(*key).parent == cache_dir("ridge_optimum") == tmp_path / "xdg/dane/ridge_optimum"
    assert cache_dir() == tmp_path / "xdg/dane/optimum"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert ridge.optimum_cache_path(*key).parent == tmp_path / "home/.cache/dane/ridge_optimum"
    monkeypatch.setenv("DANE_CACHE_DIR", str(tmp_path / "own"))
    assert (ridge.optimum_cache_path(*key).parent, cache_dir()) == (tmp_path / "own/ridge_optimum", tmp_path / "own/optimum")
