"""Real multi-process launches: horovodrun -np 2 --gloo and torchrun --nproc_per_node 2.

No mocks: these start the launchers, which start the backends' process groups.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dane.records.results import read_rounds, read_summary
from dane.work import KEYS as LOCAL_WORK
import runs
from helpers import REPO, env, horovodrun, torchrun, train

DANE_SMALL = ["algorithm=dane", "problem=ridge_synthetic", "problem.n_samples=4000", "problem.dim=100",
              "problem.covariance=decay", "rounds=6", "quiet=true", "save_iterate=true"]


def probe(launcher: list[str], tmp_path) -> list[dict]:
    out = tmp_path / "probe.jsonl"
    proc = subprocess.run([*launcher, sys.executable, str(REPO / "tests" / "comm_probe.py"), str(out)],
                          cwd=REPO, env=env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return sorted((json.loads(line) for line in out.read_text().splitlines()), key=lambda r: r["rank"])


@pytest.mark.parametrize("launch", [horovodrun, torchrun], ids=["horovodrun", "torchrun"])
@pytest.mark.slow
def test_allreduce_mean_is_exact_and_counted(launch, tmp_path):
    records = probe(launch(2), tmp_path)
    assert [r["rank"] for r in records] == [0, 1]
    for r in records:
        assert r["size"] == 2
        assert r["allreduce_err"] <= 1e-15  # float64 mean of two values: exact up to the last bit
        assert r["shapes_ok"]
        assert r["broadcast_err"] == 0.0
        assert r["text"] == "run-dir-of-rank-0"
    expected_backend = "HorovodCommunicator" if launch is horovodrun else "TorchDistCommunicator"
    assert {r["backend"] for r in records} == {expected_backend}


SIMULATED = runs.command("launchers:simulated", *DANE_SMALL, "workers=2", "out_dir={tmp}/launchers/simulated")


@pytest.fixture(scope="module")
def simulated_run(commands):
    """The in-process simulator's run of DANE_SMALL with 2 workers (helpers.simulated_run's command), a row of
    the session's batch: the reference each launch is compared with."""
    assert commands[SIMULATED]["rc"] == 0, commands[SIMULATED]["stderr"]
    return commands.tmp / "launchers" / "simulated"


LAUNCHERS = {"horovodrun": horovodrun, "torchrun": torchrun}


def launched(tmp: Path, name: str) -> dict:
    """DANE_SMALL under ``name`` with 2 processes, into {tmp}/launchers/<name>: a job of the session's fresh
    interpreter (tests/runs.py), so that the launch runs in the background beside the in-process tests."""
    out = Path(tmp) / "launchers" / name
    proc = train(*DANE_SMALL, f"out_dir={out}", launcher=LAUNCHERS[name](2))
    return {"returncode": proc.returncode, "output": proc.stdout + proc.stderr, "out_dir": str(out)}


LAUNCHED = {name: runs.job(f"launchers:{name}", "test_launchers:launched", name) for name in LAUNCHERS}


@pytest.mark.parametrize("name", list(LAUNCHERS))
def test_launcher_iterates_equal_the_in_process_simulation(name, simulated_run, fresh):
    LAUNCHERS[name](2)  # skips here where the launcher is absent (the job then holds the same skip as its error)
    done = fresh["jobs"][LAUNCHED[name]]
    assert "ok" in done, done.get("error")
    assert done["ok"]["returncode"] == 0, done["ok"]["output"]
    out = Path(done["ok"]["out_dir"])
    real, sim = read_rounds(out), read_rounds(simulated_run)
    assert len(real) == len(sim) == 7
    for a, b in zip(real, sim):
        assert a["round"] == b["round"]
        assert a["bytes_sent"] == b["bytes_sent"] and a["comm_rounds"] == b["comm_rounds"]
        # local work: summed and maxed over the ranks by an uncounted allreduce, as the simulator's board has them
        assert {key: a[key] for key in LOCAL_WORK} == {key: b[key] for key in LOCAL_WORK}
        assert a["local_passes"] >= 2 * a["round"] and a["local_passes_max"] == a["local_passes"] / 2
        assert abs(a["suboptimality"] - b["suboptimality"]) <= 1e-10 * max(1.0, b["suboptimality"])
        # mu is computed from differences of nearly equal iterates: round-off is amplified to ~1e-10
        assert a.get("mu", 0.0) == pytest.approx(b.get("mu", 0.0), rel=1e-8, abs=1e-14)
    torch.testing.assert_close(torch.load(out / "iterate.pt"), torch.load(simulated_run / "iterate.pt"),
                               rtol=0, atol=1e-10)
    summary = read_summary(out)
    assert summary["workers"] == 2
    assert summary["local_work"] == {key: real[-1][key] for key in LOCAL_WORK}
    assert summary["backend"] == ("horovod" if name == "horovodrun" else "torch")
    assert not (REPO / "outputs").exists()  # no rank made a Hydra directory of its own


@pytest.mark.slow
def test_workers_must_match_the_launcher(tmp_path):
    proc = train(*DANE_SMALL, "workers=3", f"out_dir={tmp_path}", launcher=torchrun(2))
    assert proc.returncode != 0
    assert "error: workers=3 but the launcher started 2 process(es)" in proc.stderr
    # torchrun prints its own traceback for a failed child; none comes from our code
    assert f"{REPO}/dane" not in proc.stderr and f"{REPO}/experiments" not in proc.stderr
