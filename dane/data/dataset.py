"""The ``Dataset`` record every loader returns, and the split/standardize steps they share.

Loaders differ only in how they read files; the split and the scaling are the same
code for every dataset, so a change to either lands everywhere at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


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
    x: np.ndarray, y: np.ndarray, *, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Split into train and test with the class proportions kept, fixed by ``seed``.

    Returns ``(train_x, train_y, test_x, test_y)``. The test set has
    ``ceil(test_fraction * n)`` rows (scikit-learn's rule), so 10,000 rows at 0.2 give
    exactly 8,000/2,000.
    """
    from sklearn.model_selection import train_test_split  # here: scikit-learn costs a second to import

    train_x, test_x, train_y, test_y = train_test_split(
        x, y, test_size=test_fraction, random_state=seed, stratify=y
    )
    return train_x, train_y, test_x, test_y


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
