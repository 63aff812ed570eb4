"""Local SGD's best election (``algorithm.aggregate=best``) on shards of unequal size.

Each worker's O_i carries its shard weight m n_i / N (so that the mean of the O_i is the loss over all rows): scored
by O_i(w_i), the smallest shard won whatever its model.  The score is the mean loss per row on the worker's own
shard plus the regularizer (`dane.problems.Problem.validation_objective`), here computed by hand (NumPy, or torch
on the shards' own rows) against the linear models' shards, the stacked rows (the batched path), a ridge shard
and a network's shard; and the elected worker is the one with the lowest, on the per-worker path and the batched
one.  Equal shards keep O_i(w_i) bit for bit (`tests/test_baselines.py`'s election, the batched tests).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dane import work
from dane.baselines.local_sgd import LocalSGDConfig
from dane.losses import LOSSES
from dane.numerics.inner import InnerSolver
from dane.problems import neural_shard
from dane.problems.glm import LinearModelShard
from dane.problems.ridge import quadratic_shard
from dane.problems.stacked_rows import StackedRows
from helpers import simulate, simulate_stacked

SIZES = (6, 40, 24, 90)  # worker 0: the smallest shard, its labels random: the worst model per row
LAM, LR, K = 1e-2, 0.5, 3


def rows() -> list[tuple[np.ndarray, np.ndarray]]:
    """Each worker's (X_i, y_i): ±1 labels of a planted model, but worker 0's drawn at random."""
    rng = np.random.default_rng(0)
    w_true = 2 * rng.standard_normal(5)
    parts = []
    for i, n in enumerate(SIZES):
        X = rng.standard_normal((n, 5))
        parts.append((X, np.sign(X @ w_true) if i else rng.choice([-1.0, 1.0], n)))
    return parts


def shards(parts) -> list[LinearModelShard]:
    N = sum(len(y) for _, y in parts)
    return [LinearModelShard(torch.from_numpy(X), torch.from_numpy(y), LOSSES["logistic"], l2=LAM,
                             weight=len(parts) / N) for X, y in parts]


def refused(*args, **kwargs):
    raise AssertionError("a gradient the score throws away")


def by_hand(parts) -> tuple[list[np.ndarray], list[float], list[float]]:
    """Each worker's K gradient steps from 0 on O_i(w) = (m/N) Σ_j log(1 + exp(−y_j x_jᵀw)) + (λ/2)‖w‖²; its model,
    its mean loss per row plus (λ/2)‖w‖², and O_i, there."""
    m, N = len(parts), sum(len(y) for _, y in parts)
    models, per_row, objectives = [], [], []
    for X, y in parts:
        w = np.zeros(X.shape[1])
        for _ in range(K):
            w = w - LR * ((m / N) * X.T @ (-y / (1 + np.exp(y * (X @ w)))) + LAM * w)
        losses = np.logaddexp(0.0, -y * (X @ w))
        models.append(w)
        per_row.append(losses.mean() + LAM / 2 * w @ w)
        objectives.append((m / N) * losses.sum() + LAM / 2 * w @ w)
    return models, per_row, objectives


def test_the_score_is_the_mean_loss_per_row_plus_the_regularizer():
    parts = rows()
    models, per_row, _ = by_hand(parts)
    W = torch.from_numpy(np.stack(models))
    own = [float(p.validation_objective(W[i])) for i, p in enumerate(shards(parts))]
    np.testing.assert_allclose(own, per_row, rtol=1e-13)
    stacked = StackedRows(shards(parts))
    np.testing.assert_allclose(stacked.validation_objective(W).numpy(), per_row, rtol=1e-13)  # one point a worker
    shared = [(np.logaddexp(0.0, -y * (X @ models[1])).mean() + LAM / 2 * models[1] @ models[1]) for X, y in parts]
    np.testing.assert_allclose(stacked.validation_objective(W[1]).numpy(), shared, rtol=1e-13)  # one point for all
    # a ridge shard, O_i = (m/N)‖X_i w − y_i‖² + λ‖w‖² with n_i ≠ N/m: ‖X_i w − y_i‖² / n_i + λ‖w‖²
    X, y = parts[2]
    ridge = quadratic_shard(torch.from_numpy(X), torch.from_numpy(y), 0.1, scale=4 / 160)
    r = X @ models[2] - y
    assert float(ridge.validation_objective(W[2])) == pytest.approx(r @ r / 24 + 0.1 * models[2] @ models[2], rel=1e-13)


def test_a_networks_score_is_its_mean_cross_entropy_per_row(monkeypatch):
    """A network's shard of 24 of N = 160 rows (weight m n_i / N = 0.6): its mean cross-entropy over those rows,
    by torch on them, plus (l2/2)‖w‖²; forward passes only, counted as one pass."""
    monkeypatch.setattr(neural_shard, "preload_optimizers", lambda: None)  # torch._dynamo's import: seconds
    gen = torch.Generator().manual_seed(0)
    X, y = torch.randn(24, 5, generator=gen, dtype=torch.float64), torch.randint(0, 3, (24,), generator=gen)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3)).double()
    problem = neural_shard.NeuralProblem(
        model, X, y, X[:4], y[:4], weight=4 * 24 / 160, test_weight=1.0, num_classes=3, workers=4, l2=0.1,
        inner=InnerSolver(), grad_batches=None, eval_batch_size=10, device=torch.device("cpu"), dtype=torch.float64,
        sampler_seed=0)
    w = problem.initial_point() + 0.3
    torch.nn.utils.vector_to_parameters(w, model.parameters())
    with torch.no_grad():
        expected = float(F.cross_entropy(model(X), y)) + 0.05 * float(w @ w)
    assert float(problem.evaluate(w)[1][0]) != pytest.approx(expected, rel=1e-3)  # O_i carries the weight 0.6
    monkeypatch.setattr(torch.Tensor, "backward", refused)
    ledger = work.Ledger((0,), work.unit_costs(problem))
    with work.opened(ledger):
        score = problem.validation_objective(w)
    assert float(score) == pytest.approx(expected, rel=1e-13)
    assert not score.requires_grad  # no autograd graph was recorded
    assert ledger.counts[0, work.COUNTS.index("local_passes")] == 1.0


@pytest.mark.parametrize("path", ["threads", "batched"])
def test_the_lowest_loss_per_row_is_elected_not_the_smallest_shard(path):
    parts = rows()
    models, per_row, objectives = by_hand(parts)
    best = int(np.argmin(per_row))
    assert int(np.argmin(objectives)) == 0 != best  # O_i(w_i) would elect the smallest shard, its labels random
    config = LocalSGDConfig(local_steps=K, lr=LR, aggregate="best")
    if path == "threads":
        results = simulate(config, shards(parts), rounds=1)
    else:
        results = simulate_stacked(config, StackedRows(shards(parts)), rounds=1)
    for _, records, iterates in results:
        assert records[0]["elected"] == best
        np.testing.assert_allclose(iterates[1].numpy(), models[best], rtol=1e-12)


def test_the_score_is_one_pass_without_a_gradient(monkeypatch):
    """The election's validation is the method's work (`dane.work`: a full value pass counts 1), by a forward pass:
    the gradient passes of `evaluate` are never run."""
    parts = rows()
    problems = shards(parts)
    stacked = StackedRows(shards(parts))

    monkeypatch.setattr(LinearModelShard, "data_value_grad", refused)
    monkeypatch.setattr(StackedRows, "evaluate", refused)
    for problem, ranks, w in [(problems[1], (1,), torch.ones(5, dtype=torch.float64)),
                              (stacked, range(4), torch.ones(4, 5, dtype=torch.float64)),
                              (stacked, range(4), torch.ones(5, dtype=torch.float64))]:
        ledger = work.Ledger(ranks, work.unit_costs(problem))
        with work.opened(ledger):
            problem.validation_objective(w)
        assert list(ledger.counts[:, work.COUNTS.index("local_passes")]) == [1.0] * len(ranks)
