"""Hydra sweeps of the simulator: a real multirun writes one directory per job, every synthetic
experiment file composes and runs when shrunk, and `synthetic.sweep` reuses stored runs."""
from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.types import RunMode
from omegaconf import OmegaConf, open_dict, read_write

from dane.records.results import find_runs, read_rounds, read_summary
from dane.experiments import config
from dane.experiments.callbacks import SWEEP_OUT_DIR_ENV, failure_file, run_files
from dane.experiments.config import CONF_DIR, run_spec
from dane.loop.launch import execute
from dane.loop import timeline
from dane.paper_figs.summary import job_dirs, summarize
from dane.records.provenance import run_command
from dane.synthetic.sweep import (RunIndex, answers, compose_job, composed_job, ensure, grid, identity, job_name,
                                  run_job)

from helpers import composed
from runs import command, prepare

TINY = ("problem.n_samples=600", "problem.dim=20")
# the synthetic-ridge experiments; the neural-network ones (table_*, target_*) are shrunk in test_nn_tables.py
EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml")
                     if not p.stem.startswith(("table_", "target_")))


SIMULATE_SWEEP = command("sweep:simulate", "-m", "algorithm.safeguard=false,true", "workers=16,1,2", *TINY,
                         "hydra.sweep.dir={tmp}/sweep/simulate", module="experiments.simulate")
#: an experiment file's sweep (hydra.sweeper.params) with Hydra's default sweep directory, results/sweeps/<unique>
EXPERIMENT_SWEEP = command("sweep:experiment", "-m", "experiment=speedup", *TINY, "rounds=2",
                           module="experiments.simulate", cwd="{tmp}/sweep_default")
TRAIN_SWEEP = command("sweep:train", "-m", "algorithm.safeguard=false", "workers=16,2", "rounds=30", "quiet=true", *TINY,
                      "hydra.sweep.dir={tmp}/sweep/train")

#: a 2-job sweep, then the same sweep again into its folder: each job's folder holds a finished run and is refused
#: (print_every is no part of a job's name: the second sweep's jobs have the first's folders, and another config)
RERUN_ARGS = ("-m", "workers=1,2", *TINY, "rounds=2", "hydra.sweep.dir={tmp}/sweep/rerun")
RERUN_JOBS = [f"{k}_problem.dim=20,problem.n_samples=600,rounds=2,workers={k + 1}" for k in range(2)]
FIRST_SWEEP = command("sweep:first", *RERUN_ARGS, module="experiments.simulate")
SWEEP_AGAIN = command("sweep:again", *RERUN_ARGS, "print_every=2", module="experiments.simulate",
                      watch=f"{{tmp}}/sweep/rerun/{RERUN_JOBS[0]}")
#: job 0 again as hydra/launcher=torchrun launches it: a single run into the job's folder, which the launcher names
LAUNCHED_AGAIN = command("sweep:launched-again", "workers=1", *TINY, "rounds=2",
                        f"out_dir='{{tmp}}/sweep/rerun/{RERUN_JOBS[0]}'", module="experiments.simulate",
                        env={SWEEP_OUT_DIR_ENV: f"{{tmp}}/sweep/rerun/{RERUN_JOBS[0]}"},
                        watch=f"{{tmp}}/sweep/rerun/{RERUN_JOBS[0]}")
#: a sweep, then the same again with overwrite=true and keys that change no run's result (no part of a job's name:
#: conf/config.yaml, exclude_keys), then again with resume=auto: the second replaces the first's runs in their folders,
#: a sweep into out_dir='DIR/${hydra:job.num}', then again with resume=auto: the second keeps the first's runs, and
#: neither makes folders of its own
REPLACE_ARGS = ("-m", "workers=1,2", *TINY, "rounds=2", "hydra.sweep.dir={tmp}/sweep/replace")
REPLACE_FIRST = command("sweep:replace-first", *REPLACE_ARGS, module="experiments.simulate")
REPLACED = command("sweep:replaced", *REPLACE_ARGS, "overwrite=true", "progress=none", "checkpoint_every=1",
                   "quiet=true", "print_every=2", module="experiments.simulate")
RESUME_ARGS = ("-m", "workers=1,2", *TINY, "rounds=2", "quiet=true", "out_dir={tmp}/sweep/resume/${hydra:job.num}",
               "hydra.sweep.dir={tmp}/sweep/resume.hydra")
RESUME_FIRST = command("sweep:resume-first", *RESUME_ARGS, module="experiments.simulate")
RESUMED = command("sweep:resumed", *RESUME_ARGS, "resume=auto", "checkpoint_every=1", "progress=none",
                  module="experiments.simulate")
REPLACE_JOBS = [f"{k}_problem.dim=20,problem.n_samples=600,rounds=2,workers={k + 1}" for k in range(2)]
#: a sweep of one job into out_dir='DIR/${hydra:job.num}'
ONE_JOB = command("sweep:one-job", "-m", "workers=2", *TINY, "rounds=2", "quiet=true",
                  "out_dir={tmp}/sweep/one/${hydra:job.num}", "hydra.sweep.dir={tmp}/sweep/one.hydra",
                  module="experiments.simulate")
#: before the first sweep, job 1's folder holds the line of an earlier job refused on bad input (logger is no part
#: of the job's name: a fixed logger=... runs in the same folder)
STALE_ERROR = "error: logger must be a list of jsonl, tensorboard, mlflow (e.g. logger=[jsonl,tensorboard]), got 'x'\n"


def sweep_default_folder(tmp: Path) -> None:
    (tmp / "sweep_default").mkdir()


def refused_job_folder(tmp: Path) -> None:
    folder = tmp / "sweep" / "rerun" / RERUN_JOBS[1]
    folder.mkdir(parents=True)
    (folder / "error.txt").write_text(STALE_ERROR)


prepare(sweep_default_folder)
prepare(refused_job_folder)

#: a sweep folder's name (conf/config.yaml, hydra.sweep.dir): <date>_<time>-<microseconds>_<pid>
SWEEP_NAME = re.compile(r"\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d-\d{6}_\d+")


def test_multirun_writes_one_dir_per_job(commands):
    # the first job (plain DANE, 16 workers of 37 samples in R^20) diverges; the sweep goes on
    proc, tmp_path = commands[SIMULATE_SWEEP], commands.tmp / "sweep" / "simulate"
    assert proc["rc"] == 0, proc["stderr"][-2000:]
    runs = sorted(find_runs(tmp_path), key=lambda p: int(p.name.split("_")[0]))
    assert [p.name for p in runs] == [f"{k}_algorithm.safeguard={g},problem.dim=20,problem.n_samples=600,workers={m}"
                                      for k, (g, m) in enumerate((g, m) for g in ("False", "True") for m in (16, 1, 2))]
    summaries = [read_summary(p) for p in runs]
    assert [s["workers"] for s in summaries] == [16, 1, 2] * 2
    # the safeguard turns the divergence at m=16 into convergence
    assert summaries[0]["status"] == "diverged" and summaries[3]["status"] == "converged"
    one, two = summaries[4], summaries[5]
    runs = runs[4:]
    # one worker: DANE with η=1, μ=0 is one exact Newton step on the quadratic
    assert one["status"] == "converged" and one["rounds"] == 1 and one["final_suboptimality"] < 1e-12
    # two workers: the simulator defaults stop at 1e-10, with a simulated time and the calibrated cost model
    assert two["status"] == "converged" and two["final_suboptimality"] <= 1e-10 < read_rounds(runs[1])[-2]["suboptimality"]
    assert two["backend"] == "simulator" and two["simulated_time_s"] > 0
    saved = yaml.safe_load((runs[1] / "config.yaml").read_text())
    assert saved["tol_abs"] == 1e-10 and saved["tol"] is None  # absolute: conf/experiment/simulator.yaml
    assert saved["comm"]["backend"] == "local" and saved["problem"]["dim"] == 20


def test_a_sweep_run_again_into_its_folder_leaves_each_finished_run_as_it_was(commands):
    """Each job of the second sweep is refused (its folder holds a finished run) and says so on stderr; the line
    goes to ``<sweep dir>/refused/<job>.txt``, and the job's Hydra config to ``<sweep dir>/refused/<job>.hydra/``,
    not into the finished run's folder, which stays byte for byte (its .hydra/ too, though the refused config
    differs: print_every=2); the sweep names those files as refused, the folders kept (it said "2 failed",
    though nothing failed), and exits with status 2, as a refused single run does (docs/configuration.md)."""
    first, again, sweep = commands[FIRST_SWEEP], commands[SWEEP_AGAIN], commands.tmp / "sweep" / "rerun"
    assert first["rc"] == 0, first["stderr"][-2000:]
    refusals = [f"error: out_dir={sweep / job} already holds a run (rounds.jsonl, summary.json); choose a new "
                "hydra.sweep.dir, or replace it with overwrite=true (dane.fit: overwrite=True)" for job in RERUN_JOBS]
    assert again["rc"] == 2 and again["stderr"].splitlines() == refusals
    assert again["existed"] and again["unchanged"]  # job 0's folder: no error.txt beside its run
    assert [sorted(p.name for p in (sweep / job).iterdir()) for job in RERUN_JOBS] == \
        [[".hydra", "config.yaml", "rounds.jsonl", "simulate.log", "summary.json"]] * 2
    assert [(read_summary(sweep / job)["rounds"], len(read_rounds(sweep / job))) for job in RERUN_JOBS] == \
        [(1, 2), (2, 3)]  # workers=1: one exact Newton step; workers=2: the 2-round cap
    written = [sweep / "refused" / f"{job}.txt" for job in RERUN_JOBS]
    assert sorted(p.relative_to(sweep).as_posix() for p in (sweep / "refused").rglob("*")) == \
        sorted(f"refused/{job}{name}" for job in RERUN_JOBS for name in (
            ".txt", ".hydra", ".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml"))
    assert [p.read_text() for p in written] == [line + "\n" for line in refusals]
    assert f"sweep: 2 jobs (2 refused, their folders kept as they were: {written[0]}, {written[1]}) in {sweep};" \
        in again["stdout"]
    assert [p.name for p in job_dirs(sweep)] == RERUN_JOBS  # `dane figures summary`: refused/ is no job of its own
    launched = commands[LAUNCHED_AGAIN]  # under a process launcher the refusal names the sweep's setting too
    assert launched["rc"] == 2 and launched["stderr"].splitlines() == refusals[:1]
    assert launched["existed"] and launched["unchanged"]


def test_a_sweep_run_again_with_overwrite_replaces_its_runs_in_their_folders(commands):
    """docs/configuration.md: a sweep run again into its folder is refused, and adding overwrite=true replaces the
    runs.  overwrite (and progress, checkpoint_every, quiet, print_every) was part of a job folder's name, so the
    sweep made new folders beside the first's (``0_overwrite=True,...``), which `dane figures plot_runs` then
    labelled by it as if it were a hyperparameter; now the jobs replace the runs in the first's folders.  A sweep
    into out_dir='DIR/${hydra:job.num}' run again with resume=auto (and checkpoint_every, progress) runs no job, each
    run being finished, and makes no Hydra job folders beside the first's."""
    sweep, resume = commands.tmp / "sweep" / "replace", commands.tmp / "sweep" / "resume"
    runs = [commands[name] for name in (REPLACE_FIRST, REPLACED, RESUME_FIRST, RESUMED)]
    assert [run["rc"] for run in runs] == [0] * 4, "".join(run["stderr"] for run in runs)[-2000:]
    assert f"sweep: 2 jobs in {sweep};" in runs[1]["stdout"]
    assert sorted(p.name for p in sweep.iterdir()) == [*REPLACE_JOBS, "multirun.yaml"]
    assert f"sweep: 2 jobs (2 already finished, kept as they were) in {resume} " in runs[3]["stdout"]
    assert sorted(p.name for p in Path(f"{resume}.hydra").iterdir()) == [*REPLACE_JOBS, "multirun.yaml"]
    for job in REPLACE_JOBS:
        provenance = read_summary(sweep / job)["provenance"]
        overrides = yaml.safe_load((sweep / job / ".hydra" / "overrides.yaml").read_text())
        assert "overwrite=True" in overrides  # the replacing job's config, taken into the folder's .hydra/
        assert provenance["command"] == [provenance["command"][0], *overrides, f"out_dir='{sweep / job}'"]
        assert provenance["sweep_command"][1:] == [a.replace("{tmp}", str(commands.tmp)) for a in REPLACE_ARGS] + [
            "overwrite=true", "progress=none", "checkpoint_every=1", "quiet=true", "print_every=2"]


def test_an_in_process_sweep_job_records_its_own_command_and_the_sweeps_beside_it(commands):
    """A job of an in-process sweep recorded the sweep's whole ``-m`` line as its ``provenance.command``, so that a
    cell's own overrides were not there (a torchrun job records its own): now the job's overrides, as its
    .hydra/overrides.yaml has them with out_dir resolved for the job (`experiments.launchers.job_args`, as a
    launched job is given them), and the sweep's line in ``provenance.sweep_command``.  With one job and
    ``out_dir='DIR/${hydra:job.num}'`` the closing line names DIR, as docs/configuration.md says (it named DIR/0)."""
    proc, one = commands[ONE_JOB], commands.tmp / "sweep" / "one"
    assert proc["rc"] == 0, proc["stderr"][-2000:]
    assert proc["stdout"].splitlines()[-1] == (f"sweep: 1 job in {one} (Hydra's job folders: {one}.hydra); "
                                               f"summary: dane figures summary {one}")
    provenance = read_summary(one / "0")["provenance"]
    job = ["workers=2", *TINY, "rounds=2", "quiet=True"]
    assert provenance["command"] == [provenance["command"][0], *job, f"out_dir='{one / '0'}'"]
    assert "-m" not in provenance["command"] and provenance["sweep_command"][1] == "-m"
    assert provenance["sweep_command"][-2:] == [f"out_dir={one}/${{hydra:job.num}}", f"hydra.sweep.dir={one}.hydra"]


def test_a_job_that_finishes_removes_the_error_file_an_earlier_job_left_in_its_folder(commands):
    """Job 1's folder held an earlier job's refusal (error.txt) when the first sweep ran it: the job finished, and
    its folder holds its run alone; `dane figures summary` reads each job's summary, and the sweep failed no job."""
    first, sweep = commands[FIRST_SWEEP], commands.tmp / "sweep" / "rerun"
    assert first["rc"] == 0 and f"sweep: 2 jobs in {sweep};" in first["stdout"]
    assert sorted(p.name for p in (sweep / RERUN_JOBS[1]).iterdir()) == \
        [".hydra", "config.yaml", "rounds.jsonl", "simulate.log", "summary.json"]
    assert [(row["job"], row["status"]) for row in summarize(sweep)] == \
        [(RERUN_JOBS[0], "converged"), (RERUN_JOBS[1], "max_rounds")]


def test_a_failed_jobs_line_goes_into_its_folder_unless_the_folder_holds_a_run_not_its_own(tmp_path, monkeypatch):
    """`failure_file`: ``<job>/error.txt`` where the folder held no run when the job started, or holds the job's
    own records (overwrite=true replaced the run, resume=auto continued it); ``<sweep>/refused/<job>.txt`` where it
    holds a run the job did not write (files unchanged since the job started) or another run's lock.  The folder is
    the job's run folder: its out_dir where it sets one (out_dir='DIR/${hydra:job.num}'), not its job folder."""
    monkeypatch.chdir(tmp_path)
    job = tmp_path / "sweep" / "0_workers=2"
    job.mkdir(parents=True)
    refused = Path("sweep", "refused", "0_workers=2.txt")  # under the sweep folder as named (here relative)
    assert failure_file(job, "sweep", run_files(job)) == job / "error.txt"  # a job refused on bad input
    (job / "rounds.jsonl").write_text('{"round": 0}\n')
    (job / "summary.json").write_text("{}\n")
    before = run_files(job)
    assert sorted(before) == ["rounds.jsonl", "summary.json"]
    assert failure_file(job, "sweep", before) == refused  # a finished run's folder, refused
    with open(job / "rounds.jsonl", "a") as f:  # resume=auto: the job continued the run, then failed
        f.write('{"round": 1}\n')
    assert failure_file(job, "sweep", before) == job / "error.txt"
    (job / ".lock").write_text("host 42")  # another run holds it
    assert failure_file(job, tmp_path / "sweep", run_files(job)) == tmp_path / refused
    out, empty = tmp_path / "out" / "1", tmp_path / "sweep" / "1_workers=2"  # out_dir='out/${hydra:job.num}'
    for folder in (out, empty):
        folder.mkdir(parents=True)
    (out / "summary.json").write_text("{}\n")  # the job's run folder holds a finished run, its job folder none
    assert failure_file(empty, "sweep", run_files(out), out) == Path("sweep", "refused", "1_workers=2.txt")
    assert failure_file(empty, "sweep", {}, out) == empty / "error.txt"


#: a finished job's folder as its sweep left it: the run's records and Hydra's config of the job
FINISHED_JOB = {"rounds.jsonl": '{"round": 0}\n', "summary.json": '{"status": "converged"}\n',
                ".hydra/config.yaml": "workers: 2\n", ".hydra/hydra.yaml": "hydra: {}\n",
                ".hydra/overrides.yaml": "- workers=2\n"}


def write_tree(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


def tree(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


def sweep_job(sweep: Path, *overrides: str):
    """Job 0 of ``-m <overrides> hydra.sweep.dir=<sweep>`` as a launcher hands it to Hydra's `run_job`."""
    cfg = composed(*overrides, f"hydra.sweep.dir={sweep}", hydra=True)
    with read_write(cfg), open_dict(cfg):
        cfg.hydra.mode, cfg.hydra.job.num, cfg.hydra.job.id = RunMode.MULTIRUN, 0, "0"
    return cfg


def test_a_refused_job_writes_its_hydra_config_beside_its_refusal_not_over_the_finished_jobs(tmp_path, capsys):
    """A sweep run again into its folder with a setting that is no part of a job's name (print_every=2): Hydra's
    `run_job` writes the job's .hydra/ before the job runs, so it replaced the finished job's config with the
    refused one's.  ``hydra.output_subdir`` (`job_config_dir`) sends it beside the refusal's line, to
    ``<sweep>/refused/<job>.hydra/``, and the finished folder stays byte for byte."""
    from hydra._internal.callbacks import Callbacks
    from hydra.core.utils import run_job
    from hydra.types import HydraContext

    from dane.experiments import train

    sweep, name = tmp_path / "sweep", "0_problem.dim=3,problem.n_samples=60,rounds=2,workers=2"
    write_tree(sweep / name, FINISHED_JOB)
    cfg = sweep_job(sweep, "workers=2", "rounds=2", "problem.n_samples=60", "problem.dim=3", "print_every=2")
    run_job(task_function=train.main.__wrapped__, config=cfg, job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir", hydra_context=HydraContext(config_loader=None, callbacks=Callbacks()),
            configure_logging=False)
    line = (f"error: out_dir={sweep / name} already holds a run (rounds.jsonl, summary.json); choose a new "
            "hydra.sweep.dir, or replace it with overwrite=true (dane.fit: overwrite=True)")
    assert capsys.readouterr().err == line + "\n"
    assert tree(sweep / name) == FINISHED_JOB
    refused = tree(sweep / "refused")
    assert sorted(refused) == [f"{name}.hydra/config.yaml", f"{name}.hydra/hydra.yaml", f"{name}.hydra/overrides.yaml",
                               f"{name}.txt"]
    assert refused[f"{name}.txt"] == line + "\n"
    assert yaml.safe_load(refused[f"{name}.hydra/overrides.yaml"])[-1] == "print_every=2"


def test_a_jobs_hydra_config_goes_beside_its_refusal_and_in_once_it_writes_its_records(tmp_path):
    """`job_config_dir`: ``.hydra`` where the job's run folder (its out_dir, else its job folder) holds no run when
    Hydra writes the job's config, else ``<sweep>/refused/<job>.hydra`` (absolute: Hydra joins it to the job
    folder).  `settle_job_config`: a job that then wrote its own records there (overwrite=true, resume) takes it
    into its folder's .hydra/; a refused one leaves it beside its line, and a config an earlier sweep staged is
    not taken by a job whose folder held no run."""
    from dane.experiments.callbacks import job_config_dir, settle_job_config

    sweep, job, out = tmp_path / "sweep", tmp_path / "sweep" / "0_workers=2", tmp_path / "out" / "0"

    def place(mode=RunMode.MULTIRUN, out_dir=None) -> str:
        return job_config_dir(_root_=OmegaConf.create({"out_dir": out_dir, "hydra": {
            "mode": mode, "runtime": {"output_dir": str(job)}, "sweep": {"dir": str(sweep)}}}))

    staged = sweep / "refused" / "0_workers=2.hydra"
    assert [place(), place(out_dir=str(out))] == [".hydra", ".hydra"]  # nothing there yet
    write_tree(out, {"summary.json": "{}\n"})
    assert [place(), place(out_dir=str(out))] == [".hydra", str(staged)]  # out_dir='DIR/${hydra:job.num}'
    write_tree(job, FINISHED_JOB)
    assert [place(), place(RunMode.RUN)] == [str(staged), ".hydra"]
    before = run_files(job)
    write_tree(staged, {"overrides.yaml": "- workers=2\n- overwrite=true\n"})
    settle_job_config(job, sweep, before)  # refused: its config stays beside its line
    assert tree(job) == FINISHED_JOB and tree(staged) == {"overrides.yaml": "- workers=2\n- overwrite=true\n"}
    settle_job_config(job, sweep, {})  # a job that found its folder empty: not its config
    assert tree(job) == FINISHED_JOB
    (job / "rounds.jsonl").write_text('{"round": 0}\n{"round": 1}\n')  # overwrite=true: its own records
    settle_job_config(job, sweep, before)
    assert tree(job) == {"rounds.jsonl": '{"round": 0}\n{"round": 1}\n', "summary.json": FINISHED_JOB["summary.json"],
                         ".hydra/overrides.yaml": "- workers=2\n- overwrite=true\n"}
    assert not staged.exists() and not staged.parent.exists()  # no empty refused/ left in the sweep's folder


def test_a_job_that_runs_removes_an_earlier_sweeps_refusal_of_it_and_a_refused_one_keeps_it(tmp_path, capsys):
    """A sweep run again into its folder is refused (``refused/<job>.txt``); run again with ``overwrite=true`` it
    replaced the runs, but the refusal's line stayed, so the folder said the job was refused though it ran.  Now a job
    that finishes in its folder removes it (`clear_failure`), and ``refused/`` with it; a rerun refused again keeps
    its line."""
    sweep, name = tmp_path / "sweep", "0_problem.dim=3,problem.n_samples=60,rounds=2,workers=2"
    job = ("workers=2", "rounds=2", "problem.n_samples=60", "problem.dim=3", "quiet=true")
    line = (f"error: out_dir={sweep / name} already holds a run (rounds.jsonl, summary.json); choose a new "
            "hydra.sweep.dir, or replace it with overwrite=true (dane.fit: overwrite=True)\n")
    run_sweep_job(sweep_job(sweep, *job))
    refusals = []
    for _ in range(2):  # refused, then refused again
        run_sweep_job(sweep_job(sweep, *job, "print_every=2"))
        refusals.append({key: text for key, text in tree(sweep / "refused").items() if key.endswith(".txt")})
    assert refusals == [{f"{name}.txt": line}] * 2 and capsys.readouterr().err == line * 2
    run_sweep_job(sweep_job(sweep, *job, "overwrite=true"))
    assert sorted(p.name for p in sweep.iterdir()) == [name]  # no refused/ left
    assert sorted(tree(sweep / name)) == [".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml",
                                          "config.yaml", "rounds.jsonl", "summary.json"]
    assert "overwrite=true" in yaml.safe_load((sweep / name / ".hydra" / "overrides.yaml").read_text())


def test_a_jobs_failure_in_its_own_folder_removes_an_earlier_sweeps_refusal_of_it(tmp_path, monkeypatch):
    """`record_failure`: a job whose line goes into its own folder (the folder held no run, or the job wrote its
    records there and then failed) was not refused, and the line and launch log an earlier sweep's refusal left in
    ``refused/`` go; a job refused again (its folder's run not its own) writes its line there, the log kept."""
    from hydra.core.hydra_config import HydraConfig

    from dane.experiments.callbacks import record_failure

    sweep, job = tmp_path / "sweep", tmp_path / "sweep" / "0_workers=2"
    monkeypatch.setattr(HydraConfig, "get", staticmethod(lambda: OmegaConf.create(
        {"runtime": {"output_dir": str(job)}, "sweep": {"dir": str(sweep)}})))
    stale = {"0_workers=2.txt": "error: refused\n", "0_workers=2.log": "launch\n"}
    write_tree(sweep / "refused", stale)
    write_tree(job, FINISHED_JOB)
    before = run_files(job)
    assert record_failure("error: again", before) == sweep / "refused" / "0_workers=2.txt"
    assert tree(sweep / "refused") == {**stale, "0_workers=2.txt": "error: again\n"}
    (job / "rounds.jsonl").write_text('{"round": 0}\n{"round": 1}\n')  # overwrite=true: its own records, then a loss
    assert record_failure("error: worker lost", before) == job / "error.txt"
    assert not (sweep / "refused").exists() and (job / "error.txt").read_text() == "error: worker lost\n"


def test_a_sweep_whose_every_job_was_refused_puts_back_the_sweep_config_its_folder_held(tmp_path, monkeypatch):
    """Hydra's sweeper writes its multirun.yaml into the sweep folder before any job runs.  Where every job of the
    sweep was then refused (each folder held a finished run), `SweepSummary` puts back the multirun.yaml the folder
    held, byte for byte; a sweep with a job that ran, or into a folder that held none, keeps its own."""
    from dane.experiments.callbacks import SweepSummary

    monkeypatch.setattr(SweepSummary, "failed", [])
    kept = {}
    for case, held, refused in (("all_refused", True, 2), ("one_ran", True, 1), ("new_folder", False, 2)):
        sweep = tmp_path / case
        if held:
            write_tree(sweep, {"multirun.yaml": "params: {seed: 0,1}\n"})
        summary, config = SweepSummary(), OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}})
        summary.on_multirun_start(config)
        write_tree(sweep, {"multirun.yaml": "params: {seed: 0,1}\nprint_every: 2\n"})  # the sweeper's
        for k in range(2):
            write_tree(sweep, {f"refused/{k}_seed={k}.txt" if k < refused else f"{k}_seed={k}/summary.json": "x\n"})
            summary.on_job_end(config, None)
        summary.on_multirun_end(config)
        kept[case] = (sweep / "multirun.yaml").read_text()
    assert kept == {"all_refused": "params: {seed: 0,1}\n", "one_ran": "params: {seed: 0,1}\nprint_every: 2\n",
                    "new_folder": "params: {seed: 0,1}\nprint_every: 2\n"}


def sweeper_params(name: str) -> dict[str, list[str]]:
    """What ``python -m experiments.simulate -m experiment=NAME`` sweeps over."""
    cfg = composed(f"experiment={name}", name="simulate", hydra=True)
    return {key: str(values).split(",") for key, values in (cfg.hydra.sweeper.params or {}).items()}


def test_an_experiment_files_sweep_writes_every_job_into_one_folder_of_its_own(commands):
    proc, cwd = commands[EXPERIMENT_SWEEP], commands.tmp / "sweep_default"
    assert proc["rc"] == 0, proc["stderr"][-2000:]
    [sweep] = (cwd / "results" / "sweeps").iterdir()  # the launcher and every job read one (cached) sweep directory
    assert SWEEP_NAME.fullmatch(sweep.name), sweep.name
    assert f"sweep: 6 jobs in results/sweeps/{sweep.name};" in proc["stdout"]
    runs = sorted(find_runs(sweep), key=lambda p: int(p.name.split("_")[0]))
    assert [read_summary(p)["workers"] for p in runs] == [1, 2, 4, 8, 16, 64]
    assert (sweep / "multirun.yaml").exists()


def sweep_dirs(*overrides: str) -> list[str]:
    """hydra.sweep.dir of the simulator's config, composed once per override list, as Hydra resolves it."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfgs = [compose(config_name="simulate", overrides=[o], return_hydra_config=True) for o in overrides]
    return [str(cfg.hydra.sweep.dir) for cfg in cfgs]


def test_sweeps_started_in_the_same_second_get_folders_of_their_own(monkeypatch):
    # sweeps of identical or different overrides, composed one after another in the same second: one folder each
    dirs = sweep_dirs("workers=2", "workers=2", "algorithm=gd")
    assert len(set(dirs)) == 3 and all(d.startswith("results/sweeps/") for d in dirs)
    assert all(SWEEP_NAME.fullmatch(d.removeprefix("results/sweeps/")) for d in dirs), dirs
    assert sorted(reversed(dirs)) == dirs  # named by start: sorted by start
    # the same microsecond in two processes started together: the pid tells them apart
    same = datetime(2024, 5, 1, 12, 0, 0, 123456)
    monkeypatch.setattr(config, "datetime", type("Frozen", (), {"now": staticmethod(lambda: same)}))
    names = []
    for pid in (4242, 4243):
        monkeypatch.setattr(config.os, "getpid", lambda pid=pid: pid)
        names += sweep_dirs("workers=2")
    assert names == ["results/sweeps/2024-05-01_12-00-00-123456_4242", "results/sweeps/2024-05-01_12-00-00-123456_4243"]


def test_a_sweeps_folder_is_one_for_the_launcher_and_every_job():
    # resolved again, and in a job's config (Hydra copies the resolver cache into it, load_sweep_config): the same
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="simulate", overrides=["workers=1"], return_hydra_config=True)
        job = compose(config_name="simulate", overrides=["workers=2"], return_hydra_config=True)
    first = str(cfg.hydra.sweep.dir)
    OmegaConf.copy_cache(from_config=cfg, to_config=job)
    assert str(cfg.hydra.sweep.dir) == first == str(job.hydra.sweep.dir)


def test_train_multirun_goes_on_past_a_diverged_job(commands):
    proc, tmp_path = commands[TRAIN_SWEEP], commands.tmp / "sweep" / "train"
    assert proc["rc"] == 0, proc["stderr"][-2000:]
    assert "error: dane diverged" in proc["stderr"]
    statuses = [read_summary(p)["status"] for p in sorted(find_runs(tmp_path), key=lambda p: int(p.name.split("_")[0]))]
    assert statuses[0] == "diverged" and len(statuses) == 2 and statuses[1] != "diverged"


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_file_runs_shrunk(name, tmp_path):
    assert compose_job((f"experiment={name}",)).problem.name == "ridge_synthetic"
    swept = sweeper_params(name)
    # every value the experiment sweeps over passes validation with the tiny problem
    for key, values in swept.items():
        for value in values:
            spec = run_spec(compose_job((f"experiment={name}", *TINY, f"{key}={value}")))
            assert spec.problem.dim == 20 and spec.comm.simulated  # one worker too: every m on the CPU clock
    # the first point of its sweep runs, shrunk, and makes progress
    first = [f"{key}={values[0]}" for key, values in swept.items() if key != "workers"]
    cfg = compose_job((f"experiment={name}", *TINY, *first, "workers=2", "rounds=10"))
    try:
        execute(run_spec(cfg), str(tmp_path))
    except ArithmeticError:
        pass  # a fixed-μ sweep point may diverge; its records still say so below
    records = read_rounds(tmp_path)
    summary = read_summary(tmp_path)
    assert records[0]["suboptimality"] > 0
    if summary["status"] != "diverged":
        assert records[-1]["suboptimality"] < 0.1 * records[0]["suboptimality"]


def test_ensure_runs_missing_jobs_once_and_matches_by_config(tmp_path):
    jobs = grid(["algorithm=dane", *TINY], workers=[1, 2])
    first = ensure(jobs, root=tmp_path, log=None)
    assert sorted(p.name for p in first.values()) == sorted(job_name(j) for j in jobs)
    stamps = {p: (p / "summary.json").stat().st_mtime_ns for p in first.values()}
    again = ensure(jobs, root=tmp_path, log=None)  # nothing reruns
    assert again == first and all((p / "summary.json").stat().st_mtime_ns == t for p, t in stamps.items())
    index = RunIndex(tmp_path)
    # the same config spelled differently is the same run; a different seed is not
    assert index.find(("workers=2", *TINY, "algorithm=dane", "algorithm.eta=1.0")) == first[jobs[1]]
    assert index.find(("workers=2", *TINY, "seed=1")) is None
    # a stored run that stopped early does not answer a job that asks for more
    summary = read_summary(first[jobs[1]])
    job = {"tol": None, "tol_abs": 1e-10, "rounds": 200, "comm": {"backend": "local"},  # the simulator's absolute stop
           "sim": {"alpha": summary["alpha"], "beta": summary["beta"], "calibration": None}}
    assert answers(summary, job)
    assert not answers({**summary, "status": "max_rounds", "final_suboptimality": 1e-3, "rounds": 5}, job)
    assert answers({**summary, "status": "one_shot", "final_suboptimality": 1e-3, "rounds": 1}, job)  # OSA's end
    recalibrated = {**job, "sim": {"alpha": 1.0, "beta": 1.0, "calibration": None}}
    assert not answers(summary, recalibrated) and answers(summary, recalibrated, timed=False)  # same iterates
    assert not answers({**summary, "backend": "horovod"}, job)  # wall-clock times are not simulated ones


def test_each_run_of_one_process_records_its_own_timeline(tmp_path):
    """Two runs in one process (as `ensure` runs them): the second's marks are its own, after the first's, on the
    same clock; a ``config`` marked between them (a multirun's next job, configured by its entry point) is the
    second's, none the first's (`dane.loop.timeline`)."""
    timeline.end_run()  # whatever an earlier test's refused job left
    first = run_job(("algorithm=dane", "workers=2", "rounds=2", *TINY), tmp_path / "a")["timeline"]
    timeline.configured()  # the entry point of the next job (experiments/train.py marks it so)
    timeline.mark("reference")  # made between the runs (a benchmark's optimum): not the second run's
    second = run_job(("algorithm=dane", "workers=2", "rounds=2", "problem.n_samples=1200", "problem.dim=20"),
                     tmp_path / "b")["timeline"]
    assert second["clock_origin"] == first["clock_origin"]
    assert first["data"] <= first["round0"] <= first["end"] < second["config"] <= second["data"] <= \
        second["round0"] <= second["end"]
    assert "config" not in first and "reference" not in second  # run_job's run has no entry point of its own
    assert read_summary(tmp_path / "b")["timeline"] == second


def test_a_run_made_for_a_figure_records_the_command_that_makes_it(tmp_path):
    """`run_job`'s run (as `make figures` makes it) names ``dane simulate`` with its overrides and folder, which
    compose to the config it saved, not the command of the process that made it."""
    job = ("algorithm=dane", "workers=2", "rounds=2", *TINY)
    before = run_command()
    run_job(job, tmp_path / "run")
    command = read_summary(tmp_path / "run")["provenance"]["command"]
    assert command == ["dane", "simulate", *job, f"out_dir={tmp_path / 'run'}", "quiet=true"]
    assert composed_job(tuple(command[2:])) == yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert run_command() == before  # the process's own again


def test_identity_ignores_output_settings():
    base = {"algorithm": {"name": "dane"}, "problem": {"dim": 5}, "workers": None, "seed": 0, "dtype": "float64",
            "sim": {"slowdown": [1], "delay_mean": 0.0, "seed": 0}, "out_dir": "a", "quiet": True}
    other = {**base, "out_dir": "b", "quiet": False, "workers": 1, "sim": {**base["sim"], "slowdown": [1.0]}}
    assert identity(base) == identity(other)
    assert identity(base) != identity({**base, "seed": 1})


def test_identity_ignores_where_the_data_is():
    base = {"algorithm": {"name": "dane"}, "workers": 2, "seed": 0, "dtype": "float32",
            "sim": {"slowdown": [1], "delay_mean": 0.0, "seed": 0},
            "problem": {"name": "mnist_lenet5", "data": {"dataset": "mnist", "data_dir": "../shared/data"}}}
    moved = {**base, "problem": {**base["problem"], "data": {"dataset": "mnist", "data_dir": "/work/shared/data"}}}
    other = {**base, "problem": {**base["problem"], "data": {"dataset": "digits", "data_dir": "../shared/data"}}}
    assert identity(base) == identity(moved)
    assert identity(base) != identity(other)


def test_the_closing_line_names_the_folder_of_the_jobs_runs_where_they_set_out_dir(tmp_path, monkeypatch, capsys):
    """With ``out_dir='DIR/${hydra:job.num}'`` a job folder holds only Hydra's config and log: the closing line names
    DIR, which holds every job's run, and its ``dane figures summary DIR`` lists them; without out_dir, the sweep
    folder as before."""
    from dane.experiments.callbacks import SweepSummary

    monkeypatch.setattr(SweepSummary, "failed", [])
    sweep, runs = tmp_path / "sweepH.hydra", tmp_path / "sweepH"
    lines = []
    for out_dir in (None, str(runs / "{k}")):
        summary = SweepSummary()
        summary.on_multirun_start(OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}}))
        for k in range(2):
            job = {"hydra": {"runtime": {"output_dir": str(sweep / f"{k}_seed={k}")}, "sweep": {"dir": str(sweep)}},
                   "out_dir": out_dir and out_dir.format(k=k)}
            write_tree(Path(job["out_dir"] or job["hydra"]["runtime"]["output_dir"]), FINISHED_JOB)
            summary.on_job_end(OmegaConf.create(job), None)
        summary.on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}}))
        lines.append(capsys.readouterr().out)
    assert lines == [f"sweep: 2 jobs in {sweep}; summary: dane figures summary {sweep}\n",
                     f"sweep: 2 jobs in {runs} (Hydra's job folders: {sweep}); summary: dane figures summary {runs}\n"]
    assert [(row["job"], row["status"]) for row in summarize(runs)] == [("0", "converged"), ("1", "converged")]


def run_sweep_job(cfg) -> None:
    """``cfg`` (`sweep_job`) through Hydra's `run_job`, as the basic launcher runs a job of a sweep."""
    from hydra._internal.callbacks import Callbacks
    from hydra.core.utils import run_job
    from hydra.types import HydraContext

    from dane.experiments import train

    run_job(task_function=train.main.__wrapped__, config=cfg, job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir", hydra_context=HydraContext(config_loader=None, callbacks=Callbacks()),
            configure_logging=False)


def test_a_sweep_rerun_with_resume_auto_counts_a_finished_job_as_finished_and_leaves_its_run(tmp_path, monkeypatch,
                                                                                          capsys):
    """A sweep run again with ``resume=auto out_dir='DIR/${hydra:job.num}'`` (its restart, docs/faults.md): a job
    whose out_dir holds the finished run of its config (up to display and checkpoint keys: print_every=2,
    checkpoint_every=1) does not run; one line says so, the run stays byte for byte, nothing goes to refused/, and
    `SweepSummary` counts it as finished, not failed.  Another config (problem.lam) is refused as before (a single
    run there is refused too, as docs/faults.md says: experiments.train asks `finished_run` only in a sweep)."""
    from dane.experiments.callbacks import SweepSummary
    from dane.loop.resume import finished_run

    monkeypatch.setattr(SweepSummary, "kept", [])
    monkeypatch.setattr(SweepSummary, "failed", [])
    summary = SweepSummary()
    sweep, out = tmp_path / "sweep.hydra", tmp_path / "runs" / "0"
    job = ("workers=2", "rounds=2", "problem.n_samples=60", "problem.dim=3", "resume=auto", f"out_dir={out}", "quiet=true")
    run_sweep_job(sweep_job(sweep, *job))
    assert read_summary(out)["status"] == "max_rounds" and capsys.readouterr().err == ""
    held = tree(out)
    run_sweep_job(sweep_job(sweep, *job, "print_every=2", "checkpoint_every=1"))
    assert capsys.readouterr().out.splitlines()[-1] == \
        f"resume=auto: {out} holds the finished run of this config (max_rounds after 2 rounds); nothing to do, kept as it was"
    assert tree(out) == held and not (sweep / "refused").exists()
    [kept] = SweepSummary.kept
    assert kept == sweep / "0_problem.dim=3,problem.n_samples=60,rounds=2,workers=2"  # the first's job folder: the
    # keys that change no result (resume, out_dir, quiet, print_every, checkpoint_every) are no part of its name
    run_sweep_job(sweep_job(sweep, *job, "problem.lam=0.5"))
    assert capsys.readouterr().err == (f"error: out_dir={out} already holds a run (rounds.jsonl, summary.json); choose a "
                                       "new out_dir, or replace it with overwrite=true (dane.fit: overwrite=True)\n")
    assert tree(out) == held and len(SweepSummary.kept) == 1
    again, other = composed(*job), composed(*job, "problem.lam=0.5")
    assert finished_run(again) is not None and finished_run(other) is None
    summary.jobs = 3
    summary.on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}}))
    [refused] = (sweep / "refused").glob("*.txt")
    assert capsys.readouterr().out == (f"sweep: 3 jobs (1 already finished, kept as it was; 1 refused, its folder kept "
                                       f"as it was: {refused}) in {sweep}; summary: dane figures summary {sweep}\n")
