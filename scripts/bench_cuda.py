"""Time per round on a GPU against the CPU: MNIST LeNet-5, DANE as in its accuracy table; JSON under ``cuda``.

    PYTHONPATH=. python scripts/bench_cuda.py [--out results/bench.json] [--rounds 6] [--repeats 2]

Every run is ``conf/experiment/table_mnist_lenet5.yaml``'s DANE (η=1, μ=0, no safeguard,
one pass of SGD over each worker's shard per round) for ``--rounds`` rounds, once with
``problem.device=cuda`` and once with ``problem.device=cpu``, on the same machine:

- ``launched``: ``torchrun --nproc_per_node 1`` and ``2`` (two ranks share one GPU;
  gloo carries the vectors, which live in host memory).  Time per round: the median
  of the rounds' ``time_s`` differences from round 1 on (round 0 is the first
  evaluation, and on CUDA the first kernels' start-up): `bench_scaling.median_round_s`.
  Each rank has one CPU thread (torchrun's OMP_NUM_THREADS=1, and
  `dane.problems.neural.reproducible_numerics`), so the CPU column is one core per worker.
- ``simulated``: ``experiments.simulate`` at ``--workers``: the wall seconds per round
  (``wall_time_s / rounds``) and the simulated seconds per round (median difference
  of ``time_s``).  On CUDA the simulated workers take turns on the one GPU
  (`dane.comm.threads.DeviceTurns`), so the wall time grows with m while the
  simulated time is that of m GPUs.  ``sim_vs_launched_np1``: the simulator's time per round
  at m = 1 (``sim.single_worker``) against the launched np = 1 run's, per device: how
  well the simulator's clock stands for a real run.

Skipped, with the reason in the JSON, when torch sees no CUDA device or MNIST is absent.
Timings on a shared machine are noisy: each run carries the load average it ran under.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_scaling import load, median_round_s, mnist_dir, now, spread  # noqa: E402
from dane.results import read_rounds, read_summary  # noqa: E402
from dane.synthetic.bench_file import machine, merge_section  # noqa: E402
from dane.synthetic.launchers import REPO, torchrun  # noqa: E402

KEY = "cuda"
TABLE = ("algorithm=dane", "problem=mnist_lenet5", "algorithm.eta=1.0", "algorithm.mu=0.0", "algorithm.safeguard=false",
         "problem.inner_steps=null", "tol=null", "quiet=true")
DEVICES = ("cuda", "cpu")


def launched(tmp: Path, rounds: int, repeats: int) -> dict:
    runs = []
    for repeat in range(repeats):
        for device in DEVICES:
            for np in (1, 2):
                out, before = tmp / f"launched_{device}_{np}_{repeat}", load()
                try:
                    torchrun("dane.experiments.train", [*TABLE, f"rounds={rounds}", f"problem.device={device}",
                                                   f"out_dir={out}"], np=np, timeout=1200)
                except (RuntimeError, subprocess.TimeoutExpired) as err:
                    print(f"launch failed ({device}, np={np}): {str(err)[-2000:]}", file=sys.stderr, flush=True)
                    runs.append({"device": device, "np": np, "repeat": repeat, "status": "launch_failed"})
                    continue
                runs.append({"device": device, "np": np, "repeat": repeat, "round_s": median_round_s(read_rounds(out)),
                             "final_test_accuracy": read_summary(out).get("final_test_accuracy"),
                             "load_before": before, "load_after": load()})
                print(f"launched {device} np={np} repeat {repeat}: {runs[-1]['round_s']:.3f} s per round", flush=True)
    return {"runs": runs, **{f"{device}_np{np}_round_s": _spread(runs, "round_s", device=device, np=np)
                             for device in DEVICES for np in (1, 2)}}


def simulated(tmp: Path, rounds: int, workers: list[int]) -> dict:
    runs = []
    for device in DEVICES:
        for m in workers:
            out, before = tmp / f"simulated_{device}_{m}", load()
            cmd = [sys.executable, "-m", "dane.experiments.simulate", "experiment=table_mnist_lenet5", f"workers={m}",
                   f"rounds={rounds}", f"problem.device={device}", f"out_dir={out}", "quiet=true"]
            proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
            if proc.returncode != 0:
                print(f"simulate failed ({device}, m={m}): {proc.stderr[-2000:]}", file=sys.stderr, flush=True)
                runs.append({"device": device, "workers": m, "status": "failed"})
                continue
            s = read_summary(out)
            runs.append({"device": device, "workers": m, "wall_round_s": s["wall_time_s"] / s["rounds"],
                         "simulated_round_s": median_round_s(read_rounds(out)), "clock": s.get("simulated_compute_clock"),
                         "final_test_accuracy": s.get("final_test_accuracy"), "load_before": before,
                         "load_after": load()})
            print(f"simulated {device} m={m}: wall {runs[-1]['wall_round_s']:.3f} s, simulated "
                  f"{runs[-1]['simulated_round_s']:.3f} s per round ({runs[-1]['clock']})", flush=True)
    return {"runs": runs}


def _spread(runs: list[dict], key: str, **match) -> dict | None:
    values = [r[key] for r in runs if key in r and all(r.get(k) == v for k, v in match.items())]
    return spread(values) if values else None


def ratios(result: dict) -> dict:
    """CPU over CUDA time per round, launched and simulated; the simulator's m = 1 against the launched np = 1."""
    out: dict = {}
    launched_runs, simulated_runs = result["launched"]["runs"], result["simulated"]["runs"]
    for np in (1, 2):
        cuda, cpu = (_spread(launched_runs, "round_s", device=d, np=np) for d in DEVICES)
        out[f"launched_np{np}_cpu_over_cuda"] = cpu["median"] / cuda["median"] if cuda and cpu else None
    for m in sorted({r["workers"] for r in simulated_runs}):
        cuda, cpu = (_spread(simulated_runs, "wall_round_s", device=d, workers=m) for d in DEVICES)
        out[f"simulated_m{m}_wall_cpu_over_cuda"] = cpu["median"] / cuda["median"] if cuda and cpu else None
    for device in DEVICES:
        sim = _spread(simulated_runs, "simulated_round_s", device=device, workers=1)
        real = _spread(launched_runs, "round_s", device=device, np=1)
        out[f"sim_vs_launched_np1_{device}"] = sim["median"] / real["median"] if sim and real else None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="results/bench.json")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    args = parser.parse_args()
    result: dict = {"started_at": now(), "machine": machine(), "load_before": load(), "rounds": args.rounds,
                    "overrides": " ".join(TABLE)}
    if not torch.cuda.is_available():
        result["skipped"] = "torch sees no CUDA device"
    elif not mnist_dir().is_dir():
        result["skipped"] = f"no MNIST files in {mnist_dir()} (set DANE_DATA_DIR to a folder holding mnist/)"
    else:
        result["gpu"] = torch.cuda.get_device_name(0)
        with tempfile.TemporaryDirectory() as tmp:
            result["launched"] = launched(Path(tmp), args.rounds, args.repeats)
            result["simulated"] = simulated(Path(tmp), args.rounds, args.workers)
        result["ratios"] = ratios(result)
    result.update(finished_at=now(), load_after=load(), torch=torch.__version__)
    print(f"cuda: {result.get('skipped') or result['ratios']}", flush=True)
    merge_section(Path(args.out), KEY, result)


if __name__ == "__main__":
    main()
