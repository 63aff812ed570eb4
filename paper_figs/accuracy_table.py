"""Tables 1-2 of the source paper: DANE's test accuracy for 2, 4, 6, 8 workers, ours beside the paper's.

Each row is one ``conf/experiment/table_<problem>.yaml`` sweep (DANE, fixed round budget,
simulated workers), run for each of ``SEEDS``; a cell is the mean test accuracy after the
experiment's round budget over the seeds, ± half their range (the spread).  The paper's
numbers (`ROWS`; 60k/10k MNIST, GPUs) sit in the row below ours, and the
caption states what data ours come from (train/test sizes from the runs' summaries): on
a machine with only MNIST's t10k files, ours are on a split of those 10,000 images and
the caption says so.  Reads only results/ (runs are found by config, `find_run`);
writes ``accuracy_table.{md,tex,json}`` (the JSON: every cell, every run, provenance).

    dane simulate -m experiment=table_mnist_lenet5 seed=0,1,2   # the runs (also: make tables)
    dane figures accuracy_table [--results results] [--out results/figures]
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from dane.errors import UserError
from dane.records.results import read_rounds, read_summary
from dane.paper_figs.common import FIG_DIR, cli, data_text, save
from dane.paper_figs.provenance import caption_line, figure_provenance, run_config
from dane.synthetic.sweep import Job, RunIndex, composed_job, compose_job, identity

WORKERS = (2, 4, 6, 8)
SEEDS = (0, 1, 2)
#: the source paper's setting, for the caption
PAPER_SETTING = "paper: 60,000/10,000 MNIST, 50,000/10,000 CIFAR-10, GPUs, batch 100"


@dataclass(frozen=True)
class Row:
    label: str
    problem: str
    paper: tuple[float, ...] | None  # the source paper's accuracies for WORKERS, if it has the row


ROWS = (
    Row("MNIST-LeNet3", "mnist_lenet3", (0.9831, 0.9816, 0.9813, 0.9810)),
    Row("MNIST-LeNet5", "mnist_lenet5", (0.9914, 0.9897, 0.9891, 0.9887)),
    Row("CIFAR-LeNet3", "cifar_lenet3", (0.8825, 0.8745, 0.8667, 0.8613)),
    Row("CIFAR-LeNet5", "cifar_lenet5", (0.8906, 0.8875, 0.8863, 0.8854)),
    Row("digits-MLP", "digits_mlp", None),
    Row("digits-LeNet5", "digits_lenet5", None),
)


def job(row: Row, workers: int, seed: int = SEEDS[0]) -> Job:
    return (f"experiment=table_{row.problem}", f"workers={workers}", f"seed={seed}")


def has_data(row: Row) -> bool:
    """Whether this machine has the row's data set (CIFAR-10 and full MNIST may be absent)."""
    return data_problem(row) is None


def data_problem(row: Row) -> str | None:
    """Why the row's data set cannot be read here (the loader's one-line error), or None if it can."""
    from hydra.utils import instantiate

    try:
        instantiate(compose_job(job(row, WORKERS[0])).problem).dataset()
    except UserError as exc:
        return str(exc).splitlines()[0]
    return None


def find_run(index: RunIndex, job: Job) -> Path | None:
    """The newest stored run of ``job``'s config that ran its round budget (or diverged), whatever its α-β.

    `RunIndex.find` also demands the α-β of today's cost model, because a simulated run's
    times depend on it; accuracies do not, and `retime` puts any run's times on the job's
    α-β exactly, so these slow runs are never redone for a re-measured calibration.
    """
    cfg = composed_job(tuple(job))
    wanted = identity(cfg)
    hits = [r for r in index.runs if r.identity == wanted and (
        r.summary.get("status") == "diverged" or r.summary.get("rounds", 0) >= cfg["rounds"])]
    return max(hits, key=lambda r: r.mtime).path if hits else None


def jobs(rows=ROWS, seeds=SEEDS) -> list[Job]:
    """The runs this table needs, for the rows whose data is present here."""
    return [job(row, m, seed) for row in rows if has_data(row) for seed in seeds for m in WORKERS]


def collect(index: RunIndex, rows=ROWS, seeds=SEEDS) -> dict[str, dict]:
    """{row label: {"cells": [{"mean", "spread", "values", "runs", "seeds"} per m], "rounds": budget, "data": [...],
    ...}}.

    A cell's ``values`` are the seeds' accuracies that have a run (``seeds`` those seeds); ``mean`` and
    ``spread`` (half the range) are None without any.
    """
    out = {}
    for row in rows:
        cells, notes, data, runs, rounds = [], [], [], [], compose_job(job(row, WORKERS[0]))["rounds"]
        batch = None
        for m in WORKERS:
            values, cell_runs, cell_seeds = [], [], []
            for seed in seeds:
                path = find_run(index, job(row, m, seed))
                if path is None:
                    continue
                value = accuracy_at(path, rounds)
                summary = read_summary(path)
                batch = batch or run_config(path).get("problem", {}).get("inner_batch_size")
                notes += [n for n in summary.get("notes", []) if n not in notes]
                if summary.get("data") and summary["data"] not in data:
                    data.append(summary["data"])
                if value is not None:
                    values.append(value)
                    cell_runs.append(str(path))
                    cell_seeds.append(seed)
            runs += cell_runs
            cells.append({"values": values, "runs": cell_runs, "seeds": cell_seeds,
                          "mean": statistics.fmean(values) if values else None,
                          "spread": (max(values) - min(values)) / 2 if values else None})
        out[row.label] = {"cells": cells, "ours": [c["mean"] for c in cells], "rounds": rounds, "notes": notes,
                          "paper": row.paper, "data": data, "runs": runs, "seeds": list(seeds), "batch": batch}
    return out


def accuracy_at(run_dir: Path, rounds: int) -> float | None:
    """Test accuracy of the iterate after ``rounds`` rounds (a longer run of the same config also answers)."""
    return next((r.get("test_accuracy") for r in read_rounds(run_dir) if r["round"] == rounds), None)


def data_caption(data: dict[str, dict]) -> str:
    """Which data our rows were measured on, in words, from the runs' summaries."""
    parts = []
    for label, row in data.items():
        parts += [f"{label}: {data_text(info)}" for info in row["data"]]
    return "; ".join(parts)


def fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.4f}".lstrip("0")


def fmt_cell(cell: dict) -> str:
    if cell["mean"] is None:
        return "—"
    n = len(cell["values"])
    return fmt(cell["mean"]) + (f" ± {cell['spread']:.4f}".replace("0.", ".", 1) if n > 1 else "") + \
        (f" (n={n})" if n != len(SEEDS) else "")


def what(data: dict[str, dict]) -> str:
    """The table's caption, before its provenance."""
    rounds = sorted({row["rounds"] for row in data.values()})
    sizes = data_caption(data) or "no runs yet"
    return (f"Test accuracy of DANE (η=1, μ=0, simulated workers) after {'/'.join(map(str, rounds))} rounds "
            "(each round one pass of inner SGD over every worker's shard, so as many epochs; batch per row), "
            f"{over_seeds(data)}; ours on {sizes}; {PAPER_SETTING}. "
            "Rows on fewer training images than the paper's are not comparable with its numbers")


def over_seeds(data: dict[str, dict]) -> str:
    """What a cell averages, naming the seeds read (a cell short of some says "(n=k)"): "mean ± half-range over
    seeds 0,1,2" where every one of `SEEDS` has a run (or none has), else those read and those not run."""
    read = sorted({seed for row in data.values() for cell in row["cells"] for seed in cell.get("seeds", ())})
    if not read or read == sorted(SEEDS):
        return f"mean ± half-range over seeds {','.join(map(str, SEEDS))}"
    missing = [str(seed) for seed in SEEDS if seed not in read]
    not_run = f" (seed{'s' if len(missing) > 1 else ''} {','.join(missing)} not run)" if missing else ""
    if len(read) == 1:
        return f"seed {read[0]} alone, no spread{not_run}"
    return f"mean ± half-range over seeds {','.join(map(str, read))}{not_run}"


def markdown(data: dict[str, dict]) -> str:
    head = "| model | source | " + " | ".join(f"{m} workers" for m in WORKERS) + " |"
    lines = [head, "|" + "---|" * (len(WORKERS) + 2)]
    notes: list[str] = []
    for label, row in data.items():
        sizes = "; ".join(f"{d['train_size']:,}/{d['test_size']:,}" for d in row["data"])
        source = f"ours, {row['rounds']} rounds" + (f", batch {row['batch']}" if row.get("batch") else "") + \
            (f", {sizes} train/test" if sizes else "")
        lines.append(f"| {label} | {source} | " + " | ".join(fmt_cell(c) for c in row["cells"]) + " |")
        if row["paper"] is not None:
            lines.append("|  | paper | " + " | ".join(fmt(v) for v in row["paper"]) + " |")
        notes += [n for n in row["notes"] if n not in notes]
    lines += ["", "— : no run in results/ (or no data set on this machine)."]
    lines += [f"Note: {n}" for n in notes]
    return "\n".join(lines) + "\n"


def latex(data: dict[str, dict], caption: str = "") -> str:
    cols = "ll" + "r" * len(WORKERS)
    lines = [f"% {caption}"] if caption else []
    lines += [r"\begin{tabular}{" + cols + "}", r"\toprule",
              "model & source & " + " & ".join(f"$m={m}$" for m in WORKERS) + r" \\", r"\midrule"]
    for label, row in data.items():
        ours = " & ".join("--" if c["mean"] is None else
                          f"{c['mean']:.4f}" + (f" $\\pm$ {c['spread']:.4f}" if len(c["values"]) > 1 else "")
                          for c in row["cells"])
        lines.append(f"{label} & ours ({row['rounds']} rounds) & {ours}" + r" \\")
        if row["paper"] is not None:
            lines.append(" & paper & " + " & ".join(f"{v:.4f}" for v in row["paper"]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def main(results: str | Path = "results", out: str | Path = FIG_DIR) -> list[Path]:
    data = collect(RunIndex(results))
    if not any(row["runs"] for row in data.values()):
        return []  # no run of the table's: nothing drawn (`common.cli` says so), not a table of dashes
    provenance = figure_provenance([r for row in data.values() for r in row["runs"]], root=results,
                                   data={label: row["data"] for label, row in data.items()},
                                   cells={label: row["cells"] for label, row in data.items()},
                                   paper={label: row["paper"] for label, row in data.items()})
    caption = caption_line(what(data), provenance)
    paths = save(None, out, "accuracy_table", markdown(data), caption=caption, provenance=provenance)
    tex = Path(out) / "accuracy_table.tex"
    tex.write_text(latex(data, caption))
    return [*paths, tex]


if __name__ == "__main__":
    cli(main, __doc__)
