"""Problems: worker shards of a distributed objective.

``Ridge``, ``LogReg`` and ``Softmax`` build the command line's ``problem=ridge|logreg|softmax``
from arrays (``dane.problems.LogReg(X, y, lam=1e-3)``).
"""
from .base import Problem
from .quadratic import QuadraticProblem
from .ridge import RidgeSyntheticConfig

__all__ = ["LogReg", "Problem", "QuadraticProblem", "Ridge", "RidgeSyntheticConfig", "Softmax"]


def __getattr__(name: str):
    # the array constructors live in dane.api, which imports this package: resolve them lazily
    if name in ("Ridge", "LogReg", "Softmax"):
        from .. import api

        return getattr(api, name)
    raise AttributeError(name)
