"""Figure (a), the source paper's layout: time to suboptimality 1e-8 against the number of workers.

Safeguarded DANE on the isotropic synthetic ridge (d=500, λ=0.005), one curve per N,
each with its ideal T(1)/m line (log-log).  Time is the simulator's parallel time,
counting each worker's setup (its local Hessian X_iᵀX_i, which is the work that
parallelizes over m) plus the rounds' compute and the α-β allreduce cost.

    python -m paper_figs.speedup [--results results] [--out paper_figs]
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import matplotlib.pyplot as plt

from paper_figs.common import FIG_DIR, M_GRID, N_GRID, locate, positive, save, time_to
from synthetic.sweep import Job, RunIndex, grid

TOL = 1e-8
BASE = ("algorithm=dane", "algorithm.safeguard=true", "algorithm.mu=0.0", "problem.covariance=iso")


def job(n: int, m: int) -> Job:
    return (*BASE, f"problem.n_samples={n}", f"workers={m}")


def jobs(ns=N_GRID, ms=M_GRID) -> list[Job]:
    return [job(n, m) for n in ns for m in ms]


def table(index: RunIndex, ns=N_GRID, ms=M_GRID) -> dict[int, list[float]]:
    """{N: [time to 1e-8 at each m]} in seconds (nan where 1e-8 was not reached)."""
    runs = locate(index, jobs(ns, ms))
    return {n: [time_to(runs[job(n, m)], TOL) for m in ms] for n in ns}


def draw(times: dict[int, list[float]], ms=M_GRID):
    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    for k, (n, row) in enumerate(sorted(times.items())):
        color = f"C{k}"
        ax.plot(ms, positive(row), "o-", color=color, label=f"N = {n}")
        if math.isfinite(row[0]):
            ax.plot(ms, [row[0] / m for m in ms], ":", color=color, linewidth=1)
    ax.plot([], [], "k:", linewidth=1, label="ideal T(1)/m")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ms, [str(m) for m in ms])
    ax.set_xlabel("workers m")
    ax.set_ylabel(f"simulated time to suboptimality {TOL:g} (s)")
    ax.set_title("Safeguarded DANE, synthetic ridge (d=500)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def markdown(times: dict[int, list[float]], ms=M_GRID) -> str:
    head = "| N \\ m | " + " | ".join(str(m) for m in ms) + " |\n" + "|---" * (len(ms) + 1) + "|\n"
    rows = "".join(f"| {n} | " + " | ".join("not reached" if math.isnan(t) else f"{t:.4f}" for t in row) + " |\n"
                   for n, row in sorted(times.items()))
    return (f"Simulated time (s) to suboptimality {TOL:g}, safeguarded DANE, incl. setup\n\n" + head + rows)


def main(results: str | Path = "results", out: str | Path = FIG_DIR) -> list[Path]:
    times = table(RunIndex(results))
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "speedup.md").write_text(markdown(times))
    return save(draw(times), out, "speedup")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="results")
    parser.add_argument("--out", default=str(FIG_DIR))
    args = parser.parse_args()
    print("\n".join(map(str, main(args.results, args.out))))
