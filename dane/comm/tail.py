r"""A real machine's tail for the simulator: each allreduce's excess time drawn from a calibrated distribution.

The α-β ring (`AlphaBeta`) prices an allreduce by its size alone, and the simulator times
compute on each worker's CPU clock; a real launch also waits: for the scheduler, for the
other rank's late arrival, for Horovod's background thread.  On a shared machine those
waits have a heavy tail (a real round's mean well above its median), which a fixed price
cannot reproduce.  A *tail calibration* (``dane calibrate --tail``) records, for every
allreduce k of a real launch of DANE's rounds, the excess

.. math:: e_k = w_k - \max_i c_{i,k} - T_{\alpha\beta}(n_k, m)

of the phase's wall time w_k (from rank 0's previous allreduce to the end of this one)
over what the simulator charges for it: the slowest rank's CPU time in the phase and the
α-β price of its n_k bytes.  `Tail` keeps the empirical quantile function of those
samples as a table (`Tail.fit`: the quantiles at ``points`` evenly spaced probabilities,
numpy's linear rule, the top one set to keep the samples' mean), and draws by inverting
it: u uniform on [0, 1), the table interpolated linearly at u.  The draws' mean is the table's integral (`Tail.mean`), the
sample mean; their median, the sample median.

`TailedCost` is the run's cost model with such a table: an allreduce costs
:math:`\max(0, T_{\alpha\beta}(n, m) + e)` with e drawn per allreduce, in the order the
simulator meets them, from a generator seeded with the run's ``seed`` and ``sim.seed``
(`TailedCost.drawing`, one per run, its state kept by a checkpoint: `dane.comm.meters.SeededDraws`; the same
config and seeds give the same times, bit for bit, on the per-worker and the batched path alike).  The draw is charged to the
communication clock (``simulated_comm_s``).  Departures: e is drawn independently of n,
of m and of the phase's compute (the calibration's workload is DANE's two allreduces of
a few KB at its own m); the excess is the calibrating machine's, not a model of a network.

A calibration file is `AlphaBeta`'s JSON (α, β) with a ``tail`` entry: ``probs``,
``excess_s``, ``samples`` and where it came from (``machine``, ``launcher``, ``np``,
``measured_at``).  Every simulated run's summary has ``calibration``: the file's path,
its sha256 and that provenance where a tail was drawn, else ``"alpha-beta only"``.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..checks import is_number
from ..errors import ConfigError, brief
from .cost import AlphaBeta

#: the summary's ``calibration`` where no tail is drawn
ALPHA_BETA_ONLY = "alpha-beta only"
#: quantiles a fitted table keeps (0, 0.5 %, ..., 100 %)
POINTS = 201
#: what remakes a tail calibration, named by every error about one
REMAKE = "dane calibrate --tail"
#: what a calibration file records of where it came from (the summary repeats it)
PROVENANCE = ("launcher", "np", "measured_at", "samples")


@dataclass(frozen=True)
class Tail:
    """The excess seconds ``excess_s[j]`` at probability ``probs[j]`` (both ascending, probs from 0 to 1)."""

    probs: tuple[float, ...]
    excess_s: tuple[float, ...]

    def __post_init__(self) -> None:
        p, e = np.asarray(self.probs, dtype=float), np.asarray(self.excess_s, dtype=float)
        if p.ndim != 1 or p.shape != e.shape or p.size < 2:
            raise ValueError("probs and excess_s must be lists of the same length, at least 2")
        if not (np.all(np.isfinite(p)) and np.all(np.isfinite(e))):
            raise ValueError("probs and excess_s must be finite numbers")
        if p[0] != 0 or p[-1] != 1 or np.any(np.diff(p) <= 0):
            raise ValueError("probs must rise strictly from 0 to 1")
        if np.any(np.diff(e) < 0):
            raise ValueError("excess_s must not decrease (a quantile function)")

    @classmethod
    def fit(cls, samples, points: int = POINTS) -> "Tail":
        r"""The empirical quantiles of ``samples`` at ``points`` evenly spaced probabilities (numpy's linear
        rule), except the top one, which is set so that the table's mean is the samples' mean:

        .. math:: e_{top} = \frac{2(\bar x - S)}{1 - p_{top-1}} - e_{top-1}

        with S the integral of the other segments.  A linear last segment up to the sample's maximum
        would weigh a heavy tail's largest value as if it were half the top segment's mass, and a run's
        time is a sum of draws: the mean is what must hold.
        Where the other segments already overshoot the mean, the top point is the one below it (flat)."""
        x = np.asarray(samples, dtype=float)
        if x.ndim != 1 or x.size < 2 or not np.all(np.isfinite(x)):
            raise ValueError(f"a tail needs at least 2 finite samples, got {x.size}")
        probs = np.linspace(0.0, 1.0, points)
        e = np.quantile(x, probs)
        inner = float(np.sum(np.diff(probs[:-1]) * (e[1:-1] + e[:-2]) / 2))
        e[-1] = max(e[-2], 2 * (float(x.mean()) - inner) / (1 - probs[-2]) - e[-2])
        return cls(tuple(probs.tolist()), tuple(e.tolist()))

    @property
    def mean(self) -> float:
        """The draws' mean: the integral of the piecewise-linear quantile function over [0, 1]."""
        p, e = np.asarray(self.probs), np.asarray(self.excess_s)
        return float(np.sum(np.diff(p) * (e[1:] + e[:-1]) / 2))

    def quantile(self, u):
        """The table at probability ``u`` (scalar or array), linearly interpolated."""
        return np.interp(u, self.probs, self.excess_s)

    def draw(self, rng: np.random.Generator) -> float:
        """One excess: the quantile function at a uniform draw of ``rng``."""
        return float(self.quantile(rng.random()))

    def to_json(self) -> dict:
        return {"probs": list(self.probs), "excess_s": list(self.excess_s)}


@dataclass(frozen=True)
class TailedCost:
    """`AlphaBeta` plus an excess drawn per allreduce from ``tail`` (module docstring).

    The spec's cost model (frozen, no generator): ``allreduce_time`` is the expected price (α-β plus the
    tail's mean), for a caller that does not draw; a simulated run draws through `drawing`.  ``source``
    is what the summary's ``calibration`` says: the file, its sha256 and its provenance.
    """

    base: AlphaBeta
    tail: Tail
    source: dict = field(default_factory=dict)
    seed: tuple[int, ...] = (0, 0)

    @property
    def alpha(self) -> float:
        return self.base.alpha

    @property
    def beta(self) -> float:
        return self.base.beta

    def allreduce_time(self, nbytes: int, size: int, down_bytes: int | None = None) -> float:
        if size == 1:
            return 0.0
        return max(0.0, self.base.allreduce_time(nbytes, size, down_bytes) + self.tail.mean)

    def broadcast_time(self, nbytes: int, size: int) -> float:
        """The base model's: the tail was measured on allreduces."""
        return self.base.broadcast_time(nbytes, size)

    def allreduce_sent(self, nbytes: int, size: int, down_bytes: int | None = None) -> int:
        """The ring's bytes (`AlphaBeta.allreduce_sent`): the tail is time, not traffic."""
        return self.base.allreduce_sent(nbytes, size, down_bytes)

    def broadcast_sent(self, nbytes: int, size: int) -> int:
        return self.base.broadcast_sent(nbytes, size)

    def describe(self) -> dict:
        """The summary's cost model: α, β and ``calibration`` (which a cached run must share, `synthetic.sweep`)."""
        return {**self.base.describe(), "calibration": dict(self.source)}

    def drawing(self) -> "DrawnCost":
        """This model with a fresh generator seeded from ``seed``: one per simulated run."""
        return DrawnCost(self, np.random.default_rng(np.random.SeedSequence([*self.seed, 0x7A11])))


class DrawnCost:
    """A run's `TailedCost`: every allreduce of more than one worker draws its excess from the run's generator."""

    def __init__(self, model: TailedCost, rng: np.random.Generator):
        self.model, self.rng = model, rng  # its state: `dane.comm.meters.SeededDraws`
        self.alpha, self.beta = model.alpha, model.beta

    def allreduce_time(self, nbytes: int, size: int, down_bytes: int | None = None) -> float:
        if size == 1:
            return 0.0
        return max(0.0, self.model.base.allreduce_time(nbytes, size, down_bytes) + self.model.tail.draw(self.rng))

    def broadcast_time(self, nbytes: int, size: int) -> float:
        """The base model's, drawing nothing: the tail was measured on allreduces, and the allreduces' draws stay
        the run's."""
        return self.model.base.broadcast_time(nbytes, size)

    def allreduce_sent(self, nbytes: int, size: int, down_bytes: int | None = None) -> int:
        return self.model.allreduce_sent(nbytes, size, down_bytes)

    def broadcast_sent(self, nbytes: int, size: int) -> int:
        return self.model.broadcast_sent(nbytes, size)

    def describe(self) -> dict:
        return self.model.describe()


def drawing(cost):
    """The cost model a simulated run charges with: a tailed model's `TailedCost.drawing`, any other as it is."""
    return cost.drawing() if isinstance(cost, TailedCost) else cost


def load_tail(path: str | Path, base: AlphaBeta, seed: tuple[int, ...]) -> TailedCost | None:
    """The calibration file at ``path`` as a `TailedCost` over ``base``, or None where it has no ``tail`` entry.

    A tail that is not one (missing fields, quantiles that are not numbers, do not rise, or
    probabilities that do not run from 0 to 1) is a one-line `ConfigError` naming the file and
    the command that remakes it."""
    path = Path(path)
    raw = path.read_bytes()
    data = json.loads(raw)
    if not isinstance(data, dict) or "tail" not in data:
        return None
    tail = data["tail"]
    try:
        if not isinstance(tail, dict):
            raise TypeError("not a JSON object")
        table = Tail(numbers(tail, "probs"), numbers(tail, "excess_s"))
        source = {"path": str(path), "sha256": hashlib.sha256(raw).hexdigest(),
                  "host": str(tail["machine"]["host"]), **{k: tail[k] for k in PROVENANCE}}
    except (KeyError, TypeError, ValueError) as err:
        why = f"no {err} entry" if isinstance(err, KeyError) else brief(err)
        raise ConfigError(f"{path} is not a tail calibration ({why}); re-run `{REMAKE}` to remake it, or drop its "
                          "tail entry for alpha-beta only") from None
    return TailedCost(base, table, source, seed)


def numbers(tail: dict, key: str) -> tuple[float, ...]:
    """The tail's list ``key`` as floats: JSON numbers only (float() would read the text "0.5", and true as 1)."""
    values = tail[key]
    if not isinstance(values, list):
        raise TypeError(f"its {key} is {values!r}, not a list of numbers")
    for value in values:
        if not is_number(value):
            raise TypeError(f"its {key} holds {value!r}, not a number")
    return tuple(float(value) for value in values)


def excess_samples(phases: dict, cost: AlphaBeta, m: int) -> list[float]:
    """Each recorded allreduce phase's excess over the simulator's price, wall - slowest CPU - α-β (seconds);
    ``phases`` as `synthetic.round_timing` writes them: lists ``wall_s``, ``cpu_s``, ``nbytes``."""
    return [wall - cpu - cost.allreduce_time(int(n), m)
            for wall, cpu, n in zip(phases["wall_s"], phases["cpu_s"], phases["nbytes"], strict=True)]


def tail_entry(phases: dict, cost: AlphaBeta, m: int, **provenance) -> dict:
    """The ``tail`` entry of a calibration file: the fitted table, how many phases, their excess's mean and
    median, the mean/median of their wall time, and ``provenance`` (machine, launcher, np, measured_at)."""
    samples = excess_samples(phases, cost, m)
    table = Tail.fit(samples)
    walls = phases["wall_s"]
    return {**table.to_json(), "samples": len(samples), "excess_mean_s": float(np.mean(samples)),
            "excess_median_s": float(np.median(samples)),
            "phase_wall_mean_over_median": float(np.mean(walls) / np.median(walls)),
            "fit": f"empirical quantiles at {len(table.probs)} evenly spaced probabilities of the excess "
                   "wall - max_i cpu_i - alpha-beta(n) of each allreduce phase; drawn by inverse CDF",
            **provenance}
