"""`dane.problems.row_losses`: f and f' on many clients' rows at once, bit for bit torch's client by client."""
import numpy as np
import pytest

from dane.losses import LOSSES
from dane.problems.row_losses import client_losses, client_loop, exact_split, logistic_scalar


def rows(name: str, sizes: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, 15.0, int(sizes.sum()))  # both sides of softplus' threshold 20 after −y z
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
    """x = −y z; f = x above 20 (softplus' threshold), log1p(exp(x)) else; f' = −y σ(x), at hand-checked points."""
    z, y = np.array([0.0, -30.0, 2.0]), np.array([1.0, 1.0, -1.0])
    values, dz = logistic_scalar(z, y)
    assert values[0] == np.log(2.0) and dz[0] == -0.5
    assert values[1] == 30.0  # x = 30 > 20: x itself
    assert values[2] == np.log1p(np.exp(2.0)) and dz[2] == pytest.approx(1.0 / (1.0 + np.exp(-2.0)), rel=1e-15)
