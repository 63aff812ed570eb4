r"""``data.standardize`` for a plain matrix (``data=npz``, ``data=libsvm``): which columns, and how.

The CSV source knows which of its columns it one-hot encoded; an ``.npz`` or a LIBSVM
file is just a matrix, so here the modes read the values:

- ``all``: every column;
- ``numeric``: every column that holds a value other than 0 and 1. Indicator columns
  (every value 0 or 1, as one-hot columns are) keep their 0/1, as CSV's ``numeric``
  keeps its one-hot columns; a genuinely numeric column that only takes 0 and 1 is
  left alone too, since the file cannot say which it is (``all`` scales it);
- ``none``: nothing (the default for these sources: the file is used as given).

Statistics are over every row of the file (population std), computed before rows are
dealt to workers, so they are the same on every process, backend and worker count.

**Dense X** is standardized exactly as the CSV path does it
(`dane.data.table.standardize_columns`): x_j ← (x_j − m_j)/s_j, and a constant column
(all values equal, tested exactly) is centred to 0, not divided.

**Sparse X** is scaled, not centred: x_j ← x_j / s_j, with s_j the std of the whole
column (its implicit zeros included: the mean and std of `sklearn.preprocessing.StandardScaler`
with ``with_mean=False``). Centring would fill every zero and make X dense. A constant
column is left as it is. For a linear model with an *unpenalized* intercept b, centring
only moves the intercept,

    w·(x − m) + b = w·x + (b − w·m),

so the scaled problem has the same fitted w, the same predictions and the same objective
as the fully standardized one. In this package the intercept (``problem.fit_intercept``,
a column of ones) is penalized by λ like every weight, and without it there is no offset
to absorb w·m: then the scaled fit is *not* the centred one (they agree only at λ = 0
with an intercept). The gap grows with the columns' m_j/s_j, which is at most about
sqrt(density) for a column whose non-zeros are a fraction "density" of its rows, so it
is small on typical sparse data and large for a dense column with a large mean stored
sparse. For exact standardization, save X dense (``data=npz``) or centre it yourself.
``tests/test_scaling_options.py`` checks both statements against a linear solve.
The fitted w, like CSV's, is in the units of the scaled columns.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from dane.data.table import standardize_columns
from dane.errors import plural

STANDARDIZE = ("numeric", "all", "none")
STANDARDIZE_ALIASES = {True: "numeric", False: "none"}  # the option's earlier boolean form
SHOWN = 8  # columns named in a note before "..."


def standardize_mode(value):
    """``value`` with the boolean aliases resolved (true: numeric, false: none); checked by the caller."""
    return STANDARDIZE_ALIASES[value] if isinstance(value, bool) else value


def indicator_columns(X: np.ndarray | sp.csr_matrix) -> np.ndarray:
    """A boolean per column: True when every value is 0 or 1 (implicit zeros count as 0)."""
    if sp.issparse(X):
        other = (X.data != 0) & (X.data != 1)
        return np.bincount(X.indices[other], minlength=X.shape[1]) == 0
    return ~np.any((X != 0) & (X != 1), axis=0)


def constant_sparse_columns(X: sp.csr_matrix) -> np.ndarray:
    """A boolean per column: True when all n values (implicit zeros included) are equal, tested exactly."""
    return X.max(axis=0).toarray().ravel() == X.min(axis=0).toarray().ravel()


def scale_sparse_columns(X: sp.csr_matrix, columns: np.ndarray) -> list[int]:
    """Divide ``X[:, columns]`` in place by each column's std (no centring); return the constant ones, left as is."""
    from sklearn.utils.sparsefuncs import mean_variance_axis  # sklearn at use, not at import dane

    chosen = np.zeros(X.shape[1], dtype=bool)
    chosen[columns] = True
    constant = chosen & constant_sparse_columns(X)
    scale = np.ones(X.shape[1])
    divide = chosen & ~constant
    scale[divide] = np.sqrt(mean_variance_axis(X, axis=0)[1])[divide]  # population std, implicit zeros included
    X.data /= scale[X.indices]  # the pattern of non-zeros is unchanged
    return np.flatnonzero(constant).tolist()


def standardize_matrix(X: np.ndarray | sp.csr_matrix, mode: str) -> str | None:
    """Apply ``data.standardize=mode`` to ``X`` in place (module docstring); the note for the log, or None."""
    if mode == "none":
        return None
    indicators = indicator_columns(X) if mode == "numeric" else np.zeros(X.shape[1], dtype=bool)
    columns = np.flatnonzero(~indicators)
    kept = int(indicators.sum())
    which = f"{len(columns)} {'numeric ' if mode == 'numeric' else ''}column(s)" + \
        (f" (the {kept} with only 0/1 values kept as they are)" if kept else "")
    if sp.issparse(X):
        X.sum_duplicates()  # a repeated (row, column) entry is one value: the statistics count it once
        constant = scale_sparse_columns(X, columns)
        note = (f"scaled {which} to std 1 over {plural(X.shape[0], 'row')}, not centred (X is sparse; centring would "
                "densify it): the same fit as full standardization only with an unpenalized intercept, and "
                "problem.fit_intercept's is penalized (dane/data/scaling.py)")
        left = "constant column(s) left as they are"
    else:
        constant = standardize_columns(X, columns.tolist())
        note = f"standardized {which} to mean 0, std 1 over {plural(X.shape[0], 'row')}"
        left = "constant column(s) centred to 0, not scaled"
    if constant:
        shown = ", ".join(str(j) for j in constant[:SHOWN]) + (", ..." if len(constant) > SHOWN else "")
        note += f"; {len(constant)} {left}: {shown} (0-based)"
    return note
