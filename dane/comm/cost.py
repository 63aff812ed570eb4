"""The alpha-beta cost model of a ring allreduce, used by the in-process simulator."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import ConfigError
from ..results import atomic_write_text


@dataclass(frozen=True)
class AlphaBeta:
    r"""Time of a ring allreduce of ``nbytes`` over ``m`` workers:

    .. math:: T(n, m) = \frac{2(m-1)}{m}\frac{n}{\beta} + 2(m-1)\alpha

    ``alpha`` is the per-message latency in seconds, ``beta`` the bandwidth in bytes/s.
    The defaults are Horovod over loopback on a 2-core machine (DESIGN.md section 5);
    ``python -m synthetic.calibrate`` measures them.
    """

    alpha: float = 5.5e-4
    beta: float = 4.0e8

    def __post_init__(self) -> None:
        if not self.alpha >= 0:
            raise ConfigError(f"comm cost alpha must be >= 0 seconds, got {self.alpha}")
        if not self.beta > 0:
            raise ConfigError(f"comm cost beta must be > 0 bytes/s, got {self.beta}")

    def allreduce_time(self, nbytes: int, size: int) -> float:
        if size == 1:
            return 0.0
        return 2 * (size - 1) / size * nbytes / self.beta + 2 * (size - 1) * self.alpha

    def save(self, path: str | Path, **extra) -> None:
        """Write the model (and ``extra``) as JSON: a temporary file renamed over ``path``, never half a file."""
        atomic_write_text(path, json.dumps({**asdict(self), **extra}, indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "AlphaBeta":
        """The model `save` wrote to ``path``; a file that is not one is a one-line `ConfigError` naming it."""
        try:
            data = json.loads(Path(path).read_text())
            return cls(alpha=float(data["alpha"]), beta=float(data["beta"]))
        except (OSError, ValueError, KeyError, TypeError) as err:  # ValueError: not JSON or text, a bad number
            raise ConfigError(f"{path} is not a calibration file ({_why(err)}); "
                              "re-run `python -m synthetic.calibrate` to remake it") from None


def _why(err: Exception) -> str:
    if isinstance(err, UnicodeDecodeError):
        return "not text"
    if isinstance(err, json.JSONDecodeError):
        return f"not JSON: {err.msg} at line {err.lineno} column {err.colno}"
    if isinstance(err, KeyError):
        return f"no {err} entry"
    if isinstance(err, TypeError):
        return "not a JSON object with alpha and beta"
    return " ".join(str(err).split())[:120]
