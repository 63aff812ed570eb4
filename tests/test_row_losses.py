"""`dane.problems.row_losses`: f and f' on many clients' rows at once, bit for bit torch's client by client."""
import numpy as np
import pytest
import torch

from dane.losses import LOSSES, ROW_VALUES
from dane.problems.row_losses import (GRAIN, client_losses, client_loop, exact_split, logistic_scalar, one_pass,
                                      whole_blocks)
from dane.problems.stacked import rmatvec
from dane.problems.stacked_kernels import exact_products


def rows(name: str, sizes: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, 15.0, int(sizes.sum()))  # both sides of softplus' threshold (48 ln 2) after −y z
    y = rng.choice([-1.0, 1.0], len(z)) if name == "logistic" else rng.normal(0.0, 2.0, len(z))
    return z, y


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(a.view(np.int64), b.view(np.int64))


@pytest.mark.parametrize("name", ["logistic", "squared"])
@pytest.mark.parametrize("sizes", [np.arange(1, 70), np.array([1, 40_000, 3, 17, 16, 32]), np.array([5])])
def test_client_losses_is_the_client_loop_bit_for_bit(name, sizes):
    """Clients of 1 to 69 rows (every tail length at B = 8 or 16), and one over torch's parallel grain."""
    z, y = rows(name, sizes)
    got, want = client_losses(LOSSES[name], z, y, sizes), client_loop(LOSSES[name], z, y, sizes)
    assert all(same_bits(g, w) for g, w in zip(got, want))


def test_exact_split_blocks():
    """`exact_split` answers a block B only where the split reproduces the loop; B is 2 x torch's lanes."""
    block = exact_split("logistic")
    assert block in (None, 8, 16)
    assert exact_split("softmax") is None  # no split: client_losses would run the loop


def test_logistic_scalar_formulas():
    """x = −y z; f = x above 48 ln 2 (the softplus threshold), log1p(exp(x)) else; f' = −y σ(x), at hand-checked
    points."""
    z, y = np.array([0.0, -40.0, 2.0, 30.0]), np.array([1.0, 1.0, -1.0, -1.0])
    values, dz = logistic_scalar(z, y)
    assert values[0] == np.log(2.0) and dz[0] == -0.5
    assert values[1] == 40.0  # x = 40 > 48 ln 2: x itself
    assert values[2] == np.log1p(np.exp(2.0)) and dz[2] == pytest.approx(1.0 / (1.0 + np.exp(-2.0)), rel=1e-15)
    assert values[3] == np.log1p(np.exp(30.0)) != 30.0  # x = 30: below the threshold, so not x


def test_the_logistic_loss_is_float64_exact_above_torchs_threshold_on_both_paths():
    """f(x) = x + log1p(e^{−x}) to an ulp for x above torch's softplus threshold 20, which returned x (at 20.0001 off
    by e^{−20.0001}); up to 20 the rows' values are torch's default softplus bit for bit; the compiled scalar loop
    gives torch's own scalar values (one row a call) around the new threshold 48 ln 2."""
    x = np.array([20.0001, 25.0, 30.0, 33.0, 33.27, 33.3, 34.0, 40.0, 100.0])
    value = np.array([float(LOSSES["logistic"].value(torch.tensor([-v]), torch.tensor([1.0]))) for v in x])
    exact = x + np.log1p(np.exp(-x))
    assert np.all(np.abs(value - exact) <= np.spacing(exact)), (value - exact).tolist()
    assert np.array_equal(value[-3:], x[-3:])  # above 48 ln 2: x itself
    below = torch.linspace(-30.0, 20.0, 5001, dtype=torch.float64)  # x = −y z with y = 1
    rows = ROW_VALUES["logistic"](-below[:, None], torch.ones(len(below), 1, dtype=torch.float64))
    assert torch.equal(rows, torch.nn.functional.softplus(below))
    around = np.linspace(30.0, 36.0, 601)
    scalar, _ = logistic_scalar(-around, np.ones_like(around))
    torch_scalar = np.array([float(ROW_VALUES["logistic"](torch.tensor([[-v]]), torch.ones(1, 1))[0]) for v in around])
    assert same_bits(scalar, torch_scalar)


@pytest.fixture
def two_threads():
    """torch at 2 threads (this machine's), restored after: `whole_blocks` reads the thread count."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_whole_blocks_follows_the_thread_split(two_threads):
    """2 threads: 2·GRAIN + 32 elements split 32,784 + 32,784 (whole blocks of 16), 2·GRAIN + 48 split 32,792 twice
    (8 left over in each); up to the grain one thread takes all; a count off the block never holds."""
    assert whole_blocks(2 * GRAIN + 32, 16) and not whole_blocks(2 * GRAIN + 48, 16)
    assert whole_blocks(GRAIN, 16) and not whole_blocks(GRAIN - 8, 16)


@pytest.mark.parametrize("name", ["logistic", "squared"])
@pytest.mark.parametrize("shape", [(4_000, 20, 7), (6_000, 24, 3)])
def test_one_pass_is_the_three_passes_bit_for_bit(two_threads, name, shape):
    """A stack over several chunks (k clients a chunk, k·n ≤ GRAIN a multiple of B) at a w whose margins reach both
    sides of softplus' threshold: the three passes' bits (z = Xw, the rows' f summed per client, X_iᵀf'_i); a stack
    whose rows leave a thread a partial block (19 x 4,001 rows) gets None."""
    if exact_split(name) is None or not exact_products(*shape[1:]):
        pytest.skip("torch's loops here are not those exact_split and exact_products check")
    g = torch.Generator().manual_seed(1)
    m, n, d = shape
    X = torch.randn(m, n, d, generator=g, dtype=torch.float64)
    y = torch.sign(torch.randn(m, n, generator=g, dtype=torch.float64))
    w = 4.0 * torch.randn(d, generator=g, dtype=torch.float64)
    loss = LOSSES[name]
    z = X @ w
    want = (ROW_VALUES[name](z, y), rmatvec(X, loss.dz(z, y)))
    got = one_pass(loss, X, y, w)
    assert got is not None and all(torch.equal(a, b) for a, b in zip(got, want))
    assert one_pass(loss, torch.randn(4_001, 19, d, dtype=torch.float64), torch.ones(4_001, 19, dtype=torch.float64),
                    w) is None
