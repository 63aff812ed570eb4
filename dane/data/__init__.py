"""Datasets and their division across workers.

``load_dataset(name, data_dir=..., seed=...)`` returns a ``Dataset`` of tensors;
``shard_indices(labels, workers, seed=...)`` says which training rows each worker holds, by the
scheme of ``data.sharding`` (`ShardingKeys`: iid, dirichlet, classes, quantity; `dane.data.sharding`).
"""

from dane.data.dataset import Dataset
from dane.data.registry import DATASET_NAMES, load_dataset
from dane.data.sharding import SCHEMES, ShardingKeys, shard_indices

__all__ = ["DATASET_NAMES", "SCHEMES", "Dataset", "ShardingKeys", "load_dataset", "shard_indices"]
