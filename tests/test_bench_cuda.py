"""scripts/bench_cuda.py without a GPU: its ratios from hand-made runs, and the skip it writes here (never timed)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.helpers import REPO, env

from scripts import bench_cuda as bench


def test_ratios_are_cpu_over_cuda_medians_and_the_simulators_m1_over_the_launched_np1():
    launched = [{"device": "cuda", "np": 1, "round_s": t} for t in (0.5, 0.4, 0.6)]
    launched += [{"device": "cpu", "np": 1, "round_s": t} for t in (2.0, 3.0)]
    launched += [{"device": "cuda", "np": 2, "round_s": 0.25}, {"device": "cpu", "np": 2, "status": "launch_failed"}]
    simulated = [{"device": "cuda", "workers": 1, "wall_round_s": 0.6, "simulated_round_s": 0.55},
                 {"device": "cpu", "workers": 1, "wall_round_s": 3.0, "simulated_round_s": 2.75}]
    out = bench.ratios({"launched": {"runs": launched}, "simulated": {"runs": simulated}})
    assert out["launched_np1_cpu_over_cuda"] == pytest.approx(2.5 / 0.5)  # medians: 2.5 over 0.5
    assert out["launched_np2_cpu_over_cuda"] is None  # the CPU launch failed: no ratio, not a made-up one
    assert out["simulated_m1_wall_cpu_over_cuda"] == pytest.approx(3.0 / 0.6)
    assert out["sim_vs_launched_np1_cuda"] == pytest.approx(0.55 / 0.5)
    assert out["sim_vs_launched_np1_cpu"] == pytest.approx(2.75 / 2.5)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the script would measure")
def test_without_a_gpu_it_records_why_and_keeps_the_other_sections(tmp_path):
    out = tmp_path / "bench.json"
    out.write_text(json.dumps({"strong_scaling": {"ratio": 1.9}}))
    subprocess.run([sys.executable, "-m", "scripts.bench", "cuda", "--out", str(out)], cwd=REPO, env=env(), check=True,
                   capture_output=True, text=True, timeout=120)
    written = json.loads(out.read_text())
    assert written["strong_scaling"] == {"ratio": 1.9}
    assert written["cuda"]["skipped"] == "torch sees no CUDA device"
    assert "launched" not in written["cuda"]
    assert written["cuda"]["convex"] == {"skipped": "torch sees no CUDA device"}


def test_convex_case_data_and_one_run_on_the_cpu():
    """The convex section's pieces on a tiny case: CSR rows at the asked density, 0/1 labels, and a run's record."""
    X, y = bench.convex_data(200, 50, 0.1, logistic=True)
    assert X.format == "csr" and X.nnz == 1000 and set(y) == {0.0, 1.0}
    assert all(len(set(X.indices[a:b])) == 5 for a, b in zip(X.indptr, X.indptr[1:]))  # 5 distinct columns a row
    from dane.problems import LogReg

    run = bench.convex_run(LogReg(X, y, lam=1e-2, local_solver="cg", device="cpu"), workers=2, rounds=3)
    assert run["clock"] == "thread_cpu_time" and run["simulated_round_s"] > 0 and run["w"].shape == (50,)


@pytest.mark.slow  # ~45 s on a loaded 2-core machine: four LeNet-5 rounds over the digits shard
def test_the_plain_loop_does_a_dane_rounds_work_and_reaches_its_iterate():
    """Item 5's baseline on the CPU, on digits (no MNIST needed; a round is 14 steps of batch 100): at m = 1,
    η = 1, μ = 0 DANE's correction term ∇O_i(w_t) − η g is zero, so its round is the plain loop's full gradient,
    evaluation and SGD pass on the same minibatches, and the final iterates are equal (bit for bit here: the same
    operations in the same order on one thread)."""
    out = bench.baseline(1, ["cpu"], config=lambda device: bench.baseline_config(device, "digits"), repeats=1)
    cpu = out["cpu"]
    assert cpu["iterate_rel_diff"] == 0.0
    assert cpu["dane_round_s"]["n"] == cpu["plain_loop_round_s"]["n"] == 1
    ratio = cpu["dane_round_s"]["median"] / cpu["plain_loop_round_s"]["median"]
    assert cpu["dane_round_over_plain_loop"] == pytest.approx(ratio) and cpu["goal_met"] is None  # a goal on CUDA only
