r"""FedNL's passes over the stacked rows: the clients' margins, losses, gradients and curvatures, with no loop per client.

For the rows j of client c (CSR rows ``start[c]..start[c+1]`` of the stacked X, targets y, row weight w = m/N):

.. math:: z_j = x_j^\top x,\qquad v_c = w\sum_{j\in S_c} f(z_j, y_j),\qquad
          g_c = \sum_{j\in S_c} (w\,x_j)\,f'(z_j, y_j),\qquad h_j = f''(z_j, y_j).

`row_pass` gives them for all m clients or for a few (FedNL-PP's sampled ones): z by SciPy's CSR product
(a few clients' rows: the same loop, compiled, on their row ranges), f, f' and f'' by the loss's own torch
functions (`dane.losses`, and `dane.problems.stacked.ROW_VALUES` for f; on a few clients' rows client by
client, as each client alone computes them), and the sums v_c and g_c by one compiled loop (numba) that
scatters each row into its client's gradient row.  The
former pass multiplied an (m·d) x N operator (row (c, a): client c's entries of feature a) by f', which
read twice the memory of X and cost about as much as the rest of the record; `block_products` is the
compact Hessians' product P h on some clients' rows only.

Every sum runs in the order of the products it replaces (row by row; within a client, the rows in order;
the weights w·x_ja as that operator stored them; v_c as ``numpy.bincount`` adds), so the results are
bit for bit the former ones.  The loops index through unsigned views of the CSR arrays (`unsigned`):
with signed indices numba tests each for a negative value, which made its CSR loop slower than SciPy's.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
import scipy.sparse
import torch

from dane.problems.stacked import ROW_VALUES


class RowPass(NamedTuple):
    """`row_pass`'s outputs at ``x``: z and h at the clients' rows (in their order), v (s,) (None for a few
    clients), g (s, d) (None without gradients), h (None without curvature)."""

    x: np.ndarray
    z: np.ndarray
    values: np.ndarray
    grads: np.ndarray | None
    curv: np.ndarray | None


def row_pass(X: scipy.sparse.csr_matrix, y: np.ndarray, start: np.ndarray, x: np.ndarray, loss, weight: float,
             clients: np.ndarray | None = None, *, gradients: bool = True, curvature: bool = False,
             unit: bool = False) -> RowPass:
    """The module docstring's (z, v, g, h) for ``clients`` (stack rows, in this order; None: all m, z and h then
    over all N rows in order, and v; a few clients: v None), ``loss`` a `dane.losses.Loss` with one output.
    ``unit``: every stored value of X is 1.0 (binary features; `unit_values`)."""
    d = X.shape[1]
    indptr, indices = unsigned(X.indptr), unsigned(X.indices)
    every = clients is None
    clients = np.arange(len(start) - 1) if every else np.asarray(clients, dtype=np.int64)
    sizes = start[clients + 1] - start[clients]
    if every and not unit:
        z = X @ x
    else:
        z = np.empty(int(sizes.sum()))
        _kernels()[0](indptr, indices, X.data, unit, x, unsigned(start), unsigned(clients), z)
    if every:
        zt, yt = torch.from_numpy(z), torch.from_numpy(y)
        values = ROW_VALUES[loss.name](zt[:, None], yt[:, None]).numpy()
        dz = loss.dz(zt, yt).numpy() if gradients else np.zeros(0)
        curv = loss.hess(zt, yt, torch.ones_like(zt)).numpy() if curvature else None
    else:
        values, dz, curv = None, np.empty(len(z)), np.empty(len(z)) if curvature else None
        at = 0
        for c, n_c in zip(clients, sizes):  # torch on each client's rows alone: its vector loop then rounds them as
            rows = slice(at, at + n_c)       # the per-worker path does (a longer array shifts which rows take its tail)
            zt, yt = torch.from_numpy(z[rows]), torch.from_numpy(y[start[c]:start[c + 1]])
            dz[rows] = loss.dz(zt, yt).numpy()
            if curvature:
                curv[rows] = loss.hess(zt, yt, torch.ones_like(zt)).numpy()
            at += n_c
    grads = np.zeros((len(clients), d if gradients else 0))
    sums = np.zeros(len(clients))
    _kernels()[1](indptr, indices, X.data, unit, float(weight), dz, np.zeros(0) if values is None else values,
                  unsigned(start), unsigned(clients), gradients, values is not None, grads, sums)
    return RowPass(x.copy(), z, None if values is None else weight * sums, grads if gradients else None, curv)


def block_products(P: scipy.sparse.csr_matrix, h: np.ndarray, start: np.ndarray, clients: np.ndarray | None, S: int,
                   *, value: float | None = None) -> np.ndarray:
    """(s, S): rows c·S .. c·S + S − 1 of the CSR product P h for each c in ``clients`` (None: all, in order) (SciPy's
    order of the sums), h given at the clients' rows only, in their order (`row_pass`'s); P's columns are the
    stacked rows.  ``value``: every stored value of P (binary rows: the row weight), which then is not read."""
    clients = np.arange(len(start) - 1) if clients is None else np.asarray(clients, dtype=np.int64)
    out = np.empty((len(clients), S))
    _kernels()[2](unsigned(P.indptr), unsigned(P.indices), P.data, value is not None, 0.0 if value is None else value,
                  h, unsigned(start), unsigned(clients), np.uint64(S), out)
    return out


def unit_values(A: scipy.sparse.csr_matrix, value: float = 1.0) -> bool:
    """Whether every stored value of A is ``value`` (then the passes do not read them: a third of the memory)."""
    return bool(A.nnz) and bool(np.all(A.data == value))


def unsigned(index: np.ndarray) -> np.ndarray:
    """Non-negative integer indices as an unsigned view (module docstring; other integer types copied to int64)."""
    index = np.asarray(index)
    if index.dtype not in (np.int32, np.int64):
        index = index.astype(np.int64)
    return index.view(np.uint32 if index.dtype == np.int32 else np.uint64)


@functools.cache
def _kernels():
    """(margins, sums, block_products), compiled by numba on first use (``cache=True``: once per machine)."""
    import numba

    @numba.njit(cache=True, nogil=True)
    def margins(indptr, indices, data, unit, x, start, clients, z):  # z: the clients' rows, in order
        at = 0
        for c in clients:
            for j in range(start[c], start[c + 1]):
                s = 0.0
                if unit:  # 1.0 · x_a is x_a: the same sum without reading the values
                    for p in range(indptr[j], indptr[j + 1]):
                        s += x[indices[p]]
                else:
                    for p in range(indptr[j], indptr[j + 1]):
                        s += data[p] * x[indices[p]]
                z[at] = s
                at += 1

    @numba.njit(cache=True, nogil=True)
    def sums(indptr, indices, data, unit, weight, dz, values, start, clients, gradients, with_values, grads, totals):
        at = 0
        for k in range(len(clients)):
            c = clients[k]
            g = grads[k]  # the client's gradient row (empty without gradients)
            total = 0.0
            for j in range(start[c], start[c + 1]):
                if with_values:
                    total += values[at]
                if gradients:
                    if unit:  # (1.0 · w) f' is w f'
                        step = weight * dz[at]
                        for p in range(indptr[j], indptr[j + 1]):
                            g[indices[p]] += step
                    else:
                        for p in range(indptr[j], indptr[j + 1]):
                            g[indices[p]] += (data[p] * weight) * dz[at]
                at += 1
            totals[k] = total

    @numba.njit(cache=True, nogil=True)
    def block_products_(indptr, indices, data, constant, value, h, start, clients, S, out):
        at = 0  # where h holds client k's first row (P's columns are stacked rows, h the clients' rows only)
        for k in range(len(clients)):
            c = clients[k]
            first, shift = c * S, start[c]
            for r in range(S):
                s = 0.0
                if constant:  # every product is ``value``: the same sum without reading them
                    for p in range(indptr[first + r], indptr[first + r + 1]):
                        s += value * h[at + (indices[p] - shift)]
                else:
                    for p in range(indptr[first + r], indptr[first + r + 1]):
                        s += data[p] * h[at + (indices[p] - shift)]
                out[k, r] = s
            at += start[c + 1] - shift

    return margins, sums, block_products_
