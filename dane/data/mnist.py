"""MNIST from the original IDX files (LeCun, Cortes, Burges), gzip-compressed or raw.

The full set is four files: ``train-{images,labels}`` (60,000) and ``t10k-...`` (10,000).
Some machines have only the t10k pair. Then the loader runs in *split mode*: it splits
those 10,000 images into train and test (8,000/2,000 at the default
``test_fraction=0.2``, stratified, fixed by the seed) and says so loudly, in
``Dataset.notes`` and as a logging warning, because such results are not comparable
with the standard 60k/10k split.

IDX format (http://yann.lecun.com/exdb/mnist/): a big-endian uint32 magic number
``0x0000 08 nd`` (``08`` = unsigned byte, ``nd`` = number of dimensions), then ``nd``
big-endian uint32 sizes, then the data in row-major order.
"""

from __future__ import annotations

import gzip
import logging
import struct
import zlib
from pathlib import Path

import numpy as np

from dane.data.dataset import DATA_DIR_FIX, Dataset, stratified_split, to_dataset
from dane.errors import DataError

log = logging.getLogger(__name__)

IMAGES_MAGIC = 0x00000803  # unsigned byte, 3 dims: count, rows, cols
LABELS_MAGIC = 0x00000801  # unsigned byte, 1 dim: count
TRAIN_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz")
TEST_FILES = ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
NUM_CLASSES = 10


def read_idx(path: Path, *, magic: int) -> np.ndarray:
    """Read one IDX file of unsigned bytes, checking its magic number and its length."""
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError, zlib.error) as err:  # gzip.BadGzipFile is an OSError; a damaged stream, zlib.error
        raise DataError(f"{path} is not a readable IDX file ({err}); re-download it") from None
    if len(raw) < 4:
        raise DataError(f"{path} is too short to be an IDX file; re-download it")
    (found,) = struct.unpack(">I", raw[:4])
    if found != magic:
        raise DataError(
            f"{path} has IDX magic 0x{found:08x}, expected 0x{magic:08x}; "
            "is it the right file, and not corrupted?"
        )
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path} ends inside its IDX header; re-download it")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    expected = int(np.prod(dims))
    if len(raw) - header != expected:
        raise DataError(
            f"{path} holds {len(raw) - header} data bytes but its header {dims} "
            f"promises {expected}; the file is truncated or corrupted, re-download it"
        )
    # A copy, because frombuffer over bytes is read-only and torch warns on such arrays.
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims).copy()


def _find(folder: Path, gz_name: str) -> Path | None:
    """The file under either its ``.gz`` name or its uncompressed name, if present."""
    for name in (gz_name, gz_name.removesuffix(".gz")):
        if (folder / name).is_file():
            return folder / name
    return None


def _locate(data_dir: Path) -> tuple[Path, dict[str, Path]]:
    """Pick ``data_dir`` or ``data_dir/mnist``, whichever holds MNIST files."""
    for folder in (data_dir, data_dir / "mnist"):
        found = {name: p for name in TRAIN_FILES + TEST_FILES if (p := _find(folder, name))}
        if found:
            return folder, found
    problem = "has no MNIST files" if data_dir.is_dir() else "does not exist"
    raise DataError(
        f"data_dir {data_dir} {problem}; expected {', '.join(TRAIN_FILES + TEST_FILES)} "
        f"(or just the t10k pair) in it or in its mnist/ subfolder; {DATA_DIR_FIX}"
    )


def mnist_files(data_dir: Path) -> list[Path]:
    """The MNIST files `load_mnist` reads from ``data_dir`` (or its mnist/ subfolder); one line where there are none."""
    return list(_locate(Path(data_dir))[1].values())


def _read_pair(folder: Path, found: dict[str, Path], pair: tuple[str, str]) -> tuple[np.ndarray, np.ndarray]:
    """Read one images/labels pair and check they agree with each other and with MNIST."""
    images = read_idx(found[pair[0]], magic=IMAGES_MAGIC)
    labels = read_idx(found[pair[1]], magic=LABELS_MAGIC)
    if images.shape[1:] != (28, 28):
        raise DataError(f"{found[pair[0]]} holds {images.shape[1:]} images; MNIST images are 28x28")
    if len(images) != len(labels):
        raise DataError(
            f"{folder}: {pair[0]} has {len(images)} images but {pair[1]} has {len(labels)} labels; "
            "re-download the pair"
        )
    if labels.size and labels.max() >= NUM_CLASSES:
        raise DataError(f"{found[pair[1]]} has label {labels.max()}; MNIST labels are 0..9")
    return images, labels


def load_mnist(data_dir: Path, *, seed: int, test_fraction: float, pad_to_32: bool,
               key: str = "data.test_fraction") -> Dataset:
    """Load MNIST as N x 1 x 28 x 28 floats in [0, 1] (32 x 32, zero-padded, if ``pad_to_32``).

    With all four files, the standard train/t10k split is used and ``seed`` and
    ``test_fraction`` are ignored. With only the t10k pair, split mode applies (see the
    module docstring). LeNet expects 32 x 32 inputs, as in LeCun et al. (1998), hence
    the 2-pixel zero border.
    """
    folder, found = _locate(Path(data_dir))
    has_train, has_test = all(n in found for n in TRAIN_FILES), all(n in found for n in TEST_FILES)
    notes: list[str] = []
    split = "standard"
    if has_train and has_test:
        train_x, train_y = _read_pair(folder, found, TRAIN_FILES)
        test_x, test_y = _read_pair(folder, found, TEST_FILES)
    elif has_test and not any(n in found for n in TRAIN_FILES):
        images, labels = _read_pair(folder, found, TEST_FILES)
        train_x, train_y, test_x, test_y = stratified_split(
            images, labels, test_fraction=test_fraction, seed=seed, name=f"the MNIST t10k files in {folder}", key=key
        )
        note = (
            f"MNIST SPLIT MODE: only the t10k files are in {folder}, so their {len(images)} images "
            f"were split into {len(train_x)} train and {len(test_x)} test (stratified, seed={seed}); "
            "results are NOT comparable with the standard 60k/10k MNIST split"
        )
        notes.append(note)
        log.warning(note)
        split = f"a split of the {len(images):,} t10k images, stratified, by the run's seed"
    else:
        missing = [n for n in TRAIN_FILES + TEST_FILES if n not in found]
        raise DataError(
            f"{folder} has only part of MNIST: missing {', '.join(missing)}; "
            "provide all four files, or just the t10k pair for split mode"
        )
    train_x, test_x = _scale(train_x, pad_to_32), _scale(test_x, pad_to_32)
    return to_dataset(
        train_x, train_y, test_x, test_y, num_classes=NUM_CLASSES, name="mnist", notes=notes, split=split
    )


def _scale(images: np.ndarray, pad_to_32: bool) -> np.ndarray:
    """uint8 N x 28 x 28 -> float32 N x 1 x H x W in [0, 1]."""
    x = images.astype(np.float32)[:, None] / 255.0
    if pad_to_32:
        x = np.pad(x, ((0, 0), (0, 0), (2, 2), (2, 2)))
    return x
