"""InexactDANE's and AIDE's local solver, SVRG: its pass and compile cost, InexactDANE's round, a sparse launch and a
machine's first round (JSON section ``svrg_local_solver``, grid rows, times `spread`s in seconds); docs/benchmarks.md,
section `svrg`, says what each row measures."""
from __future__ import annotations

import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

# none of these loads the numba kernels: `compile_child` times that in a fresh process
from dane.baselines import InexactDANEConfig
from dane.comm import ThreadGroup
from dane.loop.runner import run as run_rounds
from dane.loop.stopping import StopRule
from dane.losses import LOSSES
from dane.numerics.local_solvers import LocalSolver, Subproblem
from dane.numerics.svrg import svrg, svrg_reference
from dane.problems.glm import LinearModelShard, to_torch
from dane.records.results import read_rounds
from dane.synthetic.bench_file import external_reference
from dane.synthetic.sparse_data import rcv1_like, write_sparse_libsvm
from scripts.harness import (Bench, count, grid, in_fresh_process, interleave, launch, option, spread, steady, timer,
                             trained)

KEY = "svrg_local_solver"
#: the public Octave + mex InexactDANE's round, 4 workers x 5,160 rows, d=14, 3 passes (its run's record:
#: paper_figs/evidence/external_references.json, ``inexact_dane_octave``)
REFERENCE_ROUND_S = external_reference("inexact_dane_octave")["round_s"]


def dense_logistic(n: int, d: int = 14, seed: int = 0):
    """n rows: d - 1 standard normal features and an intercept; ±1 labels from a logistic model."""
    rng = np.random.default_rng(seed)
    X = np.hstack([rng.standard_normal((n, d - 1)), np.ones((n, 1))])
    p = 1 / (1 + np.exp(-(X @ rng.standard_normal(d))))
    return X, np.where(rng.random(n) < p, 1.0, -1.0)


def shard_of(X, y, loss: str, classes: int = 1, weight: float | None = None) -> LinearModelShard:
    """A worker's rows, lam = 1e-4, each row weighing ``weight`` (1/n by default)."""
    y = torch.as_tensor(y, dtype=torch.int64 if loss == "softmax" else torch.float64)
    return LinearModelShard(to_torch(X), y, LOSSES[loss], l2=1e-4, weight=weight or 1.0 / X.shape[0], classes=classes)


def pass_cases(quick: bool) -> dict[str, Subproblem]:
    """Name -> the local problem at w = anchor = 0 of: dense logistic (d = 14), sparse rcv1-like logistic, dense
    785-column softmax."""
    rng, zeros = np.random.default_rng(1), partial(torch.zeros, dtype=torch.float64)
    n_dense, n_sparse, n_soft = (600, 500, 200) if quick else (5160, 5000, 2000)
    X, y = dense_logistic(n_dense)
    Xs, _ = rcv1_like(n_sparse, 2000 if quick else 20000, seed=0)
    Xm = rng.random((n_soft, 785))
    shards = {f"dense {n_dense} x 14 logistic": shard_of(X, y, "logistic"),
              f"sparse rcv1-like {n_sparse} x {Xs.shape[1]} logistic":
                  shard_of(Xs, np.sign(rng.standard_normal(n_sparse)), "logistic"),
              f"dense {n_soft} x 785 softmax, 10 classes":
                  shard_of(Xm, rng.integers(0, 10, n_soft), "softmax", classes=10)}
    return {name: Subproblem(shard, zeros(shard.dim), zeros(shard.dim), 0.0, shard.l2)
            for name, shard in shards.items()}


def pass_cost(sub: Subproblem, repeats: int, reference_repeats: int) -> dict:
    """``pass CASE``: an SVRG pass (3 timed, over 3), a full gradient and a torch-reference pass, interleaved."""
    shard, gen = sub.shard, torch.Generator().manual_seed(0)
    svrg(sub, LocalSolver("svrg", passes=1), gen)  # compile (or load the cache)
    calls = {"full_gradient": lambda: shard.data_value_grad(sub.anchor),
             "svrg_pass": lambda: svrg(sub, LocalSolver("svrg", passes=3), gen),
             "reference_pass": lambda: svrg_reference(sub, LocalSolver("svrg", passes=1), gen)}
    runs = interleave(calls, repeats, lambda name, r: None if name == "reference_pass" and r >= reference_repeats
                      else timer(calls[name]) / (3 if name == "svrg_pass" else 1))
    row = {"rows": shard.n_local, "dim": shard.dim, **{name: spread(times) for name, times in runs.items()}}
    median = {name: (row[name] or {}).get("median") for name in calls}
    row.update(pass_over_gradient=median["svrg_pass"] / median["full_gradient"], goal="svrg_pass / full_gradient <= 3",
               reference_over_compiled=median["reference_pass"] and median["reference_pass"] / median["svrg_pass"])
    return {**row, "goal_met": row["pass_over_gradient"] <= 3}


def compile_cost() -> dict:
    """``compile``: `compile_child` in a fresh process with an empty numba cache, then with the one it left."""
    with tempfile.TemporaryDirectory() as cache:
        return {label: in_fresh_process("scripts.bench_svrg:compile_child", env={"NUMBA_CACHE_DIR": cache})
                for label in ("cold", "warm")}


def compile_child() -> dict:
    """The fresh process: import the kernels (compile or cache load), then per case a first and a second solve."""
    cases = pass_cases(True)
    out = {"import_s": timer(lambda: __import__("dane.numerics.svrg_kernels")), "first_solve_s": {},
           "second_solve_s": {}}
    for name, sub in cases.items():
        for key in ("first_solve_s", "second_solve_s"):
            out[key][name] = timer(lambda: svrg(sub, LocalSolver("svrg", passes=1), torch.Generator()))
    return {**out, "first_solves_total_s": sum(out["first_solve_s"].values())}


def inexact_dane_round(quick: bool, m: int = 4) -> dict:
    """``round``: worker 0's seconds per InexactDANE round (defaults) on m threads x n_i dense rows (``compiled``)
    over `REFERENCE_ROUND_S` (``ratio_to_public_reference``)."""
    n_i = 600 if quick else 5160
    X, y = dense_logistic(m * n_i)

    def walls(rounds: int) -> list[float]:  # worker 0's seconds per record, on fresh shards
        problems = [shard_of(X[r::m], y[r::m], "logistic", weight=1.0 / (m * n_i)) for r in range(m)]

        def worker(comm):
            torch.set_num_threads(1)
            stamps = [time.perf_counter()]
            run_rounds(InexactDANEConfig().build(problems[comm.rank], comm), StopRule(rounds=rounds),
                       lambda record: stamps.append(time.perf_counter()))
            return np.diff(stamps).tolist()

        return ThreadGroup(m).run(worker)[0]

    walls(1)  # compile or load the cache
    seconds = walls(3 if quick else 20)[:-1]  # the last record is the final evaluation
    out = {"workers": m, "rows_per_worker": n_i, "compiled": spread(seconds),
           "goal": f"round <= 3 x {REFERENCE_ROUND_S:g} s",
           "public_reference_round_s": REFERENCE_ROUND_S,
           "ratio_to_public_reference": statistics.median(seconds) / REFERENCE_ROUND_S}
    return {**out, "goal_met": out["ratio_to_public_reference"] <= 3}


def sparse_launch(quick: bool) -> dict:
    """``launch``: 2 workers on `write_sparse_libsvm`'s file, lam = 1e-4, no intercept, timed from outside."""
    rows, features, rounds = (1000, 2000, 3) if quick else (10_000, 20_000, 10)
    with tempfile.TemporaryDirectory() as tmp:
        path, run_dir = write_sparse_libsvm(Path(tmp) / "sparse.svm", rows, features, seed=0), Path(tmp) / "run"
        out = {"rows": rows, "features": features, "rounds": rounds, **launch(
            [sys.executable, "-m", "dane.experiments.train", "problem=logreg", "data=libsvm", f"data.path={path}",
             "problem.lam=1e-4", "problem.fit_intercept=false", "algorithm=inexact_dane", "workers=2",
             f"rounds={rounds}", f"out_dir={run_dir}", "quiet=true"], env={"OMP_NUM_THREADS": "1"})}
        if out["exit_status"] == 0:
            out["round_time"] = spread(steady(read_rounds(run_dir), 0))
    return out


def first_round(repeats: int, quick: bool) -> dict:
    """``first_round``: per repeat a fresh numba cache, InexactDANE cold, then warm, then GIANT, each a fresh process;
    InexactDANE's first round over GIANT's."""
    rounds, methods = (3 if quick else 8), {"cold": "inexact_dane", "warm": "inexact_dane", "giant": "giant"}

    def one(method: str, cache: Path, out: Path) -> dict:
        t = trained(out, ["problem=logreg", f"algorithm={method}", "workers=2", f"rounds={rounds}", "tol=null",
                          "quiet=true"], env={"NUMBA_CACHE_DIR": str(cache)})
        if t["summary"] is None:
            return {"error": t["error"]}
        steps = steady(t["records"], 0)[:-1]  # the last record is the final evaluation
        timeline = t["summary"]["timeline"]
        return {"first_round_s": float(steps[0]), "later_round_s": float(np.median(steps[1:])),
                "start_up_left_out_s": t["summary"]["simulated_start_up_s"],
                "setup_wall_s": timeline["round0"] - timeline["data"]}

    with tempfile.TemporaryDirectory() as tmp:
        runs = [{name: one(method, Path(tmp) / f"numba_{k}", Path(tmp) / f"{name}_{k}") for name, method in
                 methods.items()} for k in range(repeats)]
    ok = [r for r in runs if not any("error" in v for v in r.values())]
    out = {"runs": runs, "rounds": rounds, "goal": "first_over_giant <= 2 (warm)",
           **{f"{name}_{key}": spread([r[name][key] for r in ok]) for name in methods
              for key in ("first_round_s", "later_round_s", "start_up_left_out_s", "setup_wall_s")}}
    for cache in ("cold", "warm"):
        out[f"first_over_giant_{cache}"] = statistics.median(r[cache]["first_round_s"] / r["giant"]["first_round_s"]
                                                             for r in ok) if ok else None
    out["first_over_giant"] = out["first_over_giant_warm"]
    return {**out, "goal_met": out["first_over_giant"] is not None and out["first_over_giant"] <= 2}


def cells(run) -> dict:
    args = run.args
    passes = {f"pass {name}": partial(pass_cost, sub, args.repeats, args.reference_repeats)
              for name, sub in pass_cases(args.quick).items()}
    return {**passes, "compile": compile_cost, "round": partial(inexact_dane_round, args.quick),
            "launch": partial(sparse_launch, args.quick),
            "first_round": partial(first_round, 1 if args.quick else args.first_repeats, args.quick)}


BENCH = Bench(KEY, grid(cells), "the SVRG local solver: pass cost, compile cost, InexactDANE's round, a sparse launch, "
              "a first run", only=("pass", "compile", "round", "launch", "first_round"), resumable=True, options=(
                  option("--first-repeats", type=count, default=5, help="first_round: fresh caches (3 runs each)"),
                  option("--repeats", type=count, default=7),
                  option("--reference-repeats", type=int, default=1, help="torch-reference passes per case (slow)")))
