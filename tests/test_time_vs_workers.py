"""Time against workers (scripts/time_vs_workers.py and paper_figs/time_vs_workers.py).

The figure's numbers are checked on a hand-made results tree whose answers are known
(time to target, per-epoch times, mean and spread over seeds, the ideal line, the
re-timing of a run simulated with another α-β); the script is run for real in its
``--quick`` form, simulator only.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dane.paper_figs import time_vs_workers as fig

REPO = Path(__file__).resolve().parents[1]
CALIBRATION = {"alpha": 5e-4, "beta": 1e9, "measured_at": "2026-01-02T03:04:05+0000",
               "machine": {"load_avg": [0.5, 0.4, 0.3]}, "source": "test"}
DATA = {"name": "mnist", "train_size": 8000, "test_size": 2000,
        "split": "t10k split: 10000 t10k images split 8000/2000 (stratified, by the run's seed)"}


def write_run(root: Path, name: str, *, backend: str, workers: int, seed: int, times, accuracies,
              target: float = 0.95, alpha: float | None = None, comm_rounds=None,
              problem: str = "mnist_lenet5") -> Path:
    run = root / problem / name
    run.mkdir(parents=True)
    comm_rounds = comm_rounds or [2 * t for t in range(len(times))]
    with open(run / "rounds.jsonl", "w") as f:
        for t, (time_s, acc, calls) in enumerate(zip(times, accuracies, comm_rounds)):
            f.write(json.dumps({"round": t, "time_s": time_s, "bytes_sent": 1000 * calls, "comm_rounds": calls,
                                "objective": 1.0 / (t + 1), "test_accuracy": acc}) + "\n")
    summary = {"algorithm": "dane", "problem": problem, "workers": workers, "backend": backend,
               "status": "target_reached" if max(accuracies) >= target else "max_rounds", "rounds": len(times) - 1,
               "data": DATA, "provenance": {"git_commit": "abc123", "started_at": "2026-01-02T04:00:00+0000",
                                            "load_avg": [1.0 + seed, 1.0, 1.0]}}
    if backend == "simulator":
        summary.update(alpha=CALIBRATION["alpha"] if alpha is None else alpha, beta=CALIBRATION["beta"])
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "config.yaml").write_text(yaml.safe_dump({"seed": seed, "rounds": 30, "early_stop": {"target": target}}))
    return run


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """results/time_vs_workers with known answers (target 0.95)."""
    root = tmp_path / "results" / "time_vs_workers"
    root.mkdir(parents=True)
    (root / "calibration.json").write_text(json.dumps(CALIBRATION))
    # m=1: to target 7 and 13 s (mean 10, spread 3); per epoch (3+3)/2=3 and (4+4)/2=4 (mean 3.5, spread 0.5)
    write_run(root, "simulator_m1_seed0", backend="simulator", workers=1, seed=0,
              times=[0, 4, 7, 10], accuracies=[0.1, 0.8, 0.96, 0.97])
    write_run(root, "simulator_m1_seed1", backend="simulator", workers=1, seed=1,
              times=[0, 5, 9, 13], accuracies=[0.1, 0.9, 0.94, 0.96])
    # m=2, seed 0: to target 3.5, per epoch 1.0
    write_run(root, "simulator_m2_seed0", backend="simulator", workers=2, seed=0,
              times=[0, 1.5, 2.5, 3.5], accuracies=[0.1, 0.5, 0.6, 0.96])
    # m=2, seed 1, simulated with α=0: re-timed to α=0.5 ms, each allreduce costs 2(m-1)α = 1 ms more
    write_run(root, "simulator_m2_seed1", backend="simulator", workers=2, seed=1, alpha=0.0,
              times=[0, 1, 2, 3], accuracies=[0.1, 0.5, 0.96, 0.97])
    # horovodrun (wall clock, never re-timed): np=1 reaches at round 1 (seed 1 stops there: no per-epoch point)
    write_run(root, "horovod_m1_seed0", backend="horovod", workers=1, seed=0, times=[0, 6, 11],
              accuracies=[0.1, 0.96, 0.97])
    write_run(root, "horovod_m1_seed1", backend="horovod", workers=1, seed=1, times=[0, 6], accuracies=[0.1, 0.96])
    write_run(root, "horovod_m2_seed0", backend="horovod", workers=2, seed=0, times=[0, 4, 7],
              accuracies=[0.1, 0.5, 0.6])
    return tmp_path / "results"


def test_points_and_statistics_on_known_numbers(tree: Path):
    root = tree / "time_vs_workers"
    cost, calibration = fig.load_cost(root)
    assert (cost.alpha, cost.beta) == (5e-4, 1e9) and calibration["measured_at"] == CALIBRATION["measured_at"]
    table = fig.collect(root, cost)
    assert list(table) == ["mnist_lenet5"]
    points = {(p.backend, p.workers, p.seed): p for p in table["mnist_lenet5"]}
    assert points[("simulator", 1, 0)].time_to_target == 7 and points[("simulator", 1, 0)].rounds_to_target == 2
    assert points[("simulator", 1, 1)].time_to_target == 13 and points[("simulator", 1, 1)].per_epoch == 4
    retimed = points[("simulator", 2, 1)]  # comm_rounds 0, 2, 4, 6: +0, +2, +4, +6 ms
    assert retimed.time_to_target == pytest.approx(2.004)
    assert retimed.per_epoch == pytest.approx(1.002)
    assert points[("horovod", 1, 0)].time_to_target == 6 and points[("horovod", 1, 0)].per_epoch == 5
    assert math.isnan(points[("horovod", 1, 1)].per_epoch)  # stopped at round 1: nothing after round 0
    assert math.isnan(points[("horovod", 2, 0)].time_to_target) and points[("horovod", 2, 0)].rounds_to_target is None

    to_target = fig.aggregate(table["mnist_lenet5"], "time_to_target")
    per_epoch = fig.aggregate(table["mnist_lenet5"], "per_epoch")
    assert (to_target[("simulator", 1)].mean, to_target[("simulator", 1)].spread) == (10, 3)
    assert to_target[("simulator", 2)].mean == pytest.approx((3.5 + 2.004) / 2)
    assert to_target[("simulator", 2)].spread == pytest.approx((3.5 - 2.004) / 2)
    assert (per_epoch[("simulator", 1)].mean, per_epoch[("simulator", 1)].spread) == (3.5, 0.5)
    assert per_epoch[("simulator", 2)].mean == pytest.approx(1.001)
    assert to_target[("horovod", 1)] == fig.Stat(6, 0, 2, (6, 6))
    assert per_epoch[("horovod", 1)].n == 1 and per_epoch[("horovod", 1)].mean == 5
    assert to_target[("horovod", 2)].n == 0 and per_epoch[("horovod", 2)].mean == 3
    assert fig.ideal(to_target, [1, 2, 4, 8]) == [10, 5, 2.5, 1.25]
    assert fig.ideal(per_epoch, [1, 2]) == [3.5, 1.75]


def test_figure_files_caption_and_sidecar(tree: Path, tmp_path: Path):
    out = tmp_path / "figures"
    paths = fig.main(tree, out)
    assert sorted(p.name for p in paths) == [f"time_vs_workers.{e}" for e in ("json", "md", "pdf", "png")]
    md = (out / "time_vs_workers.md").read_text()
    assert "| simulator | 1 | 10 ± 3 | 10 | 2.5 ± 0.5 | 3.5 ± 0.5 |" in md
    assert "| horovod | 2 | — |  | — | 3 ± 0 (n=1 of 1) |" not in md  # one run of one: no "n of" note
    assert "| horovod | 2 | — |  | — | 3 ± 0 |" in md
    sidecar = json.loads((out / "time_vs_workers.json").read_text())
    caption = sidecar["caption"]
    assert "8,000 train / 2,000 test" in caption and "60,000 train / 10,000 test" in caption
    assert "α=500 µs" in caption and "2026-01-02T03:04:05+0000" in caption and "load avg 0.50" in caption
    assert sidecar["calibration"]["alpha"] == 5e-4 and sidecar["targets"] == {"mnist_lenet5": 0.95}
    assert sidecar["seeds"] == [0, 1] and len(sidecar["runs"]) == 7


def test_missing_runs_name_the_command(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="scripts.bench time_vs_workers"):
        fig.main(tmp_path, tmp_path / "figures")


def test_mixed_targets_are_refused(tree: Path):
    root = tree / "time_vs_workers"
    write_run(root, "simulator_m4_seed0", backend="simulator", workers=4, seed=0, times=[0, 1], accuracies=[0.1, 0.9],
              target=0.9)
    with pytest.raises(ValueError, match="mixes runs with targets"):
        fig.collect(root, fig.load_cost(root)[0])


def script(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scripts.bench", "time_vs_workers", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


def test_missing_mnist_is_one_line_and_exit_2(tmp_path: Path):
    proc = script("--quick", "--out", str(tmp_path / "out"), env={"DANE_DATA_DIR": str(tmp_path / "nowhere")})
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "t10k-images-idx3-ubyte.gz" in errors[0] and "nowhere" in errors[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_quick_run_then_figure(tmp_path: Path):
    pytest.importorskip("horovod.torch", reason="Horovod is not built (the script calibrates α-β with it)")
    data = Path(os.environ.get("DANE_DATA_DIR") or REPO.parent / "shared" / "data")
    if not any((data / sub / "t10k-images-idx3-ubyte.gz").exists() for sub in ("", "mnist")):
        pytest.skip(f"no MNIST under {data}")
    out = tmp_path / "results" / "time_vs_workers"
    args = ("--quick", "--problems", "mnist_lenet3", "--real", "--out", str(out))
    proc = script(*args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calibration = json.loads((out / "calibration.json").read_text())
    assert calibration["alpha"] >= 0 and calibration["beta"] > 0 and calibration["measured_at"]
    for m in (1, 2):
        run = out / "mnist_lenet3" / f"simulator_m{m}_seed0"
        summary = json.loads((run / "summary.json").read_text())
        assert summary["backend"] == "simulator" and summary["workers"] == m
        assert (summary["alpha"], summary["beta"]) == (calibration["alpha"], calibration["beta"])
        assert 2 <= len((run / "rounds.jsonl").read_text().splitlines()) <= 3
    assert sorted(p.name for p in (out / "mnist_lenet3").iterdir()) == ["simulator_m1_seed0", "simulator_m2_seed0"]
    again = script(*args, "--keep-calibration")  # everything is there: nothing is run again
    assert again.returncode == 0 and again.stdout.count(": kept (") == 2, again.stdout + again.stderr
    paths = fig.main(tmp_path / "results", tmp_path / "figures")
    assert (tmp_path / "figures" / "time_vs_workers.png").stat().st_size > 10_000 and len(paths) == 4
