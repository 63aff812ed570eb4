r"""A loss's f and f' on many clients' rows at once, bit for bit as torch gives them on each client's rows alone.

A client's local pass (`dane.problems.stacked_rows.each_pass`) computes, on its own n_c rows,

.. math:: v_j = f(z_j, y_j),\qquad f'_j = \partial f/\partial z\,(z_j, y_j)

by the loss's torch functions (`dane.losses`, its ``ROW_VALUES``), as the per-worker path does.
Torch's CPU loop takes an array in blocks of B = 2 x (its vector's width in doubles) elements by the vectorized
formula and the last n_c mod B by the scalar one (the C library's exp and log1p), and the two may differ in the
last bit; the value at a row therefore depends on where the row falls in its client's array.  One torch call on
all clients' rows moves those boundaries, so `client_losses` splits the rows instead: each client's first
⌊n_c/B⌋·B rows (its blocks), all clients' together, go through one torch call in pieces of whole blocks below
torch's parallel grain (a piece split across threads would start a scalar tail mid-array); the rest, the
clients' tails, through a compiled loop (numba) of the scalar formula, which calls the same C library:

- logistic: x = −y z, f = x if x > T else log1p(exp(x)) (torch's softplus, β = 1, threshold T =
  `dane.losses.SOFTPLUS_THRESHOLD`, passed to the compiled loop: numba's cache would keep a constant it read),
  f' = −y / (1 + exp(−x)) (−y times torch's sigmoid);
- squared: no transcendental function; the whole array in one torch call.

B is read from torch's CPU capability, and the split is checked once per process and loss against the
client-by-client loop on rows of 1 to 3B + 1 rows each and margins on both sides of the threshold
(`exact_split`): where it does not agree (another platform, another torch), `client_losses` runs that loop.

*One pass over a stack.*  `one_pass` gives a stack of m equal shards X (m, n, d) at a shared w its three passes'
results, z = Xw (one matrix-vector product over all rows), the rows' f summed per client and X_iᵀf'_i, bit for
bit, while reading X once instead of twice: a few clients at a time (k of them, k·n ≤ the grain and a multiple of
B), whose rows are still in cache for the second product.  Each chunk's z is the same product's rows (the BLAS
product takes each row's sum alone), the per-client sums are per row, and the chunk's f and f' are its whole
blocks, as the whole array's are where each of torch's threads takes a multiple of B elements
(`whole_blocks`); elsewhere `one_pass` answers None and the caller makes the three passes.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import torch

from ..losses import LOSSES, ROW_VALUES, SOFTPLUS_THRESHOLD
from ..numerics import jit

#: torch's vector width in float64 lanes by its CPU capability (`torch.backends.cpu.get_cpu_capability`)
LANES = {"AVX512": 8, "AVX2": 4, "DEFAULT": 4}
#: torch's `at::internal::GRAIN_SIZE`: an elementwise loop over fewer elements runs on one thread
GRAIN = 32768


def client_losses(loss, z: np.ndarray, y: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(f, f') at the rows of clients of ``sizes`` rows each, laid one client after another in z and y, each row's
    values as torch gives them on its client's rows alone (module docstring)."""
    block = exact_split(loss.name)
    if block is None:
        return client_loop(loss, z, y, sizes)
    return split(loss, z, y, sizes, block)


def whole(loss, z: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(f, f') of one torch call on all of z."""
    zt, yt = torch.from_numpy(z), torch.from_numpy(y)
    return ROW_VALUES[loss.name](zt[:, None], yt[:, None]).numpy(), loss.dz(zt, yt).numpy()


def client_loop(loss, z: np.ndarray, y: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(f, f') by one torch call per client: the reference `client_losses` reproduces."""
    values, dz = np.empty(len(z)), np.empty(len(z))
    at = 0
    for n_c in sizes.tolist():
        rows = slice(at, at + n_c)
        values[rows], dz[rows] = whole(loss, z[rows], y[rows])
        at += n_c
    return values, dz


@functools.cache
def exact_split(name: str) -> int | None:
    """The block B of `client_losses`' split for loss ``name``, or None where the split does not reproduce
    `client_loop` here (checked once: clients of 1 .. 3B + 1 rows, margins spread over ±60, ±1 targets)."""
    lanes = LANES.get(torch.backends.cpu.get_cpu_capability())
    if lanes is None or name not in ("logistic", "squared"):
        return None
    block = 2 * lanes
    rng = np.random.default_rng(0)
    sizes = np.tile(np.arange(1, 3 * block + 2), 8)
    z = rng.normal(0.0, 20.0, int(sizes.sum()))
    y = rng.choice([-1.0, 1.0], len(z)) if name == "logistic" else rng.normal(0.0, 3.0, len(z))
    loss = LOSSES[name]
    want = client_loop(loss, z, y, sizes)
    got = split(loss, z, y, sizes, block)
    same = all(np.array_equal(a.view(np.int64), b.view(np.int64)) for a, b in zip(want, got))
    return block if same else None


def split(loss, z: np.ndarray, y: np.ndarray, sizes: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """`client_losses` at block ``block``, unchecked (`exact_split` checks it)."""
    if loss.name == "squared":
        return whole(loss, z, y)
    offsets = np.repeat(np.cumsum(sizes) - sizes, sizes)
    head = np.arange(len(z)) - offsets < np.repeat(sizes // block * block, sizes)
    values, dz = np.empty(len(z)), np.empty(len(z))
    rows = np.flatnonzero(head)
    piece = GRAIN // 2 // block * block
    for at in range(0, len(rows), piece):
        part = rows[at:at + piece]
        values[part], dz[part] = whole(loss, z[part], y[part])
    tail = np.flatnonzero(~head)
    values[tail], dz[tail] = logistic_scalar(z[tail], y[tail])
    return values, dz


def logistic_scalar(z: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The logistic loss's (f, f') by torch's scalar formulas (module docstring), row by row."""
    values, dz = np.empty(len(z)), np.empty(len(z))
    _logistic_kernel()(z, y, values, dz, SOFTPLUS_THRESHOLD)
    return values, dz


@functools.cache
def _logistic_kernel():
    """`logistic_scalar`'s loop, compiled by numba on first use (no fastmath: the C library's exp and log1p)."""
    numba = jit.numba()

    @numba.njit(cache=True, nogil=True)
    def logistic(z, y, values, dz, threshold):
        for i in range(len(z)):
            x = -y[i] * z[i]
            values[i] = x if x > threshold else math.log1p(math.exp(x))
            dz[i] = -y[i] * (1.0 / (1.0 + math.exp(-x)))

    return logistic


def whole_blocks(numel: int, block: int) -> bool:
    """Whether torch's elementwise loop over ``numel`` contiguous elements takes every one in a whole block of
    ``block``: at::parallel_for gives each of min(threads, ⌈numel / GRAIN⌉) threads ⌈numel / threads⌉ elements
    (the last the rest), and each thread's loop runs its blocks from its first element."""
    threads = max(1, min(torch.get_num_threads(), -(-numel // GRAIN)))
    return numel % block == 0 and (-(-numel // threads)) % block == 0


def one_pass(loss, X: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(Σ_{j∈i} f(x_jᵀw, y_j), X_iᵀ f'(X_i w)) for every client of the float64 CPU stack X (m, n, d), y (m, n) at
    a shared w (d,): shapes (m,) and (m, d), the bits of ``ROW_VALUES[loss](X @ w, y)`` and
    ``rmatvec(X, loss.dz(X @ w, y))`` (`dane.problems.stacked`) in one pass over X (module docstring); None where
    the chunks would not reproduce them (a loss without `exact_split`, a thread split off the blocks)."""
    from .stacked_kernels import exact_products, per_worker_rmatvec

    m, n, d = X.shape
    block = exact_split(loss.name)
    if block is None or not (whole_blocks(m * n, block) and X.is_contiguous() and y.is_contiguous()):
        return None
    step = block // math.gcd(n, block)  # clients a chunk grows by: k·n stays a multiple of the block
    k = GRAIN // n // step * step
    if k == 0 or not exact_products(n, d):
        return None
    values, grads = torch.empty(m, dtype=X.dtype), torch.empty(m, d, dtype=X.dtype)
    row_value, out = ROW_VALUES[loss.name], grads.numpy()
    for at in range(0, m, k):
        rows, labels = X[at:at + k], y[at:at + k]
        z = rows @ w
        values[at:at + k] = row_value(z, labels)
        per_worker_rmatvec(rows.numpy(), loss.dz(z, labels).numpy(), out[at:at + k])
    return values, grads
