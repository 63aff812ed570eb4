"""dane: communication-efficient distributed optimization (DANE and its family) on Horovod and PyTorch.

The public names, for notebooks and scripts (see the README's "Python API"):

    import dane
    result = dane.fit(dane.problems.Ridge(X, y, lam=1e-3), "dane", workers=4, rounds=30)
"""
from . import problems
from .api import ArraySource, Result, algorithm_config, fit, shards
from .dane import DANE, DANEConfig
from .local_solvers import LOCAL_SOLVERS, LocalSolver

__all__ = ["ArraySource", "DANE", "DANEConfig", "LOCAL_SOLVERS", "LocalSolver", "Result", "algorithm_config", "fit",
           "problems", "shards"]
