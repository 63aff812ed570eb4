"""Hessian dissimilarity δ against DANE's rounds under Dirichlet label skew (issue 33 item 4): JSON section
``similarity``, a grid row per ``DATASET SHARDING[ ALPHA]`` (docs/benchmarks.md, section `similarity`): ``rounds``
and ``comm_rounds`` to relative `TARGET` (``reached``), δ = max_i ‖H_i − H‖₂ (``delta``; H_i of worker i's O_i,
weight m/N per row), its mean-square and Frobenius variants and ‖H‖ (``hessian_norm``), each at w_0 = 0 (``_start``)
and at the last iterate (``_end``)."""
from __future__ import annotations

import atexit
import shutil
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

from dane.api import fit
from dane.data.files import LibSVMSource, NPZSource, save_npz
from dane.problems.linear_models import LinearModelConfig
from dane.numerics.similarity import measure
from scripts.harness import Bench, count, data_dir, grid, option, relative

KEY = "similarity"
TARGET = 1e-8
SHARDINGS = (("dirichlet", 0.1), ("dirichlet", 0.5), ("dirichlet", 1.0), ("iid", None))
QUICK_SHARDINGS = (("dirichlet", 0.1), ("iid", None))
A9A = Path("libsvm") / "a9a"


def synthetic(folder: Path, n: int, d: int, seed: int = 0) -> Path:
    """Two balanced classes, x = ±b + z with z ~ N(0, diag(j^-0.5)) and b a fixed shift: an .npz for `NPZSource`."""
    rng = np.random.default_rng(seed)
    y = rng.permutation(np.arange(n) % 2).astype(np.float64)
    shift = rng.standard_normal(d) * 0.4
    X = np.where(y[:, None] > 0, shift, -shift) + rng.standard_normal((n, d)) * np.arange(1, d + 1) ** -0.25
    X[:, : d // 4] *= np.where(y[:, None] > 0, 2.0, 0.5)  # the classes differ in spread too: H_i differs, not only g_i
    return save_npz(folder / f"synthetic_logistic_{n}x{d}.npz", X, y)


def sources(quick: bool, folder: Path) -> dict[str, dict | str]:
    """name -> the keys of its source (or why it is absent)."""
    out: dict[str, dict | str] = {}
    if not quick:
        a9a = data_dir() / A9A
        out["a9a"] = {"kind": LibSVMSource, "path": str(a9a), "n_features": 123, "zero_based": False} \
            if a9a.is_file() else f"{a9a} not found; set DANE_DATA_DIR to the folder holding libsvm/a9a"
    n, d = (800, 8) if quick else (20000, 40)
    out["synthetic_logistic"] = {"kind": NPZSource, "path": str(synthetic(folder, n, d))}
    return out


def one_cell(dataset: str, keys: dict | str, sharding: str, alpha: float | None, args) -> dict:
    """DANE's rounds to the target and δ at the start and the end, for one data set and one sharding."""
    if isinstance(keys, str):
        return {"dataset": dataset, "sharding": sharding, "alpha": alpha, "skipped": keys}
    kind, file_keys = keys["kind"], {k: v for k, v in keys.items() if k != "kind"}
    source = kind(**file_keys, sharding=sharding, **({"alpha": alpha} if alpha is not None else {}))
    config = LinearModelConfig(data=source, loss="logistic", lam=args.lam, fit_intercept=True, optimum="auto",
                               name="logreg", seed=args.seed)
    t0 = time.perf_counter()
    result = fit(config, "dane", workers=args.workers, rounds=args.rounds, tol=TARGET, seed=args.seed)
    run_s, final = time.perf_counter() - t0, relative(result.records)[-1]
    problems = [config.build(rank, args.workers) for rank in range(args.workers)]
    cell = {"dataset": dataset, "sharding": sharding, "alpha": alpha, "rows": [p.n_local for p in problems],
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


def cells(run) -> dict:
    """``DATASET SHARDING[ ALPHA]`` -> its `one_cell`; the files in a folder that lives as long as the process."""
    args, folder = run.args, Path(tempfile.mkdtemp(prefix="bench_similarity_"))
    atexit.register(shutil.rmtree, folder, True)
    args.workers = head(args)["workers"]
    return {f"{name} {sharding}{'' if alpha is None else f' {alpha:g}'}": partial(one_cell, name, keys, sharding,
                                                                                   alpha, args)
            for name, keys in sources(args.quick, folder).items()
            for sharding, alpha in (QUICK_SHARDINGS if args.quick else SHARDINGS)}


def head(args) -> dict:
    return {"target": f"relative suboptimality (O - O*)/|O*| <= {TARGET:g}, O* from optimum=auto",
            "workers": min(args.workers, 4) if args.quick else args.workers, "lam": args.lam,
            "rounds_cap": args.rounds, "seed": args.seed}


BENCH = Bench(KEY, grid(cells, head=head), "Hessian dissimilarity against DANE's rounds", threads=None,
              only=("a9a", "synthetic_logistic"), resumable=True, options=(
    option("--workers", type=count, default=10), option("--lam", type=float, default=1e-3),
    option("--rounds", type=count, default=200, help="DANE's round cap"),
    option("--iters", type=count, default=30, help="Lanczos iterations where d is above the exact path's"),
    option("--seed", type=int, default=0)))
