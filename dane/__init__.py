"""dane: communication-efficient distributed optimization (DANE and its family) on Horovod and PyTorch.

The public names, for notebooks and scripts (see the README's "Python API"):

    import dane
    result = dane.fit(dane.problems.Ridge(X, y, lam=1e-3), "dane", workers=4, rounds=30)

They are imported on first use (PEP 562), so that ``import dane`` costs nothing a run
does not need: a launched worker imports the modules its run uses and no others.
"""
from __future__ import annotations

import importlib

from .layout import CHECKOUT

if CHECKOUT is not None:  # a checkout: dane.baselines, dane.experiments, ... are its root folders (dane/layout.py)
    __path__.append(str(CHECKOUT))

_PUBLIC = {
    "ArraySource": "problems.arrays", "Result": "api", "algorithm_config": "api", "fit": "api", "shards": "api",
    "DANE": "dane", "DANEConfig": "dane",
    "LOCAL_SOLVERS": "local_solvers", "LocalSolver": "local_solvers",
}
__all__ = sorted([*_PUBLIC, "problems"])


def __getattr__(name: str):
    if name == "problems":
        return importlib.import_module(".problems", __name__)
    if name in _PUBLIC:
        value = getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dane' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
