"""DANE and GIANT on logistic regression against a plain NumPy implementation on the same shards.

The reference below is written from the papers' update rules with NumPy only (dense
Hessians, np.linalg.solve, scipy for the local DANE solve), independent of the package's
local solvers, CG and communicator: the iterates of the exact methods must agree to round-off.
"""
from __future__ import annotations

import numpy as np
import pytest
from scipy.special import expit

import dane

LAM, M = 1e-2, 4


def problem_data(n=400, d=8, seed=3):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)) * np.linspace(1.5, 0.3, d)
    y = np.where(X @ rng.standard_normal(d) + 0.5 * rng.standard_normal(n) > 0, 1.0, -1.0)
    return X, y


def local_terms(X, y, N):
    """O_i(w) = (m/N) Σ log(1 + exp(-y x'w)) + (λ/2)||w||², its gradient and Hessian, in NumPy."""
    def value(w):
        return M / N * np.sum(np.logaddexp(0, -y * (X @ w))) + 0.5 * LAM * w @ w

    def grad(w):
        return M / N * X.T @ (-y * expit(-y * (X @ w))) + LAM * w

    def hess(w):
        s = expit(X @ w)
        return M / N * (X.T * (s * (1 - s))) @ X + LAM * np.eye(X.shape[1])

    return value, grad, hess


def reference_dane(X, y, rows, rounds, mu):
    N, d = X.shape
    terms = [local_terms(X[r], y[r], N) for r in rows]
    w, iterates = np.zeros(d), []
    for _ in range(rounds):
        iterates.append(w)
        g = np.mean([grad(w) for _, grad, _ in terms], axis=0)
        local = []
        for value, grad, hess in terms:
            lin = grad(w) - g                                     # ∇O_i(w_t) − η g, η = 1
            v = w.copy()
            for _ in range(50):                                   # Newton on the DANE subproblem, to round-off
                gv = grad(v) - lin + mu * (v - w)
                if np.linalg.norm(gv) < 1e-15:
                    break
                v = v - np.linalg.solve(hess(v) + mu * np.eye(d), gv)
            local.append(v)
        w = np.mean(local, axis=0)
    return np.array(iterates)


def reference_giant(X, y, rows, rounds):
    N, d = X.shape
    terms = [local_terms(X[r], y[r], N) for r in rows]
    objective = lambda w: np.mean([value(w) for value, _, _ in terms])  # noqa: E731
    w, iterates = np.zeros(d), []
    for _ in range(rounds):
        iterates.append(w)
        g = np.mean([grad(w) for _, grad, _ in terms], axis=0)
        p = np.mean([np.linalg.solve(hess(w), g) for _, _, hess in terms], axis=0)
        for alpha in 0.5 ** np.arange(10):                       # largest step meeting Armijo (c = 1e-4)
            if objective(w - alpha * p) <= objective(w) - 1e-4 * alpha * g @ p:
                break
        w = w - alpha * p
    return np.array(iterates)


@pytest.mark.parametrize("mu", [0.0, 0.05])
def test_dane_iterates_equal_a_numpy_dane(mu, tmp_path):
    X, y = problem_data()
    rows = dane.shards(len(y), M, seed=0)
    reference = reference_dane(X, y, rows, rounds=6, mu=mu)
    result = dane.fit(dane.problems.LogReg(X, y, lam=LAM, local_tol=1e-14), "dane", workers=M, rounds=6,
                      safeguard=False, mu=mu, out_dir=str(tmp_path))
    objectives = [r["objective"] for r in result.records]
    assert objectives[6] < 0.5 * objectives[0]  # it moved: the comparison is not of two starting points
    ref_objectives = [np.mean(np.logaddexp(0, -y * (X @ w))) + 0.5 * LAM * w @ w for w in reference]
    np.testing.assert_allclose(objectives[:6], ref_objectives, rtol=1e-12, atol=0)
    final = reference_dane(X, y, rows, rounds=7, mu=mu)[-1]
    np.testing.assert_allclose(result.w.numpy(), final, rtol=0, atol=1e-11)


def test_giant_iterates_equal_a_numpy_giant():
    X, y = problem_data()
    rows = dane.shards(len(y), M, seed=0)
    final = reference_giant(X, y, rows, rounds=7)[-1]
    result = dane.fit(dane.problems.LogReg(X, y, lam=LAM), "giant", workers=M, rounds=6, cg_tol=1e-14)
    assert result.records[-1]["objective"] < 0.5 * result.records[0]["objective"]
    np.testing.assert_allclose(result.w.numpy(), final, rtol=0, atol=1e-11)
    assert all(r["step_size"] in (1.0, 0.5, 0.25) for r in result.records[:-1])
