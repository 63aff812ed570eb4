"""``hydra/launcher=slurm``: each job of a ``-m`` sweep is one Slurm job of ``workers`` tasks, one worker a task.

    python -m experiments.train -m hydra/launcher=slurm workers=1,2 algorithm.mu=0,0.1

hydra-submitit-launcher's Slurm launcher (sbatch through submitit; its ``srun`` runs the
job once per task), with two changes:

- A job's task count is its own ``workers`` (split evenly over ``hydra.launcher.nodes``),
  so one sweep can hold 1- and 2-worker jobs; a job without ``workers=`` gets
  ``hydra.launcher.tasks_per_node`` x ``nodes`` tasks.  Inside, the tasks start
  torch.distributed from Slurm's environment (`dane.comm.slurm`); a 1-task job is a plain run.
- Only task 0 (rank 0) runs Hydra's job set-up, which writes the job directory
  (``.hydra/``, the job's log); the other tasks run the same job with the same config
  and write nothing there (submitit keeps every task's stdout/stderr under ``.submitit/``).

submitit follows jobs with ``sacct``.  On a cluster without accounting (the test cluster of
scripts/slurm_cluster.sh) the jobs are followed by their result files and ``squeue``
instead, so a job that leaves the queue without a result fails the sweep, not hangs it.
A sweep that cannot submit (no ``sbatch``/``srun`` on PATH, sbatch refusing the job array) stops in one line
naming the fix, exit status 2 (`submission_refused`), as bad input does.  So does a job that fails once
queued (its program raised, Slurm killed it, its result cannot be read): once every job has ended, one line
a failed job naming it, the cause and its log (`job_failed`).
"""
from __future__ import annotations

import contextlib
import copy
import io
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, env_override, filter_overrides, setup_globals
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as SubmititSlurmLauncher
from omegaconf import OmegaConf, open_dict, read_write

from dane.comm import launcher_rank
from dane.errors import ConfigError, UserError, say
from dane.experiments.launchers import config_search_args
from dane.records.provenance import RUN_COMMAND_ENV, SWEEP_COMMAND_ENV, run_command

log = logging.getLogger(__name__)

#: how a user without a Slurm cluster gets one on this machine (docs/launchers.md, "Slurm, through Hydra")
TEST_CLUSTER = 'scripts/slurm_cluster.sh start; eval "$(scripts/slurm_cluster.sh env)"'


class SlurmLauncher(SubmititSlurmLauncher):
    """hydra-submitit-launcher's Slurm launcher with one Slurm task per worker and one writer per job.

    Found by Hydra as ``hydra_plugins.dane_slurm_launcher.SlurmLauncher``; takes the keys of
    ``hydra/launcher=submitit_slurm`` (conf/hydra/launcher/slurm.yaml sets dane's defaults).
    """

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        try:
            jobs = self.submit(job_overrides, initial_job_idx)
        except UserError as exc:  # nothing submitted, or Slurm refused it: one line and status 2, as bad input
            say(f"error: {exc}")
            sys.exit(2)
        lost = {} if accounting() else wait_without_accounting(jobs)
        returns, failed = [], []
        for idx, job in enumerate(jobs, start=initial_job_idx):
            if job.job_id in lost:
                failed.append(job_failed(job, idx, LOST, lost[job.job_id]))
                continue
            try:
                returns.append(job.results()[0])  # task 0's JobReturn: the one that ran Hydra's job set-up
            except Exception as exc:  # submitit's FailedJobError/UncompletedJobError, or a result it cannot unpickle
                failed.append(job_failed(job, idx, *failure_cause(exc)))
        if failed:  # every job has ended: one line each, status 2, as bad input
            for line in failed:
                say(f"error: {line}")
            sys.exit(2)
        return returns

    def submit(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[Any]:
        """Queue the sweep's jobs, one sbatch job array per task count; submitit's jobs, in ``job_overrides``' order.

        Raises `UserError` where Slurm's commands are not on PATH or sbatch refuses a submission (no cluster
        answers: `submission_refused`), naming the fix, instead of submitit's traceback."""
        import submitit
        from submitit.core.utils import FailedJobError

        assert self.config is not None
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        log.info(f"Slurm sweep output dir: {sweep_dir}")
        self.entry = Path(sys.argv[0]).name  # the program that submitted: each job's command starts with it
        self.sweep_command = run_command()  # the sweep's -m line: each job's provenance.sweep_command
        self.job_command([])  # a search path no command can carry stops the sweep here, before any job is queued
        missing = [tool for tool in ("sbatch", "srun") if shutil.which(tool) is None]
        if missing:
            raise UserError(f"hydra/launcher=slurm submits through Slurm's sbatch and srun, and there is no "
                            f"{' or '.join(missing)} on PATH here; run the sweep on a Slurm "
                            f"cluster's login node (naming its partition: hydra.launcher.partition=<name>), or "
                            f"install and start the test cluster on this machine: {TEST_CLUSTER}")
        groups: dict[int, list[int]] = {}  # task count -> the jobs with it (one executor, one job array each)
        for i, overrides in enumerate(job_overrides):
            groups.setdefault(self.tasks_for(overrides), []).append(i)
        jobs: list[Any] = [None] * len(job_overrides)
        for tasks, members in groups.items():
            executor = submitit.AutoExecutor(cluster="slurm", **self.folder_params())
            executor.update_parameters(**self.queue_params(tasks))
            params = []
            for i in members:
                idx = initial_job_idx + i
                log.info(f"\t#{idx} ({tasks} task{'s' * (tasks != 1)}): {' '.join(filter_overrides(job_overrides[i]))}")
                params.append((list(job_overrides[i]), "hydra.sweep.dir", idx, f"job_id_for_{idx}", Singleton.get_state()))
            said = io.StringIO()  # submitit prints sbatch's stderr before it raises: the line below quotes it
            try:
                with contextlib.redirect_stderr(said):
                    submitted = executor.map_array(self, *zip(*params))
            except FailedJobError as exc:
                raise submission_refused(str(exc) or said.getvalue(), [job.job_id for job in jobs if job]) from exc
            sys.stderr.write(said.getvalue())
            for i, job in zip(members, submitted):
                jobs[i] = job
        return jobs

    def tasks_for(self, overrides: Sequence[str]) -> int:
        """The job's ``workers`` (as its config composes it), else ``tasks_per_node`` x ``nodes``."""
        assert self.hydra_context is not None and self.config is not None
        nodes = int(self.params["nodes"])
        job_cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        workers = job_cfg.get("workers")
        if workers is None:
            return int(self.params["tasks_per_node"]) * nodes
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ConfigError(f"workers must be a positive integer (the job's Slurm task count), got {workers!r}")
        if workers % nodes:
            raise ConfigError(f"workers={workers} does not split evenly over hydra.launcher.nodes={nodes}; "
                              "make workers a multiple of nodes")
        return workers

    def folder_params(self) -> dict[str, Any]:
        init = {"folder": self.params["submitit_folder"]}
        if "max_num_timeout" in self.params:
            init["slurm_max_num_timeout"] = self.params["max_num_timeout"]
        return init

    def queue_params(self, tasks: int) -> dict[str, Any]:
        """The launcher's settings as submitit names them, with ``tasks`` tasks spread over ``nodes``."""
        shared = set(OmegaConf.structured(BaseQueueConf).keys())
        params = {k if k in shared else f"slurm_{k}": v for k, v in self.params.items()
                  if k not in ("submitit_folder", "max_num_timeout")}
        params["tasks_per_node"] = tasks // int(self.params["nodes"])
        return params

    def job_command(self, sweep_overrides: Sequence[str]) -> list[str]:
        """A job's command line as its run records it: the program that submitted, the config folders the sweep's
        command line added (``--config-dir``, ``hydra.searchpath``: `experiments.launchers.config_search_args`),
        the job's overrides.  The jobs themselves compose with the sweep's own config loader, which searches
        those folders already."""
        assert self.config is not None
        options, searchpath = config_search_args(self.config.hydra)
        return [getattr(self, "entry", "train.py"), *options, *sweep_overrides, *searchpath]

    def __call__(self, sweep_overrides: list[str], job_dir_key: str, job_num: int, job_id: str,
                 singleton_state: dict[type, Singleton]) -> JobReturn:
        """One task of a job: rank 0 through Hydra's `run_job` (which writes the job directory); the others
        with the same Hydra config and task config, writing nothing.  The run's provenance records the job's
        command line (`RUN_COMMAND_ENV`), not submitit's ``_submit.py``, and the sweep's ``-m`` line, kept where the
        sweep submitted (`submit`), as its ``sweep_command`` (`SWEEP_COMMAND_ENV`), as a torchrun or horovodrun
        job's (`experiments.launchers`)."""
        os.environ[RUN_COMMAND_ENV] = json.dumps(self.job_command(sweep_overrides))
        if getattr(self, "sweep_command", None) is not None:
            os.environ[SWEEP_COMMAND_ENV] = json.dumps(self.sweep_command)
        if launcher_rank() == 0:
            return super().__call__(sweep_overrides, job_dir_key, job_num, job_id, singleton_state)
        import submitit

        assert self.hydra_context is not None and self.config is not None and self.task_function is not None
        Singleton.set_state(singleton_state)
        setup_globals()
        config = self.hydra_context.config_loader.load_sweep_config(self.config, sweep_overrides)
        with open_dict(config.hydra.job):
            config.hydra.job.id = submitit.JobEnvironment().job_id
            config.hydra.job.num = job_num
        output_dir = os.path.join(str(OmegaConf.select(config, job_dir_key)), str(config.hydra.sweep.subdir))
        with read_write(config.hydra.runtime), open_dict(config.hydra.runtime):
            config.hydra.runtime.output_dir = os.path.abspath(output_dir)
        HydraConfig.instance().set_config(config)
        task_cfg = copy.deepcopy(config)
        with read_write(task_cfg), open_dict(task_cfg):
            del task_cfg["hydra"]
        with env_override(config.hydra.job.env_set):
            # an exception propagates: the task exits non-zero and srun (SLURM_KILL_BAD_EXIT) ends the step
            value = self.task_function(task_cfg)
        return JobReturn(overrides=list(sweep_overrides), cfg=task_cfg, hydra_cfg=config, _return_value=value,
                         working_dir=os.getcwd(), task_name=str(config.hydra.job.name), status=JobStatus.COMPLETED)


def submission_refused(sbatch_stderr: str, queued: Sequence[str]) -> UserError:
    """The line for an sbatch that refused a job array: the last line of sbatch's stderr (its final verdict, such as
    ``Unable to contact slurm controller`` or ``Invalid partition name specified``) and the fixes; ``queued``: the
    Slurm job ids of the arrays this sweep queued before it, which stay queued."""
    lines = [line.strip() for line in sbatch_stderr.splitlines() if line.strip()]
    said = lines[-1] if lines else "no message"
    where = f"; the jobs already queued ({', '.join(queued)}) stay in Slurm's queue (scancel removes them)" if queued \
        else ""
    return UserError(f"sbatch could not submit the sweep's jobs ({said}): on this machine start the test cluster and "
                     f"point sbatch at it ({TEST_CLUSTER}); on a real cluster submit from its login node, check "
                     f"SLURM_CONF and name its partition (hydra.launcher.partition=<name>){where}")


def accounting() -> bool:
    """Whether ``sacct`` answers here (it is how submitit tells a job that died from one still running)."""
    try:
        return subprocess.run(["sacct", "-n", "-X", "-j", "1"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def wait_without_accounting(jobs: Sequence[Any], *, poll_s: float = 1.0, grace_s: float = 30.0) -> dict[str, int]:
    """Wait until every task of every job has its result file, or its job has been out of ``squeue`` for ``grace_s``
    without one (killed, out of memory, a node lost); the jobs so lost: Slurm job id -> the first task without a
    result."""
    left_queue: dict[str, float] = {}
    lost: dict[str, int] = {}
    while True:
        missing = {job.job_id: [t for t in range(job.num_tasks) if not job.task(t).paths.result_pickle.exists()]
                   for job in jobs if job.job_id not in lost}
        waiting = [job for job in jobs if missing.get(job.job_id)]
        if not waiting:
            return lost
        queued = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split()
        now = time.monotonic()
        for job in waiting:
            array_id = job.job_id.split("_")[0]
            if job.job_id in queued or any(q.startswith(f"{array_id}_[") for q in queued):
                left_queue.pop(job.job_id, None)
            elif now - left_queue.setdefault(job.job_id, now) > grace_s:
                lost[job.job_id] = missing[job.job_id][0]
        time.sleep(poll_s)


#: the cause `job_failed` names for a job `wait_without_accounting` lost
LOST = "left Slurm's queue without a result (killed: out of memory, out of time, its node lost)"

#: how a sweep with failed jobs goes on (`job_failed`; `dane.loop.resume.finished_run` keeps a finished job's run)
RERUN = ("then rerun the sweep: the finished jobs' runs are kept, and with out_dir='DIR/${hydra:job.num}' "
         "resume=auto a rerun runs only the jobs that did not finish")


def failure_cause(exc: BaseException) -> tuple[str, int]:
    """What failed in a job whose ``results()`` raised ``exc``, in a few words, and the task it names.

    submitit's `FailedJobError` holds the task's traceback between dashed lines: its last line (the exception) is
    the cause.  Its `UncompletedJobError` says the task wrote no result (and Slurm's state); the last line of the
    task's stderr it quotes (such as slurmstepd's ``oom_kill``) follows.  Another exception is submitit failing to
    read the result file."""
    from submitit.core.utils import UncompletedJobError

    text = str(exc)
    found = re.search(r"\(task[=:] ?(\d+)\)", text)
    task = int(found.group(1)) if found else 0
    if not isinstance(exc, UncompletedJobError):
        return f"wrote a result that cannot be read ({type(exc).__name__}: {text.strip() or 'no message'})", task
    parts = re.split(r"^-{20,}$", text, flags=re.MULTILINE)
    if "failed during processing" in parts[0] and len(parts) >= 3:
        trace = [line for line in parts[1].splitlines() if line.strip() and not line[0].isspace()]
        return f"raised {trace[-1].strip() if trace else 'an exception'}", task
    state = re.search(r"has not produced any output \(state: ([^)]*)\)", text)
    said = [line.strip() for line in "".join(parts[1:]).splitlines() if line.strip()]
    cause = f"ended without a result (Slurm state: {state.group(1) if state else 'unknown'})"
    return cause + (f", its stderr ending: {said[-1]}" if said else ""), task


def job_failed(job: Any, idx: int, cause: str, task: int = 0) -> str:
    """The line for the sweep's job ``idx`` (submitit's ``job``, one Slurm array element) that failed: its ids,
    ``cause``, the stderr log of its failed ``task`` and how to go on (`RERUN`)."""
    log = job.task(task if 0 <= task < job.num_tasks else 0).paths.stderr
    return f"sweep job #{idx} (Slurm job {job.job_id}) {cause}; read {log}, {RERUN}"
