"""Small tabular datasets: scikit-learn's bundled ones and the graduate admissions CSV.

These need no download (the scikit-learn sets ship inside its wheel), which makes them
the offline defaults for convex experiments such as multinomial logistic regression.
Each gets a stratified, seeded train/test split and features standardized with the
training statistics.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
from dane.data.dataset import DATA_DIR_FIX, Dataset, standardize, stratified_split, to_dataset
from dane.data.table import not_utf8
from dane.errors import DataError

def load_bundled(loader: str, **kwargs):
    """scikit-learn's bundled-data loader ``loader``, imported when a run asks for it (not at import time)."""
    def load():
        from sklearn import datasets

        return getattr(datasets, loader)(**kwargs)

    return load


SKLEARN_LOADERS = {
    "digits": load_bundled("load_digits"),  # 1,797 8x8 images, given as 64 flat features
    "iris": load_bundled("load_iris"),  # 150 rows, 4 features, 3 classes
    "breast_cancer": load_bundled("load_breast_cancer"),  # 569 rows, 30 features, 2 classes
}
ADMISSIONS_FILE = "admissions.csv"
ADMISSIONS_HEADER = ["admit", "gre", "gpa", "rank"]


def _split_and_scale(
    x: np.ndarray, y: np.ndarray, *, name: str, seed: int, test_fraction: float, key: str = "data.test_fraction"
) -> Dataset:
    train_x, train_y, test_x, test_y = stratified_split(x, y, test_fraction=test_fraction, seed=seed, name=name,
                                                        key=key)
    train_x, test_x = standardize(train_x, test_x)
    return to_dataset(
        train_x, train_y, test_x, test_y, num_classes=int(y.max()) + 1, name=name,
        split=f"{len(test_y)} of {len(y)} rows held out (stratified, by the run's seed)",
    )


def load_sklearn(name: str, *, seed: int, test_fraction: float, key: str = "data.test_fraction") -> Dataset:
    """One of scikit-learn's bundled datasets (``digits``, ``iris``, ``breast_cancer``); ``key``: the fraction's
    config key, which a split that cannot be made names."""
    bunch = SKLEARN_LOADERS[name]()
    return _split_and_scale(
        bunch.data, bunch.target, name=name, seed=seed, test_fraction=test_fraction, key=key
    )


def read_admissions(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Parse ``admit,gre,gpa,rank`` rows into (features gre, gpa, rank; labels admit)."""
    if not path.is_file():
        raise DataError(
            f"{path} does not exist; the admissions dataset expects {ADMISSIONS_FILE} "
            f"(header {','.join(ADMISSIONS_HEADER)}) in data_dir; {DATA_DIR_FIX}"
        )
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            rows = list(csv.reader(f))
    except UnicodeDecodeError as err:
        raise not_utf8(path, err, "is it the admissions CSV? save it as UTF-8 CSV") from None
    header = [cell.strip() for cell in rows[0]] if rows else []
    if header != ADMISSIONS_HEADER:
        raise DataError(
            f"{path} has header {header}, expected {','.join(ADMISSIONS_HEADER)}; is it the admissions CSV?"
        )
    values = []
    for line, row in enumerate(rows[1:], start=2):
        if not row:  # a trailing blank line
            continue
        try:
            values.append([float(cell) for cell in row])
        except ValueError:
            raise DataError(f"{path} line {line} has a non-numeric value: {row}; fix or remove the row") from None
        bad = next((i for i, value in enumerate(values[-1]) if not math.isfinite(value)), None)
        if bad is not None:
            raise DataError(f"{path} line {line}, column '{ADMISSIONS_HEADER[bad]}': {row[bad].strip()!r} is not a "
                            "finite number; fix or remove the row")
        if len(row) != len(ADMISSIONS_HEADER) or values[-1][0] not in (0.0, 1.0):
            raise DataError(f"{path} line {line} is not admit(0/1),gre,gpa,rank: {row}; fix or remove the row")
    if not values:
        raise DataError(f"{path} has a header but no rows; re-download it")
    table = np.asarray(values)
    if np.unique(table[:, 0]).size == 1:
        raise DataError(f"{path}: every row has admit={table[0, 0]:g}; the admissions data needs rows of both "
                        "classes (0 and 1): is it the whole file?")
    return table[:, 1:], table[:, 0].astype(np.int64)


def load_admissions(data_dir: Path, *, seed: int, test_fraction: float, key: str = "data.test_fraction") -> Dataset:
    """The admissions CSV in ``data_dir``: binary admit label from gre, gpa and rank.

    ``rank`` (1-4, the undergraduate institution's tier) is kept as one numeric feature,
    as in the usual logistic regression of this dataset, not one-hot encoded.
    """
    x, y = read_admissions(Path(data_dir) / ADMISSIONS_FILE)
    return _split_and_scale(x, y, name="admissions", seed=seed, test_fraction=test_fraction, key=key)
