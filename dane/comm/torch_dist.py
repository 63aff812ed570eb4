"""torch.distributed backend, the default under ``torchrun``: gloo, also when the problem is on a GPU.

Every vector the algorithms communicate (iterates, gradients, Newton-type directions)
lives in host memory, also for a network trained on CUDA (`dane.problems.neural` hands
them over on the CPU), and NCCL reduces only device memory: a process group of NCCL
alone fails on the first allreduce of a CPU tensor.  So gloo it is, on every machine.
"""
from __future__ import annotations

import itertools
import os

import torch

from .base import Communicator
from .launcher_signals import install, under_torchrun
from .slurm import slurm_task


def init_process_group(backend: str) -> None:
    """``init_process_group`` from the launcher's environment: under srun, from Slurm's (`slurm.slurm_task`);
    under torchrun, in a key space of its own for this restart attempt.

    Since torch 2.5 torchrun's agent hosts one TCPStore for the whole job
    (``TORCHELASTIC_USE_AGENT_STORE``) and ``init_process_group`` uses it without a
    per-attempt prefix, so workers restarted by ``--max-restarts`` could read the dead
    workers' gloo addresses and hang in process-group setup (pytorch issue 135712).  The
    keys of attempt k go under ``dane/attempt_k`` instead.  One node only: each agent
    counts its own restarts.

    A process may start several groups one after another: several runs in one launch (a program that runs
    `dane.loop.launch.execute` once per configuration, as tests/launched_runs.py does), each starting its group and
    destroying it at its end.  The g-th group of an attempt (every rank counts alike) takes keys of its own,
    ``dane/attempt_k/group_g`` (g >= 1; the first keeps ``dane/attempt_k``): with one key space a group's gloo
    rendezvous could read the addresses of the group before it, closed by then (seen: "Gloo connectFullMesh
    failed ... Connection refused" at the third run of one launch).

    Under torchrun, once the group is up, a SIGTERM (torchrun's stop of the survivors after a
    process exited) becomes the one-line lost-peer error (`launcher_signals.install`): every
    torchrun backend (comm=torch, comm=ps, algorithm=split) starts its group here.
    """
    _start_group(backend)
    if under_torchrun():
        install("torchrun")


def _start_group(backend: str) -> None:
    import torch.distributed as dist

    task = slurm_task() if "RANK" not in os.environ else None  # torchrun inside an srun step sets RANK
    if task is not None:
        dist.init_process_group(backend, init_method=f"tcp://{task.master_addr}:{task.master_port}",
                                rank=task.rank, world_size=task.size)
        return
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group(backend=backend)
        return
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), size, is_master=False)
    attempt, group = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"), next(GROUPS_STARTED)
    prefix = f"dane/attempt_{attempt}" + (f"/group_{group}" if group else "")  # a single run's keys as before
    dist.init_process_group(backend, store=dist.PrefixStore(prefix, store), rank=rank, world_size=size)


#: the process groups this process has started on torchrun's agent store: each rank counts alike (`_start_group`)
GROUPS_STARTED = itertools.count()


class TorchDistCommunicator(Communicator):
    carries_rides = True

    def __init__(self, backend: str | None = None) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():
            init_process_group(backend or "gloo")
        self._dist = dist
        self.rank = dist.get_rank()
        self.size = dist.get_world_size()
        self.local_rank = int(os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", 0)))
        super().__init__()

    def _allreduce_mean(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        # One flat buffer per dtype is one collective; ReduceOp.AVG is NCCL-only, so SUM then divide.
        out: list[torch.Tensor | None] = [None] * len(tensors)
        for dtype in dict.fromkeys(t.dtype for t in tensors):
            idx = [i for i, t in enumerate(tensors) if t.dtype == dtype]
            flat = torch.cat([tensors[i].reshape(-1) for i in idx])
            self._dist.all_reduce(flat, op=self._dist.ReduceOp.SUM)
            flat /= self.size
            for i, piece in zip(idx, flat.split([tensors[i].numel() for i in idx])):
                out[i] = piece.view_as(tensors[i])
        return out  # type: ignore[return-value]

    def _broadcast(self, tensors: list[torch.Tensor], root: int) -> list[torch.Tensor]:
        out = [t.clone() for t in tensors]
        for t in out:
            self._dist.broadcast(t, src=root)
        return out

    def barrier(self) -> None:
        self._dist.barrier()

    def shutdown(self) -> None:
        if self._dist.is_initialized():
            self._dist.destroy_process_group()
