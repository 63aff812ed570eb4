"""Figures: split learning, the source system's experiments regenerated (docs/split_learning.md, `dane.split`).

Three outputs, from logged runs only (their jobs are `jobs()`; ``--run-missing`` makes the
missing ones in the simulator first, as ``dane figures make_all`` does for the others):

- ``split_learning_curves``: test accuracy and training loss per epoch, "centralized"
  (one agent: by the invariant this is plain minibatch SGD on the uncut network, tested
  to 1e-12) against 2, 3 and 4 agents taking turns (sequential), for the digits MLP
  (64-128-64-32-10, cut after its second layer, ``net.4``), and LeNet-5 cut after the
  two conv stages (``features.6``) on digits upsampled to 32x32 and on MNIST (the t10k
  files in ``data_dir``, split 8,000 train / 2,000 test; each panel's title says its data);
- ``split_learning_time``: the time of one epoch split into agent compute, server
  compute, activations, cut gradients and hand-over, stacked bars at 2, 3 and 4 agents
  for LeNet-5 cut small (``features.6``) and large (``classifier.1``): simulated with
  the package's α-β per message; a real ``torchrun`` run at 2 agents is drawn beside
  them when its folder exists (`REAL`; its time split is the processes' own
  measurement, its communication the time spent in blocking sends);
- ``split_learning_cuts`` (a table): each cut of LeNet-5, the agent's share of the
  parameters, and the bytes of one epoch per link at 2 agents.

    dane figures split_learning [--results results] [--out results/figures] [--run-missing]
    # the real point (2 agents + the server, 3 processes):
    torchrun --standalone --nproc_per_node 3 -m experiments.train comm=ps algorithm=split \\
        problem=digits_lenet5 algorithm.cut=features.6 rounds=3 out_dir=results/split_learning/real/lenet5_features.6
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

import matplotlib.pyplot as plt

from dane.paper_figs.common import FIG_DIR, checked_out, data_text, locate, save
from dane.paper_figs.provenance import caption_line, figure_provenance
from dane.records.results import read_rounds, read_summary
from dane.synthetic.sweep import Job, RunIndex, ensure
from dane.records.provenance import command_name

AGENTS = (1, 2, 3, 4)
NETWORKS = {  # label -> (overrides, epochs)
    "digits MLP, cut net.4": (("problem=digits_mlp", "problem.model.hidden=[128,64,32]", "algorithm.cut=net.4"), 20),
    "digits LeNet-5, cut features.6": (("problem=digits_lenet5", "algorithm.cut=features.6"), 10),
    "MNIST LeNet-5, cut features.6": (("problem=mnist_lenet5", "algorithm.cut=features.6"), 10),
}
TIME_CUTS = ("features.6", "classifier.1")
TABLE_CUTS = ("features.0", "features.3", "features.6", "classifier.0", "classifier.2")
PARTS = ("agent_compute_s", "server_compute_s", "activations_s", "gradients_s", "handover_s")
LINKS = ("activations", "labels", "cut_gradients", "handover", "averaging")
#: real torchrun runs (folder under results/) -> the cut they stand for, at 2 agents
REAL = {"split_learning/real/lenet5_features.6": "features.6", "split_learning/real/lenet5_classifier.1": "classifier.1"}
BASE = ("algorithm=split", "algorithm.schedule=sequential", "tol=null", "sim.calibration=null", "seed=0")


def curve_job(network: str, m: int) -> Job:
    overrides, epochs = NETWORKS[network]
    return (*BASE, *overrides, f"workers={m}", f"rounds={epochs}")


def time_job(cut: str, m: int) -> Job:
    return (*BASE, "problem=digits_lenet5", f"algorithm.cut={cut}", f"workers={m}", "rounds=3")


def table_job(cut: str) -> Job:
    return (*BASE, "problem=digits_lenet5", f"algorithm.cut={cut}", "workers=2", "rounds=1")


def jobs() -> list[Job]:
    return [*(curve_job(n, m) for n in NETWORKS for m in AGENTS), *(time_job(c, m) for c in TIME_CUTS for m in (2, 3, 4)),
            *(table_job(c) for c in TABLE_CUTS)]


def agents_label(m: int) -> str:
    return "centralized (1 agent)" if m == 1 else f"{m} agents"


def draw_curves(runs: dict):
    fig, axes = plt.subplots(2, len(NETWORKS), figsize=(4.6 * len(NETWORKS), 7), squeeze=False)
    for col, network in enumerate(NETWORKS):
        for m in AGENTS:
            records = read_rounds(runs[curve_job(network, m)])
            epochs = [r["round"] for r in records]
            axes[0][col].plot(epochs, [r["test_accuracy"] for r in records], "o-", ms=3, label=agents_label(m))
            axes[1][col].plot(epochs, [r["objective"] for r in records], "o-", ms=3, label=agents_label(m))
        data = read_summary(runs[curve_job(network, 1)]).get("data")
        rows = f"{data['train_size']:,} train / {data['test_size']:,} test rows" if data else ""
        axes[0][col].set_title(f"{network}\n{rows}", fontsize=9)
        axes[0][col].set_ylabel("test accuracy")
        axes[1][col].set_ylabel("training loss (all rows)")
        axes[1][col].set_yscale("log")
        for ax in axes[:, col]:
            ax.set_xlabel("epoch")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
    return fig


def curves_table(runs: dict) -> str:
    """Final test accuracy and training loss per network and number of agents, with each network's data."""
    lines = ["| network | data | " + " | ".join(agents_label(m) for m in AGENTS) + " |", "|---" * (2 + len(AGENTS)) + "|"]
    for network in NETWORKS:
        last = [read_rounds(runs[curve_job(network, m)])[-1] for m in AGENTS]
        data = read_summary(runs[curve_job(network, 1)]).get("data")
        lines.append(f"| {network} | {data_text(data) if data else '?'} | "
                     + " | ".join(f"{r['test_accuracy']:.4f} ({r['objective']:.3g})" for r in last) + " |")
    return "final test accuracy (final training loss) after the last epoch\n\n" + "\n".join(lines) + "\n"


def epoch_split(run_dir: Path) -> list[float]:
    """The median over epochs of each part of an epoch's time (seconds)."""
    records = read_rounds(run_dir)[1:]
    return [statistics.median(r[part] for r in records) for part in PARTS]


def draw_time(runs: dict, results: Path):
    fig, axes = plt.subplots(1, len(TIME_CUTS), figsize=(5.5 * len(TIME_CUTS), 4.2), sharey=False)
    real = {cut: results / folder for folder, cut in REAL.items() if (results / folder / "summary.json").exists()}
    for ax, cut in zip(axes, TIME_CUTS):
        bars = {f"{m} agents": epoch_split(runs[time_job(cut, m)]) for m in (2, 3, 4)}
        if cut in real:
            bars["2 agents, real (torchrun)"] = epoch_split(real[cut])
        bottom = [0.0] * len(bars)
        for k, part in enumerate(PARTS):
            heights = [split[k] for split in bars.values()]
            ax.bar(list(bars), heights, bottom=bottom, label=part.removesuffix("_s").replace("_", " "))
            bottom = [b + h for b, h in zip(bottom, heights)]
        share = read_summary(runs[time_job(cut, 2)])["cut_share"]
        ax.set_title(f"LeNet-5 on digits, cut {cut} (agent holds {share:.1%} of the parameters)", fontsize=9)
        ax.set_ylabel("seconds per epoch (median)")
        ax.tick_params(axis="x", labelsize=8)
        ax.legend(fontsize=7)
    return fig, list(real.values())


def cuts_table(runs: dict) -> str:
    lines = ["| cut | agent's share of parameters | cut width (values/row) | "
             + " | ".join(f"{k} bytes/epoch" for k in LINKS) + " |", "|---" * (3 + len(LINKS)) + "|"]
    for cut in TABLE_CUTS:
        summary = read_summary(runs[table_job(cut)])
        record = read_rounds(runs[table_job(cut)])[1]
        lines.append(f"| {cut} | {summary['cut_share']:.1%} | {summary['cut_width']} | "
                     + " | ".join(f"{record[f'{k}_bytes']:,}" for k in LINKS) + " |")
    return "\n".join(lines) + "\n"


def main(results: str | Path = "results", out: str | Path = FIG_DIR) -> list[Path]:
    results = Path(results)
    runs = locate(RunIndex(results), jobs())
    written = []
    provenance = figure_provenance(runs.values(), root=results)
    what = ("Split learning, sequential: test accuracy and training loss per epoch, centralized (1 agent = plain "
            "SGD on the uncut network) against 2-4 agents; digits MLP, digits LeNet-5, MNIST LeNet-5")
    written += save(draw_curves(runs), out, "split_learning_curves", curves_table(runs),
                    caption=caption_line(what, provenance), provenance=provenance)
    fig, real = draw_time(runs, results)
    provenance = figure_provenance([*runs.values(), *real], root=results)
    what = ("Split learning: one epoch's time split, LeNet-5 on digits, small and large bottom, 2-4 agents simulated "
            "(package α-β per message)" + ("; real torchrun runs at 2 agents" if real else ""))
    written += save(fig, out, "split_learning_time", caption=caption_line(what, provenance), provenance=provenance)
    what = "Split learning: the agent's share of LeNet-5's parameters at each cut against the bytes of one epoch, 2 agents"
    written += save(None, out, "split_learning_cuts", cuts_table(runs), caption=caption_line(what, provenance),
                    provenance=provenance)
    return written


def cli() -> None:
    import argparse

    parser = argparse.ArgumentParser(prog=command_name(), description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="results")
    parser.add_argument("--out", default=str(FIG_DIR), help="where the files go (default results/figures)")
    parser.add_argument("--run-missing", action="store_true", help="make the missing runs in the simulator first")
    args = parser.parse_args()
    checked_out(args.out)  # before the missing runs are made
    if args.run_missing:
        ensure(jobs(), root=args.results, log=sys.stdout)
    for path in main(args.results, args.out):
        print(path)


if __name__ == "__main__":
    cli()
