"""Overlapping shards, the "random increments" of the MPI master/worker source system (``problem.data.overlap``).

Worker i keeps its own partition S_i (`dane.data.sharding.shard_indices`) and adds
random blocks until it holds ``absolute_factor`` · N rows: each block is
``load_factor`` · N consecutive rows (at least one) of a seeded permutation of all N
training rows, starting at a random offset (wrapping around); rows it already holds
are not counted twice, and the last block is cut so that the worker ends with exactly
⌈absolute_factor · N⌉ rows (or its partition, if that is larger).  The draws depend on
(seed, worker) only, through ``numpy.random.default_rng``, so every process computes
the same shards without communicating.  `describe` is the one line a run logs.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .. import checks
from ..errors import ConfigError


def check_factors(load_factor: float, absolute_factor: float) -> None:
    for key, value in (("problem.data.load_factor", load_factor), ("problem.data.absolute_factor", absolute_factor)):
        if not 0 < checks.positive(key, value) <= 1:
            raise ConfigError(f"{key} must be in (0, 1] (a share of the training rows), got {value}")


def overlap_shards(shards: list[torch.Tensor], n: int, *, load_factor: float, absolute_factor: float,
                   seed: int) -> list[torch.Tensor]:
    """Each shard grown by random blocks of the rows to ⌈absolute_factor · n⌉ rows (sorted int64 indices)."""
    check_factors(load_factor, absolute_factor)
    block, target = max(1, round(load_factor * n)), math.ceil(absolute_factor * n)
    out = []
    for worker, shard in enumerate(shards):
        rng = np.random.default_rng([seed, worker, 7])
        order = rng.permutation(n)
        held = set(shard.tolist())
        while len(held) < target:
            start = int(rng.integers(n))
            rows = order[(start + np.arange(block)) % n]
            for row in rows.tolist():
                if len(held) >= target:
                    break
                held.add(row)
        out.append(torch.tensor(sorted(held), dtype=torch.int64))
    return out


def describe(shards: list[torch.Tensor], n: int, load_factor: float, absolute_factor: float) -> str:
    sizes = ", ".join(str(len(s)) for s in shards)
    return (f"data.overlap: each worker's partition grown by random blocks of {load_factor:g} x {n} rows to "
            f"{absolute_factor:g} of the data; rows per worker: {sizes}")
