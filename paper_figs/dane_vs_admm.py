"""The source paper's Figure 8: test loss of DANE against ADMM over iterations on MNIST.

LeNet-5 on MNIST, 4 simulated workers, one pass over each worker's shard per round for
both methods (``conf/experiment/target_mnist_lenet5.yaml``, the runs the target table
also reads).  Plain DANE (η=1, μ=0, as in the paper); ADMM with adaptive ρ (residual
balancing, its default) started from each ρ of ``ADMM_RHOS``, the best of them (lowest
final test loss) drawn solid and the others thin, so the figure shows what the tuning
chose and what it chose from.  The reference line is the test loss of a centrally
trained model: the same local solver on one worker holding every training row, for the
same number of epochs.  The caption names the data the runs used (on a machine with
only MNIST's t10k files, a seeded split of those 10,000 images, not the paper's 60k/10k).

    dane simulate experiment=target_mnist_lenet5 algorithm=admm algorithm.rho=0.1   # one run
    dane figures dane_vs_admm [--results results] [--out results/figures]
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt

from dane.records.results import read_rounds, read_summary
from dane.paper_figs.accuracy_table import Row, data_caption, find_run, has_data
from dane.paper_figs.common import FIG_DIR, cli, save
from dane.paper_figs.provenance import caption_line, figure_provenance
from dane.synthetic.sweep import Job, RunIndex

PROBLEM = "mnist_lenet5"
BASE = ("experiment=target_mnist_lenet5",)
ADMM_RHOS = (0.1, 0.3, 1.0, 3.0, 10.0)  # the tuning grid: every start is drawn, the best solid
DANE = ("algorithm=dane", "algorithm.safeguard=false")
CENTRAL = (*DANE, "workers=1")  # one worker, all rows: the local solve is plain minibatch SGD over the data


def admm_job(rho: float) -> Job:
    return (*BASE, "algorithm=admm", f"algorithm.rho={rho}")


def jobs() -> list[Job]:
    if not has_data(Row(PROBLEM, PROBLEM, None)):
        return []
    return [(*BASE, *DANE), (*BASE, *CENTRAL), *(admm_job(rho) for rho in ADMM_RHOS)]


def curve(run: Path) -> dict:
    records = read_rounds(run)
    return {"round": [r["round"] for r in records], "test_loss": [r.get("test_loss") for r in records],
            "test_accuracy": [r.get("test_accuracy") for r in records], "run": str(run),
            "status": read_summary(run)["status"], "data": read_summary(run).get("data")}


def final_loss(c: dict) -> float:
    value = c["test_loss"][-1] if c["test_loss"] else None
    return value if value is not None and math.isfinite(value) else math.inf


def collect(index: RunIndex) -> dict | None:
    """{"dane", "central": curve, "admm": {ρ: curve}, "best_rho": ρ}; None when a run is missing."""
    runs = {job: find_run(index, job) for job in jobs()}
    if not runs or any(path is None for path in runs.values()):
        return None
    admm = {rho: curve(runs[admm_job(rho)]) for rho in ADMM_RHOS}
    return {"dane": curve(runs[(*BASE, *DANE)]), "central": curve(runs[(*BASE, *CENTRAL)]), "admm": admm,
            "best_rho": min(ADMM_RHOS, key=lambda rho: final_loss(admm[rho]))}


def draw(data: dict):
    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    best = data["best_rho"]
    for ax, key in ((loss_ax, "test_loss"), (acc_ax, "test_accuracy")):
        dane = data["dane"]
        ax.plot(dane["round"], dane[key], "o-", color="C0", markersize=3, label="DANE (η=1, μ=0), 4 workers")
        for rho, c in data["admm"].items():
            if rho == best:
                ax.plot(c["round"], c[key], "^-", color="C3", markersize=3,
                        label=f"ADMM, adaptive ρ from {rho:g} (best final test loss)")
            else:
                ax.plot(c["round"], c[key], "--", color="C3", alpha=0.35, linewidth=1,
                        label=f"ADMM, adaptive ρ from {rho:g}")
        reference = data["central"][key][-1]
        ax.axhline(reference, color="k", linestyle=":", linewidth=1.2,
                   label=f"central training, 1 worker, {data['central']['round'][-1]} epochs")
        ax.set_xlabel("iterations (communication rounds)")
        ax.grid(True, alpha=0.3)
    loss_ax.set_ylabel("test loss (cross-entropy)")
    loss_ax.set_yscale("log")
    acc_ax.set_ylabel("test accuracy")
    acc_ax.set_ylim(0.0, 1.0)
    loss_ax.legend(fontsize=7)
    fig.suptitle("MNIST LeNet-5: DANE against ADMM (the paper's Figure 8); each round one pass over each shard",
                 fontsize=10)
    return fig


def markdown(data: dict) -> str:
    lines = ["| method | final test loss | final test accuracy | rounds | status |", "|---|---|---|---|---|"]
    rows = [("DANE", data["dane"]), ("central (1 worker)", data["central"])]
    rows += [(f"ADMM, adaptive ρ from {rho:g}" + (" (best)" if rho == data["best_rho"] else ""), c)
             for rho, c in data["admm"].items()]
    for label, c in rows:
        loss, acc = c["test_loss"][-1], c["test_accuracy"][-1]
        lines.append(f"| {label} | {loss:.4f} | {acc:.4f} | {c['round'][-1]} | {c['status']} |" if loss is not None
                     else f"| {label} | — | — | {c['round'][-1]} | {c['status']} |")
    return "\n".join(lines) + "\n"


def main(results: str | Path = "results", out: str | Path = FIG_DIR) -> list[Path]:
    data = collect(RunIndex(results))
    if data is None:
        return []  # make_all reports the missing neural-network runs; `make tables` makes them
    curves = [data["dane"], data["central"], *data["admm"].values()]
    sizes = {"MNIST-LeNet5": {"data": [data["dane"]["data"]] if data["dane"]["data"] else []}}
    provenance = figure_provenance([c["run"] for c in curves], root=results, best_admm_rho=data["best_rho"],
                                   data=sizes)
    caption = caption_line("Test loss and accuracy against iterations, DANE and ADMM (adaptive ρ, best start of "
                           f"{', '.join(map(str, ADMM_RHOS))}), 4 simulated workers, central training as reference; "
                           f"data: {data_caption(sizes) or 'unknown'} (paper: 60,000/10,000)", provenance)
    return save(draw(data), out, "dane_vs_admm", markdown(data), caption=caption, provenance=provenance)


if __name__ == "__main__":
    cli(main, __doc__)
