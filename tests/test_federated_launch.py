"""The federated methods under real launchers: the same sampled clients and iterates as the simulator.

Under horovodrun or torchrun every rank draws S_t from the shared seeded sampler and a rank outside
S_t sends zeros (`dane.sampling`); the records (metrics, participants' bytes, sampled-set sizes) and
the final iterate must equal the in-process simulator's with the same shards.
"""
from __future__ import annotations

import json

import pytest
import torch

from helpers import horovodrun, simulated_run, torchrun, train

JOBS = {
    "scaffold_sampled": ("algorithm=scaffold", "algorithm.clients_per_round=1", "algorithm.local_steps=3"),
    "acc_sdane": ("algorithm=acc_sdane", "algorithm.lam=0.05"),
}
PROBLEM = ("problem=ridge_synthetic", "problem.n_samples=400", "problem.dim=20", "rounds=5", "quiet=true",
           "save_iterate=true")
EXACT = {"round", "comm_rounds", "bytes_sent", "clients", "uplink_bytes", "downlink_bytes"}


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module", params=[
    "scaffold_sampled", pytest.param("acc_sdane", marks=pytest.mark.slow)])  # all slow: each launches processes (test_launchers covers the launch fast)
def simulated(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param) / "sim"
    return request.param, simulated_run(out, *JOBS[request.param], *PROBLEM, workers=2)


@pytest.mark.parametrize("launch", [torchrun, pytest.param(horovodrun, marks=pytest.mark.slow)],
                         ids=["torchrun", "horovodrun"])
@pytest.mark.slow
def test_launched_federated_run_equals_the_simulator(launch, simulated, tmp_path):
    job, sim = simulated
    proc = train(*JOBS[job], *PROBLEM, f"out_dir={tmp_path}", launcher=launch(2))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    real, want = records(tmp_path), records(sim)
    assert len(real) == len(want) == 6
    for a, b in zip(real, want):
        assert a.keys() == b.keys()
        for key in EXACT & a.keys():
            assert a[key] == b[key], (key, a["round"])
        assert abs(a["suboptimality"] - b["suboptimality"]) <= 1e-12 * max(1.0, b["suboptimality"])
    torch.testing.assert_close(torch.load(tmp_path / "iterate.pt"), torch.load(sim / "iterate.pt"), rtol=0, atol=1e-12)
