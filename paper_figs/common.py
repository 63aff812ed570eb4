"""What every figure script shares: finding its runs in results/, reading curves, saving PNG + PDF.

Figures read only results/ (run directories written by `dane.results`); a figure names
the runs it needs as jobs (Hydra overrides of `experiments.simulate`), and
`paper_figs.make_all` runs the missing ones before drawing.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dane.results import read_rounds, read_summary  # noqa: E402
from synthetic.sweep import Job, RunIndex, job_name  # noqa: E402

FIG_DIR = Path(__file__).resolve().parent

#: the synthetic grid of the source paper (N) and ours (m, up to 64)
N_GRID = (6000, 10000, 14000, 18000)
M_GRID = (1, 2, 4, 8, 16, 64)


class MissingRuns(FileNotFoundError):
    def __init__(self, jobs: Sequence[Job], root: Path):
        shown = "\n  ".join(job_name(j) for j in jobs[:5])
        more = f"\n  ... and {len(jobs) - 5} more" if len(jobs) > 5 else ""
        super().__init__(f"{len(jobs)} run(s) missing under {root}:\n  {shown}{more}\n"
                         f"run `make figures` (python -m paper_figs.make_all) to produce them")


def locate(index: RunIndex, jobs: Sequence[Job], timed: bool = True) -> dict[Job, Path]:
    """Each job's run directory; raises `MissingRuns` naming every missing one.

    ``timed=False`` for a figure that reads only iterates (rounds, suboptimality), not times.
    """
    found = {job: index.find(job, timed) for job in jobs}
    missing = [job for job, path in found.items() if path is None]
    if missing:
        raise MissingRuns(missing, index.root)
    return found  # type: ignore[return-value]


def first_reaching(records: list[dict], tol: float, key: str = "suboptimality") -> dict | None:
    """The first record whose ``key`` is at most ``tol``, or None."""
    return next((r for r in records if r.get(key) is not None and r[key] <= tol), None)


def outcome(run_dir: Path, tol: float) -> tuple[str, dict | None]:
    """('reached', record) when the run got to ``tol``; else ('diverged' | 'not reached', None)."""
    hit = first_reaching(read_rounds(run_dir), tol)
    if hit is not None:
        return "reached", hit
    return ("diverged" if read_summary(run_dir)["status"] == "diverged" else "not reached"), None


def time_to(run_dir: Path, tol: float) -> float:
    """Seconds from the start until suboptimality <= tol, counting the workers' setup; nan if never."""
    status, hit = outcome(run_dir, tol)
    if hit is None:
        return math.nan
    return read_summary(run_dir).get("setup_s", 0.0) + hit["time_s"]


def save(fig, out_dir: str | Path, name: str, markdown: str | None = None) -> list[Path]:
    """Write ``name``.png and ``name``.pdf into ``out_dir`` (and ``name``.md, if given the
    figure's numbers as a markdown table); returns the PNG and PDF paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if markdown is not None:
        (out_dir / f"{name}.md").write_text(markdown)
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.pdf"]
    if not fig.get_constrained_layout():
        fig.tight_layout()
    for path in paths:
        fig.savefig(path, dpi=150)
    plt.close(fig)
    return paths


def positive(values: Sequence[float], floor: float = 1e-16) -> list[float]:
    """Values for a log axis: non-finite ones become nan (a gap), tiny ones the floor."""
    return [max(float(v), floor) if v is not None and math.isfinite(float(v)) else math.nan for v in values]


def cli(main, doc: str) -> None:
    """The command line every figure script shares: ``--results`` in, ``--out`` for the files; prints their paths."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--results", default="results")
    parser.add_argument("--out", default=str(FIG_DIR))
    args = parser.parse_args()
    for path in main(args.results, args.out):
        print(path)
