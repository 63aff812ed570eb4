"""Tables 1-2 of the source paper: DANE's test accuracy for 2, 4, 6, 8 workers, ours beside the paper's.

Each row is one ``conf/experiment/table_<problem>.yaml`` sweep (DANE, fixed round budget,
simulated workers); a cell is the test accuracy after the experiment's round budget.  The paper's numbers
(DESIGN.md section 4; 60k/10k MNIST, GPUs) sit in the row below ours.  Reads only
results/ (runs are found by config, `find_run`); writes
``accuracy_table.md`` and ``accuracy_table.tex``.

    python -m experiments.simulate -m experiment=table_mnist_lenet5     # the runs (also: make figures)
    python -m paper_figs.accuracy_table [--results results] [--out paper_figs]
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dane.comm import AlphaBeta
from dane.errors import UserError
from dane.results import read_rounds, read_summary
from paper_figs.common import FIG_DIR, cli
from synthetic.sweep import Job, RunIndex, _composed, compose_job, identity

WORKERS = (2, 4, 6, 8)


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


def job(row: Row, workers: int) -> Job:
    return (f"experiment=table_{row.problem}", f"workers={workers}")


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
    cfg = _composed(tuple(job))
    wanted = identity(cfg)
    hits = [r for r in index.runs if r.identity == wanted and (
        r.summary.get("status") == "diverged" or r.summary.get("rounds", 0) >= cfg["rounds"])]
    return max(hits, key=lambda r: r.mtime).path if hits else None


def retime(records: list[dict], summary: dict, cost: AlphaBeta) -> list[dict]:
    r"""The records with ``time_s`` as if simulated under ``cost`` instead of the run's own α-β.

    The simulator's clock is Σ_phases (slowest compute + allreduce time), and the
    allreduce times add up to bytes_sent/β + (allreduces)·2(m-1)α, since one worker's ring
    bytes are 2(m-1)/m of each message; so swapping α-β is exact (broadcasts cost no
    simulated time and none of these algorithms broadcast).
    """
    if "alpha" not in summary or (summary["alpha"], summary["beta"]) == (cost.alpha, cost.beta):
        return records
    m = summary["workers"]

    def comm(record: dict, alpha: float, beta: float) -> float:
        return record["bytes_sent"] / beta + record["comm_rounds"] * 2 * (m - 1) * alpha

    return [{**r, "time_s": r["time_s"] - comm(r, summary["alpha"], summary["beta"]) + comm(r, cost.alpha, cost.beta)}
            for r in records]


def jobs(rows=ROWS) -> list[Job]:
    """The runs this table needs, for the rows whose data is present here."""
    return [job(row, m) for row in rows if has_data(row) for m in WORKERS]


def collect(index: RunIndex, rows=ROWS) -> dict[str, dict]:
    """{row label: {"ours": [accuracy or None per m], "rounds": budget, "notes": [...]}}."""
    out = {}
    for row in rows:
        ours, notes, rounds = [], [], compose_job(job(row, WORKERS[0]))["rounds"]
        for m in WORKERS:
            path = find_run(index, job(row, m))
            ours.append(accuracy_at(path, rounds) if path is not None else None)
            summary = read_summary(path) if path is not None else {}
            notes += [n for n in summary.get("notes", []) if n not in notes]
        out[row.label] = {"ours": ours, "rounds": rounds, "notes": notes, "paper": row.paper}
    return out


def accuracy_at(run_dir: Path, rounds: int) -> float | None:
    """Test accuracy of the iterate after ``rounds`` rounds (a longer run of the same config also answers)."""
    return next((r.get("test_accuracy") for r in read_rounds(run_dir) if r["round"] == rounds), None)


def fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.4f}".lstrip("0")


def markdown(data: dict[str, dict]) -> str:
    head = "| model | source | " + " | ".join(f"{m} workers" for m in WORKERS) + " |"
    lines = ["Test accuracy of DANE (η=1, μ=0, simulated workers) against the number of workers; "
             "ours after the stated round budget, the paper's (Tables 1-2; 60k/10k MNIST) below.", "",
             head, "|" + "---|" * (len(WORKERS) + 2)]
    notes: list[str] = []
    for label, row in data.items():
        lines.append(f"| {label} | ours, {row['rounds']} rounds | " + " | ".join(fmt(v) for v in row["ours"]) + " |")
        if row["paper"] is not None:
            lines.append(f"|  | paper | " + " | ".join(fmt(v) for v in row["paper"]) + " |")
        notes += [n for n in row["notes"] if n not in notes]
    lines += ["", "— : no run in results/ (or no data set on this machine)."]
    lines += [f"Note: {n}" for n in notes]
    return "\n".join(lines) + "\n"


def latex(data: dict[str, dict]) -> str:
    cols = "ll" + "r" * len(WORKERS)
    lines = [r"\begin{tabular}{" + cols + "}", r"\toprule",
             "model & source & " + " & ".join(f"$m={m}$" for m in WORKERS) + r" \\", r"\midrule"]
    for label, row in data.items():
        ours = " & ".join("--" if v is None else f"{v:.4f}" for v in row["ours"])
        lines.append(f"{label} & ours ({row['rounds']} rounds) & {ours}" + r" \\")
        if row["paper"] is not None:
            lines.append(" & paper & " + " & ".join(f"{v:.4f}" for v in row["paper"]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def main(results: str | Path = "results", out: str | Path = FIG_DIR) -> list[Path]:
    data = collect(RunIndex(results))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "accuracy_table.md", out / "accuracy_table.tex"]
    paths[0].write_text(markdown(data))
    paths[1].write_text(latex(data))
    return paths


if __name__ == "__main__":
    cli(main, __doc__)
