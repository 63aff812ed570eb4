"""Figure: FedNL per compressor beside the Newton-type family and GD, against rounds and against uplink bits.

The plot the FedNL paper makes (Safaryan et al. 2022, its Figures 1-3): relative suboptimality
(O(w) − O*) / |O*| of each run, log y, against the round (left) and against the bits one client
has sent up so far (right).  Reads only logged runs, one directory per run under ``--results``
(each with ``rounds.jsonl`` and ``summary.json``, made by the commands in docs/federated.md);
it never trains.

Bits per client: FedNL's ``clients_uplink_bits`` (its own exact count, summed over the
participants) over the workers; any other method's ``uplink_bits``, the per-worker count of
``comm.compress`` (run it with ``comm.compress=none``: its messages whole, at 64 bits a value).

    dane figures fednl_bits [--results results/fednl_bits] [--out results/figures]
"""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

from dane.results import read_rounds, read_summary
from dane.paper_figs.common import FIG_DIR, caption_line, figure_provenance, positive, run_config, save

RESULTS = "results/fednl_bits"


class NoBits(ValueError):
    """A run whose records count no uplink bits."""


def label(run_dir: Path) -> str:
    """The legend entry: the algorithm, and FedNL's compressor, from the run's ``config.yaml``; a run without
    one (made by `dane.fit`) goes by its directory's name."""
    algorithm = run_config(run_dir).get("algorithm")
    if not algorithm:
        return run_dir.name
    return f"FedNL ({algorithm.get('compressor', 'none')})" if algorithm["name"] == "fednl" else algorithm["name"]


def curve(run_dir: Path) -> dict:
    """rounds, bits per client and relative suboptimality of one run."""
    records, workers = read_rounds(run_dir), read_summary(run_dir)["workers"]
    if not records or "suboptimality" not in records[0]:
        raise NoBits(f"{run_dir}: its records have no suboptimality; run it with problem.optimum=auto")
    if "clients_uplink_bits" in records[0]:
        bits = [r["clients_uplink_bits"] / workers for r in records]
    elif "uplink_bits" in records[0]:
        bits = [r["uplink_bits"] for r in records]
    else:
        raise NoBits(f"{run_dir}: its records count no uplink bits; run it with comm.compress=none")
    optimum = abs(records[0]["objective"] - records[0]["suboptimality"])
    return {"label": label(run_dir), "rounds": [r["round"] for r in records], "bits": bits,
            "relative": [r["suboptimality"] / optimum for r in records]}


def runs_under(results: str | Path) -> list[Path]:
    root = Path(results)
    found = sorted(p.parent for p in root.glob("*/rounds.jsonl"))
    if not found:
        raise FileNotFoundError(f"no runs under {root}; make them with the commands in docs/federated.md (FedNL)")
    return found


def draw(curves: list[dict]):
    fig, (by_round, by_bits) = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for c in curves:
        style = "-" if c["label"].startswith("FedNL") else "--"
        by_round.plot(c["rounds"], positive(c["relative"]), style, label=c["label"])
        by_bits.plot(c["bits"], positive(c["relative"]), style, label=c["label"])
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
    run_dirs = runs_under(results)
    curves = [curve(d) for d in run_dirs]
    provenance = figure_provenance(run_dirs, results)
    caption = caption_line("FedNL per compressor beside other methods: relative suboptimality against rounds and "
                           "uplink bits per client", provenance)
    rows = ["| run | rounds | uplink bits per client | last relative suboptimality |", "|---|---|---|---|"]
    rows += [f"| {c['label']} | {c['rounds'][-1]} | {c['bits'][-1]:.4g} | {c['relative'][-1]:.3g} |" for c in curves]
    return save(draw(curves), out, "fednl_bits", "\n".join(rows) + "\n", caption=caption, provenance=provenance)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=RESULTS)
    parser.add_argument("--out", default=str(FIG_DIR), help="where the files go (default results/figures)")
    args = parser.parse_args()
    for path in main(args.results, args.out):
        print(path)
