"""Load: the simulator at many workers, and horovodrun oversubscribed; JSON under ``load`` in results/bench.json.

    PYTHONPATH=. python scripts/bench_load.py [--out results/bench.json] [--workers 64 256 1024] [--np 4 8]

- ``simulator``: ``python -m experiments.train workers=m`` (DANE, ``ridge_synthetic`` with
  its defaults, N=18000 and d=500, ``--rounds`` rounds, no tolerance) for each m: the
  launch's wall time, the run's setup time, its median simulated time per round
  (``round_s``, from rounds.jsonl) and its real wall time (``wall_time_s``), and the
  process's peak resident memory (the kernel's ``ru_maxrss`` of
  that child).  ``largest_m_within`` fits peak memory = a + b m by least squares over the
  points and solves for the memory given (default 24 GiB, this machine's): an
  extrapolation, labelled as one.
- ``oversubscribed``: ``horovodrun -np k --gloo`` of the same run for each k, on however
  many cores this machine has (2 here): whether it finished, its exit status, the median
  wall time per round (``round_s``, rounds 2..R of rounds.jsonl), the launch's wall time.

Each point sits beside the load average it was taken under.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dane.results import read_rounds, read_summary  # noqa: E402
from synthetic.bench_file import merge_section  # noqa: E402
from synthetic.launchers import REPO, _env, venv_bin  # noqa: E402

KEY = "load"
RUN = ("algorithm=dane", "problem=ridge_synthetic", "tol=null", "quiet=true")
GIB = 2 ** 30


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def launch(cmd: list[str], out: Path, timeout: float) -> dict:
    """Run ``cmd``; its exit status, wall time and peak memory (ru_maxrss of the child, or of the launcher's
    largest descendant under horovodrun: the kernel keeps the largest of the waited-for tree)."""
    before, start = load(), time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env=_env({}), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = start + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            proc.kill()
            pid, status, usage = os.wait4(proc.pid, 0)
            break
        time.sleep(0.2)
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    stderr = proc.stderr.read() if proc.stderr else ""
    result = {"exit_status": code, "finished": code == 0, "timed_out": wall > timeout, "wall_s": wall,
              "peak_rss_gib": usage.ru_maxrss * 1024 / GIB, "load_before": before, "load_after": load()}
    if code != 0:
        result["stderr_tail"] = stderr.strip().splitlines()[-5:]
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


def simulator(tmp: Path, workers: list[int], rounds: int, timeout: float) -> dict:
    points = {}
    for m in workers:
        out = tmp / f"sim_m{m}"
        cmd = [sys.executable, "-m", "experiments.train", *RUN, f"workers={m}", f"rounds={rounds}", f"out_dir={out}"]
        points[str(m)] = launch(cmd, out, timeout)
        if "simulated_time_s" in points[str(m)]:
            points[str(m)]["simulated_round_s"] = points[str(m)]["simulated_time_s"] / rounds
        print(f"simulator m={m}: {points[str(m)]}", flush=True)
    return {"problem": " ".join(RUN) + f" rounds={rounds}", "points": points}


def largest_m(points: dict, memory_gib: float) -> dict:
    """Least squares of peak memory = a + b m over the finished points; the m where it reaches ``memory_gib``."""
    pairs = [(int(m), p["peak_rss_gib"]) for m, p in points.items() if p.get("finished")]
    if len(pairs) < 2:
        return {"m": None, "why": "fewer than two finished points"}
    ms, mem = zip(*pairs)
    mean_m, mean_mem = statistics.fmean(ms), statistics.fmean(mem)
    slope = sum((m - mean_m) * (y - mean_mem) for m, y in pairs) / sum((m - mean_m) ** 2 for m in ms)
    base = mean_mem - slope * mean_m
    return {"memory_gib": memory_gib, "m": int((memory_gib - base) / slope) if slope > 0 else None,
            "gib_per_worker": slope, "base_gib": base, "from_points": list(ms),
            "how": "extrapolated: least squares of peak memory = a + b m over the measured points"}


def oversubscribed(tmp: Path, nps: list[int], rounds: int, timeout: float) -> dict:
    points = {}
    for k in nps:
        out = tmp / f"hvd_np{k}"
        cmd = [venv_bin("horovodrun"), "-np", str(k), "--gloo", sys.executable, "-m", "experiments.train", *RUN,
               f"workers={k}", f"rounds={rounds}", f"out_dir={out}"]
        points[str(k)] = launch(cmd, out, timeout)
        print(f"horovodrun -np {k}: {points[str(k)]}", flush=True)
    return {"problem": " ".join(RUN) + f" rounds={rounds}", "cores": os.cpu_count(), "points": points}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/bench.json")
    parser.add_argument("--workers", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--np", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--memory-gib", type=float, default=24.0)
    parser.add_argument("--timeout", type=float, default=900, help="seconds per launch")
    args = parser.parse_args(argv)
    path = Path(args.out)
    report = {"started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cores": os.cpu_count(), "load_at_start": load()}
    with tempfile.TemporaryDirectory() as tmp:
        report["simulator"] = simulator(Path(tmp), args.workers, args.rounds, args.timeout)
        report["simulator"]["largest_m_within"] = largest_m(report["simulator"]["points"], args.memory_gib)
        merge_section(path, KEY, report)  # now, so a later failure loses nothing
        report["oversubscribed"] = oversubscribed(Path(tmp), args.np, args.rounds, args.timeout)
    report["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    merge_section(path, KEY, report)
    print(f"load -> {path}")


if __name__ == "__main__":
    main()
