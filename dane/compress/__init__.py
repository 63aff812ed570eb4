r"""Compressors of messages, with the exact size of what each one sends.

A compressor C maps a message x to what the receiver decodes, C(x), of the same shape; ``bits(n)``
is the exact size of the encoded message of n entries.  Every compressor works on a batch of rows
(``(rows, n)`` vectors, or ``(rows, d, d)`` matrices for `LowRank`), each row compressed on its own,
so that a simulator compresses all its clients in one call; a 1-D vector (a 2-D matrix for
`LowRank`) is one row.  Random compressors draw from the ``generator`` they are given (the global
torch generator when None).

The two classes the analyses use (Beznosikov et al. 2020; Safaryan et al. 2022):

- *unbiased* (``unbiased = True``): E[C(x)] = x and E‖C(x) − x‖² ≤ ω‖x‖², ω = ``omega(n)``;
- *contractive*: ‖C(x) − x‖² ≤ (1 − δ)‖x‖² (in expectation for a random C), δ = ``delta(n)`` ∈ (0, 1].  For an unbiased
  compressor ``delta`` is that of the scaled C/(ω+1), which is contractive with δ = 1/(ω+1).

``make(spec)`` builds one from its text: ``none``, ``topk:K``, ``randk:K``, ``toplek:K``, ``randseqk:K``,
``natural``, ``dither:S``, ``rank:R``; K is a count (an integer ≥ 1) or a fraction of n in (0, 1] (``0.1``),
resolved per message by `Sparsifier.k_of`.  A count is at most the length of every message the compressor is given
(K = n keeps them all): a larger one is refused where it first meets a shorter message, at the latest its first
message, and most methods size theirs as they are built, before round 0 (ω or δ of a d-vector); for messages of
several lengths (a network's tensors, a packed Hessian beside a vector) a fraction fits each.  Likewise a rank R is
at most the side d of the d×d matrices it compresses (R = d sends them whole); FedNL's line sizes its compressor as
its clients are built (`Compressor.check_fits`).

Error feedback, EF21 (Richtárik, Sokolov & Fatkhullin 2021), for the biased ones: the sender keeps
g, sends c = C(x − g) and both sides update g ← g + c; the receiver's estimate of x is g
(`ErrorFeedback`; g starts at 0, so the first message is C(x)).  EF21 needs a contractive C: an
unbiased C is used as C/(ω+1) there (δ = 1/(ω+1)), the same message scaled on receipt.

Bit counts are those of the encodings below, values at ``value_bits`` (64 for float64), indices at
⌈log₂ n⌉ bits; they count what one sender sends for one message, no framing or headers.

The classes, by concern: the contract every compressor keeps, the identity and EF21 (`dane.compress.base`); the
sparsifiers TopK, RandK, TopLEK and RandSeqK (`dane.compress.sparsifiers`); natural compression and dithering
(`dane.compress.quantizers`); the low-rank one of matrices (`dane.compress.low_rank`).  Every name is imported
from here (``from dane.compress import RandK``).
"""
from __future__ import annotations

import dataclasses

from ..errors import ConfigError
from .base import Compressor, ErrorFeedback, Identity, index_bits
from .low_rank import LowRank
from .quantizers import EXPONENT_BITS, Dither, Natural
from .sparsifiers import RandK, RandSeqK, Sparsifier, TopK, TopLEK

__all__ = ["SPECS", "SPARSIFIERS", "EXPONENT_BITS", "Compressor", "Dither", "ErrorFeedback", "Identity", "LowRank",
           "Natural", "RandK", "RandSeqK", "Sparsifier", "TopK", "TopLEK", "index_bits", "make"]

SPECS = ("none", "topk:K", "randk:K", "toplek:K", "randseqk:K", "natural", "dither:S", "rank:R")

#: the sparsifiers ``make`` builds from ``name:K``
SPARSIFIERS = {"topk": TopK, "randk": RandK, "toplek": TopLEK, "randseqk": RandSeqK}


def make(spec: str, key: str | None = None) -> Compressor:
    """The compressor ``spec`` names (the package's docstring); anything else is a one-line `ConfigError`, which
    starts with ``key=spec`` where the spec is a config key's (``algorithm.compressor=randk:0: ...``).  The
    compressor keeps ``key`` for the refusals that wait for a message's length (`Sparsifier.k_of`)."""
    try:
        built = _build(spec)
    except ConfigError as err:
        if key is None:
            raise
        raise ConfigError(f"{key}={spec}: {err}") from None
    return built if key is None else dataclasses.replace(built, key=key)


def _build(spec: str) -> Compressor:
    text = str(spec).strip().lower()
    name, _, arg = text.partition(":")
    if name in ("none", "identity") and not arg:
        return Identity()
    if name == "natural" and not arg:
        return Natural()
    if name in SPARSIFIERS and arg:
        return SPARSIFIERS[name](k=_count_or_fraction(name, arg))
    if name in ("dither", "rank") and arg:
        try:
            value = int(arg)
        except ValueError:
            raise ConfigError(f"{name}:{arg} needs an integer after the colon, e.g. {name}:4") from None
        return Dither(s=value) if name == "dither" else LowRank(r=value)
    raise ConfigError(f"compressor {spec!r} is not one of {' | '.join(SPECS)} "
                      f"(K a count like 8 or a fraction of n like 0.1)")


def _count_or_fraction(name: str, arg: str) -> int | float:
    try:
        return int(arg)
    except ValueError:
        pass
    try:
        return float(arg)
    except ValueError:
        raise ConfigError(f"{name}:{arg} needs a count or a fraction after the colon, e.g. {name}:8 or "
                          f"{name}:0.1") from None
