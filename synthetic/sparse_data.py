"""An rcv1-like sparse data set: tf-idf rows over a heavy-tailed vocabulary, binary labels.

    X, y = rcv1_like(n_rows=10_000, n_features=20_000, seed=0)        # csr_matrix, labels in {-1, +1}
    write_sparse_libsvm("results/rcv1_like.svm", 10_000, 20_000, seed=0)

What makes it look like rcv1 (Lewis et al. 2004; LIBSVM's ``rcv1.binary``, 47,236 features):

- *Vocabulary.* Feature j (by frequency rank r) is drawn with probability ∝ (r + 1)^-``zipf``
  (Zipf's law of word frequencies): a few features are in most rows, most are rare.
  The ranks are laid on the column indices by a seeded permutation, except that the most
  frequent feature takes the last index, so the file's largest index is ``n_features``
  and a reader that infers d from the file gets it.
- *Rows.* Each row draws k ~ uniform{``nnz``} distinct features (successive draws from the
  Zipf law, repeats skipped: sampling without replacement in proportion to frequency);
  each gets a term count tf ~ Geometric(0.6).
- *Values.* tf-idf as scikit-learn's ``TfidfTransformer(sublinear_tf=True)`` computes it,
  (1 + log tf) · (log((1 + n) / (1 + df_j)) + 1), then every row scaled to unit norm and
  rounded to 6 decimals (``%.16g`` prints such a double exactly, so the file round-trips
  bit for bit).  Rounding leaves ``|‖x‖ - 1|`` below about 1e-5.
- *Labels.* A sparse ground truth w* (a random ``support`` share of the features, N(0, 1)
  weights); z = X w* scaled to unit standard deviation, and y = +1 with probability
  sigmoid(``sharpness`` · z), else -1: a noisy linear concept, not separable.

Everything is drawn from one ``numpy.random.default_rng(seed)``: the same arguments give
the same file.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp
from sklearn.datasets import dump_svmlight_file

from dane.errors import plural

_CHUNK = 4096  # rows whose candidate draws are made at once (bounds memory; fixed, so results do not depend on it)


def rcv1_like(n_rows: int, n_features: int, *, seed: int, nnz: tuple[int, int] = (50, 100), zipf: float = 1.0,
              support: float = 0.02, sharpness: float = 4.0) -> tuple[sp.csr_matrix, np.ndarray]:
    """(X, y): X an ``n_rows`` x ``n_features`` CSR matrix (float64, unit rows), y in {-1, +1}."""
    if n_rows < 1 or n_features < 1:
        raise ValueError(f"n_rows and n_features must be >= 1, got {n_rows} and {n_features}")
    low, high = nnz
    if not 1 <= low <= high:
        raise ValueError(f"nnz must be a range (low, high) with 1 <= low <= high, got {nnz}")
    rng = np.random.default_rng(seed)
    high = min(high, n_features)
    low = min(low, high)

    column = rng.permutation(n_features)          # frequency rank -> column index
    top = int(np.flatnonzero(column == n_features - 1)[0])
    column[[0, top]] = column[[top, 0]]           # the most frequent feature is the last column
    cdf = np.cumsum(1.0 / np.arange(1, n_features + 1) ** zipf)
    cdf /= cdf[-1]

    counts = rng.integers(low, high + 1, size=n_rows)
    indptr = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    ranks = np.empty(indptr[-1], dtype=np.int64)
    for start in range(0, n_rows, _CHUNK):
        stop = min(start + _CHUNK, n_rows)
        draws = np.searchsorted(cdf, rng.random((stop - start, 4 * high)), side="right")
        for row, drawn in zip(range(start, stop), draws):
            ranks[indptr[row]:indptr[row + 1]] = _first_distinct(drawn, counts[row], cdf, rng)
    cols = column[ranks]
    tf = rng.geometric(0.6, size=len(cols)).astype(np.float64)

    X = sp.csr_matrix((1.0 + np.log(tf), cols, indptr), shape=(n_rows, n_features))
    X.sort_indices()
    df = np.bincount(X.indices, minlength=n_features)
    X = X @ sp.diags(np.log((1.0 + n_rows) / (1.0 + df)) + 1.0)
    X = sp.csr_matrix(sp.diags(1.0 / np.sqrt(X.multiply(X).sum(axis=1).A1)) @ X)
    X.data = np.round(X.data, 6)
    X.eliminate_zeros()
    X.sort_indices()

    w_star = np.zeros(n_features)
    chosen = rng.choice(n_features, size=max(1, round(support * n_features)), replace=False)
    w_star[chosen] = rng.standard_normal(len(chosen))
    z = X @ w_star
    z = z / (z.std() or 1.0)
    y = np.where(rng.random(n_rows) < 1.0 / (1.0 + np.exp(-sharpness * z)), 1.0, -1.0)
    return X, y


def _first_distinct(drawn: np.ndarray, k: int, cdf: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The first ``k`` distinct values of ``drawn`` in draw order (more draws if it holds fewer)."""
    values, first = np.unique(drawn, return_index=True)
    while len(values) < k:  # a tiny vocabulary or very common features: draw more
        drawn = np.concatenate([drawn, np.searchsorted(cdf, rng.random(4 * k), side="right")])
        values, first = np.unique(drawn, return_index=True)
    return values[np.argsort(first, kind="stable")[:k]]


def write_sparse_libsvm(path: str | Path, n_rows: int, n_features: int, *, seed: int, **options) -> Path:
    """Write `rcv1_like` (same arguments) as a 1-based LIBSVM file; returns the path.

    The header comment names the generator and its arguments.  Read it back with
    ``dane.data.files.LibSVMSource(path, n_features=n_features, zero_based=False)``.
    """
    X, y = rcv1_like(n_rows, n_features, seed=seed, **options)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    described = ", ".join(f"{k}={v}" for k, v in options.items())
    comment = (f"synthetic.sparse_data.rcv1_like(n_rows={n_rows}, n_features={n_features}, seed={seed}"
               f"{', ' + described if described else ''}): {plural(X.nnz, 'non-zero')}")
    tmp = path.with_name(path.name + ".tmp")
    dump_svmlight_file(X, y, str(tmp), zero_based=False, comment=comment)
    tmp.replace(path)
    return path
