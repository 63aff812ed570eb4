"""The one communication interface every algorithm talks to.

Algorithms never import horovod or torch.distributed; they receive a `Communicator`.
Each backend implements `_allreduce_mean`, `_broadcast` and `barrier`; this base class counts what the worker sends
and keeps the clock, so the accounting is identical on every backend, and calls ``allreduce_timer`` (a profiler's
hook) around each backend allreduce. With ``comm.compress`` (`dane.comm.compression`) the base also compresses the
tensors an algorithm marks as compressible before the backend sees them (and, with a downlink compressor, the
averaged reply after), and counts uplink and downlink bits.
"""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Callable, ContextManager

import torch

from .compression import MessageCompression
from .cost import AlphaBeta, ParameterServerCost


def one_hot_rows(rows: torch.Tensor, size: int) -> torch.Tensor:
    """The (m, k) table `Communicator.gather` returns from the workers' stacked rows: what the mean of their one-hot
    blocks, times m, gives (row r is v_r/m·m, a sum of v_r and zeros divided by m, then multiplied; + 0.0 as that sum
    turns a −0.0 into 0.0), bit for bit, for the simulators that move the rows alone."""
    return (rows + 0.0) / size * size


class Communicator(ABC):
    """rank, size, a grouped `allreduce_mean`, `broadcast`, `barrier` and a byte counter.

    ``bytes_sent`` counts what this worker sends as ``traffic`` says: by default the ring-allreduce model (each
    worker sends 2(m-1)/m of the message, and a broadcast's root its payload times (m-1)); ``calls`` counts
    communication rounds (one grouped allreduce or one broadcast is one round).

    A backend implements `_allreduce_mean`, `_broadcast` and `barrier`, and may use these hooks: `count_allreduce`
    (a backend whose collectives are its own counts one allreduce as `allreduce_mean` would: the simulators) and
    `saved_counts` with `restore_counts` (what `uncounted` saves and puts back; a backend that counts more, the
    parameter server's links, extends both and calls the base's).
    """

    rank: int = 0
    size: int = 1
    is_server: bool = False  # a parameter server's process (`dane.comm.ps_server`) serves instead of running rounds
    #: ``comm.compress``'s state of this worker (`use_compression`); None: every message as it is, no bit counts
    compression: MessageCompression | None = None
    #: whether `ride_next`'s tensors go with the next allreduce: a backend whose only accounting is this class's
    carries_rides: bool = False
    #: how the workers' local-work counts reach rank 0's record (`dane.work`): "launched" (each rank's table rides an
    #: allreduce), "threads" (the thread simulator's board, copied at each collective) or "stacked" (one ledger holds
    #: every worker's row: the batched simulator)
    local_work_path: str = "launched"
    #: a profiler's hook around each backend allreduce: ``allreduce_timer(counted)`` is a context manager entered just
    #: before the backend's `_allreduce_mean` and left just after it returns, ``counted`` False for
    #: `uncounted_allreduce_mean` (`synthetic.round_timing.PhaseRecorder`); None: none.  A single worker makes no
    #: backend call; the backends whose collectives are their own (the parameter server, the batched simulator) do
    #: not call it
    allreduce_timer: Callable[[bool], ContextManager] | None = None
    #: what one worker sends in an allreduce and a broadcast's root sends (`bytes_sent`): a cost model's
    #: ``allreduce_sent`` and ``broadcast_sent`` (`dane.comm.cost`).  A ring's by default (Horovod,
    #: torch.distributed); the simulators' is their cost model, so that under ``sim.topology=ps`` a worker counts
    #: what a parameter server's worker sends (`dane.comm.ps`)
    traffic: AlphaBeta | ParameterServerCost = AlphaBeta()
    _ride: list[torch.Tensor] | None = None  # to go with the next allreduce (`ride_next`)
    _ridden: list[torch.Tensor] | None = None  # their mean, once they went (`ridden`)

    def __init__(self) -> None:
        self.bytes_sent = 0
        self.calls = 0
        self.message_bytes = 0  # the last allreduce's message as the cost model prices it (compressed size)
        self.message_down_bytes: int | None = None  # its reply's, under comm.compress_down (None: priced as before)
        self._t0 = time.perf_counter()

    def use_compression(self, compression: MessageCompression) -> None:
        """Compress from now on the tensors whose kind ``compression`` names (`dane.comm.compression`)."""
        self.compression = compression

    def allreduce_mean(self, tensors: list[torch.Tensor], kinds: Sequence[str | None] = ()) -> list[torch.Tensor]:
        """Average every tensor over the workers, as one grouped call; returns new tensors.

        ``kinds`` names what each tensor is (``"gradient"``; None or left off: not compressible): under
        ``comm.compress`` a tensor of a kind the algorithm declares compressible is averaged as the
        server decodes it, and one of kind ``METRICS`` (the run's logged measurement) is left out of the bit
        counts (`dane.comm.compression`)."""
        if not isinstance(tensors, (list, tuple)) or not tensors:
            raise TypeError("allreduce_mean takes a non-empty list of tensors")
        if self.compression is not None:
            tensors, nbytes = self.compression.encode(list(tensors), kinds)
            self.message_down_bytes = self.compression.down_bytes
        else:
            nbytes = sum(t.numel() * t.element_size() for t in tensors)
        self.message_bytes = nbytes
        self.bytes_sent += self.traffic.allreduce_sent(nbytes, self.size, self.message_down_bytes)
        self.calls += 1
        ride, self._ride = self._ride, None
        if self.size == 1:
            means = [t.clone() for t in tensors]
        elif ride is None:
            means = self._timed_allreduce(list(tensors), counted=True)
        else:  # in the same call, after the message, on its device: its bytes are not the method's (`ride_next`)
            means = self._timed_allreduce([*tensors, *(t.to(tensors[0].device) for t in ride)], counted=True)
            means, self._ridden = means[:len(tensors)], [t.to(r.device) for t, r in zip(means[len(tensors):], ride)]
        return means if self.compression is None else self.compression.decode_down(means, kinds)

    def gather(self, values: torch.Tensor, rides: Sequence[torch.Tensor] = ()) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(every worker's ``values``, a k-vector, as the rows of an (m, k) tensor, row r worker r's; the mean of each
        of ``rides``), in one collective: the grouped `allreduce_mean` of a one-hot (m, k) block (this worker's
        ``values`` in row ``rank``, zeros elsewhere) and ``rides``, the block's mean times m.  That is what a launched
        run sends and what every backend counts and prices; the simulators move only each worker's k values, with
        the same numbers (`dane.comm.threads`, `dane.comm.batched`), so that a measurement over m simulated workers
        costs memory in m, not m².  The table is read, never written in place: the thread simulator hands every
        worker the same one."""
        block = values.new_zeros((self.size, values.shape[-1]))
        block[self.rank] = values
        block_mean, *means = self.allreduce_mean([block, *rides])
        return block_mean * self.size, means

    def count_allreduce(self, nbytes: int) -> None:
        """Count one uncompressed allreduce of an ``nbytes`` message, as `allreduce_mean` does (a hook for a backend
        whose collectives are its own)."""
        self.message_bytes = nbytes
        self.bytes_sent += self.traffic.allreduce_sent(nbytes, self.size)
        self.calls += 1

    def broadcast(self, tensors: list[torch.Tensor], root: int = 0) -> list[torch.Tensor]:
        """Every worker receives ``root``'s tensors; returns new tensors."""
        if self.rank == root:
            self.bytes_sent += self.traffic.broadcast_sent(sum(t.numel() * t.element_size() for t in tensors),
                                                           self.size)
        if self.compression is not None:
            self.compression.count_broadcast(tensors, root=self.rank == root)
        self.calls += 1
        if self.size == 1:
            return [t.clone() for t in tensors]
        return self._broadcast(list(tensors), root)

    def broadcast_object(self, text: str, root: int = 0) -> str:
        """Broadcast a short string (a run directory, say); not counted as algorithm traffic."""
        if self.size == 1:
            return text
        data = torch.tensor(list(text.encode()), dtype=torch.uint8)
        (length,) = self._broadcast([torch.tensor([data.numel()], dtype=torch.int64)], root)
        buf = data if self.rank == root else torch.zeros(int(length.item()), dtype=torch.uint8)
        return bytes(self._broadcast([buf], root)[0].tolist()).decode()

    def uncounted_allreduce_mean(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """`allreduce_mean` outside the run's accounting: no ``bytes_sent``, ``calls`` or bits (bookkeeping that
        is not the method's traffic: `dane.work`'s totals over the ranks of a launched run)."""
        if self.size == 1:
            return [t.clone() for t in tensors]
        return self._timed_allreduce(list(tensors), counted=False)

    def _timed_allreduce(self, tensors: list[torch.Tensor], counted: bool) -> list[torch.Tensor]:
        """The backend's `_allreduce_mean`, inside ``allreduce_timer(counted)`` where there is one."""
        if self.allreduce_timer is None:
            return self._allreduce_mean(tensors)
        with self.allreduce_timer(counted):
            return self._allreduce_mean(tensors)

    def ride_next(self, tensors: list[torch.Tensor]) -> None:
        """Average ``tensors`` with this worker's next `allreduce_mean`, in the same call and outside the run's
        accounting, as `uncounted_allreduce_mean` would in a call of its own (`dane.work`'s totals over the ranks of
        a launched run: bookkeeping that then costs no collective).  Every rank must ask the same before the same
        allreduce.  A backend that does not carry them (`carries_rides` False: the simulators, whose workers share
        memory, and the parameter servers, whose links count every byte) leaves them; `ridden` then gives None."""
        self._ride, self._ridden = (list(tensors) if self.carries_rides else None), None

    def ridden(self) -> list[torch.Tensor] | None:
        """The mean of `ride_next`'s tensors if an allreduce has carried them since, else None; either way they no
        longer ride."""
        ridden, self._ride, self._ridden = self._ridden, None, None
        return ridden

    @contextmanager
    def uncounted(self) -> Iterator[None]:
        """Collectives that are not the method's (the reference optimum, made before the run: `dane.loop.reference`):
        once the block ends, what this worker counts (``bytes_sent``, ``calls``, ``comm.compress``'s bits) and what its
        backend counts beside it (comm=ps: both ends of every link, and the servers' operations and busy time) is as it
        was when the block began.  Inside, they count as ever (a caller may read what its block cost).  Every rank
        enters and leaves the block together; a block left by an exception restores nothing (the run ends)."""
        saved = self.saved_counts()
        yield
        self.restore_counts(saved)

    def saved_counts(self) -> Any:
        """What `uncounted` puts back: this worker's counters (a backend that counts more keeps that too, a hook)."""
        return self.bytes_sent, self.calls, traffic_bits(self)

    def restore_counts(self, saved: Any) -> None:
        """Put back `saved_counts`'s ``saved`` (a hook, extended with it)."""
        self.bytes_sent, self.calls, bits = saved
        restore_traffic_bits(self, bits)

    def elapsed(self) -> float:
        """Seconds since this communicator started: wall time, or simulated time in the simulator."""
        return time.perf_counter() - self._t0

    def reset_clock(self) -> None:
        self._t0 = time.perf_counter()

    def restore_clock(self, elapsed: float) -> None:
        """Go on from ``elapsed`` seconds (a resumed run's clock): `elapsed` reads ``elapsed`` now."""
        self.reset_clock()
        self._t0 -= elapsed

    def next_participants(self, members: list[int] | None, absent=None) -> None:
        """Only the ranks in ``members`` take part in this worker's next collective; the others enter it with
        zeros (client sampling, `dane.sampling.sampled_mean`).  A backend that models time (the simulator)
        charges that collective to the participants only; a real one runs it over every rank as it is.
        ``absent(problem)``: the message of a worker outside ``members`` on its shard ``problem``, for a
        simulator whose non-participants sleep through the round (`dane.comm.roster`); with ``members`` None every
        rank takes part and is charged, a sleeping one through ``absent`` (`dane.comm.roster.fill_parked`)."""

    def drew(self, members: list[int]) -> None:
        """A sampled round drew ``members`` (`dane.sampling.ClientSampler.draw`); the thread simulator may park the
        others (`dane.comm.roster`), every other backend runs every rank as it is."""

    def summary_entries(self) -> dict:
        """What this backend adds to a run's summary (a parameter server's counters); by default, under
        ``comm.compress``, the compressor and the bit totals (``compression``)."""
        return {} if self.compression is None else {"compression": self.compression.summary()}

    @abstractmethod
    def _allreduce_mean(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]: ...

    @abstractmethod
    def _broadcast(self, tensors: list[torch.Tensor], root: int) -> list[torch.Tensor]: ...

    @abstractmethod
    def barrier(self) -> None: ...

    def shutdown(self) -> None:
        """Release the process group, if the backend has one."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, size={self.size})"


def traffic_bits(comm) -> dict[str, int]:
    """A record's ``uplink_bits`` and ``downlink_bits`` so far (`dane.comm.compression`); none without
    ``comm.compress`` (or on a view that is not a `Communicator`: an asynchronous run's)."""
    compression = comm.compression if isinstance(comm, Communicator) else None
    return {} if compression is None else compression.record()


def restore_traffic_bits(comm, cost: dict) -> None:
    """Go on counting bits from a checkpoint's ``cost`` (`traffic_bits`)."""
    if isinstance(comm, Communicator) and comm.compression is not None:
        comm.compression.restore(cost)
