"""One row per job of a sweep (or any folder of runs): how it ended, and how soon it reached a tolerance.

    dane figures summary results/sweeps/2024-05-01_12-00-00-123456_4242 [--tol 1e-8] [--key suboptimality] [--json]

A job is a directory under the folder that holds ``rounds.jsonl`` or ``summary.json``
(as `dane.records.results` writes them), an error file, or Hydra's ``.hydra/`` (a job that
stopped before its first record).  Its status is the summary's; with records but no
summary it is ``running or crashed``, with an error file or nothing at all ``failed``, followed by why where the
error file says it (its first line, `failure_reason`: ``failed: algorithm.lr must be > 0, got -1``; with ``--json``
the row's ``reason``).
Each row names the job and, beside it, the method (its display name: the ``label`` its summary.json records, else
its algorithm class's, `dane.algorithm.label_of_run`).
"To tol" is the round and the allreduce count (``comm_rounds``) of the first record whose
``--key`` is at most ``--tol`` (absolute, not the run's own ``tol``, which is relative, nor ``dane figures
local_work``'s target, relative too), ``-`` if none is; the column's header says "(absolute)".  Without
``--key``, the key is ``suboptimality``, or ``grad_norm`` for a run whose records carry no suboptimality (no
reference optimum), and the column's header names the key of each row.  Rounds alone rank no method: beside them,
at that record and at the end, are the bits up and down (`TRAFFIC`: "bits up/down", one worker's ``uplink_bits`` and
``downlink_bits``, else the participants' sum marked Σ, ``clients_uplink_bits`` or ``uplink_bytes`` x 8) and the local
work ("passes/HVPs/Hessians/factorizations": ``local_passes``, ``local_hvps``, ``local_hessians``,
``local_factorizations``, `dane.work`), ``-`` where the records do not count them.  Final values come from
``summary.json`` (its ``local_work`` for the counts) when there is one, else from the last complete record.  Prints a
markdown table, or with ``--json`` a list of objects (non-finite numbers as the strings "inf", "nan"), each with
every `TRAFFIC` key and every `dane.work.COUNTS` total as ``<key>_to_tol`` and ``final_<key>`` (null where not
recorded) and the method as ``label``.

A damaged file is in its job's status: ``damaged summary.json``, or the summary's status
and what is wrong with ``rounds.jsonl`` (``max_rounds; rounds.jsonl damaged (line 3)``,
``max_rounds; no rounds.jsonl``: a finished run's log missing, unreadable, damaged or cut
short); its rounds then come from the summary and "to tol" is ``?`` where the records
before the damage did not reach it.  After the table each such file gets one line naming
it and the fix, and the exit status is 2.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Iterable
from fnmatch import fnmatch
from pathlib import Path
from typing import NamedTuple

import yaml

from dane.errors import DataError, say
from dane.records.results import ROUNDS_FILE, SUMMARY_FILE, RoundsUnreadable, read_summary, scan_rounds
from dane.records.results import read_config as parsed_config
from dane.paper_figs.blocks import SECOND_ORDER, count
from dane.paper_figs.common import first_reaching, natural_key
from dane.records.provenance import command_name

#: a file a launcher or wrapper leaves when a job fails
ERROR_FILES = ("error", "error.txt", "error.log", "*.err")
RUNNING = "running or crashed"
FAILED = "failed"
DAMAGED = "damaged summary.json"


def error_names(names: Iterable[str]) -> list[str]:
    """Those of ``names`` (a folder's) that name an error file (`ERROR_FILES`), in the order of the patterns there,
    each pattern's in sorted order: a job is one where there is any (`job_dirs`), and `error_file` is the first."""
    names = sorted(names)
    return [name for pattern in ERROR_FILES for name in names if fnmatch(name, pattern)]


def error_file(run_dir: str | Path) -> Path | None:
    """The job's error file (`error_names`: the first of the order there that is a file), or None."""
    try:
        names = os.listdir(run_dir)
    except OSError:
        return None
    return next((path for name in error_names(names) if (path := Path(run_dir) / name).is_file()), None)


def failure_reason(run_dir: str | Path) -> str | None:
    """Why a failed job failed, in one line: the first line of its error file (`error_file`: a sweep's job leaves
    its one-line refusal in ``error.txt``), its ``error: `` dropped ("algorithm.lr must be > 0, got -1"); for a
    traceback, its last line (the exception); None where the job has no error file or it says nothing."""
    path = error_file(run_dir)
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = [line.strip() for line in f.read(1 << 16).splitlines() if line.strip()]
    except OSError:
        return None
    if not lines:
        return None
    line = lines[-1] if lines[0].startswith("Traceback") else lines[0]
    return line.removeprefix("error: ")


def job_dirs(root: str | Path) -> list[Path]:
    """Every job directory under ``root`` (``root`` itself when it is one), in job order."""
    found = []
    for here, subdirs, files in os.walk(root):
        if ROUNDS_FILE in files or SUMMARY_FILE in files or ".hydra" in subdirs or error_names(files):
            found.append(Path(here))
        subdirs[:] = [d for d in subdirs if not d.startswith(".")]
    return sorted(found, key=natural_key)


def records_of(run_dir: str | Path) -> tuple[list[dict], str | None, str | None]:
    """The complete records of ``rounds.jsonl``, what is wrong with the file in a few words (None if nothing), and
    the line naming the file and the fix where it is unreadable or damaged (None else).

    A run still writing, or killed mid-line, leaves a torn last line: the records before it
    are returned with the problem named, so a caller can use them or skip the run.  A missing or
    unreadable file, or a damaged line before the last, is named the same way, with the records
    before the damage (`dane.records.results.scan_rounds`; ``read_rounds`` raises its one line).
    """
    try:
        records, torn = scan_rounds(run_dir)
    except RoundsUnreadable as exc:
        return exc.records, exc.problem, str(exc)
    if torn is not None:
        return records, f"{ROUNDS_FILE} has a torn last line (line {torn} of {torn})", None
    return records, None if records else f"{ROUNDS_FILE} is empty", None


def read_config(run_dir: str | Path) -> dict:
    """The run's saved config (``config.yaml``), or {} when there is none or it does not parse (or read)."""
    try:
        loaded = parsed_config(run_dir)
    except (yaml.YAMLError, OSError, UnicodeDecodeError):  # not YAML, not text, a directory: as no config
        return {}
    return loaded if isinstance(loaded, dict) else {}


def summary_of(run_dir: Path, notes: list[str] | None = None) -> dict | None:
    """The job's summary.json; {} where it has none, None where it is damaged (its status then says so, and
    ``notes`` gets `read_summary`'s line naming the file and the fix)."""
    if not (run_dir / SUMMARY_FILE).exists():
        return {}
    try:
        return read_summary(run_dir)
    except DataError as exc:
        if notes is not None:
            notes.append(str(exc))
        return None


def status_of(run_dir: Path, summary: dict | None) -> str:
    """The job's status from its `summary_of` (read once by the caller, which also reads its keys)."""
    if summary is None:
        return DAMAGED
    if summary:
        return str(summary.get("status", "-"))
    if error_names(os.listdir(run_dir)):
        return FAILED
    return RUNNING if (run_dir / ROUNDS_FILE).exists() else FAILED


#: the statuses of a run that stopped where its stop rule said: a figure names any other (`ending`)
STOPPED_AS_ASKED = ("converged", "max_rounds", "target_reached", "early_stopped")


def stopped_at(last_round, status: str | None) -> str:
    """"stopped at round 168 (interrupted)": where a run's records end and the status its summary gives."""
    return f"stopped at round {last_round} ({status or 'status not recorded'})"


class Ending(NamedTuple):
    """What a figure says of a run that did not stop where its stop rule said (`ending`): the ``note`` its legend
    entry or title carries, and for a run without a (readable) summary.json the ``line`` naming it on stderr."""
    note: str
    line: str | None = None


def ending(run_dir: Path, last_round) -> Ending | None:
    """How a drawn run ended, where a figure should say it (None where it stopped as asked, `STOPPED_AS_ASKED`):
    "no summary: running or crashed" (`status_of`) for records without a summary.json (a run still writing, or
    killed), its summary's damage, or `stopped_at` its last record's round for a summary's other status
    ("stopped at round 168 (interrupted)", diverged); ``last_round`` is the round of its last record drawn."""
    summary = summary_of(run_dir)
    if summary and summary.get("status") in STOPPED_AS_ASKED:
        return None
    if summary:
        return Ending(stopped_at(last_round, summary.get("status")))
    note = DAMAGED if summary is None else f"no summary: {status_of(run_dir, summary)}"
    reason = failure_reason(run_dir) if note.endswith(FAILED) else None  # its error file's line: on stderr
    return Ending(note, f"{run_dir}: {note}{f' ({reason})' if reason else ''}; drawn up to its last record, round "
                        f"{last_round}")


#: what `records_of` says of a job that has not logged (yet) or was cut short mid-line: a row of its own only
#: where the job also has a summary (it finished, so its log should hold every round)
UNFINISHED = (f"no {ROUNDS_FILE}", f"{ROUNDS_FILE} is empty", f"{ROUNDS_FILE} has a torn last line")


def records_problem(run_dir: Path, problem: str | None, line: str | None, finished: bool) -> str | None:
    """One line naming the job's rounds.jsonl and the fix, where its records cannot be the run's whole log: the
    file is unreadable or damaged before its last line, or the job finished and the file is missing, empty or cut
    short (its rows' rounds and "to tol" would disagree with its summary); None where the log is as it should be.
    ``problem`` and ``line`` are `records_of`'s."""
    if problem is None or (not finished and problem.startswith(UNFINISHED)):
        return None
    if line is not None:
        return line
    return (f"{run_dir / ROUNDS_FILE}: {problem}, though the run has a {SUMMARY_FILE}; the file was cut short or "
            f"damaged after the run; restore it, or rerun the run (out_dir={run_dir} overwrite=true replaces it)")


#: the key "to tol" compares with ``--tol`` where none is given, and the one for a run without it (`key_of`)
KEY, FALLBACK = "suboptimality", "grad_norm"


def key_of(records: list[dict], key: str | None) -> str | None:
    """The record key a job's "to tol" compares: ``key`` where given, else `KEY`, or `FALLBACK` where its records
    carry no `KEY` (a run without a reference optimum); None for a job with no records."""
    if key is not None:
        return key
    if not records:
        return None
    return KEY if any(r.get(KEY) is not None for r in records) else FALLBACK


#: the records' traffic by direction (docs/results.md), each in a row at "to tol" and at the end: ``uplink_bits``,
#: ``downlink_bits`` one worker's bits in the method's messages; the ``clients_`` bits and the ``_bytes`` the
#: participants' summed (FedNL's exact bits, a federated method's bytes)
TRAFFIC = ("uplink_bits", "downlink_bits", "clients_uplink_bits", "clients_downlink_bits", "uplink_bytes",
           "downlink_bytes")
#: the local work the table shows, passes then the second-order counts (`paper_figs.blocks.SECOND_ORDER`); --json
#: has every total of `dane.work.COUNTS`
SHOWN_WORK = ("local_passes", *SECOND_ORDER)


def costs(record: dict, keys: Iterable[str], suffix: str = "", prefix: str = "") -> dict:
    """``record``'s value of each of ``keys`` (None where it has none) under ``prefix`` + key + ``suffix``."""
    return {f"{prefix}{key}{suffix}": record.get(key) for key in keys}


def label(summary: dict, algorithm: str | None) -> str | None:
    """The method's display name (`dane.algorithm.label_of_run`): the ``label`` its summary.json records, else (a
    summary from before runs recorded one, or none) the class's of ``algorithm``, the name its summary or config.yaml
    gives; None where neither names one."""
    if summary.get("label") or not isinstance(algorithm, str):
        return summary.get("label")
    from dane.algorithm import label_of_run  # here, not for --help: the classes import torch

    return label_of_run(summary, algorithm)


def row(run_dir: Path, root: Path, tol: float, key: str | None, notes: list[str] | None = None) -> dict:
    """One job's line of the table, as plain values (None where unknown).  A damaged summary.json or rounds.jsonl
    is in the status (``max_rounds; rounds.jsonl damaged (line 3)``), and ``notes`` gets a line naming the file and
    the fix; the rounds then come from the summary, and "to tol" only from the records before the damage.  The
    traffic (`TRAFFIC`) and local work (`dane.work.COUNTS`) "to tol" are the first record's that reaches it
    (``_to_tol``), the final ones (``final_``) summary.json's (its ``local_work``), else the last record's."""
    from dane.work import COUNTS  # here, not for --help: dane.work imports torch

    records, problem, line = records_of(run_dir)
    found = summary_of(run_dir, notes)
    summary = found or {}
    config = read_config(run_dir)
    status = status_of(run_dir, found)
    note = records_problem(run_dir, problem, line, finished=found != {})
    if note is not None:
        status = f"{status}; {problem}"
        if notes is not None:
            notes.append(note)
    last = records[-1] if records else {}
    key = key_of(records, key)
    hit = first_reaching(records, tol, key) if key else None
    algorithm = config.get("algorithm")
    name = run_dir.relative_to(root).as_posix()
    named = summary.get("algorithm") or (algorithm.get("name") if isinstance(algorithm, dict) else None)
    work = summary.get("local_work") if isinstance(summary.get("local_work"), dict) else {}
    ended = {**costs(last, (*TRAFFIC, *COUNTS)), **{k: summary[k] for k in TRAFFIC if k in summary}, **work}
    return {
        "job": run_dir.name if name == "." else name,
        "label": label(summary, named),
        "status": status,
        "reason": failure_reason(run_dir) if status == FAILED else None,
        "algorithm": named,
        "workers": summary.get("workers") or config.get("workers"),
        "rounds": summary.get("rounds", last.get("round")) if note else last.get("round", summary.get("rounds")),
        "key": key,
        "rounds_to_tol": hit["round"] if hit else None,
        "comm_rounds_to_tol": hit.get("comm_rounds") if hit else None,
        **costs(hit or {}, (*TRAFFIC, *COUNTS), suffix="_to_tol"),
        "final_objective": summary.get("final_objective", last.get("objective")),
        "final_suboptimality": summary.get("final_suboptimality", last.get("suboptimality")),
        "final_test_accuracy": summary.get("final_test_accuracy", last.get("test_accuracy")),
        **costs(ended, (*TRAFFIC, *COUNTS), prefix="final_"),
        "time_s": summary.get("time_s", last.get("time_s")),
    }


def summarize(root: str | Path, tol: float = 1e-8, key: str | None = None,
              notes: list[str] | None = None) -> list[dict]:
    """The rows of every job under ``root``, each with the ``key`` its "to tol" compared (`key_of`: ``key``, else
    suboptimality, or grad_norm for a run without it); ``notes`` (when given) gets one line per damaged file (`row`)."""
    root = Path(root)
    return [row(run_dir, root, tol, key, notes) for run_dir in job_dirs(root)]


def _cell(value, fmt: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, fmt or ".6g")
    return str(value)


def tol_header(rows: list[dict], tol: float) -> tuple[str, str | None]:
    """The "to tol" column's header, naming the key its rows compared with ``tol`` and that ``tol`` is absolute (the
    record's value itself, not relative to |O*| as the run's own ``tol`` and `dane figures local_work`'s target
    are), and where they compared both (`key_of`: no --key, and some runs without suboptimality) `FALLBACK`, whose
    cells are marked; else None."""
    keys = {r["key"] for r in rows if r["key"] is not None} or {KEY}
    if len(keys) == 1:
        return f"rounds/comm to {keys.pop()} <= {tol:g} (absolute)", None
    return f"rounds/comm to {KEY} <= {tol:g} (absolute; * {FALLBACK} <= {tol:g}: a run without {KEY})", FALLBACK


#: what a "bits up/down" cell's Σ means (`bits_cell`), in the header where a cell has one
SUMMED = "Σ: summed over the participants"


def bits_cell(r: dict, where: str, unknown: str = "-") -> str:
    """"up/down" bits of a row ``where`` (``_to_tol``, or ``final_`` first): one worker's ``uplink_bits`` and
    ``downlink_bits``, else the participants' sum marked Σ (`SUMMED`: ``clients_uplink_bits``, or ``uplink_bytes``
    x 8), - for a direction the record counts in none of them (one - for both); ``unknown`` where ``where`` is "to
    tol" and no record reached it."""
    if where == "_to_tol" and r["rounds_to_tol"] is None:
        return unknown

    def value(key: str):
        return r[f"final_{key}" if where == "final_" else f"{key}{where}"]

    cells = []
    for direction in ("uplink", "downlink"):
        own, clients, octets = (value(f"{direction}_bits"), value(f"clients_{direction}_bits"),
                                value(f"{direction}_bytes"))
        cells.append(count_cell(own) if own is not None else f"{count_cell(clients)} Σ" if clients is not None
                     else f"{count_cell(8 * octets)} Σ" if octets is not None else "-")
    return "-" if cells == ["-", "-"] else "/".join(cells)


def work_cell(r: dict, where: str, unknown: str = "-") -> str:
    """"passes/HVPs/Hessians/factorizations" of a row ``where`` (`SHOWN_WORK`, as `bits_cell`; one - where the record
    counts none of them: a run from before `dane.work`, or a job without records)."""
    if where == "_to_tol" and r["rounds_to_tol"] is None:
        return unknown
    cells = [count_cell(r[f"final_{key}" if where == "final_" else f"{key}{where}"]) for key in SHOWN_WORK]
    return "-" if set(cells) == {"-"} else "/".join(cells)


def count_cell(value) -> str:
    """A traffic or work count: - where not recorded (`paper_figs.blocks.count`, a whole number as one)."""
    return "-" if value is None else count(value, ".4g")


def markdown(rows: list[dict], tol: float) -> str:
    accuracy = any(r["final_test_accuracy"] is not None for r in rows)
    to, marked = tol_header(rows, tol)
    body, bits_cells = [], []
    for r in rows:
        unknown = "?" if ROUNDS_FILE in r["status"] else "-"  # the records before the damage did not reach it
        to_tol = unknown if r["rounds_to_tol"] is None else f"{r['rounds_to_tol']}/{_cell(r['comm_rounds_to_tol'])}"
        to_tol += " *" if marked is not None and r["key"] == marked else ""
        status = r["status"] if r.get("reason") is None else f"{r['status']}: {r['reason']}"
        bits_cells += [bits_cell(r, "_to_tol", unknown), bits_cell(r, "final_")]
        body.append([r["job"], _cell(r["label"]), status.replace("|", "\\|"), _cell(r["algorithm"]),
                     _cell(r["workers"]), _cell(r["rounds"]), to_tol, bits_cells[-2], work_cell(r, "_to_tol", unknown),
                     _cell(r["final_objective"], ".10g"), _cell(r["final_suboptimality"], ".3e"),
                     *([_cell(r["final_test_accuracy"], ".4f")] if accuracy else []), bits_cells[-1],
                     work_cell(r, "final_"), _cell(r["time_s"], ".4g")])
    bits = "bits up/down" + (f" ({SUMMED})" if any("Σ" in cell for cell in bits_cells) else "")
    work = "/".join(("passes", *SECOND_ORDER.values()))
    head = ["job", "method", "status", "algorithm", "workers", "rounds", to, f"{bits} to tol", f"{work} to tol",
            "final objective", "final suboptimality", *(["final test accuracy"] if accuracy else []), bits, work,
            "time_s"]
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
                      *("| " + " | ".join(cells) + " |" for cells in body)])


def _finite(value):
    """JSON has no inf or nan: write them as strings, as `dane.records.results` does."""
    return str(value) if isinstance(value, float) and not math.isfinite(value) else value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=command_name(), description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", help="a sweep directory, or any folder holding run directories")
    parser.add_argument("--tol", type=float, default=1e-8,
                        help="the absolute tolerance of the 'to tol' column (default 1e-8): the record's value itself, "
                             "not relative to |O*| as the run's own tol")
    parser.add_argument("--key", help=f"the record key compared with --tol (default {KEY}, or {FALLBACK} for a run "
                                       "whose records carry no suboptimality: no reference optimum)")
    parser.add_argument("--json", action="store_true", help="print a JSON list instead of the markdown table")
    args = parser.parse_args(argv)
    if not Path(args.sweep_dir).is_dir():
        say(f"error: {args.sweep_dir} is not a directory")
        return 2
    notes: list[str] = []
    rows = summarize(args.sweep_dir, args.tol, args.key, notes)
    if not rows:
        print(f"error: no runs under {args.sweep_dir} (no {ROUNDS_FILE}, {SUMMARY_FILE} or .hydra/ in it)",
              file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([{k: _finite(v) for k, v in r.items()} for r in rows], indent=2))
    else:
        print(markdown(rows, args.tol))
    for note in notes:  # after the table, whose rows say which jobs: one line per damaged file, and status 2
        say(f"error: {' '.join(note.split())}")
    return 2 if notes else 0


if __name__ == "__main__":
    sys.exit(main())
