"""m LeNet-5 workers as one stacked computation against one thread each (issue 35 item 4): JSON section ``batched_net``.

    PYTHONPATH=. python scripts/bench_batched_net.py --out results/bench.json [--quick] [--skip-without-data]

Local SGD (FedAvg: ``algorithm=local_sgd``, ``--local-steps`` steps of ``--batch-size`` rows at
lr 0.05, then the mean) on ``problem=mnist_lenet5`` with ``--workers`` simulated workers, run
for ``--rounds`` rounds by the per-worker path (``sim.batched=false``: one thread a worker)
and by the batched one (``sim.batched=true``: `dane.problems.stacked_net.StackedNeuralProblem`),
interleaved, ``--repeats`` times each, same data, same machine, same process:

- ``ratio``: the per-worker path's wall time of the rounds (the summary's ``wall_time_s``:
  every round's K local steps, its evaluation on the shard and the test slice, and round 0's
  evaluation) over the batched path's; median of the pairs and every pair; goal >= 5.
  ``cpu_ratio``: the same with the process's CPU seconds (all threads), which a loaded machine
  disturbs less.  ``objective_rel_diff_max``: the largest relative difference of the two
  paths' logged objectives (float32: round-off of float32 sums, `tests/test_batched_net.py`).
- `cuda_round` (called by ``scripts/bench_cuda.py --only-batched`` where torch sees a GPU):
  the batched path at ``--workers`` on CUDA against one worker (the per-worker path) on CUDA,
  each after a warm-up run; goal: the m workers' round within 2x the one worker's.

Without the MNIST files (``--skip-without-data``) the section says so and nothing runs;
``--quick`` runs m = 8, 2 local steps, one round (a smoke run).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_scaling import mnist_dir  # noqa: E402
from dane.experiments.config import run_spec  # noqa: E402
from dane.launch import execute  # noqa: E402
from dane.synthetic.bench_file import elapsed_logger, machine, merge_section  # noqa: E402
from dane.synthetic.sweep import compose_job  # noqa: E402

KEY = "batched_net"
LR = 0.05


def overrides(workers: int, local_steps: int, batch_size: int, rounds: int, batched: str, device: str) -> tuple:
    return ("algorithm=local_sgd", "problem=mnist_lenet5", f"workers={workers}", f"algorithm.local_steps={local_steps}",
            f"algorithm.batch_size={batch_size}", f"algorithm.lr={LR}", f"rounds={rounds}", "tol=null",
            "quiet=true", f"sim.batched={batched}", f"problem.device={device}")


def timed_run(*job: str) -> dict:
    """One in-process simulated run: the rounds' wall time (the summary's), the process's CPU seconds, the path."""
    spec = run_spec(compose_job(job))
    collected: dict = {}
    cpu0 = time.process_time()
    summary = execute(spec, None, collect=collected)
    return {"rounds_s": summary["wall_time_s"], "total_cpu_s": time.process_time() - cpu0,
            "path": summary["simulator_path"], "objectives": [r["objective"] for r in collected["records"]],
            "simulated_time_s": summary["simulated_time_s"], "load_avg": [round(x, 2) for x in os.getloadavg()]}


def speedup(workers: int, local_steps: int, batch_size: int, rounds: int, repeats: int, log) -> dict:
    """Per-worker over batched on the CPU (module docstring)."""
    pairs = []
    for _ in range(repeats):
        threads = timed_run(*overrides(workers, local_steps, batch_size, rounds, "false", "cpu"))
        batched = timed_run(*overrides(workers, local_steps, batch_size, rounds, "true", "cpu"))
        assert threads["path"] == "threads" and batched["path"] == "batched"
        pairs.append({"threads_rounds_s": threads["rounds_s"], "batched_rounds_s": batched["rounds_s"],
                      "ratio": threads["rounds_s"] / batched["rounds_s"],
                      "threads_cpu_s": threads["total_cpu_s"], "batched_cpu_s": batched["total_cpu_s"],
                      "cpu_ratio": threads["total_cpu_s"] / batched["total_cpu_s"],
                      "objective_rel_diff": max(abs(a - b) / abs(a) for a, b in
                                                zip(threads["objectives"], batched["objectives"])),
                      "threads_simulated_s": threads["simulated_time_s"],
                      "batched_simulated_s": batched["simulated_time_s"], "load_avg": batched["load_avg"]})
        log(f"m={workers}: per-worker {threads['rounds_s']:.2f} s, batched {batched['rounds_s']:.2f} s, "
            f"ratio {pairs[-1]['ratio']:.2f} (CPU {pairs[-1]['cpu_ratio']:.2f})")
    ratios = [p["ratio"] for p in pairs]
    return {"workers": workers, "local_steps": local_steps, "batch_size": batch_size, "rounds": rounds, "lr": LR,
            "problem": "mnist_lenet5 (float32)", "algorithm": "local_sgd (mean)", "goal": ">= 5",
            "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
            "cpu_ratio_median": statistics.median(p["cpu_ratio"] for p in pairs),
            "objective_rel_diff_max": max(p["objective_rel_diff"] for p in pairs), "pairs": pairs}


def cuda_round(workers: int, local_steps: int, batch_size: int, rounds: int, repeats: int, log,
               device: str = "cuda") -> dict:
    """The batched path's ``workers`` LeNet-5 workers on CUDA against one worker on CUDA (module docstring);
    ``device`` another device for a check of this code where there is no GPU."""
    runs: dict[str, list[float]] = {"one": [], "batched": []}
    for name, m, batched in (("one", 1, "false"), ("batched", workers, "true")):
        timed_run(*overrides(m, local_steps, batch_size, 1, batched, device))  # warm-up: CUDA context, kernels
        for _ in range(repeats):
            run = timed_run(*overrides(m, local_steps, batch_size, rounds, batched, device))
            runs[name].append(run["rounds_s"] / rounds)
            log(f"cuda m={m} ({run['path']}): {runs[name][-1]:.4f} s a round")
    one, many = statistics.median(runs["one"]), statistics.median(runs["batched"])
    return {"device": device, "workers": workers, "local_steps": local_steps, "batch_size": batch_size,
            "rounds": rounds, "lr": LR, "one_worker_round_s": one, "batched_round_s": many, "ratio": many / one, "goal": "<= 2",
            "one_worker_runs_s": runs["one"], "batched_runs_s": runs["batched"]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("results/bench.json"))
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--local-steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="m = 8, 2 local steps, one round, once (a smoke run)")
    parser.add_argument("--skip-without-data", action="store_true", help="write the reason and stop without MNIST")
    args = parser.parse_args(argv)
    if args.quick:
        args.workers, args.local_steps, args.rounds, args.repeats = 8, 2, 1, 1
    section: dict = {"machine": machine(), "quick": args.quick}
    if not mnist_dir().is_dir():
        section["skipped"] = f"no MNIST files in {mnist_dir()} (set DANE_DATA_DIR to a folder holding mnist/)"
        print(f"{KEY}: {section['skipped']}", flush=True)
        if not args.skip_without_data:
            sys.exit(2)
    else:
        section["speedup"] = speedup(args.workers, args.local_steps, args.batch_size, args.rounds, args.repeats,
                                     elapsed_logger(time.perf_counter()))
    merge_section(args.out, KEY, section)
    return section


if __name__ == "__main__":
    main()
