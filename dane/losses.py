r"""Per-row losses of linear models, as functions of the margins z = X w (or Z = X W).

Each loss gives, for rows with margins z and targets y:

- ``value(z, y)``: :math:`\sum_j f(z_j, y_j)`;
- ``dz(z, y)``: :math:`\partial f / \partial z_j`, row by row;
- ``hess(z, y, dz)``: the second derivative applied to a margin direction, row by row;
- ``second_derivative(z, y)``: :math:`f''(z_j, y_j)` row by row, where the Hessian in the margins is
  diagonal (one output: squared, logistic): ``hess(z, y, dz)`` is then ``second_derivative(z, y) * dz``,
  bit for bit, so a caller making many products at one point computes it once (`dane.problems.glm`'s
  Hessian-vector products).  None for softmax, whose curvature mixes a row's K margins;
- ``curvature``: an upper bound on :math:`f''` (per unit :math:`\|x_j\|^2`), so that
  :math:`c\,X^\top X` majorizes the data Hessian (step sizes, SVRG's step).

=========  ===========================================  =================  =======
loss       f(z, y)                                      targets            bound
=========  ===========================================  =================  =======
squared    ½ (z − y)²                                   real               1
logistic   log(1 + exp(−y z))                           ±1                 1/4
softmax    logsumexp(z) − z_y  (z in R^K)               class 0..K−1       1/2
=========  ===========================================  =================  =======

The logistic f is torch's softplus of x = −y z with its threshold raised from torch's 20 to
`SOFTPLUS_THRESHOLD` = 48 ln 2: above it f is x, below it log1p(exp(x)).  f(x) = x + log1p(e^{−x}),
and e^{−x} < 2^{−48}, half an ulp of x in [32, 64), exactly when x > 48 ln 2, so x is f rounded to
float64 there; at torch's 20 it was off by up to e^{−20}.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Loss:
    name: str
    value: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    dz: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    hess: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    curvature: float
    quadratic: bool = False
    second_derivative: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None


def _softmax_hess(z: torch.Tensor, y: torch.Tensor, dz: torch.Tensor) -> torch.Tensor:
    p = torch.softmax(z, dim=1)
    pdz = p * dz
    return pdz - p * pdz.sum(1, keepdim=True)  # (diag(p) − p pᵀ) dz, row by row


#: the margin above which softplus returns x itself: x is log(1 + e^x) rounded to float64 (module docstring)
SOFTPLUS_THRESHOLD = 48 * math.log(2)


def _logistic_second_derivative(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.sigmoid(z) * torch.sigmoid(-z)  # σ(z)σ(−z) = σ(yz)σ(−yz) for y = ±1


SQUARED = Loss("squared", value=lambda z, y: 0.5 * (z - y).square().sum(), dz=lambda z, y: z - y,
               hess=lambda z, y, dz: dz, curvature=1.0, quadratic=True,
               second_derivative=lambda z, y: torch.ones_like(z))  # ones * dz is dz, bit for bit
LOGISTIC = Loss("logistic", value=lambda z, y: F.softplus(-y * z, threshold=SOFTPLUS_THRESHOLD).sum(), dz=lambda z, y: -y * torch.sigmoid(-y * z),
                hess=lambda z, y, dz: _logistic_second_derivative(z, y) * dz, curvature=0.25,
                second_derivative=_logistic_second_derivative)
SOFTMAX = Loss("softmax", value=lambda z, y: (torch.logsumexp(z, 1) - z.gather(1, y.unsqueeze(1)).squeeze(1)).sum(),
               dz=lambda z, y: torch.softmax(z, 1) - F.one_hot(y, z.shape[1]).to(z.dtype),
               hess=_softmax_hess, curvature=0.5)
LOSSES = {loss.name: loss for loss in (SQUARED, LOGISTIC, SOFTMAX)}
#: a loss's value summed over each worker's rows of a stack (m, n) (`Loss.value` sums over all of them)
ROW_VALUES = {
    "squared": lambda z, y: 0.5 * (z - y).square().sum(-1),
    "logistic": lambda z, y: F.softplus(-y * z, threshold=SOFTPLUS_THRESHOLD).sum(-1),
}
