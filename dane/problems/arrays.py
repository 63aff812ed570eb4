"""Convex problems on in-memory arrays or a data file: ``dane.problems.Ridge | LogReg | Softmax``.

Each builds the same `LinearModelConfig` as the command line's ``problem=ridge|logreg|softmax``,
with an `ArraySource` holding X (numpy, or scipy sparse kept sparse) and y, or with a file
source from `dane.data.files` (the command line's ``data=csv|npz|libsvm``)::

    problem = dane.problems.LogReg(X, y, lam=1e-3, optimum="auto")   # optimum: records carry suboptimality
    problem = dane.problems.Ridge(data=CSVSource("housing.csv", target="price", categorical=("region",)),
                                  lam=1e-5, optimum="auto")

``fit_intercept`` defaults to what each input expects: false on arrays, given as X and y or as
``data=ArraySource(X, y)`` (the design matrix is yours as given), true on a file source (as
``conf/problem/*.yaml``: the source standardizes the columns and the intercept carries the mean).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, fields

import numpy as np
import scipy.sparse

from ..data.table import Table
from ..errors import ConfigError
from .linear_models import LinearModelConfig


@dataclass(frozen=True, repr=False)
class ArraySource:
    """A data source over in-memory arrays (X dense or scipy sparse, y a vector)."""

    X: object
    y: object
    name: str = "arrays"
    fingerprint: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        # copies: the problem holds the rows it was given (a caller's later change of its array would reach some
        # runs of it and not others, the table being cached by this fingerprint)
        for key, array in (("X", self.X), ("y", self.y)):  # NumPy would drop the imaginary part with a warning
            if np.iscomplexobj(array.data if scipy.sparse.issparse(array) else array):
                raise ConfigError(f"{key} must hold real numbers, got complex ones; pass {key}.real or abs({key}) "
                                  "as the model needs")
        try:
            X = scipy.sparse.csr_matrix(self.X, dtype=np.float64, copy=True) if scipy.sparse.issparse(self.X) else \
                np.array(self.X, dtype=np.float64, copy=True)
            y = np.array(self.y, dtype=np.float64, copy=True).reshape(-1)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"X and y must hold numbers ({' '.join(str(err).split())}); encode text labels as "
                              "numbers first (for example with numpy.unique(y, return_inverse=True))") from None
        if X.ndim != 2:
            raise ConfigError(f"X must be a 2-D array (rows x features), got shape {X.shape}")
        for axis, what, fix in ((0, "rows", "row"), (1, "columns", "feature")):  # a run of no rows, or of no features
            if X.shape[axis] == 0:
                raise ConfigError(f"X has no {what} (shape {X.shape}); give at least one {fix}")
        if X.shape[0] != y.shape[0]:
            raise ConfigError(f"X has {X.shape[0]} rows but y has {y.shape[0]} entries; give one label per row")
        data = X.data if scipy.sparse.issparse(X) else X
        if not (np.isfinite(data).all() and np.isfinite(y).all()):
            raise ConfigError("X or y holds nan or inf; drop or impute those rows first")
        digest = hashlib.sha1()
        for part in ((X.data, X.indices, X.indptr) if scipy.sparse.issparse(X) else (X,)) + (y,):
            digest.update(np.ascontiguousarray(part).tobytes())
        object.__setattr__(self, "X", X)
        object.__setattr__(self, "y", y)
        object.__setattr__(self, "fingerprint", f"{X.shape}:{digest.hexdigest()}")

    presharded = False

    def load(self) -> Table:
        return Table(self.X.copy(), self.y.copy(), self.name, [])

    def __repr__(self) -> str:  # the cache key of the loaded table: content, not address
        return f"ArraySource({self.name}, {self.fingerprint})"


def _linear(loss: str, name: str, public: str):
    def make(X=None, y=None, *, data=None, lam: float = 1e-3, fit_intercept: bool | None = None,
             local_solver: str = "auto", seed: int = 0, **solver_keys) -> LinearModelConfig:
        arrays = X is not None and y is not None
        if not (arrays and data is None or data is not None and X is None and y is None):
            raise ConfigError(f"dane.problems.{public} takes arrays X and y, or data= a file source "
                              "(dane.data.files.CSVSource, NPZSource, LibSVMSource), not both or neither")
        if data is not None and not callable(getattr(data, "load", None)):  # a tuple of arrays, a path: no source
            raise ConfigError(f"dane.problems.{public} got data= a {type(data).__name__}, not a data source; pass "
                              f"arrays as {public}(X, y), or data= a file source (dane.data.files.CSVSource, ...)")
        bad = next((key for key in solver_keys if key not in KEYWORDS), None)
        if bad in ("loss", "name"):
            raise ConfigError(f"dane.problems.{public} takes no {bad}=: it is problem={name}, the {loss} loss; for "
                              "another use dane.problems.Ridge, LogReg or Softmax")
        if bad is not None:
            raise ConfigError(f"dane.problems.{public} has no keyword {bad}; its keywords: X, y, data, "
                              f"{', '.join(sorted(KEYWORDS))}")
        source = ArraySource(X, y) if data is None else data
        intercept = not isinstance(source, ArraySource) if fit_intercept is None else fit_intercept
        return LinearModelConfig(data=source, loss=loss, lam=lam, fit_intercept=intercept,
                                 local_solver=local_solver, seed=seed, name=name, **solver_keys)

    make.__name__ = make.__qualname__ = public
    make.__doc__ = (f"problem={name} on arrays X (n x d, dense or scipy sparse) and y, or on data= a file source; "
                    f"keywords as in conf/problem/{name}.yaml (lam is the weight of (lam/2)||w||^2; optimum='auto' "
                    "for suboptimality; fit_intercept: false on arrays, true on a file source, unless given).")
    return make


#: the keywords of `LinearModelConfig` that ``Ridge``, ``LogReg`` and ``Softmax`` pass on (not data, loss or name)
KEYWORDS = frozenset(f.name for f in fields(LinearModelConfig)) - {"data", "loss", "name"}

Ridge = _linear("squared", "ridge", "Ridge")
LogReg = _linear("logistic", "logreg", "LogReg")
Softmax = _linear("softmax", "softmax", "Softmax")
