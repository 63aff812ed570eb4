r"""Where a run that hit its round cap was heading: a geometric fit to its last rounds.

A method that converges linearly has :math:`v_t \approx c\,r^t` for its suboptimality (or
gradient norm) :math:`v_t`.  The rate is the least-squares slope of :math:`\log v_t` on
:math:`t` over the last `WINDOW` rounds, :math:`\hat r = \exp(\hat s)`, and the rounds still
needed to reach a target :math:`\tau < v_T` are

.. math:: n = \left\lceil \frac{\log(\tau / v_T)}{\log \hat r} \right\rceil .

A fit is read as progress only where it moves :math:`\log v` by at least `STALL` over the
window (about 1 %); less, either way, is "stalled", and a rise as large is "not contracting".
Where the last `WINDOW` rounds move less than that, the fit is taken again over the later
half of the run: a run contracting by 0.9997 a round (GD on an ill-conditioned ridge) moves
0.6 % in 20 rounds and would read "stalled", but 45 % in 1,500.  Under client sampling (``noisy``) the fit always
spans that later half: a sampled round's objective can swing by more than 20 rounds of progress, so that the last
20 rounds alone can read "not contracting" while the run still falls.
The least-squares slope (not the ratio of the window's ends) keeps one noisy round (a
rejected DANE step, ADMM's oscillation) from deciding the verdict.  A gradient norm is no measure of progress
on its own where the loss is not convex (a network's rises while its loss falls): where the fit of one reads
flat or growing while the objective fell (or the test loss fell, or the test accuracy rose) by at least `FELL`
over the same rounds, the phrase says those changes first and the gradient norm's as a separate fact
(`Trend.progress`, `improved`), never "stalled" or "not contracting".  `dane.loop.stopping.StopRule`
puts `Trend.describe`'s phrase after ``rounds = N`` in ``stopped_by``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

#: rounds the fit spans (fewer when the run or the positive tail of its records is shorter)
WINDOW = 20
#: |fitted change of log v over the window| below which the run is "stalled"
STALL = 0.01
#: a suboptimality at most this times |O| is the objective's round-off (64 ulps of float64); a gradient norm at most
#: this times round 0's is the gradient's
ROUND_OFF = 64 * 2.0 ** -52
#: the least-squares change over the window, relative to the objective's (test loss's) size, or absolute for the
#: test accuracy, from which `improved` reads the value as improved
FELL = 1e-3


def geometric_rate(rounds: list[int], values: list[float]) -> float:
    """exp of the least-squares slope of log(values) on rounds: r with values ≈ c · r^round (all values > 0)."""
    return math.exp(slope(rounds, [math.log(v) for v in values]))


def slope(rounds: list[int], values: list[float]) -> float:
    """The least-squares slope of ``values`` on ``rounds`` (at least two distinct rounds)."""
    mean_t, mean_y = sum(rounds) / len(rounds), sum(values) / len(values)
    spread = sum((t - mean_t) ** 2 for t in rounds)
    return sum((t - mean_t) * (y - mean_y) for t, y in zip(rounds, values)) / spread


@dataclass(frozen=True)
class Trend:
    """The fit over ``span`` rounds ending at ``value`` (``shown``: that value as the line gives it, "suboptimality
    2.0e-08 x |O*|"); ``target`` (absolute, or None) is where the run would stop, ``target_label`` its setting."""

    shown: str
    value: float
    rate: float
    span: int
    target: float | None = None
    target_label: str = ""
    round_off_of: str = ""  # whose round-off the value is within ("the objective's", "the gradient's"): no stop test
    # can ask for less; "" where it is not
    progress: str = ""  # `improved` over the same rounds ("objective 2.333 -> 1.370"), read where a flat or growing
    # gradient norm would otherwise be called no progress; "" where nothing improved or the value is a suboptimality

    @property
    def moved(self) -> float:
        """The fitted change of log(value) over the window."""
        return log_change(self.rate, self.span)

    def more_rounds(self) -> int | None:
        """Rounds still needed to reach ``target`` at ``rate``; None without a target or without progress."""
        if self.target is None or self.target <= 0 or self.moved > -STALL:
            return None
        return max(1, math.ceil(math.log(self.target / self.value) / math.log(self.rate)))

    def describe(self, rounds: int) -> str:
        """One phrase: the value, the rate over the window and, when contracting, the rounds to the target
        (``rounds``: the cap the run hit, for the suggested override)."""
        over = f"over the last {self.span} rounds"
        if self.round_off_of:
            return f"{self.shown}, at {self.round_off_of} round-off (set tol to stop sooner)"
        if self.progress and self.moved > -STALL:
            how = "flat" if abs(self.moved) < STALL else f"growing {rate_text(self.rate)}x per round"
            return f"{self.progress} {over}; {self.shown}, {how}"
        if abs(self.moved) < STALL:
            return f"{self.shown}, stalled (no progress {over})"
        if self.moved > 0:
            return f"{self.shown}, not contracting (growing {rate_text(self.rate)}x per round {over})"
        shrinking = f"{self.shown}, shrinking {rate_text(self.rate)}x per round {over}"
        more = self.more_rounds()
        if more is None:
            return shrinking
        return (f"{shrinking}: about {two_digits(more):,} more rounds to {self.target_label} "
                f"(try rounds={two_digits(rounds + more, up=True)})")


def fit(records: list[dict], key: str, *, noisy: bool = False) -> tuple[float, int, float] | None:
    """(rate, span, last value) of ``key`` over the last `WINDOW` rounds of ``records`` in which it is positive and
    finite, or over the later half of those rounds where the window moves less than `STALL` or the rounds are
    ``noisy`` (client sampling); None with fewer than three such records (two rounds) at the end."""
    tail = []
    for record in reversed(records):
        value = record.get(key)
        if value is None or not math.isfinite(value) or value <= 0:
            break
        tail.append(record)
    if len(tail) < 3:
        return None
    tail.reverse()
    rate, span = tail_rate(tail[-(WINDOW + 1):], key)
    if (noisy or abs(log_change(rate, span)) < STALL) and len(tail) > 2 * (WINDOW + 1):
        rate, span = tail_rate(tail[len(tail) // 2:], key)
    return rate, span, tail[-1][key]


def improved(records: list[dict], span: int) -> str:
    """What improved over the last ``span`` rounds of ``records`` by the least-squares fit of each, by at least `FELL`:
    "objective 2.333 -> 1.370 and test accuracy 0.142 -> 0.797" (the window's end values); the test loss only where
    the objective did not fall; "" where none did."""
    tail = [r for r in records if r["round"] >= records[-1]["round"] - span]

    def better(key: str) -> bool:
        change = fitted_change(tail, key)
        if change is None or key == "test_accuracy":
            return change is not None and change >= FELL
        size = max(abs(tail[0][key]), abs(tail[-1][key]))
        return size > 0 and -change >= FELL * size

    keys = ["objective"] if better("objective") else ["test_loss"] if better("test_loss") else []
    keys += ["test_accuracy"] if better("test_accuracy") else []
    return " and ".join(f"{key.replace('_', ' ')} {shown(tail[0][key], key)} -> {shown(tail[-1][key], key)}"
                        for key in keys)


def shown(value: float, key: str) -> str:
    """``value`` of ``key`` as `improved` gives it: an accuracy to three decimals, a loss to four digits."""
    return f"{value:.3f}" if key == "test_accuracy" else f"{value:#.4g}"


def fitted_change(tail: list[dict], key: str) -> float | None:
    """The least-squares slope of ``key`` on the round over ``tail`` times the rounds it spans; None where a record
    lacks a finite value of it or the tail spans no round."""
    values, rounds = [r.get(key) for r in tail], [r["round"] for r in tail]
    if rounds[-1] == rounds[0] or any(v is None or not math.isfinite(v) for v in values):
        return None
    return slope(rounds, values) * (rounds[-1] - rounds[0])


def log_change(rate: float, span: int) -> float:
    """The change of log(value) a geometric ``rate`` per round makes over ``span`` rounds (`Trend.moved`)."""
    return span * math.log(rate)


def tail_rate(tail: list[dict], key: str) -> tuple[float, int]:
    """`geometric_rate` of ``key`` over ``tail`` and the rounds it spans."""
    rounds = [r["round"] for r in tail]
    return geometric_rate(rounds, [r[key] for r in tail]), rounds[-1] - rounds[0]


def rate_text(rate: float) -> str:
    """``rate`` with two significant digits of its distance from 1 (0.9960, 0.988, 1.02), so it never reads 1; a rate
    below 0.1 with two of its own (0.012, 3.4e-05), so it never reads 0."""
    if 0 <= rate < 0.1:
        return f"{rate:.2g}"
    gap = float(f"{abs(1.0 - rate):.2g}")  # rounded first: 0.0999999 is 0.1, and reads 0.90, not 0.900
    digits = 2 if gap == 0 else max(2, 1 - math.floor(math.log10(gap)))
    return f"{rate:.{digits}f}"


def two_digits(n: int, up: bool = False) -> int:
    """``n`` to two significant digits (1336 -> 1300; ``up``: 1336 -> 1400); below 100 unchanged."""
    if n < 100:
        return n
    step = 10 ** (len(str(n)) - 2)
    return (-(-n // step) if up else round(n / step)) * step
