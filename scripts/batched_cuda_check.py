"""The batched simulator on a GPU (issue 35 item 4): DANE on ridge_synthetic, batched against one thread per worker."""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from dane.problems import RidgeSyntheticConfig

from scripts.bench_batched import steady_batched as batched, steady_threads as threads
from scripts.harness import Bench, Run, option


def run(bench: Run) -> None:
    """DANE's steady rounds: batched against threads, both on ``--device`` at ``--thread-workers``; batched on the
    device against threads on the CPU at ``--workers``; batched at ``--large``; each with the iterates' distance."""
    args = bench.args
    torch.set_num_threads(1)
    on_device = RidgeSyntheticConfig(n_samples=args.n_samples, dim=args.dim, device=args.device)
    on_cpu = RidgeSyntheticConfig(n_samples=args.n_samples, dim=args.dim)
    on_device.prepare()
    report = {"machine": bench.machine, "device": args.device, "n_samples": args.n_samples, "dim": args.dim,
              "rounds": args.rounds, "algorithm": "dane mu=1 safeguard",
              **({"gpu": torch.cuda.get_device_name(0)} if args.device == "cuda" else {})}
    k = args.thread_workers
    w_small, report["small_batched_round_s"], _ = batched(on_device, k, args.rounds)
    w_threads, report["small_threads_round_s"], _ = threads(on_device, k, args.rounds)
    report["small_workers"] = k
    report["small_ratio_threads_over_batched"] = report["small_threads_round_s"] / report["small_batched_round_s"]
    report["small_batched_vs_threads_rel_diff"] = float((w_small.cpu() - w_threads.cpu()).norm() / w_threads.norm())
    print(json.dumps(report, indent=2), flush=True)
    w_batched, report["batched_round_s"], _ = batched(on_device, args.workers, args.rounds)
    w_cpu, report["threads_cpu_round_s"], _ = threads(on_cpu, args.workers, args.rounds)
    report["workers"] = args.workers
    report["ratio_cpu_threads_over_device_batched"] = report["threads_cpu_round_s"] / report["batched_round_s"]
    report["batched_vs_cpu_rel_diff"] = float((w_batched.cpu() - w_cpu).norm() / w_cpu.norm())
    t0 = time.perf_counter()
    _, report["large_batched_round_s"], _ = batched(on_device, args.large, args.rounds)
    report["large_workers"], report["large_total_s"] = args.large, time.perf_counter() - t0
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


BENCH = Bench("batched_cuda", run, "the batched simulator on a device against threads on the CPU (own JSON, --out)",
              out="results/batched_cuda.json", options=(
                  option("--device", default="cuda"), option("--n-samples", type=int, default=100_000),
                  option("--dim", type=int, default=500), option("--workers", type=int, default=1000),
                  option("--large", type=int, default=10_000),
                  option("--thread-workers", type=int, default=64,
                         help="m of the side-by-side on the device (each thread holds its own GPU library handles)"),
                  option("--rounds", type=int, default=10)))
