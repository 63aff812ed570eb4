"""The quantizers: every entry sent at a few bits, natural compression (to a power of two) and random dithering
(to one of s levels of the row's norm); both unbiased."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..errors import ConfigError
from .base import Compressor, uniform_like

#: exponent bits of an IEEE float of each width (natural compression sends sign and exponent)
EXPONENT_BITS = {64: 11, 32: 8, 16: 5}


@dataclass(frozen=True)
class Natural(Compressor):
    r"""Natural compression (Horváth et al. 2019): each entry to one of its two neighbouring powers of two.

    With 2^e ≤ |x_j| < 2^{e+1}, C(x)_j = sign(x_j)·2^{e+1} with probability |x_j|/2^e − 1, else
    sign(x_j)·2^e (zero stays zero); unbiased, ω = 1/8.  Sends the sign and the exponent of each entry:
    n·(1 + exponent bits) bits, 12 per entry at value_bits = 64, 9 at 32, 6 at 16."""

    name: ClassVar[str] = "natural"
    unbiased: ClassVar[bool] = True

    def _rows(self, x, generator):
        magnitude = x.abs()
        low = _power_below(magnitude)  # 2^e ≤ |x| < 2^{e+1}
        up = uniform_like(x, generator) * low < magnitude - low  # P(up) = |x|/2^e − 1
        return torch.where(x == 0, torch.zeros_like(x), torch.sign(x) * low * (1 + up.to(x.dtype)))

    def bits(self, n: int, value_bits: int = 64) -> int:
        if value_bits not in EXPONENT_BITS:
            raise ConfigError(f"natural compression needs IEEE floats of {sorted(EXPONENT_BITS)} bits, "
                              f"got value_bits={value_bits}")
        return n * (1 + EXPONENT_BITS[value_bits])

    def omega(self, n: int) -> float:
        return 1.0 / 8.0


@dataclass(frozen=True)
class Dither(Compressor):
    r"""Random dithering with s levels, QSGD (Alistarh et al. 2017), per row:

    C(x)_j = ‖x‖₂·sign(x_j)·ξ_j/s, ξ_j = ⌊s|x_j|/‖x‖₂⌋ + Bernoulli(frac(s|x_j|/‖x‖₂)); unbiased,
    ω = min(n/s², √n/s) (their Lemma 3.1).  Sends the norm at value_bits and per entry a sign and a
    level in {0..s}: value_bits + n·(1 + ⌈log₂(s+1)⌉) bits (the plain encoding, not Elias coding)."""

    s: int = 1
    name: ClassVar[str] = "dither"
    unbiased: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if isinstance(self.s, bool) or not isinstance(self.s, int) or self.s < 1:
            raise ConfigError(f"dither:S needs an integer number of levels S >= 1, got {self.s!r}; write e.g. dither:4")

    def _rows(self, x, generator):
        norm = torch.linalg.vector_norm(x, dim=1, keepdim=True)
        scaled = self.s * x.abs() / torch.where(norm == 0, torch.ones_like(norm), norm)
        floor = scaled.floor()
        level = floor + (uniform_like(x, generator) < scaled - floor).to(x.dtype)
        return norm * torch.sign(x) * level / self.s

    def bits(self, n: int, value_bits: int = 64) -> int:
        return value_bits + n * (1 + self.s.bit_length())  # s.bit_length() = ⌈log₂(s+1)⌉

    def omega(self, n: int) -> float:
        return min(n / self.s ** 2, math.sqrt(n) / self.s)

    @property
    def spec(self) -> str:
        return f"dither:{self.s}"


#: the integer type of each float's bits, and the mask of its exponent field
_EXPONENT_FIELD = {torch.float64: (torch.int64, 0x7FF0000000000000), torch.float32: (torch.int32, 0x7F800000),
                   torch.float16: (torch.int16, 0x7C00)}


def _power_below(magnitude: torch.Tensor) -> torch.Tensor:
    """2^⌊log₂ a⌋ of each a > 0 (a power of two is itself): the float with a's exponent and a zero mantissa; a
    subnormal (whose exponent field is 0) goes through frexp."""
    int_type, mask = _EXPONENT_FIELD[magnitude.dtype]
    low = (magnitude.view(int_type) & mask).view(magnitude.dtype)
    subnormal = (low == 0) & (magnitude > 0)
    if bool(subnormal.any()):
        _, exponent = torch.frexp(magnitude)  # a = m·2^exponent, m in [0.5, 1)
        low = torch.where(subnormal, torch.ldexp(torch.ones_like(magnitude), exponent - 1), low)
    return low
