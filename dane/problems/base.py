"""What an algorithm needs to know about worker i's local objective O_i.

The global objective is O(w) = (1/m) * sum_i O_i(w), so a plain ``allreduce_mean`` of
local values, gradients or metric contributions gives the global ones.
"""
from __future__ import annotations

from typing import Protocol

import torch


class Problem(Protocol):
    """Worker i's shard of a distributed objective."""

    dim: int
    dtype: torch.dtype
    #: names of the entries of the metric vector returned by `evaluate`; "objective" first
    metric_names: tuple[str, ...]
    #: whether O is convex in w; DANE's safeguard relaxes its rule when it is not (a problem
    #: without the attribute is taken as convex)
    convex: bool

    def initial_point(self) -> torch.Tensor: ...

    def evaluate(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(∇O_i(w), local metric contributions); their allreduced means are the global ones."""

    def prox_solve(self, anchor: torch.Tensor, linear: torch.Tensor, mu: float, *, with_reg: bool = True,
                   anchor_grad: torch.Tensor | None = None) -> torch.Tensor:
        r"""argmin_w O_i(w) - <linear, w> + (mu/2) ||w - anchor||^2.

        With ``with_reg=False`` the shared regulariser is left out of O_i (ADMM puts it
        into its z-step instead).  ``anchor_grad``, if given, is ∇O_i(anchor), which the
        caller may already have (DANE does); a solver that needs it need not recompute it.
        """
