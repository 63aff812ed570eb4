r"""FedNL's client-side math for m clients at once: every client's gradient and Hessian from one stacked computation.

The clients are shards of one linear model with one output (`dane.problems.glm.LinearModelShard`:
rows X_i, targets y_i, loss f, weight w = m/N, ℓ2 weight λ), so that

.. math:: \nabla^2 O_i(x) = w\,X_i^\top \operatorname{diag}(f''(X_i x))\,X_i + \lambda I,
          \qquad \nabla O_i(x) = w\,X_i^\top f'(X_i x) + \lambda x .

A symmetric d x d matrix is kept as its packed upper triangle (T = d(d+1)/2 numbers, the
row-major order of ``numpy.triu_indices(d)``), and the m clients' Hessians as one (m, T)
array.  Row j of client c with non-zeros at columns a_1 < ... < a_k adds
:math:`w\,f''(z_j)\,x_{ja}x_{jb}` to entry (c, tri(a, b)) for every a ≤ b among them: k(k+1)/2
products a row instead of d².  The targets and products are laid out once, when the clients
are stacked, as the sparse (m·T) x N matrix P with :math:`P_{(c,\,tri(a,b)),\,j} = w\,x_{ja}x_{jb}`;
a round is then one sparse matrix-vector product, :math:`\mathrm{vec}(H) = P\,f''(z)`
(``make bench`` section ``fednl`` measures it against the alternatives).  The gradients are
likewise one product with the (m·d) x N matrix that places row j's values at its client's block.

Everything here is plain NumPy/SciPy over arrays stacked by client; `baselines.fednl` holds the
method.  A client subset (FedNL-PP) uses the row blocks of P of its clients only.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import scipy.sparse
import torch

from dane.errors import ConfigError


#: how `StackedClients.hessians` forms P f''(z): SciPy's CSR product (one core) or numba (`baselines.fednl_kernels`,
#: both cores; ``scripts/bench_fednl.py --kernel``); the first is the default, the faster one measured here
KERNELS = ("scipy", "numba")


def packed_size(d: int) -> int:
    """T = d(d+1)/2, the entries of a symmetric d x d matrix's upper triangle."""
    return d * (d + 1) // 2


def packed_index(a: np.ndarray, b: np.ndarray, d: int) -> np.ndarray:
    """Position of entry (a, b), a ≤ b, in the packed upper triangle (row-major, as ``numpy.triu_indices``)."""
    return a * d - a * (a - 1) // 2 + (b - a)


def diagonal_positions(d: int) -> np.ndarray:
    """The packed positions of the diagonal entries (a, a)."""
    a = np.arange(d)
    return packed_index(a, a, d)


def unpack(packed: np.ndarray, d: int) -> np.ndarray:
    """The symmetric d x d matrix (or a stack of them) of a packed upper triangle (..., T)."""
    rows, cols = np.triu_indices(d)
    full = np.zeros(packed.shape[:-1] + (d, d), dtype=packed.dtype)
    full[..., rows, cols] = packed
    full[..., cols, rows] = packed
    return full


def pack(matrix: np.ndarray) -> np.ndarray:
    """The packed upper triangle of a symmetric matrix (or a stack of them)."""
    rows, cols = np.triu_indices(matrix.shape[-1])
    return matrix[..., rows, cols]


def frobenius_norms(packed: np.ndarray, d: int) -> np.ndarray:
    """‖M_c‖_F of each packed symmetric M_c (rows of ``packed``): the off-diagonal entries count twice."""
    diag = diagonal_positions(d)
    total = 2.0 * np.einsum("ct,ct->c", packed, packed)
    total -= np.einsum("ct,ct->c", packed[:, diag], packed[:, diag])
    return np.sqrt(np.maximum(total, 0.0))


def outer_products(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, rows_client: np.ndarray,
                   scale: np.ndarray, d: int) -> scipy.sparse.csr_matrix:
    """P, (m·T) x N: row j's products scale_j x_ja x_jb at (client_j·T + tri(a, b), j), a ≤ b (module docstring).

    Rows are grouped by their number of non-zeros k, so that each group's k(k+1)/2 pairs are one
    vectorized gather; the CSR columns must be sorted within a row (a ≤ b then follows)."""
    n = len(indptr) - 1
    T = packed_size(d)
    counts = np.diff(indptr)
    targets, values, rows = [], [], []
    for k in np.unique(counts):
        if k == 0:
            continue
        group = np.flatnonzero(counts == k)
        pos = indptr[group][:, None] + np.arange(k)[None, :]
        cols, vals = indices[pos], data[pos]
        first, second = np.triu_indices(k)
        a, b = cols[:, first], cols[:, second]
        targets.append(rows_client[group][:, None] * T + packed_index(a, b, d))
        values.append(vals[:, first] * vals[:, second] * scale[group][:, None])
        rows.append(np.broadcast_to(group[:, None], a.shape))
    m = int(rows_client.max()) + 1 if n else 0
    if not targets:
        return scipy.sparse.csr_matrix((m * T, n))
    coo = scipy.sparse.coo_matrix((np.concatenate([v.ravel() for v in values]),
                                   (np.concatenate([t.ravel() for t in targets]),
                                    np.concatenate([r.ravel() for r in rows]))), shape=(m * T, n))
    return coo.tocsr()


class StackedClients:
    """The rows of m linear-model shards with one output, stacked for FedNL's batched rounds (module docstring).

    ``shards``: `dane.problems.glm.LinearModelShard` objects of one problem (same d, loss, λ), client c
    the c-th.  Dense shards are read as sparse (a dense row has d non-zeros and costs d(d+1)/2 products).
    """

    def __init__(self, shards: Sequence, *, kernel: str = "scipy"):
        first = shards[0]
        if first.classes != 1:
            raise ConfigError(f"algorithm=fednl needs a model with one output (ridge or logistic), got "
                              f"{first.classes} classes; use problem=logreg or problem=ridge")
        self.m, self.d = len(shards), first.dim
        self.T = packed_size(self.d)
        self.loss, self.l2 = first.loss, first.l2
        parts = [scipy.sparse.csr_matrix(shard_rows(s)) for s in shards]
        for part in parts:
            part.sort_indices()
        self.X = scipy.sparse.vstack(parts, format="csr")
        self.y = torch.cat([s.y.detach().to(torch.float64) for s in shards]).numpy()
        sizes = np.array([p.shape[0] for p in parts])
        self.start = np.concatenate([[0], np.cumsum(sizes)])
        self.client = np.repeat(np.arange(self.m), sizes)
        weights = {s.weight for s in shards}
        if len(weights) != 1:
            raise ConfigError(f"the stacked clients must share one row weight m/N, got {sorted(weights)}; "
                              "build every shard of one problem with the same worker count")
        self.weight = weights.pop()
        self.row_weight = np.full(len(self.client), self.weight)
        X = self.X
        self.P = outer_products(X.indptr, X.indices, X.data, self.client, self.row_weight, self.d)
        block_cols = self.client[np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))] * self.d + X.indices
        self.B_T = scipy.sparse.csr_matrix((X.data * np.repeat(self.row_weight, np.diff(X.indptr)),
                                            (block_cols, np.repeat(np.arange(X.shape[0]), np.diff(X.indptr)))),
                                           shape=(self.m * self.d, X.shape[0]))
        self.diag = diagonal_positions(self.d)
        # each entry's column among its own client's rows (FedNL-PP's blocks, `block`)
        self._P_local = (self.P.indices - self.start[self.client[self.P.indices]]).astype(np.int32)
        self._B_local = (self.B_T.indices - self.start[self.client[self.B_T.indices]]).astype(np.int32)
        if kernel not in KERNELS:
            raise ConfigError(f"the stacked Hessian kernel must be one of {' | '.join(KERNELS)}, got {kernel!r}")
        self.kernel = kernel
        # binary rows (every stored value 1): every product is the weight w, so P's pattern alone is read
        self.binary = bool(np.all(X.data == 1.0))
        self._P_parts = (self.P.indptr.astype(np.int64), self.P.indices.astype(np.int32),
                         None if self.binary else self.P.data)

    # ------------------------------------------------------------------ the clients' oracles
    def margins(self, x: np.ndarray) -> np.ndarray:
        return self.X @ x

    def gradients_hessians(self, x: np.ndarray, clients: np.ndarray | None = None
                           ) -> tuple[np.ndarray, np.ndarray]:
        """(∇O_c(x) stacked (s, d), packed ∇²O_c(x) stacked (s, T)) for ``clients`` (None: all m, in order)."""
        if clients is None:
            zt, yt = torch.from_numpy(self.margins(x)), torch.from_numpy(self.y)
            dz = self.loss.dz(zt, yt).numpy()
            curv = self.loss.hess(zt, yt, torch.ones_like(zt)).numpy()
            grads = (self.B_T @ dz).reshape(self.m, self.d)
            hess = self.hessians(curv).reshape(self.m, self.T)
        else:  # FedNL-PP: s of the m clients, each from its own rows
            grads = np.empty((len(clients), self.d))
            hess = np.empty((len(clients), self.T))
            for k, c in enumerate(clients):
                B_c, P_c, X_c, y_c = self.block(int(c))
                z = torch.from_numpy(X_c @ x)
                grads[k] = B_c @ self.loss.dz(z, y_c).numpy()
                hess[k] = P_c @ self.loss.hess(z, y_c, torch.ones_like(z)).numpy()
        grads += self.l2 * x
        hess[:, self.diag] += self.l2
        return grads, hess

    def hessians(self, curv: np.ndarray) -> np.ndarray:
        """P f''(z), the m packed data Hessians (a fresh array)."""
        if self.kernel == "scipy":
            return self.P @ curv
        from .fednl_kernels import csr_matvec  # numba, imported when a round first runs

        indptr, indices, values = self._P_parts
        v = curv * self.weight if self.binary else curv
        return csr_matvec(indptr, indices, values, v, np.empty(self.m * self.T))

    def block(self, c: int) -> tuple:
        """Client c's rows of the gradient and Hessian operators with its own rows as columns, its rows X_c and
        targets y_c (views of the stacked arrays)."""
        rows = slice(self.start[c], self.start[c + 1])
        n_c = rows.stop - rows.start
        B_c = row_block(self.B_T, c * self.d, (c + 1) * self.d, self._B_local, n_c)
        P_c = row_block(self.P, c * self.T, (c + 1) * self.T, self._P_local, n_c)
        X_c = row_block(self.X, rows.start, rows.stop)
        return B_c, P_c, X_c, torch.from_numpy(self.y[rows])

    def objective(self, x: np.ndarray) -> float:
        """O(x) = mean_c O_c(x) = (w/m) Σ_j f(z_j, y_j) + (λ/2)‖x‖² (every shard has the weight w = m/N)."""
        z = torch.from_numpy(self.margins(x))
        data = float(self.loss.value(z, torch.from_numpy(self.y)))
        return self.weight / self.m * data + 0.5 * self.l2 * float(x @ x)

    def gradient(self, x: np.ndarray) -> np.ndarray:
        """∇O(x) = mean_c ∇O_c(x)."""
        dz = self.loss.dz(torch.from_numpy(self.margins(x)), torch.from_numpy(self.y)).numpy()
        return self.weight / self.m * (self.X.T @ dz) + self.l2 * x


def row_block(A: scipy.sparse.csr_matrix, start: int, stop: int, indices: np.ndarray | None = None,
              columns: int | None = None) -> scipy.sparse.csr_matrix:
    """Rows start..stop-1 of a CSR matrix, sharing its arrays (SciPy's slicing copies them); ``indices``: other
    column indices for A's entries (then ``columns`` columns)."""
    indptr = A.indptr[start:stop + 1]
    first, last = indptr[0], indptr[-1]
    indices = A.indices if indices is None else indices
    return scipy.sparse.csr_matrix((A.data[first:last], indices[first:last], indptr - first),
                                   shape=(stop - start, A.shape[1] if columns is None else columns))


def shard_rows(shard) -> scipy.sparse.csr_matrix:
    """A `LinearModelShard`'s X as a SciPy CSR matrix (dense X converted)."""
    X = shard.X
    if X.layout == torch.sparse_csr:
        return scipy.sparse.csr_matrix((X.values().detach().numpy(), X.col_indices().numpy(),
                                        X.crow_indices().numpy()), shape=tuple(X.shape))
    return scipy.sparse.csr_matrix(X.detach().numpy())
