"""The contract every compressor keeps (`Compressor`), the identity, and EF21 error feedback over any of them
(`ErrorFeedback`); the definitions and the bit conventions are the package's (`dane.compress`)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch


def index_bits(n: int) -> int:
    """⌈log₂ n⌉: the bits of one index into n entries (0 for n = 1)."""
    return (n - 1).bit_length()


def uniform_like(x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Uniforms on [0, 1) of x's shape and dtype, drawn on the generator's device, placed on x's."""
    device = generator.device if generator is not None else x.device
    return torch.rand(x.shape, generator=generator, dtype=x.dtype, device=device).to(x.device)


@dataclass(frozen=True)
class Compressor:
    """C: the decoded message of each row of x, same shape; `bits` of one encoded message of n entries."""

    name: ClassVar[str]
    unbiased: ClassVar[bool]
    #: compresses (rows, d, d) matrices instead of (rows, n) vectors
    matrices: ClassVar[bool] = False
    #: the config key the spec was given as (``algorithm.compressor``), which a refusal that needs the message's
    #: length names (`dane.compress.make`); None: a compressor built in code
    key: str | None = field(default=None, kw_only=True, compare=False, repr=False)

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        one = x.dim() == (2 if self.matrices else 1)
        rows = x.unsqueeze(0) if one else x
        out = self._rows(rows, generator)
        return out.squeeze(0) if one else out

    def _rows(self, x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        raise NotImplementedError

    def bits(self, n: int, value_bits: int = 64) -> int:
        """Exact bits of one compressed message of n entries."""
        raise NotImplementedError

    def check_fits(self, n: int) -> None:
        """Refuses, in one line naming the config key (`dane.compress.make`), a compressor sized beyond a message of
        n entries: a sparsifier's count K > n (`Sparsifier.k_of`), a rank R > d of d×d matrices, n = d²
        (`LowRank.rank_of`).  What a method calls as it is built, before its first message; the others fit every n."""

    def omega(self, n: int) -> float:
        """ω with E‖C(x) − x‖² ≤ ω‖x‖² for an unbiased compressor; inf for a biased one."""
        return math.inf

    def unbiased_omega(self, n: int) -> float | None:
        """`omega` of an unbiased compressor, None for a contractive one: what the default rules that take 1/(ω + 1)
        or 1 by the compressor's class read (`baselines.defaults.hessian_learning_rate`, `model_learning_rate`)."""
        return self.omega(n) if self.unbiased else None

    def contractive_divisor(self, n: int) -> float:
        """What a message of C on n entries is divided by to be one of a contractive compressor: 1 + ω for an
        unbiased C (C/(ω + 1) has δ = 1/(ω + 1), `delta`; unscaled, its variance ω‖x‖² may exceed ‖x‖²), 1 for
        a contractive C, used as it is.  EF21 (`ErrorFeedback`) and Newton-3PC's clag and cbag
        (`baselines.newton_3pc`) take an unbiased C so."""
        return 1.0 + self.omega(n) if self.unbiased else 1.0

    def delta(self, n: int) -> float:
        """δ with ‖C(x) − x‖² ≤ (1 − δ)‖x‖²; for an unbiased compressor, that of C/(ω+1): 1/(ω+1)."""
        return 1.0 / (1.0 + self.omega(n))

    @property
    def spec(self) -> str:
        """The text `dane.compress.make` builds this compressor from."""
        return self.name

    @property
    def given_as(self) -> str:
        """``key=spec`` where the config key is known (``algorithm.compressor=topk:5``), else the spec: what a refusal
        names."""
        return f"{self.key}={self.spec}" if self.key else self.spec


@dataclass(frozen=True)
class Identity(Compressor):
    """No compression: n values."""

    name: ClassVar[str] = "none"
    unbiased: ClassVar[bool] = True

    def _rows(self, x, generator):
        return x.clone()

    def bits(self, n: int, value_bits: int = 64) -> int:
        return n * value_bits

    def omega(self, n: int) -> float:
        return 0.0


class ErrorFeedback:
    """EF21 at one sender (`dane.compress`): ``self(x)`` sends c = C(x − g), sets g ← g + c and returns g, the
    receiver's estimate of x (the receiver, which keeps the same g, decodes the same).  An unbiased C is
    scaled to the contractive C/(ω+1), with ω of the message's length."""

    def __init__(self, compressor: Compressor):
        self.compressor = compressor
        self.g: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        if self.g is None:
            self.g = torch.zeros_like(x)
        c = self.compressor(x - self.g, generator)
        if self.compressor.unbiased:
            n = x.shape[-1] if not self.compressor.matrices else x.shape[-1] ** 2
            c = c / self.compressor.contractive_divisor(n)
        self.g = self.g + c
        return self.g

    def state_dict(self) -> dict:
        return {"g": None if self.g is None else self.g.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.g = None if state["g"] is None else state["g"].clone()
