"""Figure: the cost of one DANE round's local solve against the dimension d, Cholesky against CG.

Time per round (median of the repeats, bars from the fastest to the slowest) and peak
memory, from the ``local_solve_cost`` key of results/bench.json that
``scripts/bench_local_solve.py`` writes (ridge on one worker, n_i = 2d rows; dense Gaussian rows
up to d = 5,000, rcv1-like sparse rows beyond).  Cholesky's first round forms and factors
H_i + μI; later rounds at the same μ reuse the factor.  A case the benchmark skipped
(Cholesky where the dense Hessian cannot fit in memory) is marked with its reason.

    dane figures local_solve_cost [--results results] [--out results/figures]
"""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt

from dane.paper_figs.common import FIG_DIR, cli, save

KEY = "local_solve_cost"
SERIES = {  # label -> (solver, time field, style)
    "Cholesky, first round (form + factor H_i)": ("cholesky", "first_round_s", "s--"),
    "Cholesky, later rounds (factor reused)": ("cholesky", "round_s", "s-"),
    "CG (every round)": ("cg", "round_s", "o-"),
}


class MissingCost(FileNotFoundError):
    def __init__(self, path: Path):
        super().__init__(f"{path} has no '{KEY}' key; run `make bench` (scripts/bench_local_solve.py) first")


def load(results: str | Path) -> dict:
    path = Path(results) / "bench.json"
    report = json.loads(path.read_text()) if path.exists() else {}
    if KEY not in report:
        raise MissingCost(path)
    return report[KEY]


def all_cases(cost: dict) -> list[dict]:
    """The section's rows (one a case), in the order they were measured."""
    return list(cost["rows"].values())


def measured(cost: dict, solver: str) -> list[dict]:
    return sorted((c for c in all_cases(cost) if c["solver"] == solver and "round_s" in c), key=lambda c: c["d"])


def draw(cost: dict):
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.4))
    for label, (solver, key, style) in SERIES.items():
        cases = measured(cost, solver)
        if not cases:
            continue
        d = [c["d"] for c in cases]
        mid = [c[key]["median"] for c in cases]
        err = [[c[key]["median"] - c[key]["min"] for c in cases], [c[key]["max"] - c[key]["median"] for c in cases]]
        ax_t.errorbar(d, mid, yerr=err, fmt=style, capsize=3, markersize=5, label=label)
    for solver, style in (("cholesky", "s-"), ("cg", "o-")):
        cases = measured(cost, solver)
        if cases:
            ax_m.plot([c["d"] for c in cases], [max(c["peak_mb"], 1e-1) for c in cases], style, label=solver)
    data = {c["d"]: max(c["data_mb"], 1e-1) for c in all_cases(cost) if "data_mb" in c}
    if data:
        ax_m.plot(sorted(data), [data[d] for d in sorted(data)], "k:", label="the shard's X alone")
    for case in all_cases(cost):
        for ax in (ax_t, ax_m):
            ax.axvline(case["d"], color="grey", linewidth=0.5, alpha=0.4)
        if "skipped" in case:
            ax_t.annotate(f"{case['solver']} skipped at d={case['d']:,}:\n" + case["skipped"].split(": ", 1)[-1],
                          xy=(case["d"], 0.5), xycoords=("data", "axes fraction"), ha="right", va="center",
                          fontsize=6.5, wrap=True, bbox={"boxstyle": "round", "fc": "white", "alpha": 0.8})
    layouts = ", ".join(f"d={c['d']:,} {c['layout']}" for c in all_cases(cost) if c["solver"] == "cg")
    for ax in (ax_t, ax_m):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"dimension d ({layouts}; n_i = 2d rows)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    ax_t.set_ylabel("local solve time per DANE round (s)")
    ax_t.set_title("time per round (median of repeats, min-max bars)", fontsize=9)
    ax_m.set_ylabel("peak memory above an idle interpreter (MB)")
    ax_m.set_title("peak memory (ru_maxrss of the case's own process)", fontsize=9)
    fig.suptitle("One DANE local solve on one worker, ridge, one core: Cholesky vs CG", fontsize=10)
    return fig


def markdown(cost: dict) -> str:
    lines = [f"One DANE round's local solve on one worker (results/bench.json `{KEY}`, {cost.get('started_at', '')}; "
             f"load average before {cost['machine']['load_avg']}, after {cost.get('load_avg_after')})", "",
             "| d | layout | solver | first round (s) | later rounds (s) | peak MB | X alone MB |",
             "|---|---|---|---|---|---|---|"]
    for c in sorted(all_cases(cost), key=lambda c: (c["d"], c["solver"])):
        if "round_s" not in c:
            why = c.get("skipped") or f"failed: {c.get('failed')}"
            lines.append(f"| {c['d']:,} | {c['layout']} | {c['solver']} | {why} | | | |")
            continue
        first, later = c["first_round_s"], c["round_s"]
        lines.append(f"| {c['d']:,} | {c['layout']} | {c['solver']} | {first['median']:.4g} "
                     f"[{first['min']:.3g}, {first['max']:.3g}] | {later['median']:.4g} "
                     f"[{later['min']:.3g}, {later['max']:.3g}] | {c['peak_mb']:.0f} | {c['data_mb']:.0f} |")
    return "\n".join(lines) + "\n"


def main(results: str | Path = "results", out: str | Path = FIG_DIR) -> list[Path]:
    cost = load(results)
    return save(draw(cost), out, "local_solve_cost", markdown(cost))


if __name__ == "__main__":
    cli(main, __doc__)
