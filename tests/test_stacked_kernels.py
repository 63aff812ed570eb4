"""dane.problems.stacked_kernels against the batched BLAS products they replace (float64, to round-off)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from dane.problems import stacked_kernels
from dane.problems.stacked import matvec, rmatvec


@pytest.fixture(scope="module")
def stack():
    g = torch.Generator().manual_seed(3)
    m, n, d = 7, 5, 11  # n < d: the low-rank shards these kernels serve
    X = torch.randn(m, n, d, generator=g, dtype=torch.float64)
    values, Q = torch.linalg.eigh(X @ X.mT)
    return X, Q.contiguous(), 0.3 + 2.0 * values, torch.randn(m, d, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("shared", [False, True])
def test_gram_vector_is_xt_x_v(stack, shared):
    X, _, _, V = stack
    v = V[0] if shared else V
    out = np.empty((X.shape[0], X.shape[2]))
    stacked_kernels.gram_vector(X.numpy(), v.reshape(-1, X.shape[2]).numpy(), out)
    expected = rmatvec(X, matvec(X, v))
    assert np.abs(out - expected.numpy()).max() <= 1e-13 * expected.abs().max().item()


@pytest.mark.parametrize("shared", [False, True])
def test_woodbury_products_are_the_low_rank_solve(stack, shared):
    """X_iᵀ(Q_i diag(ℓ̃_i) Q_iᵀ)⁻¹X_i r_i, and through it the Woodbury identity itself: (sI + w X_iᵀX_i)⁻¹ r_i
    = (r_i − w X_iᵀ(sI + w X_iX_iᵀ)⁻¹X_i r_i)/s against a dense solve."""
    X, Q, shifted, R = stack
    r = R[0].expand_as(R) if shared else R
    out = np.empty(R.shape)
    stacked_kernels.woodbury_products(X.numpy(), Q.numpy(), shifted.numpy(), (R[:1] if shared else R).numpy(), out)
    expected = rmatvec(X, matvec(Q, rmatvec(Q, matvec(X, r)) / shifted))
    assert np.abs(out - expected.numpy()).max() <= 1e-13 * expected.abs().max().item()
    s, w = 0.3, 2.0
    dense = torch.linalg.solve(s * torch.eye(X.shape[2], dtype=X.dtype) + w * X.mT @ X, r.unsqueeze(-1)).squeeze(-1)
    woodbury = (r.numpy() - w * out) / s
    assert np.abs(woodbury - dense.numpy()).max() <= 1e-12 * dense.abs().max().item()
