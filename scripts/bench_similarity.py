"""Hessian dissimilarity δ against DANE's rounds under Dirichlet label skew (issue 33 item 4): JSON section
``similarity``, a grid row per ``DATASET SHARDING[ ALPHA]`` (docs/benchmarks.md, section `similarity`)."""
from __future__ import annotations

import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

from dane.api import fit
from dane.data.files import LibSVMSource, NPZSource, save_npz
from dane.numerics.similarity import measure
from dane.problems.linear_models import LinearModelConfig
from scripts.harness import Bench, count, data_dir, grid, option, relative

KEY = "similarity"
TARGET = 1e-8
SHARDINGS = (("dirichlet", 0.1), ("dirichlet", 0.5), ("dirichlet", 1.0), ("iid", None))
QUICK_SHARDINGS = (("dirichlet", 0.1), ("iid", None))
A9A = Path("libsvm") / "a9a"
DATASETS = ("a9a", "synthetic_logistic")
#: what `measure` gives that a row keeps, each at w_0 = 0 and at the last iterate (``delta_start``, ``delta_end``)
MEASURED = ("delta", "delta_mean_square", "delta_frobenius", "hessian_norm", "per_worker", "method")


def synthetic(folder: Path, n: int, d: int, seed: int = 0) -> Path:
    """Two balanced classes, x = ±b + z with z ~ N(0, diag(j^-0.5)) and b a fixed shift: an .npz for `NPZSource`."""
    rng = np.random.default_rng(seed)
    y = rng.permutation(np.arange(n) % 2).astype(np.float64)
    shift = rng.standard_normal(d) * 0.4
    X = np.where(y[:, None] > 0, shift, -shift) + rng.standard_normal((n, d)) * np.arange(1, d + 1) ** -0.25
    X[:, : d // 4] *= np.where(y[:, None] > 0, 2.0, 0.5)  # the classes differ in spread too: H_i differs, not only g_i
    return save_npz(folder / f"synthetic_logistic_{n}x{d}.npz", X, y)


def one_cell(dataset: str, sharding: str, alpha: float | None, args) -> dict:
    """DANE's rounds to `TARGET` and δ at the start and the end, for one data set and one sharding."""
    cell, a9a = {"dataset": dataset, "sharding": sharding, "alpha": alpha}, data_dir() / A9A
    if dataset == "a9a" and not a9a.is_file():
        return {**cell, "skipped": f"{a9a} not found; set DANE_DATA_DIR to the folder holding libsvm/a9a"}
    keys = {"sharding": sharding, **({} if alpha is None else {"alpha": alpha})}
    with tempfile.TemporaryDirectory(prefix="bench_similarity_") as folder:
        data = LibSVMSource(path=str(a9a), n_features=123, zero_based=False, **keys) if dataset == "a9a" \
            else NPZSource(path=str(synthetic(Path(folder), *((800, 8) if args.quick else (20000, 40)))), **keys)
        config = LinearModelConfig(data=data, loss="logistic", lam=args.lam, fit_intercept=True, optimum="auto",
                                   name="logreg", seed=args.seed)
        t0 = time.perf_counter()
        result = fit(config, "dane", workers=args.workers, rounds=args.rounds, tol=TARGET, seed=args.seed)
        run_s, final = time.perf_counter() - t0, relative(result.records)[-1]
        problems = [config.build(rank, args.workers) for rank in range(args.workers)]
    cell.update(rows=[p.n_local for p in problems], reached=bool(final <= TARGET), rounds=len(result.records),
                comm_rounds=result.records[-1]["comm_rounds"], final_relative_suboptimality=final,
                status=result.status, run_s=run_s)
    for at, w in (("start", torch.zeros(problems[0].dim, dtype=torch.float64)), ("end", result.w)):
        t0 = time.perf_counter()
        found = measure(problems, w, iters=args.iters)
        cell |= {**{f"{key}_{at}": found[key] for key in MEASURED}, f"measure_s_{at}": time.perf_counter() - t0}
    config.release()
    return cell


def cells(run) -> dict:
    """``DATASET SHARDING[ ALPHA]`` -> its `one_cell`; --quick: the synthetic set, on at most 4 workers."""
    args = run.args
    args.workers = head(args)["workers"]
    datasets, shardings = (DATASETS[1:], QUICK_SHARDINGS) if args.quick else (DATASETS, SHARDINGS)
    return {f"{dataset} {sharding}" + ("" if alpha is None else f" {alpha:g}"):
            partial(one_cell, dataset, sharding, alpha, args) for dataset in datasets for sharding, alpha in shardings}


def head(args) -> dict:
    return {"target": f"relative suboptimality (O - O*)/|O*| <= {TARGET:g}, O* from optimum=auto",
            "workers": min(args.workers, 4) if args.quick else args.workers, "lam": args.lam,
            "rounds_cap": args.rounds, "seed": args.seed}


BENCH = Bench(KEY, grid(cells, head=head), "Hessian dissimilarity against DANE's rounds", threads=None,
              only=DATASETS, resumable=True, options=(
    option("--workers", type=count, default=10), option("--lam", type=float, default=1e-3),
    option("--rounds", type=count, default=200, help="DANE's round cap"),
    option("--iters", type=count, default=30, help="Lanczos iterations where d is above the exact path's"),
    option("--seed", type=int, default=0)))
