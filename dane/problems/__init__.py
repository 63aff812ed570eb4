"""Problems: worker shards of a distributed objective.

``Ridge``, ``LogReg`` and ``Softmax`` build the command line's ``problem=ridge|logreg|softmax``
from arrays (``dane.problems.LogReg(X, y, lam=1e-3)``).  A new problem subclasses `Problem` (a
worker's shard) and `ProblemConfig` (what builds the shards), overriding the optional members it offers.
"""
from .arrays import ArraySource, LogReg, Ridge, Softmax
from .base import Problem, ProblemConfig
from .controlled_quadratic import ControlledQuadratic
from .quadratic import QuadraticProblem
from .ridge import RidgeSyntheticConfig

__all__ = ["ArraySource", "ControlledQuadratic", "LogReg", "Problem", "ProblemConfig", "QuadraticProblem", "Ridge", "RidgeSyntheticConfig", "Softmax"]
