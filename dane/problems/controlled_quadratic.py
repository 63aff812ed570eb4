"""``problem=controlled_quadratic``: the S-DANE paper's quadratic at a set Hessian dissimilarity δ (Jiang, Rodomanov &
Stich, NeurIPS 2024), the federated benchmark's ``--setting quadratic`` (scripts/bench_federated.py)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from .. import checks
from ..errors import ConfigError
from .base import ProblemConfig
from .quadratic import QuadraticProblem


@dataclass(frozen=True)
class ControlledQuadratic(ProblemConfig):
    r"""The S-DANE paper's quadratic at a controlled dissimilarity: O_i(w) = ½ wᵀA_i w − b_iᵀw + (μ/2)‖w‖².

    A = Q diag(s) Qᵀ with Q a random rotation and s log-spaced on [1e-6, L]; A_i = A + E_i with E_i = c P(G_i − Ḡ)P,
    G_i symmetric Gaussian, P the projector on the eigenvectors of A with s ≥ δ (so that every A_i ⪰ 0: the
    package's exact local solves need convex local problems, where the paper's may be nonconvex up to λ) and c such
    that max_i ‖E_i‖₂ = δ; mean_i E_i = 0, so H = A + μI.  b_i = H w° + ζ_i − ζ̄ (w° and ζ_i Gaussian, ‖w°‖ ≈ 1), so
    w* = w° and the gradients differ between clients too.  Deterministic in ``seed`` and the number of clients
    (the m clients' A_i are drawn together: a client's shard depends on m)."""

    name: str = "controlled_quadratic"
    dim: int = 1000
    delta: float = 0.1
    L: float = 1.0
    mu: float = 1e-6
    seed: int = 0

    def __post_init__(self) -> None:
        checks.positive_int("problem.dim", self.dim)
        checks.positive("problem.L", self.L)
        checks.nonnegative("problem.mu", self.mu)
        if not 0 < self.delta <= self.L:
            raise ConfigError(f"problem.delta must be in (0, problem.L = {self.L:g}], got {self.delta!r}")

    def check_workers(self, workers: int) -> None:
        if workers < 2:
            raise ConfigError(f"problem=controlled_quadratic sets the dissimilarity between clients: it needs "
                              f"workers >= 2, got {workers}")

    def build(self, rank: int, size: int, dtype: torch.dtype = torch.float64) -> QuadraticProblem:
        A, b, w_star = parts(self, size)
        tensor = lambda x: torch.as_tensor(x, dtype=dtype)  # noqa: E731
        return QuadraticProblem(tensor((A[rank] + A[rank].T) / 2), tensor(b[rank]), 0.0, self.mu / 2, tensor(w_star))


@lru_cache(maxsize=2)
def parts(config: ControlledQuadratic, size: int) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
    """The ``size`` clients' A_i and b_i, and w° (`ControlledQuadratic`), drawn once for all of them."""
    rng = np.random.default_rng(config.seed)
    Q, _ = np.linalg.qr(rng.standard_normal((config.dim, config.dim)))
    s = np.geomspace(1e-6, config.L, config.dim)
    P = Q[:, s >= config.delta]
    G = [(g + g.T) / 2 for g in (rng.standard_normal((P.shape[1],) * 2) for _ in range(size))]
    E = [g - sum(G) / size for g in G]
    c = config.delta / max(float(np.abs(np.linalg.eigvalsh(e)).max()) for e in E)
    A = (Q * s) @ Q.T
    w_star = rng.standard_normal(config.dim) / np.sqrt(config.dim)
    zeta = [rng.standard_normal(config.dim) for _ in range(size)]
    Hw = A @ w_star + config.mu * w_star
    return [A + c * P @ e @ P.T for e in E], [Hw + z - sum(zeta) / size for z in zeta], w_star
