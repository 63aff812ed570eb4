"""Data loaders read the real binary formats exactly; shards are exact, seeded partitions.

MNIST and CIFAR-10 readers are checked on small files written here in the standard
formats; the real shared MNIST t10k pair and admissions CSV are used when present.
"""

from __future__ import annotations

import gzip
import logging
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from dane.data import load_dataset, shard_indices
from dane.data.mnist import IMAGES_MAGIC, LABELS_MAGIC
from dane.errors import ConfigError, DataError

SHARED_DATA = Path(os.environ.get("DANE_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))
MNIST_NAMES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "t10k": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


# ---------------------------------------------------------------- file writers
def write_idx(path: Path, array: np.ndarray, magic: int) -> None:
    """Write ``array`` as a gzip IDX file: big-endian magic, big-endian dims, raw bytes."""
    header = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def write_mnist_pair(folder: Path, split: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = (np.arange(n) % 10).astype(np.uint8)
    folder.mkdir(parents=True, exist_ok=True)
    write_idx(folder / MNIST_NAMES[split][0], images, IMAGES_MAGIC)
    write_idx(folder / MNIST_NAMES[split][1], labels, LABELS_MAGIC)
    return images, labels


def write_cifar(folder: Path, per_batch: int = 2, test_n: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """Write the six CIFAR-10 python batches; return the rows of all five training batches."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    rows, labels = [], []
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        n = test_n if name == "test_batch" else per_batch
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        batch_labels = [int(v) for v in rng.integers(0, 10, size=n)]
        with open(folder / name, "wb") as f:
            pickle.dump({b"data": data, b"labels": batch_labels}, f)
        if name != "test_batch":
            rows.append(data)
            labels += batch_labels
    return np.concatenate(rows), np.asarray(labels)


# ---------------------------------------------------------------- MNIST
def test_mnist_full_mode_returns_exact_pixels_and_labels(tmp_path):
    train_images, train_labels = write_mnist_pair(tmp_path, "train", 6, seed=1)
    test_images, test_labels = write_mnist_pair(tmp_path, "t10k", 4, seed=2)
    data = load_dataset("mnist", data_dir=tmp_path, seed=0, pad_to_32=False)
    assert data.train_x.shape == (6, 1, 28, 28) and data.test_x.shape == (4, 1, 28, 28)
    np.testing.assert_array_equal(data.train_x[:, 0].numpy(), train_images.astype(np.float32) / 255)
    np.testing.assert_array_equal(data.test_x[:, 0].numpy(), test_images.astype(np.float32) / 255)
    np.testing.assert_array_equal(data.train_y.numpy(), train_labels)
    np.testing.assert_array_equal(data.test_y.numpy(), test_labels)
    assert data.train_y.dtype == torch.int64 and data.train_x.dtype == torch.float32
    assert data.num_classes == 10 and data.notes == []


def test_mnist_pads_to_32_with_a_zero_border(tmp_path):
    write_mnist_pair(tmp_path, "train", 3, seed=1)
    write_mnist_pair(tmp_path, "t10k", 2, seed=2)
    plain = load_dataset("mnist", data_dir=tmp_path, seed=0, pad_to_32=False)
    padded = load_dataset("mnist", data_dir=tmp_path, seed=0)
    assert padded.in_shape == (1, 32, 32)
    torch.testing.assert_close(padded.train_x[:, :, 2:30, 2:30], plain.train_x, rtol=0, atol=0)
    border = padded.train_x.clone()
    border[:, :, 2:30, 2:30] = 0
    assert border.abs().sum().item() == 0.0


def test_mnist_found_in_mnist_subfolder(tmp_path):
    write_mnist_pair(tmp_path / "mnist", "train", 3, seed=1)
    write_mnist_pair(tmp_path / "mnist", "t10k", 2, seed=2)
    assert len(load_dataset("mnist", data_dir=tmp_path, seed=0).train_y) == 3


def test_mnist_bad_magic_is_a_data_error(tmp_path):
    write_mnist_pair(tmp_path, "t10k", 20, seed=1)
    write_idx(tmp_path / MNIST_NAMES["t10k"][0], np.zeros((20, 28, 28)), LABELS_MAGIC + 0x100)
    with pytest.raises(DataError, match="magic 0x00000901, expected 0x00000803"):
        load_dataset("mnist", data_dir=tmp_path, seed=0)


def test_mnist_truncated_file_is_a_data_error(tmp_path):
    write_mnist_pair(tmp_path, "t10k", 20, seed=1)
    path = tmp_path / MNIST_NAMES["t10k"][1]
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">II", LABELS_MAGIC, 20) + bytes(19))
    with pytest.raises(DataError, match="19 data bytes but its header"):
        load_dataset("mnist", data_dir=tmp_path, seed=0)


def test_mnist_not_gzip_is_a_data_error(tmp_path):
    write_mnist_pair(tmp_path, "t10k", 20, seed=1)
    (tmp_path / MNIST_NAMES["t10k"][0]).write_bytes(b"not a gzip file")
    with pytest.raises(DataError, match="not a readable IDX file"):
        load_dataset("mnist", data_dir=tmp_path, seed=0)


def test_mnist_missing_dir_lists_expected_files(tmp_path):
    with pytest.raises(DataError) as err:
        load_dataset("mnist", data_dir=tmp_path / "nowhere", seed=0)
    message = str(err.value)
    assert "does not exist" in message and "\n" not in message
    assert message.endswith("; point data_dir=<folder> (or DANE_DATA_DIR) at the folder that holds the files")
    for name in MNIST_NAMES["train"] + MNIST_NAMES["t10k"]:
        assert name in message


def test_mnist_half_a_pair_is_a_data_error(tmp_path):
    write_mnist_pair(tmp_path, "t10k", 20, seed=1)
    (tmp_path / MNIST_NAMES["train"][0]).write_bytes(b"")
    with pytest.raises(DataError, match="missing train-labels-idx1-ubyte.gz"):
        load_dataset("mnist", data_dir=tmp_path, seed=0)


def test_mnist_split_mode_on_small_files_notes_and_warns(tmp_path, caplog):
    images, _ = write_mnist_pair(tmp_path, "t10k", 50, seed=3)
    with caplog.at_level(logging.WARNING, logger="dane.data.mnist"):
        data = load_dataset("mnist", data_dir=tmp_path, seed=0, pad_to_32=False)
    assert (len(data.train_y), len(data.test_y)) == (40, 10)
    assert len(data.notes) == 1 and "SPLIT MODE" in data.notes[0]
    assert any("SPLIT MODE" in record.getMessage() for record in caplog.records)
    # Stratified: 50 labels 0..9 five times each -> 4 of each class in train, 1 in test.
    assert torch.bincount(data.train_y, minlength=10).tolist() == [4] * 10
    # The split is a partition of the file's images: every image lands exactly once.
    every = torch.cat([data.train_x, data.test_x])[:, 0].numpy() * 255
    assert sorted(map(bytes, np.rint(every).astype(np.uint8))) == sorted(map(bytes, images))


def test_mnist_split_mode_on_shared_t10k_is_8000_2000_and_seeded():
    mnist_dir = SHARED_DATA / "mnist"
    if not (mnist_dir / MNIST_NAMES["t10k"][0]).is_file():
        pytest.skip("shared MNIST data not present")
    first = load_dataset("mnist", data_dir=SHARED_DATA, seed=0)
    again = load_dataset("mnist", data_dir=mnist_dir, seed=0)
    other = load_dataset("mnist", data_dir=SHARED_DATA, seed=1)
    assert first.train_x.shape == (8000, 1, 32, 32) and first.test_x.shape == (2000, 1, 32, 32)
    assert "SPLIT MODE" in first.notes[0]
    assert torch.equal(first.train_x, again.train_x) and torch.equal(first.test_y, again.test_y)
    assert not torch.equal(first.train_y, other.train_y)
    assert 0.0 <= first.train_x.min().item() and first.train_x.max().item() == 1.0
    # MNIST's t10k class counts (980 zeros ... 1009 nines) are kept 80/20 by stratification.
    total = torch.bincount(torch.cat([first.train_y, first.test_y]), minlength=10)
    assert total.tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    assert (torch.bincount(first.test_y, minlength=10) - total * 0.2).abs().max().item() <= 1


# ---------------------------------------------------------------- CIFAR-10
@pytest.mark.parametrize("point_at", ["folder", "parent"])
def test_cifar_returns_exact_pixels_in_channel_order(tmp_path, point_at):
    folder = tmp_path / "cifar-10-batches-py"
    rows, labels = write_cifar(folder)
    data = load_dataset("cifar10", data_dir=folder if point_at == "folder" else tmp_path, seed=0)
    assert data.train_x.shape == (10, 3, 32, 32) and data.test_x.shape == (3, 3, 32, 32)
    np.testing.assert_array_equal(data.train_y.numpy(), labels)
    # Row layout: 1024 red, 1024 green, 1024 blue values, each 32x32 row-major.
    assert data.train_x[7, 1, 5, 9].item() == np.float32(rows[7, 1024 + 5 * 32 + 9]) / np.float32(255)
    np.testing.assert_array_equal(data.train_x.numpy(), rows.reshape(10, 3, 32, 32).astype(np.float32) / 255)


def test_cifar_missing_lists_expected_files(tmp_path):
    with pytest.raises(DataError) as err:
        load_dataset("cifar10", data_dir=tmp_path, seed=0)
    for name in ["cifar-10-batches-py", "data_batch_1", "data_batch_5", "test_batch"]:
        assert name in str(err.value)
    assert str(err.value).endswith("; point data_dir=<folder> (or DANE_DATA_DIR) at the folder that holds the files")


def test_cifar_malformed_batch_is_a_data_error(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar(folder)
    with open(folder / "data_batch_3", "wb") as f:
        pickle.dump({b"data": np.zeros((2, 100), dtype=np.uint8), b"labels": [0, 1]}, f)
    with pytest.raises(DataError, match="data_batch_3 has data of uint8 \\(2, 100\\)"):
        load_dataset("cifar10", data_dir=tmp_path, seed=0)


# ---------------------------------------------------------------- tabular
@pytest.mark.parametrize(
    "name, rows, features, classes",
    [("digits", 1797, 64, 10), ("iris", 150, 4, 3), ("breast_cancer", 569, 30, 2)],
)
def test_sklearn_datasets_are_split_and_standardized(name, rows, features, classes):
    data = load_dataset(name, data_dir=None, seed=0)
    assert len(data.train_y) + len(data.test_y) == rows
    assert len(data.test_y) == int(np.ceil(0.2 * rows))
    assert data.in_shape == (features,) and data.num_classes == classes
    mean, std = data.train_x.double().mean(0), data.train_x.double().std(0, unbiased=False)
    assert mean.abs().max().item() < 1e-5
    varying = std > 0  # digits has pixels that are 0 in every training image
    torch.testing.assert_close(std[varying], torch.ones_like(std[varying]), rtol=0, atol=1e-5)
    assert torch.equal(data.train_x, load_dataset(name, data_dir=None, seed=0).train_x)
    assert not torch.equal(data.train_y, load_dataset(name, data_dir=None, seed=1).train_y)


def test_iris_split_is_stratified():
    data = load_dataset("iris", data_dir=None, seed=3)
    assert torch.bincount(data.test_y).tolist() == [10, 10, 10]


def test_admissions_real_file():
    if not (SHARED_DATA / "admissions.csv").is_file():
        pytest.skip("shared admissions.csv not present")
    data = load_dataset("admissions", data_dir=SHARED_DATA, seed=0)
    assert (len(data.train_y), len(data.test_y), data.in_shape, data.num_classes) == (320, 80, (3,), 2)
    assert data.train_y.sum().item() + data.test_y.sum().item() == 126  # admitted applicants
    assert data.train_x.mean(0).abs().max().item() < 1e-5


def test_admissions_parses_and_standardizes(tmp_path):
    rows = ["admit,gre,gpa,rank"] + [f"{i % 2},{400 + 10 * i},{3 + i / 100},{1 + i % 4}" for i in range(20)]
    (tmp_path / "admissions.csv").write_text("\r\n".join(rows) + "\r\n")
    data = load_dataset("admissions", data_dir=tmp_path, seed=0, test_fraction=0.25)
    assert (len(data.train_y), len(data.test_y)) == (15, 5)
    torch.testing.assert_close(data.train_x.double().std(0, unbiased=False), torch.ones(3, dtype=torch.float64))


@pytest.mark.parametrize(
    "content, message",
    [
        ("admit,gre,gpa\n1,2,3\n", "has header"),
        ("admit,gre,gpa,rank\n1,abc,3.5,2\n", "line 2 has a non-numeric value"),
        ("admit,gre,gpa,rank\n2,500,3.5,2\n", "line 2 is not admit"),
        ("admit,gre,gpa,rank\n", "no rows"),
    ],
)
def test_admissions_malformed_is_a_data_error(tmp_path, content, message):
    (tmp_path / "admissions.csv").write_text(content)
    with pytest.raises(DataError, match=message):
        load_dataset("admissions", data_dir=tmp_path, seed=0)


def test_admissions_missing_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match=r"admissions.csv .* in data_dir; point data_dir=<folder> \(or DANE_DATA_DIR\) "
                                        r"at the folder that holds the files$"):
        load_dataset("admissions", data_dir=tmp_path, seed=0)


def test_a_file_sets_stamp_serves_both_loaders_and_moves_with_its_file(tmp_path, monkeypatch):
    """`dataset_stamp` is the stamp both keepers use (`load_dataset`'s networks, `BuiltinSource.content_stamp`'s
    tables): the admissions file found in data_dir, or in the working folder where the table source reads it with no
    data_dir (the registry's own rule stamped nothing there); MNIST's files; nothing for a set without files.  Read
    again unchanged, a stamp is equal; the file touched (mtime), grown (size) or replaced by a copy of the same size
    and time (inode) moves exactly that field."""
    from dane.data.builtin_source import BuiltinSource
    from dane.data.registry import dataset_stamp

    def admissions(folder: Path, rows: int) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        lines = ["admit,gre,gpa,rank"] + [f"{i % 2},{400 + 10 * i},{3 + i / 100},{1 + i % 4}" for i in range(rows)]
        (folder / "admissions.csv").write_text("\n".join(lines) + "\n")
        return folder / "admissions.csv"

    def stat(file: Path) -> tuple:
        st = os.stat(file)
        return ((str(file.resolve()), st.st_size, st.st_mtime_ns, st.st_ino),)

    given = admissions(tmp_path / "given", 20)
    assert dataset_stamp("admissions", str(tmp_path / "given")) == stat(given)
    assert BuiltinSource("admissions", data_dir=str(tmp_path / "given")).content_stamp() == stat(given)
    cwd = admissions(tmp_path / "cwd", 12)
    monkeypatch.chdir(tmp_path / "cwd")
    assert len(BuiltinSource("admissions").load().y) == 12
    assert dataset_stamp("admissions", None) == BuiltinSource("admissions").content_stamp() == stat(cwd)
    assert dataset_stamp("admissions", str(tmp_path / "given")) == stat(given)  # data_dir's first, as both read

    before = dataset_stamp("admissions", None)
    assert dataset_stamp("admissions", None) == before
    os.utime(cwd, ns=(before[0][2] + 10**9, before[0][2] + 10**9))
    touched = dataset_stamp("admissions", None)
    assert touched == ((before[0][0], before[0][1], before[0][2] + 10**9, before[0][3]),)
    copy = tmp_path / "copy.csv"
    copy.write_bytes(cwd.read_bytes())
    os.utime(copy, ns=(touched[0][2], touched[0][2]))
    os.replace(copy, cwd)
    replaced = dataset_stamp("admissions", None)
    assert replaced[0][:3] == touched[0][:3] and replaced[0][3] != touched[0][3]
    admissions(tmp_path / "cwd", 13)
    assert dataset_stamp("admissions", None)[0][1] > replaced[0][1]

    write_mnist_pair(tmp_path / "mnist", "t10k", 20, seed=0)
    files = sorted((tmp_path / "mnist").iterdir())
    stamp = dataset_stamp("mnist", str(tmp_path / "mnist"))
    assert stamp == BuiltinSource("mnist", data_dir=str(tmp_path / "mnist")).content_stamp()
    assert sorted(stamp) == sorted(s for f in files for s in stat(f))
    assert [dataset_stamp(name, str(tmp_path / "mnist")) for name in ("digits", "cifar10", "synthetic_1_1")] == \
        [None, None, None]
    assert BuiltinSource("admissions", data_dir=str(tmp_path / "mnist")).content_stamp() == stat(cwd)
    monkeypatch.chdir(tmp_path)
    assert dataset_stamp("admissions", None) is None and dataset_stamp("mnist", None) is None


def test_admissions_with_a_class_of_one_is_one_line(tmp_path):
    """A stratified split a class of one sample makes impossible: the data set, the class counts and the fix, as a
    DataError (was scikit-learn's ValueError "The least populated class in y has only 1 member")."""
    rows = ["admit,gre,gpa,rank"] + [f"{int(i == 0)},{400 + i},3.5,2" for i in range(5)]
    (tmp_path / "admissions.csv").write_text("\n".join(rows) + "\n")
    with pytest.raises(DataError) as raised:
        load_dataset("admissions", data_dir=tmp_path, seed=0)
    assert str(raised.value) == ("admissions: class 1 has only 1 sample (samples per class: 0=4, 1=1); a stratified "
                                 "hold-out needs at least 2 of each class: add samples of it, or remove the class")


@pytest.mark.parametrize("y, fraction, line", [
    ([3], 0.2, "d: class 3 has only 1 sample (samples per class: 3=1); a stratified hold-out needs at least 2 of each "
               "class: add samples of it, or remove the class"),
    ([0, 0, 1, 1], 0.2, "d: data.test_fraction=0.2 of its 4 samples leaves 1 in the test set, fewer than its 2 classes "
                        "(samples per class: 0=2, 1=2); a stratified hold-out needs as many rows in each set as "
                        "classes: set data.test_fraction between 0.26 and 0.5, or add samples"),
    ([0, 0, 1, 1, 2, 2, 2, 2, 2, 2], 0.9,
     "d: data.test_fraction=0.9 of its 10 samples leaves 1 in the train set, fewer than its 3 classes (samples per "
     "class: 0=2, 1=2, 2=6); a stratified hold-out needs as many rows in each set as classes: set data.test_fraction "
     "between 0.21 and 0.7, or add samples"),
])
def test_a_split_that_cannot_be_made_is_one_line(y, fraction, line):
    """Each of scikit-learn's refusals (a class of one, one sample in all, fewer test or train rows than classes)
    is one DataError line; the fractions it proposes split."""
    from dane.data.dataset import split_problem, stratified_split

    y = np.array(y)
    with pytest.raises(DataError) as raised:
        stratified_split(y, y, test_fraction=fraction, seed=0, name="d")
    assert str(raised.value) == line
    if "between" in line:
        low, high = (float(v) for v in line.split("between ")[1].split(", or")[0].split(" and "))
        for f in (low, high):
            assert split_problem(y, f) is None
            assert len(stratified_split(y, y, test_fraction=f, seed=0)[3]) == np.ceil(f * len(y))


def test_a_networks_split_names_its_own_key():
    """A network's data sits under problem.data: its refusal names problem.data.test_fraction, which the run takes
    (data.test_fraction is no key of a network run)."""
    from dane.problems.neural import DataConfig, ModelConfig, NeuralProblemConfig

    config = NeuralProblemConfig(data=DataConfig(dataset="digits", test_fraction=0.001), model=ModelConfig(hidden=(4,)))
    with pytest.raises(DataError, match=r"^digits: problem.data.test_fraction=0.001 of its 1797 samples leaves 2 in the "
                                        r"test set, .*: set problem.data.test_fraction between 0.01 and 0.99, or add"):
        config.build(0, 1)


# ---------------------------------------------------------------- registry
def test_unknown_dataset_lists_known_names():
    with pytest.raises(ConfigError, match="unknown dataset 'mnsit'; use one of: admissions, breast_cancer, cifar10"):
        load_dataset("mnsit", data_dir=None, seed=0)


def test_bad_test_fraction_and_missing_data_dir_are_config_errors():
    with pytest.raises(ConfigError, match="test_fraction must be in \\(0, 1\\), got 1.5"):
        load_dataset("iris", data_dir=None, seed=0, test_fraction=1.5)
    with pytest.raises(ConfigError, match="set data_dir"):
        load_dataset("mnist", data_dir=None, seed=0)


# ---------------------------------------------------------------- sharding
def assert_partition(shards: list[torch.Tensor], n: int) -> None:
    assert all(shard.dtype == torch.int64 and len(shard) > 0 for shard in shards)
    assert torch.equal(torch.sort(torch.cat(shards)).values, torch.arange(n))


def test_iid_shards_partition_evenly_and_are_seeded():
    labels = torch.arange(103) % 7
    shards = shard_indices(labels, 4, seed=5)
    assert_partition(shards, 103)
    assert sorted(len(s) for s in shards) == [25, 26, 26, 26]
    assert all(torch.equal(a, b) for a, b in zip(shards, shard_indices(labels, 4, seed=5)))
    assert not torch.equal(shards[0], shard_indices(labels, 4, seed=6)[0])


def test_one_worker_gets_everything():
    assert torch.equal(shard_indices(torch.zeros(9, dtype=torch.int64), 1, seed=0)[0], torch.arange(9))


def test_dirichlet_small_alpha_is_skewed_and_still_a_partition():
    labels = torch.arange(1000) % 10
    shards = shard_indices(labels, 8, scheme="dirichlet", alpha=0.1, seed=0)
    assert_partition(shards, 1000)
    # IID shards of 125 would hold about 12.5 of each class; a 0.1-Dirichlet concentrates
    # each worker on few classes, so its top class covers most of the shard.
    top_share = [torch.bincount(labels[s], minlength=10).max().item() / len(s) for s in shards]
    assert np.mean(top_share) > 0.5
    iid_share = [torch.bincount(labels[s], minlength=10).max().item() / len(s) for s in shard_indices(labels, 8, seed=0)]
    assert np.mean(iid_share) < 0.25
    again = shard_indices(labels, 8, scheme="dirichlet", alpha=0.1, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(shards, again))


def test_dirichlet_repairs_empty_shards():
    # 12 samples over 10 workers at alpha=0.01: most draws leave workers empty.
    labels = torch.tensor([0] * 6 + [1] * 6)
    for seed in range(20):
        shards = shard_indices(labels, 10, scheme="dirichlet", alpha=0.01, seed=seed)
        assert_partition(shards, 12)


@pytest.mark.parametrize(
    "workers, kwargs, message",
    [
        (8, {}, "workers=8 exceeds the 5 training samples; use fewer workers or more data"),
        (0, {}, "workers must be >= 1, got 0"),
        (2, {"scheme": "dirichlet", "alpha": 0.0}, "data.alpha must be > 0, got 0.0"),  # as ShardingKeys.deal's
        (2, {"scheme": "dirichlet", "alpha": "x"}, "data.alpha must be a number, got 'x'"),  # was a TypeError
        (2, {"scheme": "dirichlet", "alpha": float("nan")}, "data.alpha must be a finite number, got nan"),
        (2, {"scheme": "pathological"}, "unknown sharding scheme 'pathological'; use one of: iid, dirichlet"),
    ],
)
def test_sharding_rejects_bad_arguments(workers, kwargs, message):
    with pytest.raises(ConfigError) as err:
        shard_indices(torch.arange(5), workers, seed=0, **kwargs)
    assert message in str(err.value)
