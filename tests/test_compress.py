"""dane.compress: unbiasedness and variance against closed forms, contraction bounds, exact bit counts."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dane.compress import Dither, ErrorFeedback, Identity, LowRank, Natural, RandK, RandSeqK, TopK, TopLEK, make
from dane.errors import ConfigError

DRAWS = 20000


def message(n: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 3


def draws(compressor, x: torch.Tensor, seed: int = 1) -> torch.Tensor:
    """DRAWS independent compressions of x: one call on DRAWS copies (each row is compressed on its own)."""
    return compressor(x.expand(DRAWS, -1).clone(), torch.Generator().manual_seed(seed))


def natural_variance(x: torch.Tensor) -> float:
    """E‖C(x) − x‖² of natural compression: Σ 4^e f(1 − f) for |x_j| = 2^e (1 + f)."""
    e = torch.floor(torch.log2(x.abs()))
    f = x.abs() / 2 ** e - 1
    return float((4 ** e * f * (1 - f)).sum())


def dither_variance(x: torch.Tensor, s: int) -> float:
    """E‖C(x) − x‖² of s-level dithering: Σ (‖x‖/s)² p(1 − p), p the fractional part of s|x_j|/‖x‖."""
    norm = torch.linalg.vector_norm(x)
    scaled = s * x.abs() / norm
    p = scaled - scaled.floor()
    return float(((norm / s) ** 2 * p * (1 - p)).sum())


@pytest.mark.parametrize("compressor, variance", [
    (RandK(k=5), lambda x: (x.numel() / 5 - 1) * float(x @ x)),
    (RandK(k=0.3), lambda x: (x.numel() / 15 - 1) * float(x @ x)),
    (Natural(), natural_variance),
    (Dither(s=1), lambda x: dither_variance(x, 1)),
    (Dither(s=4), lambda x: dither_variance(x, 4)),
])
def test_unbiased_compressors_match_their_mean_and_variance(compressor, variance):
    x = message()
    out = draws(compressor, x)
    exact = variance(x)
    # the closed-form variance is within the declared bound ω‖x‖²
    assert compressor.unbiased and exact <= compressor.omega(x.numel()) * float(x @ x) * (1 + 1e-12)
    # E‖mean − x‖² = exact/DRAWS; by Chebyshev the squared error exceeds 100× that with probability ≤ 1%
    # (the seed is fixed, so the test is deterministic; the bound says how unlucky a seed would have to be)
    assert float(((out.mean(0) - x) ** 2).sum()) <= 100 * exact / DRAWS
    # the mean of ‖C(x) − x‖² over the draws is the closed form to 5 standard errors
    sq = ((out - x) ** 2).sum(1)
    assert abs(float(sq.mean()) - exact) <= 5 * float(sq.std()) / math.sqrt(DRAWS)


def test_natural_rounds_to_a_neighbouring_power_of_two():
    x = torch.tensor([0.0, 1.0, -3.0, 0.3, 1e-300, -4e-320, -7.5e10], dtype=torch.float64)  # -4e-320: subnormal
    out = draws(Natural(), x, seed=3)
    low = 2.0 ** torch.floor(torch.log2(x.abs()))
    for j in range(x.numel()):
        values = set(out[:, j].tolist())
        if x[j] == 0:
            assert values == {0.0}
        elif low[j] == x[j].abs():  # a power of two is sent exactly
            assert values == {float(x[j])}
        else:
            sign = float(torch.sign(x[j]))
            assert values == {sign * float(low[j]), sign * 2 * float(low[j])}


def test_topk_keeps_exactly_the_k_largest_magnitudes():
    x = torch.randn(7, 40, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    out = TopK(k=6)(x)
    for row, kept in zip(x.numpy(), out.numpy()):
        largest = np.argsort(-np.abs(row))[:6]
        expected = np.zeros_like(row)
        expected[largest] = row[largest]
        np.testing.assert_array_equal(kept, expected)
        # the contraction bound ‖C(x) − x‖² ≤ (1 − k/n)‖x‖²
        assert ((kept - row) ** 2).sum() <= (1 - TopK(k=6).delta(40)) * (row ** 2).sum()


@pytest.mark.parametrize("symmetric", [True, False])
def test_low_rank_is_the_best_rank_r_approximation(symmetric):
    gen = torch.Generator().manual_seed(4)
    a = torch.randn(3, 8, 8, generator=gen, dtype=torch.float64)
    x = a + a.mT if symmetric else a
    r = 3
    out = LowRank(r=r, symmetric=symmetric)(x)
    for matrix, approx in zip(x.numpy(), out.numpy()):
        u, s, vt = np.linalg.svd(matrix)  # Eckart–Young: the truncated SVD is the best in the Frobenius norm
        best = (u[:, :r] * s[:r]) @ vt[:r]
        np.testing.assert_allclose(approx, best, atol=1e-12)
        assert np.linalg.matrix_rank(approx) == r
        assert ((approx - matrix) ** 2).sum() <= (1 - r / 8) * (matrix ** 2).sum()
    # one matrix alone is one row
    torch.testing.assert_close(LowRank(r=r, symmetric=symmetric)(x[1]), out[1])


def test_identity_returns_the_message():
    x = message()
    assert torch.equal(Identity()(x), x) and Identity().omega(50) == 0 and Identity().delta(50) == 1


@pytest.mark.parametrize("compressor, n, value_bits, bits", [
    (Identity(), 1000, 64, 64000),
    (TopK(k=10), 1000, 64, 10 * (64 + 10)),       # 10 (index, value) pairs, ⌈log₂ 1000⌉ = 10
    (TopK(k=10), 1024, 32, 10 * (32 + 10)),       # ⌈log₂ 1024⌉ = 10
    (TopK(k=10), 1025, 64, 10 * (64 + 11)),
    (TopK(k=0.1), 1000, 64, 100 * (64 + 10)),     # a fraction: k = 0.1·n
    (TopK(k=3), 3, 64, 3 * (64 + 2)),             # K = n: every entry, with its index
    (TopK(k=0.3), 12, 64, 4 * (64 + 4)),          # round(3.6) = 4 pairs, ⌈log₂ 12⌉ = 4
    (TopK(k=0.01), 10, 64, 1 * (64 + 4)),         # round(0.1) = 0, kept at 1
    (RandK(k=0.01), 10, 64, 64),
    (RandK(k=10), 1000, 64, 640),                 # values only: the indices come from the shared seed
    (Natural(), 1000, 64, 12000),                 # sign + 11 exponent bits
    (Natural(), 1000, 32, 9000),                  # sign + 8 exponent bits
    (Natural(), 1000, 16, 6000),                  # sign + 5 exponent bits
    (Dither(s=4), 1000, 64, 64 + 1000 * (1 + 3)),  # norm, then sign + a level in {0..4}
    (Dither(s=1), 10, 64, 64 + 10 * 2),
    (Dither(s=7), 10, 32, 32 + 10 * 4),
    (LowRank(r=2), 100, 64, 2 * 11 * 64),         # 2 eigenvectors of 10 and their eigenvalues
    (LowRank(r=2, symmetric=False), 100, 64, 2 * 20 * 64),
    (LowRank(r=4), 16, 64, 4 * 5 * 64),           # r = d = 4: 4 eigenvectors of 4 and their eigenvalues
    (LowRank(r=4, symmetric=False), 16, 64, 4 * 8 * 64),
])
def test_bit_counts_equal_the_hand_derived_ones(compressor, n, value_bits, bits):
    assert compressor.bits(n, value_bits) == bits


@pytest.mark.parametrize("make_it", [lambda: make("randk:1000"), lambda: TopK(k=11), lambda: TopLEK(k=11),
                                     lambda: RandSeqK(k=11)], ids=["randk", "topk", "toplek", "randseqk"])
def test_a_count_above_the_message_is_refused(make_it):
    """K > n ran dense (K was capped at n) while the records named the spec: refused wherever the compressor meets a
    message of n < K entries (its bits, ω or δ, or the message itself); K = n keeps every entry."""
    compressor = make_it()
    expected = (f"{compressor.spec} keeps K = {compressor.k} entries of a message of 10; choose K <= 10 "
                f"({compressor.name}:10 keeps them all), or a fraction of each message ({compressor.name}:0.1)")
    for use in (lambda c: c.bits(10), lambda c: c.delta(10), lambda c: c(torch.ones(10), torch.Generator())):
        with pytest.raises(ConfigError) as error:
            use(compressor)
        assert str(error.value) == expected
    x = torch.arange(1.0, 11.0)
    kept = type(compressor)(k=10)
    assert torch.equal(kept(x, torch.Generator()), x) and kept.delta(10) == 1.0


def test_a_count_above_the_message_names_the_key_it_was_given_as():
    compressor = make("topk:20", "algorithm.compressor")
    assert compressor == make("topk:20") and compressor.key == "algorithm.compressor"
    with pytest.raises(ConfigError, match=r"^algorithm\.compressor=topk:20 keeps K = 20 entries of a message of 19; "
                                          r"choose K <= 19 \(topk:19 keeps them all\), or a fraction of each message "
                                          r"\(topk:0\.1\)$"):
        compressor.delta(19)
    assert make("topk:1e-9").k_of(10) == 1  # a fraction: of each message, at least one entry


@pytest.mark.parametrize("symmetric", [True, False])
def test_a_rank_above_the_side_is_refused(symmetric):
    """R > d ran as rank d (R was capped at d) while the records named the spec: refused wherever the compressor
    meets a d×d matrix (its bits, δ, `check_fits` as FedNL's clients are built, or the matrix itself), naming the
    key it was made for; R = d sends the whole matrix."""
    compressor = LowRank(r=5, symmetric=symmetric)
    expected = "rank:5 keeps rank R = 5 of a 4×4 matrix; choose R <= 4 (rank:4 sends the whole matrix)"
    for use in (lambda c: c.bits(16), lambda c: c.delta(16), lambda c: c.check_fits(16),
                lambda c: c(torch.eye(4, dtype=torch.float64))):
        with pytest.raises(ConfigError) as error:
            use(compressor)
        assert str(error.value) == expected
    with pytest.raises(ConfigError) as error:
        make("rank:5", "algorithm.compressor").check_fits(16)
    assert str(error.value) == f"algorithm.compressor={expected}"
    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x = x + x.T if symmetric else x
    whole = LowRank(r=4, symmetric=symmetric)
    torch.testing.assert_close(whole(x), x, rtol=0, atol=1e-12)
    assert whole.delta(16) == 1.0 and whole.check_fits(16) is None


def test_bit_count_refusals():
    with pytest.raises(ValueError) as err:
        LowRank(r=1).bits(10)
    assert str(err.value) == "rank:1 counts d×d matrices; n=10 entries is not a square"
    with pytest.raises(ConfigError) as err:
        Natural().bits(10, 8)
    assert str(err.value) == "natural compression needs IEEE floats of [16, 32, 64] bits, got value_bits=8"


@pytest.mark.parametrize("compressor", [Natural(), Dither(s=4), TopK(k=2), RandK(k=2)])
def test_an_all_zero_row_is_sent_as_zeros(compressor):
    """A zero row stays zero, exactly: dithering's levels s|x_j|/‖x‖ are 0 there, not 0/0."""
    x = torch.zeros(2, 5, dtype=torch.float64)
    assert torch.equal(compressor(x, torch.Generator().manual_seed(0)), x)


def test_randk_same_seed_same_indices():
    x = message(200)
    a = RandK(k=7)(x.expand(3, -1), torch.Generator().manual_seed(11))
    b = RandK(k=7)(x.expand(3, -1), torch.Generator().manual_seed(11))
    c = RandK(k=7)(x.expand(3, -1), torch.Generator().manual_seed(12))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert ((a != 0).sum(1) == 7).all()
    assert not torch.equal(a[0] != 0, a[1] != 0)  # each row draws its own indices
    torch.testing.assert_close(a[a != 0], (x.expand(3, -1) * 200 / 7)[a != 0])


@pytest.mark.parametrize("spec, k", [(5, 5), (0.3, 15)])
def test_randk_keeps_exactly_k_entries_each_scaled_by_n_over_k(spec, k):
    """RandK's output, with no statistics: row r keeps the first k of the r-th uniform permutation drawn from the
    generator (``torch.randperm``), each kept entry exactly x_j·n/k, the rest 0 (the unbiasedness check above,
    at 100x its expected deviation, lets a scale n/(k+1) through on its own)."""
    x, rows, n = message(), 40, 50
    out = RandK(k=spec)(x.expand(rows, -1).clone(), torch.Generator().manual_seed(3))
    gen, expected = torch.Generator().manual_seed(3), torch.zeros(rows, n, dtype=x.dtype)
    for r in range(rows):
        kept = torch.randperm(n, generator=gen)[:k]
        expected[r, kept] = x[kept] * (n / k)
    assert torch.equal(out, expected)
    assert ((out != 0).sum(1) == k).all() and bool((x != 0).all())


def test_contraction_constants():
    assert TopK(k=8).delta(100) == 0.08 and LowRank(r=2).delta(100) == 0.2
    assert TopK(k=0.3).delta(12) == 4 / 12 and TopK(k=0.01).delta(10) == 1 / 10  # k = round(k n) in [1, n]
    assert LowRank(r=4).delta(16) == 1.0  # r = d = 4: the whole matrix
    assert RandK(k=8).omega(100) == 100 / 8 - 1 and RandK(k=8).delta(100) == 8 / 100
    assert Natural().omega(5) == 1 / 8 and Dither(s=2).omega(100) == min(100 / 4, 10 / 2)
    assert math.isinf(TopK(k=1).omega(10)) and not TopK.unbiased


def test_ef21_estimate_contracts_towards_a_fixed_message():
    x = message(30)
    ef = ErrorFeedback(TopK(k=3))
    gap = float(x @ x)
    for _ in range(40):
        g = ef(x)
        new_gap = float(((x - g) ** 2).sum())
        assert new_gap <= (1 - 3 / 30) * gap * (1 + 1e-12)  # ‖x − g_{t+1}‖² ≤ (1 − δ)‖x − g_t‖²
        gap = new_gap
    assert gap < 1e-2 * float(x @ x)
    state = ef.state_dict()
    other = ErrorFeedback(TopK(k=3))
    other.load_state_dict(state)
    assert torch.equal(other(x), ef(x))


@pytest.mark.parametrize("spec, expected", [
    ("none", Identity()), ("topk:8", TopK(k=8)), ("topk:0.1", TopK(k=0.1)), ("randk:3", RandK(k=3)),
    ("natural", Natural()), ("dither:4", Dither(s=4)), ("rank:2", LowRank(r=2)), ("TopK:8", TopK(k=8)),
])
def test_make_builds_what_the_spec_names(spec, expected):
    built = make(spec)
    assert built == expected and make(built.spec) == built


@pytest.mark.parametrize("spec, says", [
    ("topk", "is not one of"), ("topk:0", "K >= 1"), ("topk:1.5", "(0, 1]"), ("randk:x", "count or a fraction"),
    ("dither:0", "S >= 1"), ("dither:1.5", "integer after the colon"), ("rank:0", "R >= 1"), ("zip", "is not one of"),
])
def test_make_refuses_a_bad_spec_in_one_line(spec, says):
    with pytest.raises(ConfigError) as err:
        make(spec)
    assert says in str(err.value) and "\n" not in str(err.value)

