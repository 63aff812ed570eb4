"""One-line validation of config values, raised before any process group starts."""
from __future__ import annotations

from numbers import Real

from .errors import ConfigError


def _number(key: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ConfigError(f"{key} must be a number, got {value!r}")
    return float(value)


def positive(key: str, value) -> float:
    if not _number(key, value) > 0:
        raise ConfigError(f"{key} must be > 0, got {value}")
    return value


def nonnegative(key: str, value) -> float:
    if not _number(key, value) >= 0:
        raise ConfigError(f"{key} must be >= 0, got {value}")
    return value


def positive_int(key: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{key} must be a positive integer, got {value!r}")
    return value


def one_of(key: str, value, choices) -> str:
    if value not in choices:
        raise ConfigError(f"{key} must be one of {'|'.join(map(str, choices))}, got {value!r}")
    return value


def boolean(key: str, value) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    return value


def integer(key: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key} must be an integer, got {value!r}")
    return value
