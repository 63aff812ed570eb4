"""The staleness figure (paper_figs/staleness.py) from fake runs whose numbers are known: the asynchronous
curves are read as logged, the synchronous one is re-timed on the event simulator's model by hand."""
from __future__ import annotations

import json

import pytest
import yaml
from omegaconf import OmegaConf

from dane.comm import ParameterServerCost
from dane.records.results import RunWriter
from dane.experiments.config import cost_model
from dane.paper_figs import make_all, staleness
from dane.synthetic.sweep import composed_job, job_name

WHERE = staleness.Setting("digits MLP", "digits_mlp", rounds=3, steps_per_round=2)
PAYLOAD = 3000  # bytes of one synchronous allreduce, all of which a parameter server's worker sends (its bytes_sent)
#: one synchronous step by hand: the 3x slower worker's 3 x 10 ms, then 3 pushes and 3 pulls of 3000 bytes
#: through one server, 2*3*(550 µs + 3000/4e8 s), and the server's sum 3*3000/2e9 s
SYNC_STEP = 0.03 + 6 * (5.5e-4 + 7.5e-6) + 4.5e-6
ASYNC_STATS = {"1": dict(staleness_max=4, staleness_mean=1.0, clock_lead_max=1, clock_lead_histogram={"0": 1, "1": 3}),
               "4": dict(staleness_max=6, staleness_mean=1.5, clock_lead_max=4, clock_lead_histogram={"0": 2, "4": 2}),
               "inf": dict(staleness_max=9, staleness_mean=2.0, clock_lead_max=7, clock_lead_histogram={"7": 1})}


def accuracy(variant: int, k: int) -> float:
    return 0.1 * (k + 1) + 0.01 * variant


def fake_run(root, job, variant: int, staleness: str):
    """A run as `experiments.simulate` writes it: round k logs accuracy(variant, k), time 0.1 (variant + 1) k."""
    cfg = composed_job(tuple(job))
    writer = RunWriter(root / job_name(job))
    writer.write_text("config.yaml", yaml.safe_dump(cfg))
    for k in range(WHERE.rounds + 1):
        steps = WHERE.steps_per_round * k
        writer.write_round({"round": k, "time_s": 0.1 * (variant + 1) * k, "bytes_sent": PAYLOAD * steps,
                            "comm_rounds": steps, "test_accuracy": accuracy(variant, k)})
    summary = {"algorithm": "sync_sgd", "workers": 3, "status": "max_rounds", "rounds": WHERE.rounds,
               "backend": "simulator", **cost_model(OmegaConf.create(cfg["sim"])).describe()}
    if staleness != "0":
        summary["asynchronous"] = ASYNC_STATS[staleness]
    writer.write_summary(summary)
    writer.close()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    for variant, (label, s) in enumerate(staleness.STALENESS.items()):
        fake_run(root, staleness.job(label, WHERE), variant, s)
    return root


def test_sync_time_is_the_slowest_step_plus_a_server_allreduce_per_step():
    cost = ParameterServerCost(alpha=1e-3, beta=1e6, gamma=1e7)
    # 2 workers, slowdown [1, 4] of 5 ms; 3 steps of 1000 bytes (a worker's bytes_sent: the whole message):
    # per step 20 ms + 2*2*(1 ms + 1 ms) + 2*1000/1e7 s = 28.2 ms
    record = {"comm_rounds": 3, "bytes_sent": 3000}
    assert staleness.sync_time(record, cost=cost, workers=2, step_time=5e-3, slowdown=[1.0, 4.0]) == \
        pytest.approx(3 * 0.0282, rel=1e-12)
    assert staleness.sync_time({"comm_rounds": 0, "bytes_sent": 0}, cost=cost, workers=2, step_time=5e-3,
                               slowdown=[1.0]) == 0.0


def test_curves_read_the_asynchronous_times_and_retime_the_synchronous_one(results):
    curves = staleness.table(results, WHERE)
    assert list(curves) == list(staleness.STALENESS)
    for variant, c in enumerate(curves.values()):
        assert c.rounds == [0, 1, 2, 3]
        assert c.accuracy == pytest.approx([accuracy(variant, k) for k in range(4)], rel=1e-12)
        assert c.gradients == [3 * 2 * k for k in range(4)]
        if variant == 0:  # re-timed: 2 steps a round at SYNC_STEP each, not the logged 0.1 k
            assert c.time_s == pytest.approx([2 * k * SYNC_STEP for k in range(4)], rel=1e-12)
        else:
            assert c.time_s == pytest.approx([0.1 * (variant + 1) * k for k in range(4)], rel=1e-12)
    text = staleness.markdown(curves, "model")
    assert f"| sync SGD (s=0) | 0.4000 | {6 * SYNC_STEP:.4f} | 0 / 0 | 0 / 0 |" in text
    assert "| SSP s=1 | 0.4100 | 0.6000 | 4 / 1.00 | 1 / 0.75 |" in text
    assert "| SSP s=4 | 0.4200 | 0.9000 | 6 / 1.50 | 4 / 2.00 |" in text
    assert "| async SGD (s=∞) | 0.4300 | 1.2000 | 9 / 2.00 | 7 / 7.00 |" in text


def test_main_writes_the_figure_with_its_model_and_provenance(results, tmp_path):
    paths = staleness.main(results, tmp_path, WHERE)
    assert {p.name for p in paths} == {f"staleness.{ext}" for ext in ("png", "pdf", "md", "json")}
    assert all(p.stat().st_size > 0 for p in paths)
    sidecar = json.loads((tmp_path / "staleness.json").read_text())
    assert len(sidecar["runs"]) == 4 and sidecar["seeds"] == [0] and sidecar["problem"] == "digits_mlp"
    assert "step_time=10 ms" in sidecar["cost"] and "α=550 µs" in sidecar["caption"]
    assert "dane.paper_figs.staleness" in make_all.FIGURES


def test_jobs_are_four_distinct_runs_with_one_seed():
    jobs = staleness.jobs(WHERE)
    assert len({job_name(j) for j in jobs}) == 4
    assert {composed_job(j)["seed"] for j in jobs} == {0}
    assert [composed_job(j)["comm"]["staleness"] for j in jobs] == [0, 1, 4, float("inf")]
    # an asynchronous server steps once per gradient: lr/m, so a pass over the data moves as far as sync SGD's
    assert [composed_job(j)["algorithm"]["lr"] for j in jobs] == pytest.approx([0.05] + [0.05 / 3] * 3, rel=1e-4)


def test_a_stored_run_that_counted_a_rings_share_is_not_retimed(results):
    """A synchronous ``sim.topology=ps`` run stored before its ``bytes_sent`` counted each allreduce's whole message
    (a ring's 2(m-1)/m share then) has no ``bytes_sent_per_allreduce`` in its summary: it answers no timed job, so
    the figure re-runs it rather than re-time a share as a message."""
    from dane.records.results import read_summary
    from dane.synthetic.sweep import RunIndex, answers

    job = staleness.job("sync SGD (s=0)", WHERE)
    run = RunIndex(results).find(job)
    summary = read_summary(run)
    assert summary["bytes_sent_per_allreduce"] == "message"
    before = {k: v for k, v in summary.items() if k != "bytes_sent_per_allreduce"}
    cfg = composed_job(tuple(job))
    assert answers(summary, cfg) and not answers(before, cfg) and answers(before, cfg, timed=False)
