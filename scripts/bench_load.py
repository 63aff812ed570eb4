"""The simulator at many workers and horovodrun oversubscribed: JSON section ``load``, parts ``simulator``,
``sampled`` (FedDANE, 1% of the clients a round) and ``oversubscribed``, one point a launch; docs/benchmarks.md,
section `load`."""
from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path

from scripts.harness import Bench, Run, amount, count, load, now, option, steady, trained

RUN = ("algorithm=dane", "problem=ridge_synthetic", "tol=null", "quiet=true")
SUMMARY = ("status", "setup_s", "time_s", "simulated_time_s", "wall_time_s")


def sampled(k: int) -> tuple[str, ...]:
    """FedDANE's run at k clients: 20 rows of d = 50 each, k/100 a round, μ null (measured before round 0)."""
    return ("algorithm=feddane", "problem=ridge_synthetic", "problem.dim=50", f"problem.n_samples={20 * k}",
            f"algorithm.clients_per_round={max(k // 100, 1)}", "tol=null", "quiet=true")


def points(tmp: Path, label: str, ks: list[int], rounds: int, timeout: float, launched: bool, job=None) -> dict:
    """One launch per k of ``ks`` (``workers=k``; ``launched``: under ``horovodrun -np k``) of ``job(k)`` (`RUN`
    where None), by ``str(k)``: how it ended, its peak memory, rounds and median round after round 1."""
    out = {}
    for k in ks:
        t = trained(tmp / f"{label}{k}", (*(job(k) if job else RUN), f"workers={k}", f"rounds={rounds}"),
                    np=k if launched else None, env={}, timeout=timeout)
        times = [r["time_s"] for r in t["records"]]
        steps = steady(t["records"]) or steady(t["records"], 0)  # too few rounds: from round 0
        point = {"exit_status": t["exit_status"], "finished": t["exit_status"] == 0,
                 **{key: t[key] for key in ("timed_out", "wall_s", "peak_rss_gib", "load_before", "load_after")},
                 **({"stderr_tail": t["error"].splitlines()[-5:]} if "error" in t else {}),
                 **({"rounds": len(times) - 1, "round_s": statistics.median(steps) if steps else None}
                    if times else {}),
                 **{key: t["summary"][key] for key in SUMMARY if key in (t["summary"] or {})}}
        if not launched and "simulated_time_s" in point:
            point["simulated_round_s"] = point["simulated_time_s"] / rounds
        out[str(k)] = point
        print(f"{label}{k}: {point}", flush=True)
    problem = " ".join(RUN) if job is None else f"{' '.join(job(ks[0]))} at m = {ks[0]}, scaled with m (`sampled`)"
    return {"problem": f"{problem} rounds={rounds}", **({"cores": os.cpu_count()} if launched else {}), "points": out}


def largest_m(points: dict, memory_gib: float) -> dict:
    """Least squares of peak memory = a + b m over the finished points; the m where it reaches ``memory_gib``."""
    pairs = [(int(m), p["peak_rss_gib"]) for m, p in points.items() if p.get("finished")]
    if len(pairs) < 2:
        return {"m": None, "why": "fewer than two finished points"}
    ms, mem = zip(*pairs)
    slope, base = statistics.linear_regression(ms, mem)
    return {"memory_gib": memory_gib, "m": int((memory_gib - base) / slope) if slope > 0 else None,
            "gib_per_worker": slope, "base_gib": base, "from_points": list(ms),
            "how": "extrapolated: least squares of peak memory = a + b m over the measured points"}


def run(bench: Run) -> None:
    args = bench.args
    if args.quick:  # two small points of each: a smoke run on a shared machine
        args.workers, args.np, args.rounds, args.sampled_workers = [8, 16], [2, 3], 3, [100, 200]
    report = {"started_at": bench.started_at, "cores": os.cpu_count(), "load_at_start": load(),
              "machine": bench.machine}
    parts = {"simulator": ("sim_m", args.workers, None), "sampled": ("sampled_m", args.sampled_workers, sampled),
             "oversubscribed": ("hvd_np", args.np, None)}  # part -> launch label, its ks, its job
    with tempfile.TemporaryDirectory() as tmp:
        for part, (label, ks, job) in parts.items():
            if ks:  # each saved as it ends: a later failure loses nothing
                launched = part == "oversubscribed"
                report[part] = points(Path(tmp), label, ks, args.rounds, args.timeout, launched, job)
                if not launched:
                    report[part]["largest_m_within"] = largest_m(report[part]["points"], args.memory_gib)
                bench.save(report)
    bench.finish({**report, "finished_at": now()})
    print(f"load -> {bench.path}")


BENCH = Bench("load", run, "the simulator at large m and oversubscribed horovodrun", threads=None, options=(
    option("--workers", type=count, nargs="+", default=[64, 256, 1024]),
    option("--np", type=count, nargs="*", default=[4, 8], help="oversubscribed's k (none: skip it)"),
    option("--sampled-workers", type=count, nargs="*", default=[1000, 2000, 4000],
           help="sampled's m, FedDANE at 1%% a round (none: skip it)"),
    option("--rounds", type=count, default=10), option("--memory-gib", type=amount, default=24.0),
    option("--timeout", type=amount, default=900, help="seconds per launch")))
