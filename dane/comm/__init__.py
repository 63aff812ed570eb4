"""Communicator backends behind one interface; `make_communicator` picks one from the launcher.

The communicators import torch; they are imported on first use (PEP 562, `_TORCH_BACKED`), so that
what needs only the launcher's rank or the cost model (``dane train --help``, the figures) imports no torch.
"""
from __future__ import annotations

import os

from ..errors import ConfigError
from ..layout import lazy_names
from .cost import AlphaBeta, ParameterServerCost, ring_allreduce_bytes
from .slurm import slurm_task

#: name -> the module of this package that defines it, imported when the name is first read
_TORCH_BACKED = {"Communicator": ".base", "LocalCommunicator": ".local",
                 "Stragglers": ".threads", "ThreadCommunicator": ".threads", "ThreadGroup": ".threads"}


__getattr__ = lazy_names(__name__, _TORCH_BACKED)


BACKENDS = ("auto", "horovod", "torch", "local", "ps")


def detect_launcher() -> tuple[str, int]:
    """(backend, world size) implied by the environment: horovodrun, torchrun, srun (torch), or plain python.

    An ``srun`` step of more than one task starts the torch backend (`slurm.slurm_task`);
    a single-task step, or a batch script itself, is a plain run.
    """
    if "HOROVOD_RANK" in os.environ:
        return "horovod", int(os.environ.get("HOROVOD_SIZE", 1))
    if "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ):
        return "torch", int(os.environ.get("WORLD_SIZE", 1))
    task = slurm_task()
    if task is not None:
        return "torch", task.size
    return "local", 1


def launcher_rank() -> int:
    """This process's rank as the launcher set it, before any process group exists."""
    for key in ("HOROVOD_RANK", "RANK"):
        if key in os.environ:
            return int(os.environ[key])
    if "SLURM_STEP_ID" in os.environ:  # an srun task (a batch script's own step sets no SLURM_STEP_ID)
        return int(os.environ.get("SLURM_PROCID", 0))
    return 0


def resolve_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ConfigError(f"comm={backend} is not a backend; choose one of {', '.join(BACKENDS)}")
    if backend == "horovod" and "HOROVOD_RANK" not in os.environ and "RANK" in os.environ:
        raise ConfigError("comm=horovod cannot start under torchrun: each process would be a Horovod job of its own "
                          "(one worker each); use comm=auto or comm=torch under torchrun, or launch with horovodrun")
    if backend == "horovod" and "HOROVOD_RANK" not in os.environ and slurm_task() is not None:
        raise ConfigError("comm=horovod cannot start under srun: Horovod's gloo rendezvous needs horovodrun; "
                          "use comm=auto or comm=torch under Slurm (or run horovodrun inside the allocation)")
    if backend == "torch" and "RANK" not in os.environ and slurm_task() is None:
        raise ConfigError("comm=torch needs a launcher that sets RANK and WORLD_SIZE: torchrun --nproc_per_node <n> "
                          "(or srun under Slurm); use workers=<m> for the in-process simulator")
    resolved = detect_launcher()[0] if backend == "auto" else backend
    if resolved == "horovod":  # an extra (dane[horovod]): refused in one line before anything starts
        from .horovod import check_installed
        check_installed()
    return resolved


def make_communicator(backend: str = "auto", *, torch_backend: str | None = None, servers: int = 1) -> Communicator:
    """Start the process group of ``backend`` (after `resolve_backend`) and return its communicator.

    ``ps`` (a parameter server on torch.distributed, `dane.comm.ps`): the last ``servers`` ranks get a
    `ParameterServer` (``is_server``), whose ``serve()`` the driver runs instead of the algorithm.
    """
    backend = resolve_backend(backend)
    if backend == "ps":
        from .ps_server import connect

        return connect(servers)  # type: ignore[return-value]
    if backend == "horovod":
        from .horovod import HorovodCommunicator

        return HorovodCommunicator()
    if backend == "torch":
        from .torch_dist import TorchDistCommunicator

        return TorchDistCommunicator(torch_backend)
    from .local import LocalCommunicator

    return LocalCommunicator()


__all__ = [
    "AlphaBeta", "BACKENDS", "Communicator", "LocalCommunicator", "ParameterServerCost", "Stragglers", "ThreadCommunicator",
    "ThreadGroup", "detect_launcher", "launcher_rank", "make_communicator", "resolve_backend",
    "ring_allreduce_bytes",
]
