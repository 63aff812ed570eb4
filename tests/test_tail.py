"""The simulator's calibrated tail (dane/comm/tail.py): the fit, the seeded draws, the run's summary, and the
calibration file's errors.  tests/data/calibration_tail.json is a real `dane calibrate --tail` of this machine
(horovodrun -np 2, loaded), its bulky per-call timings ("raw") left out."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from dane.comm import AlphaBeta, ThreadGroup
from dane.comm.tail import ALPHA_BETA_ONLY, Tail, TailedCost, drawing, excess_samples, load_tail, tail_entry
from dane.errors import ConfigError
from dane.problems import RidgeSyntheticConfig
from dane.loop.launch import execute
from dane.records.results import read_rounds
from dane.run_config import calibration_file, cost_model, run_spec
from dane.synthetic.round_timing import PhaseRecorder
from dane.synthetic.sweep import answers
from helpers import composed

CANNED = Path(__file__).parent / "data" / "calibration_tail.json"


def test_fit_keeps_the_sample_quantiles_and_its_mean_is_the_tables_integral():
    five = Tail.fit([4.0, 0.0, 3.0, 1.0, 2.0], points=5)
    assert five.probs == (0.0, 0.25, 0.5, 0.75, 1.0) and five.excess_s == (0.0, 1.0, 2.0, 3.0, 4.0)
    assert five.mean == 2.0  # the table's integral: exactly the sample mean (here the top point is the max)
    assert five.quantile(0.625) == 2.5

    rng = np.random.default_rng(3)
    for n, sigma in ((300, 0.5), (300, 1.5), (50_000, 1.0)):
        sample = 1e-3 * rng.lognormal(0.0, sigma, n) - 5e-4  # a shifted log-normal, mean/median 1.6 at sigma = 1
        tail = Tail.fit(sample)
        assert np.array_equal(tail.excess_s[:-1], np.quantile(sample, tail.probs[:-1]))  # all but the top one
        assert tail.mean == pytest.approx(sample.mean(), rel=1e-12) and tail.excess_s[-1] >= tail.excess_s[-2]
    twin = np.random.default_rng(np.random.SeedSequence(11))  # a draw is the quantile function at a uniform draw
    one_by_one = [tail.draw(twin) for _ in range(1000)]
    assert one_by_one == list(tail.quantile(np.random.default_rng(np.random.SeedSequence(11)).random(1000)))
    draws = tail.quantile(rng.random(100_000))  # so 100,000 of them, drawn at once
    assert draws.mean() == pytest.approx(sample.mean(), rel=2e-2)
    assert np.median(draws) == pytest.approx(np.median(sample), rel=2e-2)


def test_excess_is_wall_less_the_slowest_cpu_less_the_alpha_beta_price():
    cost = AlphaBeta(alpha=1e-3, beta=1e9)
    phases = {"wall_s": [0.010, 0.005], "cpu_s": [0.002, 0.001], "nbytes": [4000, 0]}
    # T(n) = n/beta + 2 alpha at m = 2
    assert excess_samples(phases, cost, 2) == pytest.approx([0.010 - 0.002 - 4e-6 - 2e-3, 0.005 - 0.001 - 2e-3],
                                                            rel=1e-12)
    entry = tail_entry(phases, cost, 2, launcher="horovodrun -np 2 --gloo", np=2)
    assert entry["samples"] == 2 and entry["excess_s"][0] == pytest.approx(0.002, rel=1e-12)
    assert entry["launcher"] == "horovodrun -np 2 --gloo"


def test_draws_are_seeded_per_run():
    tail = Tail.fit(np.linspace(0.0, 1e-2, 11) ** 2)
    model = TailedCost(AlphaBeta(), tail, seed=(7, 0))

    def sequence(m: TailedCost) -> list[float]:
        cost = m.drawing()
        return [cost.allreduce_time(4000, 2) for _ in range(20)]

    assert sequence(model) == sequence(model)  # a fresh generator per run: the same draws, bit for bit
    assert sequence(model) != sequence(TailedCost(AlphaBeta(), tail, seed=(8, 0)))
    assert sequence(model) != sequence(TailedCost(AlphaBeta(), tail, seed=(7, 1)))
    assert drawing(model).allreduce_time(4000, 1) == 0.0  # one worker: no allreduce to pay for
    assert drawing(AlphaBeta()) == AlphaBeta()  # without a tail the model is the spec's own


def simulate(tmp_path: Path, name: str, *overrides: str) -> tuple[dict, list[dict]]:
    cfg = composed("workers=2", "rounds=6", "tol=null", "tol_abs=null", "quiet=true", *overrides)
    out = tmp_path / name
    summary = execute(run_spec(cfg), str(out))
    return summary, read_rounds(out)


def test_a_tailed_run_names_its_calibration_and_draws_the_same_times_on_both_paths(tmp_path):
    canned = json.loads(CANNED.read_text())
    ab = f"sim.alpha={canned['alpha']!r}", f"sim.beta={canned['beta']!r}"
    small = "problem.n_samples=1000", "problem.dim=50"  # the draws do not depend on the problem's size
    plain, _ = simulate(tmp_path, "plain", "sim.calibration=null", *ab, *small)
    first, records = simulate(tmp_path, "first", f"sim.calibration={CANNED}", *small)
    again, records_again = simulate(tmp_path, "again", f"sim.calibration={CANNED}", "sim.batched=true", *small)
    other, _ = simulate(tmp_path, "other", f"sim.calibration={CANNED}", "seed=1", *small)

    assert plain["calibration"] == ALPHA_BETA_ONLY
    assert first["calibration"] == {"path": str(CANNED), "sha256": hashlib.sha256(CANNED.read_bytes()).hexdigest(),
                                    "host": canned["tail"]["machine"]["host"], "launcher": "horovodrun -np 2 --gloo",
                                    "np": 2, "measured_at": canned["tail"]["measured_at"],
                                    "samples": canned["tail"]["samples"]}
    assert (first["alpha"], first["beta"]) == (canned["alpha"], canned["beta"])
    assert first["calibration_file"]["sha256"] == first["calibration"]["sha256"] and "calibration_file" not in plain
    # the batched path meets the same allreduces in the same order: the same draws
    assert again["simulated_comm_s"] == first["simulated_comm_s"]
    assert [r["round"] for r in records_again] == [r["round"] for r in records]
    assert other["simulated_comm_s"] != first["simulated_comm_s"]  # the run's seed seeds the draws
    # each allreduce paid alpha-beta plus one draw, in order, from the generator of (seed, sim.seed)
    model = cost_model(OmegaConf.create({"alpha": None, "beta": None, "calibration": str(CANNED), "seed": 0}), 0)
    rng = np.random.default_rng(np.random.SeedSequence([0, 0, 0x7A11]))
    draws = [model.tail.draw(rng) for _ in range(1 + 2 * 6)]  # round 0's allreduce and two a round
    assert first["simulated_comm_s"] - plain["simulated_comm_s"] == pytest.approx(sum(draws), rel=1e-9)


def test_without_a_tail_the_times_are_the_alpha_beta_models(tmp_path):
    """A calibration file without a tail (as `dane calibrate` writes) gives the same run as its α, β set by hand."""
    ab_only = tmp_path / "calibration.json"
    data = json.loads(CANNED.read_text())
    del data["tail"]
    ab_only.write_text(json.dumps(data))
    small = "problem.n_samples=1000", "problem.dim=50"  # the model's prices depend on the messages' sizes alone
    by_file, records = simulate(tmp_path, "file", f"sim.calibration={ab_only}", *small)
    by_hand, records_hand = simulate(tmp_path, "hand", "sim.calibration=null", f"sim.alpha={data['alpha']!r}",
                                     f"sim.beta={data['beta']!r}", *small)
    assert by_file["calibration"] == by_hand["calibration"] == ALPHA_BETA_ONLY
    # but the run names the file its alpha and beta came from, which the run given them by hand has none of
    assert by_file["calibration_file"] == {"path": str(ab_only), "sha256": hashlib.sha256(ab_only.read_bytes()).hexdigest(),
                                           "host": data["machine"]["host"], "measured_at": data["measured_at"]}
    assert "calibration_file" not in by_hand
    assert by_file["simulated_comm_s"] == by_hand["simulated_comm_s"]
    cost = AlphaBeta(alpha=data["alpha"], beta=data["beta"])
    metrics = len(RidgeSyntheticConfig().build(0, 2).metric_names)  # the messages as test_bench_simulator counts them
    sizes = [8 * (50 + metrics)] + [8 * (50 + metrics + 1), 8 * 50] * 6
    assert by_hand["simulated_comm_s"] == pytest.approx(sum(cost.allreduce_time(n, 2) for n in sizes), rel=1e-12)
    assert [r["objective"] for r in records] == [r["objective"] for r in records_hand]


@pytest.mark.parametrize("change, why", [
    ({"excess_s": [1e-3, 0.0, 2e-3], "probs": [0, 0.5, 1]}, "excess_s must not decrease"),
    ({"probs": [0, 0.5, 0.9], "excess_s": [0, 1e-3, 2e-3]}, "probs must rise strictly from 0 to 1"),
    ({"probs": [0, 1], "excess_s": ["fast", 1]}, "its excess_s holds 'fast', not a number"),
    ({"probs": [0, "0.5", 1], "excess_s": [0, 1e-3, 2e-3]}, "its probs holds '0.5', not a number"),  # float() reads it
    ({"probs": [0, 1], "excess_s": [0, True]}, "its excess_s holds True, not a number"),  # and true, as 1 s
    ({"probs": "0 1"}, "its probs is '0 1', not a list of numbers"),
    ({"probs": None}, "no 'probs' entry"),
    (None, "not a JSON object"),
])
def test_a_bad_tail_is_one_line_naming_the_file_and_the_fix(tmp_path, change, why):
    data = json.loads(CANNED.read_text())
    if change is None:
        data["tail"] = [0, 1]
    else:
        data["tail"] = {k: v for k, v in {**data["tail"], **change}.items() if v is not None}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as err:
        cost_model(OmegaConf.create({"alpha": None, "beta": None, "calibration": str(bad)}))
    line = str(err.value)
    assert "\n" not in line and str(bad) in line and why in line and "dane calibrate --tail" in line
    assert line.startswith("sim.calibration: ")
    with pytest.raises(ConfigError):  # the same line from the file alone
        load_tail(bad, AlphaBeta(), (0, 0))


@pytest.mark.parametrize("change, why", [
    ({"alpha": "5e-4"}, "its alpha is '5e-4', not a number"),  # float() would take the text
    ({"beta": True}, "its beta is True, not a number"),  # and JSON's true, as 1 byte/s
    ({"machine": {}}, "its machine is {}, not an object with a host"),
    ({"machine": {"host": 7}}, "its machine is {'host': 7}, not an object with a host"),
])
def test_an_alpha_beta_file_of_other_values_is_one_line_naming_the_file(tmp_path, change, why):
    """docs/simulator.md: a calibration file's α, β and γ must be numbers, and a machine it names an object with a
    host; any other file is refused in one line naming it, not read as 1 byte/s or as no host."""
    data = {**json.loads(CANNED.read_text()), **change}
    del data["tail"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    sim = OmegaConf.create({"alpha": None, "beta": None, "calibration": str(bad)})
    with pytest.raises(ConfigError) as err:
        cost_model(sim)
        calibration_file(sim)
    line = str(err.value)
    assert line == (f"sim.calibration: {bad} is not a calibration file ({why}); re-run `dane calibrate` to remake "
                    "it, or set sim.calibration=null for the defaults")


def test_a_file_without_a_machine_names_no_host(tmp_path):
    """A calibration written by hand (α and β alone) is read; the summary names no host for it."""
    ab_only = tmp_path / "calibration.json"
    ab_only.write_text(json.dumps({"alpha": 1e-4, "beta": 1e9}))
    sim = OmegaConf.create({"alpha": None, "beta": None, "calibration": str(ab_only)})
    assert cost_model(sim) == AlphaBeta(alpha=1e-4, beta=1e9)
    assert calibration_file(sim)["host"] is None


def test_a_cached_run_answers_only_a_job_with_its_calibration():
    cfg = {"comm": {"backend": "local"}, "sim": {"alpha": 1e-3, "beta": 1e9, "calibration": None}, "rounds": 5}
    before_tails = {"backend": "simulator", "alpha": 1e-3, "beta": 1e9, "rounds": 5, "status": "max_rounds"}
    assert answers(before_tails, cfg)  # summaries written before tails: alpha-beta only
    assert answers({**before_tails, "calibration": ALPHA_BETA_ONLY}, cfg)
    assert not answers({**before_tails, "calibration": {"path": "c.json", "sha256": "ab"}}, cfg)


def test_the_phase_recorder_ends_a_phase_at_each_counted_allreduce_after_the_first_of_a_restart():
    """`synthetic.round_timing.PhaseRecorder` (what ``dane calibrate --tail`` fits) through the communicator's
    ``allreduce_timer``: an uncounted allreduce ends no phase, and a restart opens none; each phase's bytes are its
    allreduce's message."""
    def worker(comm):
        recorder = PhaseRecorder(comm)
        for size, uncounted_before in ((2, False), (3, True), (7, False)):
            if uncounted_before:
                comm.uncounted_allreduce_mean([torch.ones(11, dtype=torch.float64)])
            comm.allreduce_mean([torch.ones(size, dtype=torch.float64)])
        recorder.restart()
        comm.allreduce_mean([torch.ones(4, dtype=torch.float64)])
        comm.allreduce_mean([torch.ones(5, dtype=torch.float64)])
        return recorder.nbytes, len(recorder.wall), len(recorder.cpu)

    for nbytes, walls, cpus in ThreadGroup(2).run(worker):
        assert nbytes == [8 * 3, 8 * 7, 8 * 5] and walls == cpus == 3
