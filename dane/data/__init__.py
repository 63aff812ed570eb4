"""Datasets and their division across workers.

``load_dataset(name, data_dir=..., seed=...)`` returns a ``Dataset`` of tensors;
``shard_indices(labels, workers, seed=...)`` says which training rows each worker holds.
"""

from dane.data.dataset import Dataset
from dane.data.registry import DATASET_NAMES, load_dataset
from dane.data.sharding import SCHEMES, shard_indices

__all__ = ["DATASET_NAMES", "SCHEMES", "Dataset", "load_dataset", "shard_indices"]
