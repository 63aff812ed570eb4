"""Problems: worker shards of a distributed objective.

``Ridge``, ``LogReg`` and ``Softmax`` build the command line's ``problem=ridge|logreg|softmax``
from arrays (``dane.problems.LogReg(X, y, lam=1e-3)``).
"""
from .arrays import ArraySource, LogReg, Ridge, Softmax
from .base import Problem
from .quadratic import QuadraticProblem
from .ridge import RidgeSyntheticConfig

__all__ = ["ArraySource", "LogReg", "Problem", "QuadraticProblem", "Ridge", "RidgeSyntheticConfig", "Softmax"]
