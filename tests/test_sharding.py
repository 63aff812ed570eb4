"""data.sharding on every source (dane/data/sharding.py): iid, dirichlet, classes, quantity, quantile skew."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hydra.utils import instantiate
from sklearn.datasets import dump_svmlight_file

from dane.api import shards as iid_rows
from dane.data.files import BuiltinSource, CSVSource, LibSVMSource, NPZSource, save_npz
from dane.data.sharding import ShardingKeys, power_law_sizes, quantile_bins, shard_indices
from dane.errors import ConfigError
from dane.problems.linear_models import LinearModelConfig
from dane.problems.neural import DataConfig
from helpers import composed

N, D, M = 300, 4, 5


def table(seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, D))
    labels = rng.integers(0, 3, N)  # three classes, for softmax
    return X, labels


def sources(tmp_path, **keys):
    """The same rows as a CSV, a LIBSVM and an NPZ file, each source with ``keys``."""
    X, y = table()
    header = ",".join([f"x{j}" for j in range(D)] + ["label"])
    rows = [",".join([*(f"{v:.17g}" for v in x), str(int(t))]) for x, t in zip(X, y)]
    (tmp_path / "t.csv").write_text("\n".join([header, *rows]) + "\n")
    dump_svmlight_file(X, y, str(tmp_path / "t.svm"), zero_based=True)
    save_npz(tmp_path / "t.npz", X, y)
    return [CSVSource(str(tmp_path / "t.csv"), target="label", standardize="none", **keys),
            LibSVMSource(str(tmp_path / "t.svm"), zero_based=True, n_features=D, **keys),
            NPZSource(str(tmp_path / "t.npz"), **keys)]


def dealt(config: LinearModelConfig, m: int = M) -> list[np.ndarray]:
    return [config.worker_rows(rank, m)[0] for rank in range(m)]


def histograms(y: np.ndarray, rows: list[np.ndarray]) -> list[list[int]]:
    return [np.bincount(y[r].astype(int), minlength=3).tolist() for r in rows]


def assert_partition(rows: list[np.ndarray], n: int) -> None:
    assert all(len(r) > 0 for r in rows)
    assert np.array_equal(np.sort(np.concatenate(rows)), np.arange(n))  # every row exactly once


# ---------------------------------------------------------------- every file source, one rule
def test_dirichlet_on_csv_libsvm_npz_deals_the_same_rows_every_row_once_and_is_seeded(tmp_path):
    _, y = table()
    per_source = []
    for source in sources(tmp_path, sharding="dirichlet", alpha=0.2):
        rows = dealt(LinearModelConfig(data=source, loss="softmax", name="softmax", seed=3))
        assert_partition(rows, N)
        per_source.append(histograms(y, rows))
        again = dealt(LinearModelConfig(data=source, loss="softmax", name="softmax", seed=3))
        assert all(np.array_equal(a, b) for a, b in zip(rows, again))
    assert per_source[0] == per_source[1] == per_source[2]  # one module, one rule: the groups alone decide
    other = dealt(LinearModelConfig(data=sources(tmp_path, sharding="dirichlet", alpha=0.2)[0], loss="softmax",
                                    name="softmax", seed=4))
    assert histograms(y, other) != per_source[0]
    # alpha = 0.2 over 5 workers: a worker's largest class is most of its rows (iid: about a third)
    assert np.mean([max(h) / sum(h) for h in per_source[0]]) > 0.6


def test_iid_on_a_file_source_is_the_permutation_every_backend_deals(tmp_path):
    for source in sources(tmp_path):
        rows = dealt(LinearModelConfig(data=source, loss="softmax", name="softmax", seed=2))
        assert all(np.array_equal(a, b) for a, b in zip(rows, iid_rows(N, M, seed=2)))
        assert LinearModelConfig(data=source, loss="softmax", name="softmax", seed=2).build(0, M).notes[-1] \
            .startswith("local solver")  # iid adds no note: an existing run's notes are unchanged


def test_softmax_counts_the_whole_data_sets_classes_on_a_shard_that_lacks_some(tmp_path):
    """A skewed shard may lack the largest label: every worker's softmax still has all the data's classes (it had
    the shard's own count, and the run's first allreduce stopped on tensors of two sizes); problem.classes below
    the labels names the data's count, not a shard's."""
    for source in sources(tmp_path, sharding="classes", classes_per_worker=1):
        config = LinearModelConfig(data=source, loss="softmax", name="softmax", seed=0)
        shards = [config.build(rank, 3) for rank in range(3)]
        assert sorted(len(np.unique(s.y)) for s in shards) == [1, 1, 1]  # one label each
        assert [s.classes for s in shards] == [3, 3, 3] and len({s.dim for s in shards}) == 1
        low = LinearModelConfig(data=source, loss="softmax", name="softmax", classes=2, seed=0)
        for rank in range(3):
            with pytest.raises(ConfigError, match=r"^problem.classes=2 but the labels go up to 2; raise "
                                                  r"problem.classes to 3, or drop it \(read from the labels\)$"):
                low.build(rank, 3)


def test_existing_dirichlet_shards_are_unchanged():
    """Pinned from the implementation before every source shared it (d6ab0c9), for the same labels and seed."""
    labels = torch.arange(60) % 3
    got = shard_indices(labels, 4, scheme="dirichlet", alpha=0.5, seed=7)
    assert [torch.bincount(labels[s], minlength=3).tolist() for s in got] == \
        [[11, 5, 0], [1, 9, 13], [0, 0, 1], [8, 6, 6]]
    iid = shard_indices(labels, 4, seed=7)
    assert [torch.bincount(labels[s], minlength=3).tolist() for s in iid] == \
        [[5, 6, 4], [4, 6, 5], [7, 4, 4], [4, 4, 7]]


def test_builtin_set_shards_and_notes_give_each_worker_its_size_and_histogram():
    config = LinearModelConfig(data=DataConfig(dataset="breast_cancer", sharding="dirichlet", alpha=0.1),
                               loss="logistic", name="logreg", seed=0)
    assert config.source == BuiltinSource(dataset="breast_cancer", sharding="dirichlet", alpha=0.1)
    rows = dealt(config, 4)
    assert_partition(rows, 569)
    y = config.table().y
    notes = config.build(0, 4).notes
    lines = [n for n in notes if n.startswith("worker ")]
    assert notes[notes.index(lines[0]) - 1].startswith("sharding: dirichlet (alpha=0.1) on labels, seed 0: 4 workers")
    for worker, (line, r) in enumerate(zip(lines, rows)):
        minus, plus = int((y[r] < 0).sum()), int((y[r] > 0).sum())
        want = f"worker {worker}: {len(r)} row{'s' * (len(r) != 1)}; " + ", ".join(  # worker 2: 1 row
            [f"-1: {minus}"] * bool(minus) + [f"1: {plus}"] * bool(plus))
        assert line == want
    assert all(not n.startswith("worker ") for n in config.build(1, 4).notes)  # rank 0 reports every worker


def test_data_sharding_is_a_key_of_every_data_config(tmp_path):
    X, y = table()
    save_npz(tmp_path / "t.npz", X, (y > 0).astype(float))
    for data in ("data=npz", "data=builtin", "data=diabetes", "data=iris"):
        extra = [f"data.path={tmp_path / 't.npz'}"] if data == "data=npz" else []
        problem = "problem=ridge" if data == "data=diabetes" else "problem=logreg"
        cfg = composed(problem, data, *extra, "data.sharding=quantity", "data.exponent=0.5", "data.skew_on=0",
                       "data.bins=4", "data.classes_per_worker=1")
        source = instantiate(cfg.data)
        assert (source.sharding, source.exponent, source.skew_on, source.bins) == ("quantity", 0.5, 0, 4)


# ---------------------------------------------------------------- the schemes' laws
def test_quantity_skew_sizes_follow_the_power_law():
    assert power_law_sizes(100, 4, 1.0).tolist() == [48, 24, 16, 12]  # 100 (1, 1/2, 1/3, 1/4) / (25/12)
    assert power_law_sizes(10, 4, 0.0).tolist() == [3, 3, 2, 2]
    for n, m, gamma in ((1000, 7, 1.3), (57, 5, 0.7), (12, 10, 3.0)):
        sizes = power_law_sizes(n, m, gamma)
        exact = n * np.arange(1, m + 1) ** -gamma / np.sum(np.arange(1, m + 1) ** -gamma)
        assert sizes.sum() == n and sizes.min() >= 1
        if exact.min() >= 1:
            assert np.all(np.abs(sizes - exact) < 1)
    shards = shard_indices(torch.zeros(1000), 7, scheme="quantity", exponent=1.3, seed=0)
    assert [len(s) for s in shards] == power_law_sizes(1000, 7, 1.3).tolist()
    assert torch.equal(torch.sort(torch.cat(shards)).values, torch.arange(1000))


def test_classes_per_worker_gives_each_worker_exactly_c_labels():
    labels = torch.arange(1000) % 10
    for m, c in ((5, 2), (8, 3), (10, 1), (3, 4)):
        shards = shard_indices(labels, m, scheme="classes", classes_per_worker=c, seed=1)
        assert torch.equal(torch.sort(torch.cat(shards)).values, torch.arange(1000))
        assert [len(torch.unique(labels[s])) for s in shards] == [c] * m
    with pytest.raises(ConfigError, match="data.classes_per_worker=2 with 4 workers holds 8 of the 10 groups, so "
                                          "some rows would go to no worker; raise data.classes_per_worker to 3"):
        shard_indices(labels, 4, scheme="classes", classes_per_worker=2, seed=0)
    with pytest.raises(ConfigError, match="data.classes_per_worker=11 exceeds the 10 groups"):
        shard_indices(labels, 4, scheme="classes", classes_per_worker=11, seed=0)


def test_quantile_bins_are_equal_counts_and_regression_skews_on_the_target(tmp_path):
    values = np.array([5.0, 1.0, 1.0, 3.0, 2.0, 4.0, 0.0, 6.0])
    assert quantile_bins(values, 4).tolist() == [3, 0, 1, 2, 1, 2, 0, 3]
    rng = np.random.default_rng(0)
    X, target = rng.standard_normal((N, D)), rng.standard_normal(N)
    save_npz(tmp_path / "r.npz", X, target)
    source = NPZSource(str(tmp_path / "r.npz"), sharding="classes", classes_per_worker=1, bins=M)
    config = LinearModelConfig(data=source, loss="squared", name="ridge")
    rows = dealt(config)
    assert_partition(rows, N)
    ranges = sorted((target[r].min(), target[r].max()) for r in rows)
    assert all(hi < lo for (_, hi), (lo, _) in zip(ranges, ranges[1:]))  # one bin each: disjoint y ranges
    by_column = dealt(LinearModelConfig(data=NPZSource(str(tmp_path / "r.npz"), sharding="classes",
                                                       classes_per_worker=1, bins=M, skew_on=2),
                                        loss="squared", name="ridge"))
    spans = sorted((X[r, 2].min(), X[r, 2].max()) for r in by_column)
    assert all(hi < lo for (_, hi), (lo, _) in zip(spans, spans[1:]))
    note = config.build(0, M).notes
    assert any(n.startswith(f"sharding: classes (C=1) on {M} quantile bins of y (edges ") for n in note)


# ---------------------------------------------------------------- one-line errors
def test_parts_are_natural_partitions_and_bad_keys_are_one_line(tmp_path):
    parts = r"data.sharding=dirichlet with per-worker parts \(data.path=p-\{rank\}.npz\): the parts are the partition"
    with pytest.raises(ConfigError, match=parts):
        NPZSource("p-{rank}.npz", sharding="dirichlet")
    for keys, message in (({"sharding": "pathological"}, "data.sharding must be one of iid|dirichlet|classes|quantity"),
                          ({"alpha": 0}, "data.alpha must be > 0, got 0"),
                          ({"exponent": -1}, "data.exponent must be >= 0, got -1"),
                          ({"bins": 1}, "data.bins must be >= 2"),
                          ({"skew_on": ""}, "data.skew_on must be y or a feature column")):
        with pytest.raises(ConfigError, match=message.replace("|", r"\|")):
            BuiltinSource(dataset="iris", **keys)
    config = LinearModelConfig(data=sources(tmp_path, sharding="dirichlet", skew_on="x9")[0], loss="softmax",
                               name="softmax")
    with pytest.raises(ConfigError, match="data.skew_on=x9 is not a feature of this data; its columns are: x0, x1"):
        config.check_workers(M)
    with pytest.raises(ConfigError, match="data.skew_on=2 groups rows by a feature column"):
        ShardingKeys(skew_on=2).scheme_options()
