"""dane/problems/stacked_rows.py: the passes over the stacked rows (FedNL's oracles) equal, bit for bit, the products
they replaced: SciPy's CSR products (X x, the (m·d) x N operator of the clients' gradients, P f''(z) on a client's
block), the loss's torch functions and ``numpy.bincount``, for all clients and for a few (FedNL-PP's), on binary rows
(whose values the passes do not read) and on real-valued ones, for the logistic and the squared loss."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse
import torch

from dane.losses import LOSSES
from dane.problems.glm import LinearModelShard, to_torch
from dane.losses import ROW_VALUES
from dane.problems.stacked_hessians import CompactHessians, sorted_union
from dane.problems.stacked_rows import StackedRows
from test_fednl import LAM, shards_of, sparse_logistic


def shards(loss: str, ones: float, m: int = 5):
    X, y = sparse_logistic(n=203, ones=ones)  # 203 rows over 5 clients: 40 or 41 each
    if loss == "squared":
        y = X @ np.random.default_rng(3).normal(size=X.shape[1])
    parts = np.array_split(np.arange(X.shape[0]), m)
    return [LinearModelShard(to_torch(X[p]), torch.from_numpy(y[p]), LOSSES[loss], l2=LAM, weight=m / X.shape[0])
            for p in parts]


def replaced(clients: CompactHessians, x: np.ndarray, members=None):
    """The former pass: (grads, compact Hessians, values or None) by SciPy's products and torch's losses."""
    rows_of = clients.rows
    X, m, d, S, w, loss = rows_of.X, clients.m, clients.d, clients.S, clients.weight, rows_of.loss
    n = X.shape[0]
    client = np.repeat(np.arange(m), np.diff(rows_of.start))
    entry_rows = np.repeat(np.arange(n), np.diff(X.indptr))
    B_T = scipy.sparse.csr_matrix((X.data * w, (client[entry_rows] * d + X.indices, entry_rows)), shape=(m * d, n))
    if members is None:
        zt, yt = torch.from_numpy(X @ x), torch.from_numpy(rows_of.y)
        grads = (B_T @ loss.dz(zt, yt).numpy()).reshape(m, d)
        hess = (clients.P @ loss.hess(zt, yt, torch.ones_like(zt)).numpy()).reshape(m, S)
        values = w * np.bincount(client, weights=ROW_VALUES[loss.name](zt[:, None], yt[:, None]).numpy(), minlength=m)
        return grads, hess, values
    grads, hess = np.empty((len(members), d)), np.empty((len(members), S))
    for k, c in enumerate(members):
        rows = slice(rows_of.start[c], rows_of.start[c + 1])
        zt, yt = torch.from_numpy(X[rows] @ x), torch.from_numpy(rows_of.y[rows])
        grads[k] = B_T[c * d:(c + 1) * d][:, rows] @ loss.dz(zt, yt).numpy()
        hess[k] = clients.P[c * S:(c + 1) * S][:, rows] @ loss.hess(zt, yt, torch.ones_like(zt)).numpy()
    return grads, hess, None


@pytest.mark.parametrize("loss", ["logistic", "squared"])
@pytest.mark.parametrize("ones", [1.0, 0.7])
def test_the_passes_equal_the_products_they_replaced_bit_for_bit(loss, ones):
    problem = StackedRows(shards(loss, ones))
    clients = CompactHessians(problem)
    assert problem.unit == clients.unit == (ones == 1.0)  # binary rows: X's values all 1, P's all w
    x = np.random.default_rng(1).normal(size=clients.d) * 0.3
    for members in (None, np.array([3, 0, 4])):
        grads, hess, values = replaced(clients, x, members)
        g, h = clients.gradients_hessians(x, members)
        rows = np.arange(clients.m) if members is None else members
        np.testing.assert_array_equal(g, grads + LAM * x)
        h_expected = hess.copy()
        h_expected[np.arange(len(rows))[:, None], clients.diag_slots[rows]] += LAM
        np.testing.assert_array_equal(h, h_expected)
        if values is not None:  # the record's metrics, from the pass the round just made
            grad_t, metrics = problem.evaluate(torch.from_numpy(x))
            np.testing.assert_array_equal(grad_t.numpy(), grads + LAM * x)
            np.testing.assert_array_equal(metrics[:, 0].numpy(), values + 0.5 * LAM * float(x @ x))
            np.testing.assert_array_equal(problem.objective(torch.from_numpy(x)).numpy(), metrics[:, 0].numpy())
    np.testing.assert_allclose(problem.objective(torch.from_numpy(x)).numpy(),  # and each client's own objective
                               [s.objective(torch.from_numpy(x)).item() for s in problem.shards], rtol=1e-14)


def test_sorted_union_is_numpys():
    gen = np.random.default_rng(0)
    a, b = gen.integers(0, 1000, 500), gen.integers(0, 1000, 300)
    np.testing.assert_array_equal(sorted_union(a, b), np.union1d(a, b))
    assert len(sorted_union(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))) == 0


def test_the_hessians_are_built_once_per_rows_and_whole():
    """`CompactHessians.kept`: the rows keep their Hessians; asked again with the same ``whole`` they are the same
    object, with the other a new one (the whole triangle: S = T), kept in its place."""
    problem = StackedRows(shards_of(*sparse_logistic(n=90, d=30, density=0.06, ones=0.0), 3))
    assert problem.hessians is None
    first = CompactHessians.kept(problem)
    assert CompactHessians.kept(problem) is first is problem.hessians and first.S < first.T
    whole = CompactHessians.kept(problem, whole=True)
    assert whole is not first and whole is problem.hessians and whole.S == whole.T == 31 * 32 // 2
