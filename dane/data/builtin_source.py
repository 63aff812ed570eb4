"""``BuiltinSource``: the package's built-in data sets as one ``Table`` for convex problems.

``digits``, ``iris``, ``breast_cancer`` (classification) and ``diabetes`` (regression,
real targets) ship inside scikit-learn; ``admissions`` is read from ``admissions.csv``
in ``data_dir``; ``mnist`` is read from the IDX files in ``data_dir`` by
`dane.data.mnist.load_mnist`. All rows are returned, with no train/test split, except
for MNIST: its training rows only (in split mode, the training side of the t10k
split, which the notes state). Features are standardized over all rows, except
MNIST's pixels, which stay in [0, 1].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dane import checks
from dane.data.mnist import load_mnist
from dane.data.registry import dataset_stamp
from dane.data.sharding import ShardingKeys
from dane.data.table import Table, resolve, resolve_dir, standardize_columns
from dane.data.tabular import ADMISSIONS_FILE, SKLEARN_LOADERS, load_bundled, read_admissions
from dane.errors import ConfigError

SKLEARN_SETS = {**SKLEARN_LOADERS, "diabetes": load_bundled("load_diabetes", scaled=False)}
BUILTIN_DATASETS = (*SKLEARN_SETS, "admissions", "mnist")


@dataclass(frozen=True)
class BuiltinSource(ShardingKeys):
    """A built-in data set by name (``conf/data/builtin.yaml``).

    ``data_dir``: the folder holding ``admissions.csv`` or the MNIST files (a relative
    one is taken from the repository root). ``split_seed`` and ``test_fraction`` apply
    to MNIST split mode only (just the t10k pair present), which keeps the training
    side of a seeded, stratified split. ``name`` defaults to ``dataset``. The sharding
    keys (``sharding``, ``alpha``, ...) are `dane.data.sharding.ShardingKeys`.
    """

    dataset: str
    data_dir: str | None = None
    split_seed: int = 0
    test_fraction: float = 0.2
    name: str = ""

    def __post_init__(self) -> None:
        checks.one_of("data.dataset", self.dataset, BUILTIN_DATASETS)
        checks.seed("data.split_seed", self.split_seed)
        self.check_sharding()
        if not (isinstance(self.test_fraction, (int, float)) and 0.0 < self.test_fraction < 1.0):
            raise ConfigError(f"data.test_fraction must be in (0, 1), got {self.test_fraction!r}")
        if not self.name:
            object.__setattr__(self, "name", self.dataset)

    @property
    def presharded(self) -> bool:
        """Always false: a built-in set is one table, sharded by the caller."""
        return False

    def content_stamp(self) -> tuple | None:
        """`dane.data.registry.dataset_stamp`: the stamps of the files `load` reads (admissions, MNIST), so that a
        process reads them again once they are rewritten; None for scikit-learn's sets, and for files not found."""
        return dataset_stamp(self.dataset, self.data_dir)

    def load(self) -> Table:
        """The whole data set; see the module docstring for what each one holds."""
        if self.dataset in SKLEARN_SETS:
            bunch = SKLEARN_SETS[self.dataset]()
            x, y, names = bunch.data, bunch.target, [str(f) for f in bunch.feature_names]
            notes = [f"scikit-learn's bundled {self.dataset} data: {len(y)} rows x {x.shape[1]} features"]
        elif self.dataset == "admissions":
            file = resolve(ADMISSIONS_FILE, self.data_dir, fix="set data_dir=/folder/holding/it")
            x, y = read_admissions(file)
            names, notes = ["gre", "gpa", "rank"], [f"admissions: {len(y)} rows from {file}; rank kept numeric"]
        else:
            return self._mnist()
        x = np.array(x, dtype=np.float64)
        constant = standardize_columns(x, list(range(x.shape[1])))
        notes.append(
            f"standardized all {x.shape[1]} features to mean 0, std 1 over the {len(y)} rows"
            + (f" ({len(constant)} constant column(s) centred only)" if constant else "")
        )
        return Table(X=x, y=np.asarray(y, dtype=np.float64), name=f"builtin:{self.dataset}", notes=notes,
                     feature_names=names)

    def load_part(self, rank: int, size: int) -> tuple[Table, int]:
        """Not available: a built-in set is not split into per-worker files."""
        raise ConfigError(
            f"data.dataset={self.dataset} is one built-in table, not per-worker parts; read it with load() "
            "and shard it, or write one file per worker and use data=csv|libsvm|npz with {rank} in data.path"
        )

    def _mnist(self) -> Table:
        folder = resolve_dir(self.data_dir)
        if folder is None:
            raise ConfigError("dataset mnist is read from files; set data_dir=/folder/holding/the/IDX/files")
        data = load_mnist(folder, seed=self.split_seed, test_fraction=self.test_fraction, pad_to_32=False)
        n = len(data.train_y)
        # The loader gives float32 k/255; round back to k and divide in float64, exactly.
        x = np.round(data.train_x.numpy().reshape(n, -1).astype(np.float64) * 255.0) / 255.0
        notes = [*data.notes, f"MNIST training rows only: {n} rows x {x.shape[1]} pixels in [0, 1], not standardized"]
        return Table(X=x, y=data.train_y.numpy().astype(np.float64), name="builtin:mnist", notes=notes)
