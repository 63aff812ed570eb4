"""Time against the number of workers, MNIST LeNet-3 and LeNet-5 (the source paper's Figures 3-4).

Plain DANE (η=1, μ=0) with one pass over each worker's shard per round, so a round is an
epoch.  Two panels per problem:

(a) time to the target test accuracy against the number of workers: the simulator at each
    m (mean over seeds, error bars ± half the range; each point labelled with its mean
    rounds to the target), real ``horovodrun --gloo`` runs at their process counts as
    separate markers, and the ideal line T(1)/m from the simulator's mean at m=1;
(b) time per epoch against the number of workers, with the same markers and ideal line.

How the numbers are taken, per run (``<results>/time_vs_workers/<problem>/<backend>_m<m>_seed<s>/``):

- *time to target*: ``time_s`` of the first record whose ``test_accuracy`` reaches the
  run's ``early_stop.target``, i.e. the time to produce that iterate (its rounds, each
  with the evaluation of the iterate it starts from); the workers' setup (data loading,
  model building) is left out.  A run that never reaches it gives no point (the
  markdown counts it).
- *time per epoch*: the mean of the per-round increments ``time_s[t+1] - time_s[t]``
  over rounds t >= 1; round 0's increment is left out, as it carries the one-time costs
  of a first call (allocations, Horovod's first negotiation of each tensor).  A run that
  stopped at round 1 has no such increment and gives no point.
- simulated times are each worker's thread CPU time plus the α-β ring-allreduce cost;
  they are put on the α-β of ``calibration.json`` in the same folder (measured by the
  script at its start) with `paper_figs.common.retime`, exact, so runs kept from an
  earlier calibration agree with the one stated;  horovodrun times are wall-clock on
  this machine, under whatever load it had (each run's load average is in the sidecar).

Reads only ``results/time_vs_workers/``; the runs come from the script, never from here:

    python -m scripts.bench time_vs_workers                 # the runs (slow; or: make time-vs-workers)
    dane figures time_vs_workers [--results results] [--out results/figures]
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter

from dane.comm import AlphaBeta
from dane.records.results import find_runs, read_config, read_rounds, read_summary
from dane.paper_figs.common import FIG_DIR, cli, cost_caption, data_text, retime, save
from dane.paper_figs.provenance import caption_line, figure_provenance

FOLDER = "time_vs_workers"
MAKE_RUNS = "python -m scripts.bench time_vs_workers (or: make time-vs-workers)"
LABELS = {"mnist_lenet3": "MNIST LeNet-3", "mnist_lenet5": "MNIST LeNet-5"}
BACKENDS = {"simulator": "simulator (CPU time + α-β)", "horovod": "horovodrun --gloo (wall clock)"}
#: the source paper's data, for the caption
PAPER_DATA = "the paper: 60,000 train / 10,000 test MNIST images, GPUs"


@dataclass(frozen=True)
class RunPoint:
    """One run's numbers; nan where the run gives none (target not reached, no round after round 0)."""

    problem: str
    backend: str
    workers: int
    seed: int
    target: float
    time_to_target: float
    rounds_to_target: int | None
    per_epoch: float
    run: str


@dataclass(frozen=True)
class Stat:
    """Mean and spread (half the range) of the finite values over seeds; n of them."""

    mean: float
    spread: float
    n: int
    values: tuple[float, ...]


def run_point(run_dir: Path, cost: AlphaBeta) -> RunPoint:
    summary = read_summary(run_dir)
    cfg = read_config(run_dir)
    target = (cfg.get("early_stop") or {}).get("target")
    if target is None:
        raise ValueError(f"{run_dir} has no early_stop.target in its config.yaml; it is not a run of "
                         f"scripts/time_vs_workers.py")
    records = retime(read_rounds(run_dir), summary, cost)
    hit = next((r for r in records if r.get("test_accuracy") is not None and r["test_accuracy"] >= target), None)
    steps = [b["time_s"] - a["time_s"] for a, b in zip(records, records[1:]) if a["round"] >= 1]
    return RunPoint(problem=summary["problem"], backend=summary["backend"], workers=int(summary["workers"]),
                    seed=int(cfg.get("seed", 0)), target=float(target),
                    time_to_target=hit["time_s"] if hit else math.nan,
                    rounds_to_target=hit["round"] if hit else None,
                    per_epoch=statistics.fmean(steps) if steps else math.nan, run=str(run_dir))


def stat(values) -> Stat:
    finite = tuple(v for v in values if v is not None and math.isfinite(v))
    if not finite:
        return Stat(math.nan, math.nan, 0, ())
    return Stat(statistics.fmean(finite), (max(finite) - min(finite)) / 2, len(finite), finite)


def aggregate(points: list[RunPoint], key: str) -> dict[tuple[str, int], Stat]:
    """{(backend, workers): Stat of ``key`` over the seeds}, sorted by backend then workers."""
    groups: dict[tuple[str, int], list[float]] = {}
    for p in sorted(points, key=lambda p: (p.backend, p.workers, p.seed)):
        groups.setdefault((p.backend, p.workers), []).append(getattr(p, key))
    return {k: stat(v) for k, v in groups.items()}


def ideal(stats: dict[tuple[str, int], Stat], workers) -> list[float]:
    """T(1)/m from the simulator's mean at m=1 (nan without it)."""
    base = stats.get(("simulator", 1), Stat(math.nan, math.nan, 0, ())).mean
    return [base / m for m in workers]


def load_cost(root: Path) -> tuple[AlphaBeta, dict]:
    path = root / "calibration.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing (the script measures it at its start); run {MAKE_RUNS}")
    data = json.loads(path.read_text())
    return AlphaBeta(alpha=float(data["alpha"]), beta=float(data["beta"])), data


def collect(root: Path, cost: AlphaBeta) -> dict[str, list[RunPoint]]:
    """{problem: its runs' points}, problems in LABELS order then by name; one target per problem."""
    out: dict[str, list[RunPoint]] = {}
    for run_dir in find_runs(root):
        point = run_point(run_dir, cost)
        out.setdefault(point.problem, []).append(point)
    for problem, points in out.items():
        targets = sorted({p.target for p in points})
        if len(targets) > 1:
            raise ValueError(f"{root / problem} mixes runs with targets {targets}; rerun the script with one "
                             f"--target (it replaces runs of another target)")
    order = list(LABELS)
    return dict(sorted(out.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), kv[0])))


def data_sizes(points: list[RunPoint]) -> list[dict]:
    sizes: list[dict] = []
    for p in points:
        data = read_summary(Path(p.run)).get("data")
        if data and data not in sizes:
            sizes.append(data)
    return sizes


def data_caption(sizes: dict[str, list[dict]]) -> str:
    """The data our runs trained and tested on, once per (train, test) size, beside the paper's.

    A split is described in the words of the first run that gives it (the loader's wording
    may differ between code versions; the sizes and the split are the same)."""
    seen: dict[tuple[int, int], str] = {}
    for info in (d for ds in sizes.values() for d in ds):
        key = (info["train_size"], info["test_size"])
        if key not in seen:
            seen[key] = data_text(info)
    return "ours on " + ("; ".join(seen.values()) or "unknown data") + f"; {PAPER_DATA}"


def calibration_caption(data: dict, root: Path) -> str:
    load = (data.get("machine") or {}).get("load_avg")
    return (f"calibration.json in {root}, measured {data.get('measured_at', '?')}"
            + (f" at load avg {load[0]:.2f}" if load else ""))


def _errorbar(ax, stats, backend: str, shift: float = 1.0, **style):
    """One backend's means with ± spread bars; ``shift`` nudges x (a factor) so coinciding bars stay apart."""
    keys = [k for k in stats if k[0] == backend and stats[k].n]
    if not keys:
        return
    ms = [m * shift for _, m in keys]
    ax.errorbar(ms, [stats[k].mean for k in keys], yerr=[stats[k].spread for k in keys], capsize=3,
                label=BACKENDS.get(backend, backend), **style)


def draw(table: dict[str, list[RunPoint]], cost_line: str, sizes_text: str, seeds: list[int]):
    fig, axes = plt.subplots(len(table), 2, figsize=(11, 4.3 * len(table)), squeeze=False)
    for row, (problem, points) in enumerate(table.items()):
        all_ms = sorted({p.workers for p in points})
        sim_ms = sorted({p.workers for p in points if p.backend == "simulator"}) or all_ms
        target = points[0].target
        for col, (key, ylabel, title) in enumerate((
                ("time_to_target", f"time to {target:.0%} test accuracy (s)",
                 f"(a) time to {target:.0%} test accuracy (rnd: mean rounds)"),
                ("per_epoch", "time per epoch = one round (s)", "(b) time per epoch"))):
            ax = axes[row, col]
            stats = aggregate(points, key)
            _errorbar(ax, stats, "simulator", fmt="o-", color="C0", markersize=5)
            _errorbar(ax, stats, "horovod", shift=1.04, fmt="s", color="C3", markersize=8, markerfacecolor="none",
                      markeredgewidth=1.5)
            ax.plot(sim_ms, ideal(stats, sim_ms), "k:", linewidth=1, label="ideal T(1)/m (simulator)")
            if key == "time_to_target":  # time to target = rounds x time per round: show the rounds
                rounds = aggregate(points, "rounds_to_target")
                for (backend, m), r in rounds.items():
                    if backend == "simulator" and r.n and stats[(backend, m)].n:
                        ax.annotate(f"{r.mean:.2g} rnd", (m, stats[(backend, m)].mean), textcoords="offset points",
                                    xytext=(5, -12), ha="left", fontsize=7, color="C0")
            missing = []
            for (backend, m), s in stats.items():
                total = sum(1 for p in points if p.backend == backend and p.workers == m)
                if s.n and s.n < total:
                    ax.annotate(f"{s.n}/{total} seeds", (m, s.mean), textcoords="offset points", xytext=(4, 4),
                                fontsize=7)
                elif not s.n:
                    missing.append(f"{backend} m={m}")
            if missing:
                why = "target not reached" if key == "time_to_target" else "no round after round 0"
                ax.text(0.02, 0.03, f"no point ({why}): " + ", ".join(missing), transform=ax.transAxes, fontsize=7)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(all_ms, [str(m) for m in all_ms])
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if str(f"{v:g}")[0] in "25" else ""))
            ax.set_xlabel("workers m (simulated) / processes (horovodrun)")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{LABELS.get(problem, problem)}: {title}", fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    seed_list = ",".join(map(str, seeds))
    fig.suptitle(f"Plain DANE (η=1, μ=0), one pass per round; mean ± half-range over seeds {seed_list}\n"
                 f"simulator: {cost_line}\n{sizes_text}", fontsize=9)
    return fig


def fmt(s: Stat, total: int) -> str:
    if not s.n:
        return "—"
    return f"{s.mean:.3g} ± {s.spread:.2g}" + (f" (n={s.n} of {total})" if s.n != total else "")


def markdown(table: dict[str, list[RunPoint]]) -> str:
    parts = []
    for problem, points in table.items():
        t = aggregate(points, "time_to_target")
        e = aggregate(points, "per_epoch")
        r = aggregate(points, "rounds_to_target")
        sim_ideal = {m: v for m, v in zip([m for b, m in t if b == "simulator"],
                                          ideal(t, [m for b, m in t if b == "simulator"]))}
        parts.append(f"{LABELS.get(problem, problem)}, target test accuracy {points[0].target:g}: mean ± half-range "
                     "over seeds\n\n| backend | m | time to target (s) | ideal T(1)/m (s) | rounds to target | "
                     "time per epoch (s) |\n|---|---|---|---|---|---|")
        for key in t:
            total = sum(1 for p in points if (p.backend, p.workers) == key)
            base = sim_ideal.get(key[1], math.nan) if key[0] == "simulator" else math.nan
            ideal_text = f"{base:.3g}" if math.isfinite(base) else ""
            parts.append(f"| {key[0]} | {key[1]} | {fmt(t[key], total)} | {ideal_text} | {fmt(r[key], total)} | "
                         f"{fmt(e[key], total)} |")
        parts.append("")
    return "\n".join(parts)


def _entry(point: RunPoint, root: Path) -> dict:
    """A point for the sidecar: nan (no number) as null, the run relative to the folder."""
    entry = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in vars(point).items()}
    return {**entry, "run": str(Path(point.run).relative_to(root))}


def main(results: str | Path = "results", out: str | Path = FIG_DIR) -> list[Path]:
    root = Path(results) / FOLDER
    if not root.exists() or not find_runs(root):
        raise FileNotFoundError(f"no runs under {root}; run {MAKE_RUNS} first")
    cost, calibration = load_cost(root)
    table = collect(root, cost)
    sizes = {problem: data_sizes(points) for problem, points in table.items()}
    cost_line = cost_caption(cost, calibration_caption(calibration, root))
    sizes_text = data_caption(sizes)
    runs = [p.run for points in table.values() for p in points]
    provenance = figure_provenance(
        runs, root=results, cost=cost_line, data=sizes,
        calibration={k: calibration.get(k) for k in ("alpha", "beta", "measured_at", "machine", "source")},
        targets={problem: points[0].target for problem, points in table.items()},
        points={problem: [_entry(p, root) for p in points] for problem, points in table.items()})
    seeds = provenance["seeds"]
    targets = sorted({points[0].target for points in table.values()})
    what = (f"Plain DANE (η=1, μ=0, one pass over each shard per round) on "
            f"{', '.join(LABELS.get(p, p) for p in table)}: time to {'/'.join(f'{t:g}' for t in targets)} test "
            "accuracy and time per epoch against workers, mean ± half-range over seeds; simulator (each worker's "
            "CPU time, slowest per phase, plus α-β allreduce cost) and horovodrun --gloo on this machine (wall "
            f"clock, one thread per process), ideal T(1)/m; {sizes_text}")
    caption = caption_line(what, provenance)
    return save(draw(table, cost_line, sizes_text, seeds), out, "time_vs_workers", markdown(table),
                caption=caption, provenance=provenance)


if __name__ == "__main__":
    cli(main, __doc__)
