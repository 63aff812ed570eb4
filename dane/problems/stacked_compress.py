r"""A compressor applied to each worker's compact symmetric matrix (`dane.problems.stacked_hessians`), all at once.

`compress_rows` applies a compressor to the compact rows of a `CompactHessians`: TopK by `top_k_rows`, each row's
non-zeros alone, and RandK by `randk_indices`, k positions of the packed triangle per worker drawn from that worker's
own stream (client id, round; the same draws whether the worker is a row of all m or alone) and found in its
support by binary search (all numba, one call for all workers), neither forming an (m, T) array; the other
compressors go through the packed triangle (`CompactHessians.expand`, then back).  FedNL's Hessian differences
travel this way (`baselines.fednl`).

TopK keeps what `dane.compress.TopK` keeps of the packed triangle: the k largest magnitudes, and among the entries
tied at the k-th (common on binary rows, whose Hessian entries take few distinct magnitudes) those of the lowest
indices.  A support is sorted, so a row's slot order is its packed order, and the positions off the
support are zeros, which TopK keeps only when the row has fewer than k non-zeros (then it keeps the row whole).
"""
from __future__ import annotations

import functools

import numpy as np
import torch

from ..compress import Compressor, RandK, TopK
from ..errors import ConfigError
from .stacked_hessians import CompactHessians, pack, unpack
from .stacked_rows import in_threads
from ..numerics import jit


def compress_rows(compressor: Compressor, diff: np.ndarray, clients: CompactHessians, members: np.ndarray | None,
                  *, seed: int, draw: int, generator: torch.Generator | None = None, threads: int = 1) -> np.ndarray:
    """C applied to each client's packed Hessian difference, given and returned compact (``none``: ``diff`` itself).

    ``members``: whose rows (None: all); ``draw``: the round, RandK's stream position; ``generator``: the
    other random compressors'; ``threads``: TopK's selection in that many blocks of rows, one a thread (each row's
    selection depends on that row alone, so the blocks keep what one call over all rows keeps)."""
    name, T = compressor.name, clients.T
    if name == "none":
        return diff
    rows = np.arange(len(diff))[:, None]
    if isinstance(compressor, TopK):
        k = compressor.k_of(T)
        if k >= diff.shape[1]:  # at least the support's size: every non-zero kept
            return diff.copy()
        out, select = np.zeros_like(diff), top_k_rows()  # compiled here, once, not in the threads
        in_threads(lambda lo, hi: select(diff[lo:hi], k, out[lo:hi]), len(diff), threads)
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
                              "build the Hessians with CompactHessians(..., whole=True)")
        decoded = pack(compressor(torch.from_numpy(unpack(packed, clients.d)), generator).numpy())
    else:
        decoded = compressor(torch.from_numpy(np.ascontiguousarray(packed)), generator).numpy()
    return clients.restrict(decoded, members)


def load(compressor: Compressor, clients: CompactHessians) -> None:
    """Dispatch the numba kernels `compress_rows` takes for ``compressor`` (TopK's selection; RandK's draw and slot
    lookup), on no rows: numba loads them from its cache (or compiles them) now, as the method is built, not in its
    first round (`dane.numerics.svrg_kernels.load`'s reason).  Other compressors have none."""
    if isinstance(compressor, (TopK, RandK)):
        empty = np.zeros((0, clients.S), dtype=np.float64)
        compress_rows(compressor, empty, clients, np.zeros(0, dtype=np.int64), seed=0, draw=0)


def randk_indices(seed: int, ids: np.ndarray, draw: int, n: int, k: int) -> np.ndarray:
    """(len(ids), k): for each client id, a uniform k-subset of range(n) from the stream (seed, id, draw).

    Each row is the first k distinct values of an i.i.d. uniform sequence (a uniform k-subset by
    symmetry) whose j-th value is ⌊n·u⌋, u the top 53 bits of SplitMix64(key + j), key a hash of
    (seed, id, draw): a counter-based generator, so that one call serves all clients and a client
    alone draws the same indices.  Compiled by numba (`_first_distinct`; ``reference=True`` in
    `randk_reference`, the same values by NumPy)."""
    out = np.empty((len(ids), k), dtype=np.int64)
    first_distinct()(stream_keys(seed, ids, draw), n, k, out)
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
def top_k_rows():
    """TopK's selection, ``top_k_rows()(diff, k, out)`` writing each row's kept entries into ``out`` (zeros), compiled
    by numba on first use (``cache=True``: once per machine).

    A row's non-zeros alone (a converged FedNL's rows are mostly exact zeros): with at most k of them, all; else τ,
    the k-th largest of their magnitudes, by a radix select on the magnitudes' float64 bits (for non-negative floats
    the bits' order is the values', NaN above inf): 11 bits a pass from the top, each pass keeping the keys whose
    digit holds τ's rank; then in index order every |x| > τ and the first k − #{|x| > τ} of the |x| = τ.  The loops
    that gather and keep are branch-free (a write, then a count by the condition): the kept share of a pass is
    unpredictable."""
    numba = jit.numba()

    @numba.njit(cache=True, nogil=True)  # one function: numba's cache misses a kernel that calls another closure
    def top_k_rows_(diff, k, out):
        n = diff.shape[1]
        magnitude = np.empty(n, dtype=np.float64)  # a row's non-zero magnitudes (float64: exact for float32 too)
        key = magnitude.view(np.uint64)            # their bits
        kept = np.empty(n, dtype=np.uint64)        # the keys still in the running for τ
        where = np.empty(n, dtype=np.int64)        # the non-zeros' indices
        count = np.empty(2048, dtype=np.int64)
        for r in range(diff.shape[0]):
            nnz = 0
            for j in range(n):
                where[nnz] = j
                magnitude[nnz] = abs(diff[r, j])
                nnz += diff[r, j] != 0
            if nnz <= k:
                for i in range(nnz):
                    out[r, where[i]] = diff[r, where[i]]
                continue
            rank, source, size, shift = nnz - k, key, nnz, 64  # τ: the key of ascending rank `rank` in source
            while size > 1 and shift > 0:
                width = min(11, shift)
                shift -= width
                mask = (1 << width) - 1
                count[:mask + 1] = 0
                for i in range(size):
                    count[(source[i] >> shift) & mask] += 1
                digit = 0
                while count[digit] <= rank:
                    rank -= count[digit]
                    digit += 1
                if count[digit] < size:
                    kept_size = 0
                    for i in range(size):
                        kept[kept_size] = source[i]
                        kept_size += (source[i] >> shift) & mask == digit
                    source, size = kept, kept_size
            tau = source[rank]
            room = k
            for i in range(nnz):
                room -= key[i] > tau
            for i in range(nnz):
                if key[i] > tau or (key[i] == tau and room > 0):
                    out[r, where[i]] = diff[r, where[i]]
                    room -= key[i] == tau

    return top_k_rows_


@functools.cache
def first_distinct():
    """`randk_indices`' loop, compiled by numba on first use (``cache=True``: once per machine)."""
    numba = jit.numba()

    @numba.njit(cache=True, nogil=True)
    def first_distinct_(keys, n, k, out):  # out[r]: the first k distinct values of row r's sequence
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

    return first_distinct_
