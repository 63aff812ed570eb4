"""Strong scaling under horovodrun, np=2 against np=1: JSON section ``strong_scaling``, parts (``--only``) ``ridge``,
``factorization``, ``background_loop`` and ``mnist`` (key ``mnist_lenet5``); docs/benchmarks.md, section `scaling`."""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from dane.comm.horovod import COMPUTE_BOUND_CYCLE_MS, LATENCY_BOUND_CYCLE_MS
from dane.numerics.linalg import cholesky_solve
from dane.problems import RidgeSyntheticConfig
from dane.problems.quadratic import EIGH_BREAK_EVEN
from dane.problems.ridge import gram, optimum_cache_path, shard_positions, synthesize
from dane.records.results import read_rounds, read_summary
from dane.synthetic.launchers import horovodrun, horovodrun_side_by_side
from scripts.harness import (Bench, Run, best_of, counts, interleave, load, matching, mnist_missing, need_horovod, now,
                             over, spread, spreads, steady, timer, trained)

KEY = "strong_scaling"
RIDGE = ("algorithm=dane", "problem=ridge_synthetic", "problem.n_samples=18000", "problem.dim=2000", "tol=1e-8",
         "rounds=100", "quiet=true")
RIDGE_GOAL, MNIST_GOAL = 1.5, 1.8  # issue 22 item 6: one core per worker on both sides (one_thread)
SECTIONS = ("ridge", "factorization", "background_loop", "mnist")
THREADS = {"default": {}, "one_thread": {"OMP_NUM_THREADS": "1"}}
#: the package's Horovod cycle for a network (auto: HorovodOptions.COMPUTE_BOUND_CYCLE_MS) against the convex problems'
MNIST_VARIANTS = {"default": (), "cycle_0.1ms": ("comm.horovod_cycle_time_ms=0.1",)}


def np1_np2(tmp: Path, name: str, overrides: tuple[str, ...], env: dict[str, str], repeats: int, measure,
            twin_keys: tuple[str, ...] = ()) -> list[dict]:
    """Per repeat, a row per launch of ``horovodrun -np 1`` then ``-np 2``: its status, ``measure(summary, rounds)``,
    the launcher's wall time and the load around it (``launch_failed`` where it failed; the others go on); then,
    with ``twin_keys``, two np=1 runs at once, one a core, each row those keys of ``measure``."""
    runs = []
    for repeat in range(repeats):
        for np in (1, 2):
            t = trained(tmp / f"{name}_{repeat}_{np}", overrides, np=np, env=env)
            if "error" in t:
                print(f"launch failed (np={np}, load {t['load_before']}): {t['error']}", file=sys.stderr, flush=True)
                runs.append({"np": np, "repeat": repeat, "status": "launch_failed"})
                continue
            runs.append({"np": np, "repeat": repeat, "status": t["summary"]["status"],
                         **measure(t["summary"], t["records"]), "launcher_wall_s": t["wall_s"],
                         "load_before": t["load_before"], "load_after": t["load_after"]})
            print(f"{name} np={np} repeat {repeat}: {runs[-1]}", flush=True)
        if twin_keys:
            runs += twins(overrides, tmp / f"{name}_twins_{repeat}", repeat, measure, twin_keys, env)
    return runs


def twins(overrides: tuple[str, ...], out: Path, repeat: int, measure, keys: tuple[str, ...],
          env: dict[str, str]) -> list[dict]:
    """Two np=1 runs at once, one per core (each rank's speed while the other core works): a row per core, or one
    ``launch_failed`` row where either failed."""
    before, dirs = load(), [out / f"core{k}" for k in range(2)]
    try:
        horovodrun_side_by_side("dane.experiments.train", [[*overrides, f"out_dir={d}"] for d in dirs], env=env,
                                timeout=900)
    except RuntimeError as err:  # a run that failed or timed out (killed), named
        print(f"twin launch failed (load {before}): {str(err)[-2000:]}", file=sys.stderr, flush=True)
        return [{"np": "twin", "repeat": repeat, "status": "launch_failed"}]
    rows = []
    for k, d in enumerate(dirs):
        summary = read_summary(d)
        measured = measure(summary, read_rounds(d))
        rows.append({"np": "twin", "repeat": repeat, "core": k, "status": summary["status"],
                     **{key: measured[key] for key in keys}, "load_before": before, "load_after": load()})
    return rows


def launched(runs: list[dict], np) -> list[dict]:
    """The runs of ``np`` (1, 2 or ``"twin"``) whose launch did not fail."""
    return [r for r in runs if r["np"] == np and r["status"] != "launch_failed"]


def np_ratio(runs: list[dict], key: str) -> tuple[float | None, dict | None]:
    """np=1's median ``key`` over np=2's, and the spread of that ratio per repeat (a pair launched under one load)."""
    per_repeat = [a[key] / b[key] for a in launched(runs, 1) for b in launched(runs, 2) if a["repeat"] == b["repeat"]]
    return over(matching(runs, key, np=1), matching(runs, key, np=2)), spread(per_repeat)


def ceiling(runs: list[dict], key: str, perfect, slowdown: str) -> dict:
    """The np1 / np2 ratio a perfect np=2 would reach here, ``perfect(np=1 run alone, mean key of its twins)`` per
    repeat with both (docs/benchmarks.md, section `scaling`): its median and spread, the twins' ``key`` and
    ``slowdown``, the median of twins over alone.  An upper bound: a real round also waits for the slower rank."""
    alone, beside = {r["repeat"]: r for r in launched(runs, 1)}, {}
    for r in launched(runs, "twin"):
        beside.setdefault(r["repeat"], []).append(r[key])
    pairs = [(alone[k], statistics.mean(v)) for k, v in beside.items() if k in alone]
    if not pairs:
        return {"ceiling": None}
    per_repeat = spread([perfect(a, b) for a, b in pairs])
    return {"ceiling": per_repeat["median"], "ceiling_per_repeat": per_repeat,
            f"twin_{key}": spread([b for _, b in pairs]), slowdown: statistics.median(b / a[key] for a, b in pairs)}


def ridge_ceiling(runs: list[dict]) -> dict:
    """The ridge's time to the target: T1 / (S_beside / 2 + R1), setup S and rounds R (a perfect np=2 builds half
    the Gram matrix at the speed beside a busy core, then needs no more round time than np=1's one step)."""
    return ceiling(runs, "setup_s", lambda a, b: (a["setup_s"] + a["time_s"]) / (b / 2 + a["time_s"]),
                   "setup_slowdown_beside_twin")


def mnist_ceiling(runs: list[dict]) -> dict:
    """MNIST's time per round: 2 x (np=1 alone) / (np=1 beside its twin)."""
    return ceiling(runs, "round_s", lambda a, b: 2 * a["round_s"] / b, "slowdown_beside_twin")


def ridge(tmp: Path, repeats: int) -> dict:
    config = RidgeSyntheticConfig(n_samples=18000, dim=2000)
    cached = optimum_cache_path(*config.data_key, config.lam).exists()
    # the reference optimum: computed once (or read from the cache) as a first run would
    result: dict = {"problem": " ".join(RIDGE), "reference_optimum_s": timer(config.prepare),
                    "reference_optimum_was_cached": cached, "variants": {}}
    for variant, env in THREADS.items():
        judged = variant == "one_thread"  # its pairs get twins, and the goal
        runs = np1_np2(tmp, f"ridge_{variant}", RIDGE, env, repeats, lambda s, _: {
            "rounds": s["rounds"], "final_suboptimality": s["final_suboptimality"], "setup_s": s["setup_s"],
            "time_s": s["time_s"], "time_to_tol_s": s["setup_s"] + s["time_s"]},
            ("setup_s", "time_s") if judged else ())
        result["variants"][variant] = summarize(runs, goal=RIDGE_GOAL if judged else None)
    one_thread = result["variants"]["one_thread"]
    result.update(ratio=one_thread["ratio_time_to_tol"], goal=RIDGE_GOAL, goal_met=one_thread["goal_met"],
                  goal_variant="one_thread", ceiling=ridge_ceiling(one_thread["runs"]))
    return result


def summarize(runs: list[dict], goal: float | None) -> dict:
    """The ridge's launches (`np1_np2`): their spreads, and np1 / np2 of the time to the target and of the
    launcher's wall time."""
    out: dict = {"runs": runs, "launches_failed": sum(r["status"] == "launch_failed" for r in runs)}
    if not (launched(runs, 1) and launched(runs, 2)):
        return {**out, "ratio_time_to_tol": None, "goal": goal, "goal_met": None}
    for np in (1, 2):
        rs = launched(runs, np)
        out[f"np{np}"] = {**spreads(rs, ("time_to_tol_s", "setup_s", "time_s", "launcher_wall_s", "rounds")),
                          "all_converged": all(r["status"] == "converged" for r in rs)}
    for key in ("time_to_tol_s", "launcher_wall_s"):
        out[f"ratio_{key[:-2]}"], out[f"ratio_{key[:-2]}_per_repeat"] = np_ratio(runs, key)
    if goal is not None:
        out.update(goal=goal, goal_met=out["ratio_time_to_tol"] >= goal)
    return out


def factorization(dim: int = 2000, rows: int = 9000, reps: int = 3) -> dict:
    """One core: Cholesky of a local Hessian plus a shift, against its eigendecomposition."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        X, _ = synthesize(18000, dim, "iso", 1.0, 0, *shard_positions(18000, 2, 0))
        A = gram(X[:rows]).mul_(2 / rows)
        A.diagonal().add_(0.01)

        def shifted_cholesky() -> None:  # as QuadraticProblem factors A_i + sI
            M = A.clone()
            M.diagonal().add_(0.3)
            torch.linalg.cholesky_ex(M)

        L, r = torch.linalg.cholesky(A), torch.ones(dim, dtype=A.dtype)
        before = load()
        calls = {"cholesky_s": shifted_cholesky,
                 "lapack_potrs_s": lambda: torch.cholesky_solve(r.unsqueeze(1), L),
                 "two_triangular_s": lambda: cholesky_solve(L, r), "eigh_s": lambda: torch.linalg.eigh(A),
                 "gram_s": lambda: gram(X[:rows]), "xt_x_matmul_s": lambda: X[:rows].T @ X[:rows]}
        best = {name: best_of(call, reps) for name, call in calls.items()}
    finally:
        torch.set_num_threads(threads)
    return {"dim": dim, "threads": 1, "cholesky_s": best["cholesky_s"], "eigh_s": best["eigh_s"],
            "break_even_measured": best["eigh_s"] / best["cholesky_s"], "EIGH_BREAK_EVEN": EIGH_BREAK_EVEN,
            "one_rhs_solve": {key: best[key] for key in ("lapack_potrs_s", "two_triangular_s")},
            "gram_rows": rows, "gram_s": best["gram_s"], "xt_x_matmul_s": best["xt_x_matmul_s"],
            "load_before": before, "load_after": load()}


def background_loop(tmp: Path, repeats: int) -> dict:
    """The CPU share of Horovod's background loop in a computing rank, at three cycle times taking turns."""
    cycles = (LATENCY_BOUND_CYCLE_MS, 1.0, COMPUTE_BOUND_CYCLE_MS)

    def share(cycle: float, repeat: int) -> float:
        out = tmp / f"background_{cycle}_{repeat}.json"
        horovodrun("dane.synthetic.background_cpu", ["--out", str(out)], np=2, env={"HOROVOD_CYCLE_TIME": str(cycle)})
        value = json.loads(out.read_text())["other_threads_cpu_per_s"]
        print(f"background loop at {cycle} ms: {value:.3f} of a core", flush=True)
        return value

    shares = interleave(cycles, repeats, share)
    return {"what": "CPU seconds per wall second of a rank's threads other than its computing main thread "
                    "(Horovod's background loop), horovodrun -np 2, package pinning",
            "by_cycle_ms": {str(c): spread(v) for c, v in shares.items()},
            "latency_bound_cycle_ms": LATENCY_BOUND_CYCLE_MS, "compute_bound_cycle_ms": COMPUTE_BOUND_CYCLE_MS,
            "load": load()}


def mnist(tmp: Path, repeats: int, rounds: int) -> dict:
    if why := mnist_missing():
        print(f"mnist_lenet5: skipped: {why}", flush=True)
        return {"skipped": f"skipped: {why}"}
    overrides = ("algorithm=dane", "problem=mnist_lenet5", "problem.inner_steps=null", f"rounds={rounds}",
                 "quiet=true")
    result: dict = {"problem": " ".join(overrides), "variants": {}}
    for variant, extra in MNIST_VARIANTS.items():
        runs = np1_np2(tmp, f"mnist_{variant}", (*overrides, *extra), {}, repeats,
                       lambda _, rounds: {"round_s": statistics.median(steady(rounds)), "rounds": len(rounds) - 2},
                       ("round_s",) if variant == "default" else ())
        result["variants"][variant] = mnist_ratio(runs)
    default = result["variants"]["default"]
    result.update(ratio=default["ratio"], goal=MNIST_GOAL,
                  goal_met=None if default["ratio"] is None else default["ratio"] >= MNIST_GOAL,
                  ceiling=mnist_ceiling(default["runs"]))
    if default["ratio"] is not None and result["ceiling"]["ceiling"] is not None:
        result["ratio_over_ceiling"] = default["ratio"] / result["ceiling"]["ceiling"]
    return result


def mnist_ratio(runs: list[dict]) -> dict:
    """np1 / np2 of the median time per round, and per repeat (`np_ratio`)."""
    ratio, per_repeat = np_ratio(runs, "round_s")
    return {"runs": runs, "ratio": None} if ratio is None else {
        "runs": runs, "np1_round_s": matching(runs, "round_s", np=1), "np2_round_s": matching(runs, "round_s", np=2),
        "ratio": ratio, "ratio_per_repeat": per_repeat}


def run(bench: Run) -> None:
    args = bench.args
    if args.quick:  # one repeat, two MNIST rounds: a smoke run on a shared machine
        args.repeats, args.mnist_rounds = 1, 2
    need_horovod()
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # the caller's thread settings must not leak into launches
        os.environ.pop(key, None)
    report = {**bench.earlier, "started_at": now(), "machine": bench.machine}
    with tempfile.TemporaryDirectory() as tmp:
        measures = {"ridge": lambda: ridge(Path(tmp), args.repeats), "factorization": factorization,
                    "background_loop": lambda: background_loop(Path(tmp), args.repeats),
                    "mnist": lambda: mnist(Path(tmp), args.repeats, args.mnist_rounds)}
        for name in args.only or SECTIONS:  # each merged into --out as it ends: a later failure loses nothing
            report["mnist_lenet5" if name == "mnist" else name] = measures[name]()
            report.update(updated_at=now(), load_avg_now=load())
            bench.save(report)
            bench.log(f"{KEY}.{name} -> {bench.path}")
    bench.finish(report)


BENCH = Bench(KEY, run, "strong scaling under horovodrun -np 2 over -np 1: ridge, MNIST LeNet-5, Horovod's loop",
              threads=None, only=SECTIONS, options=counts(repeats=3, mnist_rounds=3))
