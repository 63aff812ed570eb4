"""Horovod backend, the default under ``horovodrun``, and the settings it is launched with."""
from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass

import torch

from ..errors import ConfigError
from .base import Communicator
from .launcher_signals import install


def not_installed() -> str:
    """The one line for comm=horovod (or a launch under horovodrun) where Horovod is not installed.

    Horovod is the extra ``dane[horovod]``; its last release (0.28.1) needs a C++17 patch to build
    against torch >= 2.1, which scripts/setup.sh applies (a plain pip build of it fails).
    """
    return (f"comm=horovod (or a launch under horovodrun) needs Horovod, which is not installed in {sys.prefix}: "
            f"add dane[horovod] from a checkout with VENV={sys.prefix} bash scripts/setup.sh (it builds Horovod "
            f"0.28.1 with the C++17 patch torch needs), or run under torchrun, comm=torch or the simulator")


def check_installed() -> None:
    """Refuse comm=horovod in one line, before any process group starts, when Horovod cannot be imported."""
    if importlib.util.find_spec("horovod") is None:
        raise ConfigError(not_installed())


class HorovodCommunicator(Communicator):
    """Horovod's collectives behind the `Communicator` interface.

    ``init=False`` takes Horovod as already started: under Horovod elastic (`dane.loop.elastic`)
    the elastic loop owns ``hvd.init``/``hvd.shutdown`` and re-initializes Horovod after
    every reset, so each attempt makes a communicator for the current (rank, size) and
    leaves the shutdown to that loop.  A communicator that finds Horovod started (a
    program that starts it once and then runs several runs in one launch, as
    tests/launched_runs.py does) likewise uses it and leaves its shutdown (and a SIGTERM) to that program:
    under plain horovodrun the rendezvous keeps the first start's addresses, so a second
    ``hvd.init`` after ``hvd.shutdown`` in one process may connect to closed ones (seen:
    ``gloo::IoException`` "Connect timeout", and the process aborts).
    """

    carries_rides = True

    def __init__(self, *, init: bool = True) -> None:
        try:
            import horovod.torch as hvd
        except ImportError as exc:  # installed but broken (a half-built extension): the same fix
            raise ConfigError(f"{not_installed()} ({exc})") from None

        owns = init and not hvd.is_initialized()
        if owns:
            hvd.init()
        self._hvd = hvd
        self._owns = owns
        self.rank = hvd.rank()
        self.size = hvd.size()
        self.local_rank = hvd.local_rank()
        if owns:  # horovodrun SIGTERMs the survivors once a process exits: the one lost-peer line instead
            install("horovodrun")
        super().__init__()

    @staticmethod
    def _name(kind: str, tensors: list[torch.Tensor]) -> str:
        # Horovod matches collectives across ranks by name.  A name that repeats for the
        # same shapes lets its response cache skip the full negotiation on later calls
        # (a fresh name per call pays the full negotiation every time, and overflows the cache).
        # The calls are blocking, so two with one name are never in flight together.
        shapes = ";".join(f"{t.dtype}{tuple(t.shape)}" for t in tensors)
        return f"dane.{kind}.{shapes}"

    def _allreduce_mean(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        # The sum, then divided by m, as torch.distributed's mean and the simulators' are: Horovod's Average
        # multiplies by fl(1/m), which for m not a power of two is another number (25 * fl(1/3) * 3 != 25).
        handle = self._hvd.grouped_allreduce_async(tensors, op=self._hvd.Sum, name=self._name("allreduce", tensors))
        return [total.div_(self.size) for total in self._wait(handle)]

    def _broadcast(self, tensors: list[torch.Tensor], root: int) -> list[torch.Tensor]:
        handles = [self._hvd.broadcast_async(t, root_rank=root, name=self._name(f"broadcast{root}", [t]))
                   for t in tensors]
        return [self._wait(handle) for handle in handles]

    def _wait(self, handle):
        """Horovod's ``synchronize``, its own loop written in Python.

        A collective posted just after a peer died is never completed by Horovod (its
        background loop is gone), and a wait inside Horovod's C++ would then hold this
        process until the launcher kills it, so the worker could not say why it stops.
        Polling here lets the launcher's SIGTERM reach the handler of
        `launcher_signals.install`, which turns it into the one-line lost-peer error.
        Between polls the thread calls ``sched_yield`` and nothing else, the loop of
        ``synchronize`` itself (``std::this_thread::yield`` in C++), so that Horovod's
        background thread, pinned to the same core, gets it as it would under
        ``synchronize`` on any kernel.  Not ``time.sleep(0)``: that is a ``clock_nanosleep``
        to a deadline already past, a timer wake-up and not a yield, and on Linux 6.18 (the
        EEVDF scheduler) it made each collective cost several times ``synchronize``.
        ``make bench`` measures the two in the same launches
        (``allreduce_latency_ratio.horovod_wait_over_synchronize``, goal <= 1.2).
        """
        while not self._hvd.poll(handle):
            os.sched_yield()
        return self._hvd.synchronize(handle)

    def barrier(self) -> None:
        self._hvd.join()

    def shutdown(self) -> None:
        if self._owns:
            self._hvd.shutdown()


LATENCY_BOUND_CYCLE_MS = 0.1  # convex problems: millisecond rounds, small allreduces
COMPUTE_BOUND_CYCLE_MS = 5.0  # networks: rounds of seconds of compute between allreduces


@dataclass(frozen=True)
class HorovodOptions:
    """Horovod settings applied (unless already set in the environment) before ``hvd.init()``.

    Small allreduces are latency-bound on these machines (docs/design.md, "The machines"):
    - a short cycle time (``HOROVOD_CYCLE_TIME``) lets the background thread pick a
      request up sooner.  It is not free: the background loop wakes once per cycle, on
      the core of the rank's compute, also while the rank computes.  So the cycle is
      chosen by the problem (`cycle_time_for`): `LATENCY_BOUND_CYCLE_MS` where a round
      is a few milliseconds of compute between small allreduces (the convex problems),
      `COMPUTE_BOUND_CYCLE_MS` where it is seconds of compute (networks), at the cost of
      at most one cycle per allreduce (``make bench``: ``strong_scaling.mnist_lenet5``
      times a network round under both);
    - ``pin_cores`` gives each local rank its own block of cores: the process (and so
      gloo's threads and torch's intra-op threads) is bound to it, and Horovod's
      background thread to its first core (``HOROVOD_THREAD_AFFINITY``), so that threads
      stop migrating between cores (``make bench``: ``allreduce_latency_ratio`` times a
      4 KB gloo allreduce under torchrun with and without pinning);
    - torch gets one intra-op thread per core of the block, as torchrun does with
      OMP_NUM_THREADS=1: more threads than cores makes ranks wait on each other's
      threads, and a small DANE round slows many times over.  A network run then
      holds one thread whatever the block (`dane.problems.neural.reproducible_numerics`).
    Pinning is skipped when there are more local ranks than usable cores.
    """

    cycle_time_ms: float = 0.1
    pin_cores: bool = True

    @staticmethod
    def cycle_time_for(problem) -> float:
        """The cycle for ``problem``'s config: `COMPUTE_BOUND_CYCLE_MS` if it says ``compute_bound`` (networks),
        else `LATENCY_BOUND_CYCLE_MS`."""
        return COMPUTE_BOUND_CYCLE_MS if problem.compute_bound else LATENCY_BOUND_CYCLE_MS

    def apply(self) -> None:
        os.environ.setdefault("HOROVOD_CYCLE_TIME", str(self.cycle_time_ms))
        local_size = int(os.environ.get("HOROVOD_LOCAL_SIZE", os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", 1)))
        local_rank = int(os.environ.get("HOROVOD_LOCAL_RANK", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", 0)))
        blocks = pin_local_rank(local_rank, local_size) if self.pin_cores else []
        if blocks:
            os.environ.setdefault("HOROVOD_THREAD_AFFINITY", ",".join(str(b[0]) for b in blocks))
        if "OMP_NUM_THREADS" not in os.environ:
            share = len(blocks[local_rank]) if blocks else len(os.sched_getaffinity(0)) // max(1, local_size)
            torch.set_num_threads(max(1, share))


def pin_local_rank(local_rank: int, local_size: int) -> list[list[int]]:
    """Bind this process to the ``local_rank``-th of ``local_size`` equal blocks of its usable cores.

    Returns every local rank's block (empty, and nothing bound, when there are more
    local ranks than cores).
    """
    cores = sorted(os.sched_getaffinity(0))
    width = len(cores) // max(1, local_size)
    if width < 1:
        return []
    blocks = [cores[r * width:(r + 1) * width] for r in range(local_size)]
    os.sched_setaffinity(0, blocks[local_rank])
    return blocks
