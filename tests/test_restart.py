"""Restarts: a lost worker (sim.fail_at, or a process killed under torchrun --max-restarts) and a
rerun with resume=auto finish exactly as the uninterrupted run; Ctrl-C stops a simulated run
within a round and keeps its records.
"""
from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from dane.loop.checkpoint import committed
from dane.comm import ThreadGroup
from dane.errors import ConfigError
from dane.loop.faults import SimulatedFault
from dane.records.results import read_rounds, read_summary
from dane.experiments.config import run_spec
import runs
from helpers import REPO, composed, env, horovodrun, torchrun, train, unused_pid
from test_checkpoint import execute_with, without_time

RIDGE = ("problem=ridge_synthetic", "problem.n_samples=2000", "problem.dim=50", "quiet=true", "save_iterate=true")


def assert_same_iterate(a, b) -> None:
    torch.testing.assert_close(torch.load(a / "iterate.pt"), torch.load(b / "iterate.pt"), rtol=0, atol=1e-12)


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """The uninterrupted simulated run: 2 workers, 8 rounds."""
    out = tmp_path_factory.mktemp("whole")
    execute_with(out, *RIDGE, "workers=2", "rounds=8")
    return out


def test_resume_auto_starts_then_continues(tmp_path, whole):
    run_dir = tmp_path / "run"
    first = execute_with(run_dir, *RIDGE, "workers=2", "rounds=5", "checkpoint_every=2", f"out_dir={run_dir}",
                         "resume=auto")
    assert "resumed_from_round" not in first and committed(run_dir)["round"] == 4
    second = execute_with(run_dir, *RIDGE, "workers=2", "rounds=8", "checkpoint_every=2", f"out_dir={run_dir}",
                          "resume=auto")
    assert second["resumed_from_round"] == 4
    assert without_time(read_rounds(run_dir)) == without_time(read_rounds(whole))
    assert_same_iterate(run_dir, whole)
    # what reads the whole run (the stop line's trend over its rounds) reads the records before the resume too
    assert second["stopped_by"] == read_summary(whole)["stopped_by"]
    # the same command again: the run finished, nothing to continue (it redid rounds 4-8 and replaced the summary)
    kept = (run_dir / "rounds.jsonl").read_bytes(), (run_dir / "summary.json").read_bytes()
    with pytest.raises(ConfigError, match=r"holds a finished run \(max_rounds after 8 rounds\); there is nothing to "
                                          r"continue: rounds above 8 extends a run that stopped at its cap, drop resume "
                                          r"and set overwrite=true to start it again, or use a new out_dir$"):
        execute_with(run_dir, *RIDGE, "workers=2", "rounds=8", "checkpoint_every=2", f"out_dir={run_dir}",
                     "resume=auto")
    assert ((run_dir / "rounds.jsonl").read_bytes(), (run_dir / "summary.json").read_bytes()) == kept
    with pytest.raises(ConfigError, match="resume=auto continues the run in out_dir; set out_dir"):
        run_spec(composed(*RIDGE, "workers=2", "resume=auto"))


def test_resume_auto_restarts_a_run_that_crashed_before_its_first_checkpoint(tmp_path, whole):
    run_dir = tmp_path / "run"
    with pytest.raises(SimulatedFault):
        execute_with(run_dir, *RIDGE, "workers=2", "rounds=8", "checkpoint_every=5", "sim.fail_at=[[3,1]]",
                     f"out_dir={run_dir}", "resume=auto")
    assert committed(run_dir) is None and len(read_rounds(run_dir)) >= 3  # records of a run that never committed
    execute_with(run_dir, *RIDGE, "workers=2", "rounds=8", "checkpoint_every=5", "sim.fail_at=[[3,1]]",
                 f"out_dir={run_dir}", "resume=auto")
    assert without_time(read_rounds(run_dir)) == without_time(read_rounds(whole))
    # the records of an unfinished run that resume=auto cannot continue stay, unless they are a restart's to lose
    crashed = tmp_path / "crashed"
    with pytest.raises(SimulatedFault, match=f"lost at round 3 \\(sim.fail_at\\); the records before it stay in "
                                             f"{re.escape(str(crashed))}; without checkpoint_every there is no "
                                             f"checkpoint to resume from"):
        execute_with(crashed, *RIDGE, "workers=2", "rounds=8", "sim.fail_at=[[3,1]]", f"out_dir={crashed}")
    assert not (crashed / "checkpoint").exists()  # no marker of a fault that no resume could get past
    held = read_rounds(crashed)
    for every in ("checkpoint_every=0", "checkpoint_every=1"):
        with pytest.raises(ConfigError, match=rf"^resume=auto: {re.escape(str(crashed))} holds {len(held)} records of "
                                              r"an unfinished run .* they are kept: drop resume and set overwrite=true to start again"):
            execute_with(crashed, *RIDGE, "workers=2", "rounds=8", every, f"out_dir={crashed}", "resume=auto")
    assert read_rounds(crashed) == held
    # overwrite=true replaces a run's checkpoints with its records: resume=auto then starts the new run afresh
    replaced = tmp_path / "replaced"
    execute_with(replaced, *RIDGE, "workers=2", "rounds=5", "checkpoint_every=2", f"out_dir={replaced}")
    assert committed(replaced)["round"] == 4
    execute_with(replaced, *RIDGE, "workers=2", "rounds=3", f"out_dir={replaced}", "overwrite=true")
    assert committed(replaced) is None and not (replaced / "checkpoint").exists() and len(read_rounds(replaced)) == 4
    # a finished run without checkpoints is not started over by resume=auto
    finished = shutil.copytree(whole, tmp_path / "finished")
    with pytest.raises(ConfigError, match="already holds a run"):
        execute_with(finished, *RIDGE, "workers=2", "rounds=8", f"out_dir={finished}", "resume=auto")


@pytest.mark.slow
def test_a_lost_simulated_worker_and_the_same_command_rerun_finish_like_the_uninterrupted_run(tmp_path, whole):
    """The command line a restart script would repeat: the first attempt crashes, the second finishes."""
    run_dir = tmp_path / "run"
    command = (*RIDGE, "workers=2", "rounds=8", "checkpoint_every=2", "sim.fail_at=[[5,1]]", f"out_dir={run_dir}",
               "resume=auto")
    crashed = train(*command)
    assert crashed.returncode != 0 and "simulated worker 1 was lost at round 5" in crashed.stderr
    assert committed(run_dir)["round"] == 4 and not (run_dir / "summary.json").exists()
    finished = train(*command)
    assert finished.returncode == 0, finished.stderr
    assert read_summary(run_dir)["resumed_from_round"] == 4
    assert without_time(read_rounds(run_dir)) == without_time(read_rounds(whole))
    assert_same_iterate(run_dir, whole)


BATCHED = ("problem=ridge_synthetic", "problem.n_samples=240", "problem.dim=10", "workers=6", "sim.batched=true",
           "algorithm=scaffold", "algorithm.clients_per_round=3", "algorithm.local_steps=3", "quiet=true",
           "save_iterate=true")


def test_a_batched_run_that_lost_a_worker_resumes_like_the_uninterrupted_run(tmp_path):
    """On the batched path one process holds every worker: sim.fail_at loses worker 1 and with it the run, as losing
    its thread does on the per-worker path; the same command then continues from the one-part checkpoint."""
    whole, run_dir = tmp_path / "whole", tmp_path / "run"
    execute_with(whole, *BATCHED, "rounds=7")
    command = (*BATCHED, "rounds=7", "checkpoint_every=2", "sim.fail_at=[[3,1]]", f"out_dir={run_dir}", "resume=auto")
    with pytest.raises(SimulatedFault, match="simulated worker 1 was lost at round 3 \\(sim.fail_at\\); the last "
                                             "committed checkpoint stays"):
        execute_with(run_dir, *command)
    assert committed(run_dir)["round"] == 2 and [r["round"] for r in read_rounds(run_dir)] == [0, 1, 2]
    summary = execute_with(run_dir, *command)
    assert summary["resumed_from_round"] == 2 and summary["simulator_path"] == "batched"
    assert without_time(read_rounds(run_dir)) == without_time(read_rounds(whole))
    assert_same_iterate(run_dir, whole)


@pytest.mark.slow  # two processes, killed and rerun; the in-process loss above is the fast suite's resume check
def test_a_killed_batched_run_and_the_same_command_rerun_finish_like_the_uninterrupted_run(tmp_path):
    """SIGKILL of the batched simulator's one process at round 5 (the test hook, worker 1, once per run directory):
    the checkpoint committed at round 4 stays whole, and the rerun of the same command finishes the run."""
    whole, run_dir = tmp_path / "whole", tmp_path / "run"
    execute_with(whole, *BATCHED, "rounds=7")
    command = (*BATCHED, "rounds=7", "checkpoint_every=2", f"out_dir={run_dir}", "resume=auto")
    killed = train(*command, extra_env={"DANE_TEST_KILL_AT_ROUND": "5"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert committed(run_dir)["batched"] and (run_dir / "checkpoint" / "kill_round5_worker1").exists()
    finished = train(*command, extra_env={"DANE_TEST_KILL_AT_ROUND": "5"})
    assert finished.returncode == 0, finished.stderr
    summary = read_summary(run_dir)
    assert summary["resumed_from_round"] == 4 and summary["simulator_path"] == "batched"
    assert without_time(read_rounds(run_dir)) == without_time(read_rounds(whole))
    assert_same_iterate(run_dir, whole)


def test_fail_at_is_checked(tmp_path):
    with pytest.raises(ConfigError, match=r"sim.fail_at must be a list of \[round, worker\] pairs"):
        run_spec(composed(*RIDGE, "workers=2", "sim.fail_at=[3,1]"))
    with pytest.raises(ConfigError, match=r"sim.fail_at entry \[3,2\] needs round >= 0 and 0 <= worker < 2"):
        run_spec(composed(*RIDGE, "workers=2", "sim.fail_at=[[3,2]]"))
    with pytest.raises(ConfigError, match="sim.fail_at loses a simulated worker; it needs workers > 1"):
        run_spec(composed(*RIDGE, "sim.fail_at=[[3,0]]"))


def default_sigint() -> None:
    """In a child before exec: SIGINT unblocked and at its default, as a terminal starts a program, whatever
    this test process inherited or was left with (an ignored or blocked signal stays so across exec, and
    python installs its Ctrl-C handler only over the default)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("after", [50, 0])
def test_ctrl_c_that_the_kernel_hands_to_a_worker_thread_still_stops_the_simulator(after):
    """A process-directed SIGINT may land on any thread.  Worker 1 sends one to itself after
    ``after`` collectives; the main thread must notice it within its 0.2 s wait slices and stop both
    workers, long before they would have finished 20,000 collectives.  (A plain join() never woke up:
    the run went on until the workers ended by themselves, which a real run of 10^8 rounds never does.)
    With ``after=0`` the signal comes while the main thread may still be starting the threads: the
    KeyboardInterrupt then escaped from ``Thread.start`` with the workers left running (a CI run
    ended there)."""
    group = ThreadGroup(2)
    done = [0, 0]
    previous = (signal.signal(signal.SIGINT, signal.default_int_handler),  # as a fresh python has them, whatever
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}))  # earlier tests left in this process

    def worker(comm):
        for n in range(20000):
            if n == after and comm.rank == 1:
                signal.pthread_kill(threading.get_ident(), signal.SIGINT)
            comm.allreduce_mean([torch.ones(3)])
            done[comm.rank] = n + 1

    start = time.monotonic()
    try:
        group.run(worker)
    finally:
        signal.signal(signal.SIGINT, previous[0])
        signal.pthread_sigmask(signal.SIG_SETMASK, previous[1])
    assert group.interrupted
    assert max(done) < 20000 and time.monotonic() - start < 10, (done, time.monotonic() - start)


def test_ctrl_c_stops_one_simulated_worker_alone():
    """One simulated worker (``sim.single_worker``, the m = 1 jobs of a workers sweep) never meets the group at a
    collective (the communicator answers size 1 itself), so it went on to its last round after a Ctrl-C; it now stops
    at its next allreduce as m workers do."""
    group, done = ThreadGroup(1), [0]
    previous = (signal.signal(signal.SIGINT, signal.default_int_handler),
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}))

    def worker(comm):
        for n in range(200000):
            if n == 50:
                signal.pthread_kill(threading.get_ident(), signal.SIGINT)
            comm.allreduce_mean([torch.ones(3)])
            done[0] = n + 1

    try:
        group.run(worker)
    finally:
        signal.signal(signal.SIGINT, previous[0])
        signal.pthread_sigmask(signal.SIG_SETMASK, previous[1])
    assert group.interrupted and done[0] < 200000, done


def ctrl_c(tmp, path: str) -> dict:
    """In the session's fresh interpreter (tests/runs.py): a simulated run of 10^8 rounds on ``path``, SIGINT
    once it has logged 5 rounds; {returncode, stderr, stopped_s (from the signal to its exit), run_dir}."""
    run_dir = tmp / "ctrl_c" / path
    cmd = [sys.executable, "-m", "experiments.train", *RIDGE, "workers=2", "rounds=100000000", f"out_dir={run_dir}",
           f"sim.batched={'true' if path == 'batched' else 'false'}"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_sigint)
    try:
        rounds = run_dir / "rounds.jsonl"
        deadline = time.monotonic() + 120
        while not (rounds.exists() and rounds.read_text().count("\n") >= 6):  # rounds 0-5 logged: the signal comes
            # after round 5 (at >= 5 lines, round 4, a run slowed by load could stop before logging round 5)
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        _, err = proc.communicate(timeout=60)
        stopped_s = time.monotonic() - sent
    finally:
        proc.kill()
    return {"returncode": proc.returncode, "stderr": err, "stopped_s": stopped_s, "run_dir": str(run_dir)}


PATHS = ("threads", "batched")
for _path in PATHS:
    runs.job(f"restart:ctrl_c:{_path}", "test_restart:ctrl_c", _path)


@pytest.mark.parametrize("path", PATHS)
def test_ctrl_c_stops_a_simulated_run_within_a_round_and_keeps_its_records(fresh, path):
    """One thread a worker, or the m workers as one stacked computation (sim.batched): both stop at the next
    collective and write an interrupted summary."""
    done = fresh["jobs"][f"restart:ctrl_c:{path}"]
    assert "ok" in done, done.get("error")
    err, stopped_s, run_dir = done["ok"]["stderr"], done["ok"]["stopped_s"], Path(done["ok"]["run_dir"])
    assert done["ok"]["returncode"] == 130, err
    assert "Traceback" not in err and "interrupted after round" in err, err
    summary, records = read_summary(run_dir), read_rounds(run_dir)
    assert summary["status"] == "interrupted"
    assert summary["rounds"] == records[-1]["round"] >= 5
    assert [r["round"] for r in records] == list(range(len(records)))
    assert stopped_s < 30  # within a round (about a millisecond here), not at the end of 10^8 rounds
    assert summary["simulator_path"] == path
    assert not (run_dir / ".lock").exists()


@pytest.mark.slow
def test_torchrun_restarts_a_killed_worker_and_finishes_like_the_uninterrupted_run(tmp_path, whole):
    """SIGKILL of rank 1 at round 3 (once: a marker in the run directory); torchrun restarts both workers.

    About 20 s.  Before `dane.loop.launch._torchrun_process_group` the restarted workers could hang
    in process-group setup, reading the killed attempt's gloo addresses from torchrun's store.
    """
    run_dir = tmp_path / "run"
    launcher = torchrun(2)
    launcher.insert(-1, "--max-restarts=2")
    environment = {**env(), "DANE_TEST_KILL_AT_ROUND": "3"}
    cmd = [*launcher, sys.executable, "-m", "experiments.train", *RIDGE, "rounds=8", "checkpoint_every=1",
           "resume=auto", f"out_dir={run_dir}"]
    proc = subprocess.run(cmd, cwd=REPO, env=environment, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (run_dir / "checkpoint" / "kill_round3_worker1").exists()  # the kill happened
    summary = read_summary(run_dir)
    assert summary["resumed_from_round"] == 3 and summary["backend"] == "torch"
    assert summary["provenance"]["launch"]["restarts"] == 1 and summary["provenance"]["launch"]["max_restarts"] == 2
    said = [line for line in proc.stderr.splitlines() if "lost a peer" in line]  # if torchrun let the survivor speak
    assert all("torchrun restarts the workers (2 of --max-restarts left)" in line for line in said), said
    assert [r["round"] for r in read_rounds(run_dir)] == list(range(9))
    assert_same_iterate(run_dir, whole)


def test_a_survivors_line_says_what_torchrun_does_next():
    """Under torchrun --max-restarts the survivor's line says torchrun restarts the workers (not: rerun the
    command); once the restarts are spent, or with none, it says how to rerun."""
    from dane.loop.faults import worker_lost

    lost = RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:5005")
    cases = {("2", "0", 1): "torchrun restarts the workers (2 of --max-restarts left), which continue from the last "
                            "checkpoint where the command has resume=auto",
             ("2", "0", 0): "torchrun restarts the workers (2 of --max-restarts left), which start over: add "
                            "checkpoint_every=K resume=auto to the command to continue instead",
             ("2", "2", 1): "rerun the same command with resume=auto to continue from the last checkpoint",
             ("0", "0", 1): "rerun the same command with resume=auto to continue from the last checkpoint"}
    for (most, done, every), tail in cases.items():
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("TORCHELASTIC_MAX_RESTARTS", most)
            patch.setenv("TORCHELASTIC_RESTART_COUNT", done)
            line = str(worker_lost(lost, "worker 0", "/runs/r", every))
        assert line == ("worker 0 lost a peer mid-run (a worker crashed or was killed: the launcher's log names it); "
                        f"the rounds logged so far are in /runs/r; {tail}"), line


def test_a_launchers_sigterm_becomes_the_lost_peer_line_naming_the_peer_that_exited(monkeypatch):
    """torchrun SIGTERMs the survivors once a worker exits: `launcher_signals.install`'s handler raises instead of
    ending the process silently, `worker_lost` makes the one line of it naming the exited peer (a reaped pid; a
    live one is not named), and a second SIGTERM is then ignored so that it cannot cut the report short."""
    import os

    from dane.comm import launcher_signals
    from dane.loop.faults import worker_lost

    exited = unused_pid()  # gone, as torchrun's agent reaps the failed worker before it SIGTERMs the others
    alive = os.getppid()  # a live process other than this one
    previous = signal.getsignal(signal.SIGTERM)
    try:
        monkeypatch.setattr(launcher_signals, "local_peers", lambda: {exited: 1, alive: 2})
        launcher_signals.install("torchrun")
        with pytest.raises(launcher_signals.LauncherTerminated) as caught:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler runs at the next bytecode
        assert caught.value.lost == [1]
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGTERM)  # ignored: the report goes on
        line = str(worker_lost(caught.value, "worker 0", "/runs/r", 0))
        assert line == ("worker 0 lost a peer mid-run (torchrun terminated it with SIGTERM after rank 1 exited); the "
                        "rounds logged so far are in /runs/r; set checkpoint_every=K (and resume=auto) so that a rerun "
                        "continues instead of starting over")
        unknown = str(worker_lost(launcher_signals.LauncherTerminated("torchrun", []), "worker 0", "/runs/r", 0))
        assert "(torchrun terminated it with SIGTERM as another process exited or the job was stopped: " in unknown
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_launchers_sigterm_is_not_swallowed_by_an_except_exception_on_the_way(monkeypatch, tmp_path):
    """The SIGTERM lands wherever the main thread is: here inside `dane.problems.optimum.read_saved`, whose
    ``except Exception`` turns a damaged file into a ConfigError.  `LauncherTerminated` is a BaseException, so it
    passes through (as a RuntimeError it became "cannot read the saved optimum", and torchrun's SIGKILL 30 s later
    ended the process with no line)."""
    import os

    import numpy as np

    from dane.comm import launcher_signals
    from dane.problems.optimum import read_saved

    def terminated_while_reading(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler runs at the next bytecode

    saved = tmp_path / "w.npy"
    np.save(saved, np.zeros(3))
    previous = signal.getsignal(signal.SIGTERM)
    try:
        monkeypatch.setattr(launcher_signals, "local_peers", dict)
        launcher_signals.install("torchrun")
        monkeypatch.setattr(np, "load", terminated_while_reading)
        start = time.perf_counter()
        with pytest.raises(launcher_signals.LauncherTerminated, match="^torchrun terminated this worker"):
            read_saved(saved, 3, torch.float64)
        assert time.perf_counter() - start < 4  # raised by the handler, not after the sleep
        assert not isinstance(launcher_signals.LauncherTerminated("torchrun", []), Exception)
    finally:
        signal.signal(signal.SIGTERM, previous)


def local_peers_probe(tmp) -> dict:
    """In the session's fresh interpreter: two sleepers (RANK 0 and 2) and a probe (RANK 1) as its children, as
    torchrun's agent starts its workers; the probe prints the ranks `local_peers` finds: {stdout, stderr}."""
    path = REPO / "dane" / "comm" / "launcher_signals.py"
    probe = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('ls', sys.argv[1]); "
             "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); print(sorted(m.local_peers().values()))")
    sleepers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env={**env(), "RANK": str(r)})
                for r in (0, 2)]
    try:
        out = subprocess.run([sys.executable, "-c", probe, str(path)], env={**env(), "RANK": "1"}, capture_output=True,
                             text=True, timeout=60)
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()
    return {"stdout": out.stdout, "stderr": out.stderr}


LOCAL_PEERS = runs.job("restart:local_peers", "test_restart:local_peers_probe")


def test_a_torchrun_worker_finds_its_local_peers_and_their_ranks(fresh):
    """`local_peers`: the other children of this process's parent (torchrun's agent), each with the RANK of its
    environment; the module is loaded from its file alone, so the child starts in well under a second."""
    out = fresh["jobs"][LOCAL_PEERS]
    assert "ok" in out, out.get("error")
    assert out["ok"]["stdout"].strip() == "[0, 2]", out["ok"]["stderr"]


@pytest.mark.slow
def test_torchrun_restart_of_a_network_run_is_bitwise_the_uninterrupted_run(tmp_path):
    """The same for a float32 network (DANE on digits-MLP): rank 1 is SIGKILLed at round 2 and torchrun
    restarts both workers from the round-2 checkpoint.  Two gloo ranks sum in a fixed order and the run
    fixes torch's threads and algorithms (`dane.problems.neural.reproducible_numerics`), so every logged
    metric but the clock and the final iterate must be bitwise the uninterrupted run's (about 60 s)."""
    job = ("algorithm=dane", "problem=digits_mlp", "rounds=4", "quiet=true", "save_iterate=true", "checkpoint_every=1",
           "resume=auto")

    def launch(out, extra_env):
        launcher = torchrun(2)
        launcher.insert(-1, "--max-restarts=2")
        proc = subprocess.run([*launcher, sys.executable, "-m", "experiments.train", *job, f"out_dir={out}"],
                              cwd=REPO, env={**env(), **extra_env}, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]

    launch(tmp_path / "whole", {})
    launch(tmp_path / "killed", {"DANE_TEST_KILL_AT_ROUND": "2"})
    assert (tmp_path / "killed" / "checkpoint" / "kill_round2_worker1").exists()
    assert read_summary(tmp_path / "killed")["resumed_from_round"] == 2
    whole, killed = read_rounds(tmp_path / "whole"), read_rounds(tmp_path / "killed")
    assert [r["round"] for r in killed] == list(range(5))
    assert without_time(killed) == without_time(whole)
    assert torch.equal(torch.load(tmp_path / "killed" / "iterate.pt"), torch.load(tmp_path / "whole" / "iterate.pt"))


@pytest.mark.parametrize("backend", ["torch", "horovod", "ps"])
@pytest.mark.slow
def test_a_worker_killed_without_restarts_leaves_its_peers_one_line_and_its_records(tmp_path, backend):
    """SIGKILL of rank 1 at round 2 with no restart: every survivor (worker 0; under comm=ps also the
    server) says in one line that it lost a peer, where the records are and how to resume, and exits
    non-zero without a traceback of ours; rank 0's rounds.jsonl keeps rounds 0..2 (about 10 s each)."""
    if backend == "horovod":
        launcher, extra = horovodrun(2), []
    else:  # torchrun's default --monitor-interval (0.1 s): it SIGTERMs the survivors at once, and each reports
        launcher, extra = torchrun(3 if backend == "ps" else 2), (["comm=ps"] if backend == "ps" else [])
    run_dir = tmp_path / "run"
    proc = subprocess.run([*launcher, sys.executable, "-m", "experiments.train", *RIDGE, "rounds=8", *extra,
                           f"out_dir={run_dir}"], cwd=REPO, env={**env(), "DANE_TEST_KILL_AT_ROUND": "2"},
                          capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    lines = [line for line in output.splitlines() if "lost a peer mid-run" in line]
    expected = {"worker 0"} | ({"a parameter server"} if backend == "ps" else set())
    assert {line.split("error: ")[1].split(" lost")[0] for line in lines} == expected, output[-3000:]
    assert all("set checkpoint_every=K (and resume=auto)" in line for line in lines)
    assert f"the rounds logged so far are in {run_dir}" in next(line for line in lines if "worker 0" in line)
    assert "experiments/train.py" not in output and "dane/loop/launch.py" not in output, output[-3000:]  # no traceback of ours
    assert [r["round"] for r in read_rounds(run_dir)] == [0, 1, 2]


LOST = runs.command("restart:fail_at_line", "workers=4", "rounds=12", "checkpoint_every=3", "sim.fail_at=[[8,1]]",
                    "problem.n_samples=400", "problem.dim=10", "quiet=true", "out_dir={tmp}/restart_fail_at_line",
                    cwd="{tmp}")


def test_a_simulated_loss_ends_the_command_in_one_line_with_its_records_kept(commands):
    """sim.fail_at on the command line: the lost worker's line and status 4, as a launched run's lost peer (was
    Hydra's page of traceback and status 1); the committed checkpoint and the rounds before the loss stay."""
    proc = commands[LOST]
    assert proc["rc"] == 4 and proc["stderr"].splitlines() == [
        "error: simulated worker 1 was lost at round 8 (sim.fail_at); the last committed checkpoint stays: rerun with "
        "resume=auto to continue"]
    run_dir = commands.tmp / "restart_fail_at_line"
    assert committed(run_dir) is not None and len(read_rounds(run_dir)) >= 6


def test_a_resumed_runs_summary_reads_the_records_from_before_its_resume(tmp_path):
    """The stop line's trend (over the run's last rounds) and the adaptations are the whole run's: a resume goes on
    with the records it kept in hand (they were this call's alone: "stalled over the last 6 rounds" against the
    uninterrupted "shrinking 0.998x per round over the last 12 rounds")."""
    args = (*RIDGE, "algorithm=adiana", "workers=4", "rounds=12", "checkpoint_every=3")
    whole = execute_with(tmp_path / "whole", *args)
    run_dir = tmp_path / "run"
    with pytest.raises(SimulatedFault):
        execute_with(run_dir, *args, "sim.fail_at=[[8,1]]", f"out_dir={run_dir}", "resume=auto")
    resumed = execute_with(run_dir, *args, "sim.fail_at=[[8,1]]", f"out_dir={run_dir}", "resume=auto")
    assert resumed["resumed_from_round"] == 6 and "over the last 12 rounds" in whole["stopped_by"]
    assert (resumed["stopped_by"], resumed.get("adaptations")) == (whole["stopped_by"], whole.get("adaptations"))
    # the clock's split is the whole run's too (it was the rounds' after the resume): the alpha-beta cost of the same
    # messages, and compute the rest of the clock
    assert resumed["simulated_comm_s"] == pytest.approx(whole["simulated_comm_s"], rel=1e-12)
    assert resumed["simulated_compute_s"] + resumed["simulated_comm_s"] == \
        pytest.approx(resumed["simulated_time_s"], rel=1e-12)


@pytest.mark.parametrize("method", [("algorithm=gd",), ("algorithm=admm", "algorithm.rho=0.01")])
def test_a_resumed_runs_summary_keeps_what_the_method_resolved_and_adapted(tmp_path, method):
    """GD resolves its lr in round 0 and ADMM rebalances a given ρ: a resume after both lists the same defaults and
    adaptations as the uninterrupted run."""
    args = (*RIDGE, *method, "workers=4", "rounds=12", "checkpoint_every=3", "tol=null")
    whole = execute_with(tmp_path / "whole", *args)
    run_dir = tmp_path / "run"
    with pytest.raises(SimulatedFault):
        execute_with(run_dir, *args, "sim.fail_at=[[8,1]]", f"out_dir={run_dir}", "resume=auto")
    resumed = execute_with(run_dir, *args, "sim.fail_at=[[8,1]]", f"out_dir={run_dir}", "resume=auto")
    assert resumed["resumed_from_round"] == 6 and whole["defaults"]
    assert (resumed["defaults"], resumed["adaptations"]) == (whole["defaults"], whole["adaptations"])
    assert whole["adaptations"] or method[0] == "algorithm=gd"
