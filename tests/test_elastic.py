"""Horovod elastic (comm.elastic=true, dane.loop.elastic): a lost worker changes the world size and the run goes on.

The fast tests drive `dane.loop.elastic.ElasticSession` in the thread simulator, doing by hand
what ``hvd.elastic.run`` does on a lost worker (restore the last commit, start the run
loop again with the new world size).  The slow ones run real ``horovodrun`` elastic jobs
and kill a worker with SIGKILL.
"""
from __future__ import annotations

import copy
import json
import math
import subprocess
from pathlib import Path

import pytest
import torch

from dane.comm import LocalCommunicator, ThreadGroup
from dane.loop.elastic import ElasticSession, disk_progress, run_attempt
from dane.errors import ConfigError
from dane.loop.faults import SimulatedFault
from dane.records.results import read_rounds, read_summary
from dane.experiments.config import run_spec
import runs
from helpers import BIN, REPO, composed, env
from test_checkpoint import Ran, execute_with, without_time

RIDGE = ("problem=ridge_synthetic", "problem.n_samples=4000", "problem.dim=50", "quiet=true", "save_iterate=true")
ROUNDS = 12


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> Ran:
    """The uninterrupted runs the tests compare with, each made once (`test_checkpoint.Ran`: a copy a test)."""
    return Ran(tmp_path_factory.mktemp("ran"))


class FakeHorovod:
    """The two functions `ElasticSession` takes from ``horovod.torch``, for one simulated worker.

    Every worker commits the same global state, so broadcasting rank 0's is the identity.
    """

    def __init__(self, rank: int):
        self._rank = rank

    def rank(self) -> int:
        return self._rank

    @staticmethod
    def broadcast_object(obj, root_rank: int = 0):
        return obj


def attempt(spec, sessions, out_dir, size: int) -> dict:
    """One pass of the elastic run loop on ``size`` workers (threads; one plain worker when size is 1)."""
    problems = [spec.problem.build(rank, size, spec.control.dtype) for rank in range(size)]
    if size == 1:
        return run_attempt(spec, LocalCommunicator(), problems[0], sessions[0])
    return ThreadGroup(size).run(lambda comm: run_attempt(spec, comm, problems[comm.rank], sessions[comm.rank]))[0]


def lose_worker_1(out_dir, fail_at: int, checkpoint_every: int, *overrides: str) -> list[ElasticSession]:
    """Two workers until worker 1 is lost at ``fail_at``; then, as Horovod does, every session restores its commit."""
    spec = run_spec(composed(*RIDGE, "workers=2", f"rounds={ROUNDS}", f"checkpoint_every={checkpoint_every}",
                           f"sim.fail_at=[[{fail_at},1]]", *overrides))
    sessions = [ElasticSession(FakeHorovod(rank), None) for rank in range(2)]
    for session in sessions:
        session.state.out_dir = str(out_dir)
    with pytest.raises(SimulatedFault):
        attempt(spec, sessions, out_dir, 2)
    reset(sessions)
    return sessions


def reset(sessions: list[ElasticSession]) -> None:
    """What ``hvd.elastic.run`` does after a failed collective: every worker restores its last commit, then
    rank 0's committed state is broadcast to all (``ObjectState.sync``; its saved dict is Horovod's own)."""
    for session in sessions:
        session.state.restore()
    rank0 = sessions[0].state._saved_state
    for session in sessions[1:]:
        session.state._saved_state = copy.deepcopy(rank0)
        session.state.restore()


def optimum(spec) -> torch.Tensor:
    return spec.problem.build(0, 1, spec.control.dtype).w_star


def test_every_row_is_in_one_shard_whatever_the_world_size_and_a_rebuilt_shard_is_the_fresh_one():
    """What a reset relies on: O is the same function for every m, and shard (r, m) is a function of (r, m)."""
    problem = run_spec(composed(*RIDGE)).problem
    whole_rows = problem.build(0, 1).X
    for m in (2, 3):
        shards = [problem.build(r, m) for r in range(m)]
        assert sum(len(s.X) for s in shards) == len(whole_rows) == 4000
        key = lambda X: X[torch.argsort(X[:, 0])]  # noqa: E731 - rows in a canonical order
        torch.testing.assert_close(key(torch.cat([s.X for s in shards])), key(whole_rows), rtol=0, atol=0)
        torch.testing.assert_close(problem.build(m - 1, m).X, shards[-1].X, rtol=0, atol=0)
    w = torch.linspace(-1, 1, 50, dtype=torch.float64)
    objectives = {m: sum(float(problem.build(r, m).evaluate(w)[1][0]) for r in range(m)) / m for m in (1, 2, 3)}
    assert objectives[2] == pytest.approx(objectives[1], rel=1e-13)
    assert objectives[3] == pytest.approx(objectives[1], rel=1e-13)


@pytest.mark.needs_horovod  # ElasticSession's state is horovod.common.elastic.ObjectState
@pytest.mark.parametrize("algorithm", ["dane", "gd", "giant", "disco"])
def test_a_reset_to_the_same_world_size_continues_exactly_as_the_uninterrupted_run(tmp_path, algorithm, ran):
    """Commit, restore and `load_elastic_state` round-trip: rank 0's state on every worker (for DANE, with the
    safeguard's local gradient recomputed on each shard) gives the uninterrupted records and iterate."""
    whole, run_dir = tmp_path / "whole", tmp_path / "run"
    ran(whole, *RIDGE, f"algorithm={algorithm}", "workers=2", f"rounds={ROUNDS}")
    sessions = lose_worker_1(run_dir, 7, 3, f"algorithm={algorithm}")
    assert sessions[0].state.progress["round"] == 6 and sessions[0].state.progress["workers"] == 2
    spec = run_spec(composed(*RIDGE, f"algorithm={algorithm}", "workers=2", f"rounds={ROUNDS}", "checkpoint_every=3",
                           "sim.fail_at=[[7,1]]"))
    summary = attempt(spec, sessions, run_dir, 2)
    records = read_rounds(run_dir)
    assert [r["round"] for r in records] == list(range(ROUNDS + 1))
    assert {r["workers"] for r in records} == {2}
    assert summary["world_size_changes"] == [] and summary["elastic"] is True
    strip = lambda rs: [{k: v for k, v in r.items() if k != "workers"} for r in without_time(rs)]  # noqa: E731
    assert strip(records) == without_time(read_rounds(whole))
    torch.testing.assert_close(torch.load(run_dir / "iterate.pt"), torch.load(whole / "iterate.pt"), rtol=0, atol=1e-12)


@pytest.mark.needs_horovod  # ElasticSession's state is horovod.common.elastic.ObjectState
def test_an_elastic_run_continues_a_checkpoint_on_disk(tmp_path, ran):
    """resume= with comm.elastic: rank 0's committed part on disk is the first committed state, broadcast to all."""
    whole, run_dir = tmp_path / "whole", tmp_path / "run"
    ran(whole, *RIDGE, "algorithm=dane", "workers=2", f"rounds={ROUNDS}")  # the reset test's uninterrupted DANE run
    execute_with(run_dir, *RIDGE, "workers=2", "rounds=5", "checkpoint_every=2", f"out_dir={run_dir}")
    spec = run_spec(composed(*RIDGE, "workers=2", f"rounds={ROUNDS}", "checkpoint_every=2", f"resume={run_dir}"))
    sessions = [ElasticSession(FakeHorovod(rank), str(run_dir), disk_progress(spec, 2) if rank == 0 else None)
                for rank in range(2)]
    reset(sessions)
    summary = attempt(spec, sessions, run_dir, 2)
    assert summary["resumed_from_round"] == 4 and summary["world_size_changes"] == []
    records = read_rounds(run_dir)
    assert [r["workers"] for r in records[4:]] == [2] * (ROUNDS + 1 - 4) and "workers" not in records[3]
    strip = lambda rs: [{k: v for k, v in r.items() if k != "workers"} for r in without_time(rs)]  # noqa: E731
    assert strip(records) == without_time(read_rounds(whole))
    torch.testing.assert_close(torch.load(run_dir / "iterate.pt"), torch.load(whole / "iterate.pt"), rtol=0, atol=1e-12)


@pytest.mark.needs_horovod  # ElasticSession's state is horovod.common.elastic.ObjectState
def test_a_lost_worker_leaves_one_that_redoes_the_uncommitted_rounds_once_and_reaches_the_optimum(tmp_path, capsys,
                                                                                                   monkeypatch):
    run_dir = tmp_path / "run"
    sessions = lose_worker_1(run_dir, fail_at=7, checkpoint_every=3)
    logged = [r["round"] for r in read_rounds(run_dir)]
    assert logged[:7] == list(range(7)) and logged[-1] in (6, 7)  # rank 0 logged round 7 unless stopped first
    spec = run_spec(composed(*RIDGE, f"rounds={ROUNDS}", "checkpoint_every=3"))
    read, read_bytes = [], Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda path: read.append(path.name) or read_bytes(path))
    summary = attempt(spec, sessions[:1], run_dir, 1)
    assert read.count("rounds.jsonl") == 1  # the reset counts the records it drops and cuts them in one read
    records = read_rounds(run_dir)
    assert [r["round"] for r in records] == list(range(ROUNDS + 1))  # rounds 6.. done again, each logged once
    assert [r["workers"] for r in records] == [2] * 6 + [1] * (ROUNDS + 1 - 6)
    assert summary["world_size_changes"] == [{"round": 6, "from": 2, "to": 1, "records_dropped": len(logged) - 6}]
    assert summary["workers"] == 1 and summary["rounds"] == ROUNDS and read_summary(run_dir)["workers"] == 1
    assert "elastic: world size 2 -> 1 at round 6" in capsys.readouterr().err
    per_round = records[1]["bytes_sent"]  # a round at m=2 (a ring allreduce sends the message once per worker)
    assert records[6]["bytes_sent"] == records[5]["bytes_sent"] + per_round > 0  # round 5 counted once
    assert records[-1]["bytes_sent"] == records[6]["bytes_sent"]  # one worker sends nothing
    assert summary["final_suboptimality"] <= 1e-12
    w = torch.load(run_dir / "iterate.pt")
    assert float(torch.linalg.vector_norm(w - optimum(spec))) <= 1e-10
    # n_i = 40 d: plain DANE is safe, so the safeguard's evidence rule keeps μ at 0 throughout; the change of
    # world size (new shards, a rebased guard) must not read as an overshoot or a rejection and raise it
    assert [r["mu"] for r in records[:-1]] == [0.0] * ROUNDS


def test_elastic_is_checked_before_any_process_group(monkeypatch):
    with pytest.raises(ConfigError, match=r"comm.elastic=true needs horovodrun in elastic mode \(--min-np/--max-np"):
        run_spec(composed(*RIDGE, "comm.elastic=true"))
    with pytest.raises(ConfigError, match="comm.elastic must be true or false"):
        run_spec(composed(*RIDGE, "comm.elastic=maybe"))


@pytest.mark.needs_horovod  # without Horovod, a launch under horovodrun is refused for that first
def test_elastic_under_horovodrun_needs_its_elastic_mode_and_an_elastic_algorithm(monkeypatch):
    monkeypatch.setenv("HOROVOD_RANK", "0")
    monkeypatch.setenv("HOROVOD_SIZE", "2")
    with pytest.raises(ConfigError, match="comm.elastic=true needs horovodrun in elastic mode"):
        run_spec(composed(*RIDGE, "comm.elastic=true"))  # horovodrun, but not elastic
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")
    with pytest.raises(ConfigError, match="supports algorithm=dane[|]disco[|]gd[|]giant, got admm"):
        run_spec(composed(*RIDGE, "algorithm=admm", "comm.elastic=true"))
    assert run_spec(composed(*RIDGE, "comm.elastic=true")).comm.elastic


WITHOUT_HOROVODRUN = runs.command("elastic:without_horovodrun", *RIDGE, "comm.elastic=true",
                                  "out_dir={tmp}/elastic/run")


def test_elastic_without_horovodrun_is_one_line_and_exit_2(commands):
    proc, tmp_path = commands[WITHOUT_HOROVODRUN], commands.tmp / "elastic"
    assert proc["rc"] == 2
    assert proc["stderr"].strip().splitlines() == [
        "error: comm.elastic=true needs horovodrun in elastic mode (--min-np/--max-np with --host-discovery-script, "
        "e.g. scripts/discover_hosts.sh); drop comm.elastic or launch so"]
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------- real horovodrun elastic


def horovodrun_elastic(run_dir, kill_round: int, kill_rank: int, *overrides: str) -> subprocess.CompletedProcess:
    """2 workers from scripts/discover_hosts.sh (localhost:1, 127.0.0.1:1), min 1; ``kill_rank`` SIGKILLs itself."""
    pytest.importorskip("horovod.torch", reason="Horovod is not built; run `make setup`")
    exe = BIN / "horovodrun"
    if not exe.exists():
        pytest.skip("horovodrun is not installed next to this python")
    environment = {**env(), "PATH": f"{BIN}:{env()['PATH']}",  # the workers run the `python` on PATH
                   "DANE_TEST_KILL_AT_ROUND": str(kill_round), "DANE_TEST_KILL_RANK": str(kill_rank)}
    environment.pop("DANE_HOSTS_FILE", None)
    cmd = [str(exe), "--gloo", "-np", "2", "--min-np", "1", "--max-np", "2",
           "--host-discovery-script", str(REPO / "scripts" / "discover_hosts.sh"),
           "python", "-m", "experiments.train", *RIDGE, "comm.elastic=true", f"rounds={ROUNDS}",
           f"out_dir={run_dir}", *overrides]
    return subprocess.run(cmd, cwd=REPO, env=environment, capture_output=True, text=True, timeout=300)


def check_records(run_dir, change_round: int) -> list[dict]:
    records = read_rounds(run_dir)
    assert [r["round"] for r in records] == list(range(ROUNDS + 1))  # no round twice, none missing
    assert [r["workers"] for r in records] == [2] * change_round + [1] * (ROUNDS + 1 - change_round)
    assert all(math.isfinite(r["objective"]) for r in records)
    assert [r["time_s"] for r in records] == sorted(r["time_s"] for r in records)
    return records


@pytest.mark.slow
def test_horovodrun_elastic_goes_on_when_rank_1_is_killed_as_the_simulator_does(tmp_path):
    """SIGKILL of rank 1 at round 4 with a commit every 3 rounds: rank 0 resets to size 1 at round 3, the last
    commit, drops its records of rounds 3 and 4 and does them again.  About 25 s."""
    run_dir = tmp_path / "run"
    proc = horovodrun_elastic(run_dir, 4, 1, "checkpoint_every=3")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (run_dir / "checkpoint" / "kill_round4_worker1").exists()  # the kill happened
    assert "Process 1 exit with status code 137" in proc.stdout + proc.stderr
    assert "elastic: world size 2 -> 1 at round 3" in proc.stderr
    records = check_records(run_dir, 3)
    summary = read_summary(run_dir)
    assert summary["world_size_changes"] == [{"round": 3, "from": 2, "to": 1, "records_dropped": 2}]
    assert summary["workers"] == 1 and summary["backend"] == "horovod" and summary["status"] == "max_rounds"
    assert summary["final_suboptimality"] <= 1e-12
    spec = run_spec(composed(*RIDGE, f"rounds={ROUNDS}"))
    w = torch.load(run_dir / "iterate.pt")
    assert float(torch.linalg.vector_norm(w - optimum(spec))) <= 1e-10
    # the same loss in the simulator: the records agree round by round
    sim_dir = tmp_path / "sim"
    sessions = lose_worker_1(sim_dir, fail_at=4, checkpoint_every=3)
    attempt(run_spec(composed(*RIDGE, f"rounds={ROUNDS}", "checkpoint_every=3")), sessions[:1], sim_dir, 1)
    simulated = read_rounds(sim_dir)
    for real, sim in zip(records, simulated):
        assert real.keys() == sim.keys()
        for key in real.keys() - {"time_s", "accepted"}:
            assert real[key] == pytest.approx(sim[key], rel=1e-9, abs=1e-20), (real["round"], key)
    torch.testing.assert_close(w, torch.load(sim_dir / "iterate.pt"), rtol=0, atol=1e-12)


@pytest.mark.slow
def test_horovodrun_elastic_goes_on_when_rank_0_the_writer_is_killed(tmp_path):
    """SIGKILL of rank 0 at round 3 (before it logs round 3), a commit every round: the other worker becomes
    rank 0, takes over the run directory and logs from round 3, the last round every worker reached."""
    run_dir = tmp_path / "run"
    proc = horovodrun_elastic(run_dir, 3, 0)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (run_dir / "checkpoint" / "kill_round3_worker0").exists()
    assert "Process 0 exit with status code 137" in proc.stdout + proc.stderr
    assert "elastic: world size 2 -> 1 at round 3" in proc.stderr
    check_records(run_dir, 3)
    summary = read_summary(run_dir)
    assert summary["world_size_changes"] == [{"round": 3, "from": 2, "to": 1, "records_dropped": 0}]
    assert summary["final_suboptimality"] <= 1e-12
    assert not (run_dir / ".lock").exists()
    w = torch.load(run_dir / "iterate.pt")
    assert float(torch.linalg.vector_norm(w - optimum(run_spec(composed(*RIDGE))))) <= 1e-10
    assert json.loads((run_dir / "summary.json").read_text())["provenance"]
