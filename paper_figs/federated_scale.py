"""Figure: the in-process simulator at federated scale, time per round and peak memory against m.

From the ``load.federated_scale`` key of results/bench.json that ``scripts/bench_load.py``
writes (``make bench``): safeguarded DANE on the synthetic ridge, N = 100,000 rows, d = 500,
m simulated workers as m threads of one process, each point a fresh process.

- left: the rounds' wall time per round (the m workers' compute and the threads'
  collectives, all on this machine's cores; median over the repeats, bars from the
  fastest to the slowest), and the rest of the launch (imports, the m shards built one
  after another, the process's exit);
- right: the process's peak resident memory, with this machine's memory as a line.

Each point is marked with its local-solve path: the d x d Cholesky factor while a worker
holds n_i ≥ d rows, the Woodbury identity's n_i x n_i one below (`dane.problems.ridge`).

    dane figures federated_scale [--results results] [--out results/figures]
"""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt

from dane.paper_figs.common import FIG_DIR, cli, save

KEY, SECTION = "load", "federated_scale"
MACHINE_GIB = 24  # these machines' memory (docs/design.md, "The machines")
MARKERS = {"woodbury": "o", "cholesky": "s"}


class MissingScale(FileNotFoundError):
    def __init__(self, path: Path):
        super().__init__(f"{path} has no '{KEY}.{SECTION}' key; run `make bench` (scripts/bench_load.py) first")


def load(results: str | Path) -> tuple[dict, dict]:
    """(the federated_scale section, the whole load section) of results/bench.json."""
    path = Path(results) / "bench.json"
    report = json.loads(path.read_text()) if path.exists() else {}
    section = report.get(KEY, {})
    if SECTION not in section:
        raise MissingScale(path)
    return section[SECTION], section


def finished(scale: dict) -> list[tuple[int, dict]]:
    return sorted((int(m), p) for m, p in scale["points"].items() if p.get("finished") and "wall_round_s" in p)


def draw(scale: dict):
    points = finished(scale)
    ms = [m for m, _ in points]
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.6))
    for key, color, label in (("wall_round_s", "C0", "the rounds: wall time per round"),
                              ("outside_rounds_s", "C2", "the rest of the launch: imports, m shards built, exit")):
        mid = [p[key] for _, p in points]
        err = [[p[key] - p[f"{key}_min"] for _, p in points], [p[f"{key}_max"] - p[key] for _, p in points]]
        ax_t.errorbar(ms, mid, yerr=err, fmt="-", color=color, capsize=3, label=label)
        mark(ax_t, points, key, color)
    ax_m.plot(ms, [p["peak_rss_gib"] for _, p in points], "-", color="C3", label="peak resident memory")
    mark(ax_m, points, "peak_rss_gib", "C3")
    ax_m.axhline(MACHINE_GIB, color="k", linestyle="--", linewidth=1, label=f"this machine's memory ({MACHINE_GIB} GiB)")
    for path, marker in MARKERS.items():
        for ax in (ax_t, ax_m):
            ax.plot([], [], marker, color="grey", linestyle="none", label=f"local solve: {path}")
    for m, p in scale["points"].items():
        if not p.get("finished"):
            ax_t.annotate(f"m={int(m):,}: not finished", xy=(int(m), 0.1), xycoords=("data", "axes fraction"),
                          ha="right", fontsize=7)
    every_m = sorted(int(m) for m in scale["points"])
    for ax in (ax_t, ax_m):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(every_m, [f"{m:,}" for m in every_m])
        ax.minorticks_off()
        ax.set_xlabel(f"simulated workers m (threads of one process; N = {scale['n_samples']:,}, d = {scale['dim']})")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    ax_t.set_ylabel("wall time (s)")
    ax_t.set_title(f"time, {scale['rounds']} rounds (median of repeats, min-max bars)", fontsize=9)
    ax_m.set_ylabel("peak resident memory (GiB)")
    ax_m.set_title("memory: ru_maxrss of the run's own process", fontsize=9)
    fig.suptitle("Safeguarded DANE in the simulator, synthetic ridge: wall time and memory against workers",
                 fontsize=10)
    return fig


def mark(ax, points: list[tuple[int, dict]], key: str, color: str) -> None:
    """Each point's marker says its local-solve path."""
    for path, marker in MARKERS.items():
        chosen = [(m, p[key]) for m, p in points if p["local_solve"] == path]
        if chosen:
            ax.plot(*zip(*chosen), marker, color=color, linestyle="none", markersize=5)


def markdown(scale: dict) -> str:
    lines = [f"`{scale['problem']}` (results/bench.json `{KEY}.{SECTION}`)", "",
             "| m | rows per worker | local solve | wall per round (s) [min, max] | rest of the launch (s) | "
             "simulated per round (s) | peak RSS (GiB) | repeats | load (1 min) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for m, p in sorted((int(m), p) for m, p in scale["points"].items()):
        if "wall_round_s" not in p:
            lines.append(f"| {m:,} | {p['rows_per_worker']} | {p['local_solve']} | not finished | | | | "
                         f"{p['repeats']} | {p['load_1min']} |")
            continue
        lines.append(f"| {m:,} | {p['rows_per_worker']} | {p['local_solve']} | {p['wall_round_s']:.3g} "
                     f"[{p['wall_round_s_min']:.3g}, {p['wall_round_s_max']:.3g}] | {p['outside_rounds_s']:.3g} | "
                     f"{p.get('round_s', float('nan')):.3g} | {p['peak_rss_gib']:.2f} | {p['repeats']} | "
                     f"{p['load_1min']} |")
    return "\n".join(lines) + "\n"


def provenance(scale: dict, section: dict) -> dict:
    """The sidecar: where the numbers came from (the bench run's time, machine and load) and the command."""
    loads = [x for p in scale["points"].values() for x in p["load_1min"]]
    return {"source": f"results/bench.json {KEY}.{SECTION}", "command": "python -m scripts.bench load (make bench)",
            "problem": scale["problem"], "started_at": section.get("started_at"),
            "finished_at": section.get("finished_at"), "machine": section.get("machine"),
            "load_avg_1min": [min(loads), max(loads)] if loads else None,
            "points": {m: {k: p.get(k) for k in ("rows_per_worker", "local_solve", "repeats", "finished")}
                       for m, p in scale["points"].items()}}


def main(results: str | Path = "results", out: str | Path = FIG_DIR) -> list[Path]:
    scale, section = load(results)
    sidecar = provenance(scale, section)
    caption = (f"The simulator at federated scale: wall time per round and peak memory against m, "
               f"{scale['problem']}; bench run {sidecar['started_at']}; load avg (1 min) "
               f"{sidecar['load_avg_1min']}.")
    return save(draw(scale), out, "federated_scale", markdown(scale), caption=caption, provenance=sidecar)


if __name__ == "__main__":
    cli(main, __doc__)
