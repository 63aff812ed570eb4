"""The cost of one DANE local solve against d, by Cholesky and by CG: JSON section ``local_solve_cost``, one row of
`scripts.harness.grid` per case ``d=D LAYOUT SOLVER`` (docs/benchmarks.md, section `local_solve`).  The solve:
w_i = argmin O_i(w) - <grad O_i(w_t) - eta g, w>, lam = 1e-3, w_t = 0, g the worker's own gradient (eta = 1, mu = 0),
one torch thread.  ``first_round_s`` forms H_i and its Cholesky factor (a round whose mu changed), ``round_s`` is the
next solve at the same mu (Cholesky reuses the factor; CG solves again); ``peak_mb``: VmHWM minus ``baseline_mb``
(after the imports), ``peak_with_data_only_mb`` the same before any solve; ``relative_gradient_after``: |grad phi| at
the solution over |g|."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from dane.synthetic.sparse_data import rcv1_like
from scripts.harness import Bench, Run, count, grid, in_fresh_process, option, peak_rss_kb, spread, timer

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
    d, n = case["d"], case["n_rows"]
    need = 8 * (2 * d * d + (n * d if case["layout"] == "sparse" else 0))
    if case["solver"] != "cholesky" or need <= memory_bytes // 2:
        return None
    gb = 8 * d * d / 1e9
    return (f"cannot fit: the Cholesky path forms the dense {d} x {d} Hessian ({gb:.0f} GB in float64) and its "
            f"factor ({gb:.0f} GB)" + (f", and densifies X ({8 * n * d / 1e9:.0f} GB)" if case["layout"] == "sparse"
                                       else "") + f", against {memory_bytes / 2**30:.0f} GiB of memory here")


def write_case_data(case: dict, folder: Path) -> Path:
    """Generate a case's rows (dense x ~ N(0, I), or `rcv1_like`) and y = <x, 1> + noise into ``folder``."""
    import numpy as np
    import scipy.sparse as sp

    d, n = case["d"], case["n_rows"]
    rng = np.random.default_rng(0)
    path = folder / f"case_{d}_{case['layout']}.npz"
    if path.exists():
        return path
    if case["layout"] == "dense":
        X = rng.standard_normal((n, d))
        np.savez(path, X=X, y=X.sum(1) + rng.standard_normal(n))
    else:
        X, _ = rcv1_like(n, d, seed=0)
        sp.save_npz(folder / f"X_{d}.npz", X, compressed=False)
        np.savez(path, y=np.asarray(X.sum(1)).ravel() + rng.standard_normal(n), sparse=str(folder / f"X_{d}.npz"))
    return path


def measure_case(case: dict, data: str, repeats: int, lam: float = 1e-3) -> dict:
    """In a fresh process: one DANE local solve (ridge, w_t = 0, g = this worker's gradient) timed ``repeats`` times."""
    import numpy as np
    import scipy.sparse as sp
    from dane.numerics.local_solvers import LocalSolver
    from dane.losses import LOSSES
    from dane.problems.glm import LinearModelShard, to_torch

    torch.set_num_threads(1)  # one core per worker, as in the simulator
    baseline_kb = peak_rss_kb()
    arrays = np.load(data)
    if case["layout"] == "dense":
        X = torch.from_numpy(arrays["X"])
        data_bytes = X.numel() * 8
    else:
        Xs = sp.load_npz(str(arrays["sparse"]))
        X, data_bytes = to_torch(Xs), Xs.nnz * 16 + (Xs.shape[0] + 1) * 8  # float64 values, int64 indices
        del Xs
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
    w_new = shard.prox_solve(w, linear, 0.0, anchor_grad=grad)
    residual = float(torch.linalg.vector_norm(shard.grad(w_new) - linear))  # ∇φ at the local solution
    return {"round_s": spread(again), "first_round_s": spread(first),
            "peak_mb": (peak_kb - baseline_kb) / 1024, "peak_with_data_only_mb": (data_kb - baseline_kb) / 1024,
            "baseline_mb": baseline_kb / 1024, "data_mb": data_bytes / 2**20,
            "relative_gradient_after": residual / float(torch.linalg.vector_norm(grad))}


def measure(run: Run, case: dict) -> dict:
    """A case skipped where the Cholesky path cannot fit here, else `measure_case` in a fresh process."""
    why = skip_reason(case, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    if why:
        return {**case, "skipped": why}
    with tempfile.TemporaryDirectory() as tmp:
        data = str(write_case_data(case, Path(tmp)))
        return {**case, **in_fresh_process("scripts.bench_local_solve:measure_case", case, data, run.args.repeats)}


BENCH = Bench(KEY, grid(lambda run: cost_cases(run.args), measure), "one local solve against d: Cholesky and CG time per round, "
              "peak memory", threads=None, resumable=True, options=(option("--repeats", type=count, default=3),))
