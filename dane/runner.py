"""The round loop shared by every algorithm and backend, with rank-0 logging."""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from typing import Callable

from .algorithm import Algorithm


@dataclass(frozen=True)
class StopRule:
    """Stop after ``rounds`` rounds, or once suboptimality (else grad_norm) is at most ``tol``.

    A run whose objective becomes non-finite or grows past ``blowup`` times its start is
    stopped and marked diverged.
    """

    rounds: int = 30
    tol: float | None = None
    blowup: float = 1e8

    def status(self, record: dict, first: dict) -> str | None:
        objective = record["objective"]
        if not math.isfinite(objective) or abs(objective) > self.blowup * max(1.0, abs(first["objective"])):
            return "diverged"
        if self.tol is not None:
            key = "suboptimality" if "suboptimality" in record else "grad_norm"
            if record.get(key, math.inf) <= self.tol:
                return "converged"
        return None


def run(algo: Algorithm, stop: StopRule, on_round: Callable[[dict], None] | None = None) -> tuple[list[dict], str]:
    """Run rounds until ``stop`` says so; every record describes iterate w_t and what it cost to reach.

    Round t's metrics are measured inside round t's first allreduce, and its time and
    bytes are the totals when w_t was produced.  The last iterate gets one evaluation.
    """
    comm = algo.comm
    cost = {"time_s": comm.elapsed(), "bytes_sent": comm.bytes_sent, "comm_rounds": comm.calls}
    records: list[dict] = []
    status = "max_rounds"
    for t in range(stop.rounds + 1):
        metrics = algo.step() if t < stop.rounds else algo.evaluate()
        record = {"round": t, **cost, **metrics}
        records.append(record)
        if on_round is not None:
            on_round(record)
        verdict = stop.status(record, records[0])
        if verdict is not None:
            status = verdict
            break
        cost = {"time_s": comm.elapsed(), "bytes_sent": comm.bytes_sent, "comm_rounds": comm.calls}
    return records, status


class RoundTable:
    """A compact per-round table on stdout, for rank 0."""

    COLUMNS = (("round", "{:>5d}"), ("time_s", "{:>9.4f}"), ("bytes_sent", "{:>10}"), ("objective", "{:>14.8e}"),
               ("suboptimality", "{:>12.3e}"), ("grad_norm", "{:>10.3e}"), ("mu", "{:>8.3g}"))

    def __init__(self, every: int = 1, stream=sys.stdout):
        self.every, self.stream = every, stream
        self._header_done = False

    def __call__(self, record: dict) -> None:
        if record["round"] % self.every:
            return
        cols = [(k, f) for k, f in self.COLUMNS if k in record]
        if not self._header_done:
            print("  ".join(f"{k:>{len(f.format(record[k]))}}" for k, f in cols), file=self.stream)
            self._header_done = True
        cells = []
        for k, f in cols:
            v = record[k]
            cells.append(f.format(_human_bytes(v) if k == "bytes_sent" else v) if math.isfinite(float(v)) or k == "bytes_sent" else f"{v!s:>12}")
        print("  ".join(cells), file=self.stream, flush=True)


def _human_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return str(n)


def wall_clock() -> float:
    return time.perf_counter()
