r"""FedNL's numeric kernels: every client's gradient and Hessian from one stacked computation, on each client's support.

The clients are shards of one linear model with one output (`dane.problems.glm.LinearModelShard`:
rows X_i, targets y_i, loss f, weight w = m/N, ℓ2 weight λ), so that

.. math:: \nabla^2 O_i(x) = w\,X_i^\top \operatorname{diag}(f''(X_i x))\,X_i + \lambda I,
          \qquad \nabla O_i(x) = w\,X_i^\top f'(X_i x) + \lambda x .

A symmetric d x d matrix is a packed upper triangle (T = d(d+1)/2 numbers, the row-major order of
``numpy.triu_indices(d)``).  Entry (a, b) of ∇²O_c can differ from λ·[a = b] only where some row of
client c has non-zeros at both a and b: its **support**, the sorted packed positions ``support[c]``
(the diagonal always included).  FedNL's H_c⁰ = ∇²O_c(x⁰), and every later change of H_c is a
compression of ∇²O_c(x) − H_c, which is zero off the support for every entrywise compressor (RandK,
natural and dithering decode a zero entry as zero; TopK's top k of a vector with fewer than k
non-zeros keeps them all), so H_c stays on it too.  A rank-R approximation is not zero there: with
``rank:R`` the support is the whole triangle (``whole=True``).  The m clients' Hessians (and H_c, and the compressed
differences) are therefore kept *compact*: an (m, S) array, row c holding the values at
``support[c]`` and zeros after its |support[c]| ≤ S entries (the padding, position T).  On w8a
(d = 301, 142 clients, 12 non-zeros a row) |support| is about 10k of T = 45,451.

Row j of client c with non-zeros at columns a_1 < ... < a_k adds :math:`w\,f''(z_j)\,x_{ja}x_{jb}`
to every a ≤ b among them: k(k+1)/2 products a row instead of d².  They are laid out once as the
sparse (m·S) x N matrix P with :math:`P_{(c,\,slot(a,b)),\,j} = w\,x_{ja}x_{jb}`, so that a round's
Hessians are one product, compact(H) = P f''(z) (SciPy's CSR product; a numba kernel measured
slower here, commit 5cca6b0).  The margins, losses, gradients and f''(z) come from one compiled pass over
the rows (`baselines.fednl_rows`), all m clients' or a few's; a few clients' rows of P h are
`baselines.fednl_rows.block_products`.

`compress_rows` applies a compressor to the compact rows: TopK by one ``argpartition`` over (m, S)
and RandK by `randk_indices`, k positions of the packed triangle per client drawn from that
client's own stream (client id, round; the same draws whether the client is a row of all m or a
worker alone) and found in its support by binary search (both numba, one call for all clients),
neither forming an (m, T) array; the other compressors go through the packed triangle (`expand`,
then back).
"""
from __future__ import annotations

import functools
from typing import Sequence

import numpy as np
import scipy.sparse
import torch

from dane.compress import Compressor, RandK, TopK
from dane.errors import ConfigError
from dane.work import count

from .fednl_rows import RowPass, block_products, row_pass, unit_values


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
    """The sorted distinct values of a and b (``numpy.union1d``'s), by a sort: on w8a's millions of product keys
    NumPy 2's hash-based ``unique`` (which ``union1d`` calls) took most of the clients' set-up, a sort a small part."""
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


class StackedClients:
    """The rows of m linear-model shards with one output, stacked, their Hessians on their supports (module docstring).

    ``shards``: `dane.problems.glm.LinearModelShard` objects of one problem (same d, loss, λ), row c the c-th;
    ``ids``: their client numbers (default 0..m-1; a worker alone passes its rank), which key RandK's streams;
    ``whole``: every client's support the whole triangle (for ``rank:R``).
    Dense shards are read as sparse (a dense row has d non-zeros and costs d(d+1)/2 products).
    """

    def __init__(self, shards: Sequence, *, ids: Sequence[int] | None = None, whole: bool = False):
        first = shards[0]
        if first.classes != 1:
            raise ConfigError(f"algorithm=fednl needs a model with one output (ridge or logistic), got "
                              f"{first.classes} classes; use problem=logreg or problem=ridge")
        self.m, self.d = len(shards), first.dim
        self.T = packed_size(self.d)
        self.ids = np.arange(self.m) if ids is None else np.asarray(ids, dtype=np.int64)
        self.loss, self.l2 = first.loss, first.l2
        parts = [scipy.sparse.csr_matrix(shard_rows(s)) for s in shards]
        for part in parts:
            part.sort_indices()
        self.X = X = scipy.sparse.vstack(parts, format="csr")
        self._at: RowPass | None = None  # `rows_at`'s last pass
        self.y = torch.cat([s.y.detach().to(torch.float64) for s in shards]).numpy()
        sizes = np.array([p.shape[0] for p in parts])
        self.start = np.concatenate([[0], np.cumsum(sizes)])
        client = np.repeat(np.arange(self.m), sizes)
        weights = {s.weight for s in shards}
        if len(weights) != 1:
            raise ConfigError(f"the stacked clients must share one row weight m/N, got {sorted(weights)}; "
                              "build every shard of one problem with the same worker count")
        self.weight = weights.pop()
        row_weight = np.full(len(client), self.weight)
        self.P = self._compact(*outer_products(X.indptr, X.indices, X.data, client, row_weight, self.d), whole)
        # binary rows (w8a, a9a): X's values all 1.0 and P's all w, so the passes read neither (`baselines.fednl_rows`)
        self.unit = unit_values(X) and unit_values(self.P, self.weight)

    def _compact(self, keys: np.ndarray, values: np.ndarray, rows: np.ndarray, whole: bool) -> scipy.sparse.csr_matrix:
        """Sets the supports (``support``, ``S``, ``slot_a``/``slot_b``, ``weights``, ``diag_slots``) from the products'
        keys (`outer_products`) and returns the (m·S) x N operator P with the products at (client·S + slot, j).
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
        return scipy.sparse.coo_matrix((values, (compact_row, rows)), shape=(m * S, len(self.y))).tocsr()

    # ------------------------------------------------------------------ the clients' oracles
    def gradients_hessians(self, x: np.ndarray, clients: np.ndarray | None = None
                           ) -> tuple[np.ndarray, np.ndarray]:
        """(∇O_c(x) stacked (s, d), compact ∇²O_c(x) stacked (s, S)) for ``clients`` (None: all m, in order), from
        one pass over their rows (`baselines.fednl_rows`)."""
        each = 1.0 if clients is None else np.isin(np.arange(self.m), clients).astype(np.float64)
        count("local_passes", each)  # per client of the stack (the worker's rows in `dane.work`'s ledger)
        count("local_hessians", each)
        if clients is None:
            at = self.rows_at(x, curvature=True)
            grads = at.grads.copy()
            hess = (self.P @ at.curv).reshape(self.m, self.S)  # SciPy's product: as fast as the compiled loop here
            clients = slice(None)
        else:  # FedNL-PP: s of the m clients, their rows only
            at = row_pass(self.X, self.y, self.start, x, self.loss, self.weight, clients, curvature=True,
                          unit=self.unit)
            grads = at.grads
            hess = block_products(self.P, at.curv, self.start, clients, self.S,
                                  value=self.weight if self.unit else None)
        grads += self.l2 * x
        diag = self.diag_slots[clients]
        hess[np.arange(len(diag))[:, None], diag] += self.l2
        return grads, hess

    def rows_at(self, x: np.ndarray, *, curvature: bool = False) -> RowPass:
        """Every client's pass at x (`baselines.fednl_rows.row_pass`: margins, weighted data losses (m,), data
        gradients without λx (m, d), curvatures with ``curvature``), kept for the last x: a round's oracles and its
        record's metrics (`baselines.fednl_problem.StackedShards.evaluate`) read the same point under full
        participation, so the rows are passed once for both.  Read-only: a caller that changes them copies."""
        at = self._at
        if at is None or not np.array_equal(at.x, x) or (curvature and at.curv is None):
            at = self._at = row_pass(self.X, self.y, self.start, x, self.loss, self.weight, curvature=curvature,
                                     unit=self.unit)
        return at

    def objective(self, x: np.ndarray) -> float:
        """O(x) = mean_c O_c(x) = (w/m) Σ_j f(z_j, y_j) + (λ/2)‖x‖² (every shard has the weight w = m/N)."""
        data = float(self.loss.value(torch.from_numpy(self.X @ x), torch.from_numpy(self.y)))
        return self.weight / self.m * data + 0.5 * self.l2 * float(x @ x)

    def gradient(self, x: np.ndarray) -> np.ndarray:
        """∇O(x) = mean_c ∇O_c(x)."""
        dz = self.loss.dz(torch.from_numpy(self.X @ x), torch.from_numpy(self.y)).numpy()
        return self.weight / self.m * (self.X.T @ dz) + self.l2 * x

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
        """M_c x for the symmetric M_c of each compact row, (s, d)."""
        rows = self.rows_of(clients)
        a, b = self.slot_a[rows], self.slot_b[rows]
        offset = np.arange(len(compact))[:, None] * self.d
        size = len(compact) * self.d
        upper = np.bincount((offset + a).ravel(), weights=(compact * x[b]).ravel(), minlength=size)
        lower = np.bincount((offset + b).ravel(), weights=(np.where(a == b, 0.0, compact) * x[a]).ravel(),
                            minlength=size)
        return (upper + lower).reshape(len(compact), self.d)

    def slots_of(self, positions: np.ndarray, clients: np.ndarray | None = None) -> np.ndarray:
        """The slot of each packed position (s, k) in its client's compact row; -1 off the support."""
        out = np.empty(positions.shape, dtype=np.int64)
        _numba_kernels()[1](self.support, np.arange(self.m)[self.rows_of(clients)], positions, out)
        return out


class PackedRows:
    """The m clients' packed triangles, (m, T), held as compact rows: row k of ``compact`` is the client at row
    ``rows[k]`` of ``clients`` (None: all in order), every other client's triangle zero.

    What a batched communicator's allreduce takes as a stacked tensor (`dane.comm.batched`), which reads of it only
    the shape, the size in bytes (``numel``, ``element_size``: those of the (m, T) float64 array it stands for, so
    bytes are counted as for the per-worker path's packed triangles) and the sum over the clients, ``sum(0)``: a
    scatter-add of the compact rows (`StackedClients.packed_sum`), O(m·S) work instead of O(m·T)."""

    def __init__(self, clients: StackedClients, compact: np.ndarray, rows: np.ndarray | None = None):
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


def randk_indices(seed: int, ids: np.ndarray, draw: int, n: int, k: int) -> np.ndarray:
    """(len(ids), k): for each client id, a uniform k-subset of range(n) from the stream (seed, id, draw).

    Each row is the first k distinct values of an i.i.d. uniform sequence (a uniform k-subset by
    symmetry) whose j-th value is ⌊n·u⌋, u the top 53 bits of SplitMix64(key + j), key a hash of
    (seed, id, draw): a counter-based generator, so that one call serves all clients and a client
    alone draws the same indices.  Compiled by numba (`_first_distinct`; ``reference=True`` in
    `randk_reference`, the same values by NumPy)."""
    out = np.empty((len(ids), k), dtype=np.int64)
    _numba_kernels()[0](stream_keys(seed, ids, draw), n, k, out)
    return out


def stream_keys(seed: int, ids: np.ndarray, draw: int) -> np.ndarray:
    """RandK's per-client stream keys (uint64) of round ``draw``."""
    rows = len(ids)
    with np.errstate(over="ignore"):
        return _mix(_mix(np.full(rows, seed, dtype=np.uint64)) + _mix(np.asarray(ids, dtype=np.uint64) << np.uint64(20))
                    + _mix(np.full(rows, draw, dtype=np.uint64) + np.uint64(0x632BE59BD9B4E019)))


def randk_reference(seed: int, ids: np.ndarray, draw: int, n: int, k: int) -> np.ndarray:
    """`randk_indices` by vectorized NumPy (a stable sort of each row's sequence): the reference the tests compare."""
    key, rows = stream_keys(seed, ids, draw), len(ids)
    length = k + k // 4 + 64
    while True:
        with np.errstate(over="ignore"):
            counters = key[:, None] + np.arange(length, dtype=np.uint64)[None, :]
        draws = ((_mix(counters) >> np.uint64(11)).astype(np.float64) * (n / 2.0 ** 53)).astype(np.int64)
        order = np.argsort(draws, axis=1, kind="stable")
        ordered = np.take_along_axis(draws, order, axis=1)
        new = np.ones_like(ordered, dtype=bool)
        new[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
        first = np.empty_like(new)
        np.put_along_axis(first, order, new, axis=1)
        taken = np.cumsum(first, axis=1)
        if (taken[:, -1] >= k).all():
            return draws[first & (taken <= k)].reshape(rows, k)
        length *= 2  # too few distinct values (k close to n): a longer sequence, the same prefix


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer, elementwise on uint64 (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


@functools.cache
def _numba_kernels():
    """(first_distinct, find_slots), compiled by numba on first use (``cache=True``: once per machine)."""
    import numba

    @numba.njit(cache=True, nogil=True)
    def first_distinct(keys, n, k, out):  # out[r]: the first k distinct values of row r's sequence
        seen = np.zeros(n, dtype=np.uint8)
        scale = n / 2.0 ** 53
        for r in range(len(keys)):
            j, count = np.uint64(0), 0
            while count < k:
                z = keys[r] + j + np.uint64(0x9E3779B97F4A7C15)
                z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
                z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
                z = z ^ (z >> np.uint64(31))
                v = np.int64(np.float64(z >> np.uint64(11)) * scale)
                j += np.uint64(1)
                if seen[v] == 0:
                    seen[v] = 1
                    out[r, count] = v
                    count += 1
            for c in range(k):
                seen[out[r, c]] = 0

    @numba.njit(cache=True, nogil=True)
    def find_slots(support, rows, positions, out):  # out[i, c]: slot of positions[i, c] in support[rows[i]], or -1
        slot_of = np.full(support.max() + 1, -1, dtype=np.int64)  # a row's support, position -> slot, then cleared
        for i in range(len(rows)):
            row = support[rows[i]]
            for s in range(len(row)):
                slot_of[row[s]] = s
            for c in range(positions.shape[1]):
                out[i, c] = slot_of[positions[i, c]]
            for s in range(len(row)):
                slot_of[row[s]] = -1

    return first_distinct, find_slots


def compress_rows(compressor: Compressor, diff: np.ndarray, clients: StackedClients, members: np.ndarray | None,
                  *, seed: int, draw: int, generator: torch.Generator | None = None) -> np.ndarray:
    """C applied to each client's packed Hessian difference, given and returned compact (``none``: ``diff`` itself).

    ``members``: whose rows (None: all); ``draw``: the round, RandK's stream position; ``generator``: the
    other random compressors'."""
    name, T = compressor.name, clients.T
    if name == "none":
        return diff
    rows = np.arange(len(diff))[:, None]
    if isinstance(compressor, TopK):
        k = compressor.k_of(T)
        if k >= diff.shape[1]:  # at least the support's size: every non-zero kept
            return diff.copy()
        kept = np.argpartition(np.abs(diff), diff.shape[1] - k, axis=1)[:, diff.shape[1] - k:]
        out = np.zeros_like(diff)
        out[rows, kept] = diff[rows, kept]
        return out
    if isinstance(compressor, RandK):
        k = compressor.k_of(T)
        ids = clients.ids[clients.rows_of(members)]
        slots = clients.slots_of(randk_indices(seed, ids, draw, T, k), members)
        hit = slots >= 0
        out = np.zeros_like(diff)
        where = (np.broadcast_to(rows, slots.shape)[hit], slots[hit])
        out[where] = diff[where] * (T / k)
        return out
    packed = clients.expand(diff, members)
    if compressor.matrices:
        if clients.S < clients.T:
            raise ConfigError(f"{compressor.spec} compresses whole matrices, which leave the clients' supports; "
                              "build the clients with StackedClients(..., whole=True)")
        decoded = pack(compressor(torch.from_numpy(unpack(packed, clients.d)), generator).numpy())
    else:
        decoded = compressor(torch.from_numpy(np.ascontiguousarray(packed)), generator).numpy()
    return clients.restrict(decoded, members)


def shard_rows(shard) -> scipy.sparse.csr_matrix:
    """A `LinearModelShard`'s X as a SciPy CSR matrix (dense X converted)."""
    X = shard.X
    if X.layout == torch.sparse_csr:
        return scipy.sparse.csr_matrix((X.values().detach().numpy(), X.col_indices().numpy(),
                                        X.crow_indices().numpy()), shape=tuple(X.shape))
    return scipy.sparse.csr_matrix(X.detach().numpy())
