"""The defaults benchmark's data (``make bench`` section ``defaults``): three families where defaults can fail.

Each generator returns ``(X, y, fit_intercept)`` for one loss (``squared`` or ``logistic``),
float64, seeded.  Logistic labels are 0/1 from the sign of the same linear model plus noise.

- `rare_onehot`: Gaussian numeric columns standardized (what ``data.standardize=numeric``
  gives) and a categorical column one-hot encoded, one of whose values is in only
  ``rare`` rows, so with 4 or 8 equal shards some shard holds none of them and its
  Hessian misjudges the global one along that column (docs/design.md, "A rare feature").  No
  intercept: the one-hot columns sum to one and carry it.
- `large_targets`: standardized Gaussian features, a regression target of scale 1e5
  (y = 1e5 (3 + xᵀw + ε)) with an intercept; the case where an absolute tolerance or
  forcing term is in the wrong units.  Ridge only: logistic labels have no scale.
- `ill_conditioned`: Gaussian features scaled so that their covariance has condition
  number ``condition`` (column scales log-spaced from 1 to condition^-1/2).
"""
from __future__ import annotations

import numpy as np

FAMILIES = ("rare_onehot", "large_targets", "ill_conditioned")


def _labels(margin: np.ndarray, loss: str, rng: np.random.Generator, noise: float = 0.3) -> np.ndarray:
    if loss == "squared":
        return margin + noise * rng.standard_normal(margin.shape[0])
    return (margin + noise * rng.standard_normal(margin.shape[0]) > 0).astype(np.float64)


def rare_onehot(loss: str, n: int = 2000, d: int = 10, values: int = 4, rare: int = 3, seed: int = 0):
    """Standardized Gaussian columns and a ``values``-valued categorical one-hot encoded; the last value is in
    ``rare`` rows only, the others share the rest at random."""
    rng = np.random.default_rng(seed)
    numeric = rng.standard_normal((n, d))
    numeric = (numeric - numeric.mean(0)) / numeric.std(0)
    category = rng.integers(0, values - 1, n)
    category[rng.choice(n, rare, replace=False)] = values - 1
    onehot = np.eye(values)[category]
    X = np.hstack([numeric, onehot])
    w = rng.standard_normal(d + values)
    w[-1] = 3.0  # the rare value matters: its rows are where a shard's model goes wrong
    return X, _labels(X @ w, loss, rng), False


def large_targets(loss: str, n: int = 2000, d: int = 20, scale: float = 1e5, seed: int = 0):
    """Standardized Gaussian features; y = scale (3 + xᵀw + ε) with ε ~ N(0, 0.3²), fitted with an intercept."""
    if loss != "squared":
        raise ValueError("large_targets is a regression family: logistic labels are 0/1 whatever their scale")
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    X = (X - X.mean(0)) / X.std(0)
    return X, scale * (3.0 + _labels(X @ rng.standard_normal(d), loss, rng)), True


def ill_conditioned(loss: str, n: int = 2000, d: int = 20, condition: float = 1e6, seed: int = 0):
    """Gaussian features times column scales logspace(0, -log10(condition)/2, d): the population covariance
    diag(scales²) has condition number ``condition``; w* weighs the small columns up so they matter."""
    rng = np.random.default_rng(seed)
    scales = np.logspace(0.0, -0.5 * np.log10(condition), d)
    X = rng.standard_normal((n, d)) * scales
    w = rng.standard_normal(d) / np.sqrt(scales)
    return X, _labels(X @ w, loss, rng), True


def make(family: str, loss: str, **kwargs):
    """``(X, y, fit_intercept)`` of ``family`` for ``loss``."""
    return {"rare_onehot": rare_onehot, "large_targets": large_targets, "ill_conditioned": ill_conditioned}[family](
        loss, **kwargs)
