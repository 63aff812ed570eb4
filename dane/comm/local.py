"""Single-process backend: one worker, no communication."""
from __future__ import annotations

import torch

from .base import Communicator


class LocalCommunicator(Communicator):
    rank = 0
    size = 1

    def _allreduce_mean(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        return [t.clone() for t in tensors]

    def _broadcast(self, tensors: list[torch.Tensor], root: int) -> list[torch.Tensor]:
        return [t.clone() for t in tensors]

    def barrier(self) -> None:
        pass
