"""Figure: DANE's rounds to relative suboptimality 1e-8 against the Hessian dissimilarity δ of the shards.

From the ``similarity`` key of results/bench.json that ``scripts/bench_similarity.py`` writes:
per data set, one point per sharding (Dirichlet α, iid) at m workers, δ = max_i ||∇²O_i − ∇²O||₂
at w_0 = 0 (left) and at the last iterate (right), relative to ||∇²O|| there; a point that did
not reach the target within the round cap is drawn hollow at the cap. DANE's analysis
(Shamir, Srebro and Zhang 2014) bounds its contraction by δ/μ for μ-strongly convex O, so
rounds should grow with δ.

    dane figures similarity [--results results] [--out results/figures]
"""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.ticker import NullFormatter

from dane.paper_figs.common import FIG_DIR, cli, save

KEY = "similarity"
MARKERS = "osD^v"


class MissingSimilarity(FileNotFoundError):
    def __init__(self, path: Path):
        super().__init__(f"{path} has no '{KEY}' key; run scripts/bench_similarity.py (dane bench similarity) first")


def load(results: str | Path) -> dict:
    path = Path(results) / "bench.json"
    report = json.loads(path.read_text()) if path.exists() else {}
    if KEY not in report:
        raise MissingSimilarity(path)
    return report[KEY]


def datasets(report: dict) -> dict[str, list[dict]]:
    """The section's rows by data set, in the order measured (a skipped one holds ``skipped``)."""
    out: dict[str, list[dict]] = {}
    for row in report["rows"].values():
        out.setdefault(row["dataset"], []).append(row)
    return out


def label(cell: dict) -> str:
    return "iid" if cell["sharding"] == "iid" else f"α={cell['alpha']:g}"


def relative(cell: dict, at: str) -> float:
    """δ / ||∇²O|| at ``at`` (start or end)."""
    return cell[f"delta_{at}"] / cell[f"hessian_norm_{at}"]


def draw(report: dict):
    fig, axes = plt.subplots(1, 2, figsize=(10.5, 4.2), sharey=True)
    measured = {name: [c for c in cells if "skipped" not in c] for name, cells in datasets(report).items()}
    for ax, at in zip(axes, ("start", "end")):
        for (name, cells), marker in zip(((n, c) for n, c in measured.items() if c), MARKERS):
            cells = sorted(cells, key=lambda c: relative(c, at))
            x = [relative(c, at) for c in cells]
            y = [c["comm_rounds"] for c in cells]
            line, = ax.plot(x, y, "-", alpha=0.4)
            for c, xi, yi in zip(cells, x, y):
                ax.plot(xi, yi, marker, color=line.get_color(), markerfacecolor=line.get_color() if c["reached"]
                        else "none", markersize=7, label=name if c is cells[0] else None)
                ax.annotate(label(c), (xi, yi), textcoords="offset points", xytext=(5, 4), fontsize=7)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # log minor labels overlap over a decade or less
        ax.set_xlabel(f"δ / ||∇²O|| at {'w_0 = 0' if at == 'start' else 'the last iterate'}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    axes[0].set_ylabel("allreduces to relative suboptimality 1e-8")
    fig.suptitle(f"Safeguarded DANE at its defaults, logistic regression, λ={report['lam']:g}, "
                 f"m={report['workers']} workers; hollow: not reached in {report['rounds_cap']} rounds", fontsize=10)
    return fig


def markdown(report: dict) -> str:
    lines = [f"DANE's allreduces to {report['target']} against δ (results/bench.json `{KEY}`, "
             f"{report.get('started_at', '')}; load average before {report['machine']['load_avg']}, after "
             f"{report.get('load_avg_after')})", "",
             "| data | sharding | rows per worker (min-max) | δ start | δ_A start | δ_F start | ‖H‖ start | δ end | "
             "‖H‖ end | allreduces | reached |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, cells in datasets(report).items():
        for c in cells:
            if "skipped" in c:
                lines.append(f"| {name} | {label(c)}: skipped, {c['skipped']} | | | | | | | | | |")
                continue
            lines.append(f"| {name} | {label(c)} | {min(c['rows'])}-{max(c['rows'])} | {c['delta_start']:.4g} | "
                         f"{c['delta_mean_square_start']:.4g} | {c['delta_frobenius_start']:.4g} | "
                         f"{c['hessian_norm_start']:.4g} | {c['delta_end']:.4g} | {c['hessian_norm_end']:.4g} | "
                         f"{c['comm_rounds']} | {'yes' if c['reached'] else 'no'} |")
    return "\n".join(lines) + "\n"


def main(results: str | Path = "results", out: str | Path = FIG_DIR) -> list[Path]:
    report = load(results)
    return save(draw(report), out, "similarity", markdown(report))


if __name__ == "__main__":
    cli(main, __doc__)
