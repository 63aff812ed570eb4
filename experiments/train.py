"""Run one algorithm on one problem; the same program under horovodrun, torchrun or plain python.

    horovodrun -np 2 python -m experiments.train algorithm=dane problem=ridge_synthetic
    torchrun --nproc_per_node 2 -m experiments.train algorithm=dane problem=ridge_synthetic
    python -m experiments.train algorithm=dane problem=ridge_synthetic workers=2   # simulated

Bad input exits with status 2 and one line on stderr; a diverged run exits with status 3
after writing its results; a launched worker whose peer crashed or was killed exits with
status 4 and one line (`dane.errors.WorkerLost`), its records kept; so does a run whose
simulated worker ``sim.fail_at`` loses (`dane.loop.faults.SimulatedFault`).  In a ``-m`` sweep
none stops the sweep: a diverged job is a result (status: diverged), an invalid or
broken one leaves its line in ``<job dir>/error.txt`` (in ``<sweep dir>/refused/`` where its folder
holds a run the job did not write: `experiments.callbacks.failure_file`), and a sweep with such jobs
exits with status 2 once every job has run (`experiments.callbacks.SweepSummary`).

A single run writes only its own run directory: ``out_dir``, or by default
``results/runs/<date>_<time>-<microseconds>_<algorithm>_<problem>_<pid>`` (unique even for
runs started in the same second), made when the run starts, so rejected input leaves no
folder behind.  A sweep's jobs write under Hydra's sweep directory.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from dane.comm.launcher_signals import LauncherTerminated
from dane.loop import timeline
from dane.errors import DivergenceError, SharedRefusal, UserError, WorkerLost, say
from dane.records.results import ROUNDS_FILE
from dane.loop.stopping import MonitorError
from dane.experiments.cli import freeze_at_exit
from dane.experiments.config import rank_zero, unique_name
from dane.experiments.callbacks import (SWEEP_OUT_DIR_ENV, SweepSummary, clear_failure, job_run_dir, record_failure,
                                        run_files, settle_job_config, skip_finished)
from dane.experiments.overrides import check_group_choices, check_keys, check_sweep_out_dir, is_multirun


def multirun() -> bool:
    return HydraConfig.get().mode == RunMode.MULTIRUN


def run_dir(cfg: DictConfig) -> str:
    if cfg.out_dir:
        return cfg.out_dir
    if multirun():
        return HydraConfig.get().runtime.output_dir
    return str(Path("results") / "runs" / unique_name(cfg.algorithm.name, cfg.problem.name))


def out_dir_key(out_dir: str | None, swept: bool) -> str:
    """The setting a refusal of an occupied run directory asks to change (`dane.records.results.occupied`):
    ``hydra.sweep.dir`` where the sweep chose the job's folder (a job of a ``-m`` sweep, ``swept``, without out_dir;
    a run a process launcher started with the job's folder as out_dir, which it names in `SWEEP_OUT_DIR_ENV`),
    else ``out_dir``."""
    if (swept and not out_dir) or (out_dir and os.environ.get(SWEEP_OUT_DIR_ENV) == str(out_dir)):
        return "hydra.sweep.dir"
    return "out_dir"


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    timeline.configured()
    if not (multirun() and rank_zero()):
        return train(cfg, {})
    # in a sweep, the run files the job's run folder (its out_dir, else its job folder) holds before the job: a
    # refusal is not written beside another run's, and the job's .hydra/, which Hydra wrote beside the refusal's
    # place then (`job_config_dir`), goes into the job folder once the job writes its records there
    hydra = HydraConfig.get()
    run_at = job_run_dir(cfg, hydra.runtime.output_dir)
    job = run_files(run_at)
    try:
        with job_command(hydra, cfg):
            train(cfg, job, run_at)
    finally:
        settle_job_config(hydra.runtime.output_dir, hydra.sweep.dir, job, run_at)


def job_command(hydra: DictConfig, cfg: DictConfig):
    """Around a job of an in-process sweep: its run's ``provenance.command`` is the job's own command (the program,
    `experiments.launchers.job_args`: its overrides as a launched job's are, ``out_dir`` its job folder where it
    sets none), not the sweep's ``-m`` line, which goes to ``provenance.sweep_command``
    (`dane.records.provenance.command_of_run`).  Where a launcher named the job's command already (Slurm's,
    `RUN_COMMAND_ENV`), or the job cannot be one command (refused by the run itself), as it was."""
    from contextlib import nullcontext

    from omegaconf.errors import OmegaConfBaseException

    from dane.experiments.launchers import job_args
    from dane.records.provenance import RUN_COMMAND_ENV, command_of_run, entry_program, run_command

    if RUN_COMMAND_ENV in os.environ:
        return nullcontext()
    try:
        args = job_args(hydra, cfg)
    except (UserError, OmegaConfBaseException):  # an out_dir that does not resolve: the run's check says so
        return nullcontext()
    return command_of_run([*entry_program(), *args], sweep=run_command())


def train(cfg: DictConfig, job: dict, run_at: Path | None = None) -> None:
    """The run of ``cfg``; in a sweep, ``job`` is the `run_files` of its run folder ``run_at`` at the job's start."""
    # the run's modules import torch: here, not at the top, so that --help (Hydra's, which never calls main) needs none
    from dane.loop.faults import SimulatedFault
    from dane.loop.launch import execute
    from dane.loop.resume import finished_run
    from dane.run_config import check_interpolations, run_spec

    try:
        check_interpolations(cfg)  # before cfg.out_dir is read
        done = finished_run(cfg) if multirun() else None  # a single run there is refused by run_spec
        spec = None if done else run_spec(cfg, out_dir_key(cfg.out_dir, multirun()))
    except UserError as exc:
        return reject(exc, job, run_at, every_rank=False)  # the config is the same on every rank: rank 0 speaks
    if done:
        return already_finished(done)
    out_dir = run_dir(cfg) if rank_zero() else None
    before = listing(out_dir)
    try:
        execute(spec, out_dir)
    except DivergenceError as exc:
        say(f"error: {exc}")
        if multirun():
            return finished()  # in a sweep a diverged job is a result (written, status: diverged): go on
        sys.exit(3)
    except (WorkerLost, SimulatedFault) as exc:  # a peer crashed or was killed (or sim.fail_at lost one): one line
        if multirun():
            return reject(exc, job, run_at)  # the job's error.txt, and the sweep goes on
        say(f"error: {exc}")
        sys.exit(4)
    except UserError as exc:  # a data file, the run directory, a monitor no record has: per rank
        if isinstance(exc, MonitorError):
            take_back(out_dir, before)  # raised at the first record, in the run directory this run holds
        reject(exc, job, run_at, every_rank=not isinstance(exc, SharedRefusal))  # rank 0 says it, sent to all
    else:
        finished()


def finished() -> None:
    """A sweep's job wrote its result: an error.txt an earlier job left in its folder, and an earlier sweep's refusal
    of it in refused/, go (`clear_failure`)."""
    if multirun() and rank_zero():
        hydra = HydraConfig.get()
        clear_failure(hydra.runtime.output_dir, hydra.sweep.dir)


def already_finished(line: str) -> None:
    """A sweep rerun with ``resume=auto`` (its restart) whose job's out_dir holds the finished run of its config
    (`dane.loop.resume.finished_run`): one line, the run as it was, and the job counts as finished (`skip_finished`)."""
    if rank_zero():
        print(line, flush=True)
        hydra = HydraConfig.get()
        skip_finished(hydra.runtime.output_dir, hydra.sweep.dir)


def reject(exc: UserError, job: dict, run_at: Path | None = None, *, every_rank: bool = True) -> None:
    """Bad input: one line and exit 2; in a sweep the job's `failure_file` holds the line (``job``: the run files
    of its run folder ``run_at`` when it started) and the sweep goes on."""
    if multirun():  # under hydra/launcher=slurm every task of a job runs this: rank 0 speaks and writes
        if every_rank or rank_zero():
            say(f"error: {exc}")
        if rank_zero():
            record_failure(f"error: {exc}", job, run_at)
        return
    fail(exc, speak=every_rank or rank_zero())


#: how long a silent rank waits before its exit: a launcher that stops every rank at the first non-zero exit
#: (torchrun, horovodrun, srun with --kill-on-bad-exit or KillOnBadExit=1, as scripts/slurm_cluster.sh sets) must
#: not stop rank 0 before it has printed its line (seen: horovodrun killed rank 0 before it spoke; with 2 s, a
#: parameter server's rank under torchrun on a loaded machine, and srun tasks whose rank 0 started 3 s late, ended
#: the job with no line at all).  Under such a launcher rank 0's exit ends the wait; a plain srun step, which stops
#: no task, holds the refused step this long after rank 0's line (docs/faults.md)
SILENT_EXIT_DELAY_S = 30.0


def fail(exc: UserError, *, speak: bool = True) -> None:
    if speak:
        say(f"error: {exc}")
    else:
        try:
            time.sleep(SILENT_EXIT_DELAY_S)  # rank 0's exit ends this rank sooner where the launcher stops it
        except LauncherTerminated:  # torchrun's SIGTERM once rank 0 has exited: the silent exit it was waiting for
            pass
    sys.exit(2)


def listing(out_dir: str | None) -> set[str] | None:
    """The names in ``out_dir`` now; None where it is not a folder yet."""
    return {p.name for p in Path(out_dir).iterdir()} if out_dir and Path(out_dir).is_dir() else None


def take_back(out_dir: str | None, before: set[str] | None) -> None:
    """A run stopped on bad input at its first record removes what it made in ``out_dir`` (config.yaml,
    an empty rounds.jsonl, the folder itself), so the corrected command can use the same out_dir."""
    path = Path(out_dir) if out_dir else None
    if path is None or not path.is_dir():
        return
    made = {p.name for p in path.iterdir()} - (before or set())
    rounds = path / ROUNDS_FILE
    if rounds.exists() and (ROUNDS_FILE not in made or rounds.stat().st_size > 0):
        return  # records are there: keep everything
    for name in made & {ROUNDS_FILE, "config.yaml"}:
        (path / name).unlink(missing_ok=True)
    if before is None and not any(path.iterdir()):
        path.rmdir()


def hydra_argv(argv: list[str]) -> list[str]:
    """Keep Hydra from making directories of its own for a single run: the run makes its own (`run_dir`).

    Non-zero ranks run Hydra too and must never make one (hydra #2070); a single run's
    rank 0 makes only its run directory, when the run starts.  Hydra's own log then
    goes to the console only.
    """
    quiet_hydra = ["hydra.run.dir=.", "hydra.output_subdir=null", "hydra/job_logging=stdout"]
    if rank_zero():
        return argv if is_multirun(argv) else beside_overrides(argv, quiet_hydra)
    return beside_overrides(argv, ["hydra.run.dir=.", "hydra.output_subdir=null",
                                   "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"])


def beside_overrides(argv: list[str], more: list[str]) -> list[str]:
    """``argv`` with the overrides ``more`` right after its last override: Hydra's parser takes its overrides as
    one run of positional arguments, which an option after them (``rounds=1 --config-name x``) would split."""
    last = max((i for i, arg in enumerate(argv) if "=" in arg and not arg.startswith("-")), default=len(argv) - 1)
    return [*argv[:last + 1], *more, *argv[last + 1:]]


def cli(entry=None, config_name: str = "config") -> None:
    """Check group choices and keys with one-line errors, then hand the command line to Hydra's ``entry``.

    ``config_name`` is the one ``entry`` composes (``config`` here, ``simulate`` for experiments.simulate).
    """
    freeze_at_exit()  # also where a launcher or a sweep runs python -m dane.experiments.train, not dane
    try:
        check_group_choices(sys.argv[1:])
        check_keys(sys.argv[1:], config_name)
        check_sweep_out_dir(sys.argv[1:], config_name)
    except UserError as exc:
        fail(exc, speak=rank_zero())  # every rank parses the same command line: rank 0 speaks for all
    sys.argv = [sys.argv[0], *hydra_argv(sys.argv[1:])]
    SweepSummary.failed = []  # this command's sweep, not one an earlier command of this process ran
    (entry or main)()
    if SweepSummary.failed:  # a sweep whose jobs were refused went on to the end: its status says so
        sys.exit(2)


if __name__ == "__main__":
    cli()
