"""Horovod backend, the default under ``horovodrun``."""
from __future__ import annotations

import torch

from .base import Communicator


class HorovodCommunicator(Communicator):
    """Horovod's collectives behind the `Communicator` interface.

    ``init=False`` takes Horovod as already started: under Horovod elastic (`dane.elastic`)
    the elastic loop owns ``hvd.init``/``hvd.shutdown`` and re-initializes Horovod after
    every reset, so each attempt makes a communicator for the current (rank, size) and
    leaves the shutdown to that loop.
    """

    def __init__(self, *, init: bool = True) -> None:
        import horovod.torch as hvd

        if init:
            hvd.init()
        self._hvd = hvd
        self._owns = init
        self.rank = hvd.rank()
        self.size = hvd.size()
        self.local_rank = hvd.local_rank()
        super().__init__()

    @staticmethod
    def _name(kind: str, tensors: list[torch.Tensor]) -> str:
        # Horovod matches collectives across ranks by name.  A name that repeats for the
        # same shapes lets its response cache skip the full negotiation on later calls
        # (a fresh name per call measured ~1.4x slower at 4 KB and overflows the cache).
        # The calls are blocking, so two with one name are never in flight together.
        shapes = ";".join(f"{t.dtype}{tuple(t.shape)}" for t in tensors)
        return f"dane.{kind}.{shapes}"

    def _allreduce_mean(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        return self._hvd.grouped_allreduce(tensors, op=self._hvd.Average, name=self._name("allreduce", tensors))

    def _broadcast(self, tensors: list[torch.Tensor], root: int) -> list[torch.Tensor]:
        return [self._hvd.broadcast(t, root_rank=root, name=self._name(f"broadcast{root}", [t])) for t in tensors]

    def barrier(self) -> None:
        self._hvd.join()

    def shutdown(self) -> None:
        if self._owns:
            self._hvd.shutdown()
