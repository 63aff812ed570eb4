"""What ``comm.compress`` costs and saves (issue 34 item 1): JSON section ``compress``, rows (`scripts.harness.grid`)
``time n=N SPEC`` and ``gd SPEC[ ef]``; docs/benchmarks.md, section `compress`."""
from __future__ import annotations

from functools import partial

import torch

from dane.api import fit
from dane.compress import make
from dane.problems import RidgeSyntheticConfig
from scripts.harness import Bench, count, grid, option, spread, timer

SPECS = ("none", "topk:0.1", "randk:0.1", "natural", "dither:4")
SIZES = (500, 30730)
#: (comm.compress, algorithm.lr or None for GD's rule): a GD run of each, and of each but none with EF21 too
COMPRESSORS = (("none", None), ("topk:10", None), ("randk:10", 0.05), ("natural", None), ("dither:4", None))
RUNS = tuple((spec, ef, lr) for spec, lr in COMPRESSORS for ef in (False, True) if spec != "none" or not ef)
TARGET = 1e-8


def compressor_time(spec: str, n: int, repeats: int, quick: bool) -> dict:
    """Seconds of one compression of a float64 n-vector (over ``repeats`` timed loops) and its exact bits."""
    gen = torch.Generator().manual_seed(0)
    x, compressor = torch.randn(n, generator=gen, dtype=torch.float64), make(spec)
    loops = max(1, 20000 // n) * (1 if quick else 10)

    def compress_all() -> None:
        for _ in range(loops):
            compressor(x, gen)
    bits = compressor.bits(n)
    return {"spec": spec, "n": n, "seconds": spread([timer(compress_all) / loops for _ in range(repeats)]),
            "bits": bits, "bits_over_dense": bits / (64 * n)}


def gd_to_target(spec: str, ef: bool, lr: float | None, quick: bool) -> dict:
    """Distributed GD on ridge_synthetic to `TARGET` with ``spec``'s uplink: its rounds, bits and simulated time."""
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


BENCH = Bench("compress", grid(cells, head=lambda args: {"target": TARGET}),
              "what comm.compress costs and saves (issue 34 item 1)", only=("time", "gd"), resumable=True,
              options=(option("--repeats", type=count, default=5),))
