"""Fit the labels a source read to the loss a problem minimizes, or say in one line why not.

Sources return labels exactly as in the file (float64). A loss needs a particular
coding: real values (squared), ±1 (logistic), class indices 0..K-1 (softmax).
"""

from __future__ import annotations

import numpy as np

from dane import checks
from dane.errors import DataError

LOSSES = ("squared", "logistic", "softmax")
SHOWN = 5  # label values quoted in an error message


def check_labels(
    y: np.ndarray, loss: str, source_name: str, *, classes: np.ndarray | None = None, whole: bool = False
) -> np.ndarray:
    """``y`` coded for ``loss``; ``source_name`` (e.g. ``csv:admissions.csv``) starts every error.

    - ``squared``: ``y`` unchanged (float64).
    - ``logistic``: float64 labels in {-1, +1}; accepts labels in {0, 1} (0 -> -1) or in
      {-1, +1}. A subset (one class only) is accepted, since one worker's part may hold
      a single class; with ``whole`` (``y`` is the whole data set) it is refused: a logistic
      regression on one class has no minimizer without the penalty and learns nothing with it.
      With ``whole``, any two distinct values are accepted too, the smaller coded -1 and the
      larger +1 (scikit-learn's convention): LIBSVM's mushrooms and covtype.binary use {1, 2},
      breast-cancer {2, 4}; `two_class_note` says so in the run's notes.  A part alone (``whole``
      false) cannot tell which of two such values is the positive class and is refused.
    - ``softmax``: int64 class indices: the k-th smallest label value becomes k. The
      labels must be integer-valued. ``classes`` (sorted label values) fixes the map;
      give it when ``y`` is one worker's part, because a part missing a class would
      otherwise number the remaining classes differently from the other parts.

    Every loss requires finite labels; a nan/inf label is an error naming its row (0-based).
    """
    checks.one_of("loss", loss, LOSSES)
    y = np.asarray(y, dtype=np.float64)
    if y.ndim != 1:
        raise DataError(f"{source_name}: labels must be one value per row, got shape {y.shape}")
    bad = np.flatnonzero(~np.isfinite(y))
    if bad.size:
        raise DataError(
            f"{source_name}: label at row {bad[0]} is {y[bad[0]]} ({bad.size} non-finite labels); "
            "every row needs a finite label, remove or fix those rows"
        )
    if loss == "squared":
        return y
    if loss == "logistic":
        return _plus_minus_one(y, source_name, whole)
    return _class_indices(y, source_name, classes)


def _plus_minus_one(y: np.ndarray, source_name: str, whole: bool) -> np.ndarray:
    """`check_labels`' logistic coding: finite float64 ``y`` as -1/+1."""
    values = np.unique(y)
    if whole and values.size == 1 and values[0] in (-1.0, 0.0, 1.0):
        raise DataError(
            f"{source_name}: problem=logreg needs two classes, but every label is {values[0]:g}; check the "
            "labels it reads (data.target of a CSV, data.y_key of an .npz), or add rows of the other class"
        )
    if set(values) <= {0.0, 1.0}:
        return np.where(y == 0.0, -1.0, 1.0)
    if set(values) <= {-1.0, 1.0}:
        return y.copy()
    if whole and _recoded_pair(values):
        return np.where(y == values[0], -1.0, 1.0)
    if not whole and values.size <= 2:  # {1, 2} reads on a whole file; a part alone cannot tell which is positive
        raise DataError(
            f"{source_name}: problem=logreg on per-worker parts needs labels 0/1 or -1/+1, found {_show(values)}; a "
            "part cannot tell which of two other values is the positive class (a part may hold one): map them in "
            "the parts, or read the whole file"
        )
    raise DataError(
        f"{source_name}: problem=logreg needs two classes labelled 0/1 or -1/+1, found labels "
        f"{_show(values)}; use problem=softmax for more classes or map the labels"
    )


def _class_indices(y: np.ndarray, source_name: str, classes: np.ndarray | None) -> np.ndarray:
    """`check_labels`' softmax coding: finite float64 ``y`` as int64 indices into ``classes`` (default: its values)."""
    not_integer = np.flatnonzero(y != np.round(y))
    if not_integer.size:
        row = not_integer[0]
        raise DataError(
            f"{source_name}: problem=softmax needs integer class labels, row {row} has {y[row]:g}; "
            "map the labels to integers 0..K-1"
        )
    values = np.unique(y)
    classes = values if classes is None else np.unique(np.asarray(classes, dtype=np.float64))
    unknown = np.setdiff1d(values, classes)
    if unknown.size:
        raise DataError(
            f"{source_name}: labels {_show(unknown)} are not among the classes {_show(classes)}; "
            "pass every class value in classes"
        )
    return np.searchsorted(classes, y).astype(np.int64)


def two_class_note(y: np.ndarray, loss: str) -> str | None:
    """The note a run keeps when `check_labels` recoded two labels other than 0/1 or -1/+1 (``y`` as read)."""
    if loss != "logistic":
        return None
    values = np.unique(np.asarray(y, dtype=np.float64))
    if not _recoded_pair(values):
        return None
    return f"labels {values[0]:g} and {values[1]:g} coded -1 and +1 (the larger value is the positive class)"


def _recoded_pair(values: np.ndarray) -> bool:
    """Whether sorted distinct labels are two values that `check_labels` recodes to -1/+1 (not 0/1 or -1/+1)."""
    return values.size == 2 and not set(values) <= {0.0, 1.0} and not set(values) <= {-1.0, 1.0}


def _show(values: np.ndarray) -> str:
    """``{0, 1, 2, 3, 4, ...} (12 distinct)``: the first few sorted values of a label set."""
    shown = ", ".join(f"{v:g}" for v in values[:SHOWN])
    if values.size > SHOWN:
        return f"{{{shown}, ...}} ({values.size} distinct)"
    return f"{{{shown}}}"
