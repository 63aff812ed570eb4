"""The one log schema: ``rounds.jsonl`` (one JSON record per round, append-only) and ``summary.json``.

Every record has ``round, time_s, bytes_sent, comm_rounds, objective`` and, where the
problem knows them, ``suboptimality`` and ``grad_norm``; algorithms add their own keys
(``mu``, ``accepted``, ``primal_residual``, ...).  ``time_s`` is wall time under a
launcher and simulated parallel time in the in-process simulator; ``bytes_sent`` is what
rank 0 sent.  Figures read these files and nothing else.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from .provenance import run_provenance

ROUNDS_FILE = "rounds.jsonl"
SUMMARY_FILE = "summary.json"


def _clean(value):
    """JSON has no inf or nan; write them as strings so a diverged run is still readable."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class RunWriter:
    """Appends round records and writes the summary; flushes every line so a crash loses nothing.

    The summary also gets ``provenance`` (`dane.provenance.run_provenance`, taken when the
    writer opens: commit, command, start time, host, load average).
    """

    def __init__(self, out_dir: str | Path):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.provenance = run_provenance()
        self._rounds = open(self.out_dir / ROUNDS_FILE, "a", buffering=1)

    def write_round(self, record: dict) -> None:
        self._rounds.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")

    def write_summary(self, summary: dict) -> None:
        tmp = self.out_dir / (SUMMARY_FILE + ".tmp")
        summary = {**summary, "provenance": summary.get("provenance", self.provenance)}
        tmp.write_text(json.dumps({k: _clean(v) for k, v in summary.items()}, indent=2) + "\n")
        tmp.replace(self.out_dir / SUMMARY_FILE)

    def write_text(self, name: str, text: str) -> None:
        (self.out_dir / name).write_text(text)

    def close(self) -> None:
        self._rounds.close()


def _number(value):
    return float(value) if isinstance(value, str) and value in ("inf", "-inf", "nan") else value


def read_rounds(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / ROUNDS_FILE
    with open(path) as f:
        return [{k: _number(v) for k, v in json.loads(line).items()} for line in f if line.strip()]


def read_summary(run_dir: str | Path) -> dict:
    return {k: _number(v) for k, v in json.loads((Path(run_dir) / SUMMARY_FILE).read_text()).items()}


def find_runs(root: str | Path) -> list[Path]:
    """Every run directory (one holding a summary.json) under ``root``, sorted."""
    return sorted(p.parent for p in Path(root).rglob(SUMMARY_FILE))
