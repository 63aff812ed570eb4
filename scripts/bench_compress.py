"""What ``comm.compress`` costs and saves (issue 34 item 1): JSON section ``compress``."""
from __future__ import annotations

import statistics
import time

import torch

from dane.api import fit
from dane.compress import make
from dane.problems import RidgeSyntheticConfig
from dane.synthetic.bench_file import machine
from scripts.harness import Bench, Run, option

KEY = "compress"
SPECS = ("none", "topk:0.1", "randk:0.1", "natural", "dither:4")
SIZES = (500, 30730)
RUNS = (  # (comm.compress, comm.error_feedback, algorithm.lr or None for GD's rule)
    ("none", False, None), ("topk:10", False, None), ("topk:10", True, None), ("randk:10", False, 0.05),
    ("randk:10", True, 0.05), ("natural", False, None), ("natural", True, None), ("dither:4", False, None),
    ("dither:4", True, None),
)
TARGET = 1e-8


def compressor_time(repeats: int, quick: bool) -> list[dict]:
    rows = []
    gen = torch.Generator().manual_seed(0)
    for n in SIZES[:1] if quick else SIZES:
        x = torch.randn(n, generator=gen, dtype=torch.float64)
        for spec in SPECS:
            compressor = make(spec)
            loops = max(1, 20000 // n) * (1 if quick else 10)
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                for _ in range(loops):
                    compressor(x, gen)
                times.append((time.perf_counter() - start) / loops)
            bits = compressor.bits(n)
            rows.append({"spec": spec, "n": n, "seconds_median": statistics.median(times), "seconds_min": min(times),
                         "seconds_max": max(times), "bits": bits, "bits_over_dense": bits / (64 * n)})
    return rows


def gd_to_target(quick: bool) -> list[dict]:
    problem = RidgeSyntheticConfig(n_samples=4000, dim=100)
    rows = []
    for spec, ef, lr in RUNS[:3] if quick else RUNS:
        start = time.perf_counter()
        result = fit(problem, "gd", workers=4, rounds=300 if quick else 3000, tol=TARGET, compress=spec,
                     error_feedback=ef, **({} if lr is None else {"lr": lr}))
        last = result.records[-1]
        rows.append({"compress": spec, "error_feedback": ef, "lr": last.get("lr"), "status": result.status,
                     "rounds": last["round"], "final_relative_suboptimality": result.summary["final_relative_suboptimality"],
                     "uplink_bits": last["uplink_bits"], "downlink_bits": last["downlink_bits"],
                     "simulated_time_s": last["time_s"], "wall_s": time.perf_counter() - start})
    return rows


def run(bench: Run) -> dict:
    section = {"machine": bench.machine, "target": TARGET,
               "compressor_time": compressor_time(bench.args.repeats, bench.args.quick),
               "gd_to_target": gd_to_target(bench.args.quick)}
    return bench.finish({**section, "machine_after": machine()["load_avg"]})


BENCH = Bench(KEY, run, "what comm.compress costs and saves (issue 34 item 1)",
              options=(option("--repeats", type=int, default=5),))
