"""Where a figure's numbers came from: its sidecar (``NAME.json``) and the caption line that says it.

A figure drawn from runs lists each run's code commit, command, seed, start time, load average and α-β
(`figure_provenance`, from its ``summary.json`` and ``config.yaml``: `run_config`), and its caption gives their
commits, seeds, dates and loads in one line (`caption_line`).  A figure or table drawn from benchmark JSON names the
file, the commands that made it (a tracked file's from docs/design.md's Evidence table: `evidence_command`) and the
commits its rows were measured at (`row_commits`, `commits_text`), read from the file's section (`bench_section`;
`bench_provenance`, `bench_caption`).  Nothing here depends on when it runs, so the same records give the same
sidecar and caption.  Drawing and saving are `paper_figs.common`'s.
"""
from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Iterable, Sequence

from dane.layout import CHECKOUT
from dane.records.results import read_config, read_summary


def run_config(run_dir: str | Path) -> dict:
    """A run's saved config (``config.yaml``), or {} where it has none (a figure reads each run's twice: its
    setting and its sidecar; parsed once per version of the file)."""
    path = Path(run_dir) / "config.yaml"
    if not path.exists():
        return {}
    stat = path.stat()
    return copy.deepcopy(_parsed(str(path.resolve()), stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=4096)
def _parsed(path: str, mtime_ns: int, size: int) -> dict:
    return read_config(Path(path).parent)


def _run_entry(run_dir: Path, root: Path | None) -> dict:
    summary = read_summary(run_dir)
    cfg = run_config(run_dir)
    provenance = summary.get("provenance", {})
    try:
        shown = str(run_dir.resolve().relative_to(root.resolve())) if root is not None else str(run_dir)
    except ValueError:
        shown = str(run_dir)
    return {
        "run": shown,
        "command": provenance.get("command"),
        "git_commit": provenance.get("git_commit"),
        "git_dirty": provenance.get("git_dirty"),
        "started_at": provenance.get("started_at"),
        "load_avg": provenance.get("load_avg"),
        "torch": provenance.get("torch"),
        "cpu_capability": provenance.get("cpu_capability"),
        "seed": cfg.get("seed"),
        "workers": summary.get("workers"),
        "backend": summary.get("backend"),
        "alpha": summary.get("alpha"),
        "beta": summary.get("beta"),
        "status": summary.get("status"),
    }


def figure_provenance(runs: Iterable[str | Path], root: str | Path | None = None, **extra) -> dict:
    """The sidecar of a figure drawn from ``runs``: one entry per run, and their ranges.

    ``extra`` holds what the figure itself adds (the α-β its times are put on, the data
    sizes, notes).  Runs are listed in sorted order, so the sidecar is the same however
    the script found them.
    """
    root = Path(root) if root is not None else None
    entries = [_run_entry(Path(p), root) for p in sorted({str(p) for p in runs})]
    dates = sorted(e["started_at"] for e in entries if e["started_at"])
    loads = [e["load_avg"][0] for e in entries if e["load_avg"]]
    return {
        "runs": entries,
        "commits": commit_names(entries),
        "seeds": sorted({e["seed"] for e in entries if e["seed"] is not None}),
        "dates": [dates[0], dates[-1]] if dates else None,
        "load_avg_1min": [min(loads), max(loads)] if loads else None,
        **extra,
    }


#: after a commit in a figure's sidecar and caption: a run of it came from a tree with uncommitted changes
MODIFIED_TREE = "(modified tree)"


def commit_names(entries: list[dict]) -> list[str]:
    """The commits the runs (`_run_entry`) came from, each once, sorted; ``<sha> (modified tree)`` where a run of it
    records ``git_dirty: true`` (its code was that commit plus changes no commit holds)."""
    dirty = {e["git_commit"] for e in entries if e["git_dirty"]}
    commits = sorted({e["git_commit"] for e in entries if e["git_commit"]})
    return [f"{c} {MODIFIED_TREE}" if c in dirty else c for c in commits]


def short_commit(name: str) -> str:
    """A `commit_names` entry for a caption: the sha's first 10 characters, then its marker if any."""
    sha, _, marker = name.partition(" ")
    return " ".join(filter(None, (sha[:10], marker)))


def row_commits(codes: Sequence[dict | None]) -> dict:
    """The commits of a table's rows from each row's code record (`dane.records.provenance.code_version`:
    ``git_commit``, ``git_dirty``; None where the row records none): ``commits`` (`commit_names`, `MODIFIED_TREE`
    where a record says ``git_dirty``), ``rows`` and ``rows_without_commit``: what an evidence figure's sidecar
    holds."""
    recorded = [c for c in codes if c and c.get("git_commit")]
    return {"commits": commit_names(recorded), "rows": len(codes), "rows_without_commit": len(codes) - len(recorded)}


def commits_text(codes: Sequence[dict | None] | dict) -> str:
    """What a generated table's header says of the code its rows were measured with (`row_commits`, or its answer):
    ``Measured at commit <sha>.`` (`short_commit`), ``... at commits <a>, <b>.`` where rows differ, ``...; commit
    not recorded for k of n rows.`` where some record none, and ``Commit not recorded.`` where none does."""
    found = codes if isinstance(codes, dict) else row_commits(codes)
    names, missing = [short_commit(name) for name in found["commits"]], found["rows_without_commit"]
    if not names:
        return "Commit not recorded."
    return (f"Measured at commit{'s' * (len(names) > 1)} {', '.join(names)}" +
            (f"; commit not recorded for {missing} of {found['rows']} rows." if missing else "."))


def caption_line(what: str, provenance: dict) -> str:
    """One line: what the figure shows, then where its numbers came from."""
    commits = provenance.get("commits") or ["unknown commit"]
    dates = provenance.get("dates")
    loads = provenance.get("load_avg_1min")
    parts = [what.rstrip("."),
             f"{len(provenance.get('runs', []))} runs",
             "code " + ", ".join(c if c == "unknown commit" else short_commit(c) for c in commits),
             f"seeds {','.join(map(str, provenance.get('seeds') or ['?']))}"]
    if dates:
        parts.append(f"run {dates[0][:10]}" + (f" to {dates[1][:10]}" if dates[1][:10] != dates[0][:10] else ""))
    if loads:
        parts.append(f"load avg {loads[0]:.2f}-{loads[1]:.2f}")
    if provenance.get("cost"):
        parts.append(provenance["cost"])
    return "; ".join(parts) + "."


def repo_path(path: str | Path) -> str:
    """``path`` as the repository names it (``paper_figs/evidence/compressed.json``) where it lies in this checkout,
    else as given: what a sidecar shows, whatever the working directory."""
    try:
        return Path(path).resolve().relative_to(CHECKOUT).as_posix() if CHECKOUT is not None else str(path)
    except ValueError:
        return str(path)


#: what a benchmark's section records about its run that a figure's sidecar repeats, where the section has it
BENCH_RUN_KEYS = ("started_at", "quick", "wall_s", "machine", "load_avg_after", "parts", "peers", "skipped")
#: the page whose table says how each tracked evidence file was made (its "Evidence" section)
DESIGN_PAGE = Path("docs") / "design.md"


def evidence_command(path: str | Path) -> str | None:
    """How a tracked evidence file was made: its row's "written by" cell in docs/design.md's Evidence table (the one
    place that records the options of a file whose JSON does not); None for any other file, or outside a checkout."""
    shown = repo_path(path)
    if CHECKOUT is None or not shown.startswith("paper_figs/evidence/") or not (CHECKOUT / DESIGN_PAGE).is_file():
        return None
    for line in (CHECKOUT / DESIGN_PAGE).read_text().splitlines():
        cells = line.strip().strip("|").split(" | ")
        if len(cells) == 3 and cells[0].strip() == f"`{shown}`":
            return cells[1].strip().replace("`", "")  # the page's code spans: the command's words
    return None


def bench_run(path: str | Path, section: dict, command: str, codes=None) -> dict:
    """What the run(s) that wrote benchmark ``section`` (the JSON at ``path``) record (`BENCH_RUN_KEYS`), with the
    commands that made it (``commands``, and where they were read: ``commands_from``) and, where ``codes(section)``
    gives its rows' code records, the commit(s) they were measured at (`row_commits`).

    A section written in ``parts`` (`scripts/bench_compressed.py`: each run's command line, start, loads and wall
    seconds) gives its parts' commands and is dated by the range of their starts (``dates``: first, last), its load by
    the range of its parts' 1-minute loads (``load_avg_1min``), its ``wall_s`` the sum of theirs: the section's own
    ``started_at``, ``wall_s``, ``load_avg_after`` and ``machine``'s load are the last part's (each run's save
    overwrites them), so they are not repeated.  Another section's command is docs/design.md's for a tracked file
    (`evidence_command`), else ``command`` (the section's, without the options the file does not record)."""
    entry = {"json": repo_path(path), **(row_commits(codes(section)) if codes else {})}
    parts = section.get("parts")
    if parts:
        starts = sorted(p["started_at"] for p in parts)
        loads = [p[k][0] for p in parts for k in ("load_avg_before", "load_avg_after") if k in p]
        entry.update(commands=[p["command"] for p in parts], commands_from="the file's parts",
                     dates=[starts[0], starts[-1]], load_avg_1min=[min(loads), max(loads)] if loads else None,
                     wall_s=round(sum(p.get("wall_s", 0.0) for p in parts), 1))
        if "machine" in section:
            entry["machine"] = {k: v for k, v in section["machine"].items() if k != "load_avg"}
        return {**entry, **{k: section[k] for k in ("quick", "parts", "peers", "skipped") if k in section}}
    documented = evidence_command(path)
    entry.update(commands=[documented or f"{command} (its options are not recorded in {entry['json']})"],
                 commands_from=f"{DESIGN_PAGE.as_posix()}, Evidence" if documented else "the section")
    return {**entry, **{k: section[k] for k in BENCH_RUN_KEYS if k in section}}


def bench_provenance(sources: Sequence[str | Path], sections: Sequence[dict], command: str, codes=None,
                     **extra) -> dict:
    """The sidecar of a figure drawn from benchmark JSON, not from runs: the files read (``json``, `repo_path`), the
    commands that made them (``commands``), the commit(s) of the rows shown (`row_commits` of ``codes(section)``
    over the files; none recorded without ``codes``) and per file what its run(s)
    recorded (`bench_run`; ``command`` is the benchmark section's, for a file that records no command of its own);
    ``extra`` is the figure's own."""
    runs = [bench_run(p, s, command, codes) for p, s in zip(sources, sections)]
    return {"json": [repo_path(p) for p in sources], "commands": [c for run in runs for c in run["commands"]],
            **row_commits([c for s in sections for c in codes(s)] if codes else []),
            "benchmarks": runs, **extra}


def bench_caption(what: str, provenance: dict) -> str:
    """One line: what the figure shows, then the JSON it was drawn from, each with its run's start and load (a file
    written in parts: how many, the range of their starts and of their loads) and its rows' commit(s)."""
    def when(b: dict) -> str:
        text = commits_text(b) if "commits" in b else ""
        commits = f"; {text[:1].lower()}{text[1:].rstrip('.')}" if text else ""
        if "dates" not in b:
            return f"started {b.get('started_at')}, load avg {b.get('machine', {}).get('load_avg')}{commits}"
        load = b.get("load_avg_1min")
        return (f"{len(b['parts'])} runs started {b['dates'][0]} to {b['dates'][1]}" +
                (f", load avg {load[0]:g}-{load[1]:g}" if load else "") + commits)

    runs = [f"{b['json']} ({when(b)})" for b in provenance["benchmarks"]]
    return f"{what.rstrip('.')}; from {', '.join(runs)}."


def bench_section(path: str | Path, key: str) -> dict:
    """Section ``key`` of the benchmark JSON at ``path``; a JSON without it is one line naming the run that writes
    it."""
    bench = json.loads(Path(path).read_text())
    if key not in bench:
        raise SystemExit(f"error: {path} holds no {key} section; run python -m scripts.bench {key} first")
    return bench[key]
