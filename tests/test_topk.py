"""TopK's rule (dane/compress/sparsifiers.py): the k largest magnitudes, ties at the k-th place to the lowest
indices, on each path: the CPU's selection, the sort other devices take, and FedNL's compact rows
(dane/problems/stacked_compress.py), against hand-picked sets and a stable sort."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from dane.compress import TopK
from dane.compress.sparsifiers import top_k_indices, top_k_mask
from dane.problems.stacked_compress import compress_rows, top_k_rows
from dane.problems.stacked_hessians import CompactHessians
from dane.problems.stacked_rows import StackedRows
from test_fednl import shards_of, sparse_logistic

def top_k_reference(diff: np.ndarray, k: int) -> np.ndarray:
    """TopK of each row by its definition, a stable sort of −|x| and its first k: the reference the paths are held to."""
    kept = np.argsort(-np.abs(diff), axis=1, kind="stable")[:, :k]
    out = np.zeros_like(diff)
    np.put_along_axis(out, kept, np.take_along_axis(diff, kept, axis=1), axis=1)
    return out


# (row, k, the indices kept): worked by hand from the rule
HAND = [
    ([0, 0, 0, 0], 2, [0, 1]),                       # all zeros: τ = 0, the first two (the output is zero)
    ([0, 3, 0, -1, 0], 3, [0, 1, 3]),                # 2 non-zeros < k: both, and the first zero
    ([0, 2, 0, -2, 1], 3, [1, 3, 4]),                # non-zeros = k: exactly them
    ([1, -2, 1, 3, -1, 1], 3, [0, 1, 3]),            # 3, -2, then one of four 1s: the first
    ([1, -2, 1, 3, -1, 1], 4, [0, 1, 2, 3]),         # two of four 1s
    ([-1, 1, -1, 1, 1], 2, [0, 1]),                  # all tied
    ([2, 5, 5, 5, 1], 2, [1, 2]),                    # the tie is at the top
    ([0, -1, 0, 2, 1, 0, -1], 3, [1, 3, 4]),         # ties among zeros and ones
    ([0.5, -0.25, 0.75, 0.25], 2, [0, 2]),           # no tie
]


def expected(row: np.ndarray, kept: list[int]) -> np.ndarray:
    out = np.zeros_like(row)
    out[kept] = row[kept]
    return out


@pytest.mark.parametrize("row, k, kept", HAND)
def test_the_rule_on_hand_made_rows(row, k, kept):
    x = np.array([row], dtype=np.float64)
    assert np.flatnonzero(top_k_mask(np.abs(x), k)[0]).tolist() == kept
    assert sorted(top_k_indices(torch.from_numpy(x), k)[0].tolist()) == kept
    want = expected(x[0], kept)
    np.testing.assert_array_equal(TopK(k=k)(torch.from_numpy(x[0])).numpy(), want)
    compact = np.zeros_like(x)
    top_k_rows()(x, k, compact)
    np.testing.assert_array_equal(compact[0], want)
    np.testing.assert_array_equal(top_k_reference(x, k)[0], want)


def tied_rows(seed: int, rows: int, n: int, zeros: float) -> np.ndarray:
    """Rows of values in {0, ±1, ±2}, a share ``zeros`` of them zero: ties everywhere."""
    rng = np.random.default_rng(seed)
    values = rng.choice([1.0, -1.0, 2.0, -2.0], size=(rows, n))
    return np.where(rng.random((rows, n)) < zeros, 0.0, values)


@pytest.mark.parametrize("zeros", [0.0, 0.5, 0.95, 1.0])
@pytest.mark.parametrize("k", [1, 7, 40, 199])
def test_every_path_equals_a_stable_sort(zeros, k):
    x = tied_rows(k, 30, 200, zeros)
    want = top_k_reference(x, k)
    assert (np.count_nonzero(want, axis=1) == np.minimum(k, np.count_nonzero(x, axis=1))).all()
    compact = np.zeros_like(x)
    top_k_rows()(x, k, compact)
    np.testing.assert_array_equal(compact, want)
    t = torch.from_numpy(x)
    np.testing.assert_array_equal(TopK(k=k)(t).numpy(), want)  # the CPU's path
    idx = top_k_indices(t, k)                                     # other devices' path, here on the CPU
    np.testing.assert_array_equal(torch.zeros_like(t).scatter_(1, idx, t.gather(1, idx)).numpy(), want)
    x32 = x.astype(np.float32)
    np.testing.assert_array_equal(TopK(k=k)(torch.from_numpy(x32)).numpy(), want.astype(np.float32))
    compact32 = np.zeros_like(x32)
    top_k_rows()(x32, k, compact32)
    np.testing.assert_array_equal(compact32, want.astype(np.float32))


def test_distinct_magnitudes_keep_the_k_largest():
    """Without ties the rule is plain TopK: on normal rows, the k entries of largest magnitude, each row's error
    within the contraction bound (1 − k/n)‖x‖²."""
    x = np.random.default_rng(3).normal(size=(20, 500))
    compact = np.zeros_like(x)
    top_k_rows()(x, 25, compact)
    for row, kept in zip(x, compact):
        largest = np.argsort(-np.abs(row))[:25]
        np.testing.assert_array_equal(kept, expected(row, list(largest)))
        assert ((kept - row) ** 2).sum() <= (1 - 25 / 500) * (row ** 2).sum()


def test_compact_rows_on_every_bit_of_the_magnitudes():
    """The selection reads the magnitudes' bits a digit at a time: on magnitudes from subnormals to 1e300, and on
    neighbours one ulp apart (they differ in the last digit alone), it keeps what a stable sort keeps."""
    rng = np.random.default_rng(5)
    wide = rng.normal(size=(10, 300)) * 10.0 ** rng.integers(-300, 300, size=(10, 300))
    wide[:, :5] = 5e-324
    steps = (1.5 + np.arange(8) * np.spacing(1.5))[rng.integers(0, 8, size=(10, 300))]  # 1.5 and 7 ulps above
    ulps = steps * rng.choice([-1.0, 1.0], size=(10, 300))
    assert len(np.unique(np.abs(ulps))) == 8
    for x in (wide, ulps, ulps.astype(np.float32)):
        for k in (1, 17, 150, 299):
            compact = np.zeros_like(x)
            top_k_rows()(x, k, compact)
            np.testing.assert_array_equal(compact, top_k_reference(x, k))


@pytest.mark.parametrize("k, kept", [(1, [1]), (2, [1, 3]), (3, [1, 3, 5]), (4, [1, 2, 3, 5])])
def test_compact_rows_keep_nan_and_inf_first(k, kept):
    """A NaN ranks above ±inf (its bits are above inf's), as in torch's topk: a diverged client's row keeps them."""
    x = np.array([[1.0, np.nan, -3.0, np.inf, 2.0, -np.inf, 0.5]])
    compact = np.zeros_like(x)
    top_k_rows()(x, k, compact)
    np.testing.assert_array_equal(compact[0], expected(x[0], kept))


def test_topk_bits_are_unchanged():
    assert TopK(k=10).bits(45451) == 10 * (64 + 16) and TopK(k=0.01).bits(1000, 32) == 10 * (32 + 10)


@pytest.mark.parametrize("threads", [1, 3])
def test_compact_rows_keep_the_packed_triangles_choice(threads):
    """On binary rows (ties at the k-th place), compress_rows keeps what TopK keeps of the whole packed triangle,
    in any number of thread blocks."""
    X, y = sparse_logistic(n=90, d=30, density=0.06, ones=1.0)
    clients = CompactHessians(StackedRows(shards_of(X, y, 5)))
    diff = clients.gradients_hessians(np.full(clients.d, 0.1))[1] - clients.gradients_hessians(np.zeros(clients.d))[1]
    packed = clients.expand(diff)
    k = 12
    magnitudes = -np.sort(-np.abs(packed), axis=1)
    assert (magnitudes[:, k - 1] == magnitudes[:, k]).any() and (magnitudes[:, k] > 0).any()  # a tie straddles k
    got = clients.expand(compress_rows(TopK(k=k), diff, clients, None, seed=0, draw=0, threads=threads))
    np.testing.assert_array_equal(got, TopK(k=k)(torch.from_numpy(np.ascontiguousarray(packed))).numpy())
    np.testing.assert_array_equal(got, top_k_reference(packed, k))
