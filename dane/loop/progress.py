"""Rank 0's per-round display: the table (``progress=table``, `RoundTable`) or a `tqdm` bar over the rounds
(``progress=bar``, or ``auto`` on a terminal, `RoundBar`)."""
from __future__ import annotations

import math
import sys

from ..algorithm import Algorithm, Column


class RoundBar:
    """Rounds done out of ``total`` on ``stream`` (stderr), with the last record's objective, test accuracy and time.

    Called with each record, as `RoundTable` is.  The bar starts at the first
    record (a resumed run's round; lines said before it stay above it); `close` ends its line.
    """

    def __init__(self, total: int, stream=sys.stderr):
        self.total, self.stream, self.bar = max(total, 1), stream, None

    def __call__(self, record: dict) -> None:
        done = min(record["round"], self.total)
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, initial=done, file=self.stream, unit="round", dynamic_ncols=True)
        post = {"objective": f"{record['objective']:.4e}"}
        if "test_accuracy" in record:
            post["test_accuracy"] = f"{record['test_accuracy']:.4f}"
        post["time"] = f"{record['time_s']:.1f}s"
        self.bar.set_postfix(post, refresh=False)
        self.bar.update(done - self.bar.n)  # redraws as often as tqdm's mininterval allows, and at close

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class RoundTable:
    """A compact per-round table on ``stream`` (stdout), for rank 0: every ``every``-th record, one line each.

    The columns are the common ones (`COMMON`), then the algorithm's own, as its class
    declares them (`dane.algorithm.Algorithm.columns`), then those of asynchronous runs
    and of a test set (`LAST`).  The first record fixes which are shown: a key it has,
    or a column's ``shown_with`` key it has; later records may lack some (μ at the end).
    """

    COMMON = (Column("round", "{:>5d}"), Column("time_s", "{:>9.4f}"), Column("bytes_sent", "{:>10}"),
              Column("objective", "{:>14.8e}"), Column("suboptimality", "{:>12.3e}"), Column("grad_norm", "{:>10.3e}"))
    LAST = (Column("staleness_max", "{:>13.0f}"), Column("staleness_mean", "{:>14.2f}"),
            Column("test_loss", "{:>9.4f}"), Column("test_accuracy", "{:>13.4f}"))

    def __init__(self, every: int = 1, stream=sys.stdout, algorithm: type[Algorithm] | Algorithm = Algorithm):
        self.every, self.stream = every, stream
        self.columns = (*self.COMMON, *algorithm.columns, *self.LAST)
        self._header_done = False

    def __call__(self, record: dict) -> None:
        if record["round"] % self.every:
            return
        if not self._header_done:
            self._cols = [(c.key, c.fmt, max(len(c.key), len(c.fmt.format(record.get(c.key, 0.0)))))
                          for c in self.columns if c.key in record or (c.shown_with is not None and c.shown_with in record)]
            print("  ".join(f"{k:>{width}}" for k, _, width in self._cols), file=self.stream)
            self._header_done = True
        cells = []
        for k, f, width in self._cols:
            if k not in record:
                cells.append(" " * width)
                continue
            v = record[k]
            cells.append(f.format(_human_bytes(v) if k == "bytes_sent" else v) if math.isfinite(float(v)) or k == "bytes_sent" else f"{v!s:>12}")
        print("  ".join(cells), file=self.stream, flush=True)


def _human_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return str(n)
