r"""SVRG's inner loop compiled by numba: the fast path of `dane.numerics.svrg.svrg`.

The math is `dane.numerics.svrg.svrg_reference`'s, on the rows of a linear model
(`dane.problems.glm.LinearModelShard.svrg_rows`): φ(w) = D(w) + (s/2)‖w‖² + ⟨c_0, w⟩ with
:math:`D(w) = \text{weight}\sum_j f(x_j^\top W, y_j)`, s = λ + μ and c_0 = −linear − μ·anchor
(so that ∇φ(w) = ∇D(w) + s w + c_0).  Per snapshot :math:`\tilde w` the kernel computes the
snapshot's margins :math:`\tilde z_j` and full gradient once, c = ∇D(w̃) + c_0, and then
takes the steps

.. math:: w \leftarrow (1 - \gamma s)\, w - \gamma\, c
          - \gamma\,\frac{n}{b}\,\text{weight}\sum_{j\in B} x_j\,(f'(z_j) - f'(\tilde z_j))

with the rows B in the order given (the caller draws it, so that both paths see the same
draws).  The first snapshot is the anchor, where the caller's round computed ∇D(w̃) already
(`dane.numerics.local_solvers.Subproblem.data_grad_at_anchor`): given as ``c_first`` = ∇D(w̃) + c_0,
it is not summed again, and only the snapshot's margins are computed there (the kernel keeps
f'(z̃_j) in place of each step's second row gradient, which the count, 2b/n a step, counts).
Dense rows update w directly.  Sparse (CSR) rows keep w = α u − β c, so that a step touches
only the row's non-zeros: α ← (1 − γs) α, β ← (1 − γs) β + γ,
u ← u − γ (n/b) weight Σ x_j δ_j / α, and a margin is α ⟨x_j, u⟩ − β ⟨x_j, c⟩ with
⟨x_j, c⟩ computed once per snapshot; u is rescaled (α = 1) when α falls below
`RESCALE_BELOW`.  Same iterates in exact arithmetic; in floating point they agree with
the reference to round-off (tests/test_svrg.py).

numba is imported here, and this module only when SVRG runs (never at ``import dane``);
``cache=True`` keeps the machine code on disk beside this file (or in
``NUMBA_CACHE_DIR``), so that later processes load it instead of compiling again.
"""
from __future__ import annotations

import math

import numpy as np

from ..work import count
from . import jit
from .jit import FASTMATH  # the dense rows' kernels only: the CSR kernels compile without it

numba = jit.numba()  # with its compiles marked as start-up (`dane.numerics.jit`)

SQUARED, LOGISTIC, SOFTMAX = 0, 1, 2
LOSS_CODES = {"squared": SQUARED, "logistic": LOGISTIC, "softmax": SOFTMAX}
RESCALE_BELOW = 1e-3  # sparse path: fold α into u below this, so that u's updates stay within 1e3 x w's scale


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def _dz_scalar(loss, z, y):
    """∂f/∂z of the squared or logistic loss at margin z, target y."""
    if loss == SQUARED:
        return z - y
    t = -y * z  # logistic: -y sigmoid(-y z), the sigmoid evaluated without overflow
    if t >= 0:
        return -y / (1.0 + math.exp(-t))
    e = math.exp(t)
    return -y * e / (1.0 + e)


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def _dz_softmax(z, y, out):
    """out = softmax(z) − e_y, z of length K, y the class index (as a float)."""
    K = z.shape[0]
    top = z[0]
    for k in range(1, K):
        top = max(top, z[k])
    total = 0.0
    for k in range(K):
        out[k] = math.exp(z[k] - top)
        total += out[k]
    for k in range(K):
        out[k] /= total
    out[int(y)] -= 1.0


# ------------------------------------------------------------------------------------- one output (K = 1)
@numba.njit(cache=True, nogil=True)
def _fold(alpha, u, beta, c, out):
    """out = α u − β c: the sparse path's iterate w from its scaled form (out may be u itself)."""
    for i in range(u.shape[0]):
        out[i] = alpha * u[i] - beta * c[i]


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def svrg_dense(X, y, loss, weight, lr, shrink, scale, w, c0, c_first, order, steps, b):
    """SVRG from w (overwritten and returned) on dense rows X (n x d), squared or logistic loss:
    ``len(order) // (steps * b)`` snapshots, each followed by ``steps`` steps of b rows from ``order``."""
    n, d = X.shape
    snapshots = order.shape[0] // (steps * b)
    g_snap = np.empty(n)  # f'(z̃_j): fixed per snapshot
    c = np.empty(d)
    a = np.empty(b)
    decay, coeff = 1.0 - lr * shrink, lr * scale * weight
    pos = 0
    for s in range(snapshots):
        given = s == 0 and c_first.shape[0] > 0  # the first snapshot's ∇D(w̃) + c_0, the caller's
        c[:] = c_first if given else c0
        for j in range(n):  # the snapshot's f'(z̃_j) and (unless given) full gradient ∇D(w̃)
            z = 0.0
            for f in range(d):
                z += X[j, f] * w[f]
            g_snap[j] = _dz_scalar(loss, z, y[j])
            if not given:
                gj = weight * g_snap[j]
                for f in range(d):
                    c[f] += X[j, f] * gj
        for _ in range(steps):
            for r in range(b):
                j = order[pos + r]
                z = 0.0
                for f in range(d):
                    z += X[j, f] * w[f]
                a[r] = coeff * (_dz_scalar(loss, z, y[j]) - g_snap[j])
            if b == 1:  # the default: one row, hoisted out of the update (which then vectorizes)
                j, a0 = order[pos], a[0]
                for f in range(d):
                    w[f] = decay * w[f] - lr * c[f] - a0 * X[j, f]
            else:
                for f in range(d):
                    v = decay * w[f] - lr * c[f]
                    for r in range(b):
                        v -= a[r] * X[order[pos + r], f]
                    w[f] = v
            pos += b
    return w


@numba.njit(cache=True, nogil=True)
def svrg_csr(indptr, indices, data, y, loss, weight, lr, shrink, scale, w, c0, c_first, order, steps, b):
    """`svrg_dense` on CSR rows, w kept as α u − β c between snapshots (see the module docstring)."""
    n, d = indptr.shape[0] - 1, w.shape[0]
    snapshots = order.shape[0] // (steps * b)
    g_snap = np.empty(n)
    x_c = np.empty(n)  # <x_j, c>
    c = np.empty(d)
    a = np.empty(b)
    u = w  # w's buffer holds u during the steps
    decay, coeff = 1.0 - lr * shrink, lr * scale * weight
    pos = 0
    for s in range(snapshots):
        given = s == 0 and c_first.shape[0] > 0
        c[:] = c_first if given else c0
        for j in range(n):
            z = 0.0
            for p in range(indptr[j], indptr[j + 1]):
                z += data[p] * w[indices[p]]
            g_snap[j] = _dz_scalar(loss, z, y[j])
            if not given:
                gj = weight * g_snap[j]
                for p in range(indptr[j], indptr[j + 1]):
                    c[indices[p]] += data[p] * gj
        for j in range(n):
            z = 0.0
            for p in range(indptr[j], indptr[j + 1]):
                z += data[p] * c[indices[p]]
            x_c[j] = z
        alpha, beta = 1.0, 0.0
        for _ in range(steps):
            for r in range(b):
                j = order[pos + r]
                z = 0.0
                for p in range(indptr[j], indptr[j + 1]):
                    z += data[p] * u[indices[p]]
                a[r] = _dz_scalar(loss, alpha * z - beta * x_c[j], y[j]) - g_snap[j]
            alpha *= decay
            beta = decay * beta + lr
            for r in range(b):
                j = order[pos + r]
                step = coeff * a[r] / alpha
                for p in range(indptr[j], indptr[j + 1]):
                    u[indices[p]] -= step * data[p]
            if alpha < RESCALE_BELOW:
                _fold(alpha, u, beta, c, u)
                alpha, beta = 1.0, 0.0
            pos += b
        _fold(alpha, u, beta, c, w)
    return w


# ------------------------------------------------------------------------------------- softmax (K classes)
@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def svrg_dense_softmax(X, y, K, weight, lr, shrink, scale, w, c0, c_first, order, steps, b):
    """`svrg_dense` for softmax: W = w viewed d x K (feature-major), margins z_j = x_jᵀW."""
    n, d = X.shape
    D = d * K
    snapshots = order.shape[0] // (steps * b)
    g_snap = np.empty((n, K))
    z = np.empty(K)
    deltas = np.empty((b, K))
    c = np.empty(D)
    decay, coeff = 1.0 - lr * shrink, lr * scale * weight
    pos = 0
    for s in range(snapshots):
        given = s == 0 and c_first.shape[0] > 0
        c[:] = c_first if given else c0
        for j in range(n):
            _dense_margins(X, j, w, K, z)
            _dz_softmax(z, y[j], g_snap[j])
            if not given:
                for f in range(d):
                    x = X[j, f] * weight
                    for k in range(K):
                        c[f * K + k] += x * g_snap[j, k]
        for _ in range(steps):
            for r in range(b):
                j = order[pos + r]
                _dense_margins(X, j, w, K, z)
                _dz_softmax(z, y[j], deltas[r])
                for k in range(K):
                    deltas[r, k] = coeff * (deltas[r, k] - g_snap[j, k])
            for i in range(D):
                w[i] = decay * w[i] - lr * c[i]
            for r in range(b):
                j = order[pos + r]
                for f in range(d):
                    x = X[j, f]
                    for k in range(K):
                        w[f * K + k] -= x * deltas[r, k]
            pos += b
    return w


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def _dense_margins(X, j, w, K, out):
    out[:] = 0.0
    for f in range(X.shape[1]):
        x = X[j, f]
        for k in range(K):
            out[k] += x * w[f * K + k]


@numba.njit(cache=True, nogil=True)
def _csr_margins(indptr, indices, data, j, v, K, out):
    out[:] = 0.0
    for p in range(indptr[j], indptr[j + 1]):
        x, f = data[p], indices[p]
        for k in range(K):
            out[k] += x * v[f * K + k]


@numba.njit(cache=True, nogil=True)
def svrg_csr_softmax(indptr, indices, data, y, K, weight, lr, shrink, scale, w, c0, c_first, order, steps, b):
    """`svrg_csr` for softmax (w = α u − β c between snapshots)."""
    n, D = indptr.shape[0] - 1, w.shape[0]
    snapshots = order.shape[0] // (steps * b)
    g_snap = np.empty((n, K))
    x_c = np.empty((n, K))
    z = np.empty(K)
    deltas = np.empty((b, K))
    c = np.empty(D)
    u = w
    decay, coeff = 1.0 - lr * shrink, lr * scale * weight
    pos = 0
    for s in range(snapshots):
        given = s == 0 and c_first.shape[0] > 0
        c[:] = c_first if given else c0
        for j in range(n):
            _csr_margins(indptr, indices, data, j, w, K, z)
            _dz_softmax(z, y[j], g_snap[j])
            if not given:
                for p in range(indptr[j], indptr[j + 1]):
                    x, f = data[p] * weight, indices[p]
                    for k in range(K):
                        c[f * K + k] += x * g_snap[j, k]
        for j in range(n):
            _csr_margins(indptr, indices, data, j, c, K, x_c[j])
        alpha, beta = 1.0, 0.0
        for _ in range(steps):
            for r in range(b):
                j = order[pos + r]
                _csr_margins(indptr, indices, data, j, u, K, z)
                for k in range(K):
                    z[k] = alpha * z[k] - beta * x_c[j, k]
                _dz_softmax(z, y[j], deltas[r])
                for k in range(K):
                    deltas[r, k] -= g_snap[j, k]
            alpha *= decay
            beta = decay * beta + lr
            for r in range(b):
                j = order[pos + r]
                step = coeff / alpha
                for p in range(indptr[j], indptr[j + 1]):
                    x, f = step * data[p], indices[p]
                    for k in range(K):
                        u[f * K + k] -= x * deltas[r, k]
            if alpha < RESCALE_BELOW:
                _fold(alpha, u, beta, c, u)
                alpha, beta = 1.0, 0.0
            pos += b
        _fold(alpha, u, beta, c, w)
    return w


def run(rows, *, lr: float, shrink: float, scale: float, w: np.ndarray, c0: np.ndarray, c_first: np.ndarray,
        order: np.ndarray, steps: int, b: int) -> np.ndarray:
    """SVRG on ``rows`` (a `dane.problems.glm.SVRGRows`) from w (a fresh array, overwritten and returned); ``c_first``:
    the first snapshot's ∇D(w̃) + c_0, from the caller's gradient at the anchor, or empty (the kernel computes it)."""
    loss = LOSS_CODES[rows.loss]
    # each snapshot a full gradient (the first one the caller's where given), then steps corrections of b rows at
    # two points
    snapshots = order.shape[0] // (steps * b)
    given = 1 if snapshots and len(c_first) else 0
    count("local_passes", snapshots * (1 + 2 * steps * b / len(rows.y)) - given)
    count("local_solver_iters", snapshots * steps)
    args = (rows.weight, lr, shrink, scale, w, c0, c_first, order, steps, b)
    if loss == SOFTMAX:
        if rows.X is not None:
            return svrg_dense_softmax(rows.X, rows.y, rows.classes, *args)
        return svrg_csr_softmax(rows.indptr, rows.indices, rows.data, rows.y, rows.classes, *args)
    if rows.X is not None:
        return svrg_dense(rows.X, rows.y, loss, *args)
    return svrg_csr(rows.indptr, rows.indices, rows.data, rows.y, loss, *args)


def load(rows) -> None:
    """Dispatch the kernel `run` takes for ``rows``, with no rows to visit: numba loads its machine code from the cache
    (or compiles it, on a machine whose cache is empty) now, not in the first solve.

    `dane.numerics.svrg.load_svrg` calls it as a method is built, so that numba's start in a process (its
    import, LLVM's set-up and the cached code, or a compile where the cache is empty: ``make bench`` section ``svrg``,
    cell ``first_round``) falls in the run's set-up, not in its first round.  Same argument types as a solve's: 1-d
    arrays of the rows' dtype, int64 ``order``, Python scalars."""
    dtype = rows.X.dtype if rows.X is not None else rows.data.dtype
    empty = np.zeros(0, dtype=dtype)
    run(rows, lr=0.0, shrink=0.0, scale=1.0, w=empty.copy(), c0=empty, c_first=empty,
        order=np.zeros(0, dtype=np.int64), steps=1, b=1)
