"""``hydra/launcher=horovod|torchrun``: each job of a ``-m`` sweep is a real ``-np <workers>`` launch.

The launched sweeps (slow: two or more launches each, about 20 s apiece on 2 cores) check
that each job ran with its own number of processes on the right backend, gave the
in-process simulator's iterates, recorded its launch command, and that a failed job is
recorded as failed while the sweep goes on.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher
from omegaconf import OmegaConf

from dane.records.results import find_runs, read_rounds, read_summary
from dane.experiments.config import CONF_DIR
from dane.experiments.launchers import ERROR_LINE, quote
from helpers import REPO, composed, env, horovodrun, torchrun, train
import runs

SMALL = ["algorithm=dane", "problem=ridge_synthetic", "problem.n_samples=2000", "problem.dim=50", "rounds=5"]
LAUNCHERS = {"horovod": ("horovodrun", "horovod", horovodrun), "torchrun": ("torchrun", "torch", torchrun)}


def test_the_launchers_are_hydra_plugins_and_compose():
    found = {f"{c.__module__}.{c.__name__}" for c in Plugins.instance().discover(Launcher)}
    assert {"hydra_plugins.dane_launchers.HorovodLauncher", "hydra_plugins.dane_launchers.TorchrunLauncher"} <= found
    for name, cls in (("horovod", "HorovodLauncher"), ("torchrun", "TorchrunLauncher")):
        cfg = composed(f"hydra/launcher={name}", hydra=True)
        assert cfg.hydra.launcher._target_ == f"hydra_plugins.dane_launchers.{cls}"
        assert list(cfg.hydra.launcher.extra_args) == [] and cfg.hydra.launcher.timeout_s is None


def test_a_job_directory_passes_as_one_override_value():
    job_dir = "/tmp/sweep/3_algorithm.mu=0.1,problem.dim=50,workers=2"
    parsed = OverridesParser.create().parse_override(f"out_dir={quote(job_dir)}")
    assert parsed.key_or_group == "out_dir" and parsed.value() == job_dir
    quoted = quote("/tmp/it's")
    assert OverridesParser.create().parse_override(f"out_dir={quoted}").value() == "/tmp/it's"


def test_the_programs_error_line_is_found_under_either_launcher():
    lines = ["[1]<stderr>:error: algorithm.mu must be >= 0, got -1", "error: workers=3 but the launcher started 2",
             "RuntimeError: Horovod detected that one or more processes exited", "[0]<stdout>:round  time_s"]
    assert [m.group(1) for line in lines if (m := ERROR_LINE.match(line))] == [
        "error: algorithm.mu must be >= 0, got -1", "error: workers=3 but the launcher started 2"]


#: what the fake launcher prints: a rank's output, its error line, then horovodrun's own report of the exit
SAID = ["[0]<stdout>:round 0", "[0]<stderr>:error: algorithm.mu must be >= 0, got -1",
        "Traceback (most recent call last):", "RuntimeError: Horovod detected that one or more processes exited"]


def launcher_report(tmp) -> dict:
    """In the session's fresh interpreter (tests/runs.py): `HorovodLauncher._run` on a fake launcher (``python -c``)
    that prints `SAID` and exits 2, its job folder ``tmp/launcher_report``: {status, tail, shown (what it wrote to
    stdout, by line)}."""
    import contextlib
    import io

    from dane.experiments.launchers import LOG_FILE, HorovodLauncher

    code = "import sys; print(*sys.argv[1:], sep='\\n'); sys.exit(2)"
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        status, tail = HorovodLauncher()._run([sys.executable, "-c", code, *SAID], tmp / "launcher_report" / LOG_FILE)
    return {"status": status, "tail": tail, "shown": shown.getvalue().splitlines()}


LAUNCHER_REPORT = runs.job("sweep_launchers:launcher_report", "test_sweep_launchers:launcher_report")


def test_after_a_ranks_error_line_the_launchers_own_report_goes_to_the_log_only(fresh):
    """horovodrun follows a rank's one line with its own 20-line traceback of the exit: kept in launch.log, not shown
    (the sweep's line for the job repeats the error)."""
    from dane.experiments.launchers import LOG_FILE

    done = fresh["jobs"][LAUNCHER_REPORT]
    assert "ok" in done, done.get("error")
    status, tail, shown = (done["ok"][k] for k in ("status", "tail", "shown"))
    assert status == 2 and tail == SAID
    assert shown == SAID[:2]
    assert (fresh.tmp / "launcher_report" / LOG_FILE).read_text().splitlines()[1:] == SAID


def test_a_launched_job_refused_for_its_finished_run_leaves_the_run_as_it_was(tmp_path, monkeypatch, capsys):
    """A sweep run again into its folder under hydra/launcher=torchrun: the launched program refuses the job's
    folder (exit 2; its summary.json is the finished run's, not one this launch wrote), so the job is a failure
    whose line goes to ``<sweep>/refused/<job>.txt``; a launch that diverged (exit 3, a summary it wrote) is a
    result, as before."""
    from dane.experiments import launchers
    from dane.experiments.callbacks import SWEEP_OUT_DIR_ENV
    from dane.records.provenance import SWEEP_COMMAND_ENV, run_command

    sweep_dir, job = tmp_path, tmp_path / "0_workers=2"
    job.mkdir()
    (job / "summary.json").write_text('{"status": "converged"}\n')
    hydra = OmegaConf.create({"runtime": {"output_dir": str(job)}, "sweep": {"dir": str(sweep_dir)},
                              "overrides": {"task": ["workers=2"]}})
    monkeypatch.setattr(launchers.HydraConfig, "get", staticmethod(lambda: hydra))
    monkeypatch.setattr(launchers, "main_module", lambda: "experiments.train")
    line = f"error: out_dir={job} already holds a run (summary.json); choose a new hydra.sweep.dir, or replace it ..."
    launcher = launchers.TorchrunLauncher()
    given = {}
    monkeypatch.setattr(launcher, "_run", lambda cmd, logged, env: (given.update(env), (2, [line]))[1])
    assert launcher.launch_job(OmegaConf.create({"workers": 2, "out_dir": None})) == 2
    assert given.pop(SWEEP_OUT_DIR_ENV) == str(job)  # the launched run's refusal names hydra.sweep.dir
    assert given == {SWEEP_COMMAND_ENV: json.dumps(run_command())}  # the sweep's command, its provenance.sweep_command
    assert capsys.readouterr().err == line + "\n"
    assert sorted(p.relative_to(sweep_dir).as_posix() for p in sweep_dir.rglob("*") if p.is_file()) == \
        ["0_workers=2/summary.json", "refused/0_workers=2.txt"]
    assert (sweep_dir / "refused" / "0_workers=2.txt").read_text() == line + "\n"

    def diverged(cmd, logged, env):
        (job / "summary.json").write_text('{"status": "diverged"}\n')
        return 3, ["error: dane diverged ..."]

    (sweep_dir / "refused" / "0_workers=2.txt").unlink()
    monkeypatch.setattr(launcher, "_run", diverged)
    assert launcher.launch_job(OmegaConf.create({"workers": 2, "out_dir": None})) == 3  # as with overwrite=true
    assert sorted(p.name for p in sweep_dir.rglob("*") if p.is_file()) == ["summary.json"]


def test_a_job_whose_program_is_no_module_fails_with_its_line(tmp_path, monkeypatch, capsys):
    """The program run as a script (``__main__`` without a module spec): `main_module`'s refusal was raised outside
    `launch_job`'s guarded block, so Hydra showed a traceback; the job fails with its one line (exit 2) and launches
    nothing."""
    import types

    from dane.experiments import launchers

    job = tmp_path / "0_workers=2"
    hydra = OmegaConf.create({"runtime": {"output_dir": str(job)}, "sweep": {"dir": str(tmp_path)},
                              "overrides": {"task": ["workers=2"]}})
    monkeypatch.setattr(launchers.HydraConfig, "get", staticmethod(lambda: hydra))
    monkeypatch.setitem(sys.modules, "__main__", types.SimpleNamespace(__spec__=None))
    launcher = launchers.TorchrunLauncher()
    monkeypatch.setattr(launcher, "_run", lambda cmd, logged, env: pytest.fail(f"launched {cmd}"))
    assert launcher.launch_job(OmegaConf.create({"workers": 2, "out_dir": None})) == 2
    line = ("error: the horovod and torchrun sweep launchers start the program as a module: run it as dane train "
            "(or dane simulate, python -m experiments.train)")
    assert capsys.readouterr().err == line + "\n"


class Launch:
    """`subprocess.Popen` for `ProcessLauncher._run`, without a process: the launched program writes ``writes``
    (path -> text), prints ``lines`` and exits with ``status``; ``env`` is the environment it was given."""

    def __init__(self, lines: list[str], status: int, writes: dict | None = None):
        self.lines, self.status, self.writes, self.env = lines, status, writes or {}, None

    def __call__(self, cmd, *, env, **kwargs):
        self.env = env
        for path, text in self.writes.items():
            Path(path).write_text(text)
        self.stdout = iter([line + "\n" for line in self.lines])
        return self

    def wait(self) -> int:
        return self.status


class Stopping(Launch):
    """`Launch` whose launcher runs until it is signalled (its output then ends, as a launcher that stops its
    workers and exits), or whose output reading raises KeyboardInterrupt (``interrupt``: Ctrl-C in the sweep);
    ``events`` is what `ProcessLauncher._run` did to it, with ``os.killpg`` (patched by ``watch``) in order."""

    pid = 4242

    def __init__(self, interrupt: bool = False):
        super().__init__([], -15)
        self.interrupt, self.events, self.signalled = interrupt, [], threading.Event()

    def __call__(self, cmd, *, env, **kwargs):
        super().__call__(cmd, env=env, **kwargs)
        self.stdout = self.output()
        return self

    def output(self):
        yield "started\n"
        if self.interrupt:
            raise KeyboardInterrupt
        self.signalled.wait(timeout=30)

    def send_signal(self, sig) -> None:
        self.events.append(("signal", sig))
        self.signalled.set()

    def wait(self, timeout=None) -> int:
        self.events.append(("wait", timeout))
        return self.status

    def watch(self, monkeypatch, launchers) -> None:
        monkeypatch.setattr(launchers.subprocess, "Popen", self)
        monkeypatch.setattr(launchers.os, "killpg", lambda pid, sig: self.events.append(("killpg", pid, sig)))


@pytest.mark.parametrize("how", ["interrupt", "timeout"])
def test_a_stopped_launch_is_sent_sigterm_then_its_group_sigkill(how, tmp_path, monkeypatch):
    """On Ctrl-C in the sweep, or past hydra.launcher.timeout_s, the launcher gets SIGTERM first and up to
    `STOP_GRACE_S` to exit, then its process group SIGKILL.  torchrun's agent starts each worker in a session of
    its own: SIGKILLed at once, as before, torchrun left its workers running, writing the job's run to the end and
    holding its folder, where on SIGTERM it stops them before it exits."""
    import signal

    from dane.experiments import launchers

    launch = Stopping(interrupt=how == "interrupt")
    launch.watch(monkeypatch, launchers)
    launcher = launchers.TorchrunLauncher(timeout_s=0.05 if how == "timeout" else None)
    if how == "interrupt":
        with pytest.raises(KeyboardInterrupt):
            launcher._run(["torchrun"], tmp_path / "launch.log")
    else:
        assert launcher._run(["torchrun"], tmp_path / "launch.log")[0] == launchers.TIMED_OUT
    stop = launch.events.index(("signal", signal.SIGTERM))
    assert launch.events[stop:stop + 3] == [("signal", signal.SIGTERM), ("wait", launchers.STOP_GRACE_S),
                                            ("killpg", Stopping.pid, signal.SIGKILL)]
    assert (tmp_path / "launch.log").read_text().splitlines() == ["torchrun", "started"]


class Terminated(Stopping):
    """`Stopping` whose sweep gets SIGTERM while the launch runs: the handler the sweep holds then is called, as the
    signal would call it (no signal is sent)."""

    def output(self):
        import signal

        yield "started\n"
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler), f"SIGTERM's handler during a launch: {handler!r}"  # the default ends the sweep alone
        handler(signal.SIGTERM, None)


def test_a_sigterm_to_the_sweep_stops_the_launch_and_ends_the_sweep_with_its_own_line_and_143(tmp_path, monkeypatch,
                                                                                             capsys):
    """A SIGTERM (a kill, a scheduler's time limit) during a launch is taken as a Ctrl-C (`sigterm_as_ctrl_c`): the
    launch is stopped as on a Ctrl-C, and the sweep ends with status 143 and a line naming SIGTERM and the log (a
    Ctrl-C's KeyboardInterrupt goes on to the cli's own line); the handler before the launch is back after it."""
    import signal

    from dane.experiments import launchers
    from dane.loop.faults import RunInterrupted

    before = signal.getsignal(signal.SIGTERM)
    launch = Terminated()
    launch.watch(monkeypatch, launchers)
    with pytest.raises(KeyboardInterrupt) as stopped:  # a RunInterrupted is one; a bare one would stop pytest
        launchers.TorchrunLauncher()._run(["torchrun"], tmp_path / "launch.log")
    line = f"interrupted by SIGTERM; the running job's launch was stopped, its output is in {tmp_path / 'launch.log'}"
    assert stopped.type is RunInterrupted and (stopped.value.code, str(stopped.value)) == (143, line)
    assert capsys.readouterr().err.splitlines()[-1] == line
    stop = launch.events.index(("signal", signal.SIGTERM))
    assert launch.events[stop:stop + 3] == [("signal", signal.SIGTERM), ("wait", launchers.STOP_GRACE_S),
                                            ("killpg", Stopping.pid, signal.SIGKILL)]
    assert signal.getsignal(signal.SIGTERM) is before


def launched_job(monkeypatch, job: Path, files: dict[str, str], overrides: list[str]):
    """The torchrun launcher, Hydra's current job ``job`` (under the sweep folder ``job.parent``, its ``overrides``)
    holding ``files`` (name -> text); returns the launcher and a function of the job's launch command."""
    from omegaconf import OmegaConf

    from dane.experiments import launchers

    for name, text in files.items():
        (job / name).parent.mkdir(parents=True, exist_ok=True)
        (job / name).write_text(text)
    hydra = OmegaConf.create({"runtime": {"output_dir": str(job)}, "sweep": {"dir": str(job.parent)},
                              "overrides": {"task": overrides}})
    monkeypatch.setattr(launchers.HydraConfig, "get", staticmethod(lambda: hydra))
    monkeypatch.setattr(launchers, "main_module", lambda: "experiments.train")
    launcher = launchers.TorchrunLauncher()
    return launcher, " ".join(launcher.command("experiments.train", [*overrides, f"out_dir={quote(str(job))}"], 2))


def tree(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_refused_launch_leaves_the_finished_runs_launch_log_and_writes_its_own_beside_its_refusal(
        tmp_path, monkeypatch, capsys):
    """A sweep run again into its folder under hydra/launcher=torchrun: the job's folder holds a finished run with
    its launch.log.  The refused launch's output goes to ``<sweep>/refused/<job>.log``, beside its line, and the
    folder stays byte for byte; the launched run is told that the sweep chose its out_dir (its refusal then names
    hydra.sweep.dir).  With overwrite=true the launch writes its records into the folder, and its output is then
    the folder's launch.log; the refusal's line leaves refused/, the job having run."""
    from dane.experiments import launchers
    from dane.experiments.callbacks import SWEEP_OUT_DIR_ENV

    sweep_dir, job = tmp_path, tmp_path / "0_workers=2"
    finished = {"rounds.jsonl": '{"round": 0}\n', "summary.json": '{"status": "converged"}\n',
                "launch.log": "torchrun ... workers=2\nround 0\n", ".hydra/overrides.yaml": "- workers=2\n"}
    launcher, cmd = launched_job(monkeypatch, job, finished, ["workers=2"])
    line = f"error: out_dir={job} already holds a run (rounds.jsonl, summary.json); choose a new hydra.sweep.dir, ..."
    launch = Launch([line], 2)
    monkeypatch.setattr(launchers.subprocess, "Popen", launch)
    assert launcher.launch_job(OmegaConf.create({"workers": 2, "out_dir": None})) == 2
    assert tree(job) == finished
    assert tree(sweep_dir / "refused") == {"0_workers=2.log": f"{cmd}\n{line}\n", "0_workers=2.txt": f"{line}\n"}
    assert launch.env[SWEEP_OUT_DIR_ENV] == str(job)
    assert capsys.readouterr().err == line + "\n"

    launcher, cmd = launched_job(monkeypatch, job, {}, ["workers=2", "overwrite=true"])
    replaced = {"rounds.jsonl": '{"round": 0}\n{"round": 1}\n', "summary.json": '{"status": "max_rounds"}\n'}
    launch = Launch(["round 1"], 0, {job / name: text for name, text in replaced.items()})
    monkeypatch.setattr(launchers.subprocess, "Popen", launch)
    assert launcher.launch_job(OmegaConf.create({"workers": 2, "out_dir": None})) == 0
    assert tree(job) == {**finished, **replaced, "launch.log": f"{cmd}\nround 1\n"}
    assert not (sweep_dir / "refused").exists()  # the first launch's refusal of it went (its line stayed)


def test_a_job_that_names_its_number_in_out_dir_launches_there_and_a_refused_launch_leaves_the_finished_job(
        tmp_path, monkeypatch, capsys):
    """``-m hydra/launcher=torchrun out_dir='DIR/${hydra:job.num}'``: the launched program is a run of its own, where
    hydra:job.num is None, so it was passed the override as typed and every job wrote DIR/None (job 1 refused as
    DIR/None held job 0's run).  It is passed the job's out_dir, resolved in the sweep (DIR/3).  Run again into the
    same sweep folder, the job's run folder DIR/3 holds the finished run: the refused launch's output goes beside
    its line in ``<sweep>/refused/``, and the finished job's folder (its launch.log, .hydra/) stays byte for byte."""
    from hydra.core.utils import setup_globals

    from dane.experiments import launchers

    setup_globals()  # the ${hydra:...} resolver, as a sweep has it
    sweep_dir, job, out = tmp_path / "sweep", tmp_path / "sweep" / "3_workers=2", tmp_path / "out" / "3"
    typed = f"out_dir={tmp_path}/out/$\\{{hydra\\:job.num\\}}"  # as Hydra's sweeper escapes it in the job's overrides
    finished_job = {"launch.log": "torchrun ... workers=2\nround 0\n", ".hydra/overrides.yaml": "- workers=2\n"}
    finished_run = {"rounds.jsonl": '{"round": 0}\n', "summary.json": '{"status": "converged"}\n'}
    for folder, files in ((job, finished_job), (out, finished_run)):
        for name, text in files.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(text)
    hydra = OmegaConf.create({"runtime": {"output_dir": str(job)}, "sweep": {"dir": str(sweep_dir)},
                              "overrides": {"task": ["workers=2", typed]}, "job": {"num": 3}})
    monkeypatch.setattr(launchers.HydraConfig, "get", staticmethod(lambda: hydra))
    monkeypatch.setattr(launchers, "main_module", lambda: "experiments.train")
    line = f"error: out_dir={out} already holds a run (rounds.jsonl, summary.json); choose a new out_dir, ..."
    launch = Launch([line], 2)
    monkeypatch.setattr(launchers.subprocess, "Popen", launch)
    launcher = launchers.TorchrunLauncher()
    cfg = OmegaConf.create({"workers": 2, "out_dir": f"{tmp_path}/out/${{hydra:job.num}}"})
    assert launcher.launch_job(cfg) == 2
    cmd = " ".join(launcher.command("experiments.train", ["workers=2", f"out_dir='{out}'"], 2))
    assert capsys.readouterr().err == line + "\n"
    assert tree(job) == finished_job and tree(out) == finished_run
    assert tree(sweep_dir / "refused") == {"3_workers=2.log": f"{cmd}\n{line}\n", "3_workers=2.txt": f"{line}\n"}
    typed_cfg = OmegaConf.create({"seed": "${hydra:job.num}", "tag": "j${hydra:job.num}", "logger": ["jsonl"]})
    assert launchers.job_overrides(["seed=${hydra:job.num}", "+tag='j${hydra:job.num}'", "logger=[jsonl]"],
                                   typed_cfg) == ["seed=3", "+tag='j3'", "logger=[jsonl]"]  # a number, a string


def test_a_launched_job_with_a_result_removes_an_earlier_jobs_error_file(tmp_path, monkeypatch):
    """A job refused on bad input left its line in its folder's error.txt; run again once the input is fixed, it
    finishes (exit 0), or diverges (exit 3, its summary written): either is a result, and the error.txt goes."""
    from dane.experiments import launchers

    job = tmp_path / "0_workers=2"
    failed = {"error.txt": "error: logger must be a list of jsonl, tensorboard, mlflow, got 'nosuch'\n",
              "launch.log": "torchrun ... workers=2\n", ".hydra/overrides.yaml": "- workers=2\n"}
    for status, summary in ((0, '{"status": "max_rounds"}\n'), (3, '{"status": "diverged"}\n')):
        launcher, cmd = launched_job(monkeypatch, job, failed, ["workers=2"])
        (job / "summary.json").unlink(missing_ok=True)
        monkeypatch.setattr(launchers.subprocess, "Popen", Launch(["round 0"], status, {job / "summary.json": summary}))
        assert launcher.launch_job(OmegaConf.create({"workers": 2, "out_dir": None})) == status
        assert tree(tmp_path) == {"0_workers=2/.hydra/overrides.yaml": "- workers=2\n",
                                  "0_workers=2/launch.log": f"{cmd}\nround 0\n", "0_workers=2/summary.json": summary}


def test_a_launched_job_keeps_the_config_folders_its_sweep_searched(tmp_path, monkeypatch):
    """``dane train -m --config-dir DIR hydra.searchpath=[file://REL] hydra/launcher=torchrun algorithm=<DIR's own>
    problem=<REL's own>``: each job's command passes the folder with ``--config-dir`` (absolute, as Hydra made it) and
    the search path with REL made absolute against the sweep's folder, so the launched program knows both choices
    (its first check, `check_group_choices`, refused them as unknown when the command held only the overrides)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path, get_args_parser
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.types import RunMode
    from omegaconf import open_dict

    from dane.experiments import launchers
    from dane.experiments.overrides import check_group_choices

    outside = Path(__file__).resolve().parent / "outside" / "conf"
    (tmp_path / "more" / "problem").mkdir(parents=True)
    ridge = (CONF_DIR / "problem" / "ridge_synthetic.yaml").read_text()
    (tmp_path / "more" / "problem" / "my_ridge.yaml").write_text(ridge)
    monkeypatch.chdir(tmp_path)  # where the sweep was typed: REL is relative to it
    search_path = create_config_search_path(str(CONF_DIR))
    search_path.prepend("command-line", f"file://{outside}", anchor=SearchPathQuery(provider="schema"))
    task = ["algorithm=my_fedprox", "problem=my_ridge", "workers=2"]
    cfg = ConfigLoaderImpl(config_search_path=search_path).load_configuration(
        "config", [*task, "hydra.searchpath=[file://more]", "hydra/launcher=torchrun"], run_mode=RunMode.MULTIRUN)
    job = tmp_path / "sweep" / "0_job"
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir, cfg.hydra.sweep.dir, cfg.hydra.overrides.task = str(job), str(job.parent), task
    monkeypatch.setattr(launchers.HydraConfig, "get", staticmethod(lambda: cfg.hydra))
    monkeypatch.setattr(launchers, "main_module", lambda: "experiments.train")
    cmd = []
    monkeypatch.setattr(launchers.TorchrunLauncher, "_run", lambda self, c, logged, env: (cmd.extend(c), (0, []))[1])
    assert launchers.TorchrunLauncher().launch_job(OmegaConf.create({"workers": 2, "out_dir": None})) == 0
    args = ["--config-dir", str(outside), *task, f"out_dir={quote(str(job))}",
            f"hydra.searchpath=['file://{tmp_path / 'more'}']"]
    assert cmd == launchers.torchrun_command("experiments.train", args, np=2)
    launched = cmd[cmd.index("experiments.train") + 1:]
    monkeypatch.chdir(REPO)  # the launched program's own first check, from elsewhere
    check_group_choices(launched)
    parsed = get_args_parser().parse_args(launched)
    assert parsed.config_dir == str(outside) and parsed.overrides == args[2:]


def test_the_refusal_of_an_occupied_folder_names_the_setting_its_user_changes(monkeypatch):
    """`experiments.train.out_dir_key`: ``hydra.sweep.dir`` for a sweep's job in the folder the sweep chose (no
    out_dir in a -m sweep; out_dir named by a process launcher), ``out_dir`` for a run given its out_dir."""
    from dane.experiments.callbacks import SWEEP_OUT_DIR_ENV
    from dane.experiments.train import out_dir_key

    monkeypatch.delenv(SWEEP_OUT_DIR_ENV, raising=False)
    assert [out_dir_key(None, True), out_dir_key("runs/a", True), out_dir_key("runs/a", False)] == \
        ["hydra.sweep.dir", "out_dir", "out_dir"]
    monkeypatch.setenv(SWEEP_OUT_DIR_ENV, "sweep/0_workers=2")
    assert [out_dir_key("sweep/0_workers=2", False), out_dir_key("runs/a", False)] == ["hydra.sweep.dir", "out_dir"]


def sweep(launcher: str, overrides: list[str], sweep_dir, options: list[str] = ()) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "experiments.train", "-m", *options, f"hydra/launcher={launcher}", *overrides,
           f"hydra.sweep.dir={sweep_dir}"]
    return subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    """The in-process runs with 1 and 2 workers: what each launched job must reproduce."""
    runs = {}
    for workers in (1, 2):
        out = tmp_path_factory.mktemp(f"sim{workers}")
        proc = train(*SMALL, f"workers={workers}", "quiet=true", f"out_dir={out}")
        assert proc.returncode == 0, proc.stderr
        runs[workers] = read_rounds(out)
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["horovod", "torchrun"])
def test_a_sweep_launches_each_job_with_its_workers(launcher, simulated, tmp_path):
    program, backend, available = LAUNCHERS[launcher]
    available()  # skips when the launcher is not installed
    # a --config-dir of the user's own (relative, as typed; nothing of it chosen here): each job's command carries it
    proc = sweep(launcher, ["workers=1,2", *SMALL, "quiet=true"], tmp_path, ["--config-dir", "tests/outside/conf"])
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    runs = sorted(find_runs(tmp_path))
    assert [p.name.split("_")[0] for p in runs] == ["0", "1"]
    for workers, run in zip((1, 2), runs):
        summary = read_summary(run)
        # the backend's own world size, and the launcher's layout as it told rank 0
        assert (summary["workers"], summary["backend"], summary["rounds"]) == (workers, backend, 5)
        launch = summary["provenance"]["launch"]
        assert launch["launcher"] == program and launch["size"] == launch["local_size"] == workers
        command = launch["command"]
        assert command[0].endswith(program) and str(workers) in command[1:4]
        assert f"out_dir={quote(str(run))}" in command and f"workers={workers}" in command
        assert command[command.index("--config-dir") + 1] == str(REPO / "tests" / "outside" / "conf")
        assert (run / "launch.log").read_text().splitlines()[0] == " ".join(command)
        assert (run / ".hydra" / "overrides.yaml").exists() and not (run / "error.txt").exists()
        real, sim = read_rounds(run), simulated[workers]
        assert len(real) == len(sim) == 6
        for a, b in zip(real, sim):
            assert a["bytes_sent"] == b["bytes_sent"]
            assert a["objective"] == pytest.approx(b["objective"], rel=1e-10, abs=0)
            assert a["suboptimality"] == pytest.approx(b["suboptimality"], rel=1e-10, abs=1e-14)
    assert simulated[2][-1]["suboptimality"] < 1e-8 < simulated[2][1]["suboptimality"]  # rounds that differ

    # the sweep's last line, and the command it prints, which tabulates both jobs
    last = re.search(r"^sweep: 2 jobs in (.+); summary: (.+)$", proc.stdout, re.M)
    assert last and last.group(1) == str(tmp_path), proc.stdout[-2000:]
    command = shlex.split(last.group(2))  # `dane figures summary DIR`: the venv's dane command
    table = subprocess.run([str(Path(sys.executable).with_name(command[0])), *command[1:]], cwd=REPO, env=env(),
                           capture_output=True, text=True, timeout=120)
    assert table.returncode == 0, table.stderr
    rows = [line.split("|") for line in table.stdout.splitlines()[2:]]
    assert [(r[2].strip(), r[4].strip(), r[5].strip()) for r in rows] == [("max_rounds", "1", "5"), ("max_rounds", "2", "5")]


@pytest.mark.slow
def test_a_failed_job_is_recorded_and_the_sweep_goes_on(tmp_path):
    torchrun()
    # workers=0: refused before any launch; mu=-1: launched, the program rejects it (exit 2);
    # plain DANE on 15 samples a worker in R^20: launched, diverges (exit 3) -- a result, not a failure
    proc = sweep("torchrun", ["workers=0,2", "algorithm.mu=-1,0", "algorithm.safeguard=false", "problem.n_samples=30",
                              "problem.dim=20", "rounds=30", "quiet=true"], tmp_path)
    assert proc.returncode == 2, (proc.stdout + proc.stderr)[-3000:]  # all ran; three were refused
    jobs = sorted((p for p in tmp_path.iterdir() if p.is_dir()), key=lambda p: int(p.name.split("_")[0]))
    errors = [(p / "error.txt").read_text() if (p / "error.txt").exists() else None for p in jobs]
    assert errors == ["error: workers must be a positive integer, got 0\n"] * 2 + [
        "error: algorithm.mu must be >= 0, got -1\n", None]
    assert [(p / "launch.log").exists() for p in jobs] == [False, False, True, True]  # nothing launched for workers=0
    assert "torchrun" in (jobs[2] / "launch.log").read_text().splitlines()[0]
    diverged = read_summary(jobs[3])
    assert (diverged["status"], diverged["workers"], diverged["backend"]) == ("diverged", 2, "torch")
    assert diverged["final_objective"] > 1e6
    assert not any((p / "summary.json").exists() for p in jobs[:3])
    assert "sweep: 4 jobs (3 failed: " in proc.stdout
    table = subprocess.run([sys.executable, "-m", "paper_figs.summary", str(tmp_path), "--json"], cwd=REPO, env=env(),
                           capture_output=True, text=True, timeout=120)
    assert table.returncode == 0, table.stderr
    assert [row["status"] for row in json.loads(table.stdout)] == ["failed", "failed", "failed", "diverged"]


def processes_naming(text: str) -> list[int]:
    """The pids of this machine's processes whose command line holds ``text``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text.encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            pass
    return found


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["torchrun", "horovod"])
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_an_interrupted_launched_sweep_leaves_no_worker_and_its_rerun_continues(launcher, signame, tmp_path):
    """Ctrl-C on a sweep while a launched job runs: the sweep exits 130, and no worker of the job is left (torchrun's
    agent starts its workers in sessions of their own: a SIGKILLed torchrun left them running to the end, holding the
    job's folder, so that the rerun was refused as in use by another run); the same sweep again with resume=auto
    continues the job from its checkpoint.  A SIGTERM to the sweep (a kill, a scheduler's time limit) does the same,
    with its own line and status 143 (before, it ended the sweep alone and the launch ran on)."""
    import signal

    LAUNCHERS[launcher][2]()  # skips when the launcher is not installed
    out = tmp_path / "runs"
    args = ["algorithm=gd", "workers=2", "problem.n_samples=6000", "problem.dim=200", "progress=none",
            f"out_dir={out}/${{hydra:job.num}}", "resume=auto", "checkpoint_every=100"]
    cmd = [sys.executable, "-m", "experiments.cli", "train", "-m", f"hydra/launcher={launcher}", *args,
           f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    proc = subprocess.Popen([*cmd, "rounds=100000"], cwd=REPO, env=env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not (out / "0" / "checkpoint" / "COMMITTED").exists() and proc.poll() is None:
            assert time.monotonic() < deadline, "no checkpoint after 300 s"
            time.sleep(0.2)
        proc.send_signal(getattr(signal, signame))
        said, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    job = next((tmp_path / "sweep").glob("0_*"))
    assert proc.returncode == {"SIGINT": 130, "SIGTERM": 143}[signame], said[-3000:]
    assert said.splitlines()[-1] == {
        "SIGINT": "dane train: interrupted",
        "SIGTERM": f"interrupted by SIGTERM; the running job's launch was stopped, its output is in {job}/launch.log",
    }[signame], said[-3000:]
    deadline = time.monotonic() + 30  # a worker stopped by its launcher says its line and exits
    while processes_naming(str(out)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_naming(str(out)) == [], "a worker of the interrupted job is still running"
    assert not (out / "0" / "summary.json").exists()  # stopped, not run to its end
    again = subprocess.run([*cmd, "rounds=300"], cwd=REPO, env=env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    summary = read_summary(out / "0")
    assert summary["rounds"] == 300 and summary["resumed_from_round"] >= 100
