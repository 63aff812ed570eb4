"""Figure (b): suboptimality against communication rounds and against simulated time.

DANE with a fixed μ (plain, μ=0 as in the paper), safeguarded DANE, consensus ADMM
(its default ρ = √(μ̲ L̄)), distributed GD (its default step) and one-shot averaging on the synthetic ridge at N=18000, m=8; top row
isotropic x, bottom row the ill-conditioned covariance (feature j scaled by j^-0.6).
The rounds axis counts allreduces (``comm_rounds``): a DANE round is two of them.  Times
are put on the figures' fixed α-β (`paper_figs.common.FIGURE_COST`), which the time axes and the title state.
The title and caption name the setting as the runs record it (`paper_figs.common.setting_text`: the data, N, d, m,
λ); ``convergence.md`` holds, under the caption, each method's rounds, allreduces and simulated time to
suboptimality `TOL` per covariance.

    dane figures convergence [--results results] [--out results/figures]
"""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from dane.records.results import read_rounds, read_summary
from dane.paper_figs.common import (FIG_DIR, FIGURE_COST, alpha_beta_text, cli, cost_caption, first_reaching, locate,
                                    positive, retime, save, setting_text, wrapped)
from dane.paper_figs.provenance import caption_line, figure_provenance
from dane.synthetic.sweep import Job, RunIndex

N, M = 18000, 8
TOL = 1e-8  # the table's target: the speedup figure's
#: the figure's rows, top to bottom: every ``problem.covariance`` (`dane.problems.ridge.COVARIANCES`, restated: that
#: module imports torch, which a figure's ``--help`` does not load; `tests/test_figures.py` holds the two equal)
COVARIANCES = ("iso", "decay")
#: label -> overrides; plain DANE keeps μ fixed, the safeguard adapts it
METHODS: dict[str, tuple[str, ...]] = {
    "DANE (μ=0, fixed)": ("algorithm=dane", "algorithm.safeguard=false", "algorithm.mu=0.0"),
    "DANE (safeguarded)": ("algorithm=dane", "algorithm.safeguard=true", "algorithm.mu=0.0"),
    "ADMM (default ρ)": ("algorithm=admm",),
    "GD (default step)": ("algorithm=gd",),
    "one-shot averaging": ("algorithm=osa", "rounds=5"),
}
STYLE = {"DANE (μ=0, fixed)": "o-", "DANE (safeguarded)": "s-", "ADMM (default ρ)": "^-", "GD (default step)": "v-",
         "one-shot averaging": "x--"}


def job(label: str, covariance: str) -> Job:
    return (*METHODS[label], f"problem.covariance={covariance}", f"problem.n_samples={N}", f"workers={M}",
            "sim.calibration=null")


def jobs() -> list[Job]:
    return [job(label, cov) for cov in COVARIANCES for label in METHODS]


def curves(index: RunIndex) -> dict[tuple[str, str], dict[str, list[float]]]:
    """{(covariance, label): {"round": [...], "comm_rounds": [...], "time_s": [...], "suboptimality": [...],
    "status": the run's, "run": path}}."""
    runs = locate(index, jobs())
    out = {}
    for cov in COVARIANCES:
        for label in METHODS:
            run = runs[job(label, cov)]
            records = retime(read_rounds(run), read_summary(run))
            out[cov, label] = {key: [r.get(key) for r in records]
                               for key in ("round", "comm_rounds", "time_s", "suboptimality")}
            out[cov, label].update(status=read_summary(run)["status"], run=str(run))
    return out


def draw(data: dict[tuple[str, str], dict[str, list[float]]]):
    fig, axes = plt.subplots(2, 2, figsize=(10, 8), sharey="row")
    setting = setting_text(curve["run"] for curve in data.values())
    fig.suptitle(wrapped(f"{setting}\nSimulated times re-timed to one ring-allreduce α-β, not calibrated: "
                         f"{cost_caption()}", 10), fontsize=10)
    at = alpha_beta_text(FIGURE_COST.alpha, FIGURE_COST.beta)
    for row, cov in enumerate(COVARIANCES):
        for col, (xkey, xlabel) in enumerate((("comm_rounds", "communication rounds (allreduces)"),
                                               ("time_s", f"simulated time (s) at {at}"))):
            ax = axes[row, col]
            for label in METHODS:
                if (cov, label) not in data:
                    continue
                curve = data[cov, label]
                ax.plot(curve[xkey], positive(curve["suboptimality"], ax=ax), STYLE[label], markersize=3, label=label)
            ax.set_yscale("log")
            dane_end = max(max(data[cov, k][xkey]) for k in METHODS if k.startswith("DANE") and (cov, k) in data)
            end = max(max(data[cov, k][xkey]) for k in METHODS if (cov, k) in data)
            if end > 5 * dane_end:  # DANE needs a handful of rounds where ADMM and GD need hundreds:
                ax.set_xscale("symlog", linthresh=1.2 * dane_end, linscale=2)  # linear over DANE's, log beyond
                ax.set_xlim(left=0)
                xlabel += f"\n(log scale beyond {1.2 * dane_end:.3g})"
            ax.set_xlabel(xlabel)
            ax.set_ylabel("suboptimality O(w) - O(w*)")
            ax.set_title(f"{'isotropic' if cov == 'iso' else 'decaying (j^-0.6)'} covariance")
            ax.grid(True, which="both", alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    return fig


def to_target(curve: dict) -> str:
    """A run's rounds, allreduces and simulated seconds to `TOL` ("12 | 24 | 0.0312"), or how it missed it."""
    records = [dict(zip(("round", "comm_rounds", "time_s", "suboptimality"), r))
               for r in zip(curve["round"], curve["comm_rounds"], curve["time_s"], curve["suboptimality"])]
    hit = first_reaching(records, TOL)
    if hit is not None:
        return f"{hit['round']} | {hit['comm_rounds']} | {hit['time_s']:.4g}"
    missed = "diverged" if curve["status"] == "diverged" else f"not reached in {records[-1]['round']} rounds"
    return f"{missed} | — | —"


def markdown(data: dict[tuple[str, str], dict]) -> str:
    """Per covariance and method: rounds, allreduces and simulated time (at `FIGURE_COST`) to `TOL`."""
    lines = [f"Rounds, allreduces and simulated time (s, at {alpha_beta_text(FIGURE_COST.alpha, FIGURE_COST.beta)}) "
             f"to suboptimality {TOL:g}; a run that missed it says how.", "",
             "| covariance | method | rounds | allreduces | simulated time (s) |", "|---|---|---|---|---|"]
    lines += [f"| {cov} | {label} | {to_target(data[cov, label])} |" for cov in COVARIANCES for label in METHODS
              if (cov, label) in data]
    return "\n".join(lines) + "\n"


def main(results: str | Path = "results", out: str | Path = FIG_DIR) -> list[Path]:
    data = curves(RunIndex(results))
    runs = [c["run"] for c in data.values()]
    provenance = figure_provenance(runs, root=results, cost=cost_caption(), tolerance=TOL)
    caption = caption_line(f"Suboptimality against allreduces and simulated time: {setting_text(runs)}", provenance)
    return save(draw(data), out, "convergence", markdown(data), caption=caption, provenance=provenance)


if __name__ == "__main__":
    cli(main, __doc__)
