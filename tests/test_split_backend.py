"""Split learning's backend under a launcher (`dane.run_config.split_backend`, issue 35 item 6): a launched split
run needs a server rank of its own, so under torchrun ``comm=torch`` (or ``auto``) becomes ``comm=ps`` with one
server, said in the run's notes; what cannot run is refused before any process group, by rank 0 alone."""
from __future__ import annotations

import pytest

from dane.errors import ConfigError
from dane.experiments.config import run_spec
from helpers import composed

SPLIT = ("algorithm=split", "problem=digits_mlp")
NOTE = "comm=ps, chosen for algorithm=split under torchrun: the last rank is the split server, the others are agents"



@pytest.fixture
def torchrun_3(monkeypatch):
    """What torchrun --nproc_per_node 3 sets, as rank 0 sees it."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")


@pytest.mark.parametrize("comm", ["auto", "torch"])
def test_split_under_torchrun_runs_through_comm_ps_and_says_so(comm, torchrun_3):
    spec = run_spec(composed(*SPLIT, f"comm={comm}"))
    assert (spec.comm.backend, spec.comm.workers, spec.comm.servers) == ("ps", 2, 1)  # 2 agents + the server
    assert spec.algorithm.notes == (NOTE,)


def test_split_with_comm_ps_and_other_algorithms_keep_their_backend(torchrun_3):
    spec = run_spec(composed(*SPLIT, "comm=ps"))
    assert (spec.comm.backend, spec.comm.workers, spec.algorithm.notes) == ("ps", 2, ())
    spec = run_spec(composed("problem=digits_mlp", "comm=torch"))
    assert (spec.comm.backend, spec.comm.workers) == ("torch", 3)


def test_split_without_a_launcher_keeps_the_simulator():
    spec = run_spec(composed(*SPLIT, "workers=2"))
    assert (spec.comm.backend, spec.comm.workers, spec.algorithm.notes) == ("local", 2, ())


def test_split_with_two_servers_is_refused_before_any_process_group(torchrun_3):
    with pytest.raises(ConfigError) as err:
        run_spec(composed(*SPLIT, "comm=ps", "comm.servers=2"))
    assert str(err.value) == ("algorithm=split runs in the simulator (workers=<m>, plain python) or under torchrun "
                              "with comm=ps and one server (torchrun --nproc_per_node <m+1> ... comm=ps), not comm=ps "
                              "with comm.servers=2")


@pytest.mark.slow  # 20-90 s: one torchrun launch of 3 processes on a loaded 2-core machine
def test_torchrun_split_without_comm_ps_trains_and_notes_the_choice(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    from dane.records.results import read_rounds, read_summary

    repo = Path(__file__).resolve().parents[1]
    environment = {**os.environ, "PYTHONPATH": str(repo), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run(["torchrun", "--standalone", "--nproc_per_node", "3", "-m", "experiments.train", *SPLIT,
                           "algorithm.cut=net.2", "problem.model.hidden=[32,16]", "rounds=1", "quiet=true",
                           f"out_dir={tmp_path / 'run'}"], cwd=repo, capture_output=True, text=True, timeout=300,
                          env=environment)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = read_summary(tmp_path / "run")
    assert summary["backend"] == "ps" and summary["workers"] == 2 and summary["notes"] == [NOTE]
    assert [r["round"] for r in read_rounds(tmp_path / "run")] == [0, 1]
