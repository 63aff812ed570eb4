"""Asynchronous and stale-synchronous SGD (comm.staleness, dane.loop.asynchronous): the event-driven simulator first,
then real torchrun runs through the parameter server (dane.loop.asynchronous.protocol).

- s=0 is today's synchronous sync_sgd, bit for bit; one asynchronous worker is sync_sgd with one worker;
- SSP never lets a worker start more than s clocks ahead of the slowest (the bound is reached);
- the fully asynchronous staleness pattern of two workers, one 3x slower, is the one derived by hand;
- the update order and the iterates are identical on a rerun with the same seed;
- asynchronous SGD trains the digits MLP to >= 90% test accuracy;
- under torchrun, one asynchronous worker follows sync_sgd, and SSP keeps its bound.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from dane.loop.asynchronous.simulator import EventSimulator
from dane.comm import ParameterServerCost, Stragglers
from dane.comm.threads import DeviceTurns
from dane.records import confusion as confusion_files
from dane.records.confusion import JSON_FILE
from dane.loop.launch import execute
from dane.numerics.inner import preload_optimizers
from dane.records.results import read_rounds, read_summary
from dane.experiments.config import run_spec
from helpers import composed

LOGREG = ("problem=logreg", "problem.optimum=auto", "algorithm=sync_sgd", "algorithm.batch_size=20", "algorithm.lr=0.05",
          "algorithm.steps_per_round=4", "quiet=true")
PS = ("sim.topology=ps",)
FAST_LINK = ("sim.alpha=0", "sim.beta=1e12", "sim.gamma=1e12")  # messages take ~1e-9 s against 1e-3 s per step

# sync_sgd's workers import what a torch optimizer's first step imports (torch._dynamo: seconds, once a process) as
# they set up: here, at collection, so that it is not billed to whichever test first steps an optimizer
preload_optimizers()



def run(*overrides: str, out_dir: Path | None = None) -> tuple[dict, dict]:
    collect: dict = {}
    summary = execute(run_spec(composed(*overrides)), str(out_dir) if out_dir else None, collect=collect)
    return summary, collect


def objectives(collect: dict) -> list[float]:
    return [r["objective"] for r in collect["records"]]


def test_staleness_zero_is_todays_sync_sgd_bit_for_bit():
    _, plain = run(*LOGREG, "workers=3", "rounds=4")
    _, zero = run(*LOGREG, *PS, "workers=3", "rounds=4", "comm.staleness=0")
    assert torch.equal(plain["w"], zero["w"])
    assert objectives(plain) == objectives(zero)
    assert "updates" not in zero  # the synchronous path: no event simulator


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_one_asynchronous_worker_is_sync_sgd_with_one_worker(momentum):
    """The worker's step and the server's update are sync_sgd's own math: with m=1 no update is ever stale."""
    common = (*LOGREG, f"algorithm.momentum={momentum}", "workers=1", "rounds=5")
    _, sync = run(*common)
    summary, asynchronous = run(*common, *PS, "comm.staleness=inf")
    assert torch.equal(sync["w"], asynchronous["w"])
    assert objectives(sync) == objectives(asynchronous)
    assert summary["asynchronous"]["staleness_histogram"] == {"0": 20}
    # one worker in the event simulator is a simulated run too: its time is the modelled clock, named so
    assert (summary["backend"], summary["time_s_clock"]) == ("simulator", "simulated")
    assert summary["simulated_time_s"] == summary["time_s"] and summary["calibration"] == "alpha-beta only"


def test_one_asynchronous_local_sgd_worker_is_local_sgd():
    common = ("problem=logreg", "algorithm=local_sgd", "algorithm.local_steps=3", "workers=1", "rounds=5", "quiet=true")
    _, sync = run(*common)
    _, asynchronous = run(*common, *PS, "comm.staleness=2")
    torch.testing.assert_close(asynchronous["w"], sync["w"], rtol=0, atol=1e-12)


def test_the_set_up_collective_is_counted_as_a_synchronous_run_counts_it():
    """local_sgd's lr=null takes one allreduce before round 0: round 0 of the asynchronous run counts it (its bytes
    and call), as the synchronous run's does; each later round adds the m pushes' mean."""
    common = ("problem=logreg", "algorithm=local_sgd", "workers=2", "rounds=2", "quiet=true", *PS)
    _, sync = run(*common)
    _, asynchronous = run(*common, "comm.staleness=1")
    first = [(r["bytes_sent"], r["comm_rounds"]) for r in (sync["records"][0], asynchronous["records"][0])]
    assert first[0] == first[1] and first[0][1] == 1 and first[0][0] > 0
    d = asynchronous["w"].numel()
    assert [r["comm_rounds"] for r in asynchronous["records"]] == [1, 2, 3]
    assert [r["bytes_sent"] - first[1][0] for r in asynchronous["records"]] == [0, 8 * d, 16 * d]


@pytest.mark.parametrize("s", [1, 4])
def test_ssp_never_lets_a_worker_run_more_than_s_clocks_ahead(s, tmp_path):
    summary, collect = run(*LOGREG, *PS, "workers=3", "sim.slowdown=[1,1,3]", "sim.alpha=1e-5", "rounds=12",
                           f"comm.staleness={s}", out_dir=tmp_path)
    updates = collect["updates"]
    m = 3
    assert len(updates) == 12 * m * 4
    assert max(u.clock_lead for u in updates) == s  # the bound holds, and the 3x slower worker makes it bind
    assert max(u.staleness for u in updates) <= (m - 1) * (2 * s + 1)
    stats = summary["asynchronous"]
    assert stats["ssp_wait_s"][0] > 0 and stats["ssp_wait_s"][1] > 0 and stats["ssp_wait_s"][2] == 0
    # the fast workers are held back: at most s + 1 clocks more than the slow one
    assert max(stats["updates_per_worker"]) - stats["updates_per_worker"][2] <= s + 1
    # the files: every update in updates.jsonl, its histogram in summary.json, per-round maxima in rounds.jsonl
    lines = [json.loads(line) for line in (tmp_path / "updates.jsonl").read_text().splitlines()]
    assert [line["staleness"] for line in lines] == [u.staleness for u in updates]
    assert sum(read_summary(tmp_path)["asynchronous"]["clock_lead_histogram"].values()) == len(updates)
    rounds = read_rounds(tmp_path)
    per_round = 3 * 4
    for r in rounds[:-1]:
        chunk = updates[r["round"] * per_round:(r["round"] + 1) * per_round]
        assert r["staleness_max"] == max(u.staleness for u in chunk)
        assert r["clock_lead_max"] == max(u.clock_lead for u in chunk)
        assert r["staleness_mean"] == pytest.approx(sum(u.staleness for u in chunk) / per_round)


def test_asynchronous_workers_are_not_held_back():
    summary, collect = run(*LOGREG, *PS, "workers=3", "sim.slowdown=[1,1,3]", "sim.alpha=1e-5", "rounds=12",
                           "comm.staleness=inf")
    assert max(u.clock_lead for u in collect["updates"]) > 4
    assert summary["asynchronous"]["ssp_wait_s"] == [0.0, 0.0, 0.0]


def test_asynchronous_staleness_of_two_workers_one_three_times_slower():
    """Worker 0 steps every c, worker 1 every 3c (messages ~free).  Worker 1's j-th push lands at 3jc, just before
    worker 0's (3j)-th, which worker 0 computed on the version before it: so worker 0's k-th update is 1 stale
    when 3 divides k and fresh otherwise.  Worker 1's j-th update saw worker 0's 2 first updates (j = 1),
    then 3 per step."""
    summary, collect = run(*LOGREG, *PS, *FAST_LINK, "workers=2", "sim.slowdown=[1,3]", "rounds=6",
                           "comm.staleness=inf")
    updates = collect["updates"]
    assert len(updates) == 6 * 2 * 4
    assert [u.rank for u in updates[:11]] == [0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1]
    fast = [u for u in updates if u.rank == 0]
    slow = [u for u in updates if u.rank == 1]
    assert [u.staleness for u in fast] == [int(k % 3 == 0) for k in range(1, len(fast) + 1)]
    assert [u.staleness for u in slow] == [2] + [3] * (len(slow) - 1)
    assert len(fast) == 36 and len(slow) == 12
    assert summary["asynchronous"]["staleness_histogram"] == {"0": 24, "1": 12, "2": 1, "3": 11}
    assert summary["simulated_compute_clock"] == "sim_step_time"  # modelled steps, not measured ones


def test_same_seed_same_update_order_and_iterates():
    common = (*LOGREG, *PS, "workers=3", "sim.slowdown=[1,2,3]", "sim.delay_mean=5e-4", "rounds=5",
              "comm.staleness=2")
    _, first = run(*common, "sim.seed=7")
    _, again = run(*common, "sim.seed=7")
    _, other = run(*common, "sim.seed=8")
    assert first["updates"] == again["updates"]
    assert first["records"] == again["records"]
    assert torch.equal(first["w"], again["w"])
    assert [u.rank for u in other["updates"]] != [u.rank for u in first["updates"]]


def test_asynchronous_local_sgd_under_ssp_keeps_pace_with_synchronous_local_sgd():
    """Local gradient descent (lr = 1/max L_i, estimated in lockstep before the asynchronous run) on logistic
    regression: with SSP (s=2) and one worker 3x slower, the same number of updates gets as far as the
    synchronous rounds: within 5% of their final suboptimality, and below 3% of where it started."""
    common = ("problem=logreg", "problem.optimum=auto", "algorithm=local_sgd", "algorithm.local_steps=5",
              "algorithm.aggregate=weighted",
              "workers=3", "sim.slowdown=[1,1,3]", "rounds=30", "quiet=true")
    sync, _ = run(*common)
    summary, collect = run(*common, *PS, "comm.staleness=2")
    assert max(u.clock_lead for u in collect["updates"]) == 2
    subopt = [r["suboptimality"] for r in collect["records"]]
    assert all(b < a for a, b in zip(subopt, subopt[1:]))
    assert summary["final_suboptimality"] <= 1.05 * sync["final_suboptimality"]
    assert summary["final_suboptimality"] < 0.03 * subopt[0]


def test_asynchronous_sgd_trains_the_digits_mlp_to_90_percent(tmp_path, monkeypatch):
    # the confusion matrix's JSON is read below; its figure, most of this run's time, is tests/test_neural.py's
    monkeypatch.setattr(confusion_files, "plot_confusion", lambda *args, **kwargs: None)
    summary, _ = run("problem=digits_mlp", "problem.model.hidden=[32]", "algorithm=sync_sgd", "algorithm.batch_size=32",
                     "algorithm.steps_per_round=10", "algorithm.lr=0.05", *PS, "workers=3", "sim.slowdown=[1,1,3]",
                     "comm.staleness=inf", "rounds=5", "quiet=true", out_dir=tmp_path)
    assert summary["final_test_accuracy"] >= 0.90
    assert summary["asynchronous"]["updates"] == 5 * 3 * 10
    confusion = json.loads((tmp_path / JSON_FILE).read_text())  # the whole test set's, from every worker's slice
    assert confusion["test_rows"] == 360
    assert confusion["accuracy"] == pytest.approx(summary["final_test_accuracy"])


def test_stored_runs_are_told_apart_by_staleness():
    """A sweep reuses a stored run only for the same job: comm.staleness (and, when > 0, sim.step_time) count;
    a run stored before comm.staleness existed was synchronous."""
    from dane.synthetic.sweep import identity

    sim = {"slowdown": [1, 1, 3], "delay_mean": 0.0, "seed": 0}
    base = {"algorithm": {"name": "sync_sgd"}, "problem": {"name": "logreg"}, "workers": 3, "seed": 0,
            "dtype": "float64", "comm": {"backend": "local"}, "sim": sim}
    sync = {**base, "comm": {"backend": "local", "staleness": 0}, "sim": {**sim, "step_time": 1e-3}}
    ssp = {**sync, "comm": {"backend": "local", "staleness": 2}}
    assert identity(base) == identity(sync) == identity({**sync, "sim": {**sim, "step_time": 5e-3}})
    assert identity(ssp) != identity(sync)
    assert identity(ssp) != identity({**ssp, "comm": {"backend": "local", "staleness": float("inf")}})
    assert identity(ssp) != identity({**ssp, "sim": {**sim, "step_time": 5e-3}})


# ---------------------------------------------------------------- real runs: torchrun, comm=ps (dane.loop.asynchronous.protocol)
def torchrun_train(tmp_path: Path, processes: int, *overrides: str) -> tuple[dict, list[dict], list[dict]]:
    from helpers import torchrun, train

    proc = train(*overrides, "comm=ps", f"out_dir={tmp_path}", "quiet=true", launcher=torchrun(processes))
    assert proc.returncode == 0, proc.stderr[-3000:]
    updates = [json.loads(line) for line in (tmp_path / "updates.jsonl").read_text().splitlines()]
    return read_summary(tmp_path), read_rounds(tmp_path), updates


@pytest.mark.slow
def test_torchrun_one_asynchronous_worker_follows_sync_sgd(tmp_path):
    """With one worker nothing is stale, and the server's optimizer step is sync_sgd's: the same objectives."""
    summary, rounds, updates = torchrun_train(tmp_path, 2, *LOGREG, "rounds=5", "comm.staleness=inf")
    _, sync = run(*LOGREG, "workers=1", "rounds=5")
    assert [r["objective"] for r in rounds] == pytest.approx(objectives(sync), rel=1e-12, abs=0)
    assert summary["backend"] == "ps" and summary["asynchronous"]["staleness_histogram"] == {"0": 20}
    assert [u["version"] for u in updates] == list(range(1, 21))
    # the pushes and replies are on the link, counted alike at both ends: 20 updates up, 19 parameters down (the
    # 20th push is answered with stop), over the evaluations' messages; they are the server's pushes too
    ps, payload = summary["parameter_server"], rounds[-1]["bytes_sent"] // 20  # the records' bytes: the pushes
    (link,) = ps["links"]
    assert ps["worker_links"] == ps["links"] and ps["server"][0]["pushes"] >= 20
    assert link["to_server_bytes"] >= 20 * payload and link["to_worker_bytes"] >= 19 * payload
    assert link["to_server_bytes"] - 20 * payload < 20 * payload  # the evaluations' metrics, a few values a round
    server = ps["server"][0]  # its busy and waiting stretches are disjoint, within its uptime over all three phases
    assert 0 < server["busy_s"] and server["busy_s"] + server["wait_s"] <= server["uptime_s"]


@pytest.mark.slow  # two torchrun launches (about 40 s); the simulator tests cover staleness fast
@pytest.mark.parametrize("s", [1, "inf"])
def test_torchrun_stale_synchronous_and_asynchronous_sgd(s, tmp_path):
    summary, rounds, updates = torchrun_train(tmp_path, 4, *LOGREG, "rounds=6", f"comm.staleness={s}")
    m = 3
    assert len(updates) == 6 * m * 4 == summary["asynchronous"]["updates"]
    assert [u["version"] for u in updates] == list(range(1, len(updates) + 1))
    assert all(u["staleness"] == u["version"] - 1 - u["pulled"] >= 0 for u in updates)
    if s == 1:
        assert max(u["clock_lead"] for u in updates) <= 1
    assert len(rounds) == 7 and rounds[-1]["suboptimality"] < 0.2 * rounds[0]["suboptimality"]
    assert [r["comm_rounds"] for r in rounds] == [4 * t for t in range(7)]
    assert sum(summary["asynchronous"]["staleness_histogram"].values()) == len(updates)


@pytest.mark.slow
def test_torchrun_a_worker_slowed_three_times_pushes_a_third_as_often_unless_ssp_holds_the_others(tmp_path):
    """comm.slowdown=[1,3] under real torchrun (2 workers, 1 server): asynchronous, the slowed worker's steps take
    3x as long, so it makes about a third of the fast one's pushes (asserted >= 1.8x, for a loaded machine); under
    SSP with s=1 the fast worker is held back instead: at most one clock ahead, so the counts stay within 2."""
    from collections import Counter

    _, _, updates = torchrun_train(tmp_path / "async", 3, *LOGREG, "rounds=6", "comm.staleness=inf",
                                   "comm.slowdown=[1,3]")
    pushes = Counter(u["rank"] for u in updates)
    assert pushes[0] >= 1.8 * pushes[1], pushes
    _, _, updates = torchrun_train(tmp_path / "ssp", 3, *LOGREG, "rounds=6", "comm.staleness=1", "comm.slowdown=[1,3]")
    pushes = Counter(u["rank"] for u in updates)
    assert max(u["clock_lead"] for u in updates) <= 1 and abs(pushes[0] - pushes[1]) <= 2, pushes


class Idle:
    """A worker whose step changes nothing: the meters below see only the simulator's calls around it."""

    updates_per_round = 1

    def worker_update(self, w: torch.Tensor) -> list[torch.Tensor]:
        return [torch.zeros_like(w)]


class Failing(Idle):
    def worker_update(self, w: torch.Tensor) -> list[torch.Tensor]:
        raise RuntimeError("step failed")


class Server:
    def __init__(self):
        self.w = torch.zeros(3, dtype=torch.float64)

    def apply(self, update: list[torch.Tensor], rank: int) -> None:
        self.w += update[0]


class ScriptedMeter:
    """A meter that reads no clock: each step reads 0.25 s, and every call is logged."""

    name = "scripted"

    def __init__(self):
        self.calls = []

    def start(self) -> float:
        self.calls.append("start")
        return 100.0

    def read(self, mark: float) -> float:
        self.calls.append(("read", mark))
        return 0.25

    def stop(self) -> None:
        self.calls.append("stop")


def two_idle_workers(meter, steps=4) -> EventSimulator:
    """Two workers, fully asynchronous, after ``steps`` server updates: both start at once, and each of the 4 pushes
    (alternating, ties by rank) starts the next step, so each worker has made 3 steps."""
    sim = EventSimulator([Idle(), Idle()], Server(), staleness=math.inf, cost=ParameterServerCost(),
                         stragglers=Stragglers(), step_time=1.0, meter=meter)
    for _ in range(steps):
        sim.advance()
    return sim


def test_measured_step_times_are_the_meters_readings_and_the_modelled_clock_drives_the_run():
    """``measured_compute_s`` sums the meter's readings, one per step between its start and its stop; the modelled
    clock (``step_time``) is what drives the run, whatever the meter reads."""
    meter = ScriptedMeter()
    sim = two_idle_workers(meter)
    steps = [3, 3]
    assert sim.stats()["measured_compute_s"] == [n * 0.25 for n in steps]
    assert sim.stats()["modelled_compute_s"] == [n * 1.0 for n in steps]
    assert meter.calls == ["start", ("read", 100.0), "stop"] * sum(steps)
    failed = ScriptedMeter()
    with pytest.raises(RuntimeError, match="step failed"):
        EventSimulator([Failing()], Server(), staleness=math.inf, cost=ParameterServerCost(), stragglers=Stragglers(),
                       step_time=1.0, meter=failed)
    assert failed.calls == ["start", "stop"]  # a GPU's turn is given back even when the step fails


def test_the_simulator_meters_a_cpu_step_by_its_threads_cpu_time_and_a_gpu_step_by_a_drained_turn():
    """No meter given: the thread's CPU time (`meter_for` of CPU devices).  `DeviceTurns` (what `meter_for` gives
    for a GPU; its wall-clock reading is tests/test_simulator.py's) drains the queues at both ends of every step."""
    assert two_idle_workers(None).meter.name == "thread_cpu_time"
    drains = []
    sim = two_idle_workers(DeviceTurns(lambda: drains.append(1)))
    assert len(drains) == 2 * (3 + 3)
    assert sim.stats()["modelled_compute_s"] == [3.0, 3.0]


def test_an_asynchronous_run_notes_its_workers_defaults():
    """steps_per_round=null: a pass over the worker's own rows (no round 0 to agree in), noted as
    `sgd_steps_per_round`; local_sgd's lr=null as `local_step`: the summary holds worker 0's as a synchronous run's."""
    base = [a for a in LOGREG if not a.startswith("algorithm.steps_per_round")]
    summary, _ = run(*base, *PS, *FAST_LINK, "comm.staleness=1", "workers=2", "rounds=1", "algorithm.steps_per_round=null")
    (entry,) = summary["defaults"]
    assert (entry["key"], entry["rule"], entry["stats"]) == ("algorithm.steps_per_round", "sgd_steps_per_round",
                                                            {"rows": 285.0, "batch_size": 20})  # 569 rows over 2
    assert entry["value"] == 285 // 20 and summary["package_rules_applied"] is True
    local, _ = run("problem=logreg", "algorithm=local_sgd", "quiet=true", *PS, *FAST_LINK, "comm.staleness=1",
                   "workers=2", "rounds=1", "resume=false")  # resume=false: no resume, which this path allows
    assert [(e["key"], e["rule"]) for e in local["defaults"]] == [("algorithm.lr", "local_step")]
