"""The low-rank compressor of matrices: each d×d matrix sent as the factors of its best rank-r approximation."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..errors import ConfigError
from .base import Compressor


@dataclass(frozen=True)
class LowRank(Compressor):
    r"""The best rank-r approximation of each d×d matrix in the Frobenius norm (Eckart–Young); biased, δ = r/d.

    ``symmetric=True`` (FedNL's Hessian differences, the default of ``rank:R``): compresses the
    symmetric part (x + xᵀ)/2, the matrix itself when symmetric, by its r eigenpairs of largest
    |λ|; sends r eigenvectors and eigenvalues, r·(d+1)·value_bits bits.  ``symmetric=False``: the
    truncated SVD, with the singular values folded into U: r·2d·value_bits bits.  r = d sends the
    whole factorisation (and decodes x); r > d is refused where the compressor first meets a d×d matrix
    (`rank_of`)."""

    r: int = 1
    symmetric: bool = True
    name: ClassVar[str] = "rank"
    unbiased: ClassVar[bool] = False
    matrices: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r < 1:
            raise ConfigError(f"rank:R needs an integer rank R >= 1, got {self.r!r}; write e.g. rank:1")

    def _rows(self, x, generator):
        if x.dim() != 3 or x.shape[1] != x.shape[2]:
            raise ValueError(f"rank:{self.r} compresses square matrices (rows, d, d), got shape {tuple(x.shape)}")
        r = self.rank_of(x.shape[1])
        if self.symmetric:
            evals, evecs = torch.linalg.eigh((x + x.mT) / 2)
            idx = evals.abs().topk(r, dim=1).indices
            lam = evals.gather(1, idx)
            vecs = evecs.gather(2, idx.unsqueeze(1).expand(-1, x.shape[1], -1))
            return (vecs * lam.unsqueeze(1)) @ vecs.mT
        u, sv, vh = torch.linalg.svd(x, full_matrices=False)
        return (u[..., :r] * sv[:, None, :r]) @ vh[:, :r, :]

    def rank_of(self, d: int) -> int:
        """r for a d×d matrix: at most d (r = d sends the whole matrix).  r > d is refused in one line naming d (and
        the config key the spec was made for, `dane.compress.make`): the run would send rank d while its records name
        the spec."""
        if self.r > d:
            raise ConfigError(f"{self.given_as} keeps rank R = {self.r} of a {d}×{d} matrix; choose R <= {d} "
                              f"(rank:{d} sends the whole matrix)")
        return self.r

    def check_fits(self, n: int) -> None:
        self.rank_of(self.side(n))

    def side(self, n: int) -> int:
        """d of a d×d matrix of n entries."""
        d = math.isqrt(n)
        if d * d != n:
            raise ValueError(f"rank:{self.r} counts d×d matrices; n={n} entries is not a square")
        return d

    def bits(self, n: int, value_bits: int = 64) -> int:
        d = self.side(n)
        r = self.rank_of(d)
        return r * (d + 1) * value_bits if self.symmetric else r * 2 * d * value_bits

    def delta(self, n: int) -> float:
        d = self.side(n)
        return self.rank_of(d) / d

    @property
    def spec(self) -> str:
        return f"rank:{self.r}"
