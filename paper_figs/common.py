"""What every figure script shares: finding its runs in results/, reading curves, saving a figure
with its provenance (made by `paper_figs.provenance`).

Figures read only results/ (run directories written by `dane.records.results`); a figure names
the runs it needs as jobs (Hydra overrides of `experiments.simulate`), and
`paper_figs.make_all` runs the missing ones before drawing.  Figures are written into
``results/figures/`` (untracked); ``make publish-figures`` copies them into paper_figs/,
a deliberate step.  Every figure or table ``NAME`` comes with ``NAME.json``, its
provenance: the runs it was drawn from, each with its code commit, overrides, seed,
α-β, start time and load average (`paper_figs.provenance.figure_provenance`), and a one-line caption.
Nothing in a figure or its sidecar depends on when it was drawn, so drawing twice from
the same logs gives identical files.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import textwrap
from pathlib import Path
from typing import Iterable, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from dane.comm import AlphaBeta  # noqa: E402
from dane.errors import UserError, plural, say  # noqa: E402
from dane.records.results import (atomic_write_text, output_file, output_folder, read_rounds,  # noqa: E402
                                  read_summary)
from dane.synthetic.sweep import Job, RunIndex, job_name  # noqa: E402
from dane.records.provenance import command_name  # noqa: E402
from dane.paper_figs.provenance import (bench_caption, bench_provenance, bench_section, repo_path,  # noqa: E402
                                       run_config)

#: where figures and tables are written (untracked); `make publish-figures` copies them to PUBLISHED_DIR
FIG_DIR = Path("results") / "figures"
PUBLISHED_DIR = Path(__file__).resolve().parent
#: the benchmark JSON the pages' tables are rendered from, tracked (docs/design.md, "Evidence"); `make_all` draws the
#: figures of those benchmarks from it
EVIDENCE_DIR = PUBLISHED_DIR / "evidence"
#: the α-β every figure's simulated times are put on (`retime`), whatever the runs were simulated with:
#: Horovod over loopback on a 2-core machine (docs/design.md, "The machines"), fixed so that a figure does not
#: move with the last calibration; the caption and sidecar state it
FIGURE_COST = AlphaBeta()
FIGURE_COST_SOURCE = "package default α-β (Horovod, loopback, 2 cores)"
#: file metadata without a creation date, so the same figure is the same bytes
_METADATA = {"png": {"Software": None}, "pdf": {"CreationDate": None, "ModDate": None, "Producer": None,
                                                 "Creator": None}}

#: the synthetic grid of the source paper (N) and ours (m, up to 64)
N_GRID = (6000, 10000, 14000, 18000)
M_GRID = (1, 2, 4, 8, 16, 64)


class MissingRuns(FileNotFoundError):
    """The runs a figure reads that ``root`` lacks, in one line (the first named: each is a whole job's overrides)."""

    def __init__(self, jobs: Sequence[Job], root: Path):
        super().__init__(f"{len(jobs)} run(s) missing under {root} (the first: {job_name(jobs[0])}); run `make "
                         f"figures` (dane figures make_all) to produce them")


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


def retime(records: list[dict], summary: dict, cost: AlphaBeta = FIGURE_COST) -> list[dict]:
    r"""The records with ``time_s`` as if simulated under ``cost`` instead of the run's own α-β.

    The simulator's clock is Σ_phases (slowest compute + allreduce time), and the
    allreduce times add up to bytes_sent/β + (allreduces)·2(m-1)α, since one worker's ring
    bytes are 2(m-1)/m of each message; so swapping α-β is exact (broadcasts cost no
    simulated time).  Records of a run without a simulated network (m=1, or a launched
    run) are returned as they are.  A run simulated with parameter servers
    (``topology: ps``) has another cost formula: asking to re-time one is an error.
    """
    if "alpha" not in summary or (summary["alpha"], summary["beta"]) == (cost.alpha, cost.beta):
        return records
    if summary.get("topology", "allreduce") != "allreduce":
        raise ValueError(f"retime swaps a ring allreduce's α-β; this run was simulated with topology "
                         f"{summary['topology']}")
    m = summary["workers"]

    def comm(record: dict, alpha: float, beta: float) -> float:
        return record["bytes_sent"] / beta + record["comm_rounds"] * 2 * (m - 1) * alpha

    return [{**r, "time_s": r["time_s"] - comm(r, summary["alpha"], summary["beta"]) + comm(r, cost.alpha, cost.beta)}
            for r in records]


def alpha_beta_text(alpha: float, beta: float) -> str:
    """α and β in words: "α=550 µs, β=0.4 GB/s"."""
    latency = f"{alpha * 1e3:.3g} ms" if alpha >= 1e-3 else f"{alpha * 1e6:.3g} µs"
    return f"α={latency}, β={beta / 1e9:.3g} GB/s"


def cost_caption(cost: AlphaBeta = FIGURE_COST, source: str = FIGURE_COST_SOURCE) -> str:
    return f"{alpha_beta_text(cost.alpha, cost.beta)} ({source})"


def run_cost_text(summary: dict, cfg: dict | None = None) -> str | None:
    """The cost model a simulated run's times were charged under, in words, from its ``summary.json`` (and
    ``config.yaml``, ``cfg``): α, β (and γ and the servers of ``sim.topology=ps``), and whether they were calibrated,
    the file named (``calibration_file``: its path, host and date), set by hand (``sim.alpha``/``sim.beta``) or the
    package's defaults; a drawn tail is named.  None for a run that records none (a launched run: wall time)."""
    if "alpha" not in summary or "beta" not in summary:
        return None
    sim = (cfg or {}).get("sim") or {}
    by_hand = [f"sim.{k}" for k in ("alpha", "beta", "gamma") if sim.get(k) is not None]
    source = summary.get("calibration_file")
    if source:
        words = (f"calibrated: {source.get('path')}" + (f" on {source['host']}" if source.get("host") else "") +
                 (f", {str(source['measured_at'])[:10]}" if source.get("measured_at") else ""))
    elif (summary["alpha"], summary["beta"]) == (AlphaBeta.alpha, AlphaBeta.beta) and not by_hand:
        words = "not calibrated: the package's default α-β"
    else:
        words = "not calibrated"
    if by_hand:
        words += f", {' and '.join(by_hand)} set by hand"
    if isinstance(summary.get("calibration"), dict):
        words += ", its tail drawn"
    text = f"{alpha_beta_text(summary['alpha'], summary['beta'])} ({words})"
    if summary.get("topology") == "ps":
        text = f"{summary.get('servers', 1)} parameter server(s), γ={summary['gamma'] / 1e9:.3g} GB/s, " + text
    return text


#: a data source's note in a run's summary: "569 rows x 30 features" (`dane.data`)
_SHAPE = re.compile(r"(\d+) rows? x (\d+) (features?|pixels)")


def run_setting(run_dir: str | Path) -> dict[str, str | None]:
    """What a logged run was, from its ``summary.json`` and ``config.yaml`` (None where neither records it: the size
    of a `dane.fit` run's arrays, which its config names as their shape): the problem, the data set, its rows x
    features (the data source's note in the summary), the rows N and features d of a generated data set (its
    config's ``n_samples`` and ``dim``: the synthetic ridge, its data named by its covariance), the workers m, λ and
    the stop rule (``the round cap`` where the summary's ``stop_rule`` is null: no ``tol``)."""
    summary, cfg = read_summary(run_dir), run_config(run_dir)
    problem = cfg.get("problem") or {}
    data = problem.get("data") or {}
    name = data.get("dataset") or (Path(str(data["path"])).name if data.get("path") else None) or data.get("name")
    generated = not data and "n_samples" in problem
    if generated:
        name = "generated data" + (f" ({problem['covariance']} covariance)" if problem.get("covariance") else "")
    shape = next((found for note in summary.get("notes", []) if (found := _SHAPE.search(str(note)))), None)
    lam = problem.get("lam")
    return {"problem": summary.get("problem") or problem.get("name"), "data": name,
            "size": f"{plural(int(shape[1]), 'row', ',')} x {shape[2]} {shape[3]}" if shape else None,
            "N": f"{int(problem['n_samples']):,}" if generated else None,
            "d": str(problem["dim"]) if generated and problem.get("dim") is not None else None,
            "m": None if summary.get("workers") is None else str(summary["workers"]),
            "λ": None if lam is None else f"{lam:g}",
            "stop": summary.get("stop_rule") or ("the round cap" if "stop_rule" in summary else None)}


def setting_value(settings: Sequence[dict], key: str) -> str | None:
    """One `run_setting` key over several runs: each value once, " / " between them ("?" for a run that records
    none), in increasing order where all are numbers (m = 1 / 2 / 4 / 8), else in the runs' order; None where none
    records it."""
    values = list(dict.fromkeys(s[key] or "?" for s in settings))
    numbers = [number(v) for v in values]
    if None not in numbers:
        values = [v for _, v in sorted(zip(numbers, values))]
    return None if values in ([], ["?"]) else " / ".join(values)


def number(text: str) -> float | None:
    """``text`` ("18,000", "0.005") as a number; None where it is none."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def setting_text(run_dirs: Iterable[str | Path]) -> str:
    """The runs' `run_setting` in one line: "logreg on breast_cancer (569 rows x 30 features), m = 8, λ = 0.001,
    runs stop at suboptimality <= 1e-12 x |O*|" ("ridge_synthetic on generated data (iso covariance), N = 18,000,
    d = 500, m = 8, λ = 0.005, ..." for a generated set); a value the runs differ in is each of them ("m = 4 / 8",
    "?" for a run that records none), and what none records is named as such."""
    settings = [run_setting(d) for d in run_dirs]
    value = lambda key: setting_value(settings, key)  # noqa: E731
    problem, data, size, rows, dim, m, lam, stop = (value(k) for k in ("problem", "data", "size", "N", "d", "m", "λ",
                                                                       "stop"))
    head = (problem or "?") + (f" on {data}" if data else "") + (f" ({size})" if size else "")
    parts = [head] + [f"{name} = {v}" for name, v in (("N", rows), ("d", dim), ("m", m), ("λ", lam)) if v]
    if stop:
        parts.append(f"runs stop at {stop}")
    missing = [name for name, v in (("data set", data), ("λ", lam), ("stop rule", stop)) if not v]
    if missing:
        parts.append(f"{', '.join(missing)} not recorded")
    return ", ".join(parts)


def wrapped(text: str, width_in: float, fontsize: float = 10) -> str:
    """``text`` broken into lines that fit a title ``width_in`` inches wide at ``fontsize`` points (its own line
    breaks kept, a hyphenated word never split: "full-gradient" stays one word)."""
    chars = max(20, int(width_in * 72 / (0.55 * fontsize)))
    return "\n".join(textwrap.fill(line, chars, break_on_hyphens=False) for line in text.split("\n"))


def data_text(info: dict) -> str:
    """A run's recorded ``data`` in words: "8,000 train / 2,000 test", and the split when not the files' own."""
    split = info.get("split", "standard")
    return f"{info['train_size']:,} train / {info['test_size']:,} test" + (f" ({split})" if split != "standard" else "")


class MissingCount(ValueError):
    """A run whose records lack a count a figure plots (suboptimality, uplink traffic, local passes)."""


def bits_per_client(records: list[dict], workers: int, way: str = "uplink") -> list[float] | None:
    """Each record's ``way`` (``uplink`` or ``downlink``) bits per client so far: FedNL's and FedNL-BC's exact
    ``clients_<way>_bits``, a federated method's participants' ``<way>_bytes``, or ``comm.compress``'s per-worker
    ``<way>_bits``; None where the records count none."""
    first = records[0]
    if f"clients_{way}_bits" in first:
        return [r[f"clients_{way}_bits"] / workers for r in records]
    if f"{way}_bytes" in first:
        return [8 * r[f"{way}_bytes"] / workers for r in records]
    if f"{way}_bits" in first:
        return [float(r[f"{way}_bits"]) for r in records]
    return None


def reference_fix(run_dir: Path) -> str:
    """How to make a run whose records carry suboptimality, as one that exists for the run: ``problem.optimum=auto``
    where its config.yaml's problem has that key; for a problem without it (one's own), a problem reporting its
    optimum, or the gradient norm drawn by plot_runs; a run without a config.yaml is told both."""
    problem = run_config(run_dir).get("problem")
    own = ('a problem whose optimum is known reports it as a "suboptimality" metric (docs/extending.md); '
           "dane figures plot_runs --y grad_norm draws runs without one")
    if not isinstance(problem, dict):
        return f"run it with problem.optimum=auto where its problem has that key; else {own}"
    if "optimum" in problem:
        return "run it with problem.optimum=auto"
    return f"problem={problem.get('name', '?')} has no problem.optimum key to compute one: {own}"


def run_curve(run_dir: Path, label: str, *, passes: bool = False, error: type[MissingCount] = MissingCount) -> dict:
    """One run's ``rounds``, uplink ``bits`` per client (`bits_per_client`) and ``relative`` suboptimality
    (O(w) − O*)/|O*| (O* from its first record), under ``label``; its local gradient ``passes`` per client, its
    ``downlink`` bits per client (`bits_per_client`) and each count of `paper_figs.blocks.SECOND_ORDER` per client,
    each None where its records do not count it; and the run's ``status`` from its summary.  A count its records lack
    (uplink bits; local passes too, where ``passes`` asks for them) is ``error`` (a `MissingCount`), naming the run and
    how to make one that has it."""
    from dane.paper_figs.blocks import SECOND_ORDER

    records, summary = read_rounds(run_dir), read_summary(run_dir)
    workers = summary["workers"]
    if not records or "suboptimality" not in records[0]:
        raise error(f"{run_dir}: its records have no suboptimality; {reference_fix(run_dir)}")
    if passes and "local_passes" not in records[0]:
        raise error(f"{run_dir}: its records count no local work (written before dane.work); run it again")
    bits = bits_per_client(records, workers)
    if bits is None:
        raise error(f"{run_dir}: its records count no uplink traffic; run it with comm.compress=none")
    optimum = abs(records[0]["objective"] - records[0]["suboptimality"])
    out = {"label": label, "rounds": [r["round"] for r in records], "bits": bits,
           "downlink": bits_per_client(records, workers, "downlink")}
    out.update({name: None if records[0].get(key) is None else [r[key] / workers for r in records]
                for name, key in (("passes", "local_passes"), *((key, key) for key in SECOND_ORDER))})
    out["status"] = summary.get("status")
    return {**out, "relative": [r["suboptimality"] / optimum for r in records]}


def natural_key(path: Path) -> list:
    """Sort ``2_...`` before ``10_...`` (Hydra numbers the jobs of a sweep): the job order of every folder of runs
    (`paper_figs.summary.job_dirs`, `run_dirs_under`)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]


def run_dirs_under(results: str | Path, how_to_make: str) -> list[Path]:
    """Every run directory directly under ``results`` (one holding rounds.jsonl), in job order (`natural_key`: ``2_``
    before ``10_``); none is one line naming ``how_to_make`` them."""
    root = Path(results)
    found = sorted((p.parent for p in root.glob("*/rounds.jsonl")), key=natural_key)
    if not found:
        raise FileNotFoundError(f"no runs under {root}; {how_to_make}")
    return found


def save(fig, out_dir: str | Path, name: str, markdown: str | None = None, *, caption: str | None = None,
         provenance: dict | None = None) -> list[Path]:
    """Write ``name``.png and ``name``.pdf into ``out_dir``, with ``name``.md (the figure's
    numbers, if given, under the caption line) and ``name``.json (``provenance`` and the
    caption); ``fig`` None writes only the text files (a table).  Returns the paths written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    if fig is not None:
        if not fig.get_constrained_layout():
            fig.tight_layout()
        for ext in ("png", "pdf"):
            path = out_dir / f"{name}.{ext}"
            fig.savefig(path, dpi=150, metadata=_METADATA[ext])
            fig.set_layout_engine("none")  # the PDF keeps the layout the PNG's drawing made: one layout, not two
            paths.append(path)
        plt.close(fig)
    if markdown is not None:
        paths.append(out_dir / f"{name}.md")
        atomic_write_text(paths[-1], (f"{caption}\n\n" if caption else "") + markdown)
    if provenance is not None or caption is not None:
        paths.append(out_dir / f"{name}.json")
        sidecar = {"figure": name, "caption": caption, **(provenance or {})}
        atomic_write_text(paths[-1], json.dumps(sidecar, indent=2, ensure_ascii=False, sort_keys=False) + "\n")
    return paths


#: the smallest value a log axis draws (`positive`): one below it is drawn there, and the axes say so (`mark_floor`)
FLOOR = 1e-16
#: the artist id of the note `mark_floor` puts on the axes, once
FLOOR_NOTE = "floored"


def positive(values: Sequence[float], floor: float = FLOOR, ax=None) -> list[float]:
    """Values for a log axis: non-finite ones become nan (a gap), those below ``floor`` (0 too) the floor.  With
    ``ax``, the axes they are drawn on, a value floored is said on them (`mark_floor`), never silently."""
    if ax is not None and floored(values, floor):
        mark_floor(ax, floor)
    return [max(float(v), floor) if v is not None and math.isfinite(float(v)) else math.nan for v in values]


def floored(values: Sequence[float], floor: float = FLOOR) -> bool:
    """Whether `positive` draws one of ``values`` at ``floor``: a finite one below it."""
    return any(v is not None and math.isfinite(float(v)) and float(v) < floor for v in values)


def mark_floor(ax, floor: float = FLOOR) -> None:
    """Say on ``ax`` that some values below ``floor`` are drawn at it: one note under its x-axis label ("values below
    1e-16 drawn at 1e-16"), outside the data and the legend, once however many curves were floored; no line is added
    (``ax.lines`` stays one a curve)."""
    if any(text.get_gid() == FLOOR_NOTE for text in ax.texts):
        return
    ax.annotate(f"values below {floor:g} drawn at {floor:g}", xy=(0.5, 0), xycoords=ax.xaxis.label,
                xytext=(0, -2), textcoords="offset points", ha="center", va="top", fontsize=7, color="dimgrey",
                gid=FLOOR_NOTE)


#: colours (tab10), then markers, then line styles: the product of the three, colour fastest, is `curve_style`'s
#: cycle, so that no two of the first 400 curves of a figure look alike (the first 10 as matplotlib's defaults
#: with round markers; 100 with solid lines)
CURVE_COLOURS = tuple(matplotlib.colors.to_hex(c) for c in matplotlib.colormaps["tab10"].colors)
CURVE_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "<", ">")
CURVE_LINESTYLES = ("-", "--", ":", "-.")


def curve_styles():
    """The cycler `curve_style` walks: line style x marker x colour (`CURVE_COLOURS` fastest)."""
    from cycler import cycler

    return (cycler(linestyle=list(CURVE_LINESTYLES)) * cycler(marker=list(CURVE_MARKERS))
            * cycler(color=list(CURVE_COLOURS)))


def curve_style(k: int) -> dict:
    """The ``k``-th curve's colour, marker and line style (``ax.plot(x, y, **curve_style(k))``), distinct from every
    other of a figure's first `len(curve_styles())` (400) curves; after those they come round again.  Every figure
    that draws one curve per run takes its looks from here."""
    styles = list(curve_styles())
    return dict(styles[k % len(styles)])


def checked_out(out: str | Path, file: str | None = None) -> Path:
    """A figure command's ``--out``, checked before its work (reading runs, making missing ones): the folder its
    files go into (`dane.records.results.output_folder`), or with ``file`` (a name to suggest) the one file it names
    (`dane.records.results.output_file`); a path it could not write is one line and exit 2."""
    try:
        return output_file(out, "--out", file) if file else output_folder(out, "--out")
    except UserError as exc:
        say(f"error: {exc}")
        raise SystemExit(2) from None


class _FigureParser(argparse.ArgumentParser):
    """A figure command's parser (`cli`'s, `bench_parser`'s with a figure): ``--out`` is `checked_out` once parsed."""

    def parse_args(self, args=None, namespace=None):
        parsed = super().parse_args(args, namespace)
        checked_out(parsed.out)
        return parsed


def cli(main, doc: str, results: str = "results") -> None:
    """The command line every figure script shares: ``--results`` in (default ``results``, or the script's own run
    folder), ``--out`` for the files; prints their paths.  A run the figure cannot use (`MissingCount`: a count its
    records lack) or another `UserError` is one line naming the run and the fix, and exit 2."""
    parser = _FigureParser(prog=command_name(), description=doc.splitlines()[0])
    parser.add_argument("--results", default=results)
    parser.add_argument("--out", default=str(FIG_DIR), help="where the files go (default results/figures)")
    args = parser.parse_args()
    try:
        written = main(args.results, args.out)
    except (MissingCount, UserError) as exc:
        say(f"error: {parser.prog}: {' '.join(str(exc).split())}")
        raise SystemExit(2) from None
    if not written:  # a figure whose runs are missing draws nothing (make_all says so for all of them): say it here
        say(f"error: nothing drawn: the runs it reads are missing under {args.results}; make tables (dane figures "
            "--nn) makes them")
        raise SystemExit(2)
    for path in written:
        print(path)


def bench_parser(doc: str, page: str | Path | None, *, several: str | None = None, figure: bool = False,
                 page_aliases: Sequence[str] = ()):
    """The command line every script that renders a benchmark's JSON into a page's block shares: ``--json`` (default
    results/bench.json; ``several``, the help saying what several files are, takes one or more), ``--out`` where
    the script also draws a ``figure`` (default results/figures), ``--page`` (default ``page``, also spelled
    ``page_aliases``), ``--print`` (the block to stdout, not into the page); ``page`` None: a figure that writes no
    block (no ``--page``, ``--print``).  The script adds its own options."""
    parser = (_FigureParser if figure else argparse.ArgumentParser)(prog=command_name(),
                                                                     description=doc.splitlines()[0])
    if several is None:
        parser.add_argument("--json", default="results/bench.json", help="the benchmark's JSON")
    else:
        parser.add_argument("--json", nargs="+", default=["results/bench.json"], help=several)
    if figure:
        parser.add_argument("--out", default=str(FIG_DIR), help="where the figure goes (default results/figures)")
    if page is not None:
        parser.add_argument("--page", *page_aliases, dest="page", default=str(page),
                            help="the page whose block(s) the output replaces (default: %(default)s)")
        parser.add_argument("--print", action="store_true", help="write the table(s) to stdout, not into the page")
    return parser


def bench_figure(source: str | Path, key: str, out: str | Path, name: str, *, draw, render, command: str,
                 what: str, codes=None) -> list[Path]:
    """The figure ``name`` of section ``key`` of the one JSON ``source``: ``draw(section)``, its table
    ``render(section, source)`` as ``name``.md, and the sidecar (`bench_provenance`, the commits of ``codes``) and
    caption (`bench_caption`, ``what`` first) naming the file; no page is written."""
    section = bench_section(source, key)
    sidecar = bench_provenance([source], [section], command, codes)
    return save(draw(section), out, name, render(section, repo_path(source)), provenance=sidecar,
                caption=bench_caption(what, sidecar))
