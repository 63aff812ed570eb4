from .base import Problem
from .quadratic import QuadraticProblem
from .ridge import RidgeSyntheticConfig

__all__ = ["Problem", "QuadraticProblem", "RidgeSyntheticConfig"]
