"""What ``comm.compress`` costs and saves (issue 34 item 1): JSON section ``compress``, rows (`scripts.harness.grid`)
``time n=N SPEC`` and ``gd SPEC[ ef]``; docs/benchmarks.md, section `compress`."""
from __future__ import annotations

import time
from functools import partial

import torch

from dane.api import fit
from dane.compress import make
from dane.problems import RidgeSyntheticConfig
from scripts.harness import Bench, count, grid, option, spread

KEY = "compress"
SPECS = ("none", "topk:0.1", "randk:0.1", "natural", "dither:4")
SIZES = (500, 30730)
RUNS = (  # (comm.compress, comm.error_feedback, algorithm.lr or None for GD's rule)
    ("none", False, None), ("topk:10", False, None), ("topk:10", True, None), ("randk:10", False, 0.05),
    ("randk:10", True, 0.05), ("natural", False, None), ("natural", True, None), ("dither:4", False, None),
    ("dither:4", True, None),
)
TARGET = 1e-8


def compressor_time(spec: str, n: int, repeats: int, quick: bool) -> dict:
    gen = torch.Generator().manual_seed(0)
    x, compressor = torch.randn(n, generator=gen, dtype=torch.float64), make(spec)
    loops = max(1, 20000 // n) * (1 if quick else 10)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(loops):
            compressor(x, gen)
        times.append((time.perf_counter() - start) / loops)
    bits = compressor.bits(n)
    return {"spec": spec, "n": n, "seconds": spread(times), "bits": bits, "bits_over_dense": bits / (64 * n)}


def gd_to_target(spec: str, ef: bool, lr: float | None, quick: bool) -> dict:
    result = fit(RidgeSyntheticConfig(n_samples=4000, dim=100), "gd", workers=4, rounds=300 if quick else 3000,
                 tol=TARGET, compress=spec, error_feedback=ef, **({} if lr is None else {"lr": lr}))
    last = result.records[-1]
    return {"compress": spec, "error_feedback": ef, "lr": last.get("lr"), "status": result.status,
            "rounds": last["round"], "final_relative_suboptimality": result.summary["final_relative_suboptimality"],
            "uplink_bits": last["uplink_bits"], "downlink_bits": last["downlink_bits"],
            "simulated_time_s": last["time_s"]}


def cells(run) -> dict:
    args = run.args
    times = {f"time n={n} {spec}": partial(compressor_time, spec, n, args.repeats, args.quick)
             for n in SIZES[:1 if args.quick else None] for spec in SPECS}
    runs = {f"gd {spec}{' ef' * ef}": partial(gd_to_target, spec, ef, lr, args.quick)
            for spec, ef, lr in RUNS[:3 if args.quick else None]}
    return {**times, **runs}


BENCH = Bench(KEY, grid(cells, head=lambda args: {"target": TARGET}),
              "what comm.compress costs and saves (issue 34 item 1)", only=("time", "gd"), resumable=True,
              options=(option("--repeats", type=count, default=5),))
