"""``load_dataset``: one entry point from a dataset name to a ``Dataset``.

Configs name a dataset; this module checks the name and the shared arguments before
any file is opened, so a typo fails at once with the list of valid names.
"""

from __future__ import annotations

from pathlib import Path

from dane.data.cifar import cifar_files, load_cifar10
from dane.data.dataset import Dataset
from dane.data.mnist import load_mnist, mnist_files
from dane.data.synthetic_source import PAPER_SETS, synthetic_dataset
from dane.data.table import file_stamps, resolve, resolve_dir
from dane.data.tabular import ADMISSIONS_FILE, SKLEARN_LOADERS, load_admissions, load_sklearn
from dane.errors import ConfigError, UserError

FILE_DATASETS = ("mnist", "cifar10", "admissions")  # read from data_dir
DATASET_NAMES = FILE_DATASETS + tuple(SKLEARN_LOADERS) + tuple(PAPER_SETS)  # sklearn's and FedProx's Synthetic need no files


def load_dataset(
    name: str,
    *,
    data_dir: str | Path | None,
    seed: int,
    test_fraction: float = 0.2,
    pad_to_32: bool = True,
    key: str = "data.test_fraction",
) -> Dataset:
    """Load ``name`` from ``data_dir`` (unused by the scikit-learn datasets).

    ``seed`` fixes every train/test split that is not given by the files (all but
    full MNIST and CIFAR-10), and draws FedProx's Synthetic sets (`dane.data.synthetic_source`). ``test_fraction`` is the share held out in those splits.
    ``pad_to_32`` applies to MNIST only: it zero-pads 28 x 28 to the 32 x 32 LeNet input.  ``key``: the config key
    of ``test_fraction``, which a bad value or a split that cannot be made names.
    """
    if name not in DATASET_NAMES:
        raise ConfigError(f"unknown dataset '{name}'; use one of: {', '.join(sorted(DATASET_NAMES))}")
    if not 0.0 < test_fraction < 1.0:
        raise ConfigError(f"{key} must be in (0, 1), got {test_fraction}")
    if name in SKLEARN_LOADERS:
        return load_sklearn(name, seed=seed, test_fraction=test_fraction, key=key)
    if name in PAPER_SETS:  # generated from the seed; each client's own held-out share, the generator's 0.1
        return synthetic_dataset(name, seed=seed)
    if data_dir is None:
        raise ConfigError(
            f"dataset {name} is read from files; set data_dir=/path/to/data "
            "(the folder holding the files or their mnist/, cifar-10-batches-py/ subfolder)"
        )
    data_dir = resolve_dir(data_dir)  # relative: from the repository root, not the working folder
    if name == "mnist":
        return load_mnist(data_dir, seed=seed, test_fraction=test_fraction, pad_to_32=pad_to_32, key=key)
    if name == "cifar10":
        return load_cifar10(data_dir)
    return load_admissions(data_dir, seed=seed, test_fraction=test_fraction, key=key)


def dataset_stamp(name: str, data_dir: str | Path | None) -> tuple | None:
    """`dane.data.table.file_stamps` of the files a loader reads for the set ``name`` from ``data_dir``: `load_dataset`
    and `dane.data.builtin_source.BuiltinSource.load` (its ``content_stamp``), so that a process that keeps a loaded
    set (`dane.problems.neural`, `dane.problems.linear_models`) reads it again once they are rewritten; None for a set
    that is generated or ships with scikit-learn, and where the files are not there (the loader says so).

    The admissions file is the one `dane.data.table.resolve` finds, in ``data_dir`` and then in the working folder,
    as the built-in table reads it; `load_dataset` reads ``data_dir``'s alone, the first of the two, and where that
    one is absent it raises, and keeps nothing under the stamp."""
    try:
        if name == "admissions":
            return file_stamps([resolve(ADMISSIONS_FILE, data_dir)])
        folder = resolve_dir(data_dir)
        if name not in FILE_DATASETS or folder is None:
            return None
        return file_stamps(mnist_files(folder) if name == "mnist" else cifar_files(folder))
    except (UserError, OSError):
        return None
