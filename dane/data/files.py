"""Bring your own data: sources that read a convex problem's rows from files (``conf/data/``).

A source is a small frozen dataclass that Hydra builds from ``conf/data/<name>.yaml``
(``_target_``); it checks its fields when built and reads a `Table` (``X``: n x d
float64, dense or ``csr_matrix``; ``y``: float64 labels exactly as in the file)::

    source = CSVSource("admissions.csv", target="admit", categorical=("rank",), data_dir="../shared/data")
    table = source.load()                       # the whole data set
    table, N = source.load_part(rank, size)     # presharded: path has {rank}; this worker's file only
    y = check_labels(table.y, "logistic", table.name)   # ±1 labels, or one line saying why not

Sources: `CSVSource` (header row, one-hot categorical columns, imputation,
standardization), `LibSVMSource` (sparse), `NPZSource` (dense or CSR arrays; `save_npz`
writes one), `BuiltinSource` (digits, iris, breast_cancer, diabetes, admissions, mnist), `SyntheticSource`
(FedProx's Synthetic(α, β), generated; its clients are the workers' parts).
The file sources take ``standardize``: numeric | all | none over all rows
(`dane.data.scaling`: a sparse X is scaled, not centred).
Every source takes the sharding keys (``sharding``: iid | dirichlet | classes | quantity,
``alpha``, ``classes_per_worker``, ``exponent``, ``skew_on``, ``bins``: `dane.data.sharding`),
which say how a convex problem deals the table's rows to its workers; ``{rank}`` parts are
the partition themselves. The file sources also take ``sharding=column`` with
``client_column`` (a CSV header name, an .npz key, LIBSVM's ``qid``): one client per
distinct value of that column, read into ``Table.clients`` and left out of the features.

Every source has ``name``, ``presharded``, ``load()`` and ``load_part(rank, size)``.
Relative paths are looked up under ``data_dir``, then the working folder (`resolve`);
a relative ``data_dir`` is taken from the repository root. Every user mistake (a
missing file or column, a bad cell, parts that do not match the workers) raises one
line, a ``ConfigError`` or ``DataError``, that names the problem and the fix.
"""

from dane.data.builtin_source import BUILTIN_DATASETS, BuiltinSource
from dane.data.csv_source import CSVSource
from dane.data.labels import LOSSES, check_labels
from dane.data.libsvm_source import LibSVMSource
from dane.data.npz_source import NPZSource, save_npz
from dane.data.parts import check_same_width, is_presharded
from dane.data.synthetic_source import SyntheticSource
from dane.data.table import Table, resolve, resolve_dir

SOURCES = (CSVSource, LibSVMSource, NPZSource, BuiltinSource, SyntheticSource)

__all__ = [
    "BUILTIN_DATASETS",
    "LOSSES",
    "SOURCES",
    "BuiltinSource",
    "CSVSource",
    "LibSVMSource",
    "NPZSource",
    "SyntheticSource",
    "Table",
    "check_labels",
    "check_same_width",
    "is_presharded",
    "resolve",
    "resolve_dir",
    "save_npz",
]
