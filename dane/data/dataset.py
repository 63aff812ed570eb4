"""The ``Dataset`` record every loader returns, and the split/standardize steps they share.

Loaders differ only in how they read files; the split and the scaling are the same
code for every dataset, so a change to either lands everywhere at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch


#: the fix a missing data file's one line names (conf/config.yaml: data_dir: ${oc.env:DANE_DATA_DIR,../shared/data})
DATA_DIR_FIX = "point data_dir=<folder> (or DANE_DATA_DIR) at the folder that holds the files"


@dataclass
class Dataset:
    """A train/test pair of tensors: ``x`` float32, ``y`` int64 class indices.

    ``notes`` holds facts a run's log must state, such as a non-standard split; the
    entry point prints them, so a reader of the results cannot miss them.  ``split``
    says where the test rows come from: ``"standard"`` (the files' own train/test
    split, e.g. MNIST's 60k/10k) or a description of a seeded hold-out.
    """

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    name: str
    notes: list[str] = field(default_factory=list)
    split: str = "standard"

    def info(self) -> dict:
        """What a run's summary records about its data: name, train/test sizes, split."""
        return {"name": self.name, "train_size": len(self.train_y), "test_size": len(self.test_y), "split": self.split}

    def __post_init__(self) -> None:
        # A bug in a loader, not a user error: fail loudly with a traceback.
        for part in ("train_x", "test_x"):
            assert getattr(self, part).dtype == torch.float32, f"{self.name}.{part} must be float32"
        for part in ("train_y", "test_y"):
            assert getattr(self, part).dtype == torch.int64, f"{self.name}.{part} must be int64"
        assert len(self.train_x) == len(self.train_y) and len(self.test_x) == len(self.test_y)

    @property
    def in_shape(self) -> tuple[int, ...]:
        """Shape of one example, e.g. ``(1, 32, 32)`` or ``(64,)``; what ``build_model`` needs."""
        return tuple(self.train_x.shape[1:])


def stratified_split(
    x: np.ndarray, y: np.ndarray, *, test_fraction: float, seed: int, name: str = "the data set",
    key: str = "data.test_fraction", classes: list[str] | None = None, then: str = "",
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Split into train and test with the class proportions kept, fixed by ``seed``.

    Returns ``(train_x, train_y, test_x, test_y)``. The test set has
    ``ceil(test_fraction * n)`` rows (scikit-learn's rule), so 10,000 rows at 0.2 give
    exactly 8,000/2,000. A split that cannot be made (a class of one sample; fewer test or
    train rows than classes) is a `DataError` of one line (`split_problem`): ``name`` the data
    set, ``key`` its config key of the fraction, ``classes`` the names of labels 0, 1, ...,
    ``then`` what follows a fix of the data (a push, say).
    """
    problem = split_problem(y, test_fraction, key=key, classes=classes, then=then)
    if problem:
        from dane.errors import DataError

        raise DataError(f"{name}: {problem}")
    from sklearn.model_selection import train_test_split  # here: scikit-learn costs a second to import

    train_x, test_x, train_y, test_y = train_test_split(
        x, y, test_size=test_fraction, random_state=seed, stratify=y
    )
    return train_x, train_y, test_x, test_y


def split_problem(y: np.ndarray, test_fraction: float, *, key: str = "data.test_fraction",
                  classes: list[str] | None = None, then: str = "") -> str | None:
    """Why a stratified hold-out of ``test_fraction`` of labels ``y`` cannot be made, and the fix (None: it can):
    scikit-learn's conditions, tested before it raises them as a ValueError with a traceback."""
    labels, counts = np.unique(np.asarray(y), return_counts=True)
    n, c = int(counts.sum()), len(labels)
    named = [str(classes[int(v)]) if classes is not None and 0 <= int(v) < len(classes) else str(v) for v in labels]
    shown = ", ".join(f"{k}={m}" for k, m in zip(named[:12], counts[:12].tolist())) + (", ..." if c > 12 else "")
    then = f", {then}" if then else ""
    if n == 0:
        return "holds no samples; add some" + then
    if counts.min() < 2:
        single = [k for k, m in zip(named, counts) if m < 2]
        which = (f"class {single[0]} has" if len(single) == 1 else
                 f"{len(single)} classes ({', '.join(single[:6])}{', ...' if len(single) > 6 else ''}) have")
        it = "it, or remove the class" if len(single) == 1 else "them, or remove those classes"
        return (f"{which} only 1 sample (samples per class: {shown}); a stratified hold-out needs at least 2 of each "
                f"class: add samples of {it}{then}")
    n_test = math.ceil(test_fraction * n)  # scikit-learn's rounding
    if c <= n_test <= n - c:
        return None
    grid = [f for f in (k / 100 for k in range(1, 100)) if c <= math.ceil(f * n) <= n - c] or \
           [f for f in (k / 1000 for k in range(1, 1000)) if c <= math.ceil(f * n) <= n - c]
    fix = (f"set {key} between {grid[0]:g} and {grid[-1]:g}, or add samples" if len(grid) > 1 else
           f"set {key}={grid[0]:g}, or add samples" if grid else "add samples")
    part, rows = ("the test", n_test) if n_test < c else ("the train", n - n_test)
    return (f"{key}={test_fraction:g} of its {n} samples leaves {rows} in {part} set, fewer than its {c} classes "
            f"(samples per class: {shown}); a stratified hold-out needs as many rows in each set as classes: "
            f"{fix}{then}")


def standardize(train_x: np.ndarray, test_x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Scale features to zero mean, unit variance using the *training* statistics only.

    Using test statistics would leak the test set into training. A feature that is
    constant on the training set (e.g. a corner pixel of ``digits``) has std 0; it is
    centred but not divided, so it stays 0 instead of becoming NaN.
    """
    mean = train_x.mean(axis=0, dtype=np.float64)
    std = train_x.std(axis=0, dtype=np.float64)
    # constant on the training set, tested exactly: round-off makes std of seven 0.1s 1.4e-17, not 0
    std[(train_x == train_x[:1]).all(axis=0) | (std == 0.0)] = 1.0
    return (train_x - mean) / std, (test_x - mean) / std


def to_dataset(
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray,
    *,
    num_classes: int,
    name: str,
    notes: list[str] | None = None,
    split: str = "standard",
) -> Dataset:
    """Wrap numpy arrays as a ``Dataset`` with the dtypes the models expect."""
    return Dataset(
        train_x=torch.as_tensor(np.ascontiguousarray(train_x), dtype=torch.float32),
        train_y=torch.as_tensor(np.ascontiguousarray(train_y), dtype=torch.int64),
        test_x=torch.as_tensor(np.ascontiguousarray(test_x), dtype=torch.float32),
        test_y=torch.as_tensor(np.ascontiguousarray(test_y), dtype=torch.int64),
        num_classes=num_classes,
        name=name,
        notes=list(notes or []),
        split=split,
    )
