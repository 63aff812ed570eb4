"""Figure (a), the source paper's layout: time to suboptimality 1e-8 against the number of workers.

Safeguarded DANE on the isotropic synthetic ridge (d=500, λ=0.005), one curve per N,
each with its ideal T(1)/m line (log-log).  Time is the simulator's parallel time,
counting each worker's setup (its local Hessian X_iᵀX_i, which is the work that
parallelizes over m) plus the rounds' compute and the α-β allreduce cost.  Left: the
cost model calibrated on this machine (results/calibration.json; the package defaults,
measured once on a machine like this one, when it is absent; the panel says which);
right: the same runs' compute with a fast interconnect (α=10 µs, β=10 GB/s), where the ring allreduce's
2(m-1)α latency no longer swamps the parallelized setup.

    python -m paper_figs.speedup [--results results] [--out paper_figs]
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt

from paper_figs.common import FIG_DIR, M_GRID, N_GRID, cli, locate, positive, save, time_to
from dane.comm import AlphaBeta
from dane.results import read_summary
from synthetic.sweep import Job, RunIndex, grid

TOL = 1e-8
BASE = ("algorithm=dane", "algorithm.safeguard=true", "algorithm.mu=0.0", "problem.covariance=iso")
#: panel -> cost-model overrides ("measured": results/calibration.json, or the defaults without it)
NETWORKS: dict[str, tuple[str, ...]] = {
    "measured": (),
    "fast interconnect": ("sim.alpha=1e-05", "sim.beta=1e10"),
}
Times = dict[str, dict[int, list[float]]]


def job(n: int, m: int, network: tuple[str, ...] = ()) -> Job:
    return (*BASE, f"problem.n_samples={n}", f"workers={m}", *network)


def jobs(ns=N_GRID, ms=M_GRID) -> list[Job]:
    return [job(n, m, network) for network in NETWORKS.values() for n in ns for m in ms]


def table(index: RunIndex, ns=N_GRID, ms=M_GRID) -> Times:
    """{panel: {N: [time to 1e-8 at each m]}} in seconds (nan where 1e-8 was not reached)."""
    runs = locate(index, jobs(ns, ms))
    return {title(name, read_summary(runs[job(ns[0], ms[-1], network)])):
            {n: [time_to(runs[job(n, m, network)], TOL) for m in ms] for n in ns}
            for name, network in NETWORKS.items()}


def title(name: str, summary: dict) -> str:
    """The panel's title, with the α-β its runs were simulated under (and where it came from)."""
    alpha, beta = summary.get("alpha"), summary.get("beta")
    if alpha is None or beta is None:  # a single-worker run has no network
        return name
    if name == "measured":
        default = AlphaBeta()
        name = ("package default α-β (no results/calibration.json)" if (alpha, beta) == (default.alpha, default.beta)
                else "α-β calibrated on this machine")
    return f"{name}\nα={alpha * 1e6:.3g} µs, β={beta / 1e9:.3g} GB/s"


def draw(times: Times, ms=M_GRID):
    fig, axes = plt.subplots(1, len(times), figsize=(5.2 * len(times), 4.2), sharey=True, squeeze=False)
    for ax, (title, panel) in zip(axes[0], times.items()):
        for k, (n, row) in enumerate(sorted(panel.items())):
            color = f"C{k}"
            ax.plot(ms, positive(row), "o-", color=color, label=f"N = {n}")
            if math.isfinite(row[0]):
                ax.plot(ms, [row[0] / m for m in ms], ":", color=color, linewidth=1)
        ax.plot([], [], "k:", linewidth=1, label="ideal T(1)/m")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(ms, [str(m) for m in ms])
        ax.set_xlabel("workers m")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    axes[0, 0].set_ylabel(f"simulated time to suboptimality {TOL:g} (s)")
    fig.suptitle("Safeguarded DANE, synthetic ridge (d=500)")
    return fig


def markdown(times: Times, ms=M_GRID) -> str:
    parts = [f"Simulated time (s) to suboptimality {TOL:g}, safeguarded DANE, counting the workers' setup\n"]
    for title, panel in times.items():
        head = f"| {title}: N \\ m | " + " | ".join(str(m) for m in ms) + " |\n" + "|---" * (len(ms) + 1) + "|\n"
        rows = "".join(f"| {n} | " + " | ".join("not reached" if math.isnan(t) else f"{t:.4f}" for t in row)
                       + " |\n" for n, row in sorted(panel.items()))
        parts.append(head + rows)
    return "\n".join(parts)


def main(results: str | Path = "results", out: str | Path = FIG_DIR) -> list[Path]:
    times = table(RunIndex(results))
    return save(draw(times), out, "speedup", markdown(times))


if __name__ == "__main__":
    cli(main, __doc__)
