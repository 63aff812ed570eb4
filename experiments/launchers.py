"""Hydra launchers that run each job of a ``-m`` sweep as its own multi-process launch on this machine.

    python -m experiments.train -m hydra/launcher=horovod workers=1,2 algorithm=dane problem=ridge_synthetic
    python -m experiments.train -m hydra/launcher=torchrun workers=1,2,4 ...

Job k is ``horovodrun -np <workers> --gloo python -m experiments.train [--config-dir <folder>] <its overrides>
out_dir=<its job directory> [hydra.searchpath=[...]]`` (or ``torchrun --standalone --nproc_per_node <workers>``),
an override with an interpolation resolved for the job (``out_dir='DIR/${hydra:job.num}'`` passes as
``out_dir='DIR/k'``: `job_overrides`),
the config folders being those the sweep's command line added (`config_search_args`), the jobs one after
another; ``workers`` unset is one process.  The commands come from
`synthetic.launchers`, and each launched rank applies the job's ``comm.*`` Horovod settings
itself (`dane.comm.horovod.HorovodOptions`), as any horovodrun run does; Horovod tuning variables
of this shell (`synthetic.launchers.HOROVOD_KEYS`) are not passed on.  The job directory gets
Hydra's ``.hydra/`` (config, overrides) from this process, the run's records from rank 0,
``launch.log`` (the launch's whole output), and ``error.txt`` when the job failed without a
result (`experiments.callbacks.failure_file`: in ``<sweep dir>/refused/`` where the job's run folder, its
out_dir or else its job directory, holds a run the job did not write, and the launch's output and Hydra's
config beside it, as ``<job dir>.log`` and ``<job dir>.hydra/``: `launch_log`,
`experiments.callbacks.job_config_dir`): a non-zero
exit is that job's failure, and the sweep goes on, as with the basic launcher.  A run that diverged wrote its
summary (status: diverged): that is a result.  A job with a result removes an earlier job's error.txt from its
folder, and an earlier sweep's refusal of it from ``<sweep dir>/refused/`` (`experiments.callbacks.clear_failure`).
The launch command is in the run's ``summary.json`` (``provenance.launch.command``), the sweep's in
``provenance.sweep_command`` (`SWEEP_COMMAND_ENV`); the launched run's refusal of an occupied job folder names
hydra.sweep.dir (`experiments.callbacks.SWEEP_OUT_DIR_ENV`).

Hydra instantiates launchers only from the ``hydra_plugins`` package: these classes are
found as ``hydra_plugins.dane_launchers`` (a shim in hydra_plugins/, which ``pip install -e .``
installs too), configured by conf/hydra/launcher/{horovod,torchrun}.yaml.
"""
from __future__ import annotations

import collections
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, configure_log, filter_overrides, run_job, setup_globals
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from dane import checks
from dane.errors import ConfigError, say
from dane.experiments.callbacks import (SWEEP_OUT_DIR_ENV, clear_failure, failure_file, job_run_dir, record_failure,
                                        run_files, settle_job_config, skip_finished)
from dane.records.provenance import LAUNCH_COMMAND_ENV, SWEEP_COMMAND_ENV, run_command
from dane.records.results import SUMMARY_FILE
from dane.synthetic.launchers import launch_env, horovodrun_command, torchrun_command

log = logging.getLogger(__name__)

LOG_FILE = "launch.log"
TIMED_OUT = 124
#: a program's one-line error, as the launchers pass it on (horovodrun prefixes ``[rank]<stderr>:``)
ERROR_LINE = re.compile(r"^(?:\[\d+\]<std(?:err|out)>:)?(error: .*)$")


class ProcessLauncher(Launcher):
    """Runs each job of a sweep as ``command(module, overrides, np=workers)``, one job after another."""

    name = "process"

    def __init__(self, extra_args: Sequence[str] = (), timeout_s: float | None = None) -> None:
        self.extra_args = [str(a) for a in extra_args]
        self.timeout_s = None if timeout_s is None else checks.positive("hydra.launcher.timeout_s", timeout_s)
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None

    def command(self, module: str, args: list[str], np: int) -> list[str]:
        raise NotImplementedError

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        main_module()  # before any job: the launched processes run the program as a module
        self.config = config
        self.hydra_context = hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        """As Hydra's basic launcher, except that a job is `launch_job` in new processes, not the task function."""
        setup_globals()
        assert self.config is not None and self.hydra_context is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        log.info(f"Launching {len(job_overrides)} jobs with {self.name}, one after another")
        returns = []
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            sweep_config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(sweep_config):
                sweep_config.hydra.job.id = idx
                sweep_config.hydra.job.num = idx
            returns.append(run_job(hydra_context=self.hydra_context, task_function=self.launch_job, config=sweep_config,
                                   job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir"))
            configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        return returns

    def launch_job(self, cfg: DictConfig) -> int:
        """Run one job (``cfg``, Hydra's job config is current) in ``workers`` new processes; returns the exit status.

        A failure is written to the job's `failure_file` (``error.txt``), never raised: Hydra would stop the sweep.
        """
        hydra = HydraConfig.get()
        job_dir = Path(hydra.runtime.output_dir)
        run_dir = job_run_dir(cfg, job_dir)  # out_dir='DIR/${hydra:job.num}': DIR/<job number>
        job = run_files(run_dir)  # a failure is not written beside a run the job did not write
        env = {}
        from dane.loop.resume import finished_run  # imports torch: not at the top (Hydra's --help needs none)
        try:
            done = finished_run(cfg)  # a sweep rerun with resume=auto: the job's run is there, finished
            if done:
                print(done, flush=True)
                skip_finished(job_dir, hydra.sweep.dir)
                return 0
            np = 1 if cfg.workers is None else checks.positive_int("workers", cfg.workers)
            args = job_args(hydra, cfg)  # the launched program composes the job again
            if not cfg.get("out_dir"):
                env[SWEEP_OUT_DIR_ENV] = str(job_dir)  # its refusal of the folder names hydra.sweep.dir
            env[SWEEP_COMMAND_ENV] = json.dumps(run_command())  # its provenance.sweep_command
            module = main_module()
        except ConfigError as exc:
            return self._failed(f"error: {exc}", 2, job, run_dir)
        held = run_files(run_dir).get(SUMMARY_FILE)
        cmd = self.command(module, args, np)
        logged = launch_log(job_dir, hydra.sweep.dir, job, run_dir)
        try:
            returncode, tail = self._run(cmd, logged, env)
        finally:  # into the job's folder once the job wrote there (overwrite, resume); beside its refusal if not
            logged = settle(logged, launch_log(job_dir, hydra.sweep.dir, job, run_dir))
            settle_job_config(job_dir, hydra.sweep.dir, job, run_dir)
        if returncode == 0:
            clear_failure(job_dir, hydra.sweep.dir)
            return 0
        if returncode == TIMED_OUT:
            return self._failed(f"error: the job ran past hydra.launcher.timeout_s={self.timeout_s} and was "
                                f"stopped; its output is in {logged}", returncode, job, run_dir)
        if run_files(run_dir).get(SUMMARY_FILE) not in (None, held):  # a diverged run wrote its result (status 3)
            status = json.loads((run_dir / SUMMARY_FILE).read_text()).get("status")
            log.info(f"job {job_dir.name}: {status} (exit status {returncode})")
            clear_failure(job_dir, hydra.sweep.dir)
            return returncode
        errors = [m.group(1) for line in tail if (m := ERROR_LINE.match(line))]
        message = errors[-1] if errors else (f"error: {cmd[0]} exited with status {returncode}; "
                                             f"its output is in {logged}")
        return self._failed(message, returncode, job, run_dir)

    def _run(self, cmd: list[str], logged: Path, env: dict[str, str] | None = None) -> tuple[int, list[str]]:
        """Run ``cmd`` (``env`` added to its environment) in its own process group, its output shown and kept in
        ``logged`` (`launch_log`); (status, last lines).

        The launch command reaches the run's provenance through `LAUNCH_COMMAND_ENV`.  On a
        timeout or an interrupt the launch is stopped (`_stop`): the launcher first, which stops its workers, then
        whatever is left of its process group.  A SIGTERM to the sweep (a ``kill``, a scheduler's time limit) is such
        an interrupt (`dane.loop.faults.sigterm_as_ctrl_c`): by default it ended this process alone, and the launch,
        in a session of its own, ran on holding the job's folder.  The sweep then ends with one line and status 143.
        """
        from dane.loop.faults import interrupted_by, sigterm_as_ctrl_c  # import torch: not at the top
        from dane.loop.kinds import interrupted

        tail: collections.deque[str] = collections.deque(maxlen=200)
        logged.parent.mkdir(parents=True, exist_ok=True)
        with open(logged, "w") as logfile, sigterm_as_ctrl_c():
            logfile.write(" ".join(cmd) + "\n")
            try:
                proc = subprocess.Popen(cmd, env=launch_env({**(env or {}), LAUNCH_COMMAND_ENV: json.dumps(cmd)}),
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        start_new_session=True)
            except OSError as exc:
                logfile.write(f"error: could not start {cmd[0]}: {exc}\n")
                return 127, [f"error: could not start {cmd[0]}: {exc}"]
            timed_out = threading.Event()

            def stop() -> None:
                timed_out.set()
                _stop(proc)

            timer = threading.Timer(self.timeout_s, stop) if self.timeout_s is not None else None
            try:
                if timer is not None:
                    timer.start()
                said = False  # after a rank's error line, the launcher's own report of the exit (horovodrun's
                for line in proc.stdout:  # traceback) goes to launch.log only; the rest is shown as it comes
                    if not said:
                        sys.stdout.write(line)
                    logfile.write(line)
                    tail.append(line.rstrip("\n"))
                    said = said or ERROR_LINE.match(tail[-1]) is not None
                returncode = proc.wait()
            except BaseException:  # Ctrl-C: stop the launch too, its output after that into launch.log only
                drain = threading.Thread(target=_copy_rest, args=(proc, logfile), daemon=True)
                drain.start()
                _stop(proc)
                drain.join(timeout=1.0)
                if interrupted_by()[0] != "interrupted":  # a SIGTERM: its own line and status (a Ctrl-C: the cli's)
                    raise interrupted(f"interrupted; the running job's launch was stopped, its output is in {logged}")
                raise
            finally:
                if timer is not None:
                    timer.cancel()
        return (TIMED_OUT if timed_out.is_set() else returncode), list(tail)

    @staticmethod
    def _failed(message: str, returncode: int, job: dict, run_dir: Path) -> int:
        say(message)
        record_failure(message, job, run_dir)
        return returncode


class HorovodLauncher(ProcessLauncher):
    """``horovodrun -np <workers> [extra_args] --gloo`` per job (``hydra/launcher=horovod``)."""

    name = "horovodrun"

    def command(self, module: str, args: list[str], np: int) -> list[str]:
        return horovodrun_command(module, args, np=np, extra=self.extra_args)


class TorchrunLauncher(ProcessLauncher):
    """``torchrun --standalone --nproc_per_node <workers> [extra_args]`` per job (``hydra/launcher=torchrun``)."""

    name = "torchrun"

    def command(self, module: str, args: list[str], np: int) -> list[str]:
        return torchrun_command(module, args, np=np, extra=self.extra_args)


def launch_log(job_dir: Path, sweep_dir: str | Path, job: dict[str, tuple[int, int]],
               run_dir: Path | None = None) -> Path:
    """Where a job's launch output goes: ``<job dir>/launch.log``, unless the job's run folder (``run_dir``: its
    out_dir, else the job folder) holds a run the job did not write (``job``: its `run_files` when the job started;
    `failure_file`): then beside the job's refusal, ``<sweep dir>/refused/<job dir>.log``, so that a refused launch
    (a sweep run again into its folder) leaves the finished job's launch.log as it was.  Asked again after the
    launch, it is the folder's where the launch wrote its records there (overwrite, resume), and `settle` moves the
    log in."""
    refusal = failure_file(job_dir, sweep_dir, job, run_dir)
    return job_dir / LOG_FILE if refusal.parent == job_dir else refusal.with_suffix(".log")


def settle(logged: Path, place: Path) -> Path:
    """The launch log ``logged`` moved to ``place`` (`launch_log` after the launch); where it is."""
    if logged == place or not logged.exists():
        return logged
    shutil.move(logged, place)
    return place


#: how long a launcher given SIGTERM has to stop its workers and exit before its process group is killed (`_stop`)
STOP_GRACE_S = 10.0


def _stop(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """Stop a launch (``proc``, the launcher, leader of its own process group): SIGTERM to the launcher, up to
    ``grace_s`` for it to stop its workers and exit, then SIGKILL to whatever is left of its group.

    torchrun's agent starts each worker in a session of its own (``start_new_session``), out of the launcher's
    group: a SIGKILLed torchrun leaves them running (and holding the run's folder), where a SIGTERMed one stops them
    (SIGTERM, then SIGKILL after its own 30 s) before it exits.  horovodrun on SIGTERM stops its workers the same
    way (its per-worker middlemen, in sessions of their own too, also end them once horovodrun is gone).  A second
    Ctrl-C during the wait goes straight to the SIGKILL."""
    try:
        try:
            proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # the group is gone (its leader's pid alone names it)
            pass
        proc.wait()


def _copy_rest(proc: subprocess.Popen, logfile) -> None:
    """The rest of a stopped launch's output (its launcher's and workers' last lines) into its launch.log."""
    try:
        for line in proc.stdout:
            logfile.write(line)
    except (OSError, ValueError):  # the pipe or the log closed under it
        pass


def main_module() -> str:
    """The module the sweep was started as (``experiments.train`` for ``python -m experiments.train``)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is None or not spec.name:
        raise ConfigError("the horovod and torchrun sweep launchers start the program as a module: "
                          "run it as dane train (or dane simulate, python -m experiments.train)")
    return spec.name


def config_search_args(hydra: DictConfig) -> tuple[list[str], list[str]]:
    """The config search path the sweep's command line added, as (options, overrides) of a command that composes a
    job again in a new process: ``--config-dir <folder>`` (Hydra made it absolute), and ``hydra.searchpath=[...]``
    as typed, its ``file://`` entries made absolute against the sweep's working folder (``hydra.runtime.cwd``).

    The launched program composes the job from its own command line only: without these a job of a user's own
    algorithm or problem (a yaml in a ``--config-dir``) would be refused as unknown.  Read from the job's
    ``hydra.runtime.config_sources``, where Hydra lists every folder it searched and who added it."""
    cwd = Path(str(OmegaConf.select(hydra, "runtime.cwd", default=None) or os.getcwd()))
    options, searchpath = [], []
    for source in OmegaConf.select(hydra, "runtime.config_sources", default=None) or []:
        if source.provider == "command-line":  # --config-dir / -cd
            options += ["--config-dir", str(source.path)]
        elif source.provider == "hydra.searchpath in command-line":
            path = str(cwd / source.path) if source.schema == "file" else str(source.path)
            searchpath.append(_quoted(f"{source.schema}://{path}", "the config search path entry",
                                      "choose a plainer folder for it"))
    return options, ([f"hydra.searchpath=[{','.join(searchpath)}]"] if searchpath else [])


def job_args(hydra: DictConfig, cfg: DictConfig) -> list[str]:
    """The arguments that run a sweep's job (``cfg``; ``hydra``, its Hydra config) as a command of its own: the
    config folders the sweep's command line added (`config_search_args`), the job's overrides with their
    interpolations resolved for the job (`job_overrides`), and ``out_dir=<its job folder>`` where it sets none
    (`quote`).  A process launcher launches the job's program with them; an in-process job records them as its
    command (`experiments.train.job_command`).  Raises `ConfigError` where a path cannot be one override value."""
    overrides = job_overrides(list(hydra.overrides.task), cfg)
    if not cfg.get("out_dir"):
        overrides.append(f"out_dir={quote(str(hydra.runtime.output_dir))}")
    options, searchpath = config_search_args(hydra)
    return [*options, *overrides, *searchpath]


def job_overrides(overrides: list[str], cfg: DictConfig) -> list[str]:
    """The job's overrides as its launched program must read them: a value with an interpolation resolved here, in
    the sweep, where ``out_dir='DIR/${hydra:job.num}'`` (or ``resume=...``) names the job's number; the launched
    program is a run of its own, where ``hydra:job.num`` is None (every job's out_dir was DIR/None).  A list or a
    mapping, or a value that does not resolve (the launched program refuses it), passes as typed."""
    parser = OverridesParser.create()
    resolved = []
    for text in overrides:
        override = parser.parse_override(text)
        value = None
        if isinstance(override.value(), str) and "${" in override.value():
            try:
                value = OmegaConf.select(cfg, override.key_or_group)
            except OmegaConfBaseException:
                value = None
        if value is None or isinstance(value, (DictConfig, ListConfig)):
            resolved.append(text)
            continue
        add = "++" if override.is_force_add() else "+" if override.is_add() else ""
        resolved.append(f"{add}{override.key_or_group}={override_value(override.key_or_group, value)}")
    return resolved


def override_value(key: str, value) -> str:
    """``value``, a resolved scalar, as an override's value of the same type: a string quoted (`quote`)."""
    if isinstance(value, str):
        return _quoted(value, f"the value of {key}", f"choose a plainer {key}")
    return str(value).lower() if isinstance(value, bool) else repr(value)


def quote(value: str) -> str:
    """``value`` as one quoted Hydra override value (a job directory's name holds ``=`` and ``,``)."""
    return _quoted(value, "the job directory", "choose a plainer hydra.sweep.dir")


def _quoted(value: str, what: str, fix: str) -> str:
    for mark in ("'", '"'):
        if mark not in value and not value.endswith("\\"):
            return mark + value + mark
    raise ConfigError(f"{what} {value} holds both kinds of quotes; {fix}")
