"""The reference optimum (`dane.problems.optimum`, `dane.loop.reference`): made by the workers, to round-off, cached by content, off the clock."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import scipy.optimize
import scipy.sparse
import torch

import dane
from dane.errors import ConfigError
from dane.comm import ThreadGroup
from dane.problems.optimum import check_mode, data_moments, distributed_newton, global_value_grad, solve
from dane.loop.reference import attach_all
from dane.loop.stopping import StopRule
from helpers import simulate


def data(n=240, d=12, sparse=False, seed=0, classes=2):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)) * np.linspace(0.2, 3.0, d)  # unequal column scales
    if sparse:
        X = scipy.sparse.random(n, 40 * d, density=0.05, format="csr", random_state=seed)
        X.data = rng.standard_normal(X.nnz)
    w = rng.standard_normal(X.shape[1])
    z = X @ w
    y = z + 0.1 * rng.standard_normal(n) if classes == 0 else (z > 0).astype(float) if classes == 2 \
        else np.digitize(z, np.quantile(z, np.linspace(0, 1, classes + 1)[1:-1])).astype(float)
    return X, y


def scipy_optimum(shard) -> tuple[np.ndarray, float]:
    """O* of the one-worker shard by an independent solve, to round-off: scipy's L-BFGS-B from zero, then
    Newton's steps w ← w − H⁻¹∇O(w), H the central differences of ∇O at the L-BFGS-B point (not the
    package's Hessian), while ‖∇O‖ falls.

    A quasi-Newton solve alone ends where its line search no longer sees O fall (scipy's "precision loss"),
    with ‖∇O(w)‖ far above round-off; its w is then only within ‖∇O(w)‖ / λ_min(∇²O) of w*, and λ_min is λ
    itself where the rows span fewer dimensions than w has (the sparse case: 240 rows, 480 columns, no
    intercept).  Newton's steps take ‖∇O‖ to its round-off, so that w is as accurate as the reference's.
    """
    def value_grad(x):
        grad, metrics = shard.evaluate(torch.from_numpy(x))
        return float(metrics[0]), grad.numpy()

    x = scipy.optimize.minimize(value_grad, np.zeros(shard.dim), jac=True, method="L-BFGS-B",
                                options={"ftol": 0.0, "gtol": 1e-12, "maxiter": 10_000}).x
    steps = np.finfo(float).eps ** (1 / 3) * np.maximum(1.0, np.abs(x))  # central differences: error O(h^2)
    H = np.empty((shard.dim, shard.dim))
    for j, h in enumerate(steps):
        e = np.zeros(shard.dim)
        e[j] = h
        H[:, j] = (value_grad(x + e)[1] - value_grad(x - e)[1]) / (2 * h)
    H = (H + H.T) / 2
    value, g = value_grad(x)
    for _ in range(10):
        x_next = x - np.linalg.solve(H, g)
        value_next, g_next = value_grad(x_next)
        if np.linalg.norm(g_next) >= np.linalg.norm(g):
            break
        x, value, g = x_next, value_next, g_next
    return x, value


@pytest.mark.parametrize("maker, classes, sparse, workers", [
    (dane.problems.Ridge, 0, False, 3), (dane.problems.LogReg, 2, False, 1), (dane.problems.LogReg, 2, False, 4),
    (dane.problems.LogReg, 2, True, 2), (dane.problems.Softmax, 3, False, 3)])
def test_distributed_newton_reaches_the_optimum_to_round_off(maker, classes, sparse, workers):
    X, y = data(sparse=sparse, classes=classes)
    config = maker(X, y, lam=1e-3, fit_intercept=not sparse)
    ref = solve([config.build(rank, workers) for rank in range(workers)])
    whole = config.build(0, 1)
    w_scipy, f_scipy = scipy_optimum(whole)
    assert ref.objective <= f_scipy + 1e-14 * abs(f_scipy)  # at least as low as an independent solver
    grad0 = float(torch.linalg.vector_norm(whole.evaluate(whole.initial_point())[0]))
    assert float(torch.linalg.vector_norm(whole.evaluate(ref.w)[0])) <= 1e-13 * grad0
    assert float(torch.linalg.vector_norm(whole.evaluate(torch.from_numpy(w_scipy))[0])) <= 1e-13 * grad0
    # O is λ-strongly convex: ‖w − w*‖ <= ‖∇O(w)‖ / λ for each, so the two are within 2e-13 ‖∇O(w_0)‖ / λ
    assert np.linalg.norm(ref.w.numpy() - w_scipy) <= 2e-13 * grad0 / whole.strong_convexity


def test_ridge_reference_is_the_closed_form():
    X, y = data(classes=0)
    config = dane.problems.Ridge(X, y, lam=0.02)
    ref = solve([config.build(rank, 2) for rank in range(2)])
    n, d = X.shape
    np.testing.assert_allclose(ref.w.numpy(), np.linalg.solve(X.T @ X / n + 0.02 * np.eye(d), X.T @ y / n),
                               rtol=0, atol=1e-12)


def test_the_fingerprint_is_the_data_not_the_shards():
    """The optimum of (1/N) sum_j f_j + (lam/2)||w||^2 depends on the set of rows only."""
    X, y = data()
    config = dane.problems.LogReg(X, y, lam=1e-3)
    for workers in (1, 2, 5):
        shards = [config.build(rank, workers) for rank in range(workers)]
        totals = sum(data_moments(s.X, s.y) for s in shards)
        np.testing.assert_allclose(totals.numpy(), data_moments(config.build(0, 1).X, config.build(0, 1).y).numpy(),
                                   rtol=1e-13)
    dense, sparse = (dane.problems.LogReg(M, y, lam=1e-3).build(0, 1) for M in (X, scipy.sparse.csr_matrix(X)))
    np.testing.assert_allclose(data_moments(dense.X, dense.y).numpy(), data_moments(sparse.X, sparse.y).numpy(),
                               rtol=1e-13)
    other = dane.problems.LogReg(X[::-1].copy(), y[::-1].copy(), lam=1e-3).build(0, 1)  # rows in another order
    np.testing.assert_allclose(data_moments(other.X, other.y).numpy(), data_moments(dense.X, dense.y).numpy(),
                               rtol=1e-13)
    changed = X.copy()
    changed[7, 3] += 1e-6
    moved = dane.problems.LogReg(changed, y, lam=1e-3).build(0, 1)
    assert not np.allclose(data_moments(moved.X, moved.y).numpy(), data_moments(dense.X, dense.y).numpy(),
                           rtol=1e-11, atol=0)


def test_a_run_caches_its_reference_and_another_worker_count_reads_it(tmp_path, monkeypatch):
    monkeypatch.setenv("DANE_CACHE_DIR", str(tmp_path))
    X, y = data()
    config = dane.problems.LogReg(X, y, lam=1e-3, optimum="auto")
    first = dane.fit(config, "giant", workers=2, rounds=3)
    assert "distributed Newton-CG" in " ".join(first.summary["notes"])
    assert len(list((tmp_path / "optimum").glob("*.pt"))) == 1
    again = dane.fit(config, "giant", workers=3, rounds=3)
    assert "from cache" in " ".join(again.summary["notes"])
    f_first, f_again = (float(n.split("O* = ")[1].split(",")[0]) for r in (first, again)
                        for n in r.summary["notes"] if "O* = " in n)
    assert f_again == pytest.approx(f_first, rel=1e-15, abs=0)


def test_the_reference_costs_the_run_nothing(tmp_path, monkeypatch):
    """Records with a reference equal those without: rounds, objectives, gradients and iterates.

    Only bytes_sent differs: the suboptimality rides in each allreduce as one more float64 of the metric vector.
    """
    monkeypatch.setenv("DANE_CACHE_DIR", str(tmp_path))
    X, y = data()
    plain = dane.fit(dane.problems.LogReg(X, y, lam=1e-3), "dane", workers=3, rounds=4)
    ref = dane.fit(dane.problems.LogReg(X, y, lam=1e-3, optimum="auto"), "dane", workers=3, rounds=4)
    assert "suboptimality" not in plain.records[0] and "suboptimality" in ref.records[0]
    for a, b in zip(plain.records, ref.records):
        assert (a["comm_rounds"], a["objective"], a["grad_norm"]) == (b["comm_rounds"], b["objective"], b["grad_norm"])
    torch.testing.assert_close(plain.w, ref.w, rtol=0, atol=0)


def test_a_saved_optimum_is_read_and_a_bad_one_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("DANE_CACHE_DIR", str(tmp_path / "cache"))
    X, y = data()
    w_star = solve([dane.problems.LogReg(X, y, lam=1e-3).build(0, 1)]).w
    np.save(tmp_path / "w.npy", w_star.numpy())
    from_file = dane.fit(dane.problems.LogReg(X, y, lam=1e-3, optimum=str(tmp_path / "w.npy")), "giant",
                         workers=2, rounds=8)
    made = dane.fit(dane.problems.LogReg(X, y, lam=1e-3, optimum="auto"), "giant", workers=2, rounds=8)
    for a, b in zip(from_file.records, made.records):
        assert a["suboptimality"] == pytest.approx(b["suboptimality"], rel=0, abs=1e-15)
    assert from_file.records[-1]["suboptimality"] <= 1e-3 * from_file.records[0]["suboptimality"]
    np.save(tmp_path / "short.npy", np.zeros(3))
    (tmp_path / "junk.pt").write_bytes(b"not a tensor")
    for path, message in ((tmp_path / "short.npy", r"has shape \(3,\) but this problem has 12 parameters"),
                          (tmp_path / "junk.pt", "cannot read the saved optimum"),
                          (tmp_path / "none.npy", "no such file")):
        with pytest.raises(ConfigError, match=message) as info:
            dane.fit(dane.problems.LogReg(X, y, lam=1e-3, optimum=str(path)), "giant", workers=2, rounds=1)
        assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="auto, none or the path"):
        check_mode("problem.optimum", 3)
    with pytest.raises(ConfigError, match="neither auto, none nor a saved optimum"):
        check_mode("problem.optimum", "best")


def test_without_a_reference_tol_is_relative_to_the_first_gradient():
    X, y = data(classes=0)
    config = dane.problems.Ridge(X, y, lam=1e-3)
    for scale in (1.0, 1e4):  # scaling the objective changes no round
        problems = [config.build(rank, 2) for rank in range(2)]
        for p in problems:
            p.weight *= scale
            p.l2 *= scale
        (_, records, _), _ = simulate(dane.DANEConfig(safeguard=False, mu=0.0), problems, rounds=40, tol=1e-9)
        stop = next(r["round"] for r in records if r["grad_norm"] <= 1e-9 * records[0]["grad_norm"])
        assert records[-1]["round"] == stop
        if scale == 1.0:
            first = stop
        else:
            assert stop == first
    assert StopRule(tol=1e-9).rule({"grad_norm": 1.0}) == "grad_norm <= 1e-09 x grad_norm at round 0"
    assert StopRule(tol=1e-9).rule({"suboptimality": 1.0}) == "suboptimality <= 1e-09 x |O*|"  # relative (issue 23)


def test_a_record_without_grad_norm_never_stops_on_tol():
    rule = StopRule(rounds=5, tol=1e-3)
    assert rule.status({"objective": 1.0}, {"objective": 1.0}) is None


def test_distributed_newton_counts_its_collectives():
    X, y = data()
    problems = [dane.problems.LogReg(X, y, lam=1e-3).build(rank, 2) for rank in range(2)]

    results = ThreadGroup(2).run(lambda comm: (distributed_newton(problems[comm.rank], comm), comm.calls))
    ((ref, rounds), calls), _ = results
    assert rounds == calls > 0 and f"({rounds} collectives)" in ref.source
    attach_all(dane.problems.LogReg(X, y, lam=1e-3), problems)  # optimum=none: nothing attached
    assert problems[0].metric_names == ("objective",)


def test_a_float32_run_makes_the_float64_reference_a_float64_run_reads(tmp_path, monkeypatch):
    """The reference is solved in float64 whatever the run's dtype, so the cache entry (keyed by the data, not the
    dtype) that a float32 run leaves is the one a float64 run solves for itself, bit for bit.

    Rows of 0s and 1s, exact in float32, have one key in both dtypes: a float32 run's reference, once solved in
    float32, was read by the float64 run with ‖∇O(w*)‖ at float32's round-off, and its suboptimality went negative.
    The float32 run's O* is O(w*) as it computes it, in float32."""
    monkeypatch.setenv("DANE_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(0)
    X = (rng.random((400, 10)) < 0.3).astype(float)
    y = np.where(X @ rng.standard_normal(10) + 0.5 * rng.standard_normal(400) > 0.6, 1.0, -1.0)
    config = dane.problems.LogReg(scipy.sparse.csr_matrix(X), y, lam=1e-4, fit_intercept=True, optimum="auto",
                                  local_solver="cg")
    runs = {}
    for dtype in ("float32", "float64"):
        precision = dataclasses.replace(config, dtype=dtype)
        runs[dtype] = [precision.build(rank, 2) for rank in range(2)]
        attach_all(precision, runs[dtype])
    assert len(list((tmp_path / "optimum").glob("*.pt"))) == 1
    exact = solve([dataclasses.replace(config, optimum="none").build(rank, 2) for rank in range(2)])
    cached = runs["float64"][0]
    assert torch.equal(cached.w_star, exact.w) and cached.f_star == exact.objective
    single = runs["float32"][0]
    assert single.w_star.dtype == torch.float32 and torch.equal(single.w_star, exact.w.float())
    in_float32 = ThreadGroup(2).run(lambda comm: global_value_grad(runs["float32"][comm.rank], comm, single.w_star))
    assert single.f_star == in_float32[0][0] != exact.objective
    assert "from cache" in cached.notes[-1] and "in float64" in single.notes[-1]
