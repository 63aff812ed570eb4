"""Load: the simulator at many workers, and horovodrun oversubscribed; JSON under ``load`` in results/bench.json."""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path

from dane.records.results import read_rounds, read_summary
from dane.problems import RidgeSyntheticConfig
from dane.synthetic.launchers import venv_bin
from scripts.harness import Bench, Run, launch, load, now, option

KEY = "load"
RUN = ("algorithm=dane", "problem=ridge_synthetic", "tol=null", "quiet=true")


def timed(cmd: list[str], out: Path, timeout: float) -> dict:
    """`harness.launch` of ``cmd`` (its exit status, wall time, peak memory, the load around it) and the run's rounds:
    their count, the median round after round 1 (round 1 factors), the summary's times."""
    t = launch(cmd, env={}, timeout=timeout)
    result = {"exit_status": t["exit_status"], "finished": t["exit_status"] == 0,
              **{k: t[k] for k in ("timed_out", "wall_s", "peak_rss_gib", "load_before", "load_after")}}
    if "error" in t:
        result["stderr_tail"] = t["error"].splitlines()[-5:]
    if (out / "rounds.jsonl").exists():
        times = [r["time_s"] for r in read_rounds(out)]
        steps = [b - a for a, b in zip(times[1:], times[2:])] or [b - a for a, b in zip(times, times[1:])]
        result["rounds"] = len(times) - 1
        result["round_s"] = statistics.median(steps) if steps else None
    if (out / "summary.json").exists():
        summary = read_summary(out)
        result.update({k: summary[k] for k in ("status", "setup_s", "time_s", "simulated_time_s", "wall_time_s")
                       if k in summary})
    return result


def train(*overrides: str, out: Path) -> list[str]:
    return [sys.executable, "-m", "dane.experiments.train", *RUN, *overrides, f"out_dir={out}"]


def points(tmp: Path, label: str, ks: list[int], command, timeout: float) -> dict:
    """`timed` launches of ``command(k, out)``, one per k (in the folder ``label`` k), by ``str(k)``."""
    out = {}
    for k in ks:
        out[str(k)] = timed(command(k, tmp / f"{label}{k}"), tmp / f"{label}{k}", timeout)
        print(f"{label}{k}: {out[str(k)]}", flush=True)
    return out


def simulator(tmp: Path, workers: list[int], rounds: int, timeout: float) -> dict:
    runs = points(tmp, "sim_m", workers, lambda m, out: train(f"workers={m}", f"rounds={rounds}", out=out), timeout)
    for run in runs.values():
        if "simulated_time_s" in run:
            run["simulated_round_s"] = run["simulated_time_s"] / rounds
    return {"problem": " ".join(RUN) + f" rounds={rounds}", "points": runs}


FEDERATED_N, FEDERATED_DIM = 100_000, 500


def federated_scale(tmp: Path, workers: list[int], rounds: int, timeout: float, repeats: int,
                    repeat_below: int) -> dict:
    """Time per round and peak memory of the simulator against m on one problem of N = 100,000 rows (module docstring)."""
    config = RidgeSyntheticConfig(n_samples=FEDERATED_N, dim=FEDERATED_DIM)
    config.prepare()  # the reference optimum, once, off the clock (then from its disk cache)
    problem = (f"problem.n_samples={FEDERATED_N}", f"problem.dim={FEDERATED_DIM}")
    points = {}
    for m in workers:
        runs = []
        for k in range(repeats if m <= repeat_below else 1):
            out = tmp / f"federated_m{m}_{k}"
            run = timed(train(*problem, f"workers={m}", f"rounds={rounds}", out=out), out, timeout)
            if "wall_time_s" in run and run.get("rounds"):
                run["wall_round_s"] = run["wall_time_s"] / run["rounds"]
                run["outside_rounds_s"] = run["wall_s"] - run["wall_time_s"]  # imports, shards, exit
            runs.append(run)
            print(f"federated_scale m={m} #{k}: {run}", flush=True)
        points[str(m)] = {"rows_per_worker": FEDERATED_N // m,
                          "local_solve": "woodbury" if config.low_rank(m) else "cholesky",
                          **spread(runs), "runs": runs}
    return {"problem": " ".join((*RUN, *problem)) + f" rounds={rounds}", "n_samples": FEDERATED_N,
            "dim": FEDERATED_DIM, "rounds": rounds, "points": points}


def spread(runs: list[dict]) -> dict:
    """Median, min and max over the finished repeats of each timing, the largest peak memory, and the load averages."""
    done = [r for r in runs if r.get("finished")]
    out: dict = {"finished": len(done) == len(runs), "repeats": len(runs),
                 "load_1min": [r["load_before"][0] for r in runs]}
    if done:
        out["peak_rss_gib"] = max(r["peak_rss_gib"] for r in done)
    for key in ("wall_round_s", "wall_s", "outside_rounds_s", "round_s", "setup_s"):
        values = [r[key] for r in done if r.get(key) is not None]
        if values:
            out.update({key: statistics.median(values), f"{key}_min": min(values), f"{key}_max": max(values)})
    return out


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


def oversubscribed(tmp: Path, nps: list[int], rounds: int, timeout: float) -> dict:
    def command(k: int, out: Path) -> list[str]:
        return [venv_bin("horovodrun"), "-np", str(k), "--gloo", *train(f"workers={k}", f"rounds={rounds}", out=out)]

    return {"problem": " ".join(RUN) + f" rounds={rounds}", "cores": os.cpu_count(),
            "points": points(tmp, "hvd_np", nps, command, timeout)}


def run(bench: Run) -> None:
    args, path = bench.args, bench.path
    report = {"started_at": bench.started_at, "cores": os.cpu_count(), "load_at_start": load(),
              "machine": bench.machine}
    with tempfile.TemporaryDirectory() as tmp:
        report["simulator"] = simulator(Path(tmp), args.workers, args.rounds, args.timeout)
        report["simulator"]["largest_m_within"] = largest_m(report["simulator"]["points"], args.memory_gib)
        bench.save(report)  # now, so a later failure loses nothing
        if args.federated_workers:
            report["federated_scale"] = federated_scale(Path(tmp), args.federated_workers, args.rounds, args.timeout,
                                                        args.repeats, args.federated_repeat_below)
            bench.save(report)
        if args.np:
            report["oversubscribed"] = oversubscribed(Path(tmp), args.np, args.rounds, args.timeout)
    report["finished_at"] = now()
    bench.finish(report)
    print(f"load -> {path}")


BENCH = Bench(KEY, run, "the simulator at large m, federated_scale, and oversubscribed horovodrun", threads=None, options=(
    option("--workers", type=int, nargs="+", default=[64, 256, 1024]),
    option("--np", type=int, nargs="*", default=[4, 8], help="oversubscribed's k (none: skip it)"),
    option("--rounds", type=int, default=10), option("--memory-gib", type=float, default=24.0),
    option("--timeout", type=float, default=900, help="seconds per launch"),
    option("--federated-workers", type=int, nargs="*", default=[64, 256, 1024, 4096, 10000],
           help="federated_scale's m (none: skip it)"),
    option("--repeats", type=int, default=3, help="federated_scale: launches per point up to ..."),
    option("--federated-repeat-below", type=int, default=1024, help="... this many workers (then one)")))
