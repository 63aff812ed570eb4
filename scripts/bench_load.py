"""Load: the simulator at many workers, and horovodrun oversubscribed; JSON under ``load`` in results/bench.json."""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path

from dane.records.results import read_rounds, read_summary
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
        if args.np:
            report["oversubscribed"] = oversubscribed(Path(tmp), args.np, args.rounds, args.timeout)
    report["finished_at"] = now()
    bench.finish(report)
    print(f"load -> {path}")


BENCH = Bench(KEY, run, "the simulator at large m and oversubscribed horovodrun", threads=None, options=(
    option("--workers", type=int, nargs="+", default=[64, 256, 1024]),
    option("--np", type=int, nargs="*", default=[4, 8], help="oversubscribed's k (none: skip it)"),
    option("--rounds", type=int, default=10), option("--memory-gib", type=float, default=24.0),
    option("--timeout", type=float, default=900, help="seconds per launch")))
