"""Cost models of one allreduce for the in-process simulator: a ring (`AlphaBeta`) or parameter servers
(`ParameterServerCost`); ``sim.topology`` picks one.  Each says what a collective takes (``allreduce_time``,
``broadcast_time``) and what a worker sends in it (``allreduce_sent``, ``broadcast_sent``: ``bytes_sent``)."""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from ..checks import is_number
from ..errors import ConfigError, brief
from ..records.results import atomic_write_text

#: the message sizes (bytes) a calibration times, 8 B to 4 MB (`dane.synthetic.calibrate`)
CALIBRATION_SIZES = (8, 64, 512, 4096, 32768, 262144, 1048576, 4194304)


def ring_allreduce_bytes(nbytes: int, size: int) -> int:
    """Bytes one worker sends in a ring allreduce of an ``nbytes`` message: 2(m-1)/m * nbytes."""
    return 0 if size == 1 else (2 * (size - 1) * nbytes) // size


@dataclass(frozen=True)
class AlphaBeta:
    r"""Time of a ring allreduce of ``nbytes`` over ``m`` workers:

    .. math:: T(n, m) = \frac{2(m-1)}{m}\frac{n}{\beta} + 2(m-1)\alpha

    ``alpha`` is the per-message latency in seconds, ``beta`` the bandwidth in bytes/s; n is the
    message as the communicator counted it: under ``comm.compress`` its compressed size
    (`dane.comm.compression`), as for `ParameterServerCost`.  Under ``comm.compress_down`` the reply has a size
    of its own, ``down_bytes``, and the ring's two halves are charged apart: its reduce-scatter at the uplink's n,
    its allgather at the downlink's,

    .. math:: T(n_{up}, n_{down}, m) = \frac{m-1}{m}\frac{n_{up} + n_{down}}{\beta} + 2(m-1)\alpha
    The defaults are Horovod over loopback on a 2-core machine (docs/design.md, "The machines");
    ``python -m synthetic.calibrate`` measures them.
    """

    alpha: float = 5.5e-4
    beta: float = 4.0e8

    def __post_init__(self) -> None:
        _check_link(self.alpha, self.beta)

    def allreduce_time(self, nbytes: int, size: int, down_bytes: int | None = None) -> float:
        if size == 1:
            return 0.0
        if down_bytes is None:
            return 2 * (size - 1) / size * nbytes / self.beta + 2 * (size - 1) * self.alpha
        return (size - 1) / size * (nbytes + down_bytes) / self.beta + 2 * (size - 1) * self.alpha

    def allreduce_sent(self, nbytes: int, size: int, down_bytes: int | None = None) -> int:
        """Bytes one worker sends in a ring allreduce of an ``nbytes`` message (a record's ``bytes_sent``):
        2(m−1)/m·n, floored; under ``comm.compress_down`` its reduce-scatter at n and its allgather at the reply's
        ``down_bytes``, (m−1)(n + n_down)/m."""
        if down_bytes is None:
            return ring_allreduce_bytes(nbytes, size)
        return (size - 1) * (nbytes + down_bytes) // size

    def broadcast_sent(self, nbytes: int, size: int) -> int:
        """Bytes the root sends in a broadcast of ``nbytes``, counted at the root: (m−1)·n, the payload for each of
        the others."""
        return nbytes * (size - 1)

    def broadcast_time(self, nbytes: int, size: int) -> float:
        r"""Time of a broadcast of ``nbytes`` from one worker to the other m − 1, a binomial tree (Thakur,
        Rabenseifner & Gropp 2005, the textbook model of MPI's): :math:`\lceil\log_2 m\rceil(\alpha + n/\beta)`."""
        return 0.0 if size == 1 else math.ceil(math.log2(size)) * (self.alpha + nbytes / self.beta)

    def describe(self) -> dict:
        """What a run's summary records of its cost model."""
        return {"alpha": self.alpha, "beta": self.beta}

    def save(self, path: str | Path, **extra) -> None:
        """Write the model (and ``extra``) as JSON: a temporary file renamed over ``path``, never half a file."""
        atomic_write_text(path, json.dumps({**asdict(self), **extra}, indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "AlphaBeta":
        """The model `save` wrote to ``path``; a file that is not one is a one-line `ConfigError` naming it."""
        return _load(cls, path, "dane calibrate", "allreduce")


@dataclass(frozen=True)
class ParameterServerCost:
    r"""Time of one allreduce through ``servers`` = k parameter servers over m workers (push, average, pull):

    .. math:: T(n, m) = 2m\left(\alpha + \frac{n}{k\beta}\right) + \frac{m\,n}{k\,\gamma}

    Server j holds a contiguous slice of n/k bytes.  Its link takes the m workers' pushes
    of that slice one after another, then their m pulls (α per message, β bytes/s), and
    between the two it sums the m slices at ``gamma`` bytes/s.  Both terms grow with m:
    the server's serial part, which the source paper names as the reason its speedup
    falls short of linear.  A ring allreduce (`AlphaBeta`) sends 2(m-1)/m of the message
    per worker instead, on every link at once.  ``python -m synthetic.calibrate --topology
    ps`` measures α, β and γ on real ``comm=ps`` runs.  Under ``comm.compress_down`` the pulls carry the reply's
    ``down_bytes``: T = m(2α + (n + n_down)/(kβ)) + m n/(kγ).
    """

    alpha: float = AlphaBeta.alpha  # the same links as the ring's by default
    beta: float = AlphaBeta.beta
    gamma: float = 2.0e9
    servers: int = 1

    def __post_init__(self) -> None:
        _check_link(self.alpha, self.beta)
        if not self.gamma > 0:
            raise ConfigError(f"parameter-server gamma must be > 0 bytes/s, got {self.gamma}")
        if isinstance(self.servers, bool) or not isinstance(self.servers, int) or self.servers < 1:
            raise ConfigError(f"sim.servers must be an integer >= 1, got {self.servers!r}")

    def allreduce_time(self, nbytes: int, size: int, down_bytes: int | None = None) -> float:
        slice_bytes = nbytes / self.servers
        if down_bytes is None:
            return 2 * size * (self.alpha + slice_bytes / self.beta) + size * slice_bytes / self.gamma
        pushes_pulls = (slice_bytes + down_bytes / self.servers) / self.beta
        return size * (2 * self.alpha + pushes_pulls) + size * slice_bytes / self.gamma

    def allreduce_sent(self, nbytes: int, size: int, down_bytes: int | None = None) -> int:
        """Bytes one worker sends in an allreduce through the servers (a record's ``bytes_sent``, as
        `dane.comm.ps.PSCommunicator` counts it): its push, the whole n-byte message (slice j to server j), whatever
        m; the reply it pulls, ``down_bytes`` under ``comm.compress_down``, it receives."""
        return nbytes

    def broadcast_sent(self, nbytes: int, size: int) -> int:
        """Bytes the root sends in a broadcast through the servers: its payload once, which the servers relay."""
        return nbytes

    def broadcast_time(self, nbytes: int, size: int) -> float:
        """Time of a broadcast through the servers: the root's push of its n/k-byte slice to each server, then the
        other m − 1 workers' pulls of it, one after another on each server's link: m(α + n/(kβ))."""
        return 0.0 if size == 1 else size * (self.alpha + nbytes / self.servers / self.beta)

    def describe(self) -> dict:
        """What a run's summary records of its cost model: α, β, γ, the servers, and that its ``bytes_sent`` counts
        each allreduce's whole message (a stored run without that entry counted a ring's share: it answers no timed
        job, `synthetic.sweep.answers`)."""
        return {"topology": "ps", **asdict(self), "bytes_sent_per_allreduce": "message"}

    def save(self, path: str | Path, **extra) -> None:
        """As `AlphaBeta.save` (the server count is the run's choice, not the machine's: not saved)."""
        data = {k: v for k, v in asdict(self).items() if k != "servers"}
        atomic_write_text(path, json.dumps({**data, "topology": "ps", **extra}, indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path, servers: int = 1) -> "ParameterServerCost":
        return replace(_load(cls, path, "dane calibrate --topology ps", "ps"), servers=servers)


def _check_link(alpha: float, beta: float) -> None:
    if not alpha >= 0:
        raise ConfigError(f"comm cost alpha must be >= 0 seconds, got {alpha}")
    if not beta > 0:
        raise ConfigError(f"comm cost beta must be > 0 bytes/s, got {beta}")


#: where a calibration file of each topology (its ``topology`` entry; none: a ring's) is given to the simulator
CALIBRATION_KEYS = {"allreduce": "sim.calibration", "ps": "sim.ps_calibration with sim.topology=ps"}


def _load(cls, path: str | Path, remake: str, topology: str):
    """``cls`` from the JSON `save` wrote (its float fields; a missing optional one keeps its default);
    a file that is not one is a one-line `ConfigError` naming it and the command that remakes it, and a file of
    the other ``topology`` one naming its topology and the key that takes it (`CALIBRATION_KEYS`)."""
    try:
        data = json.loads(Path(path).read_text())
        found = data.get("topology", "allreduce") if isinstance(data, dict) else topology
        if not (isinstance(found, str) and found in CALIBRATION_KEYS):
            raise ValueError(f"topology {found!r} is neither allreduce nor ps")
        if found == topology:
            required = {"alpha", "beta"}
            values = {f.name: data[f.name] for f in fields(cls)
                      if f.name in required or (f.type in ("float", float) and f.name in data)}
            for name, value in values.items():  # JSON's Infinity and NaN are numbers to Python's reader
                if not is_number(value):  # "5e-4" and true would pass float()
                    raise ValueError(f"its {name} is {value!r}, not a number")
                if not math.isfinite(value):
                    raise ValueError(f"its {name} is {value}, not a finite number")
            return cls(**{name: float(value) for name, value in values.items()})
    except (OSError, ValueError, KeyError, TypeError) as err:  # ValueError: not JSON or text, a bad number
        raise ConfigError(f"{path} is not a calibration file ({_why(err)}); re-run `{remake}` to remake it") from None
    raise ConfigError(f"{path} is a calibration of topology {found}, not {topology}: give it as "
                      f"{CALIBRATION_KEYS[found]}")


def _why(err: Exception) -> str:
    if isinstance(err, UnicodeDecodeError):
        return "not text"
    if isinstance(err, json.JSONDecodeError):
        return f"not JSON: {err.msg} at line {err.lineno} column {err.colno}"
    if isinstance(err, KeyError):
        return f"no {err} entry"
    if isinstance(err, TypeError):
        return "not a JSON object with alpha and beta"
    return brief(err)
