"""Launch-to-answer wall clock, split into its parts, against one-process L-BFGS baselines: JSON section
``wallclock``; docs/benchmarks.md, section `wallclock`."""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from dane.synthetic.lbfgs_baseline import fit, read_rows, value_grad
from scripts.harness import (Bench, Run, count, first_at, folder, interleave, launch, load, mnist_dir, option,
                             relative, spread, spreads, trained)

KEY = "wallclock"
TARGET = 1e-8                  # relative suboptimality every timed run should reach
LAUNCH_GOAL_S = 2.0            # np2's answer over the bare horovodrun line, at most
PARTS = ("launcher", "imports", "data", "reference", "setup", "rounds", "write", "exit")
PACKAGE = ("horovodrun_np1", "horovodrun_np2", "simulator_m2")
BASELINES = ("scipy_lbfgsb", "sklearn_lbfgs")
BARE = {"bare_python": "import torch, horovod.torch",
        "bare_horovodrun": "import torch, horovod.torch as h; h.init()"}
MEASURED = {
    "launcher": "command start (time.time() in the benchmark) to rank 0's process start (/proc start tick against "
                "CLOCK_BOOTTIME, `dane.loop.timeline.process_start`; 10 ms ticks)",
    "imports": "rank 0's process start to its `config` mark (interpreter, imports, Hydra)",
    "data": "`config` to `data` (the file read, the shard built)",
    "reference": "`data` to `reference` (0: the timed runs ask for no optimum; O* is made untimed beforehand)",
    "setup": "`data` (or `reference`) to `round0` (the algorithm built, the run directory opened)",
    "rounds": "`round0` to `end` (rank 0's marks, on its clock)",
    "write": "`end` to summary.json's modification time (the answer on disk)",
    "exit": "summary.json's mtime to the command's return (time.time() in the benchmark)",
    "baselines": "the same clock: command start, the process's start tick, its own marks (imports, data, fit, "
                 "as time.time()), result.json's mtime, the return; fit_s is perf_counter around the fit alone",
    "parts_sum": "the parts telescope: they add up to total_s (and all but exit to answer_s) to the marks' "
                 "4-decimal rounding",
}


# ---------------------------------------------------------------------- arithmetic
def gap(objective: float, optimum: float) -> float:
    """The relative suboptimality (O(w) - O*) / |O*|."""
    return (objective - optimum) / abs(optimum)


def telescoped(t_cmd: float, ends: dict[str, float], t_answer: float, t_exit: float) -> dict:
    """A launch's parts between consecutive marks on one clock: the command's start, ``ends`` (each ends its part),
    the answer's mtime (``write``), the return (``exit``); they add up to ``total_s`` (but ``exit``: ``answer_s``)."""
    marks = [t_cmd, *ends.values(), t_answer, t_exit]
    return {"parts": dict(zip([*ends, "write", "exit"], (b - a for a, b in zip(marks, marks[1:])))),
            "answer_s": t_answer - t_cmd, "total_s": t_exit - t_cmd}


def package_parts(t_cmd: float, t_exit: float, t_answer: float, timeline: dict) -> dict:
    """A launch's `PARTS` from its command's start and return, summary.json's mtime and rank 0's marks."""
    origin = timeline["clock_origin"]
    wall = {k: origin + v for k, v in timeline.items() if k not in ("clock_origin", "process_start")}
    start = origin + (timeline.get("process_start") or 0.0)
    return telescoped(t_cmd, {"launcher": start, "imports": wall["config"], "data": wall["data"],
                              "reference": wall.get("reference", wall["data"]), "setup": wall["round0"],
                              "rounds": wall["end"]}, t_answer, t_exit)


def summarize(runs: list[dict]) -> dict:
    """A launched variant's runs and the spreads of the ones that did not fail: times, parts, what they reached."""
    ok = [r for r in runs if r.get("status") != "launch_failed"]
    if not ok:
        return {"runs": runs, "launches_failed": len(runs)}
    reached = [k for k in ("rel_suboptimality", "fit_s", "time_s", "rounds", "allreduces") if k in ok[0]]
    return {"runs": runs, "launches_failed": len(runs) - len(ok), **spreads(ok, ("answer_s", "total_s")),
            "parts": spreads([r["parts"] for r in ok], list(ok[0]["parts"])), **spreads(ok, reached),
            "all_reached_target": all(r["rel_suboptimality"] <= TARGET for r in ok if "rel_suboptimality" in r)}


def goals(variants: dict) -> dict:
    """np2's answer over the bare horovodrun line, and np2's rounds over L-BFGS-B's fit (medians)."""
    def median(name: str, *path: str):
        value = variants.get(name)
        for key in (*path, "median"):
            value = (value or {}).get(key)
        return value

    np2, bare = median("horovodrun_np2", "answer_s"), median("bare_horovodrun", "total_s")
    rounds, lbfgs = median("horovodrun_np2", "parts", "rounds"), median("scipy_lbfgsb", "fit_s")
    over = None if np2 is None or bare is None else np2 - bare
    ratio = None if rounds is None or lbfgs is None else rounds / lbfgs
    return {"launch_over_bare_horovodrun": {"np2_answer_s": np2, "bare_s": bare, "over_s": over,
                                            "goal_s": LAUNCH_GOAL_S,
                                            "goal_met": None if over is None else over <= LAUNCH_GOAL_S},
            "rounds_over_lbfgs_fit": {"np2_rounds_s": rounds, "lbfgs_fit_s": lbfgs, "ratio": ratio, "goal": 1.0,
                                      "goal_met": None if ratio is None else ratio <= 1.0}}


# ---------------------------------------------------------------------- problems
def problems(tmp: Path, data_dir: Path, quick: bool) -> list[dict]:
    """Each problem: its overrides and how a baseline reads it, or why it is skipped."""
    from dane.synthetic.sparse_data import write_sparse_libsvm

    where = data_dir / "mnist"
    no_mnist = not all((where / f).exists() for f in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"))
    why = f"the MNIST t10k files are not in {where}" if no_mnist else "--quick" if quick else None
    softmax = {"name": "mnist_softmax", "skipped": why} if why else mnist(tmp, data_dir)
    if quick:
        return [dense(tmp, rows=600, cols=5, name="tiny_dense_logreg"), softmax]
    svm = write_sparse_libsvm(tmp / "rcv1_like.svm", 10_000, 20_000, seed=0)
    rcv1 = logreg("rcv1_like_logreg", "rcv1-like sparse, 10,000 x 20,000 (synthetic.sparse_data, seed 0), LIBSVM file",
                  ["data=libsvm", f"data.path={svm}", "data.n_features=20000"],
                  {"kind": "svmlight", "path": str(svm), "n_features": 20000}, fit_intercept=False)
    return [rcv1, softmax, dense(tmp, rows=20_000, cols=50, name="dense_logreg")]


def logreg(name: str, data: str, overrides: list[str], read: dict, *, fit_intercept: bool) -> dict:
    """Logistic regression at λ = 1e-4 on the data that ``overrides`` name and ``read`` reads."""
    return {"name": name, "loss": "logistic", "lam": 1e-4, "fit_intercept": fit_intercept, "classes": 1, "data": data,
            "overrides": ["problem=logreg", *overrides, "problem.lam=1e-4",
                          f"problem.fit_intercept={str(fit_intercept).lower()}"],
            "read": {**read, "loss": "logistic"}}


def dense(tmp: Path, *, rows: int, cols: int, name: str) -> dict:
    """Dense logistic regression, column scales 10^-1..10^1, labels from a noisy linear concept, seeded."""
    import numpy as np
    from dane.data.npz_source import save_npz

    rng = np.random.default_rng(0)
    X = rng.standard_normal((rows, cols)) * np.logspace(-1, 1, cols)
    margin = X @ (rng.standard_normal(cols) / np.logspace(-1, 1, cols)) / np.sqrt(cols)
    y = np.where(rng.random(rows) < 1 / (1 + np.exp(-2 * margin)), 1.0, 0.0)
    path = save_npz(tmp / f"{name}.npz", X, y)
    return logreg(name, f"dense {rows} x {cols}, columns scaled 10^-1..10^1, labels 0/1 (seed 0), .npz",
                  ["data=npz", f"data.path={path}"], {"kind": "npz", "path": str(path)}, fit_intercept=True)


def mnist(tmp: Path, data_dir: Path) -> dict:
    """The package's MNIST rows (its seeded stratified t10k split), their indices saved for the baseline's reader."""
    import numpy as np
    from sklearn.model_selection import train_test_split
    from dane.data.builtin_source import BuiltinSource
    from dane.data.mnist import LABELS_MAGIC, read_idx

    labels = read_idx(data_dir / "mnist" / "t10k-labels-idx1-ubyte.gz", magic=LABELS_MAGIC)
    rows, *_ = train_test_split(np.arange(len(labels)), test_size=0.2, random_state=0, stratify=labels)
    np.save(tmp / "mnist_rows.npy", rows)
    read = {"kind": "mnist", "folder": str(data_dir / "mnist"), "rows": str(tmp / "mnist_rows.npy"),
            "loss": "softmax"}
    if not np.array_equal(read_rows(read, fit_intercept=False)[0],
                          BuiltinSource(dataset="mnist", data_dir=str(data_dir)).load().X):
        raise RuntimeError("the baseline's MNIST rows differ from the package's; fix read_rows")
    return {"name": "mnist_softmax", "loss": "softmax", "lam": 1e-3, "fit_intercept": True, "classes": 10,
            "data": f"MNIST t10k split, {len(rows)} training rows x 784 pixels in [0, 1] (conf/problem/softmax.yaml)",
            "overrides": ["problem=softmax", "data=mnist", f"data_dir={data_dir}"], "read": read}


# ---------------------------------------------------------------------- untimed: O*, the method, the tolerances
def first_stop(ratios: list[float], good: list[bool]) -> float | None:
    """A threshold t that stops the sequence ``ratios`` (first i with ratios[i] <= t) at an i where ``good[i]``:
    the geometric mean of that ratio and the smallest one before it; None if no such i."""
    low = float("inf")
    for value, ok in zip(ratios, good):
        if value < low and ok:
            return (value * low) ** 0.5 if low != float("inf") else value * 1.01
        low = min(low, value)
    return None


def pick_method(problem: dict, tmp: Path, rounds: int) -> dict:
    """GIANT and DiSCO at their defaults in the simulator (m=2) with O*: the one with fewer allreduces to `TARGET`,
    and the gradient-norm tol that stops it there."""
    tried = {}
    for method in ("giant", "disco"):
        t = trained(tmp / f"pick_{problem['name']}_{method}",
                    [*problem["overrides"], f"algorithm={method}", "workers=2", "problem.optimum=auto", "tol=1e-12",
                     f"rounds={rounds}", "quiet=true"], env={"DANE_CACHE_DIR": str(tmp / f"cache_{problem['name']}")},
                    np=None, timeout=1800)
        if t["summary"] is None:
            tried[method] = {"status": "failed"}
            continue
        s, records = t["summary"], t["records"]
        optimum = s["final_objective"] - s["final_suboptimality"]
        rel = relative(records, optimum)
        hit = first_at(rel, TARGET)
        at = {} if hit is None else records[hit]
        tried[method] = {"status": s["status"], "optimum": optimum, "rounds_to_target": hit,
                         "allreduces_to_target": at.get("comm_rounds"), "rounds_time_to_target_s": at.get("time_s"),
                         "tol": first_stop([r["grad_norm"] / records[0]["grad_norm"] for r in records],
                                           [v <= TARGET for v in rel])}
    reached = [m for m, t in tried.items() if t.get("allreduces_to_target") is not None and t["tol"] is not None]
    if not reached:
        return {"tried": tried, "method": None}
    method = min(reached, key=lambda m: (tried[m]["allreduces_to_target"], tried[m]["rounds_time_to_target_s"]))
    return {"tried": tried, "method": method, "optimum": tried[method]["optimum"], "tol": tried[method]["tol"],
            "why": "fewer allreduces to 1e-8 relative suboptimality at m=2 (simulator; ties: less round time); "
                   "a DiSCO round is a whole distributed PCG, so rounds do not compare"}


def calibrate_baselines(problem: dict, optimum: float, cache: Path) -> dict:
    """L-BFGS-B's gtol (largest that stops it at TARGET), scikit-learn's tol (the same, /10 until it reaches),
    and the baselines' objective evaluated at the package's cached optimum."""
    import numpy as np
    import torch

    X, y = read_rows(problem["read"], problem["fit_intercept"])
    args, classes = (problem["lam"], problem["loss"]), problem["classes"]
    trace = [value_grad(np.zeros(X.shape[1] * classes), X, y, *args)]

    def stopping_gtol() -> float | None:  # the largest gradient tolerance that stops the trace at TARGET, if any
        return first_stop([float(np.max(np.abs(g))) for _, g in trace],
                          [gap(f, optimum) <= TARGET for f, _ in trace])

    def record(intermediate_result):
        trace.append(value_grad(intermediate_result.x, X, y, *args))
        if stopping_gtol() is not None:
            raise StopIteration

    fit("scipy_lbfgsb", X, y, *args, 1e-14, classes, callback=record)
    gtol = tol = stopping_gtol()
    tries = []
    for _ in range(6):
        w, _ = fit("sklearn_lbfgs", X, y, *args, tol, classes)
        tries.append({"tol": tol, "rel_suboptimality": gap(value_grad(w, X, y, *args)[0], optimum)})
        if tries[-1]["rel_suboptimality"] <= TARGET:
            break
        tol /= 10
    check = None
    if saved := sorted(cache.glob("optimum/*.pt")):
        at_optimum = value_grad(torch.load(saved[0])["w"].numpy(), X, y, *args)[0]
        check = {"baseline_objective_at_package_optimum": at_optimum, "package_optimum": optimum,
                 "rel_difference": abs(at_optimum - optimum) / abs(optimum)}
    return {"scipy_gtol": gtol, "scipy_ftol": 0.0, "sklearn_tol": tol, "sklearn_tries": tries,
            "sklearn_C": 1.0 / (X.shape[0] * problem["lam"]), "objective_check": check}


# ---------------------------------------------------------------------- timed launches
def timed(variant: str, problem: dict, chosen: dict, calib: dict, out: Path) -> dict:
    """One launch of ``variant``: its parts and what it reached, or ``status: launch_failed`` and the error."""
    from dane.synthetic.launchers import venv_bin

    if variant in BARE:
        cmd = [sys.executable, "-c", BARE[variant]]
        t = launch(cmd if variant == "bare_python" else [venv_bin("horovodrun"), "-np", "2", "--gloo", *cmd])
        return {"status": "launch_failed", "error": t["error"]} if "error" in t else {"total_s": t["end"] - t["start"]}
    if variant in BASELINES:
        spec = {"solver": variant, "read": problem["read"], "fit_intercept": problem["fit_intercept"],
                "lam": problem["lam"], "classes": problem["classes"], "out": str(out / "result.json"),
                "tol": calib["scipy_gtol" if variant == "scipy_lbfgsb" else "sklearn_tol"]}
        out.mkdir(parents=True)
        (out / "spec.json").write_text(json.dumps(spec))
        t = launch([sys.executable, "-m", "dane.synthetic.lbfgs_baseline", str(out / "spec.json")],
                   answer=out / "result.json")
        if "error" in t:
            return {"status": "launch_failed", "error": t["error"]}
        result = json.loads((out / "result.json").read_text())
        ends = {"launcher": result["process_start"] or t["start"], **result["marks"]}  # marks: imports, data, fit
        return {**telescoped(t["start"], ends, t["answer"], t["end"]), "fit_s": result["fit_s"],
                "iterations": result["iterations"], "rel_suboptimality": gap(result["objective"], chosen["optimum"])}
    np_ = {"horovodrun_np1": 1, "horovodrun_np2": 2}.get(variant)
    t = trained(out, [*problem["overrides"], f"algorithm={chosen['method']}", f"tol={chosen['tol']:.6g}", "rounds=200",
                      "quiet=true", *([] if np_ else ["workers=2"])], np=np_, timeout=1800)
    if "error" in t:
        return {"status": "launch_failed", "error": t["error"]}
    s = t["summary"]
    return {**package_parts(t["start"], t["end"], t["answer"], s["timeline"]), "status": s["status"],
            "rounds": s["rounds"], "allreduces": s["comm_rounds"], "time_s": s["time_s"],
            "rel_suboptimality": gap(s["final_objective"], chosen["optimum"])}


def variants_here(horovod: bool) -> list[str]:
    """The variants a problem times: without Horovod none that imports it (both bare lines, the horovodrun ones)."""
    return [v for v in [*BARE, *PACKAGE, *BASELINES] if horovod or (v not in BARE and "horovod" not in v)]


def bench_problem(problem: dict, tmp: Path, repeats: int, quick: bool) -> dict:
    """One problem: the untimed choices, then every variant ``repeats`` times, taking turns, and the goals."""
    from dane.synthetic.launchers import have_horovod

    if "skipped" in problem:
        print(f"bench_wallclock: {problem['name']} skipped: {problem['skipped']}", flush=True)
        return {"skipped": problem["skipped"]}
    result = {"data": problem["data"], "overrides": problem["overrides"], "load_avg_start": load()}
    chosen = result["method"] = pick_method(problem, tmp, rounds=30 if quick else 60)
    if chosen["method"] is None:
        return {**result, "skipped": "neither GIANT nor DiSCO reached 1e-8 relative suboptimality"}
    calib = result["baselines"] = calibrate_baselines(problem, chosen["optimum"], tmp / f"cache_{problem['name']}")
    variants = variants_here(have_horovod())
    if not have_horovod():
        result["horovod"] = "not importable here: the horovodrun variants and both bare lines are left out"

    def measure(variant: str, repeat: int) -> dict:
        run = {"repeat": repeat, "load_before": load(),
               **timed(variant, problem, chosen, calib, tmp / f"{problem['name']}_{variant}_{repeat}")}
        answer = run.get("answer_s", run.get("total_s", 0))
        what = f"failed: {run['error']}" if "error" in run else f"answer {answer:.2f} s"
        print(f"{problem['name']} {variant} repeat {repeat}: {what}, load {run['load_before']}", flush=True)
        return run

    runs = interleave(variants, repeats, measure, rotate=True)
    result["variants"] = {v: {"runs": rs, "total_s": spread([r.get("total_s") for r in rs])} if v in BARE else
                          summarize(rs) for v, rs in runs.items()}
    return {**result, "goals": goals(result["variants"]), "load_avg_end": load()}


def run(bench: Run) -> dict:
    args = bench.args
    repeats = 1 if args.quick else args.repeats
    result = {"machine": bench.machine, "repeats": repeats, "quick": args.quick, "target_rel_suboptimality": TARGET,
              "how_measured": MEASURED, "problems": {}}
    with tempfile.TemporaryDirectory(prefix="bench_wallclock_") as tmp:
        for problem in problems(Path(tmp), (args.data_dir or mnist_dir().parent).resolve(), args.quick):
            result["problems"][problem["name"]] = bench_problem(problem, Path(tmp), repeats, args.quick)
            bench.save(result)  # each problem as it is done: a long run is not lost to a crash
    bench.log(f"{KEY} -> {args.out}")
    return bench.finish(result)


BENCH = Bench(KEY, run, "launch-to-answer wall time against scipy and scikit-learn in one process", threads=None,
              options=(option("--repeats", type=count, default=3),
                       option("--data-dir", type=folder, help="the folder holding mnist/ (default: DANE_DATA_DIR, "
                              "else ../shared/data)")))
