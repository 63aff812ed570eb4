"""Real multi-process launches: horovodrun -np 2 --gloo and torchrun --nproc_per_node 2.

No mocks: these start the launchers, which start the backends' process groups.  The fast tests read one launch per
launcher a session, each running every run of tests/launched_runs.py one after another (DANE through the command
line, the compressed methods, the FedNL line, the compressed downlink and S-DANE's re-solves), against the
simulator's runs of the same.
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
import launched_runs
import runs
from helpers import REPO, env, horovodrun, torchrun, train

DANE_SMALL = list(launched_runs.CLI["dane"])


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
        # the ring's 2(m-1)/m of the 500 + 12 float64 and 7 float32 = 4124 bytes, at m = 2 the whole message;
        # the broadcast adds the root's 500 float64 once for the other worker, on the root only
        assert r["bytes_after_allreduce"] == 4124
        assert r["bytes_after_broadcast"] == 4124 + (4000 if r["rank"] == 0 else 0)
    expected_backend = "HorovodCommunicator" if launch is horovodrun else "TorchDistCommunicator"
    assert {r["backend"] for r in records} == {expected_backend}


#: the simulator's runs of `launched_runs` (workers=2), one row of the session's batch: what each launch is compared with
SIMULATED = runs.command("launchers:simulated", "{tmp}/launchers/simulated", "--simulate", module="launched_runs",
                         env={"DANE_CACHE_DIR": "{tmp}/launchers/simulated/cache"})


@pytest.fixture(scope="module")
def simulated(commands) -> Path:
    """The folder of the simulator's runs, each run's {rc, stderr} in its ``simulated.json``."""
    assert commands[SIMULATED]["rc"] == 0, commands[SIMULATED]["stderr"][-3000:]
    return commands.tmp / "launchers" / "simulated"


LAUNCHERS = {"horovodrun": horovodrun, "torchrun": torchrun}


def launched(tmp: Path, name: str) -> dict:
    """Every run of tests/launched_runs.py under ``name`` with 2 processes, in one launch, into {tmp}/launchers/<name>:
    a job of the session's fresh interpreter (tests/runs.py), so that the launch runs in the background beside the
    in-process tests."""
    out = Path(tmp) / "launchers" / name
    proc = subprocess.run([*LAUNCHERS[name](2), sys.executable, str(REPO / "tests" / "launched_runs.py"), str(out)],
                          cwd=REPO, env={**env(), "DANE_CACHE_DIR": str(out / "cache")}, capture_output=True, text=True,
                          timeout=600)
    return {"returncode": proc.returncode, "output": proc.stdout[-5000:] + proc.stderr[-5000:], "out_dir": str(out)}


LAUNCHED = {name: runs.job(f"launchers:{name}", "test_launchers:launched", name) for name in LAUNCHERS}


def launch(name: str, fresh) -> Path:
    """The folder of the launch under ``name``, once it ended well; skips here where the launcher is absent (the
    job then holds the same skip as its error)."""
    LAUNCHERS[name](2)
    done = fresh["jobs"][LAUNCHED[name]]
    assert "ok" in done, done.get("error")
    assert done["ok"]["returncode"] == 0, done["ok"]["output"]
    return Path(done["ok"]["out_dir"])


def ran(folder: Path, run: str, rank: str) -> dict:
    """{rc, stderr} of ``run`` on ``rank`` (a rank's number, or "simulated")."""
    return json.loads((folder / f"{rank}.json" if rank == "simulated" else folder / f"rank{rank}.json").read_text())[run]


@pytest.mark.parametrize("name", list(LAUNCHERS))
def test_launcher_iterates_equal_the_in_process_simulation(name, simulated, fresh):
    out = launch(name, fresh)
    assert ran(simulated, "dane", "simulated")["rc"] == 0, ran(simulated, "dane", "simulated")["stderr"][-3000:]
    assert [ran(out, "dane", rank)["rc"] for rank in (0, 1)] == [0, 0], ran(out, "dane", 0)["stderr"][-3000:]
    # the local-work table rode each round's first allreduce: no collective of its own (`dane.work.post`)
    assert [ran(out, "dane", rank)["uncounted"] for rank in (0, 1)] == [0, 0]
    out, simulated_run = out / "dane", simulated / "dane"
    real, sim = read_rounds(out), read_rounds(simulated_run)
    assert len(real) == len(sim) == 7
    for a, b in zip(real, sim):
        assert a["round"] == b["round"]
        assert a["bytes_sent"] == b["bytes_sent"] and a["comm_rounds"] == b["comm_rounds"]
        # local work: summed and maxed over the ranks (the table rides each round's first allreduce), as the simulator's
        # board has them
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
    # sim.slowdown=[1,3] slowed the simulator's clock; the launch ran without it, and its notes say so
    assert SIM_NOTE in summary.get("notes", []) and SIM_NOTE not in read_summary(simulated_run).get("notes", [])
    assert not (REPO / "outputs").exists()  # no rank made a Hydra directory of its own


#: the note of a launched run whose config set sim.slowdown (`dane.run_config.ignored_sim_notes`)
SIM_NOTE = "sim.slowdown is the simulator's (dane simulate); a launched run ignores it"


@pytest.mark.parametrize("overrides, name, keys", [
    ((), "config", []),
    (("sim.slowdown=[1,3]",), "config", ["sim.slowdown"]),
    (("sim.slowdown=[1,3]", "sim.alpha=1e-3", "sim.topology=ps"), "config", ["sim.alpha", "sim.topology", "sim.slowdown"]),
    (("sim.alpha=null", "sim.slowdown=[1]", "sim.batched=auto"), "config", []),  # each its default: none set
    (("sim.batched=false", "sim.fail_at=[]", "sim.seed=1"), "config", ["sim.seed", "sim.batched"]),
    (("experiment=table_mnist_lenet5",), "config", ["sim.alpha", "sim.beta", "sim.single_worker"]),  # a file's keys
    ((), "simulate", ["sim.single_worker"]),
], ids=["none", "slowdown", "three", "defaults", "bool", "experiment", "simulate"])
def test_the_simulators_keys_a_config_set_are_those_off_the_configs_defaults(overrides, name, keys):
    """The ``sim.*`` keys whose composed value differs from conf/config.yaml's, in the config's order, whoever set
    them: the command line, an experiment file (`dane.run_config.simulator_keys_set`)."""
    from dane.run_config import simulator_keys_set
    from helpers import composed

    assert simulator_keys_set(composed(*overrides, name=name).sim) == keys


def test_a_launched_run_notes_the_simulators_keys_it_ignores():
    """One note naming them on a launched backend (horovod, torch, ps), which rank 0 prints and the summary keeps;
    none in the simulator (one process at m > 1), which reads them, nor in a launch that set none
    (`dane.run_config.ignored_sim_notes`)."""
    from dane.run_config import ignored_sim_notes
    from helpers import composed

    one, three = composed("sim.slowdown=[1,3]"), composed("sim.slowdown=[1,3]", "sim.alpha=1e-3", "sim.topology=ps")
    launched = ("horovod", "torch", "ps")
    assert [ignored_sim_notes(one, backend, 2) for backend in launched] == [(SIM_NOTE,)] * 3
    assert [ignored_sim_notes(three, backend, 2) for backend in launched] == [(
        "sim.alpha, sim.topology, sim.slowdown are the simulator's (dane simulate); a launched run ignores them",)] * 3
    assert ignored_sim_notes(one, "local", 2) == ignored_sim_notes(three, "local", 4) == \
        ignored_sim_notes(composed(), "torch", 2) == ()


def test_a_one_process_run_notes_the_simulators_keys_it_ignores(tmp_path):
    """``workers=1`` runs in one process on the wall clock, where no ``sim.*`` key is read: one note, as a launch
    gets (its summary keeps it), and the way into the simulator; none with ``sim.single_worker=true`` (``dane
    simulate``'s), which times it there, nor where no key is set (`dane.run_config.ignored_sim_notes`)."""
    from dane.experiments.config import run_spec
    from dane.loop.launch import execute
    from dane.run_config import ignored_sim_notes
    from helpers import composed

    said = ("sim.alpha, sim.slowdown are the simulator's; a one-process run (workers=1) ignores them: "
            "sim.single_worker=true runs it in the simulator")
    assert ignored_sim_notes(composed("sim.slowdown=[1,3]", "sim.alpha=1e-3"), "local", 1) == (said,)
    spec = run_spec(composed("workers=1", "sim.slowdown=[1,3]", "sim.alpha=1e-3", "problem.n_samples=200",
                             "problem.dim=5", "rounds=1", "quiet=true"))  # dane train's config
    assert said in execute(spec, str(tmp_path))["notes"]
    assert ignored_sim_notes(composed("sim.slowdown=[1,3]", "sim.single_worker=true"), "local", 1) == ()
    assert ignored_sim_notes(composed("sim.slowdown=[1,3]", name="simulate"), "local", 1) == ()
    assert ignored_sim_notes(composed(), "local", 1) == ()


#: a float of a record (objective, gradient norm, a step size, a suboptimality) may differ by this much, relative to
#: max(1, |value|): both sides run the same float64 kernels on one thread, and the mean of two ranks' values is one
#: rounding in any order, so on this machine every run is equal bit for bit; the bound leaves room for another
#: summation order in a collective (eps = 2.2e-16), amplified over 3 rounds by the problem's conditioning (L/mu =
#: 3.6/1.4e-3, about 3e3, in DIANA's resolved defaults), and stays far below what another draw, coin or client sample
#: moves (seed=1 moves the objective by 3e-4 to 0.6, relative, within the 3 rounds of DIANA, PP-MARINA, Newton-3PC
#: and GD with a compressed downlink)
RTOL = 1e-10


def same_record(real: dict, sim: dict) -> list[str]:
    """The keys of one round where a launched record departs from the simulator's: integers (rounds, bits, bytes,
    clients, cases) and the local work counts exactly, floats to `RTOL`; ``time_s`` is each side's own clock."""
    assert set(real) == set(sim), set(real) ^ set(sim)
    exact = [key for key in sim if key in LOCAL_WORK or not isinstance(sim[key], float)]
    return [key for key in sim if key != "time_s" and (
        real[key] != sim[key] if key in exact else abs(real[key] - sim[key]) > RTOL * max(1.0, abs(sim[key])))]


@pytest.mark.parametrize("name", list(LAUNCHERS))
@pytest.mark.parametrize("run", list(launched_runs.RUNS))
def test_a_method_launched_equals_the_simulator(run, name, simulated, fresh):
    """Each compressed method, the FedNL line, the compressed downlink and S-DANE's re-solves under ``name`` (2
    ranks, one run after another in one launch: tests/launched_runs.py) against the simulator's 2 workers: every
    record (bits up and down, bytes, local work, the adaptations' events, objectives), the resolved defaults and the
    final iterate."""
    out = launch(name, fresh)
    assert ran(simulated, run, "simulated") == {"rc": 0, "stderr": ""}
    assert [ran(out, run, rank) for rank in (0, 1)] == [{"rc": 0, "stderr": ""}] * 2
    real, sim = read_rounds(out / run), read_rounds(simulated / run)
    assert [r["round"] for r in real] == [r["round"] for r in sim] == [0, 1, 2, 3]
    assert {r["round"]: same_record(a, r) for a, r in zip(real, sim)} == {t: [] for t in range(4)}
    assert sim[-1][LOCAL_WORK[0]] > 0  # the counts compared are not all zero
    w = torch.load(simulated / run / "iterate.pt")
    torch.testing.assert_close(torch.load(out / run / "iterate.pt"), w, rtol=0, atol=RTOL * max(1.0, w.abs().max()))
    summary, expected = read_summary(out / run), read_summary(simulated / run)
    assert (summary["workers"], summary["backend"]) == (2, "horovod" if name == "horovodrun" else "torch")
    for key in ("status", "rounds", "total_bytes", "comm_rounds", "uplink_bits", "downlink_bits", "local_work",
                "compression"):
        assert summary.get(key) == expected.get(key), key
    # the defaults the run resolved (step sizes from the workers' curvature, a coin's probability): to round-off
    assert [(d["key"], d["rule"]) for d in summary.get("defaults") or []] == \
        [(d["key"], d["rule"]) for d in expected.get("defaults") or []]
    for got, want in zip(summary.get("defaults") or [], expected.get("defaults") or []):
        assert got["value"] == (pytest.approx(want["value"], rel=RTOL, abs=0) if isinstance(want["value"], float)
                                else want["value"]), got["key"]


@pytest.mark.slow
def test_workers_must_match_the_launcher(tmp_path):
    proc = train(*DANE_SMALL, "workers=3", f"out_dir={tmp_path}", launcher=torchrun(2))
    assert proc.returncode != 0
    assert "error: workers=3 but the launcher started 2 process(es)" in proc.stderr
    # torchrun prints its own traceback for a failed child; none comes from our code
    assert f"{REPO}/dane" not in proc.stderr and f"{REPO}/experiments" not in proc.stderr
