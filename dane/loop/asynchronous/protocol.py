"""Asynchronous and stale-synchronous SGD on the real parameter server (``torchrun ... comm=ps comm.staleness=s``).

The event loop of `dane.loop.asynchronous.simulator.EventSimulator`, but with real processes and
`torch.distributed` point-to-point messages.  It runs between the synchronous parts of a
``comm=ps`` run (set-up before it; the evaluation of the recorded iterates after it, with
`dane.comm.ps`'s own protocol), on tags of its own, and with one server only.  It is a
run, not a collective (the server builds the algorithm's server half and counts the
run's rounds), so it lives with the run above `dane.comm` and uses only the public
parts of `dane.comm.ps` (`PSCommunicator.pause_servers`, ``server_ranks``).

Start.  Each worker sends the server ``[n_local, numel, dtype, updates_per_round]`` and
worker 0 sends w_0.  The server builds the algorithm's server object from the config
(``spec.algorithm.async_server(w0, sizes)``).  Every worker starts from w_0 (version 0).

Loop.  A worker sends a one-value header and then its update, and waits for a reply.  The
reply is a header ``[version, stop]`` and, unless stop is set, the parameters.  The server
takes pushes from any worker in the order they arrive.  It applies each push, logs its
staleness, and keeps the iterate at every round boundary.  SSP holds a reply while that
worker is more than s clocks ahead of the slowest; the pushing worker is answered first,
then the released ones by rank.  Once ``rounds * m * updates_per_round`` updates are in,
the server answers every worker with stop and discards the pushes that were still in
flight.

End.  The server sends every worker the kept iterates, their times and the update log.

Counted on both ends of each worker-server link (`dane.comm.ps_protocol.Link`, the summary's ``parameter_server``),
as the synchronous protocol's messages are: every push (its header, control bytes, and its update, payload) and
every reply (its header, and the parameters where it has them); the server's ``pushes`` and its ``busy_s`` (from a
push's arrival to its replies) and ``wait_s`` (for the next push).  The start and the final transfer of the kept
iterates are the replay's bookkeeping, not counted (as ``STATS``).
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ...comm.ps_protocol import DTYPES
from .updates import LOG_FIELDS

TAG_START, TAG_PUSH, TAG_DATA, TAG_REPLY, TAG_RESULT = 11, 12, 13, 14, 15


def work(comm, algo, updates_per_round: int, slowdown: float = 1.0) -> dict:
    """A worker's asynchronous phase: step at the pulled parameters, push, wait for the reply, until stopped.

    ``slowdown`` > 1 makes this worker a straggler on purpose (``comm.slowdown``): after each
    step it sleeps (slowdown - 1) times that step's time (compute, push and reply), so its
    steps take ``slowdown`` times as long as they would.

    Returns what the server recorded (`serve` ``results``); this worker's pushes and replies are on its link
    (`count_push`, `count_reply`).
    """
    server = comm.server_ranks[0]
    w = algo.iterate.detach().clone().reshape(-1)
    start = torch.tensor([algo.problem.n_local, w.numel(), DTYPES.index(w.dtype), updates_per_round])
    dist.send(start, dst=server, tag=TAG_START)
    if comm.rank == 0:
        dist.send(w, dst=server, tag=TAG_START)
    pushes = 0
    reply = torch.zeros(2, dtype=torch.int64)
    link = comm.links[server]
    while True:
        started = time.perf_counter()
        (update,) = algo.worker_update(w.clone())
        flat = update.detach().reshape(-1).to(w.dtype)
        dist.send(torch.tensor([pushes], dtype=torch.int64), dst=server, tag=TAG_PUSH)
        dist.send(flat, dst=server, tag=TAG_DATA)
        pushes += 1
        count_push(link, flat)
        dist.recv(reply, src=server, tag=TAG_REPLY)
        count_reply(link, None if reply[1] else w)
        if reply[1]:
            break
        dist.recv(w, src=server, tag=TAG_REPLY)
        if slowdown > 1:
            time.sleep((slowdown - 1) * (time.perf_counter() - started))
    return receive_results(server, w)


#: the bytes of a push's header and of a reply's: one and two int64
PUSH_HEADER_BYTES, REPLY_HEADER_BYTES = 8, 16


def count_push(link, update: torch.Tensor) -> None:
    """One push on ``link`` (either end's count): its header and its update."""
    link.to_server_messages += 2
    link.control_bytes += PUSH_HEADER_BYTES
    link.to_server_bytes += update.numel() * update.element_size()


def count_reply(link, w: torch.Tensor | None) -> None:
    """One reply on ``link``: its header, and the parameters unless it says stop (``w`` None)."""
    link.to_worker_messages += 1 if w is None else 2
    link.control_bytes += REPLY_HEADER_BYTES
    if w is not None:
        link.to_worker_bytes += w.numel() * w.element_size()


def receive_results(server: int, like: torch.Tensor) -> dict:
    sizes = torch.zeros(2, dtype=torch.int64)
    dist.recv(sizes, src=server, tag=TAG_RESULT)
    kept, updates = int(sizes[0]), int(sizes[1])
    iterates = torch.empty(kept, like.numel(), dtype=like.dtype)
    times = torch.empty(kept, dtype=torch.float64)
    log = torch.empty(updates, len(LOG_FIELDS), dtype=torch.float64)
    for buf in (iterates, times, log):
        dist.recv(buf, src=server, tag=TAG_RESULT)
    return {"iterates": list(iterates), "times": times.tolist(), "log": log.tolist()}


class AsyncServer:
    """The server's side: the push loop of the module docstring."""

    def __init__(self, comm, spec):
        self.m, self.spec, self.comm = comm.workers, spec, comm
        self.staleness = spec.comm.staleness

    def serve(self) -> None:
        m = self.m
        starts = [torch.zeros(4, dtype=torch.int64) for _ in range(m)]
        for rank, start in enumerate(starts):
            dist.recv(start, src=rank, tag=TAG_START)
        numel, dtype, per_round = int(starts[0][1]), DTYPES[int(starts[0][2])], int(starts[0][3])
        w0 = torch.empty(numel, dtype=dtype)
        dist.recv(w0, src=0, tag=TAG_START)
        server = self.spec.algorithm.async_server(w0.clone(), [float(s[0]) for s in starts])
        target, every = self.spec.control.stop.rounds * m * per_round, m * per_round
        iterates, times, log = [w0.clone()], [0.0], []
        clocks, pulled, lead = [0] * m, [0] * m, [0] * m
        waiting: set[int] = set()
        version, stopped, t0 = 0, 0, time.perf_counter()
        header, update = torch.zeros(1, dtype=torch.int64), torch.empty(numel, dtype=dtype)
        spent, ops = self.comm.times, self.comm.ops  # the server's counters (`dane.comm.ps_server`)
        while stopped < m:
            waited = time.perf_counter()
            src = dist.recv(header, tag=TAG_PUSH)  # from whichever worker pushes first
            arrived = time.perf_counter()
            spent["wait_s"] += arrived - waited
            try:  # busy from the push's arrival to its replies, whichever way it is answered
                dist.recv(update, src=src, tag=TAG_DATA)
                count_push(self.comm.links[src], update)
                ops["pushes"] += 1
                if version >= target:  # a push still in flight when the run ended: answered, not applied
                    self._reply(src, version, None)
                    stopped += 1
                    continue
                server.apply([update.clone()], src)
                clocks[src] += 1
                version += 1
                now = time.perf_counter() - t0
                log.append([version, src, clocks[src], pulled[src], version - 1 - pulled[src], lead[src], now])
                if version % every == 0:
                    iterates.append(server.w.detach().clone())
                    times.append(now)
                waiting.add(src)
                if version >= target:
                    for j in sorted(waiting):
                        self._reply(j, version, None)
                    stopped += len(waiting)
                    waiting.clear()
                    continue
                slowest = min(clocks)
                for j in [src] + sorted(waiting - {src}):
                    if j in waiting and clocks[j] - slowest <= self.staleness:
                        waiting.discard(j)
                        pulled[j], lead[j] = version, clocks[j] - slowest
                        self._reply(j, version, server.w.detach())
            finally:
                spent["busy_s"] += time.perf_counter() - arrived
        self._send_results(iterates, times, log)

    def _reply(self, worker: int, version: int, w: torch.Tensor | None) -> None:
        dist.send(torch.tensor([version, int(w is None)], dtype=torch.int64), dst=worker, tag=TAG_REPLY)
        if w is not None:
            dist.send(w.contiguous(), dst=worker, tag=TAG_REPLY)
        count_reply(self.comm.links[worker], w)

    def _send_results(self, iterates: list[torch.Tensor], times: list[float], log: list[list[float]]) -> None:
        stacked = torch.stack(iterates)
        bufs = [torch.tensor(times, dtype=torch.float64),
                torch.tensor(log, dtype=torch.float64).reshape(len(log), len(LOG_FIELDS))]
        for worker in range(self.m):
            dist.send(torch.tensor([len(iterates), len(log)], dtype=torch.int64), dst=worker, tag=TAG_RESULT)
            for buf in (stacked, *bufs):
                dist.send(buf, dst=worker, tag=TAG_RESULT)
