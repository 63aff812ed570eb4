"""Figure: FedNL per compressor beside the Newton-type family and GD, against rounds and against uplink bits.

The plot the FedNL paper makes (Safaryan et al. 2022, its Figures 1-3): relative suboptimality
(O(w) − O*) / |O*| of each run, log y, against the round (left) and against the bits one client
has sent up so far (right).  Reads only logged runs, one directory per run under ``--results``
(each with ``rounds.jsonl`` and ``summary.json``, made by the commands in docs/federated.md);
it never trains.

Bits per client: FedNL's ``clients_uplink_bits`` (its own exact count, summed over the
participants) over the workers; any other method's ``uplink_bits``, the per-worker count of
``comm.compress`` (run it with ``comm.compress=none``: its messages whole, at 64 bits a value).

``make figures`` (`dane.paper_figs.make_all`) makes the runs `jobs` names where results/ lacks them
(``timed = False``: the figure reads rounds and bits, not times): logistic regression (λ = 1e-3, an
intercept) on a9a (``libsvm/a9a`` under ``data_dir``) where the file is, else the built-in breast_cancer
table, over `WORKERS` clients; FedNL (option 2) with none, TopK and RandK (k = 8d) beside DANE, GIANT,
DiSCO, ADMM and GD; the docs' commands make the same runs by hand.  `main` draws those runs when
``--results`` holds them (a results root), else every run directory under ``--results``.  The title and the
caption name the problem, data set (rows x features), m, λ and stop rule of the runs drawn, as their config.yaml and
summary.json record them (`paper_figs.common.setting_text`), not as `jobs` asks for them.

    dane figures fednl_bits [--results results/fednl_bits] [--out results/figures]
"""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from dane.paper_figs.blocks import NOT_RECORDED, SECOND_ORDER, SECOND_ORDER_NOTE, count
from dane.paper_figs.common import (FIG_DIR, MissingCount, cli, curve_style, positive, run_curve, run_dirs_under, save,
                                    setting_text, wrapped)
from dane.paper_figs.provenance import caption_line, figure_provenance, run_config
from dane.records.results import read_summary
from dane.synthetic.sweep import Job, RunIndex, compose_job

RESULTS = "results/fednl_bits"
TIMED = False  # `make figures`: the runs' iterates and bits matter, not their simulated times
WORKERS = 8
ROUNDS = 300
OTHERS = ("dane", "giant", "disco", "admm", "gd")
WHAT = "FedNL per compressor beside other methods: relative suboptimality against rounds and uplink bits per client"


def data_overrides() -> tuple[tuple[str, ...], int]:
    """The data's overrides and d (with the intercept): a9a where ``libsvm/a9a`` is under ``data_dir``, else the
    built-in breast_cancer table (30 features)."""
    from dane.data.table import resolve_dir  # imported here, not for --help: dane.data imports torch

    folder = resolve_dir(compose_job(("problem=logreg",))["data_dir"])
    if folder is not None and (folder / "libsvm" / "a9a").is_file():
        return ("data=libsvm", "data.path=libsvm/a9a"), 124
    return ("data=breast_cancer",), 31


def jobs() -> list[Job]:
    """The runs of the figure (module docstring), as the simulator's overrides."""
    data, d = data_overrides()
    common = ("problem=logreg", *data, "problem.lam=0.001", "problem.optimum=auto", f"workers={WORKERS}",
              f"rounds={ROUNDS}", "tol=1e-12", "tol_abs=null")  # the simulator's 1e-10 floor would stop them first
    fednl = [("algorithm=fednl", "algorithm.option=2", f"algorithm.compressor={c}", *common)
             for c in ("none", f"topk:{8 * d}", f"randk:{8 * d}")]
    return fednl + [(f"algorithm={name}", "comm.compress=none", *common) for name in OTHERS]


class NoBits(MissingCount):
    """A run whose records count no uplink bits."""


def label(run_dir: Path) -> str:
    """The legend entry: the algorithm the run's ``config.yaml`` names, FedNL with its compressor and another by
    the display name its summary.json records (`dane.algorithm.label_of_run`: its class's ``label``, one's own
    class's too), a command's or `dane.fit`'s; a run without a config.yaml goes by its directory's name."""
    from dane.algorithm import label_of_run  # imported here, not for --help: the classes import torch

    algorithm = run_config(run_dir).get("algorithm")
    if not algorithm:
        return run_dir.name
    if algorithm["name"] == "fednl":
        return f"FedNL ({algorithm.get('compressor', 'none')})"
    return label_of_run(read_summary(run_dir), algorithm["name"])


def curve(run_dir: Path) -> dict:
    """rounds, bits per client and relative suboptimality of one run, and the counts `table` gives (`run_curve`); an
    uplink count it lacks is `NoBits`."""
    return run_curve(run_dir, label(run_dir), error=NoBits)


def title(run_dirs: list[Path]) -> str:
    """The figure's title and caption: what it shows, then the runs' problem, data, m, λ and stop rule as their
    summaries and configs record them (`setting_text`), whichever runs it was drawn from."""
    return f"{WHAT}\n{setting_text(run_dirs)}"


def draw(curves: list[dict], heading: str | None = None):
    fig, (by_round, by_bits) = plt.subplots(1, 2, figsize=(10, 4.4), sharey=True)
    if heading:
        fig.suptitle(wrapped(heading, 10), fontsize=10)
    for k, c in enumerate(curves):  # each run its colour and marker (`curve_style`); FedNL solid, the others dashed
        style = {**curve_style(k), "linestyle": "-" if c["label"].startswith("FedNL") else "--", "markersize": 3,
                 "markevery": max(1, len(c["rounds"]) // 25), "label": c["label"]}
        by_round.plot(c["rounds"], positive(c["relative"], ax=by_round), **style)
        by_bits.plot(c["bits"], positive(c["relative"], ax=by_bits), **style)
    by_round.set_xlabel("round")
    by_bits.set_xlabel("uplink bits per client")
    by_bits.set_xscale("log")
    by_round.set_ylabel("relative suboptimality (O(w) − O*) / |O*|")
    for ax in (by_round, by_bits):
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
    by_bits.legend(fontsize=8)
    return fig


def main(results: str | Path = RESULTS, out: str | Path = FIG_DIR) -> list[Path]:
    index = RunIndex(results)
    found = index.find_all(jobs(), timed=False)
    run_dirs = found if found else run_dirs_under(results, "make them with the commands in docs/federated.md (FedNL)")
    curves = [curve(d) for d in run_dirs]
    provenance = figure_provenance(run_dirs, results)
    heading = title(run_dirs)
    caption = caption_line(heading.replace("\n", "; "), provenance)
    return save(draw(curves, heading), out, "fednl_bits", table(curves), caption=caption,
                provenance=provenance)


def table(curves: list[dict]) -> str:
    """Per run (its `curve`), what it spent by its last record, per client: rounds, bits up and down, local passes and
    `SECOND_ORDER` work (—: not counted by its records), and its last relative suboptimality; the figure draws
    rounds and uplink bits, the paper's axes, and the table gives the costs beside them, so that no method is ranked
    on one of them alone."""
    names = ("rounds", "uplink bits per client", "downlink bits per client", "local passes per client",
             *(f"{name} per client" for name in SECOND_ORDER.values()))
    rows = [f"By each run's last record; {SECOND_ORDER_NOTE}; —: {NOT_RECORDED}, or a downlink its records do not "
            "count.", "", "| run | " + " | ".join(names) + " | last relative suboptimality |",
            "|---|" + "---|" * (len(names) + 1)]
    for c in curves:
        counts = [c["downlink"], c["passes"], *(c[key] for key in SECOND_ORDER)]
        cells = [str(c["rounds"][-1]), f"{c['bits'][-1]:.4g}", *(count(None if x is None else x[-1], ".4g")
                                                                  for x in counts)]
        rows.append(f"| {c['label']} | {' | '.join(cells)} | {c['relative'][-1]:.3g} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    cli(main, __doc__, RESULTS)
