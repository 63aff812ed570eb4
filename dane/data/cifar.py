"""CIFAR-10 from the standard "python version" batches (Krizhevsky, 2009).

The folder ``cifar-10-batches-py`` holds ``data_batch_1`` .. ``data_batch_5`` (50,000
training images) and ``test_batch`` (10,000). Each is a pickled dict whose ``b"data"``
is a uint8 array N x 3072 (1024 red, then 1024 green, then 1024 blue values, each a
32 x 32 image in row-major order) and whose ``b"labels"`` is a list of N ints in 0..9.

The batches are pickles, so only point ``data_dir`` at files from a source you trust.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from dane.data.dataset import DATA_DIR_FIX, Dataset, to_dataset
from dane.errors import DataError

FOLDER = "cifar-10-batches-py"
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
NUM_CLASSES = 10


def _locate(data_dir: Path) -> Path:
    """Accept the batches folder itself, its parent, or ``data_dir/cifar10/``."""
    for folder in (data_dir, data_dir / FOLDER, data_dir / "cifar10" / FOLDER):
        if all((folder / name).is_file() for name in TRAIN_BATCHES + (TEST_BATCH,)):
            return folder
    problem = "has no complete CIFAR-10 batches" if data_dir.is_dir() else "does not exist"
    raise DataError(
        f"data_dir {data_dir} {problem}; expected {FOLDER}/ with "
        f"{', '.join(TRAIN_BATCHES)}, {TEST_BATCH} (the CIFAR-10 python version), "
        f"in data_dir or as data_dir itself; {DATA_DIR_FIX}"
    )


def cifar_files(data_dir: Path) -> list[Path]:
    """The batch files `load_cifar10` reads from ``data_dir``; one line where they are not all there."""
    folder = _locate(Path(data_dir))
    return [folder / name for name in TRAIN_BATCHES + (TEST_BATCH,)]


def read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One batch as (uint8 N x 3 x 32 x 32 images, int64 N labels), checked for shape and range."""
    try:
        with open(path, "rb") as f:
            batch = pickle.load(f, encoding="bytes")
    except (OSError, EOFError, pickle.UnpicklingError, ValueError) as err:
        raise DataError(f"{path} is not a readable CIFAR-10 batch ({err}); re-download it") from None
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        raise DataError(f"{path} lacks the b'data' and b'labels' entries of a CIFAR-10 batch; re-download it")
    data = np.asarray(batch[b"data"])
    labels = np.asarray(batch[b"labels"], dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise DataError(
            f"{path} has data of {data.dtype} {data.shape}; a CIFAR-10 batch holds uint8 N x 3072"
        )
    if labels.shape != (len(data),):
        raise DataError(f"{path} has {len(data)} images but {labels.size} labels; re-download it")
    if labels.size and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise DataError(f"{path} has labels outside 0..9; re-download it")
    return data.reshape(-1, 3, 32, 32), labels


def load_cifar10(data_dir: Path) -> Dataset:
    """Load CIFAR-10 as N x 3 x 32 x 32 floats in [0, 1], with its standard train/test split."""
    folder = _locate(Path(data_dir))
    train = [read_batch(folder / name) for name in TRAIN_BATCHES]
    test_images, test_y = read_batch(folder / TEST_BATCH)
    train_x = np.concatenate([images for images, _ in train]).astype(np.float32) / 255.0
    train_y = np.concatenate([labels for _, labels in train])
    test_x = test_images.astype(np.float32) / 255.0
    return to_dataset(train_x, train_y, test_x, test_y, num_classes=NUM_CLASSES, name="cifar10")
