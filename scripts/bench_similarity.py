"""Hessian dissimilarity δ against DANE's rounds, across Dirichlet label skew (issue 33 item 4)."""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]

from dane.api import fit
from dane.data.files import LibSVMSource, NPZSource, save_npz
from dane.problems.linear_models import LinearModelConfig
from dane.numerics.similarity import measure
from scripts.harness import Bench, Run, load, option, relative

KEY = "similarity"
TARGET = 1e-8
SHARDINGS = (("dirichlet", 0.1), ("dirichlet", 0.5), ("dirichlet", 1.0), ("iid", None))
QUICK_SHARDINGS = (("dirichlet", 0.1), ("iid", None))
A9A = Path("libsvm") / "a9a"


def data_dir() -> Path:
    return Path(os.environ.get("DANE_DATA_DIR", ROOT.parent / "shared" / "data"))


def synthetic(folder: Path, n: int, d: int, seed: int = 0) -> Path:
    """Two balanced classes, x = ±b + z with z ~ N(0, diag(j^-0.5)) and b a fixed shift: an .npz for `NPZSource`."""
    rng = np.random.default_rng(seed)
    y = rng.permutation(np.arange(n) % 2).astype(np.float64)
    shift = rng.standard_normal(d) * 0.4
    X = np.where(y[:, None] > 0, shift, -shift) + rng.standard_normal((n, d)) * np.arange(1, d + 1) ** -0.25
    X[:, : d // 4] *= np.where(y[:, None] > 0, 2.0, 0.5)  # the classes differ in spread too: H_i differs, not only g_i
    return save_npz(folder / f"synthetic_logistic_{n}x{d}.npz", X, y)


def sources(quick: bool, folder: Path) -> dict[str, dict | None]:
    """name -> the keys of its source (or None and why, when the file is absent)."""
    out: dict[str, dict | None] = {}
    if not quick:
        a9a = data_dir() / A9A
        out["a9a"] = {"kind": LibSVMSource, "path": str(a9a), "n_features": 123, "zero_based": False} \
            if a9a.is_file() else None
    n, d = (800, 8) if quick else (20000, 40)
    out["synthetic_logistic"] = {"kind": NPZSource, "path": str(synthetic(folder, n, d))}
    return out


def one_cell(keys: dict, sharding: str, alpha: float | None, args) -> dict:
    """DANE's rounds to the target and δ at the start and the end, for one data set and one sharding."""
    kind, file_keys = keys["kind"], {k: v for k, v in keys.items() if k != "kind"}
    source = kind(**file_keys, sharding=sharding, **({"alpha": alpha} if alpha is not None else {}))
    config = LinearModelConfig(data=source, loss="logistic", lam=args.lam, fit_intercept=True, optimum="auto",
                               name="logreg", seed=args.seed)
    t0 = time.perf_counter()
    result = fit(config, "dane", workers=args.workers, rounds=args.rounds, tol=TARGET, seed=args.seed)
    run_s, final = time.perf_counter() - t0, relative(result.records)[-1]
    problems = [config.build(rank, args.workers) for rank in range(args.workers)]
    cell = {"sharding": sharding, "alpha": alpha, "rows": [p.n_local for p in problems],
            "reached": bool(final <= TARGET), "rounds": len(result.records),
            "comm_rounds": result.records[-1]["comm_rounds"], "final_relative_suboptimality": final,
            "status": result.status, "run_s": run_s}
    for at, w in (("start", torch.zeros(problems[0].dim, dtype=torch.float64)), ("end", result.w)):
        t0 = time.perf_counter()
        found = measure(problems, w, iters=args.iters)
        cell.update({f"{key}_{at}": found[key] for key in
                     ("delta", "delta_mean_square", "delta_frobenius", "hessian_norm", "per_worker", "method")})
        cell[f"measure_s_{at}"] = time.perf_counter() - t0
    config.release()
    return cell


def run(bench: Run) -> dict:
    """DANE's rounds and δ per data set and sharding (`one_cell`); a LIBSVM table that is not here is skipped."""
    args, log = bench.args, bench.log
    args.workers = min(args.workers, 4) if args.quick else args.workers
    out = {"what": "logistic regression with an intercept, (lam/2)||w||^2, safeguarded DANE at its defaults on m "
                   "simulated workers; delta = max_i ||H_i - H||_2 at w_0 = 0 (start) and at the last iterate "
                   "(end), H_i = Hessian of worker i's O_i (weight m/N per row), dane.numerics.similarity",
           "target": f"relative suboptimality (O - O*)/|O*| <= {TARGET:g}, O* from optimum=auto",
           "workers": args.workers, "lam": args.lam, "rounds_cap": args.rounds, "seed": args.seed,
           "datasets": {}, "load_avg_before": load()}
    with tempfile.TemporaryDirectory() as tmp:
        for name, keys in sources(args.quick, Path(tmp)).items():
            if keys is None:
                out["datasets"][name] = {"skipped": f"{data_dir() / A9A} not found; set DANE_DATA_DIR to the "
                                                    "folder holding libsvm/a9a"}
                continue
            cells = out["datasets"].setdefault(name, {"cells": []})["cells"]
            for sharding, alpha in (QUICK_SHARDINGS if args.quick else SHARDINGS):
                cells.append(cell := one_cell(keys, sharding, alpha, args))
                log(f"{name} {sharding} {alpha}: delta {cell['delta_start']:.4g}, {cell['rounds']} rounds")
    return bench.record(out)


BENCH = Bench(KEY, run, "Hessian dissimilarity against DANE's rounds", threads=None, options=(
    option("--workers", type=int, default=10), option("--lam", type=float, default=1e-3),
    option("--rounds", type=int, default=200, help="DANE's round cap"),
    option("--iters", type=int, default=30, help="Lanczos iterations where d is above the exact path's"),
    option("--seed", type=int, default=0)))
