"""Split training indices across workers: IID, or label-skewed by a Dirichlet draw.

DANE's analysis assumes each worker holds an i.i.d. sample; the Dirichlet scheme
(Hsu, Qi and Brown, 2019) breaks that on purpose to study heterogeneous shards.
Shards depend only on the labels, the worker count and the seed (a
``numpy.random.default_rng(seed)``, no global state), so every process and every
backend computes the same shards without communicating.
"""

from __future__ import annotations

import numpy as np
import torch

from dane.errors import ConfigError

SCHEMES = ("iid", "dirichlet")


def shard_indices(
    labels: torch.Tensor, workers: int, *, scheme: str = "iid", alpha: float = 1.0, seed: int
) -> list[torch.Tensor]:
    """Partition ``range(len(labels))`` into ``workers`` non-empty shards of sorted int64 indices.

    ``iid``: a seeded permutation cut into pieces whose sizes differ by at most one.
    ``dirichlet``: for each class c, proportions p_c ~ Dir(alpha * 1_workers) decide
    how c's samples are divided among workers; small ``alpha`` gives each worker few
    classes, large ``alpha`` tends to IID. ``alpha`` is ignored by ``iid``.
    """
    n = len(labels)
    if scheme not in SCHEMES:
        raise ConfigError(f"unknown sharding scheme '{scheme}'; use one of: {', '.join(SCHEMES)}")
    if workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}")
    if workers > n:
        raise ConfigError(
            f"workers={workers} exceeds the {n} training samples; use fewer workers or more data"
        )
    if scheme == "dirichlet" and not alpha > 0:
        raise ConfigError(f"data.alpha must be > 0 for dirichlet sharding, got {alpha}")
    rng = np.random.default_rng(seed)
    if scheme == "iid":
        shards = np.array_split(rng.permutation(n), workers)
    else:
        shards = _dirichlet_shards(torch.as_tensor(labels).cpu().numpy(), workers, alpha, rng)
    return [torch.as_tensor(np.sort(shard), dtype=torch.int64) for shard in shards]


def _dirichlet_shards(
    labels: np.ndarray, workers: int, alpha: float, rng: np.random.Generator
) -> list[np.ndarray]:
    """Label-skewed shards, then a repair step so that no shard is empty.

    A small ``alpha`` can leave a worker with nothing, and a worker with no data has
    no gradient or Hessian to contribute. While some shard is empty, it takes one
    sample (the last) from the currently largest shard. Because there are at least as
    many samples as workers, the largest shard then holds at least two, so the move
    never empties it, and each move fills one empty shard: the loop ends after at most
    ``workers - 1`` moves and changes the skew by only that many samples.
    """
    pieces: list[list[np.ndarray]] = [[] for _ in range(workers)]
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        proportions = rng.dirichlet(np.full(workers, alpha))
        cuts = (np.cumsum(proportions)[:-1] * len(members)).astype(np.int64)
        for worker, part in enumerate(np.split(members, cuts)):
            pieces[worker].append(part)
    shards = [np.concatenate(parts) for parts in pieces]
    for empty in [w for w, shard in enumerate(shards) if len(shard) == 0]:
        donor = max(range(workers), key=lambda w: len(shards[w]))
        shards[empty], shards[donor] = shards[donor][-1:], shards[donor][:-1]
    return shards
