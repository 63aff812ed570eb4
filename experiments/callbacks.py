"""Hydra callbacks of the entry points (registered in conf/config.yaml under ``hydra.callbacks``).

`SweepSummary` ends a ``-m`` multirun of `experiments.train` or `experiments.simulate`
with one line saying where the jobs' runs went and the command that tabulates them:

    sweep: 12 jobs in results/sweeps/2024-05-01_12-00-00-123456_4242; summary: dane figures summary results/sweeps/...

or, where the jobs set ``out_dir='DIR/${hydra:job.num}'``, ``sweep: 12 jobs in DIR (Hydra's job folders: <sweep
dir>); summary: dane figures summary DIR`` (`runs_folder`; a sweep of one job too: `runs_root`).

It only prints the command (experiments do not import paper_figs).  A job that raises
stops Hydra's sweep with its traceback before ``on_multirun_end``, so no line then;
a diverged job is a result, not a failure (experiments/train.py), and is counted.  A job
refused on bad input (or whose worker was lost) leaves its line in ``<job dir>/error.txt``
(`failure_file`), or, where its folder holds a run the job did not write (a sweep run again into
its folder: each finished job's folder is refused), in ``<sweep dir>/refused/<job dir>.txt``, so
that a run's folder never holds a later job's refusal.  The sweep goes on; the line then names
those files (``k refused, their folders kept as they were: ...`` for those in refused/, whose folders hold the run
they held: nothing failed there; ``k failed: ...`` for the error.txt files), and the sweep exits with status 2, as a
refused single run does (`failed`, read by ``experiments.train.cli``).  A job
that finishes in a folder where an earlier job failed removes that job's error.txt, and a job that runs removes an
earlier sweep's refusal of it from refused/ (`clear_failure`, `clear_refusal`: a plain rerun refused, then run again
with ``overwrite=true``).  A sweep
run again with ``resume=auto`` runs no job whose out_dir holds the finished run of its config
(`dane.loop.resume.finished_run`): the job is counted as finished (`skip_finished`), not failed.

Such a job's Hydra config goes beside its line too, as ``<sweep dir>/refused/<job dir>.hydra/``
(``hydra.output_subdir: ${dane.job_config_dir:}`` in conf/config.yaml, `job_config_dir`), so that the
finished run's ``.hydra/`` stays byte for byte; a job that then writes its records there (overwrite, resume)
moves it in (`settle_job_config`).  A sweep whose every job was refused so puts back the ``multirun.yaml``
the folder held (`SweepSummary`), which Hydra's sweeper rewrites before any job runs.
"""
from __future__ import annotations

import os
import shlex
import shutil
import time
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dane.experiments.config import rank_zero
from dane.records.lock import LOCK_FILE
from dane.records.results import ROUNDS_FILE, SUMMARY_FILE, atomic_write, atomic_write_text

ERROR_FILE = "error.txt"  # a failed job's line in its folder; paper_figs.summary lists such a job as failed
REFUSED_DIR = "refused"  # <sweep dir>/refused/<job dir>.txt: the line of a job whose folder holds a run not its own
JOB_CONFIG_DIR = ".hydra"  # Hydra's config of a sweep's job, in its folder (hydra.output_subdir)
SWEEP_CONFIG_FILE = "multirun.yaml"  # Hydra's config of a sweep, in its folder
#: the job folder a process launcher (experiments.launchers) passes as its launched run's out_dir: that run is a
#: sweep's job in the folder the sweep chose, and its refusal names hydra.sweep.dir (experiments.train.out_dir_key)
SWEEP_OUT_DIR_ENV = "DANE_SWEEP_OUT_DIR"


def run_files(folder: str | Path | None) -> dict[str, tuple[int, int]]:
    """The run's files in ``folder`` (rounds.jsonl, summary.json, another run's .lock): name -> (size, mtime in ns)."""
    found = {}
    for name in (ROUNDS_FILE, SUMMARY_FILE, LOCK_FILE):
        try:
            stat = (Path(folder) / name).stat() if folder else None
        except OSError:
            continue
        if stat is not None:
            found[name] = (stat.st_size, stat.st_mtime_ns)
    return found


def job_run_dir(cfg: DictConfig, job_dir: str | Path) -> Path:
    """The folder a sweep's job writes its run to: its ``out_dir`` where it sets one (resolved for the job:
    ``out_dir='DIR/${hydra:job.num}'``), else its job folder, as also where ``out_dir`` does not resolve (the job
    refuses it then)."""
    try:
        out_dir = OmegaConf.select(cfg, "out_dir")
    except OmegaConfBaseException:
        out_dir = None
    return Path(str(out_dir)) if out_dir else Path(job_dir)


#: where an out_dir's path names the job (``out_dir='DIR/${hydra:job.num}'``): the path is the job's from there on
JOB_INTERPOLATION = "${hydra:job."


def runs_root(cfg: DictConfig, job_dir: str | Path) -> Path:
    """The folder that holds a job's run folder (`job_run_dir`) and those of the sweep's other jobs: where its out_dir
    names the job (``out_dir='DIR/${hydra:job.num}'``, or ``DIR/run_${hydra:job.num}/x``: `JOB_INTERPOLATION`), the
    run folder less the parts from that one on, ``DIR``, however many jobs the sweep has; the run folder itself
    else (`runs_folder` takes the folder common to every job's)."""
    run = job_run_dir(cfg, job_dir)
    try:
        typed = OmegaConf.to_container(cfg, resolve=False).get("out_dir") if isinstance(cfg, DictConfig) else None
    except (OmegaConfBaseException, AttributeError):
        typed = None
    if not isinstance(typed, str) or JOB_INTERPOLATION not in typed:
        return run
    typed = typed.rstrip("/")
    job_parts = typed[typed.index(JOB_INTERPOLATION):].count("/") + 1  # the part that names the job, and those after it
    return run.parents[job_parts - 1] if len(run.parts) > job_parts else run


def refused_path(job_dir: str | Path, sweep_dir: str | Path, suffix: str) -> Path:
    """``<sweep dir>/refused/<job dir><suffix>``: a refused job's file, beside the folder it was refused."""
    return Path(sweep_dir) / REFUSED_DIR / f"{os.path.relpath(job_dir, sweep_dir)}{suffix}"


def failure_file(job_dir: str | Path, sweep_dir: str | Path, before: dict[str, tuple[int, int]],
                 run_dir: str | Path | None = None) -> Path:
    """Where a sweep's job that ended without a result leaves its one line, given ``before``, the `run_files` of
    its run's folder (``run_dir``: its out_dir, `job_run_dir`; the job folder by default) when the job started:
    ``<job dir>/error.txt``, unless that folder holds a run this job did not write (a run's files there before
    the job, unchanged; or another run's lock): then ``<sweep dir>/refused/<job dir>.txt``.  A sweep run again
    into its folder refuses each finished job's folder (`dane.records.results.occupied`), and that folder stays as
    the finished run left it, as a single run's does."""
    job_dir = Path(job_dir)
    run_dir = job_dir if run_dir is None else Path(run_dir)
    if not before or (LOCK_FILE not in before and run_files(run_dir) != before):
        return job_dir / ERROR_FILE  # nothing there before, or this job's own records (overwrite, resume)
    return refused_path(job_dir, sweep_dir, ".txt")


def record_failure(line: str, before: dict[str, tuple[int, int]], run_dir: str | Path | None = None) -> Path:
    """Write ``line`` to the current Hydra job's `failure_file`; where it went.  A job whose line goes into its own
    folder (it ran there, or the folder held no run) was not refused: an earlier sweep's refusal of it goes
    (`clear_refusal`)."""
    hydra = HydraConfig.get()
    job_dir, sweep_dir = Path(hydra.runtime.output_dir), hydra.sweep.dir
    path = failure_file(job_dir, sweep_dir, before, run_dir)
    atomic_write_text(path, line + "\n")
    if path.parent == job_dir:
        clear_refusal(job_dir, sweep_dir)
    return path


def job_config_dir(*, _root_: DictConfig) -> str:
    """``hydra.output_subdir`` of a sweep's job (``${dane.job_config_dir:}``, resolved by Hydra's ``run_job`` before
    the job runs, once it knows the job's folder): ``.hydra`` (in the job folder), unless the job's run folder
    (`job_run_dir`) holds a run then (`run_files`): ``<sweep dir>/refused/<job dir>.hydra``, an absolute path, so
    that a refused job writes no config over the finished run's.  A single run has no ``.hydra``
    (experiments/train.py, `hydra_argv`); outside a sweep this is ``.hydra``."""
    hydra = _root_.hydra
    if hydra.mode != RunMode.MULTIRUN:
        return JOB_CONFIG_DIR
    job_dir, sweep_dir = str(hydra.runtime.output_dir), str(hydra.sweep.dir)
    if not run_files(job_run_dir(_root_, job_dir)):
        return JOB_CONFIG_DIR
    return os.path.abspath(refused_path(job_dir, sweep_dir, JOB_CONFIG_DIR))


OmegaConf.register_new_resolver("dane.job_config_dir", job_config_dir, replace=True)


def settle_job_config(job_dir: str | Path, sweep_dir: str | Path, before: dict[str, tuple[int, int]],
                      run_dir: str | Path | None = None) -> None:
    """After a job that `job_config_dir` sent to ``<sweep dir>/refused/`` (``before``, its run folder's
    `run_files` at its start, not empty): where it wrote its own records there (overwrite=true, resume; as
    `failure_file` decides), its config replaces the folder's ``.hydra/``; refused, it stays beside its line."""
    staged = refused_path(job_dir, sweep_dir, JOB_CONFIG_DIR)
    if not before or not staged.is_dir() or failure_file(job_dir, sweep_dir, before, run_dir).parent != Path(job_dir):
        return
    target = Path(job_dir) / JOB_CONFIG_DIR
    shutil.rmtree(target, ignore_errors=True)
    shutil.move(staged, target)
    drop_refused_dir(sweep_dir)


def drop_refused_dir(sweep_dir: str | Path) -> None:
    """``<sweep dir>/refused/`` removed where nothing is left in it (its last staged config moved in or dropped)."""
    try:
        (Path(sweep_dir) / REFUSED_DIR).rmdir()
    except OSError:
        pass


def clear_failure(job_dir: str | Path, sweep_dir: str | Path) -> None:
    """A sweep's job that finished (its summary written) removes the ``error.txt`` an earlier job left in its folder
    (refused on bad input, then run again once the input was fixed), and an earlier sweep's refusal of it
    (`clear_refusal`: a plain rerun refused, then the run replaced with ``overwrite=true``): the folder holds this
    job's result, not a failure or a refusal it no longer has."""
    (Path(job_dir) / ERROR_FILE).unlink(missing_ok=True)
    clear_refusal(job_dir, sweep_dir)


#: what a refused job leaves beside its line in ``<sweep dir>/refused/``: the line itself, and a launched job's output
#: (experiments.launchers.launch_log); its Hydra config, ``<job dir>.hydra``, is `settle_job_config`'s
REFUSAL_SUFFIXES = (".txt", ".log")


def clear_refusal(job_dir: str | Path, sweep_dir: str | Path) -> None:
    """The job's files of an earlier refusal (`REFUSAL_SUFFIXES`) removed from ``<sweep dir>/refused/``, and the
    folder where nothing is left in it: a job that ran in its folder, or whose run is the finished one of its
    config, was not refused, and the sweep's folder says no more that it was."""
    for suffix in REFUSAL_SUFFIXES:
        refused_path(job_dir, sweep_dir, suffix).unlink(missing_ok=True)
    drop_refused_dir(sweep_dir)


def skip_finished(job_dir: str | Path, sweep_dir: str | Path) -> None:
    """A sweep's job that did not run: its out_dir holds the finished run of its config, found by a rerun of the
    sweep with ``resume=auto`` (`dane.loop.resume.finished_run`).  The Hydra config `job_config_dir` set beside a
    refusal goes (the run's config.yaml is the job's), as do an error.txt an earlier job left and an earlier sweep's
    refusal of it (`clear_failure`); `SweepSummary` counts the job as finished."""
    shutil.rmtree(refused_path(job_dir, sweep_dir, JOB_CONFIG_DIR), ignore_errors=True)
    clear_failure(job_dir, sweep_dir)
    SweepSummary.kept.append(Path(job_dir))


class SweepSummary(Callback):
    """Counts the jobs of a multirun and prints where they are and how to summarize them."""

    #: the error.txt and refused/ files of the last sweep's failed or refused jobs (`on_multirun_end`)
    failed: list[Path] = []
    #: the job folders of this sweep's jobs whose run was already finished (`skip_finished`)
    kept: list[Path] = []

    def __init__(self) -> None:
        self.jobs = 0
        self.run_dirs: list[Path] = []  # each job's run folder (`job_run_dir`), where on_job_end runs in this process
        self.roots: list[Path] = []  # the folder that holds each job's run folder (`runs_root`)
        self.started = time.time()
        self.sweep_config: bytes | None = None  # the multirun.yaml the sweep's folder held before this sweep

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.started = time.time()
        SweepSummary.kept = []
        try:  # Hydra's sweeper writes this sweep's multirun.yaml over it next, before any job runs
            self.sweep_config = (Path(str(config.hydra.sweep.dir)) / SWEEP_CONFIG_FILE).read_bytes()
        except OSError:
            self.sweep_config = None

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        self.jobs += 1  # Hydra's config of the job is current: out_dir='DIR/${hydra:job.num}' resolves for it
        job_dir = OmegaConf.select(config, "hydra.runtime.output_dir")
        if job_dir is not None:
            self.run_dirs.append(job_run_dir(config, job_dir))
            self.roots.append(runs_root(config, job_dir))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if not rank_zero():  # under a launcher every rank runs Hydra; one line is enough
            return
        sweep_dir = str(config.hydra.sweep.dir)
        # a launcher that runs jobs in other processes calls on_job_end there: count the job directories instead
        jobs = self.jobs or sum(1 for p in Path(sweep_dir).glob("*/.hydra"))
        # this sweep's failures: a file of an earlier sweep into the same folder is older than its start
        written = [*Path(sweep_dir).glob(f"*/{ERROR_FILE}"), *Path(sweep_dir).glob(f"{REFUSED_DIR}/**/*.txt")]
        failed = sorted(p for p in written if p.stat().st_mtime >= self.started - 1.0)
        SweepSummary.failed = failed
        refused = [p for p in failed if Path(os.path.relpath(p, sweep_dir)).parts[0] == REFUSED_DIR]
        if self.sweep_config is not None and failed and len(refused) == len(failed) >= jobs:
            # every job refused: the folder holds the earlier sweep's runs alone, and its config with them
            atomic_write(Path(sweep_dir) / SWEEP_CONFIG_FILE, lambda f: f.write(self.sweep_config))
        kept = len(SweepSummary.kept)
        notes = [f"{kept} already finished, kept as {'it was' if kept == 1 else 'they were'}"] if kept else []
        if refused:  # their folders held a run the job did not write: as they were, and the line says why
            notes.append(f"{len(refused)} refused, {'its folder' if len(refused) == 1 else 'their folders'} kept as "
                         f"{'it was' if len(refused) == 1 else 'they were'}: {files(refused)}")
        if len(failed) > len(refused):
            notes.append(f"{len(failed) - len(refused)} failed: {files([p for p in failed if p not in refused])}")
        note = f" ({'; '.join(notes)})" if notes else ""
        runs = runs_folder(sweep_dir, self.run_dirs, self.roots)
        configs = f" (Hydra's job folders: {sweep_dir})" if runs != sweep_dir else ""
        print(f"sweep: {jobs} job{'s' * (jobs != 1)}{note} in {runs}{configs}; "
              f"summary: dane figures summary {shlex.quote(runs)}", flush=True)


def files(paths: list[Path], shown: int = 3) -> str:
    """The first ``shown`` of ``paths``, and ``...`` where there are more."""
    return f"{', '.join(str(p) for p in paths[:shown])}{', ...' * (len(paths) > shown)}"


def runs_folder(sweep_dir: str, run_dirs: list[Path], roots: list[Path] | None = None) -> str:
    """Where a sweep's runs are: its folder, unless a job's run folder (`job_run_dir`) lies outside it (the jobs set
    ``out_dir='DIR/${hydra:job.num}'``): then the folder that holds every job's run folder (DIR: common to the
    jobs' ``roots``, `runs_root`, also where one job alone ran), which ``dane figures summary`` tabulates (a job
    folder then holds only Hydra's config and log)."""
    sweep = Path(os.path.abspath(sweep_dir))
    folders = [Path(os.path.abspath(p)) for p in run_dirs]
    if all(p.is_relative_to(sweep) for p in folders):
        return sweep_dir
    return os.path.commonpath([Path(os.path.abspath(p)) for p in roots or run_dirs])
