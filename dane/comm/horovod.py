"""Horovod backend, the default under ``horovodrun``."""
from __future__ import annotations

import torch

from .base import Communicator


class HorovodCommunicator(Communicator):
    def __init__(self) -> None:
        import horovod.torch as hvd

        hvd.init()
        self._hvd = hvd
        self.rank = hvd.rank()
        self.size = hvd.size()
        self.local_rank = hvd.local_rank()
        self._seq = 0
        super().__init__()

    def _name(self, kind: str) -> str:
        # Horovod matches collectives across ranks by name; every rank calls in the same order.
        self._seq += 1
        return f"dane.{kind}.{self._seq}"

    def _allreduce_mean(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        return self._hvd.grouped_allreduce(tensors, op=self._hvd.Average, name=self._name("allreduce"))

    def _broadcast(self, tensors: list[torch.Tensor], root: int) -> list[torch.Tensor]:
        return [self._hvd.broadcast(t, root_rank=root, name=self._name("broadcast")) for t in tensors]

    def barrier(self) -> None:
        self._hvd.join()

    def shutdown(self) -> None:
        self._hvd.shutdown()
