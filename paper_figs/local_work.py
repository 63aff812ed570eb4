"""Figure: relative suboptimality against rounds, uplink and downlink bits per client and local passes per client.

The costs a federated comparison weighs (rounds alone favour the methods that compute most per round):
each run's relative suboptimality (O(w) − O*) / |O*|, log y, against the round, the bits one client has sent up
so far, the bits it has received so far, and the gradient passes one client has made so far (the records'
``local_passes``, summed over the clients, `dane.work`, over the workers).  The passes panel counts gradient passes
only; the table beside it gives each run's rounds, bits up and down, passes and second-order work (HVPs, Hessians,
factorizations per client: `paper_figs.blocks.SECOND_ORDER`) to `TARGET` relative suboptimality, as its headers say
(``dane figures summary``'s ``--tol`` is absolute), so that no method is ranked on its passes alone, and for a run
that never reached it, why its cells are — (`why_not`: its status and the round it stopped at, the round cap where it
ran to it).  Reads only logged runs, one directory per run under ``--results`` (each
with ``rounds.jsonl`` and ``summary.json``); it never trains.

Bits per client: FedNL's ``clients_uplink_bits``; a federated method's ``uplink_bytes`` (its participants'
uploads) times 8; else ``comm.compress``'s per-worker ``uplink_bits`` (run the method with
``comm.compress=none``); each summed count over the workers.  Downlink the same way (FedNL-BC's
``clients_downlink_bits``, ``downlink_bytes``, ``downlink_bits``); a run that counts none draws no downlink line.

``make figures`` (`dane.paper_figs.make_all`) makes the runs `jobs` names where results/ lacks them (``TIMED =
False``): logistic regression (λ = 1e-3, an intercept) on the built-in breast_cancer table over `WORKERS`
clients, every client each round, the methods of `METHODS` at their defaults.  `main` draws those runs when
``--results`` holds them (a results root), else every run directory under ``--results``.  The title and the
caption name the problem, data set (rows x features), m, λ and stop rule of the runs drawn, as their config.yaml and
summary.json record them (`paper_figs.common.setting_text`), and the table's target.  A row and its legend entry
are the run's method (`label`); runs of one method add what differs between their configs (`labels`).

    dane figures local_work [--results results/local_work] [--out results/figures]
"""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from dane.paper_figs.blocks import NOT_RECORDED, SECOND_ORDER, SECOND_ORDER_NOTE, count
from dane.paper_figs.common import MissingCount  # noqa: F401  what `curve` raises (`run_curve`), named here too
from dane.paper_figs.common import (FIG_DIR, cli, curve_style, positive, run_curve, run_dirs_under, save, setting_text,
                                    wrapped)
from dane.paper_figs.plot_runs import labels_for
from dane.paper_figs.provenance import caption_line, figure_provenance, run_config
from dane.paper_figs.summary import stopped_at
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
    (`dane.algorithm.label_of_run`: its class's ``label``, one's own class's too), a command's or `dane.fit`'s; a run
    without a config.yaml goes by its directory."""
    from dane.algorithm import label_of_run  # imported here, not for --help: the classes import torch

    algorithm = run_config(run_dir).get("algorithm")
    return label_of_run(read_summary(run_dir), algorithm["name"]) if algorithm else run_dir.name


def labels(run_dirs: list[Path]) -> list[str]:
    """Each run's `label`; runs that share one (a sweep of one method) add what differs between their configs, as
    `dane figures plot_runs` names runs (`paper_figs.plot_runs.labels_for`: "GD (algorithm.lr=0.5, workers=2)")."""
    names = [label(d) for d in run_dirs]
    out = list(names)
    for name in set(names):
        shared = [k for k, other in enumerate(names) if other == name]
        if len(shared) > 1:
            group = [run_dirs[k] for k in shared]
            for k, differs in zip(shared, labels_for(group, [run_config(d) for d in group])):
                out[k] = f"{name} ({differs})"
    return out


def curve(run_dir: Path, name: str | None = None) -> dict:
    """rounds, uplink bits and local passes per client, and relative suboptimality, of one run (`run_curve`), under
    ``name`` (default its `label`)."""
    return run_curve(run_dir, label(run_dir) if name is None else name, passes=True)


def first_within(c: dict, target: float = TARGET) -> int | None:
    """The index of the first record within ``target``; None if none is."""
    return next((k for k, value in enumerate(c["relative"]) if value <= target), None)


def to_target(c: dict, target: float = TARGET) -> tuple[int, float, float] | None:
    """(rounds, bits per client, passes per client) at the first record within ``target``; None if none is."""
    k = first_within(c, target)
    return None if k is None else (c["rounds"][k], c["bits"][k], c["passes"][k])


def why_not(c: dict, target: float = TARGET) -> str:
    """Why a run's cells are —: it stopped (its summary's status; ``max_rounds``: the round cap it ran to) at its last
    record's round without a record within ``target``."""
    status, last = c.get("status"), c["rounds"][-1]
    if status == "max_rounds":
        return f"not within {target:g} relative by its round cap, {last}"
    return f"not within {target:g} relative: {stopped_at(last, status)}"


WHAT = ("Relative suboptimality against rounds, uplink and downlink bits per client and local gradient passes per "
        "client (passes only: the table has the HVPs, Hessians and factorizations)")


def title(run_dirs: list[Path], target: float = TARGET) -> str:
    """The figure's title and caption: what it shows, then the runs' problem, data, m, λ and stop rule as their
    summaries and configs record them (`setting_text`), whichever runs it was drawn from, and the table's target."""
    return f"{WHAT}\n{setting_text(run_dirs)}; the table: cost to {target:g} relative"


#: the panels: the curve's key and its axis label
PANELS = (("rounds", "round"), ("bits", "uplink bits per client"), ("downlink", "downlink bits per client"),
          ("passes", "local gradient passes per client (passes only)"))


def draw(curves: list[dict], heading: str | None = None):
    fig, axes = plt.subplots(1, len(PANELS), figsize=(18, 4.4), sharey=True)
    if heading:
        fig.suptitle(wrapped(heading, 18), fontsize=10)
    for k, c in enumerate(curves):
        for ax, (x, _) in zip(axes, PANELS):
            if c.get(x) is not None:  # a run that counts no downlink draws no line there
                ax.plot(c[x], positive(c["relative"], ax=ax), label=c["label"], markersize=3,
                        markevery=max(1, len(c[x]) // 25), **curve_style(k))
    for ax, (_, text) in zip(axes, PANELS):
        ax.set_xlabel(text)
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
    for ax in axes[1:3]:
        ax.set_xscale("symlog", linthresh=1.0)  # round 0 sends nothing: 0 on the axis, then decades
        ax.set_xlim(left=0)
    axes[0].set_ylabel("relative suboptimality (O(w) − O*) / |O*|")
    axes[-1].legend(fontsize=8)
    return fig


def table(curves: list[dict], target: float = TARGET) -> str:
    """Per run, its rounds, bits up and down, passes and `SECOND_ORDER` work per client to ``target`` (a count its
    records lack: —, `NOT_RECORDED`), its last relative suboptimality, and for a run that never reached ``target``
    why its cells are — (`why_not`).  ``target`` is relative suboptimality (O(w) − O*) / |O*|, as every header says
    ("rounds to 1e-08 relative"): `dane figures summary`'s ``--tol`` is absolute."""
    names = ("rounds", "uplink bits", "downlink bits", "local passes", *SECOND_ORDER.values())
    rows = [f"{SECOND_ORDER_NOTE}, per client; —: {NOT_RECORDED}, or the run never reached {target:g} relative "
            "suboptimality (O(w) − O*) / |O*| (its last column says why).", "",
            "| run | " + " | ".join(f"{name} to {target:g} relative" for name in names)
            + " | last relative suboptimality | — because |", "|---|" + "---|" * (len(names) + 2)]
    for c in curves:
        k = first_within(c, target)
        if k is None:
            cells, why = ["—"] * len(names), why_not(c, target)
        else:
            counts = [c["bits"], c.get("downlink"), c["passes"], *(c.get(key) for key in SECOND_ORDER)]
            cells, why = [str(c["rounds"][k]), *(count(None if x is None else x[k], ".4g") for x in counts)], ""
        rows.append(f"| {c['label']} | {' | '.join(cells)} | {c['relative'][-1]:.3g} | {why} |")
    return "\n".join(rows) + "\n"


def main(results: str | Path = RESULTS, out: str | Path = FIG_DIR) -> list[Path]:
    index = RunIndex(results)
    found = index.find_all(jobs(), timed=False)
    run_dirs = found if found else run_dirs_under(
        results, f"make them with dane figures make_all or `dane train ... out_dir={results}/NAME` (problem.optimum=auto)")
    curves = [curve(d, name) for d, name in zip(run_dirs, labels(run_dirs))]
    provenance = figure_provenance(run_dirs, results)
    heading = title(run_dirs)
    caption = caption_line(heading.replace("\n", "; "), provenance)
    return save(draw(curves, heading), out, "local_work", table(curves), caption=caption, provenance=provenance)


if __name__ == "__main__":
    cli(main, __doc__, RESULTS)
