"""Figure (c): rounds to suboptimality 1e-10 over the (N, m) grid, plain DANE against safeguarded DANE.

Three panels (and a markdown table): plain DANE with μ=0, plain DANE with the best
fixed μ from {0.01, 0.03, 0.1, 0.3, 1, 3} for that cell (chosen after the fact, which
favours it), and safeguarded DANE, which needs no tuning.  Cells say "div" where the
run diverged and "—" where it had not reached 1e-10 within its round budget.  The title and the caption (which
heads the table) name the setting as the runs record it (`paper_figs.common.setting_text`: the data, N, d, m, λ).

    dane figures rounds_table [--results results] [--out results/figures]
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from dane.paper_figs.common import FIG_DIR, M_GRID, N_GRID, cli, locate, outcome, save, setting_text, wrapped
from dane.paper_figs.provenance import caption_line, figure_provenance
from dane.synthetic.sweep import Job, RunIndex

TOL = 1e-10
MUS = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
ROUNDS = 100  # round budget of the plain-DANE μ grid
TIMED = False  # reads rounds only: runs simulated under any cost model will do


def plain_job(n: int, m: int, mu: float) -> Job:
    return ("algorithm=dane", "algorithm.safeguard=false", f"algorithm.mu={float(mu)}", "problem.covariance=iso",
            f"problem.n_samples={n}", f"workers={m}", f"rounds={ROUNDS}")


def safeguarded_job(n: int, m: int) -> Job:
    return ("algorithm=dane", "algorithm.safeguard=true", "algorithm.mu=0.0", "problem.covariance=iso",
            f"problem.n_samples={n}", f"workers={m}")


def jobs(ns=N_GRID, ms=M_GRID) -> list[Job]:
    return [job for n in ns for m in ms
            for job in (safeguarded_job(n, m), *(plain_job(n, m, mu) for mu in (0.0, *MUS)))]


Cell = tuple[str, float, float | None]  # (status, rounds or nan, μ)


def cell(run_dir: Path, mu: float | None = None) -> Cell:
    status, hit = outcome(run_dir, TOL)
    return status, (float(hit["round"]) if hit else math.nan), mu


def best(cells: list[Cell]) -> Cell:
    """Fewest rounds among the cells that reached the target; else the first non-diverged one."""
    reached = [c for c in cells if c[0] == "reached"]
    if reached:
        return min(reached, key=lambda c: c[1])
    return next((c for c in cells if c[0] != "diverged"), cells[0])


def table(index: RunIndex, ns=N_GRID, ms=M_GRID) -> dict[str, dict[tuple[int, int], Cell]]:
    """{"μ=0" | "best fixed μ" | "safeguarded": {(N, m): (status, rounds, μ)}}."""
    runs = locate(index, jobs(ns, ms), timed=False)
    out: dict[str, dict[tuple[int, int], Cell]] = {"μ=0": {}, "best fixed μ": {}, "safeguarded": {}}
    for n in ns:
        for m in ms:
            out["μ=0"][n, m] = cell(runs[plain_job(n, m, 0.0)], 0.0)
            out["best fixed μ"][n, m] = best([cell(runs[plain_job(n, m, mu)], mu) for mu in MUS])
            out["safeguarded"][n, m] = cell(runs[safeguarded_job(n, m)])
    return out


def label(c: Cell, with_mu: bool = False) -> str:
    status, rounds, mu = c
    if status == "diverged":
        return "div"
    if status != "reached":
        return "—"
    return f"{rounds:.0f}" + (f" (μ={mu:g})" if with_mu and mu is not None else "")


def markdown(data: dict[str, dict[tuple[int, int], Cell]], ns=N_GRID, ms=M_GRID) -> str:
    parts = [f"Rounds of DANE to suboptimality {TOL:g}; div = diverged, — = not reached (plain DANE: {ROUNDS} rounds, safeguarded: 200).\n"]
    for name, cells in data.items():
        head = f"| {name}: N \\ m | " + " | ".join(map(str, ms)) + " |\n" + "|---" * (len(ms) + 1) + "|\n"
        rows = "".join(f"| {n} | " + " | ".join(label(cells[n, m], name == "best fixed μ") for m in ms) + " |\n"
                       for n in ns)
        parts.append(head + rows)
    return "\n".join(parts)


def draw(data: dict[str, dict[tuple[int, int], Cell]], ns=N_GRID, ms=M_GRID, setting: str | None = None):
    """One panel per row of `table`; ``setting`` (`setting_text` of the runs) in the title."""
    fig, axes = plt.subplots(1, len(data), figsize=(4.2 * len(data), 3.8), sharey=True,
                             layout="constrained")
    for ax, (name, cells) in zip(np.atleast_1d(axes), data.items()):
        grid = np.array([[cells[n, m][1] for m in ms] for n in ns])
        image = ax.imshow(np.log10(grid), cmap="viridis_r", vmin=0, vmax=np.log10(ROUNDS), aspect="auto")
        for i, n in enumerate(ns):
            for j, m in enumerate(ms):
                c = cells[n, m]
                text = label(c) + (f"\nμ={c[2]:g}" if name == "best fixed μ" and c[0] == "reached" else "")
                ax.text(j, i, text, ha="center", va="center", fontsize=7,
                        color="white" if c[0] == "reached" and c[1] > 10 else "black")
        ax.set_xticks(range(len(ms)), [str(m) for m in ms])
        ax.set_yticks(range(len(ns)), [str(n) for n in ns])
        ax.set_xlabel("workers m")
        ax.set_title(f"DANE, {name}")
    np.atleast_1d(axes)[0].set_ylabel("samples N")
    fig.colorbar(image, ax=axes, label=f"log10 rounds to {TOL:g}", shrink=0.8)
    if setting:
        fig.suptitle(wrapped(f"Rounds of DANE to suboptimality {TOL:g}: {setting}", 4.2 * len(data)), fontsize=10)
    return fig


def main(results: str | Path = "results", out: str | Path = FIG_DIR) -> list[Path]:
    index = RunIndex(results)
    data = table(index)
    runs = list(locate(index, jobs(), timed=False).values())
    provenance = figure_provenance(runs, root=results, tolerance=TOL)
    setting = setting_text(runs)
    caption = caption_line(f"Rounds of DANE to suboptimality {TOL:g}, μ=0, the best fixed μ, safeguarded: {setting}",
                           provenance)
    return save(draw(data, setting=setting), out, "rounds_table", markdown(data), caption=caption,
                provenance=provenance)


if __name__ == "__main__":
    cli(main, __doc__)
