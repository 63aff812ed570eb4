"""Figure: dane's FedAvg beside Flower, pfl and a plain NumPy loop at 100 to 100,000 clients.

From the ``federated_scale`` section of the JSON that ``scripts/bench_federated_scale.py`` writes
(``make bench``: results/bench.json; tracked: paper_figs/evidence/federated_scale_phishing.json and
paper_figs/evidence/federated_scale_synthetic.json, which ``--json`` takes together, each setting with its
run's rounds): FedAvg, 10 full-batch local gradient steps, L2-regularised logistic regression, the same
seeded shards fed to every framework, each run a fresh process tree.

- left: seconds per round, the median of rounds 2..R (round 1, where a framework starts its
  workers, apart), bars from the fastest to the slowest such round;
- right: the peak memory of the run's whole process tree (summed PSS, or the largest
  process's resident set where that is larger), with the 4 GiB goal of the 100,000-client
  setting as a line.

The table beside it gives each run's final objective against the NumPy loop's and the
section's goals (dane at most 0.5x pfl's and 5x the NumPy loop's seconds per round).  The sidecar
(federated_scale.json) names the JSON read, with each run's start, machine, load average and peers.

    dane figures federated_scale [--json results/bench.json ...] [--out results/figures]
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import matplotlib.pyplot as plt

from dane.paper_figs.common import bench_parser, save
from dane.paper_figs.provenance import bench_caption, bench_provenance

KEY = "federated_scale"
FRAMEWORKS = ("dane", "flower", "pfl", "numpy")
MEMORY_GOAL_GIB = 4


class MissingScale(FileNotFoundError):
    def __init__(self, path: Path):
        super().__init__(f"{path} has no '{KEY}' key; run `make bench` (scripts/bench_federated_scale.py) first")


def load(path: str | Path) -> dict:
    """The federated_scale section of the JSON at ``path``."""
    report = json.loads(Path(path).read_text()) if Path(path).exists() else {}
    if KEY not in report:
        raise MissingScale(Path(path))
    return report[KEY]


def combine(sections: Sequence[dict]) -> dict:
    """One section from several runs' (the tracked phishing and synthetic ones): their settings in order, each with
    its run's ``rounds``, and their goals and skipped lines; one section is returned as it is."""
    if len(sections) == 1:
        return sections[0]
    return {**sections[0], "settings": {name: {"rounds": section["rounds"], **setting} for section in sections
                                        for name, setting in section["settings"].items()},
            "goals": [g for section in sections for g in section.get("goals", [])],
            "skipped": [line for section in sections for line in section.get("skipped", [])]}


def rounds(section: dict) -> str:
    """``5 rounds``; where the settings were run for different counts, each count with its settings."""
    per: dict = {}
    for name, setting in section["settings"].items():
        per.setdefault(setting.get("rounds", section["rounds"]), []).append(name)
    if len(per) == 1:
        return f"{next(iter(per))} rounds"
    return "; ".join(f"{count} rounds ({', '.join(names)})" for count, names in per.items())


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
    labels = [f"{s}\n{section['settings'][s]['clients']:,} clients\n{section['settings'][s]['per_round']:,} a round"
              for s in settings]
    for ax in (ax_t, ax_m):
        ax.set_xticks(range(len(settings)), labels, fontsize=7)
        ax.set_yscale("log")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    ax_t.set_ylabel("seconds per round (median of rounds 2..R)")
    ax_m.set_ylabel("peak memory of the process tree (GiB)")
    fig.suptitle(f"FedAvg, {rounds(section)}: dane beside Flower, pfl and a NumPy loop (same shards)",
                 fontsize=10)
    return fig


def markdown(section: dict, sources: Sequence[str]) -> str:
    lines = [f"{section['workload']}; {rounds(section)} ({', '.join(sources)} `{KEY}`)", "",
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


def codes(section: dict) -> list[dict | None]:
    """Each setting's code record: the section's ``code``, else (a run of old) dane's row's ``version``, the commit
    alone (whether its tree was modified not recorded); None where neither is."""
    def one(setting: dict) -> dict | None:
        commit = setting["frameworks"].get("dane", {}).get("version")
        return section.get("code") or ({"git_commit": commit, "git_dirty": None} if commit else None)

    return [one(setting) for setting in section["settings"].values()]


def provenance(sources: Sequence[str | Path], sections: Sequence[dict]) -> dict:
    """The sidecar: the JSON read, each run's time, machine, load and peers and the commands that made the files (`bench_provenance`)."""
    section = combine(sections)
    loads = [x for s in section["settings"].values() for r in s["frameworks"].values() for run in r["runs"]
             for x in (run["load_before"][0], run["load_after"][0])]
    return bench_provenance(sources, sections, "python -m scripts.bench federated_scale", codes,
                            workload=section["workload"], rounds=rounds(section),
                            load_avg_1min=[min(loads), max(loads)] if loads else None)


def figure(sources: Sequence[str | Path], out: str | Path, name: str = KEY) -> list[Path]:
    """The figure ``name`` from the JSON at ``sources`` (their settings side by side), with its table and sidecar."""
    sections = [load(path) for path in sources]
    section, sidecar = combine(sections), provenance(sources, sections)
    caption = bench_caption(f"dane's FedAvg beside Flower, pfl and a NumPy loop: seconds per round and peak memory, "
                            f"{rounds(section)}", sidecar)
    return save(draw(section), out, name, markdown(section, sidecar["json"]), caption=caption, provenance=sidecar)


def main(argv: list[str] | None = None) -> list[Path]:
    args = bench_parser(__doc__, None, several="the benchmark's JSON: several (the tracked phishing and synthetic "
                        "runs) are drawn side by side", figure=True).parse_args(argv)
    paths = figure(args.json, args.out)
    for path in paths:
        print(path)
    return paths


if __name__ == "__main__":
    main()
