"""Figure: relative suboptimality against rounds, uplink bits per client and local passes per client, side by side.

The three costs a federated comparison weighs (issue 45: rounds alone favour the methods that compute most
per round): each run's relative suboptimality (O(w) − O*) / |O*|, log y, against the round (left), the bits one
client has sent up so far (middle) and the gradient passes one client has made so far (right: the records'
``local_passes``, summed over the clients, `dane.work`, over the workers).  The table beside it gives each run's
rounds, bits and passes to `TARGET`.  Reads only logged runs, one directory per run under ``--results`` (each
with ``rounds.jsonl`` and ``summary.json``); it never trains.

Bits per client: FedNL's ``clients_uplink_bits``; a federated method's ``uplink_bytes`` (its participants'
uploads) times 8; else ``comm.compress``'s per-worker ``uplink_bits`` (run the method with
``comm.compress=none``); each summed count over the workers.

``make figures`` (`dane.paper_figs.make_all`) makes the runs `jobs` names where results/ lacks them (``TIMED =
False``): logistic regression (λ = 1e-3, an intercept) on the built-in breast_cancer table over `WORKERS`
clients, every client each round, the methods of `METHODS` at their defaults.  `main` draws those runs when
``--results`` holds them (a results root), else every run directory under ``--results``.  The title and the
caption name the problem, data set (rows x features), m, λ and stop rule of the runs drawn, as their config.yaml and
summary.json record them (`paper_figs.common.setting_text`), and the table's target.

    dane figures local_work [--results results/local_work] [--out results/figures]
"""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from dane.paper_figs.common import MissingCount  # noqa: F401  what `curve` raises (`run_curve`), named here too
from dane.paper_figs.common import (FIG_DIR, caption_line, cli, figure_provenance, positive, run_config, run_curve,
                                    run_dirs_under, save, setting_text, wrapped)
from dane.records.results import read_summary
from dane.synthetic.sweep import Job, RunIndex

RESULTS = "results/local_work"
TIMED = False  # `make figures`: the runs' iterates, bits and passes matter, not their simulated times
WORKERS = 8
ROUNDS = 200
TARGET = 1e-8
#: (method, its overrides): those that count no participants' bytes send their messages through comm.compress=none
METHODS = (("gd", ("comm.compress=none",)), ("dane", ("comm.compress=none",)), ("giant", ("comm.compress=none",)),
           ("fednl", ("algorithm.option=2",)), ("sdane", ()), ("scaffold", ()), ("scaffnew", ()))


def jobs() -> list[Job]:
    """The runs of the figure (module docstring), as the simulator's overrides."""
    common = ("problem=logreg", "data=breast_cancer", "problem.lam=0.001", "problem.optimum=auto",
              f"workers={WORKERS}", f"rounds={ROUNDS}", "tol=1e-10")
    return [(f"algorithm={name}", *extra, *common) for name, extra in METHODS]


def label(run_dir: Path) -> str:
    """The display name of the algorithm the run's ``config.yaml`` names, as its summary.json records it
    (`dane.algorithm.label_of_run`: its class's ``label``, one's own class's too); a run without a config (`dane.fit`)
    goes by its directory."""
    from dane.algorithm import label_of_run  # imported here, not for --help: the classes import torch

    algorithm = run_config(run_dir).get("algorithm")
    return label_of_run(read_summary(run_dir), algorithm["name"]) if algorithm else run_dir.name


def curve(run_dir: Path) -> dict:
    """rounds, uplink bits and local passes per client, and relative suboptimality, of one run (`run_curve`)."""
    return run_curve(run_dir, label(run_dir), passes=True)


def to_target(c: dict, target: float = TARGET) -> tuple[int, float, float] | None:
    """(rounds, bits per client, passes per client) at the first record within ``target``; None if none is."""
    for k, value in enumerate(c["relative"]):
        if value <= target:
            return c["rounds"][k], c["bits"][k], c["passes"][k]
    return None


WHAT = "Relative suboptimality against rounds, uplink bits per client and local gradient passes per client"


def title(run_dirs: list[Path], target: float = TARGET) -> str:
    """The figure's title and caption: what it shows, then the runs' problem, data, m, λ and stop rule as their
    summaries and configs record them (`setting_text`), whichever runs it was drawn from, and the table's target."""
    return f"{WHAT}\n{setting_text(run_dirs)}; the table: cost to {target:g} relative"


def draw(curves: list[dict], heading: str | None = None):
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.4), sharey=True)
    if heading:
        fig.suptitle(wrapped(heading, 14), fontsize=10)
    for c in curves:
        for ax, x in zip(axes, ("rounds", "bits", "passes")):
            ax.plot(c[x], positive(c["relative"]), label=c["label"])
    for ax, text in zip(axes, ("round", "uplink bits per client", "local gradient passes per client")):
        ax.set_xlabel(text)
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
    axes[1].set_xscale("symlog", linthresh=1.0)  # round 0 sends nothing: 0 on the axis, then decades
    axes[1].set_xlim(left=0)
    axes[0].set_ylabel("relative suboptimality (O(w) − O*) / |O*|")
    axes[2].legend(fontsize=8)
    return fig


def table(curves: list[dict], target: float = TARGET) -> str:
    rows = [f"| run | rounds to {target:g} | uplink bits per client to {target:g} | local passes per client to "
            f"{target:g} | last relative suboptimality |", "|---|---|---|---|---|"]
    for c in curves:
        reached = to_target(c, target)
        cells = ("—", "—", "—") if reached is None else (f"{reached[0]}", f"{reached[1]:.4g}", f"{reached[2]:.4g}")
        rows.append(f"| {c['label']} | {' | '.join(cells)} | {c['relative'][-1]:.3g} |")
    return "\n".join(rows) + "\n"


def main(results: str | Path = RESULTS, out: str | Path = FIG_DIR) -> list[Path]:
    index = RunIndex(results)
    found = index.find_all(jobs(), timed=False)
    run_dirs = found if found else run_dirs_under(
        results, f"make them with dane figures make_all or `dane train ... out_dir={results}/NAME` (problem.optimum=auto)")
    curves = [curve(d) for d in run_dirs]
    provenance = figure_provenance(run_dirs, results)
    heading = title(run_dirs)
    caption = caption_line(heading.replace("\n", "; "), provenance)
    return save(draw(curves, heading), out, "local_work", table(curves), caption=caption, provenance=provenance)


if __name__ == "__main__":
    cli(main, __doc__, RESULTS)
