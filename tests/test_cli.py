"""The entry point as a user meets it: bad input gets one line and a non-zero exit, before any process group."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from dane.comm.horovod import COMPUTE_BOUND_CYCLE_MS, LATENCY_BOUND_CYCLE_MS
from dane.records.results import read_rounds, read_summary
import runs
from helpers import env, train, unused_pid

SMALL = ["problem.n_samples=600", "problem.dim=20", "rounds=3", "quiet=true"]


# The one-line refusals of bad values (eta, mu, booleans, choices, ...) are rows of tests/test_bad_input.py's
# table, run in one process there.


PLAIN = runs.command("cli:plain", *SMALL, "tol=1e-12", "out_dir={tmp}/cli/plain")
DIVERGING = runs.command("cli:diverging", "problem.n_samples=6000", "workers=8", "algorithm.safeguard=false", "rounds=40",
                         "quiet=true", "out_dir={tmp}/cli/diverging")


def test_plain_python_runs_one_worker_and_writes_the_schema(commands):
    proc, tmp_path = commands[PLAIN], commands.tmp / "cli" / "plain"
    assert proc["rc"] == 0, proc["stderr"]
    summary = read_summary(tmp_path)
    assert summary["workers"] == 1 and summary["backend"] == "local"
    assert summary["status"] == "converged" and summary["rounds"] == 1  # one worker: DANE is Newton's method
    assert summary["final_suboptimality"] <= 1e-12
    assert summary["total_bytes"] == 0
    for key in ("algorithm", "problem", "workers", "rounds", "final_objective", "final_suboptimality",
                "total_bytes", "wall_time_s"):
        assert key in summary
    records = read_rounds(tmp_path)
    for key in ("round", "time_s", "bytes_sent", "objective", "suboptimality", "grad_norm"):
        assert key in records[0]
    assert (tmp_path / "config.yaml").exists()


def test_diverging_run_keeps_its_results_and_exits_3(commands):
    proc, tmp_path = commands[DIVERGING], commands.tmp / "cli" / "diverging"
    assert proc["rc"] == 3
    assert proc["stderr"].strip().splitlines()[-1].startswith("error: dane diverged at round")
    assert read_summary(tmp_path)["status"] == "diverged"
    assert len(read_rounds(tmp_path)) >= 2


def test_round_table_shows_admm_residuals_from_the_first_round():
    import io

    from dane.baselines import ADMM
    from dane.loop.progress import RoundTable

    out = io.StringIO()
    table = RoundTable(stream=out, algorithm=ADMM)  # the columns ADMM declares, residuals shown with rho
    table({"round": 0, "time_s": 0.0, "bytes_sent": 0, "objective": 2.0, "rho": 1.0})
    table({"round": 1, "time_s": 0.1, "bytes_sent": 4096, "objective": 1.5, "rho": 1.0,
           "primal_residual": 0.25, "dual_residual": 3.0})
    header, first, second = out.getvalue().splitlines()
    assert header.split() == ["round", "time_s", "bytes_sent", "objective", "rho", "primal_residual", "dual_residual"]
    assert len(first.split()) == 5 and second.split()[-2:] == ["2.500e-01", "3.000e+00"]


def test_round_table_shows_the_columns_the_algorithm_declares():
    import io

    from dane.algorithm import Algorithm
    from dane.dane import DANE
    from dane.loop.progress import RoundTable

    record = {"round": 0, "time_s": 0.0, "bytes_sent": 0, "objective": 2.0, "mu": 0.5, "test_accuracy": 0.75}
    for algorithm, header in ((DANE, ["round", "time_s", "bytes_sent", "objective", "mu", "test_accuracy"]),
                              (Algorithm, ["round", "time_s", "bytes_sent", "objective", "test_accuracy"])):
        out = io.StringIO()
        RoundTable(stream=out, algorithm=algorithm)(record)
        assert out.getvalue().splitlines()[0].split() == header


def run_in(folder, *overrides: str) -> subprocess.CompletedProcess:
    """``python -m experiments.train`` started in ``folder`` (the package found through PYTHONPATH)."""
    return subprocess.run([sys.executable, "-m", "experiments.train", *overrides], cwd=folder, env=env(),
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_rejected_input_and_out_dir_leave_no_other_folder(tmp_path):
    assert run_in(tmp_path, "algorithm.mu=-1").returncode == 2
    assert list(tmp_path.iterdir()) == []  # no Hydra folder for a rejected run
    assert run_in(tmp_path, *SMALL, "out_dir=mine").returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["config.yaml", "rounds.jsonl", "summary.json"]


@pytest.mark.slow
def test_default_run_directories_are_unique_for_runs_started_together(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-m", "experiments.train", *SMALL], cwd=tmp_path, env=env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(2)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    runs = sorted((tmp_path / "results" / "runs").iterdir())
    assert len(runs) == 2 and all(len(read_rounds(run)) == 4 for run in runs)  # rounds 0..3, nothing mixed


@pytest.mark.slow
def test_an_invalid_job_is_recorded_and_the_sweep_goes_on(tmp_path):
    proc = run_in(tmp_path, "-m", "algorithm.mu=-1,0.0", *SMALL, "hydra.sweep.dir=sweep")
    assert proc.returncode == 2, proc.stderr  # every job ran; the status says one was refused
    bad, good = sorted((tmp_path / "sweep").glob("[01]_*"))
    assert (bad / "error.txt").read_text() == "error: algorithm.mu must be >= 0, got -1\n"
    assert read_summary(good)["rounds"] == 3
    assert f"sweep: 2 jobs (1 failed: sweep/{bad.name}/error.txt) in sweep;" in proc.stdout


@pytest.mark.slow
def test_a_second_run_into_a_finished_run_directory_is_refused_unless_overwrite(tmp_path):
    assert train(*SMALL, f"out_dir={tmp_path}").returncode == 0
    before = (tmp_path / "rounds.jsonl").read_bytes(), (tmp_path / "summary.json").read_bytes()
    proc = train(*SMALL, "rounds=2", f"out_dir={tmp_path}")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"error: out_dir={tmp_path} already holds a run (rounds.jsonl, summary.json); choose a new out_dir, "
        "or replace it with overwrite=true (dane.fit: overwrite=True)"]  # no checkpoint: resume= could not continue it
    assert ((tmp_path / "rounds.jsonl").read_bytes(), (tmp_path / "summary.json").read_bytes()) == before
    assert train(*SMALL, "rounds=2", "overwrite=true", f"out_dir={tmp_path}").returncode == 0
    assert [r["round"] for r in read_rounds(tmp_path)] == [0, 1, 2]  # replaced, not appended
    assert not (tmp_path / ".lock").exists()


def test_a_run_directory_in_use_is_refused_and_a_dead_runs_lock_is_taken_over(tmp_path):
    import os
    import socket

    from dane.errors import ConfigError
    from dane.records.results import RunWriter

    writer = RunWriter(tmp_path / "run")
    with pytest.raises(ConfigError, match=f"is in use by another run \\({socket.gethostname()} pid {os.getpid()}\\)"):
        RunWriter(tmp_path / "run", overwrite=True)
    writer.close()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / ".lock").write_text(f"{socket.gethostname()} {unused_pid()}")
    RunWriter(tmp_path / "other").close()  # its owner has exited: the lock is stale
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="is a file, not a directory"):
        RunWriter(tmp_path / "file")


@pytest.mark.parametrize("overrides, cycle_ms", [
    (("problem=ridge_synthetic",), LATENCY_BOUND_CYCLE_MS),                         # auto, convex
    (("problem=digits_mlp",), COMPUTE_BOUND_CYCLE_MS),                             # auto, a network
    (("problem=digits_mlp", "comm.horovod_cycle_time_ms=0.5"), 0.5),               # a number is kept
])
def test_horovod_cycle_time_auto_is_short_for_convex_problems_and_long_for_networks(overrides, cycle_ms):
    from dane.experiments.config import run_spec
    from helpers import composed

    assert run_spec(composed(*overrides)).comm.horovod.cycle_time_ms == cycle_ms


def test_a_run_holds_its_directory_until_its_summary_is_written(tmp_path, monkeypatch):
    # Between closing rounds.jsonl and writing summary.json the lock must stay: a second run with
    # overwrite=true taking the directory in that gap would delete these rounds and get this run's summary.
    import dane
    from dane.records.results import RunWriter

    held = []
    write_summary = RunWriter.write_summary

    def spy(self, summary):
        held.append((self.out_dir / ".lock").exists())
        write_summary(self, summary)

    monkeypatch.setattr(RunWriter, "write_summary", spy)
    X = np.random.default_rng(0).standard_normal((40, 3))
    dane.fit(dane.problems.Ridge(X, X @ np.ones(3), lam=0.1), "gd", workers=2, rounds=2, out_dir=str(tmp_path / "r"))
    assert held == [True]
    assert not (tmp_path / "r" / ".lock").exists()


def test_the_single_runs_hydra_overrides_join_the_users_overrides():
    """Hydra reads its overrides as one run of positional arguments: the ones a single run adds go right after the
    user's last override, so that an option typed after them (``rounds=1 --config-name x``) splits nothing."""
    from dane.experiments.train import beside_overrides

    assert beside_overrides(["rounds=1", "--config-name", "x"], ["a=1"]) == ["rounds=1", "a=1", "--config-name", "x"]
    assert beside_overrides(["--config-name", "x", "rounds=1"], ["a=1"]) == ["--config-name", "x", "rounds=1", "a=1"]
    assert beside_overrides(["--config-name", "x"], ["a=1"]) == ["--config-name", "x", "a=1"]
    assert beside_overrides([], ["a=1"]) == ["a=1"]


def test_a_command_collects_once_at_exit_then_freezes_what_is_left(monkeypatch):
    """The dane command and experiments.train's cli (python -m, a launched worker) register `collect_then_freeze`
    at exit: a garbage cycle is finalized, as at any shutdown, and every object left is frozen, so that the
    collections of CPython's shutdown pass over none of them (the older generations are empty)."""
    import atexit
    import gc

    from dane.experiments import cli, train

    registered = []
    monkeypatch.setattr(atexit, "register", registered.append)
    monkeypatch.setattr(atexit, "unregister", lambda function: None)
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    monkeypatch.setattr(sys, "argv", ["dane train"])
    train.cli(lambda: None)
    assert registered == [cli.collect_then_freeze, cli.collect_then_freeze]

    finalized = []

    class Cycle:
        def __del__(self):
            finalized.append(True)

    cycle = Cycle()
    cycle.itself = cycle
    del cycle
    gc.disable()  # no collection of the youngest generation moves an object into an older one while we count
    try:
        cli.collect_then_freeze()
        older = [len(gc.get_objects(generation)) for generation in (1, 2)]
        frozen = gc.get_freeze_count()
    finally:
        gc.unfreeze()
        gc.enable()
    assert finalized == [True]
    assert older == [0, 0] and frozen > 0


def test_a_sigterm_in_a_plain_runs_imports_is_one_line_and_status_143(monkeypatch, capsys):
    """`dane simulate ...` (or python -m dane.experiments.cli) SIGTERMed in its first second, while it imports torch
    and Hydra, ended silently with status 143: the run's own handling (`dane.loop.faults.sigterm_as_ctrl_c`) was not
    set yet.  The entry point now takes SIGTERM as a Ctrl-C from before the module's imports (the module's run, as
    `runpy` starts it, replaced here by one that is SIGTERMed at once), and puts the previous handler back; under a
    launcher it leaves SIGTERM to the launched worker (`dane.comm.launcher_signals`)."""
    import os
    import runpy
    import signal
    import time

    from dane.experiments import cli
    from dane.records import provenance

    def not_taken(signum, frame):
        raise AssertionError("the entry point did not take SIGTERM")

    def sigtermed(module, **kwargs):  # the module's imports, SIGTERMed
        assert signal.getsignal(signal.SIGTERM) is not not_taken
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises here
        raise AssertionError("SIGTERM was not taken")

    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(provenance, "_entry_command", provenance._entry_command)  # the command main records
    monkeypatch.setattr(provenance, "_entry_prog", provenance._entry_prog)
    monkeypatch.setattr(runpy, "run_module", sigtermed)
    for name in ("HOROVOD_RANK", "RANK", "TORCHELASTIC_RUN_ID", "SLURM_STEP_ID"):
        monkeypatch.delenv(name, raising=False)
    previous = signal.signal(signal.SIGTERM, not_taken)  # not Python's default: that would end pytest
    try:
        with pytest.raises(SystemExit) as stopped:
            cli.main(["simulate", "workers=2"])
        assert signal.getsignal(signal.SIGTERM) is not_taken  # put back
        monkeypatch.setenv("HOROVOD_RANK", "1")  # a launched worker: untouched
        seen = []
        monkeypatch.setattr(runpy, "run_module", lambda module, **kwargs: seen.append(signal.getsignal(signal.SIGTERM)))
        cli.main(["train", "algorithm=gd"])
        assert seen == [not_taken] and signal.getsignal(signal.SIGTERM) is not_taken
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert stopped.value.code == 143 and capsys.readouterr().err == "dane simulate: interrupted by SIGTERM\n"
