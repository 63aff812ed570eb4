r"""Quadratic local objectives with exact (Cholesky) local solves.

Worker i holds

.. math:: O_i(w) = \tfrac12 w^\top A_i w - b_i^\top w + c_i + \lambda \|w\|^2,
          \qquad H_i = A_i + 2\lambda I,

and the global objective is the mean of the O_i.  When the global optimum w* is known,
suboptimality is computed as the exact quadratic identity

.. math:: O(w) - O(w^*) = \tfrac12 (w - w^*)^\top H (w - w^*),

each worker contributing :math:`\tfrac12 e^\top H_i e`, so it stays accurate to
round-off far below the objective's own cancellation error.
"""
from __future__ import annotations

import torch

from ..errors import ConfigError


class QuadraticProblem:
    """Worker i's quadratic shard; Cholesky factors of A_i (+2λI) + μI are computed once per μ."""

    convex = True

    def __init__(self, A: torch.Tensor, b: torch.Tensor, c: float, lam: float, w_star: torch.Tensor | None = None):
        self.A, self.b, self.c, self.lam = A, b, float(c), float(lam)
        self.dim = b.numel()
        self.dtype = b.dtype
        self.w_star = w_star
        self.metric_names = ("objective", "suboptimality") if w_star is not None else ("objective",)
        self._H_w_star = self.hessian_vector(w_star) if w_star is not None else None
        self._factors: dict[tuple[float, bool], torch.Tensor] = {}

    def initial_point(self) -> torch.Tensor:
        return torch.zeros(self.dim, dtype=self.dtype)

    def hessian_vector(self, v: torch.Tensor, *, with_reg: bool = True) -> torch.Tensor:
        Av = self.A @ v
        return Av + 2 * self.lam * v if with_reg else Av

    def grad(self, w: torch.Tensor, *, with_reg: bool = True) -> torch.Tensor:
        return self.hessian_vector(w, with_reg=with_reg) - self.b

    def evaluate(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        Hw = self.hessian_vector(w)
        grad = Hw - self.b
        objective = 0.5 * (w @ (Hw - 2 * self.lam * w)) - self.b @ w + self.c + self.lam * (w @ w)
        metrics = [objective]
        if self.w_star is not None:
            metrics.append(0.5 * ((w - self.w_star) @ (Hw - self._H_w_star)))
        return grad, torch.stack(metrics)

    def factor(self, mu: float, *, with_reg: bool = True) -> torch.Tensor:
        """Lower Cholesky factor of A_i (+ 2λI) + μI, cached per (μ, with_reg)."""
        key = (float(mu), with_reg)
        if key not in self._factors:
            shift = mu + (2 * self.lam if with_reg else 0.0)
            M = self.A + shift * torch.eye(self.dim, dtype=self.dtype, device=self.A.device)
            L, info = torch.linalg.cholesky_ex(M)
            if info.item() != 0:
                raise ConfigError(
                    f"the local Hessian plus mu={mu} is not positive definite on this shard; use mu > 0"
                )
            if len(self._factors) >= 8:  # the safeguard visits a handful of μ values; keep memory bounded
                self._factors.pop(next(iter(self._factors)))
            self._factors[key] = L
        return self._factors[key]

    def prox_regularizer(self, v: torch.Tensor, rho: float) -> torch.Tensor:
        r"""argmin_z λ||z||^2 + (ρ/2)||z - v||^2 = ρ v / (ρ + 2λ): the prox of the shared regulariser (ADMM's z-step)."""
        return (rho / (rho + 2 * self.lam)) * v

    def prox_solve(self, anchor: torch.Tensor, linear: torch.Tensor, mu: float, *, with_reg: bool = True,
                   anchor_grad: torch.Tensor | None = None) -> torch.Tensor:
        # Stationarity: (H_i + μI)(w - anchor) = linear - ∇O_i(anchor); solving for the step
        # rather than for w keeps the result accurate when the step is tiny.
        if anchor_grad is None:
            anchor_grad = self.grad(anchor, with_reg=with_reg)
        rhs = linear - anchor_grad
        step = torch.cholesky_solve(rhs.unsqueeze(1), self.factor(mu, with_reg=with_reg)).squeeze(1)
        return anchor + step
