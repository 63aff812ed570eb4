"""Rank 0's progress bar (``progress=bar``, or ``auto`` on a terminal): a `tqdm` bar over the rounds."""
from __future__ import annotations

import sys


class RoundBar:
    """Rounds done out of ``total`` on ``stream`` (stderr), with the last record's objective, test accuracy and time.

    Called with each record, as `dane.runner.RoundTable` is.  The bar starts at the first
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
