"""The rest of the FedNL line (baselines/newton_star.py, ...): each round against a NumPy transcription of the
paper's (FedNL-Public's ``methods.py`` conventions where they can be matched) on a tiny problem, and the bits of
each message against a hand count."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse
import torch

from dane.baselines.newton_star import NewtonStarConfig
from dane.errors import ConfigError
from dane.losses import LOSSES
from dane.problems.glm import LinearModelShard, add_intercept, to_torch
from helpers import simulate, straight_and_resumed

LAM, M, D = 1e-2, 3, 5  # d = D + 1 with the intercept


def data(n=60, seed=0):
    rng = np.random.default_rng(seed)
    X = add_intercept(scipy.sparse.csr_matrix(rng.normal(size=(n, D)))).tocsr()
    y = np.where(X @ rng.normal(size=D + 1) + 0.5 * rng.normal(size=n) > 0, 1.0, -1.0)
    return X, y


def dense(X, y, loss):
    A, n = X.toarray(), len(y)

    def grad(w):
        z = A @ w
        dz = -y / (1 + np.exp(y * z)) if loss == "logistic" else z - y
        return A.T @ dz / n + LAM * w

    def hess(w):
        s = 1 / (1 + np.exp(-(A @ w))) if loss == "logistic" else None
        c = s * (1 - s) if loss == "logistic" else np.ones(n)
        return (A.T * c) @ A / n + LAM * np.eye(A.shape[1])

    return grad, hess


def optimum(grad, hess, d):
    w = np.zeros(d)
    for _ in range(40):
        w = w - np.linalg.solve(hess(w), grad(w))
    return w


def shards(X, y, loss, w_star=None):
    parts = np.array_split(np.arange(X.shape[0]), M)
    out = [LinearModelShard(to_torch(X[p]), torch.from_numpy(y[p]), LOSSES[loss], l2=LAM, weight=M / X.shape[0])
           for p in parts]
    if w_star is not None:
        for shard in out:
            shard.set_reference(torch.from_numpy(w_star), 0.0)
    return out


@pytest.fixture(scope="module")
def logistic():
    X, y = data()
    grad, hess = dense(X, y, "logistic")
    w_star = optimum(grad, hess, X.shape[1])
    assert np.linalg.norm(grad(w_star)) < 1e-14
    return X, y, grad, hess, w_star


# ------------------------------------------------------------------ Newton-Star
def test_newton_star_one_step_on_a_quadratic():
    X, y = data(seed=1)
    grad, hess = dense(X, y, "squared")
    w_star = np.linalg.solve(hess(np.zeros(D + 1)), -grad(np.zeros(D + 1)))
    _, records, ws = simulate(NewtonStarConfig(), shards(X, y, "squared", w_star), 2)[0]
    np.testing.assert_allclose(ws[1].numpy(), w_star, rtol=0, atol=1e-13)


def test_newton_star_iterates_and_bits(logistic):
    """x_{k+1} = x_k − ∇²O(x*)⁻¹∇O(x_k) (FedNL-Public's ``Newton_Star.step``), 3 rounds, and the bits: 64·d(d+1)/2
    once, 64·d a round, per client."""
    X, y, grad, hess, w_star = logistic
    algo, records, ws = simulate(NewtonStarConfig(), shards(X, y, "logistic", w_star), 3)[0]
    d, H_star, x = D + 1, hess(w_star), np.zeros(D + 1)
    for k in range(1, 4):
        x = x - np.linalg.inv(H_star) @ grad(x)
        np.testing.assert_allclose(ws[k].numpy(), x, rtol=0, atol=1e-12)
    assert [r["clients_uplink_bits"] for r in records] == [M * 64 * (21 + k * 6) for k in (1, 2, 3, 3)]  # + the last
    assert d * (d + 1) // 2 == 21


def test_newton_star_needs_the_optimum(logistic):
    X, y, *_ = logistic
    with pytest.raises(ConfigError, match="algorithm=newton_star steps with the Hessian at the optimum"):
        simulate(NewtonStarConfig(), shards(X, y, "logistic"), 1)
    with pytest.raises(ConfigError, match="algorithm=newton_star does not take algorithm.clients_per_round=2"):
        NewtonStarConfig(clients_per_round=2)


def test_newton_star_resumes(logistic):
    X, y, _, _, w_star = logistic
    for straight, resumed, w1, w2 in straight_and_resumed(NewtonStarConfig(), shards(X, y, "logistic", w_star)):
        assert straight == resumed and torch.equal(w1, w2)
