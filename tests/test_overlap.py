"""problem.data.overlap (dane.data.overlap): what each worker holds, the source system's "random increments"."""
from __future__ import annotations

import math

import pytest
import torch

from dane.data import shard_indices
from dane.data.overlap import overlap_shards
from dane.errors import ConfigError
from dane.problems.neural import DataConfig, ModelConfig, NeuralProblemConfig


def test_each_worker_keeps_its_partition_and_grows_to_the_absolute_factor_by_blocks():
    labels = torch.arange(1000) % 10
    shards = shard_indices(labels, 4, seed=3)
    grown = overlap_shards(shards, 1000, load_factor=0.05, absolute_factor=0.6, seed=3)
    for own, held in zip(shards, grown):
        assert set(own.tolist()) <= set(held.tolist())                  # its own partition, all of it
        assert len(held) == math.ceil(0.6 * 1000) and len(set(held.tolist())) == len(held)  # exactly 60%, no repeats
        assert torch.equal(held, held.sort().values)
    assert not torch.equal(grown[0], grown[1])                          # workers draw their own blocks
    assert all(torch.equal(a, b) for a, b in zip(grown, overlap_shards(shards, 1000, load_factor=0.05,
                                                                      absolute_factor=0.6, seed=3)))  # seeded
    other = overlap_shards(shards, 1000, load_factor=0.05, absolute_factor=0.6, seed=4)
    assert any(not torch.equal(a, b) for a, b in zip(grown, other))


def test_the_added_rows_come_in_blocks_of_the_seeded_permutation():
    """With one worker whose partition is empty of extra rows, the first block is load_factor x N consecutive
    rows of numpy's permutation for (seed, worker): the rows the source's random increment would add."""
    import numpy as np

    shards = [torch.tensor([], dtype=torch.int64)]
    (held,) = overlap_shards(shards, 100, load_factor=0.1, absolute_factor=0.1, seed=0)
    rng = np.random.default_rng([0, 0, 7])
    order = rng.permutation(100)
    start = int(rng.integers(100))
    assert set(held.tolist()) == set(order[(start + np.arange(10)) % 100].tolist())


def test_a_worker_of_a_run_holds_its_grown_shard_and_the_run_logs_it():
    config = NeuralProblemConfig(data=DataConfig(dataset="digits", overlap=True, load_factor=0.1, absolute_factor=0.5),
                                 model=ModelConfig(name="logreg"), device="cpu", seed=0)
    problems = [config.build(rank, 3) for rank in range(3)]
    n = len(config.dataset().train_y)
    assert [p.n_local for p in problems] == [math.ceil(0.5 * n)] * 3
    assert any("data.overlap" in note for note in problems[0].notes)
    assert sum(p.weight for p in problems) / 3 == pytest.approx(1.0)   # the mean of the O_i: mean loss over held rows
    with pytest.raises(ConfigError) as err:
        DataConfig(overlap=True, load_factor=1.5)
    assert str(err.value) == "problem.data.load_factor must be in (0, 1] (a share of the training rows), got 1.5"
