"""Figure: the Newton-type family (DANE, InexactDANE, AIDE, GIANT, DiSCO) against ADMM and GD on convex problems.

One panel per (problem, workers) of ``scripts/bench_convex.py``: relative suboptimality
(O(w) - O*) / |O*| against allreduces (every allreduce or broadcast counted), log y, one
line per algorithm, the 1e-8 target dashed.  Reads only what the benchmark logged,
``results/bench_convex/<problem>/m<workers>/problem.json`` and ``<algorithm>/rounds.jsonl``;
it never trains.  ``make bench`` makes those runs.

    dane figures newton_family [--results results] [--out results/figures]
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib.pyplot as plt

from dane.records.results import read_rounds
from dane.paper_figs.common import FIG_DIR, cli, first_reaching, positive, save

TARGET = 1e-8
#: algorithm directory -> (its label's form around the class's display name, `label`; style; colour): the same colour
#: in every panel
ALGORITHMS = {
    "dane": ("{} (safeguarded)", "s-", "tab:blue"),
    "inexact_dane": ("{} (SVRG)", "d-", "tab:cyan"),
    "aide": ("{}", "p-", "tab:olive"),
    "giant": ("{}", "o-", "tab:orange"),
    "disco": ("{}", "*-", "tab:green"),
    "admm": ("{} (default ρ)", "^--", "tab:red"),
    "gd": ("{} (default step)", "v--", "tab:purple"),
}
ORDER = ("mnist_softmax", "rcv1_like_logreg", "breast_cancer_logreg", "diabetes_ridge")


def label(name: str) -> str:
    """The legend's name of the algorithm directory ``name``: its class's display name (`dane.algorithm.label_of`) in
    the run's setting (`ALGORITHMS`)."""
    from dane.algorithm import label_of  # imported here, not for --help: the classes import torch

    return ALGORITHMS[name][0].format(label_of(name))


class MissingBench(FileNotFoundError):
    def __init__(self, root: Path):
        super().__init__(f"no benchmark runs under {root}; run `make bench` (scripts/bench_convex.py) first")


def panels(results: str | Path) -> list[dict]:
    """Every (problem, workers) the benchmark logged: its problem.json and {algorithm: curve}."""
    root = Path(results) / "bench_convex"
    found = []
    for meta_path in root.glob("*/m*/problem.json"):
        meta = json.loads(meta_path.read_text())
        scale = abs(meta["f_star"]) or 1.0
        curves = {}
        for name in ALGORITHMS:
            run = meta_path.parent / name
            records = read_rounds(run) if (run / "rounds.jsonl").exists() else []
            if records:
                curves[name] = {"comm_rounds": [r["comm_rounds"] for r in records],
                                "rel": [r["suboptimality"] / scale for r in records],
                                "hit": first_reaching([{"rel": r["suboptimality"] / scale, **r} for r in records],
                                                      TARGET, key="rel")}
        found.append({**meta, "curves": curves})
    if not found:
        raise MissingBench(root)
    rank = {name: k for k, name in enumerate(ORDER)}
    return sorted(found, key=lambda p: (rank.get(p["problem"], len(ORDER)), p["problem"], p["workers"]))


def panel_title(panel: dict) -> str:
    data = panel.get("title") or panel["problem"].replace("_", " ")
    return f"{data}\nm={panel['workers']} workers, λ={panel['lam']:g}"


def draw(data: list[dict]):
    cols = min(3, len(data))
    rows = math.ceil(len(data) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.4 * rows), squeeze=False,
                             layout="constrained")
    for ax, panel in zip(axes.flat, data):
        curves = panel["curves"]
        for name, (_, style, colour) in ALGORITHMS.items():
            if name in curves:
                ax.plot(curves[name]["comm_rounds"], positive(curves[name]["rel"], ax=ax), style, color=colour,
                        markersize=3, markevery=max(1, len(curves[name]["rel"]) // 25), label=label(name))
        ax.axhline(TARGET, color="grey", linestyle=":", linewidth=1)
        ax.set_yscale("log")
        newton_end = max((c["comm_rounds"][-1] for n, c in curves.items() if n not in ("admm", "gd")), default=0)
        end = max((c["comm_rounds"][-1] for c in curves.values()), default=0)
        xlabel = "allreduces (communication rounds)"
        if newton_end and end > 5 * newton_end:  # hundreds of ADMM/GD rounds beside a few dozen: log beyond
            ax.set_xscale("symlog", linthresh=1.2 * newton_end, linscale=2)
            ax.set_xlim(left=0)
            xlabel += f"\n(log scale beyond {1.2 * newton_end:.3g})"
        ax.set_xlabel(xlabel)
        ax.set_ylabel("relative suboptimality (O(w) − O*) / |O*|")
        ax.set_title(panel_title(panel), fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(data):]:
        ax.axis("off")
    legend = {}
    for ax in axes.flat:  # every algorithm once, in ALGORITHMS' order, though a panel may lack some
        legend.update({text: handle for handle, text in zip(*ax.get_legend_handles_labels())})
    labels = [label(name) for name in ALGORITHMS if label(name) in legend]
    fig.legend([legend[text] for text in labels], labels, loc="outside lower center", ncol=len(labels), fontsize=8,
               frameon=False)
    return fig


def markdown(data: list[dict]) -> str:
    lines = [f"Allreduces to relative suboptimality {TARGET:g} (best reached where the run stopped first), "
             "from results/bench_convex/ (scripts/bench_convex.py; the in-process simulator, the package's "
             "default α-β)", ""]
    names = [n for n in ALGORITHMS if any(n in p["curves"] for p in data)]
    lines.append("| problem | m | λ | " + " | ".join(label(n) for n in names) + " |")
    lines.append("|---|---|---|" + "---|" * len(names))
    for panel in data:
        cells = []
        for n in names:
            curve = panel["curves"].get(n)
            if curve is None:
                cells.append("—")
            elif curve["hit"] is not None:
                cells.append(str(curve["hit"]["comm_rounds"]))
            else:
                cells.append(f"> {curve['comm_rounds'][-1]} (best {min(curve['rel']):.1e})")
        lines.append(f"| {panel.get('title') or panel['problem']} | {panel['workers']} | {panel['lam']:g} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(results: str | Path = "results", out: str | Path = FIG_DIR) -> list[Path]:
    data = panels(results)
    return save(draw(data), out, "newton_family", markdown(data))


if __name__ == "__main__":
    cli(main, __doc__)
