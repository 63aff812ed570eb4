"""A parameter server on torch.distributed point-to-point messages (gloo ``isend``/``irecv``).

Ranks.  Under ``torchrun --nproc_per_node P`` with ``comm=ps comm.servers=k`` the last k
ranks (m .. P-1, m = P - k) are servers and ranks 0 .. m-1 are workers.  A worker keeps
its launcher rank, so the workers' `PSCommunicator` has rank/size = worker rank / m:
every algorithm runs unchanged, the shards are those of an m-worker run and rank 0
writes the results.  A server rank runs `dane.comm.ps_server.ParameterServer.serve` instead of
the algorithm.

Slices.  Each call groups its tensors into one flat buffer per dtype (as the torch
backend does); server j holds slice j of every buffer (`slice_bounds`: k contiguous
slices, the first ``n % k`` one element longer), so each worker sends each server 1/k
of the message.

Protocol (synchronous: the workers issue the same sequence of operations, as any
data-parallel program does).  For each operation a worker sends every server a header,
``HEADER`` int64 values ``[op, root, groups, dtype_0, numel_0, ...]`` (so a server learns
the shapes and dtypes of what follows), then the payload slices.  A server reads one
header from every worker, checks that they agree, and then:

- ``PUSH``: receives the m slices and keeps their mean (summed in worker order, then
  divided by m: the simulator's arithmetic, so the iterates agree to the last bits);
- ``PULL``: sends the kept mean to each worker;
- ``BROADCAST``: receives the root's slices and sends them to the other workers;
- ``BARRIER``: once all m headers are in, sends each worker a one-byte ack;
- ``STATS``: sends its counters (`PSCommunicator.summary_entries`);
- ``MEAN``: receives the m slices and sends their mean back at once, keeping nothing
  (`PSCommunicator.uncounted_allreduce_mean`: bookkeeping, such as `dane.work`'s totals);
- ``SAVE`` and ``RESTORE``: keep its counters, and later put them back (`Communicator.uncounted`: the
  collectives between, such as the reference optimum's before the run, are on no link's count);
- ``SHUTDOWN``: leaves the serve loop (every worker's `PSCommunicator.shutdown` sends one).

``allreduce_mean`` is `PSCommunicator.push` then `PSCommunicator.pull`: one
communication round, and ``bytes_sent`` grows by the message's bytes (what a worker
sends; for m = 2 this equals the ring model's 2(m-1)/m share).  A broadcast adds the
payload to the root's ``bytes_sent`` once.  Both are `ParameterServerCost`'s ``allreduce_sent`` and
``broadcast_sent``, which the simulator's workers count under ``sim.topology=ps``.  Per link (worker -> server, server -> worker) the
payload bytes and the messages (headers and acks included; their bytes are counted
apart as control bytes) are counted on both ends, and each server times how long it
waited for the workers' headers and how long it was busy (receiving, averaging,
sending).  ``broadcast_object`` (the run directory), ``MEAN`` and ``STATS`` are not counted, nor is anything inside
`Communicator.uncounted`.
"""
from __future__ import annotations

import time
from dataclasses import fields, replace
from typing import Any

import torch

from .base import Communicator
from .cost import ParameterServerCost
from .ps_protocol import (BARRIER, BROADCAST, MEAN, OBJECT, PULL, PUSH, RESTORE, SAVE, SERVER_FIELDS, SHUTDOWN, STATS,
                          TAG_DATA, TAG_HEADER, TAG_REPLY, UNCOUNTED, Groups, Link, encode, flatten, layout, slice_bounds,
                          unflatten, wait_all)

class PSCommunicator(Communicator):
    """A worker's view of the parameter servers: rank/size are the worker rank and the number of workers."""

    is_server = False
    traffic = ParameterServerCost()  # what a worker sends: the message per push, the payload per broadcast

    def __init__(self, dist, workers: int) -> None:
        self._dist = dist
        self.rank = dist.get_rank()
        self.size = workers
        self.server_ranks = list(range(workers, dist.get_world_size()))
        self.links = {s: Link() for s in self.server_ranks}  # this worker's end of its link to each server
        self.comm_s = 0.0  # time spent inside this worker's communication calls
        self._pending: list = []
        self._keep: list[torch.Tensor] = []  # buffers of sends still in flight
        super().__init__()

    # -- the counted collectives -------------------------------------------------------------------
    def allreduce_mean(self, tensors: list[torch.Tensor], kinds=()) -> list[torch.Tensor]:
        """Average every tensor over the workers, through the servers (push, then pull): one round.  ``kinds`` is
        the base's (`Communicator.allreduce_mean`); comm.compress is refused under comm=ps, so nothing is compressed."""
        if not isinstance(tensors, (list, tuple)) or not tensors:
            raise TypeError("allreduce_mean takes a non-empty list of tensors")
        bad = [t.dtype for t in tensors if not t.is_floating_point()]
        if bad:
            raise TypeError(f"comm=ps averages floating-point tensors, got {bad[0]}")
        start = time.perf_counter()
        result = self._allreduce_mean(list(tensors))
        self.comm_s += time.perf_counter() - start
        return result

    def broadcast(self, tensors: list[torch.Tensor], root: int = 0) -> list[torch.Tensor]:
        """Every worker receives ``root``'s tensors, relayed by the servers: the root sends each payload once."""
        if self.rank == root:
            payload = sum(t.numel() * t.element_size() for t in tensors)
            self.bytes_sent += self.traffic.broadcast_sent(payload, self.size)
        self.calls += 1
        start = time.perf_counter()
        result = self._broadcast(list(tensors), root)
        self.comm_s += time.perf_counter() - start
        return result

    def broadcast_object(self, text: str, root: int = 0) -> str:
        """A short string through the servers; not counted, neither here nor on the links."""
        data = torch.tensor(list(text.encode()), dtype=torch.uint8)
        (length,) = self._broadcast([torch.tensor([data.numel()], dtype=torch.int64)], root, op=OBJECT)
        buf = data if self.rank == root else torch.zeros(int(length.item()), dtype=torch.uint8)
        return bytes(self._broadcast([buf], root, op=OBJECT)[0].tolist()).decode()

    def uncounted_allreduce_mean(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """The mean through the servers in one uncounted exchange (MEAN: each worker's slices in, their mean back),
        neither in ``bytes_sent`` and ``calls`` nor on the links."""
        idx, flats = flatten(tensors)
        groups = tuple((f.dtype, f.numel()) for f in flats)
        self._header(MEAN, groups)
        out = [torch.empty(numel, dtype=dtype) for dtype, numel in groups]
        for flat, mean in zip(flats, out):
            for (server, piece), (_, reply) in zip(self._pieces(flat), self._pieces(mean)):
                self._send(piece, server, counted=False)
                self._receive(reply, server, counted=False)
        self._complete()
        return unflatten(tensors, idx, out)

    # -- push and pull -----------------------------------------------------------------------------
    def push(self, tensors: list[torch.Tensor]) -> None:
        """Send slice j of this worker's tensors to server j; a server averages once all m workers have pushed.

        Adds the tensors' bytes to ``bytes_sent``.  The sends are posted, not awaited: the
        next `pull` (or any other call) completes them.
        """
        idx, flats = flatten(tensors)
        self.bytes_sent += self.traffic.allreduce_sent(sum(f.numel() * f.element_size() for f in flats), self.size)
        self._header(PUSH, tuple((f.dtype, f.numel()) for f in flats))
        for flat in flats:
            for server, piece in self._pieces(flat):
                self._send(piece, server, counted=True)

    def pull(self, like: list[torch.Tensor]) -> list[torch.Tensor]:
        """The servers' mean of the last push, as new tensors shaped (and typed, and placed) like ``like``.

        A push and its pull are one communication round: the pull adds one to ``calls``.
        """
        self.calls += 1
        idx, groups = layout(like)
        self._header(PULL, groups)
        out = [torch.empty(numel, dtype=dtype) for dtype, numel in groups]
        for flat in out:
            for server, piece in self._pieces(flat):
                self._receive(piece, server, counted=True)
        self._complete()
        return unflatten(like, idx, out)

    def _allreduce_mean(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        self.push(tensors)
        return self.pull(tensors)

    def _broadcast(self, tensors: list[torch.Tensor], root: int, op: int = BROADCAST) -> list[torch.Tensor]:
        if self.rank == root:
            idx, out = flatten(tensors)
            groups = tuple((f.dtype, f.numel()) for f in out)
        else:
            idx, groups = layout(tensors)
            out = [torch.empty(numel, dtype=dtype) for dtype, numel in groups]
        self._header(op, groups, root)
        counted = op not in UNCOUNTED
        for flat in out:
            for server, piece in self._pieces(flat):
                if self.rank == root:
                    self._send(piece, server, counted)
                else:
                    self._receive(piece, server, counted)
        self._complete()
        return unflatten(tensors, idx, out)  # new tensors on the root too: its flat buffers are copies

    def barrier(self) -> None:
        start = time.perf_counter()
        self._header(BARRIER, ())
        acks = [torch.zeros(1, dtype=torch.uint8) for _ in self.server_ranks]
        for server, ack in zip(self.server_ranks, acks):
            self._pending.append(self._dist.irecv(ack, src=server, tag=TAG_REPLY))
            self.links[server].to_worker_messages += 1
            self.links[server].control_bytes += 1
        self._complete()
        self.comm_s += time.perf_counter() - start

    def saved_counts(self) -> Any:
        """The base's counters, this worker's end of each link and ``comm_s``; the servers keep theirs (SAVE)."""
        self._header(SAVE, ())
        self._complete()
        return super().saved_counts(), {s: replace(link) for s, link in self.links.items()}, self.comm_s

    def restore_counts(self, saved: Any) -> None:
        base, self.links, self.comm_s = saved
        super().restore_counts(base)
        self._header(RESTORE, ())
        self._complete()

    def reset_clock(self) -> None:
        """Restart the clock and ``comm_s`` (the driver calls this once every worker is set up)."""
        super().reset_clock()
        self.comm_s = 0.0

    # -- what the run's summary gets ---------------------------------------------------------------
    def summary_entries(self) -> dict:
        """``{"parameter_server": ...}``: each server's busy and waiting time and every link's traffic, as the
        servers counted them (a collective: every worker calls it), and this worker's time in communication."""
        self._header(STATS, ())
        per_worker = len(fields(Link))
        replies = [torch.zeros(len(SERVER_FIELDS) + per_worker * self.size, dtype=torch.float64)
                   for _ in self.server_ranks]
        for server, reply in zip(self.server_ranks, replies):
            self._pending.append(self._dist.irecv(reply, src=server, tag=TAG_REPLY))
        self._complete()
        servers, links = [], []
        for server, reply in zip(self.server_ranks, replies):
            values = reply.tolist()
            head = dict(zip(SERVER_FIELDS, values))
            servers.append({"rank": server, **{k: (int(v) if k in SERVER_FIELDS[4:] else v) for k, v in head.items()}})
            for worker in range(self.size):
                counts = values[len(SERVER_FIELDS) + per_worker * worker:][:per_worker]
                links.append({"worker": worker, "server": server,
                              **{f.name: int(v) for f, v in zip(fields(Link), counts)}})
        return {"parameter_server": {
            "workers": self.size, "servers": len(self.server_ranks), "server_ranks": self.server_ranks,
            "server": servers, "links": links, "worker_comm_s": self.comm_s,
            "worker_links": [{"worker": self.rank, "server": s, **vars(link)} for s, link in self.links.items()],
        }}

    def pause_servers(self) -> None:
        """End the servers' synchronous loop (`ParameterServer.serve` returns) and keep the process group, so
        that another protocol on tags of its own can run (`dane.loop.asynchronous.protocol`); the servers' next
        ``serve()`` answers this protocol again.  Every worker calls it."""
        self._header(SHUTDOWN, ())
        self._complete()

    def shutdown(self) -> None:
        """Tell every server to stop, then release the process group."""
        if not self._dist.is_initialized():
            return
        try:
            self._header(SHUTDOWN, ())
            wait_all(self._pending)
        finally:
            self._pending, self._keep = [], []
            self._dist.destroy_process_group()

    # -- messages ----------------------------------------------------------------------------------
    def _header(self, op: int, groups: Groups, root: int = 0) -> None:
        header = encode(op, groups, root)
        self._keep.append(header)
        for server in self.server_ranks:
            self._pending.append(self._dist.isend(header, dst=server, tag=TAG_HEADER))
            if op not in UNCOUNTED:
                self.links[server].to_server_messages += 1
                self.links[server].control_bytes += header.numel() * header.element_size()

    def _pieces(self, flat: torch.Tensor):
        """(server j, slice j of the flat buffer ``flat``) for each server (`slice_bounds`)."""
        return zip(self.server_ranks, (flat[a:b] for a, b in slice_bounds(flat.numel(), len(self.server_ranks))))

    def _send(self, piece: torch.Tensor, server: int, counted: bool) -> None:
        if piece.numel() == 0:
            return  # fewer elements than servers: this server's slice is empty, and no message goes
        self._keep.append(piece)
        self._pending.append(self._dist.isend(piece, dst=server, tag=TAG_DATA))
        if counted:
            self.links[server].to_server_messages += 1
            self.links[server].to_server_bytes += piece.numel() * piece.element_size()

    def _receive(self, piece: torch.Tensor, server: int, counted: bool) -> None:
        if piece.numel() == 0:
            return
        self._pending.append(self._dist.irecv(piece, src=server, tag=TAG_REPLY))
        if counted:
            self.links[server].to_worker_messages += 1
            self.links[server].to_worker_bytes += piece.numel() * piece.element_size()

    def _complete(self) -> None:
        """Wait for every message posted since the last call; their buffers may then go."""
        wait_all(self._pending)
        self._pending, self._keep = [], []
