"""dane: communication-efficient distributed optimization (DANE and its family) on Horovod and PyTorch.

The public names, for notebooks and scripts (docs/python_api.md):

    import dane
    result = dane.fit(dane.problems.Ridge(X, y, lam=1e-3), "dane", workers=4, rounds=30)

A method of one's own subclasses ``dane.Algorithm`` (its round, and on the class what it
supports and the columns it reports) and ``dane.AlgorithmConfig`` (its hyperparameters, with
``algorithm = <the class>``); a yaml with ``_target_`` naming the config, in a folder given
to ``--config-dir`` as ``algorithm/<name>.yaml``, selects it with ``algorithm=<name>``.

They are imported on first use (PEP 562), so that ``import dane`` costs nothing a run
does not need: a launched worker imports the modules its run uses and no others.
"""
from __future__ import annotations

import importlib

from .layout import CHECKOUT, lazy_names

if CHECKOUT is not None:  # a checkout: dane.baselines, dane.experiments, ... are its root folders (dane/layout.py)
    __path__.append(str(CHECKOUT))

_PUBLIC = {
    "ArraySource": "problems.arrays", "Result": "api", "algorithm_config": "api", "fit": "api", "shards": "api",
    "DANE": "dane", "DANEConfig": "dane",
    "LOCAL_SOLVERS": "numerics.local_solvers", "LocalSolver": "numerics.local_solvers",
    # to write a method or a problem of one's own (docstrings of dane.algorithm and dane.problems.base)
    "Algorithm": "algorithm", "AlgorithmConfig": "algorithm", "Column": "algorithm", "known_algorithms": "algorithm",
    "Problem": "problems.base", "ProblemConfig": "problems.base", "Communicator": "comm", "ConfigError": "errors",
    "counted": "work",  # a problem of one's own counts its local work (docs/results.md)
    # one's own files, read as data=csv|libsvm|npz reads them (docs/python_api.md, docs/own_data.md)
    "CSVSource": "data.csv_source", "LibSVMSource": "data.libsvm_source", "NPZSource": "data.npz_source",
    "save_npz": "data.npz_source",
    "Table": "data.table",  # what a data source of one's own returns from load() (docs/extending.md)
    # a problem of one's own that deals its rows as data.sharding does (docs/own_data.md, "Heterogeneous shards")
    "ShardingKeys": "data.sharding", "column_shards": "data.sharding",
    "read_rounds": "records.results", "read_summary": "records.results",  # a run folder read back (docs/results.md)
}
__all__ = sorted([*_PUBLIC, "problems"])


_public = lazy_names(__name__, {name: f".{module}" for name, module in _PUBLIC.items()})


def __getattr__(name: str):
    if name == "problems":
        return importlib.import_module(".problems", __name__)
    return _public(name)


def __dir__() -> list[str]:
    """The public names and the module's dunders: not this module's own imports (``importlib``, ``CHECKOUT``, ...),
    nor a second copy of a name `__getattr__` has already put into its globals."""
    return sorted({*__all__, *(name for name in globals() if name.startswith("__"))})
