"""Hydra callbacks of the entry points (registered in conf/config.yaml under ``hydra.callbacks``).

`SweepSummary` ends a ``-m`` multirun of `experiments.train` or `experiments.simulate`
with one line saying where the jobs went and the command that tabulates them:

    sweep: 12 jobs in results/sweeps/2024-05-01_12-00-00-123456_4242; summary: dane figures summary results/sweeps/...

It only prints the command (experiments do not import paper_figs).  A job that raises
stops Hydra's sweep with its traceback before ``on_multirun_end``, so no line then;
a diverged job is a result, not a failure (experiments/train.py), and is counted.  A job
refused on bad input (or whose worker was lost) leaves its line in ``<job dir>/error.txt``
and the sweep goes on; the line then names those jobs, and the sweep exits with status 2
(`failed`, read by ``experiments.train.cli``).
"""
from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from dane.experiments.config import rank_zero


class SweepSummary(Callback):
    """Counts the jobs of a multirun and prints where they are and how to summarize them."""

    #: the error.txt files of the last sweep's failed jobs (`on_multirun_end`)
    failed: list[Path] = []

    def __init__(self) -> None:
        self.jobs = 0
        self.started = time.time()

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.started = time.time()

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        self.jobs += 1

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if not rank_zero():  # under a launcher every rank runs Hydra; one line is enough
            return
        sweep_dir = str(config.hydra.sweep.dir)
        # a launcher that runs jobs in other processes calls on_job_end there: count the job directories instead
        jobs = self.jobs or sum(1 for p in Path(sweep_dir).glob("*/.hydra"))
        # this sweep's failures: an error.txt of an earlier sweep into the same folder is older than its start
        failed = sorted(p for p in Path(sweep_dir).glob("*/error.txt") if p.stat().st_mtime >= self.started - 1.0)
        SweepSummary.failed = failed
        note = f" ({len(failed)} failed: {', '.join(str(p) for p in failed[:3])}{', ...' if len(failed) > 3 else ''})" \
            if failed else ""
        print(f"sweep: {jobs} job{'s' * (jobs != 1)}{note} in {sweep_dir}; "
              f"summary: dane figures summary {shlex.quote(sweep_dir)}", flush=True)
