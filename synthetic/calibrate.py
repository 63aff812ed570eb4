r"""Measure the simulator's α-β allreduce cost model on real Horovod allreduces of this machine.

    python -m synthetic.calibrate [--np 2] [--out results/calibration.json]

Launches ``horovodrun -np NP --gloo`` on `synthetic.allreduce_timing` with
``HOROVOD_CYCLE_TIME=0.1`` (the package's default, `dane.launch.HorovodOptions`), which
times grouped allreduces of 8 B to 4 MB, and fits the ring-allreduce model

.. math:: T(n) = \frac{2(m-1)}{m}\frac{n}{\beta} + 2(m-1)\,\alpha

to the median times by least squares on relative errors (each size weighs the same,
so the 8 B latency counts as much as the 4 MB bandwidth).  The result is saved with
`dane.comm.AlphaBeta.save`, with the measurements beside it; conf/config.yaml's
``sim.calibration`` points the simulator at it.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import tempfile
import time
from pathlib import Path

import numpy as np

from dane.comm import AlphaBeta
from synthetic.allreduce_timing import DEFAULT_SIZES
from synthetic.launchers import have_horovod, horovodrun

CYCLE_TIME_MS = "0.1"


def fit_alpha_beta(sizes, times, m: int) -> AlphaBeta:
    r"""Least squares of T(n) = a n + b on relative residuals, a = 2(m-1)/(m β), b = 2(m-1) α.

    Minimizes :math:`\sum_k ((a n_k + b) / T_k - 1)^2` over a > 0, b >= 0.
    """
    if m < 2:
        raise ValueError(f"an allreduce cost needs m >= 2 workers, got {m}")
    n = np.asarray(sizes, dtype=float)
    t = np.asarray(times, dtype=float)
    rows = np.stack([n / t, 1 / t], axis=1)
    (a, b), *_ = np.linalg.lstsq(rows, np.ones_like(t), rcond=None)
    if b < 0:  # no latency left to explain: refit the slope alone
        b, a = 0.0, float(np.sum(n / t) / np.sum((n / t) ** 2))
    if a <= 0:  # no bandwidth term visible (all sizes latency-bound): refit the intercept alone
        a, b = 1e-15, float(np.sum(1 / t) / np.sum((1 / t) ** 2))
    return AlphaBeta(alpha=float(b) / (2 * (m - 1)), beta=2 * (m - 1) / (m * float(a)))


def relative_errors(cost: AlphaBeta, sizes, times, m: int) -> list[float]:
    return [cost.allreduce_time(int(n), m) / t - 1 for n, t in zip(sizes, times)]


def machine() -> dict:
    return {"host": socket.gethostname(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "load_avg": list(os.getloadavg())}


def calibrate(np_: int = 2, sizes=DEFAULT_SIZES, reps: int = 200, warmup: int = 20) -> dict:
    """Launch the timing worker under horovodrun and fit; returns {alpha, beta, measurements...}."""
    if not have_horovod():
        raise RuntimeError("horovod.torch is not importable here; run `make setup` (it builds Horovod) first")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "timing.json"
        horovodrun("synthetic.allreduce_timing",
                   ["--out", str(out), "--reps", str(reps), "--warmup", str(warmup), "--sizes", *map(str, sizes)],
                   np=np_, env={"HOROVOD_CYCLE_TIME": CYCLE_TIME_MS})
        timing = json.loads(out.read_text())
    sizes = [int(s) for s in timing["sizes"]]
    medians = [timing["sizes"][str(s)]["median_s"] for s in sizes]
    cost = fit_alpha_beta(sizes, medians, np_)
    return {"alpha": cost.alpha, "beta": cost.beta, "workers": np_, "horovod_cycle_time_ms": float(CYCLE_TIME_MS),
            "fit": "T(n) = 2(m-1)/m n/beta + 2(m-1) alpha, least squares on relative error of median times",
            "sizes_bytes": sizes, "median_s": medians,
            "relative_error": relative_errors(cost, sizes, medians, np_),
            "raw": timing["sizes"], "machine": machine(),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2, dest="np_", help="Horovod processes (default 2)")
    parser.add_argument("--out", default="results/calibration.json")
    parser.add_argument("--reps", type=int, default=200)
    args = parser.parse_args(argv)
    result = calibrate(args.np_, reps=args.reps)
    cost = AlphaBeta(alpha=result.pop("alpha"), beta=result.pop("beta"))
    cost.save(args.out, **result)
    print(f"alpha = {cost.alpha * 1e6:.1f} us, beta = {cost.beta / 1e6:.1f} MB/s "
          f"(m={args.np_}, HOROVOD_CYCLE_TIME={CYCLE_TIME_MS}) -> {args.out}")
    for n, t, e in zip(result["sizes_bytes"], result["median_s"], result["relative_error"]):
        print(f"  {n:>8d} B  measured {t * 1e3:8.3f} ms  model {t * (1 + e) * 1e3:8.3f} ms  ({e:+.0%})")


if __name__ == "__main__":
    main()
