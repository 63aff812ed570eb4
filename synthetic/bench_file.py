"""The benchmark JSON (results/bench.json): every benchmark script merges its own key into it."""
from __future__ import annotations

import json
from pathlib import Path

from dane.results import atomic_write_text


def read_bench(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def merge_section(path: Path, key: str, value: dict) -> dict:
    """Put ``value`` under ``key`` in the JSON at ``path``, other keys kept, atomically; returns the whole file."""
    merged = read_bench(path)
    merged[key] = value
    atomic_write_text(path, json.dumps(merged, indent=2, allow_nan=False, default=str) + "\n")
    return merged
