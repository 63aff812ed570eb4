"""The server's update log, shared by the simulated and the real asynchronous run.

Two measures are logged per update (`Update`):

- ``staleness``: the server's version (updates applied so far) when the update is
  applied, minus the version its worker pulled;
- ``clock_lead``: how many clocks its worker was ahead of the slowest worker when it
  started the step.  This is what SSP bounds (``clock_lead <= s``).

With m workers, ``staleness`` is at most (m-1)(2s+1) under SSP, and it is unbounded when
asynchronous.  A record summarizes its round's updates (`round_stats`), the summary the
whole log (`log_stats`), and ``updates.jsonl`` holds it line by line (`keep_updates`).
"""
from __future__ import annotations

import json
import math
import os
from collections import Counter
from dataclasses import asdict, dataclass, fields
from typing import Sequence

import numpy as np

from ..callbacks import Callback
from ...records.results import atomic_write_text

UPDATES_FILE = "updates.jsonl"


@dataclass(frozen=True)
class Update:
    """One server update: it made ``version`` from ``version - 1``."""

    version: int
    rank: int
    clock: int        # the worker's clock of this update (its pushes so far, this one included)
    pulled: int       # the server version the worker computed on
    staleness: int    # version - 1 - pulled: updates by others between the worker's pull and this push
    clock_lead: int   # the worker's clocks ahead of the slowest worker when it started (SSP: <= s)
    time: float       # simulated time (a real run: the server's wall clock) at which the server applied it


LOG_FIELDS = tuple(f.name for f in fields(Update))  # a real run's log rows, as the server sends them


def log_stats(log: Sequence[Update], staleness: float, workers: int) -> dict:
    """The staleness distribution of a run's updates, overall and per worker."""
    per_worker = [[u for u in log if u.rank == i] for i in range(workers)]
    return {
        "staleness": "inf" if math.isinf(staleness) else int(staleness),
        "updates": len(log),
        "staleness_histogram": histogram(u.staleness for u in log),
        "clock_lead_histogram": histogram(u.clock_lead for u in log),
        "staleness_max": max((u.staleness for u in log), default=0),
        "staleness_mean": float(np.mean([u.staleness for u in log])) if log else 0.0,
        "clock_lead_max": max((u.clock_lead for u in log), default=0),
        "updates_per_worker": [len(us) for us in per_worker],
        "staleness_mean_per_worker": [float(np.mean([u.staleness for u in us])) if us else 0.0 for us in per_worker],
    }


def round_stats(updates: Sequence[Update]) -> dict:
    """A record's summary of its round's updates."""
    staleness = [u.staleness for u in updates]
    return {"staleness_max": max(staleness), "staleness_mean": float(np.mean(staleness)),
            "clock_lead_max": max(u.clock_lead for u in updates)}


def histogram(values) -> dict[str, int]:
    """{value: count}, keys as strings in increasing order (JSON object keys)."""
    counts = Counter(values)
    return {str(k): counts[k] for k in sorted(counts)}


def keep_updates(log: Sequence[Update], out_dir: str | None, collect: dict | None) -> None:
    """``out_dir``/updates.jsonl, one update per line (written whole, atomically); ``collect`` gets the list."""
    if out_dir:
        atomic_write_text(os.path.join(out_dir, UPDATES_FILE), "".join(json.dumps(asdict(u)) + "\n" for u in log))
    if collect is not None:
        collect["updates"] = list(log)


class KeepUpdates(Callback):
    """The run loop's last step of an asynchronous run: `keep_updates` of the server's update log (rank 0 writes it)."""

    def __init__(self, log: Sequence[Update], collect: dict | None):
        self.log, self.collect = log, collect

    def on_end(self, loop, summary: dict) -> None:
        keep_updates(self.log, loop.out_dir if loop.comm.rank == 0 else None, self.collect)
