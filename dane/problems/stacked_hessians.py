r"""The Hessians of stacked linear-model shards on their supports: every worker's from one stacked computation.

The workers are shards of one linear model with one output on their rows (`dane.problems.stacked_rows.StackedRows`:
rows X_c, targets y_c, loss f, weight w = m/N, ℓ2 weight λ), so that

.. math:: \nabla^2 O_c(x) = w\,X_c^\top \operatorname{diag}(f''(X_c x))\,X_c + \lambda I,
          \qquad \nabla O_c(x) = w\,X_c^\top f'(X_c x) + \lambda x .

A symmetric d x d matrix is a packed upper triangle (T = d(d+1)/2 numbers, the row-major order of
``numpy.triu_indices(d)``).  Entry (a, b) of ∇²O_c can differ from λ·[a = b] only where some row of
worker c has non-zeros at both a and b: its **support**, the sorted packed positions ``support[c]``
(the diagonal always included).  A matrix learned from such Hessians by entrywise-compressed changes stays on the
support too (FedNL's H_c: H_c⁰ = ∇²O_c(x⁰), every later change a compression of ∇²O_c(x) − H_c, which is zero off
the support for every entrywise compressor: RandK, natural and dithering decode a zero entry as zero; TopK's top k
of a vector with fewer than k non-zeros keeps them all).  A rank-R approximation is not zero there: with
``rank:R`` the support is the whole triangle (``whole=True``).  The m workers' Hessians (and matrices learned from
them) are therefore kept *compact*: an (m, S) array, row c holding the values at ``support[c]`` and zeros after
its |support[c]| ≤ S entries (the padding, position T).  On a sparse table (w8a: d = 301, 142 clients, about
12 non-zeros a row) the support is a small part of the triangle.

Row j of worker c with non-zeros at columns a_1 < ... < a_k adds :math:`w\,f''(z_j)\,x_{ja}x_{jb}`
to every a ≤ b among them: k(k+1)/2 products a row instead of d².  They are laid out once as the
sparse (m·S) x N matrix P with :math:`P_{(c,\,slot(a,b)),\,j} = w\,x_{ja}x_{jb}`, so that a round's
Hessians are one product, compact(H) = P f''(z): `dane.problems.stacked_rows.block_products`, over P held by
columns (CSC) with each entry's slot in its client's row (``slots``, 2 bytes where S ≤ 65,536), the sums in the
order of SciPy's CSR product, bit for bit (`make bench` section `fednl` times the round this serves).  The
margins, losses,
gradients and f''(z) come from one compiled pass over the rows (`dane.problems.stacked_rows.row_pass`), all m
workers' or a few's.  Compressing the compact rows: `dane.problems.stacked_compress`.
"""
from __future__ import annotations

import functools
from typing import Sequence

import numpy as np
import scipy.sparse
import torch

from ..work import count
from .stacked_rows import StackedRows, block_products, row_pass, unit_values
from ..numerics import jit


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
    upper, lower = _flat_triangle(d)
    full = np.zeros(packed.shape[:-1] + (d * d,), dtype=packed.dtype)
    full[..., upper] = packed
    full[..., lower] = packed
    return full.reshape(packed.shape[:-1] + (d, d))


@functools.cache
def _flat_triangle(d: int) -> tuple[np.ndarray, np.ndarray]:
    """The flat positions in a d x d matrix of the packed entries (a, b) and of their mirrors (b, a)."""
    rows, cols = np.triu_indices(d)
    return rows * d + cols, cols * d + rows


def pack(matrix: np.ndarray) -> np.ndarray:
    """The packed upper triangle of a symmetric matrix (or a stack of them)."""
    rows, cols = np.triu_indices(matrix.shape[-1])
    return matrix[..., rows, cols]


def frobenius_norms(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """‖M_c‖_F of symmetric M_c from the entries of its upper triangle (rows of ``values``): sqrt Σ weight·value²,
    weight 2 off the diagonal, 1 on it (0 on padding)."""
    return np.sqrt(np.maximum(np.einsum("ct,ct->c", values * weights, values), 0.0))


def triangle_weights(d: int) -> np.ndarray:
    """`frobenius_norms`' weights of a whole packed triangle."""
    weights = np.full(packed_size(d), 2.0)
    weights[diagonal_positions(d)] = 1.0
    return weights


def sorted_union(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The sorted distinct values of a and b (``numpy.union1d``'s), by one sort of both, not by NumPy 2's hash-based
    ``unique`` that ``union1d`` calls: the clients' set-up that runs it is ``setup_s`` of ``make bench`` section
    ``fednl``."""
    both = np.concatenate([a, b])
    both.sort()
    return both[np.concatenate([[True], both[1:] != both[:-1]])] if len(both) else both


def outer_products(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, rows_client: np.ndarray,
                   scale: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The products scale_j x_ja x_jb, a ≤ b, of every row j (module docstring), as three arrays: the key
    client_j·T + tri(a, b), the value, and j.

    Rows are grouped by their number of non-zeros k, so that each group's k(k+1)/2 pairs are one
    vectorized gather; the CSR columns must be sorted within a row (a ≤ b then follows)."""
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
    if not targets:
        return np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0, dtype=np.int64)
    return tuple(np.concatenate([part.ravel() for part in parts]) for parts in (targets, values, rows))


class CompactHessians:
    """The Hessians of m stacked linear-model shards on their supports (module docstring), over their rows ``rows``
    (a `dane.problems.stacked_rows.StackedRows`, whose passes it shares).

    ``ids``: the workers' client numbers (default 0..m-1; a worker alone passes its rank), which key each one's
    random streams (`dane.problems.stacked_compress`); ``whole``: every support the whole triangle (a compressor
    of whole matrices, ``rank:R``).  A dense row has d non-zeros and costs d(d+1)/2 products.
    """

    def __init__(self, rows: StackedRows, *, ids: Sequence[int] | None = None, whole: bool = False):
        self.rows, self.whole = rows, whole
        self.m, self.d = rows.stacked_workers, rows.dim
        self.T = packed_size(self.d)
        self.ids = np.arange(self.m) if ids is None else np.asarray(ids, dtype=np.int64)
        self.l2, self.weight = rows.l2, rows.weight
        X = rows.X
        row_weight = np.full(X.shape[0], self.weight)
        self.P = self._compact(*outer_products(X.indptr, X.indices, X.data, rows.row_client, row_weight, self.d),
                               whole)
        # binary rows (w8a, a9a): P's values all w, which `block_products` then does not read
        self.unit = rows.unit and unit_values(self.P, self.weight)

    @classmethod
    def kept(cls, rows: StackedRows, *, whole: bool = False) -> CompactHessians:
        """The Hessians kept on ``rows`` (``rows.hessians``) where they were built with this ``whole``, else new ones,
        then kept there: the support layout and P are built once per stack of rows (a run's set-up, a benchmark's
        table), not once per run on it."""
        if rows.hessians is None or rows.hessians.whole != whole:
            rows.hessians = cls(rows, whole=whole)
        return rows.hessians

    def _compact(self, keys: np.ndarray, values: np.ndarray, rows: np.ndarray, whole: bool) -> scipy.sparse.csc_matrix:
        """Sets the supports (``support``, ``S``, ``slot_a``/``slot_b``, ``weights``, ``diag_slots``) from the products'
        keys (`outer_products`) and returns the (m·S) x N operator P (CSC) with the products at (client·S + slot, j);
        sets ``slots``, each stored product's slot (module docstring).
        Memory O(products + m·S): nothing of size m·T unless ``whole``."""
        m, d, T = self.m, self.d, self.T
        diagonal = diagonal_positions(d)  # also the packed triangle's row starts
        if whole:
            present = np.arange(m * T)
        else:  # the (client, position) pairs with a product, and every diagonal entry; sorted
            present = sorted_union(keys, (np.arange(m)[:, None] * T + diagonal).ravel())
        client, position = np.divmod(present, T)
        counts = np.bincount(client, minlength=m)
        self.S = S = int(counts.max())
        slot = np.arange(len(present)) - np.repeat(np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
        self.support = np.full((m, S), T, dtype=np.int64)  # padding: position T (outside the triangle)
        self.support[client, slot] = position
        padding = self.support == T
        a = np.searchsorted(diagonal, self.support, side="right") - 1  # the entry (a, b) of each slot
        self.slot_a = np.where(padding, 0, a)                            # (padding: (0, 0))
        self.slot_b = np.where(padding, 0, a + self.support - diagonal[a])
        self.weights = np.where(self.slot_a == self.slot_b, 1.0, 2.0)
        self.weights[padding] = 0.0
        self.diag_slots = np.nonzero((self.slot_a == self.slot_b) & ~padding)[1].reshape(m, d)
        compact_row = (client * S + slot)[np.searchsorted(present, keys)]
        P = scipy.sparse.coo_matrix((values, (compact_row, rows)), shape=(m * S, self.rows.X.shape[0])).tocsc()
        # each entry's slot in its client's row: its row of P less client·S, the client that of its column
        column_client = np.repeat(self.rows.row_client, np.diff(P.indptr))
        self.slots = (P.indices - column_client * S).astype(np.uint16 if S <= 1 << 16 else np.uint32)
        return P

    # ------------------------------------------------------------------ the workers' oracles
    def gradients_hessians(self, x: np.ndarray, clients: np.ndarray | None = None, *, threads: int = 1
                           ) -> tuple[np.ndarray, np.ndarray]:
        """(∇O_c(x) stacked (s, d), compact ∇²O_c(x) stacked (s, S)) for ``clients`` (None: all m, in order), from
        one pass over their rows (`dane.problems.stacked_rows.row_pass`; all m: the rows' kept pass); the Hessians'
        product on ``threads`` threads (`dane.problems.stacked_rows.block_products`: the same numbers)."""
        each = 1.0 if clients is None else np.isin(np.arange(self.m), clients).astype(np.float64)
        count("local_passes", each)  # per client of the stack (the worker's rows in `dane.work`'s ledger)
        count("local_hessians", each)
        rows = self.rows
        if clients is None:
            at = rows.rows_at(x, curvature=True)
            grads = at.grads.copy()
            hess = block_products(self.P, self.slots, at.curv, rows.start, None, self.S,
                                  value=self.weight if self.unit else None, threads=threads)
            clients = slice(None)
        else:  # FedNL-PP: s of the m clients, their rows only
            at = row_pass(rows.X, rows.y, rows.start, x, rows.loss, self.weight, clients, curvature=True,
                          unit=rows.unit)
            grads = at.grads
            hess = block_products(self.P, self.slots, at.curv, rows.start, clients, self.S,
                                  value=self.weight if self.unit else None, threads=threads)
        grads += self.l2 * x
        diag = self.diag_slots[clients]
        hess[np.arange(len(diag))[:, None], diag] += self.l2
        return grads, hess

    def gradients(self, x: np.ndarray, clients: np.ndarray) -> np.ndarray:
        """∇O_c(x) stacked (s, d) for ``clients``, from one gradient pass over their rows (no Hessian formed): the
        clients that form no Hessian this round beside those `gradients_hessians` serves (Newton-3PC's Bernoulli
        aggregation)."""
        count("local_passes", np.isin(np.arange(self.m), clients).astype(np.float64))
        rows = self.rows
        grads = row_pass(rows.X, rows.y, rows.start, x, rows.loss, self.weight, clients, unit=rows.unit).grads
        return grads + self.l2 * x

    # ------------------------------------------------------------------ compact rows and the packed triangle
    def rows_of(self, clients: np.ndarray | None) -> np.ndarray | slice:
        return slice(None) if clients is None else clients

    def expand(self, compact: np.ndarray, clients: np.ndarray | None = None) -> np.ndarray:
        """The packed triangles (s, T) of compact rows (``clients``: whose rows they are; None: all m)."""
        full = np.zeros((len(compact), self.T + 1))
        np.put_along_axis(full, self.support[self.rows_of(clients)], compact, axis=1)
        return full[:, :self.T]

    def restrict(self, packed: np.ndarray, clients: np.ndarray | None = None) -> np.ndarray:
        """Compact rows of packed triangles (s, T) that vanish off their clients' supports."""
        padded = np.concatenate([packed, np.zeros((len(packed), 1))], axis=1)
        return np.take_along_axis(padded, self.support[self.rows_of(clients)], axis=1)

    def packed_sum(self, compact: np.ndarray, clients: np.ndarray | None = None) -> np.ndarray:
        """Σ_c of the packed triangles of compact rows, (T,), without forming them."""
        return np.bincount(self.support[self.rows_of(clients)].ravel(), weights=compact.ravel(),
                           minlength=self.T + 1)[:self.T]

    def matvec(self, compact: np.ndarray, x: np.ndarray, clients: np.ndarray | None = None) -> np.ndarray:
        """M_c x for the symmetric M_c of each compact row, (s, d) (`symmetric_products`)."""
        out = np.empty((len(compact), self.d))
        symmetric_products()(compact, self.slot_a, self.slot_b, np.arange(self.m)[self.rows_of(clients)], x, out)
        return out

    def slots_of(self, positions: np.ndarray, clients: np.ndarray | None = None) -> np.ndarray:
        """The slot of each packed position (s, k) in its client's compact row; -1 off the support."""
        out = np.empty(positions.shape, dtype=np.int64)
        find_slots()(self.support, np.arange(self.m)[self.rows_of(clients)], positions, out)
        return out


class PackedRows:
    """The m clients' packed triangles, (m, T), held as compact rows: row k of ``compact`` is the client at row
    ``rows[k]`` of ``clients`` (a `CompactHessians`) (None: all in order), every other client's triangle zero.

    What a batched communicator's allreduce takes as a stacked tensor (`dane.comm.batched`), which reads of it only
    the shape, the size in bytes (``numel``, ``element_size``: those of the (m, T) float64 array it stands for, so
    bytes are counted as for the per-worker path's packed triangles) and the sum over the clients, ``sum(0)``: a
    scatter-add of the compact rows (`CompactHessians.packed_sum`), O(m·S) work instead of O(m·T)."""

    def __init__(self, clients: CompactHessians, compact: np.ndarray, rows: np.ndarray | None = None):
        self.clients, self.compact, self.rows = clients, compact, rows
        self.shape = torch.Size((clients.m, clients.T))

    def dim(self) -> int:
        return 2

    def numel(self) -> int:
        return self.clients.m * self.clients.T

    def element_size(self) -> int:
        return 8  # float64

    def sum(self, dim: int) -> torch.Tensor:
        """Σ over the clients of their packed triangles, (T,)."""
        if dim != 0:
            raise ValueError(f"PackedRows sums over the clients (dim=0) only, got dim={dim}")
        return torch.from_numpy(self.clients.packed_sum(self.compact, self.rows))


@functools.cache
def find_slots():
    """`CompactHessians.slots_of`'s loop, compiled by numba on first use (``cache=True``: once per machine)."""
    numba = jit.numba()

    @numba.njit(cache=True, nogil=True)
    def find_slots_(support, rows, positions, out):  # out[i, c]: slot of positions[i, c] in support[rows[i]], or -1
        slot_of = np.full(support.max() + 1, -1, dtype=np.int64)  # a row's support, position -> slot, then cleared
        for i in range(len(rows)):
            row = support[rows[i]]
            for s in range(len(row)):
                slot_of[row[s]] = s
            for c in range(positions.shape[1]):
                out[i, c] = slot_of[positions[i, c]]
            for s in range(len(row)):
                slot_of[row[s]] = -1

    return find_slots_


@functools.cache
def symmetric_products():
    """`CompactHessians.matvec`'s loop, compiled by numba on first use (``cache=True``: once per machine):
    ``out[c] = M x`` for the symmetric M of compact row c, client ``rows[c]``: for each slot (a, b) in order,
    v·x_b added to entry a and, off the diagonal, v·x_a to entry b, into two sums (the upper and the mirrored
    entries) added at the end.  The upper sum is kept in a register while the slots stay in one row a of the
    triangle (a support is sorted), in the same order of additions."""
    numba = jit.numba()

    @numba.njit(cache=True, nogil=True)
    def symmetric_products_(compact, slot_a, slot_b, rows, x, out):
        upper = np.empty(out.shape[1])
        lower = np.empty(out.shape[1])
        for c in range(compact.shape[0]):
            upper[:] = 0.0
            lower[:] = 0.0
            a_of, b_of = slot_a[rows[c]], slot_b[rows[c]]
            row, total = 0, 0.0  # upper[row], while its slots run
            for s in range(compact.shape[1]):
                a, b, v = a_of[s], b_of[s], compact[c, s]
                if a != row:
                    upper[row], row = total, a
                    total = upper[a]
                total += v * x[b]
                lower[b] += (0.0 if a == b else v) * x[a]
            upper[row] = total
            out[c] = upper + lower

    return symmetric_products_
