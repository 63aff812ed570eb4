"""FedNL's stacked Hessians compiled by numba (`baselines.fednl_stacked`): one gather-sum per packed entry.

``packed[t] = Σ_{p ∈ row t} values[p] · v[indices[p]]``: the product P v of the (m·T) x N operator P in CSR,
rows in parallel (numba's ``prange``, both cores).  ``values`` None: every stored value is 1 (binary
features, the stacked weights folded into v), so that only the indices are read.  numba is imported
here, and this module only when a FedNL round runs; ``cache=True`` keeps the machine code on disk.
"""
from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True, parallel=True)
def _pattern_matvec(indptr, indices, v, out):
    for t in numba.prange(len(indptr) - 1):
        total = 0.0
        for p in range(indptr[t], indptr[t + 1]):
            total += v[indices[p]]
        out[t] = total


@numba.njit(cache=True, nogil=True, parallel=True)
def _valued_matvec(indptr, indices, values, v, out):
    for t in numba.prange(len(indptr) - 1):
        total = 0.0
        for p in range(indptr[t], indptr[t + 1]):
            total += values[p] * v[indices[p]]
        out[t] = total


def csr_matvec(indptr: np.ndarray, indices: np.ndarray, values: np.ndarray | None, v: np.ndarray,
               out: np.ndarray | None = None) -> np.ndarray:
    """P v for P in CSR (``values`` None: all ones); ``out`` reused when given."""
    out = np.empty(len(indptr) - 1) if out is None else out
    if values is None:
        _pattern_matvec(indptr, indices, v, out)
    else:
        _valued_matvec(indptr, indices, values, v, out)
    return out
