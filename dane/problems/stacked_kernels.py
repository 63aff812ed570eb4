r"""Products over all m stacked workers compiled by numba: the low-rank `dane.problems.stacked.StackedRidge`'s two,
and the per-worker matrix-vector products of `dane.problems.stacked.matvec` and ``rmatvec``.

With n < d rows a worker, a batched ridge round is two products with each X_i (n x d): the
Hessian-vector product X_iᵀX_i v_i and the Woodbury solve's X_iᵀ u_i with
u_i = Q_i diag(1/ℓ̃_i) Q_iᵀ X_i r_i.  As batched matrix products each reads X_i twice and calls a
small GEMV per worker; here each worker's X_i is read from memory once per product, row by row:

- `gram_vector`: for each row x_j of X_i, t = ⟨x_j, v_i⟩ and then out_i += t x_j, while x_j is in
  the first-level cache;
- `woodbury_products`: t = X_i r_i, then the n x n products with Q_i, then out_i = X_iᵀ u, X_i
  still in the second-level cache (a worker's X_i is n·d·8 bytes, 400 KB at n = 100, d = 500).

One thread (the simulator's clock reads this thread's CPU time, `dane.comm.threads.ThreadCPUTime`).
The sums run in another order than the BLAS products', so results agree with them to
round-off (``tests/test_batched.py``).

*Bit for bit.*  `per_worker_matvec` (X_i v_i) and `per_worker_rmatvec` (X_iᵀ u_i) instead
reproduce torch's batched products (``X @ v[..., None]``, ``u[..., None, :] @ X``), which on float64
rows this small call one small matrix product per worker (a call's overhead per worker, however few
its rows) whose sums run in index order, one product and one addition at a time: so do these loops
(no fastmath, so no fused multiply-add), one pass over X at memory speed.  Whether they agree
with torch here is checked once per process and shape (`exact_products`, on random rows of
magnitudes 1e-3 to 1e3), and `dane.problems.stacked` calls them only where they do; elsewhere
(another torch or BLAS, float32) torch's product runs, so that a record never depends on which ran.

numba is imported here, and this module only on the CPU paths that call it; ``cache=True`` keeps
the machine code on disk.
"""
from __future__ import annotations

import functools

import numpy as np
import torch

from ..numerics import jit
from ..numerics.jit import FASTMATH

numba = jit.numba()  # with its compiles marked as start-up (`dane.numerics.jit`)



@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def gram_vector(X: np.ndarray, V: np.ndarray, out: np.ndarray) -> None:
    """out_i = X_iᵀX_i v_i for X (m, n, d), V (m, d) or one shared row (1, d), out (m, d)."""
    m, n, d = X.shape
    shared = V.shape[0] == 1
    for i in range(m):
        v = V[0] if shared else V[i]
        o = out[i]
        o[:] = 0.0
        for j in range(n):
            x = X[i, j]
            t = 0.0
            for k in range(d):
                t += x[k] * v[k]
            for k in range(d):
                o[k] += t * x[k]


@numba.njit(cache=True, nogil=True, fastmath=FASTMATH)
def woodbury_products(X: np.ndarray, Q: np.ndarray, shifted: np.ndarray, R: np.ndarray, out: np.ndarray) -> None:
    """out_i = X_iᵀ Q_i diag(1/shifted_i) Q_iᵀ X_i r_i for X (m, n, d), Q (m, n, n), shifted (m, n), R (m, d) or
    one shared row (1, d), out (m, d)."""
    m, n, d = X.shape
    shared = R.shape[0] == 1
    t = np.empty(n)
    z = np.empty(n)
    for i in range(m):
        r = R[0] if shared else R[i]
        for j in range(n):  # t = X_i r_i
            x = X[i, j]
            s = 0.0
            for k in range(d):
                s += x[k] * r[k]
            t[j] = s
        Qi = Q[i]
        z[:] = 0.0
        for j in range(n):  # z = Q_iᵀ t, by rows of Q_i
            tj = t[j]
            for a in range(n):
                z[a] += Qi[j, a] * tj
        for a in range(n):
            z[a] /= shifted[i, a]
        o = out[i]
        o[:] = 0.0
        for j in range(n):  # u = Q_i z, then out_i = X_iᵀ u
            s = 0.0
            for a in range(n):
                s += Qi[j, a] * z[a]
            x = X[i, j]
            for k in range(d):
                o[k] += s * x[k]


@numba.njit(cache=True, nogil=True)
def per_worker_matvec(X: np.ndarray, V: np.ndarray, out: np.ndarray) -> None:
    """out_i = X_i v_i for X (m, a, b), V (m, b), out (m, a): each entry summed in index order from 0."""
    m, a, b = X.shape
    for i in range(m):
        v = V[i]
        for j in range(a):
            x = X[i, j]
            s = 0.0
            for k in range(b):
                s += x[k] * v[k]
            out[i, j] = s


@numba.njit(cache=True, nogil=True)
def per_worker_rmatvec(X: np.ndarray, U: np.ndarray, out: np.ndarray) -> None:
    """out_i = X_iᵀ u_i for X (m, a, b), U (m, a), out (m, b): row j of X_i added to out_i after row j − 1."""
    m, a, b = X.shape
    for i in range(m):
        o = out[i]
        o[:] = 0.0
        for j in range(a):
            u = U[i, j]
            x = X[i, j]
            for k in range(b):
                o[k] += u * x[k]


@functools.cache
def exact_products(a: int, b: int) -> bool:
    """Whether `per_worker_matvec` and `per_worker_rmatvec` give torch's batched products bit for bit on float64
    matrices a x b (module docstring): checked on 8 workers' seeded rows of magnitudes 1e-3 to 1e3, once per process
    and shape."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((8, a, b)) * 10.0 ** rng.uniform(-3, 3, (8, a, b))
    V, U = rng.standard_normal((8, b)), rng.standard_normal((8, a)) * 10.0 ** rng.uniform(-3, 3, (8, a))
    Xt, Vt, Ut = torch.from_numpy(X), torch.from_numpy(V), torch.from_numpy(U)
    want = ((Xt @ Vt.unsqueeze(-1)).squeeze(-1).numpy(), (Ut.unsqueeze(-2) @ Xt).squeeze(-2).numpy())
    got = np.empty((8, a)), np.empty((8, b))
    per_worker_matvec(X, V, got[0])
    per_worker_rmatvec(X, U, got[1])
    return all(np.array_equal(w.view(np.int64), g.view(np.int64)) for w, g in zip(want, got))
