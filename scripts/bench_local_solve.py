"""The cost of one DANE local solve against d, by Cholesky and by CG: JSON section ``local_solve_cost``, a grid row per
case ``d=D LAYOUT SOLVER``, each measured in a fresh process (docs/benchmarks.md, section `local_solve`)."""
from __future__ import annotations

import os
import tempfile

import numpy as np
import scipy.sparse as sp
import torch

from dane.losses import LOSSES
from dane.numerics.local_solvers import LocalSolver
from dane.problems.glm import LinearModelShard, to_torch
from dane.synthetic.sparse_data import rcv1_like
from scripts.harness import Bench, count, grid, in_fresh_process, option, peak_rss_kb, spread, timer

KEY = "local_solve_cost"


def cost_cases(args) -> dict[str, dict]:
    """The cases by name, ``d=D LAYOUT SOLVER``: rows ``n_rows`` = 2d (--quick: two small ones)."""
    cases = ([{"d": 100, "layout": "dense", "n_rows": 200, "solver": "cholesky"},
              {"d": 1000, "layout": "sparse", "n_rows": 2000, "solver": "cg"}] if args.quick else
             [{"d": d, "layout": layout, "n_rows": 2 * d, "solver": solver}
              for d, layout in ((500, "dense"), (5000, "dense"), (50000, "sparse")) for solver in ("cholesky", "cg")])
    return {f"d={c['d']} {c['layout']} {c['solver']}": c for c in cases}


def skip_reason(case: dict, memory_bytes: int) -> str | None:
    """Why the Cholesky path cannot run this case here (it would need over half the memory), or None."""
    d, n, sparse = case["d"], case["n_rows"], case["layout"] == "sparse"
    if case["solver"] != "cholesky" or 8 * (2 * d * d + (n * d if sparse else 0)) <= memory_bytes // 2:
        return None
    gb = 8 * d * d / 1e9
    return (f"cannot fit: the Cholesky path forms the dense {d} x {d} Hessian ({gb:.0f} GB in float64) and its "
            f"factor ({gb:.0f} GB)" + (f", and densifies X ({8 * n * d / 1e9:.0f} GB)" if sparse else "")
            + f", against {memory_bytes / 2**30:.0f} GiB of memory here")


def write_case_data(case: dict, folder: str) -> None:
    """A case's rows into ``folder``: y = <x, 1> + noise in data.npz, beside dense X (x ~ N(0, I)), else `rcv1_like`'s
    in X.npz."""
    d, n, rng = case["d"], case["n_rows"], np.random.default_rng(0)
    if case["layout"] == "dense":
        X = rng.standard_normal((n, d))
        np.savez(f"{folder}/data.npz", X=X, y=X.sum(1) + rng.standard_normal(n))
    else:
        X, _ = rcv1_like(n, d, seed=0)
        sp.save_npz(f"{folder}/X.npz", X, compressed=False)
        np.savez(f"{folder}/data.npz", y=np.asarray(X.sum(1)).ravel() + rng.standard_normal(n))


def measure_case(case: dict, folder: str, repeats: int, lam: float = 1e-3) -> dict:
    """The fresh process: ridge, w_t = 0, g = this worker's gradient (η = 1, μ = 0), one thread.  ``first_round_s``
    forms H_i and its factor (μ changed), ``round_s`` solves again at that μ; memory in MB over ``baseline_mb`` (VmHWM
    after the imports); ``relative_gradient_after``: |∇φ| at the solution over |g|."""
    torch.set_num_threads(1)  # one core per worker, as in the simulator
    baseline_kb, arrays = peak_rss_kb(), np.load(f"{folder}/data.npz")
    if case["layout"] == "dense":
        X = torch.from_numpy(arrays["X"])
        data_bytes = X.numel() * 8
    else:  # float64 values, int64 indices
        X = to_torch(sp.load_npz(f"{folder}/X.npz"))
        data_bytes = X.values().numel() * 16 + X.crow_indices().numel() * 8
    y, solver = torch.from_numpy(arrays["y"]), LocalSolver(case["solver"])

    def fresh_shard():  # no cached factor: the round in which μ changed
        return LinearModelShard(X, y, LOSSES["squared"], l2=lam, weight=1.0 / case["n_rows"], solver=solver)

    shard, w = fresh_shard(), torch.zeros(case["d"], dtype=torch.float64)
    grad = shard.grad(w)
    linear = grad - grad  # ∇O_i(w_t) − η g with g = ∇O_i(w_t), η = 1
    data_kb, first, again = peak_rss_kb(), [], []
    for _ in range(repeats):
        del shard
        shard = fresh_shard()
        first.append(timer(lambda: shard.prox_solve(w, linear, 0.0, anchor_grad=grad)))
        again.append(timer(lambda: shard.prox_solve(w, linear, 0.0, anchor_grad=grad)))
    peak_kb = peak_rss_kb()
    residual = shard.grad(shard.prox_solve(w, linear, 0.0, anchor_grad=grad)) - linear  # ∇φ at the local solution
    return {"round_s": spread(again), "first_round_s": spread(first),
            "peak_mb": (peak_kb - baseline_kb) / 1024, "peak_with_data_only_mb": (data_kb - baseline_kb) / 1024,
            "baseline_mb": baseline_kb / 1024, "data_mb": data_bytes / 2**20,
            "relative_gradient_after": float(torch.linalg.vector_norm(residual) / torch.linalg.vector_norm(grad))}


def measure(run, case: dict) -> dict:
    """A case skipped where the Cholesky path cannot fit here, else `measure_case` in a fresh process."""
    if why := skip_reason(case, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")):
        return {**case, "skipped": why}
    with tempfile.TemporaryDirectory() as folder:
        write_case_data(case, folder)
        return {**case, **in_fresh_process("scripts.bench_local_solve:measure_case", case, folder, run.args.repeats)}


BENCH = Bench(KEY, grid(lambda run: cost_cases(run.args), measure),
              "one local solve against d: Cholesky and CG time per round, peak memory", threads=None, resumable=True,
              options=(option("--repeats", type=count, default=3),))
