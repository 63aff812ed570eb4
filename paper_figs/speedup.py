"""Figure (a), the source paper's layout: time to suboptimality 1e-8 against the number of workers,
and where that time goes.

Safeguarded DANE on the isotropic synthetic ridge (λ=0.005) in two regimes:

- *latency-dominated*, the paper's grid (d=500, N from 6,000 to 18,000): a worker's setup
  (its local Hessian X_iᵀX_i, O(n_i d²)) and a round's compute are small next to the
  ring allreduce's 2(m-1)α latency, so adding workers soon adds more network time than
  it saves in compute;
- *compute-dominated* (d=2,000, N=64,000: 14x the paper's largest N·d), where forming
  the local Hessian dominates, as in the paper's Matlab timing, and the time falls
  nearly as 1/m until the latency catches up.

Top: time to 1e-8 (setup included) against m, with the ideal T(1)/m line.  Bottom: the
same times split into compute (setup plus each phase's slowest worker) and
communication (the α-β model: bytes/β + 2(m-1)α per allreduce, exactly what the
simulator charged).  Every time is put on one fixed α-β (`paper_figs.common.FIGURE_COST`,
stated on the figure) by `retime`, so the figure does not move with the last
calibration; its compute part is each simulated worker's measured CPU time.  The title, the panels and the
caption name the setting as the runs record it (`paper_figs.common.setting_text`: the data, N, d, m, λ).

    dane figures speedup [--results results] [--out results/figures]
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt

from dane.records.results import read_rounds, read_summary
from dane.paper_figs.common import (FIG_DIR, FIGURE_COST, M_GRID, N_GRID, cli, cost_caption, first_reaching, locate,
                                    positive, retime, run_setting, save, setting_text, setting_value, wrapped)
from dane.paper_figs.provenance import caption_line, figure_provenance
from dane.synthetic.sweep import Job, RunIndex

TOL = 1e-8
BASE = ("algorithm=dane", "algorithm.safeguard=true", "algorithm.mu=0.0", "problem.covariance=iso",
        "sim.calibration=null")  # the package's α-β; the figure re-times every run to FIGURE_COST anyway


@dataclass(frozen=True)
class Regime:
    title: str
    dim: int
    ns: tuple[int, ...]
    ms: tuple[int, ...]


REGIMES = (
    Regime("latency-dominated (the paper's grid)", 500, N_GRID, M_GRID),
    Regime("compute-dominated", 2000, (64000,), (1, 2, 4, 8, 16, 32)),
)


def job(n: int, m: int, dim: int = 500) -> Job:
    return (*BASE, f"problem.n_samples={n}", f"workers={m}", *((f"problem.dim={dim}",) if dim != 500 else ()))


def jobs(regimes=REGIMES) -> list[Job]:
    return [job(n, m, r.dim) for r in regimes for n in r.ns for m in r.ms]


@dataclass(frozen=True)
class Point:
    """Time to TOL (setup included) and its compute and communication parts; nan where TOL was not reached."""

    total: float
    compute: float
    comm: float
    run: str


def point(run_dir: Path) -> Point:
    summary = read_summary(run_dir)
    hit = first_reaching(retime(read_rounds(run_dir), summary), TOL)
    if hit is None:
        return Point(math.nan, math.nan, math.nan, str(run_dir))
    m = summary["workers"]
    comm = (hit["bytes_sent"] / FIGURE_COST.beta + hit["comm_rounds"] * 2 * (m - 1) * FIGURE_COST.alpha) if m > 1 else 0.0
    total = summary.get("setup_s", 0.0) + hit["time_s"]
    return Point(total, total - comm, comm, str(run_dir))


Table = dict[Regime, dict[int, list[Point]]]


def runs_of(times: Table) -> list[str]:
    """The run directories drawn, regime by regime, N by N, m by m."""
    return [p.run for panel in times.values() for row in panel.values() for p in row]


def panel_setting(panel: dict[int, list[Point]], key: str) -> str | None:
    """A `run_setting` key over one regime's runs (``"N"``, ``"d"``), as they record it."""
    return setting_value([run_setting(p.run) for row in panel.values() for p in row], key)


def heading(regime: Regime, panel: dict[int, list[Point]]) -> str:
    """A regime's name with its N and d as its runs record them ("compute-dominated: N = 64,000, d = 2000")."""
    return f"{regime.title}: N = {panel_setting(panel, 'N')}, d = {panel_setting(panel, 'd')}"


def table(index: RunIndex, regimes=REGIMES) -> Table:
    """{regime: {N: [Point at each m]}}."""
    runs = locate(index, jobs(regimes))
    return {r: {n: [point(runs[job(n, m, r.dim)]) for m in r.ms] for n in r.ns} for r in regimes}


def draw(times: Table):
    regimes = list(times)
    fig, axes = plt.subplots(2, len(regimes), figsize=(5.6 * len(regimes), 8), squeeze=False)
    for col, regime in enumerate(regimes):
        ms, panel = regime.ms, times[regime]
        ax = axes[0, col]
        for k, (n, row) in enumerate(sorted(panel.items())):
            totals = [p.total for p in row]
            ax.plot(ms, positive(totals, ax=ax), "o-", color=f"C{k}", label=f"N = {n}")
            if math.isfinite(totals[0]):
                ax.plot(ms, [totals[0] / m for m in ms], ":", color=f"C{k}", linewidth=1)
        ax.plot([], [], "k:", linewidth=1, label="ideal T(1)/m")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(ms, [str(m) for m in ms])
        ax.set_xlabel("workers m")
        ax.set_ylabel(f"simulated time to suboptimality {TOL:g} (s)")
        ax.set_title(wrapped(heading(regime, panel), 5.6), fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        n = max(panel)
        row = panel[n]
        ax = axes[1, col]
        x = range(len(ms))
        compute = [p.compute if math.isfinite(p.compute) else 0.0 for p in row]
        comm = [p.comm if math.isfinite(p.comm) else 0.0 for p in row]
        ax.bar(x, compute, color="C0", label="compute (setup + slowest worker per phase)")
        ax.bar(x, comm, bottom=compute, color="C3", label="communication (α-β allreduce model)")
        for i, p in enumerate(row):
            if not math.isfinite(p.total):
                ax.text(i, 0, "not\nreached", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(list(x), [str(m) for m in ms])
        ax.set_xlabel("workers m")
        ax.set_ylabel(f"time to {TOL:g} (s)")
        ax.set_title(f"where the time goes, N = {n}", fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(wrapped(f"Safeguarded DANE, {setting_text(runs_of(times))}: simulated time under {cost_caption()}",
                         5.6 * len(regimes)), fontsize=10)
    return fig


def markdown(times: Table) -> str:
    parts = [f"Simulated time (s) to suboptimality {TOL:g}, safeguarded DANE, setup included: "
             "total = compute + communication\n"]
    for regime, panel in times.items():
        head = f"| {regime.title}, d = {panel_setting(panel, 'd')}: N \\ m | " + " | ".join(str(m) for m in regime.ms) + " |\n" + \
            "|---" * (len(regime.ms) + 1) + "|\n"
        rows = "".join(f"| {n} | " + " | ".join("not reached" if math.isnan(p.total) else
                                                  f"{p.total:.3f} = {p.compute:.3f} + {p.comm:.3f}" for p in row)
                       + " |\n" for n, row in sorted(panel.items()))
        parts.append(head + rows)
    return "\n".join(parts)


def main(results: str | Path = "results", out: str | Path = FIG_DIR) -> list[Path]:
    times = table(RunIndex(results))
    provenance = figure_provenance(runs_of(times), root=results, cost=cost_caption(), tolerance=TOL)
    caption = caption_line(f"Safeguarded DANE: simulated time to {TOL:g} against workers, split into compute and "
                           f"communication, latency- and compute-dominated regimes: {setting_text(runs_of(times))}",
                           provenance)
    return save(draw(times), out, "speedup", markdown(times), caption=caption, provenance=provenance)


if __name__ == "__main__":
    cli(main, __doc__)
