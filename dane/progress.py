"""Rank 0's progress bar (``progress=bar``, or ``auto`` on a terminal): a `tqdm` bar over the rounds."""
from __future__ import annotations

import sys


class RoundBar:
    """Rounds done out of ``total`` on ``stream`` (stderr), with the last record's objective, test accuracy and time.

    Called with each record, as `dane.runner.RoundTable` is; a resumed run's first record moves
    the bar to its round.  `close` ends the bar's line.
    """

    def __init__(self, total: int, stream=sys.stderr):
        from tqdm import tqdm

        self.bar = tqdm(total=max(total, 1), file=stream, unit="round", dynamic_ncols=True, leave=True)

    def __call__(self, record: dict) -> None:
        done = min(record["round"], self.bar.total)
        post = {"objective": f"{record['objective']:.4e}"}
        if "test_accuracy" in record:
            post["test_accuracy"] = f"{record['test_accuracy']:.4f}"
        post["time"] = f"{record['time_s']:.1f}s"
        self.bar.set_postfix(post, refresh=False)
        self.bar.update(done - self.bar.n)  # refreshes the line as often as tqdm's mininterval allows

    def close(self) -> None:
        self.bar.close()
