"""Figure: dane's FedAvg beside Flower, pfl and a plain NumPy loop at 100 to 100,000 clients.

From the ``federated_scale`` key of results/bench.json that ``scripts/bench_federated_scale.py``
writes (``make bench``): FedAvg, 10 full-batch local gradient steps, L2-regularised logistic
regression, the same seeded shards fed to every framework, each run a fresh process tree.

- left: seconds per round, the median of rounds 2..R (round 1, where a framework starts its
  workers, apart), bars from the fastest to the slowest such round;
- right: the peak memory of the run's whole process tree (summed PSS, or the largest
  process's resident set where that is larger), with the 4 GiB goal of the 100,000-client
  setting as a line.

The table beside it gives each run's final objective against the NumPy loop's and the
section's goals (dane at most 0.5x pfl's and 5x the NumPy loop's seconds per round).

    dane figures federated_scale [--results results] [--out results/figures]
"""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt

from dane.paper_figs.common import FIG_DIR, cli, save

KEY = "federated_scale"
FRAMEWORKS = ("dane", "flower", "pfl", "numpy")
MEMORY_GOAL_GIB = 4


class MissingScale(FileNotFoundError):
    def __init__(self, path: Path):
        super().__init__(f"{path} has no '{KEY}' key; run `make bench` (scripts/bench_federated_scale.py) first")


def load(results: str | Path) -> dict:
    """The federated_scale section of results/bench.json."""
    path = Path(results) / "bench.json"
    report = json.loads(path.read_text()) if path.exists() else {}
    if KEY not in report:
        raise MissingScale(path)
    return report[KEY]


def draw(section: dict):
    settings = list(section["settings"])
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.6))
    width = 0.8 / len(FRAMEWORKS)
    for k, framework in enumerate(FRAMEWORKS):
        rows = [(i, section["settings"][s]["frameworks"].get(framework, {})) for i, s in enumerate(settings)]
        done = [(i + (k - 1.5) * width, r) for i, r in rows if "round_s" in r]
        if not done:
            continue
        xs = [x for x, _ in done]
        err = [[r["round_s"] - r["round_s_min"] for _, r in done], [r["round_s_max"] - r["round_s"] for _, r in done]]
        ax_t.bar(xs, [r["round_s"] for _, r in done], width, yerr=err, capsize=2, color=f"C{k}", label=framework)
        ax_m.bar(xs, [r["peak_gib"] for _, r in done], width, color=f"C{k}", label=framework)
        for i, row in rows:
            if "round_s" not in row:
                ax_t.annotate("not run" if not row else "did not finish", xy=(i + (k - 1.5) * width, 0.02),
                              xycoords=("data", "axes fraction"), rotation=90, fontsize=6, ha="center")
    ax_m.axhline(MEMORY_GOAL_GIB, color="k", linestyle="--", linewidth=1, label=f"{MEMORY_GOAL_GIB} GiB (100k goal)")
    labels = [f"{s}\n{section['settings'][s]['clients']:,} clients, {section['settings'][s]['per_round']:,} a round"
              for s in settings]
    for ax in (ax_t, ax_m):
        ax.set_xticks(range(len(settings)), labels, fontsize=7)
        ax.set_yscale("log")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    ax_t.set_ylabel("seconds per round (median of rounds 2..R)")
    ax_m.set_ylabel("peak memory of the process tree (GiB)")
    fig.suptitle(f"FedAvg, {section['rounds']} rounds: dane beside Flower, pfl and a NumPy loop (same shards)",
                 fontsize=10)
    return fig


def markdown(section: dict) -> str:
    lines = [f"{section['workload']}; {section['rounds']} rounds (results/bench.json `{KEY}`)", "",
             "| setting | framework | version | s/round [min, max] | first round (s) | objective | vs NumPy's | "
             "peak (GiB) | load (1 min) |", "|---|---|---|---|---|---|---|---|---|"]
    for name, setting in section["settings"].items():
        for framework, row in setting["frameworks"].items():
            agree = setting["agreement"].get(framework)
            versus = f"{agree['rel_diff']:.1e}" if agree else "reference"
            load = row["runs"][0]["load_before"][0] if row["runs"] else ""
            version = str(row.get("version"))[:12]
            if "round_s" not in row:
                lines.append(f"| {name} | {framework} | {version} | not finished | | | | | {load} |")
                continue
            lines.append(f"| {name} | {framework} | {version} | {row['round_s']:.3g} [{row['round_s_min']:.3g}, "
                         f"{row['round_s_max']:.3g}] | {row['runs'][0]['first_round_s']:.3g} | {row['objective']:.10g} "
                         f"| {versus} | {row['peak_gib']:.2f} | {load} |")
    lines += ["", "| setting | goal | value | target | met |", "|---|---|---|---|---|"]
    lines += [f"| {g['setting']} | {g['goal']} | {'—' if g['value'] is None else format(g['value'], '.3g')} | "
              f"{g['target']:g} | {'yes' if g['met'] else 'no'} |" for g in section.get("goals", [])]
    lines += [f"- {line}" for line in section.get("skipped", [])]
    return "\n".join(lines) + "\n"


def provenance(section: dict) -> dict:
    """The sidecar: where the numbers came from (the bench run's time, machine, load and peers) and the command."""
    loads = [x for s in section["settings"].values() for r in s["frameworks"].values() for run in r["runs"]
             for x in (run["load_before"][0], run["load_after"][0])]
    return {"source": f"results/bench.json {KEY}", "command": "python -m scripts.bench federated_scale (make bench)",
            "workload": section["workload"], "rounds": section["rounds"], "started_at": section.get("started_at"),
            "machine": section.get("machine"), "peers": section.get("peers"), "skipped": section.get("skipped"),
            "load_avg_1min": [min(loads), max(loads)] if loads else None}


def main(results: str | Path = "results", out: str | Path = FIG_DIR) -> list[Path]:
    section = load(results)
    sidecar = provenance(section)
    caption = (f"dane's FedAvg beside Flower, pfl and a NumPy loop: seconds per round and peak memory, "
               f"{section['rounds']} rounds; bench run {sidecar['started_at']}; load avg (1 min) "
               f"{sidecar['load_avg_1min']}.")
    return save(draw(section), out, "federated_scale", markdown(section), caption=caption, provenance=sidecar)


if __name__ == "__main__":
    cli(main, __doc__)
