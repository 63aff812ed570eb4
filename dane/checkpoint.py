"""Per-worker checkpoints in a run directory, and resuming a run in place.

Every ``checkpoint_every`` rounds each worker writes ``<run dir>/checkpoint/rank<r>.pt``
(atomically: a temporary file, then a rename): the state `dane.runner.run` hands out
(next round, cost counters, first record, early-stopping state, ``algo.state_dict()``)
plus what the run was (algorithm, problem, workers).  Resuming loads the file of the
worker's own rank, checks it belongs to the same kind of run, and rank 0 cuts
``rounds.jsonl`` back to the rounds before the checkpoint, so that the finished run
directory reads exactly like one uninterrupted run.  All ranks must see the run
directory (one machine, or a shared file system).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from .errors import ConfigError
from .results import ROUNDS_FILE

CHECKPOINT_DIR = "checkpoint"


def checkpoint_path(run_dir: str | Path, rank: int) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR / f"rank{rank}.pt"


def save_checkpoint(run_dir: str | Path, rank: int, state: dict, meta: dict) -> None:
    path = checkpoint_path(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(_plain({**state, "meta": meta}), tmp)
    tmp.replace(path)


def _plain(value):
    """numpy scalars (the simulator's clock, say) as Python numbers, so that ``weights_only`` loading accepts them."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, np.generic):
        return value.item()
    return value


def load_checkpoint(run_dir: str | Path, rank: int, meta: dict) -> dict:
    """The checkpoint of ``rank`` in ``run_dir``; a `ConfigError` naming the mismatch if it is not this run's kind."""
    path = checkpoint_path(run_dir, rank)
    if not path.is_file():
        raise ConfigError(f"resume={run_dir} has no {CHECKPOINT_DIR}/{path.name}; "
                          f"was it run with checkpoint_every > 0 and as many workers ({meta['workers']})?")
    state = torch.load(path, weights_only=True)
    for key, value in meta.items():
        if state["meta"].get(key) != value:
            raise ConfigError(f"resume={run_dir} was a run with {key}={state['meta'].get(key)}, "
                              f"this one has {key}={value}; resume with the same {key}")
    return state


def truncate_rounds(run_dir: str | Path, next_round: int) -> None:
    """Keep only the records of rounds before ``next_round`` in ``rounds.jsonl`` (the checkpoint's past)."""
    path = Path(run_dir) / ROUNDS_FILE
    if not path.is_file():
        return
    kept = [line for line in path.read_text().splitlines(keepends=True)
            if line.strip() and json.loads(line)["round"] < next_round]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(kept))
    tmp.replace(path)
