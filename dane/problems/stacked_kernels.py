r"""The low-rank `dane.problems.stacked.StackedRidge`'s two products over all m workers, compiled by numba.

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
round-off (``tests/test_batched.py``).  numba is imported here, and this module only when a
low-rank stacked ridge runs on the CPU; ``cache=True`` keeps the machine code on disk.
"""
from __future__ import annotations

import numba
import numpy as np

#: sums may be reassociated (a dot product then vectorizes) and a*b+c fused; no assumption about inf or nan
FASTMATH = {"reassoc", "contract"}


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
