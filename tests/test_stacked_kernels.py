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


@pytest.mark.parametrize("shape", [(40, 20, 50), (9, 1, 4), (6, 300, 3), (5, 3, 300)])
def test_matvec_and_rmatvec_are_torchs_products_bit_for_bit(shape):
    """`matvec`/`rmatvec` with one vector per worker: torch's batched products' bits, whether the compiled loops
    run (`exact_products` true for the shape) or torch's product does (300 x 3 rows: not the index order here)."""
    g = torch.Generator().manual_seed(5)
    m, a, b = shape
    X = torch.randn(m, a, b, generator=g, dtype=torch.float64) * 10.0 ** torch.randint(-3, 4, (m, a, b), generator=g)
    v, u = torch.randn(m, b, generator=g, dtype=torch.float64), torch.randn(m, a, generator=g, dtype=torch.float64)
    assert torch.equal(matvec(X, v), (X @ v.unsqueeze(-1)).squeeze(-1))
    assert torch.equal(rmatvec(X, u), (u.unsqueeze(-2) @ X).squeeze(-2))
    assert torch.equal(matvec(X, v[:1].expand(m, b)), (X @ v[0].expand(m, b).unsqueeze(-1)).squeeze(-1))


def test_the_loops_sum_in_index_order():
    """Hand sums: 1e16 + 1 − 1e16 is 0 summed from the first term on (the 1 is lost to 1e16), not 1."""
    terms = np.array([1e16, 1.0, -1e16])
    out = np.empty((1, 1))
    stacked_kernels.per_worker_matvec(terms.reshape(1, 1, 3), np.ones((1, 3)), out)
    assert out[0, 0] == 0.0
    out = np.empty((1, 1))
    stacked_kernels.per_worker_rmatvec(terms.reshape(1, 3, 1), np.ones((1, 3)), out)
    assert out[0, 0] == 0.0
