"""Slurm: srun tasks start torch.distributed from Slurm's environment; hydra/launcher=slurm runs sweeps there.

The fast tests read fake ``SLURM_*`` environments.  The slow ones start a real single-node
cluster (scripts/slurm_cluster.sh: slurmctld, slurmd, munge), submit through Hydra and
compare every job with the in-process simulator on the same shards.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dane.comm import detect_launcher, launcher_rank, resolve_backend
from dane.comm.slurm import PORT_BASE, first_host, slurm_task
from dane.errors import ConfigError
from dane.records.results import read_rounds, read_summary
from dane.experiments.config import CONF_DIR, rank_zero, workers_for
from helpers import REPO, composed, env, train

SRUN_TASK_1_OF_4 = {  # what srun -N 2 -n 4 sets for the second task (as printed by `srun env` on the test cluster)
    "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_LOCALID": "1",
    "SLURM_STEP_NUM_TASKS": "4", "SLURM_NTASKS": "4", "SLURM_STEP_NODELIST": "node[07-08]",
    "SLURM_JOB_NODELIST": "node[07-08]",
}
LAUNCHER_KEYS = ("HOROVOD_RANK", "HOROVOD_SIZE", "RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "MASTER_ADDR",
                 "MASTER_PORT", "LOCAL_RANK")


@pytest.fixture
def srun_env(monkeypatch):
    """Replace this process's launcher and Slurm variables with ``fake``."""
    def apply(fake: dict[str, str]) -> None:
        for key in [k for k in os.environ if k.startswith("SLURM_")] + list(LAUNCHER_KEYS):
            monkeypatch.delenv(key, raising=False)
        for key, value in fake.items():
            monkeypatch.setenv(key, value)
    return apply


def test_srun_task_is_read_from_slurm_variables():
    task = slurm_task(SRUN_TASK_1_OF_4)
    assert (task.rank, task.size, task.local_rank) == (1, 4, 1)
    assert task.master_addr == "node07"  # the first host of the step, the same for every task
    assert task.master_port == PORT_BASE + 4242 % 10000
    assert slurm_task({**SRUN_TASK_1_OF_4, "SLURM_JOB_ID": "4243"}).master_port == task.master_port + 1
    assert slurm_task({**SRUN_TASK_1_OF_4, "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29400"}).master_addr == "10.0.0.5"
    assert slurm_task({**SRUN_TASK_1_OF_4, "MASTER_PORT": "29400"}).master_port == 29400


def test_single_task_and_batch_script_are_plain_runs():
    assert slurm_task({**SRUN_TASK_1_OF_4, "SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1"}) is None
    batch = {k: v for k, v in SRUN_TASK_1_OF_4.items() if not k.startswith("SLURM_STEP")}  # sbatch's own step
    assert slurm_task(batch) is None
    assert slurm_task({}) is None


@pytest.mark.parametrize("nodelist, first", [
    ("vm", "vm"), ("node[07-09,12],gpu1", "node07"), ("gpu1,node[1-2]", "gpu1"), ("rack[2-3]-n[01-04]", "rack2-n01"),
    ("a[5,1-3]", "a5"),
])
def test_first_host_of_a_slurm_host_list(nodelist, first):
    assert first_host(nodelist) == first


def test_bad_slurm_variables_are_named():
    with pytest.raises(ConfigError, match="SLURM_STEP_NUM_TASKS='x' is not an integer"):
        slurm_task({**SRUN_TASK_1_OF_4, "SLURM_STEP_NUM_TASKS": "x"})


def test_launcher_detection_under_srun(srun_env):
    srun_env({**SRUN_TASK_1_OF_4, "SLURM_PROCID": "3"})
    assert detect_launcher() == ("torch", 4)
    assert launcher_rank() == 3 and not rank_zero()  # a non-zero task never writes the run directory
    assert resolve_backend("auto") == "torch"
    assert workers_for("torch", 4) == 4 and workers_for("torch", None) == 4
    with pytest.raises(ConfigError, match="workers=2 but the launcher started 4 process"):
        workers_for("torch", 2)
    with pytest.raises(ConfigError, match="^comm=horovod cannot start under srun: Horovod's gloo rendezvous needs "
                                          "horovodrun"):
        resolve_backend("horovod")


def test_single_task_slurm_job_and_torchrun_inside_srun(srun_env):
    srun_env({**SRUN_TASK_1_OF_4, "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1"})
    assert detect_launcher() == ("local", 1) and launcher_rank() == 0
    assert workers_for("local", 2) == 2  # simulated workers inside a one-task job
    # torchrun started by a one-task srun step: torchrun's variables win
    srun_env({**SRUN_TASK_1_OF_4, "TORCHELASTIC_RUN_ID": "x", "RANK": "2", "WORLD_SIZE": "3"})
    assert detect_launcher() == ("torch", 3) and launcher_rank() == 2


def test_comm_horovod_under_torchrun_is_refused(srun_env):
    """Under torchrun each process's hvd.init() would be a job of its own, one worker each, and the run exit 0."""
    srun_env({"TORCHELASTIC_RUN_ID": "x", "RANK": "1", "WORLD_SIZE": "2"})
    with pytest.raises(ConfigError, match="^comm=horovod cannot start under torchrun: each process would be a Horovod "
                                          "job of its own"):
        resolve_backend("horovod")
    assert resolve_backend("auto") == "torch"


def test_provenance_under_srun_records_the_step_and_the_jobs_command(srun_env, monkeypatch):
    """summary.json's provenance of a Slurm job: the srun step's layout, and the job's overrides as its command
    (the process's own argv is submitit's _submit.py)."""
    from dane.records.provenance import RUN_COMMAND_ENV, launch_layout, run_provenance

    srun_env({**SRUN_TASK_1_OF_4, "SLURM_STEP_NUM_NODES": "2", "SLURM_ARRAY_TASK_ID": "3"})
    monkeypatch.setattr(sys, "argv", ["/spool/_submit.py", "/sweep/.submitit/%j"])
    monkeypatch.setenv(RUN_COMMAND_ENV, json.dumps(["train.py", "workers=4", "algorithm.mu=0.1"]))
    provenance = run_provenance()
    assert provenance["launch"] == launch_layout() == {"launcher": "srun", "size": 4, "nodes": 2,
                                                       "hosts": "node[07-08]", "job_id": "4242_3"}
    assert provenance["command"] == ["train.py", "workers=4", "algorithm.mu=0.1"]
    monkeypatch.delenv(RUN_COMMAND_ENV)
    assert run_provenance()["command"] == ["_submit.py", "/sweep/.submitit/%j"]
    srun_env({**SRUN_TASK_1_OF_4, "TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "3"})  # torchrun inside srun: its layout
    assert launch_layout()["launcher"] == "torchrun"


def test_slurm_launcher_config_composes():
    cfg = composed("hydra/launcher=slurm", "workers=2", hydra=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.dane_slurm_launcher.SlurmLauncher"
    assert (launcher.nodes, launcher.cpus_per_task, launcher.partition) == (1, 1, None)
    assert "export SLURM_KILL_BAD_EXIT=1" in launcher.setup


def test_a_slurm_jobs_recorded_command_keeps_the_config_folders_its_sweep_searched(tmp_path, monkeypatch):
    """The command a Slurm job's run records (provenance.command) holds the sweep's ``--config-dir`` (absolute) and
    ``hydra.searchpath`` (made absolute against the sweep's folder), which its own algorithm or problem needs."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.types import RunMode
    from hydra.utils import instantiate

    from dane.experiments import slurm_launcher
    from dane.records.provenance import RUN_COMMAND_ENV

    outside = Path(__file__).resolve().parent / "outside" / "conf"
    (tmp_path / "more").mkdir()
    monkeypatch.chdir(tmp_path)
    search_path = create_config_search_path(str(CONF_DIR))
    search_path.prepend("command-line", f"file://{outside}", anchor=SearchPathQuery(provider="schema"))
    cfg = ConfigLoaderImpl(config_search_path=search_path).load_configuration(
        "config", ["algorithm=my_fedprox", "hydra.searchpath=[file://more]", "hydra/launcher=slurm"],
        run_mode=RunMode.MULTIRUN)
    launcher = instantiate(cfg.hydra.launcher)
    launcher.setup(hydra_context=None, task_function=None, config=cfg)
    launcher.entry = "train.py"
    # task 0 of the job, up to Hydra's job set-up (submitit's own __call__, which would run the job)
    monkeypatch.setattr(slurm_launcher, "launcher_rank", lambda: 0)
    monkeypatch.setattr(slurm_launcher.SubmititSlurmLauncher, "__call__", lambda self, *args: None)
    monkeypatch.setenv(RUN_COMMAND_ENV, "")  # restored after
    launcher(["algorithm=my_fedprox", "workers=2"], "hydra.sweep.dir", 0, "job_id_for_0", {})
    assert json.loads(os.environ[RUN_COMMAND_ENV]) == [
        "train.py", "--config-dir", str(outside), "algorithm=my_fedprox", "workers=2",
        f"hydra.searchpath=['file://{tmp_path / 'more'}']"]


@pytest.fixture
def slurm_sweep_launcher(tmp_path, monkeypatch):
    """hydra/launcher=slurm as a sweep sets it up, each job of 1 task (its config is not composed here)."""
    from hydra.utils import instantiate

    cfg = composed("hydra/launcher=slurm", f"hydra.sweep.dir={tmp_path / 'sweep'}", hydra=True)
    launcher = instantiate(cfg.hydra.launcher)
    launcher.setup(hydra_context=None, task_function=None, config=cfg)
    monkeypatch.setattr(launcher, "tasks_for", lambda overrides: 1)
    return launcher


def slurm_commands_on_path(folder: Path, monkeypatch, commands=("sbatch", "srun")) -> None:
    """PATH is ``folder`` alone, holding stand-ins (never run) for Slurm's ``commands``."""
    folder.mkdir()
    for command in commands:
        (folder / command).write_text("#!/bin/sh\nexit 1\n")
        (folder / command).chmod(0o755)
    monkeypatch.setenv("PATH", str(folder))


SBATCH_DOWN = "sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)"
FIXES = ('on this machine start the test cluster and point sbatch at it (scripts/slurm_cluster.sh start; '
         'eval "$(scripts/slurm_cluster.sh env)"); on a real cluster submit from its login node, check SLURM_CONF '
         'and name its partition (hydra.launcher.partition=<name>)')


def test_a_slurm_sweep_sbatch_refuses_stops_in_one_line_with_status_2(slurm_sweep_launcher, tmp_path, monkeypatch,
                                                                       capsys):
    """sbatch refusing the job array (no controller answers) is one line naming sbatch's verdict and the fixes, status
    2; it was submitit's FailedJobError, a traceback after sbatch's stderr, status 1."""
    import submitit
    from submitit.core.utils import FailedJobError

    class RefusedExecutor:  # what submitit's AutoExecutor does when sbatch exits non-zero
        def __init__(self, **kwargs):
            pass

        def update_parameters(self, **kwargs):
            pass

        def map_array(self, fn, *iterables):
            stderr = "sbatch: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n" + SBATCH_DOWN
            print(stderr, file=sys.stderr)  # submitit's CommandFunction prints it, then raises
            raise FailedJobError(stderr)

    slurm_commands_on_path(tmp_path / "bin", monkeypatch)
    monkeypatch.setattr(submitit, "AutoExecutor", RefusedExecutor)
    with pytest.raises(SystemExit) as stop:
        slurm_sweep_launcher.launch([["workers=1"], ["workers=2"]], 0)
    assert stop.value.code == 2
    assert capsys.readouterr().err == f"error: sbatch could not submit the sweep's jobs ({SBATCH_DOWN}): {FIXES}\n"


def test_a_slurm_sweep_without_slurm_on_path_stops_in_one_line_with_status_2(slurm_sweep_launcher, tmp_path,
                                                                                monkeypatch, capsys):
    """No srun on PATH (submitit's 'Could not detect "srun"' RuntimeError, a traceback) is one line, status 2."""
    slurm_commands_on_path(tmp_path / "bin", monkeypatch, commands=("sbatch",))
    with pytest.raises(SystemExit) as stop:
        slurm_sweep_launcher.launch([["workers=1"]], 0)
    assert stop.value.code == 2
    assert capsys.readouterr().err == (
        "error: hydra/launcher=slurm submits through Slurm's sbatch and srun, and there is no srun on PATH here; "
        "run the sweep on a Slurm cluster's login node (naming its partition: hydra.launcher.partition=<name>), or "
        'install and start the test cluster on this machine: scripts/slurm_cluster.sh start; '
        'eval "$(scripts/slurm_cluster.sh env)"\n')


def test_a_slurm_jobs_run_records_the_sweeps_command_as_a_launched_job_does(slurm_sweep_launcher, tmp_path,
                                                                            monkeypatch):
    """A job of an in-process sweep records the sweep's ``-m`` line in ``provenance.sweep_command``, and a torchrun
    or horovodrun job is given it (`SWEEP_COMMAND_ENV`); a Slurm job had none (its process's argv is submitit's
    ``_submit.py``).  The launcher keeps the sweep's command where the sweep submits, and each task of the job
    (the launcher, pickled by submitit, run there) puts it in its environment beside the job's own command."""
    import cloudpickle
    import submitit

    from dane.experiments import slurm_launcher
    from dane.records.provenance import RUN_COMMAND_ENV, SWEEP_COMMAND_ENV, run_provenance

    queued = []

    class QueuingExecutor:  # submitit's AutoExecutor up to sbatch: what it pickles for the job array's tasks
        def __init__(self, **kwargs):
            pass

        def update_parameters(self, **kwargs):
            pass

        def map_array(self, fn, *iterables):
            queued.extend((cloudpickle.dumps(fn), args) for args in zip(*iterables))
            return [QueuedJob(f"4242_{k}", tmp_path) for k in range(len(iterables[0]))]

    sweep = ["train.py", "-m", "hydra/launcher=slurm", "workers=1,2", "algorithm.mu=0,0.1"]
    slurm_commands_on_path(tmp_path / "bin", monkeypatch)
    monkeypatch.setattr(submitit, "AutoExecutor", QueuingExecutor)
    monkeypatch.setattr(sys, "argv", sweep)
    slurm_sweep_launcher.submit([["workers=1", "algorithm.mu=0"], ["workers=2", "algorithm.mu=0.1"]], 0)
    monkeypatch.setattr(sys, "argv", ["/spool/_submit.py", f"{tmp_path}/.submitit/%j"])  # in the job's task 0
    monkeypatch.setattr(slurm_launcher, "launcher_rank", lambda: 0)
    monkeypatch.setattr(slurm_launcher.SubmititSlurmLauncher, "__call__", lambda self, *args: None)
    for key in (RUN_COMMAND_ENV, SWEEP_COMMAND_ENV):
        monkeypatch.setenv(key, "")  # restored after
    pickled, args = queued[1]
    cloudpickle.loads(pickled)(*args)
    provenance = run_provenance()
    assert (provenance["command"], provenance["sweep_command"]) == (
        ["train.py", "workers=2", "algorithm.mu=0.1"], sweep)


def test_an_sbatch_refusal_after_an_earlier_array_names_the_queued_jobs():
    from dane.experiments.slurm_launcher import submission_refused

    line = str(submission_refused(f"{SBATCH_DOWN}\n", ["4242_0", "4242_1"]))
    assert line == (f"sbatch could not submit the sweep's jobs ({SBATCH_DOWN}): {FIXES}; the jobs already queued "
                    "(4242_0, 4242_1) stay in Slurm's queue (scancel removes them)")



class QueuedJob:
    """submitit's SlurmJob as the launcher reads it: ids, tasks, each task's log paths, ``results()``."""

    def __init__(self, job_id: str, folder: Path, num_tasks: int = 1, raises: BaseException | None = None):
        self.job_id, self.num_tasks, self.raises = job_id, num_tasks, raises
        self.folder = folder

    def task(self, t: int):
        paths = type("Paths", (), {"stderr": self.folder / f"{self.job_id}_{t}_log.err",
                                   "stdout": self.folder / f"{self.job_id}_{t}_log.out",
                                   "result_pickle": self.folder / f"{self.job_id}_{t}_result.pkl"})
        return type("Task", (), {"paths": paths})

    @property
    def paths(self):
        return self.task(0).paths

    def results(self):
        if self.raises is not None:
            raise self.raises
        return [f"return of {self.job_id}"]


def trace_failure(task: int, folder: Path, job_id: str):
    """submitit's FailedJobError for a task whose program raised, worded as submitit's Job.exception words it."""
    from submitit.core.utils import FailedJobError

    trace = ('Traceback (most recent call last):\n  File "/repo/experiments/train.py", line 9, in main\n'
             '    raise ValueError("the shard is empty")\nValueError: the shard is empty')
    return FailedJobError(f"Job (task={task}) failed during processing with trace:\n----------------------\n{trace}\n"
                          "----------------------\nYou can check full logs with 'job.stderr(0)' and 'job.stdout(0)'"
                          f"or at paths:\n  - {folder}/{job_id}_{task}_log.err\n  - {folder}/{job_id}_{task}_log.out")


RERUN = ("then rerun the sweep: the finished jobs' runs are kept, and with out_dir='DIR/${hydra:job.num}' resume=auto "
         "a rerun runs only the jobs that did not finish")


def test_slurm_jobs_that_fail_once_queued_end_the_sweep_in_one_line_each_with_status_2(slurm_sweep_launcher, tmp_path,
                                                                                         monkeypatch, capsys):
    """A queued job whose program raised (submitit's FailedJobError, task 1 of 2) or that ended without a result
    (UncompletedJobError, killed for memory) is one line naming the sweep's job number, Slurm's job id, the cause
    and the failed task's log, status 2, once every job has ended; it was submitit's traceback, status 1."""
    from submitit.core.utils import UncompletedJobError

    from dane.experiments import slurm_launcher

    logs = tmp_path / "sweep" / ".submitit"
    killed = UncompletedJobError(
        f"Job 4242_2 (task: 0) with path {logs}/4242_2_0_result.pkl\nhas not produced any output (state: "
        "OUT_OF_MEMORY)\nError stream produced:\n----------------------------------------\n"
        "slurmstepd: error: Detected 1 oom_kill event in StepId=4242_2.0. Some of the step tasks have been "
        "OOM Killed.\n")
    jobs = [QueuedJob("4242_0", logs), QueuedJob("4242_1", logs, 2, trace_failure(1, logs, "4242_1")),
            QueuedJob("4242_2", logs, raises=killed)]
    monkeypatch.setattr(slurm_sweep_launcher, "submit", lambda overrides, idx: jobs)
    monkeypatch.setattr(slurm_launcher, "accounting", lambda: True)
    with pytest.raises(SystemExit) as stop:
        slurm_sweep_launcher.launch([["workers=1"], ["workers=2"], ["workers=1"]], 5)
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: sweep job #6 (Slurm job 4242_1) raised ValueError: the shard is empty; read {logs}/4242_1_1_log.err, "
        f"{RERUN}",
        "error: sweep job #7 (Slurm job 4242_2) ended without a result (Slurm state: OUT_OF_MEMORY), its stderr ending: "
        "slurmstepd: error: Detected 1 oom_kill event in StepId=4242_2.0. Some of the step tasks have been OOM Killed.; "
        f"read {logs}/4242_2_0_log.err, {RERUN}"]


def test_a_slurm_job_whose_result_cannot_be_read_is_one_line():
    from dane.experiments.slurm_launcher import failure_cause

    assert failure_cause(EOFError("Ran out of input")) == (
        "wrote a result that cannot be read (EOFError: Ran out of input)", 0)


def test_a_slurm_job_that_left_the_queue_without_a_result_is_one_line(slurm_sweep_launcher, tmp_path, monkeypatch,
                                                                      capsys):
    """Without accounting, a job out of squeue with no result for its task 1 (the other job finished) is one line
    naming that task's log, status 2; it was a RuntimeError's traceback."""
    from dane.experiments import slurm_launcher

    logs = tmp_path / "logs"
    logs.mkdir()
    for name in ("4243_0_0_result.pkl", "4243_1_0_result.pkl"):
        (logs / name).write_bytes(b"")
    jobs = [QueuedJob("4243_0", logs), QueuedJob("4243_1", logs, 2)]
    squeue = subprocess.CompletedProcess(["squeue"], 0, stdout="", stderr="")
    monkeypatch.setattr(slurm_launcher.subprocess, "run", lambda *args, **kwargs: squeue)
    monkeypatch.setattr(slurm_launcher, "accounting", lambda: False)
    monkeypatch.setattr(slurm_launcher.time, "sleep", lambda s: None)
    ticks = iter(range(0, 1000, 20))
    monkeypatch.setattr(slurm_launcher.time, "monotonic", lambda: float(next(ticks)))
    monkeypatch.setattr(slurm_sweep_launcher, "submit", lambda overrides, idx: jobs)
    with pytest.raises(SystemExit) as stop:
        slurm_sweep_launcher.launch([["workers=1"], ["workers=2"]], 0)
    assert stop.value.code == 2
    assert capsys.readouterr().err == (
        "error: sweep job #1 (Slurm job 4243_1) left Slurm's queue without a result (killed: out of memory, out of "
        f"time, its node lost); read {logs}/4243_1_1_log.err, {RERUN}\n")

# --- a real cluster --------------------------------------------------------------------------------------------

SMALL = ["algorithm=dane", "problem=ridge_synthetic", "problem.n_samples=2000", "problem.dim=50", "rounds=10",
         "dtype=float64", "quiet=true"]
CLUSTER = REPO / "scripts" / "slurm_cluster.sh"


@pytest.fixture(scope="module")
def slurm_env():
    """The environment of a client of the test cluster (started here if it is not running; stopped after if so)."""
    state = subprocess.run(["bash", str(CLUSTER), "env"], capture_output=True, text=True, check=True).stdout
    conf = state.strip().removeprefix("export SLURM_CONF=")
    was_running = subprocess.run(["bash", str(CLUSTER), "status"], capture_output=True).returncode == 0
    proc = subprocess.run(["bash", str(CLUSTER), "start"], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        installed = all(shutil.which(tool) for tool in ("slurmctld", "slurmd", "munged", "sbatch"))
        if not installed:  # apt could not install it (no root, no apt, no network): nothing to test against
            pytest.skip(f"no Slurm here and it could not be installed: {proc.stderr.strip()}")
        pytest.fail(f"Slurm is installed but the test cluster did not start: {proc.stdout}{proc.stderr}")
    yield {**env(), "SLURM_CONF": conf}
    if not was_running:
        subprocess.run(["bash", str(CLUSTER), "stop"], capture_output=True, timeout=120)


def sweep(*overrides: str, sweep_dir: Path, client_env: dict, slurm: bool) -> list[Path]:
    """A ``-m`` sweep of experiments.train (through Slurm, or in this machine's processes); its job directories."""
    launcher = ["hydra/launcher=slurm"] if slurm else []
    proc = subprocess.run([sys.executable, "-m", "experiments.train", "-m", *launcher, *overrides,
                           f"hydra.sweep.dir={sweep_dir}"], cwd=REPO, env=client_env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return sorted(p for p in sweep_dir.iterdir() if (p / ".hydra").is_dir())


def assert_same_run(real: Path, simulated: Path) -> None:
    a_rounds, b_rounds = read_rounds(real), read_rounds(simulated)
    assert len(a_rounds) == len(b_rounds) == 11
    for a, b in zip(a_rounds, b_rounds):
        assert a["round"] == b["round"]
        assert a["bytes_sent"] == b["bytes_sent"] and a["comm_rounds"] == b["comm_rounds"]
        assert a["objective"] == pytest.approx(b["objective"], rel=1e-10, abs=0)
        assert abs(a["suboptimality"] - b["suboptimality"]) <= 1e-10 * max(1.0, b["suboptimality"])


@pytest.mark.slow
def test_two_task_slurm_job_equals_the_simulator(slurm_env, tmp_path):
    jobs = sweep(*SMALL, "workers=2", "save_iterate=true", sweep_dir=tmp_path / "slurm", client_env=slurm_env,
                 slurm=True)
    assert len(jobs) == 1
    job = jobs[0]
    summary = read_summary(job)
    assert (summary["backend"], summary["workers"]) == ("torch", 2)  # two srun tasks, one process group
    proc = train(*SMALL, "workers=2", "save_iterate=true", f"out_dir={tmp_path / 'sim'}")
    assert proc.returncode == 0, proc.stderr
    assert read_summary(tmp_path / "sim")["backend"] == "simulator"
    assert_same_run(job, tmp_path / "sim")
    torch.testing.assert_close(torch.load(job / "iterate.pt"), torch.load(tmp_path / "sim" / "iterate.pt"),
                               rtol=0, atol=1e-10)
    # rank 0 alone wrote the job directory: the run's files and Hydra's, each once
    assert sorted(p.name for p in job.iterdir()) == [".hydra", "config.yaml", "iterate.pt", "rounds.jsonl",
                                                     "summary.json", "train.log"]
    task_logs = sorted((tmp_path / "slurm" / ".submitit").glob("*/*_1_log.out"))
    assert task_logs and "global_rank=1(2)" in task_logs[0].read_text()  # the second task did run


@pytest.mark.slow
def test_slurm_sweep_over_workers_and_mu_equals_the_simulator(slurm_env, tmp_path):
    grid = ["workers=1,2", "algorithm.mu=0,0.1"]
    real = sweep(*SMALL, *grid, sweep_dir=tmp_path / "slurm", client_env=slurm_env, slurm=True)
    simulated = sweep(*SMALL, *grid, sweep_dir=tmp_path / "sim", client_env=env(), slurm=False)
    assert [p.name for p in real] == [p.name for p in simulated] and len(real) == 4
    for job, sim in zip(real, simulated):
        workers, backend = read_summary(sim)["workers"], read_summary(sim)["backend"]
        assert (workers, backend) in ((1, "local"), (2, "simulator"))
        assert read_summary(job)["backend"] == ("torch" if workers == 2 else "local")  # 1 task: a plain run
        assert read_summary(job)["workers"] == workers
        assert_same_run(job, sim)
    mus = {p.name.split("algorithm.mu=")[1].split(",")[0] for p in real}
    assert mus == {"0", "0.1"}
