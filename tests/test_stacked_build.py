"""`LinearModelConfig.build_stacked`: the m equal shards gathered at once are the m shards `build` makes, stacked."""
import numpy as np
import torch

from dane.problems.arrays import LogReg


def test_gathered_stack_is_the_stack_of_the_built_shards(monkeypatch):
    """Worker 0's shard alone is built; the others' rows are gathered, bit for bit the shards' X and y."""
    rng = np.random.default_rng(3)
    X = rng.standard_normal((48, 5))
    config = LogReg(X, (X[:, 0] > 0).astype(float), lam=1e-3)
    m = 6
    built, build = [], type(config).build
    monkeypatch.setattr(type(config), "build",
                        lambda self, rank, size, *a: built.append(rank) or build(self, rank, size, *a))
    stacked = config.build_stacked(m)
    assert built == [0]
    monkeypatch.undo()
    shards = [config.build(rank, m) for rank in range(m)]
    assert torch.equal(stacked.X, torch.stack([s.X for s in shards]))
    assert torch.equal(stacked.y, torch.stack([s.y for s in shards]))
    assert [len(r) for r in config.all_worker_rows(m)] == [8] * m
    assert all(np.array_equal(r, config.worker_rows(rank, m)[0]) for rank, r in enumerate(config.all_worker_rows(m)))
