"""The server ranks of `dane.comm.ps`: each holds slice j of every message and answers the workers.

The protocol (headers, operations, slices, what is counted) is described in `dane.comm.ps`.
"""
from __future__ import annotations

import time
from dataclasses import replace

import torch

from ..errors import ConfigError
from .ps import PSCommunicator
from .ps_protocol import (BARRIER, BROADCAST, HEADER, MEAN, OBJECT, OP_NAMES, PULL, PUSH, RESTORE, SAVE, SERVER_FIELDS,
                          SHUTDOWN, STATS, TAG_DATA, TAG_HEADER, TAG_REPLY, UNCOUNTED, Groups, Link, decode,
                          slice_bounds, wait_all)


class ParameterServer:
    """A server rank: holds slice j of every message and answers the workers until they shut it down."""

    is_server = True

    def __init__(self, dist, workers: int) -> None:
        self._dist = dist
        self.rank = dist.get_rank()
        self.workers = workers
        self.servers = dist.get_world_size() - workers
        self.index = self.rank - workers  # which slice of each buffer this server holds
        self.links = [Link() for _ in range(workers)]  # this server's end of its link to each worker
        self.times = dict.fromkeys(SERVER_FIELDS[:4], 0.0)
        self.ops = dict.fromkeys(SERVER_FIELDS[4:], 0)
        self._kept: list[torch.Tensor] = []  # the mean of the last push, one slice per group
        self._kept_groups: Groups = ()
        self._started = time.perf_counter()
        self._saved: list[tuple] = []  # the counters at each SAVE not yet restored, which RESTORE puts back

    def serve(self) -> dict:
        """Answer headers until every worker has sent SHUTDOWN; returns this server's counters (``uptime_s`` since it
        was made: an asynchronous run serves its set-up, `dane.loop.asynchronous.protocol`'s phase and its evaluations,
        and the counters add up all three)."""
        while True:
            t0 = time.perf_counter()
            op, root, groups = self._headers()
            t1 = time.perf_counter()
            self.times["wait_s"] += t1 - t0
            if op == SHUTDOWN:
                break
            {PUSH: self._push, PULL: self._pull, BARRIER: self._barrier, STATS: self._stats, MEAN: self._mean,
             SAVE: self._save, RESTORE: self._restore}.get(op, self._relay)(op, root, groups)
            if op not in UNCOUNTED:
                self.times["busy_s"] += time.perf_counter() - t1
        self.times["uptime_s"] = time.perf_counter() - self._started
        return {"status": "served", "backend": "ps", "server_rank": self.rank, **self.times, **self.ops,
                "links": [{"worker": w, "server": self.rank, **vars(link)} for w, link in enumerate(self.links)]}

    def shutdown(self) -> None:
        if self._dist.is_initialized():
            self._dist.destroy_process_group()

    def _headers(self) -> tuple[int, int, Groups]:
        """The next operation: one header from every worker, which must all agree."""
        headers = [torch.zeros(HEADER, dtype=torch.int64) for _ in range(self.workers)]
        wait_all([self._dist.irecv(h, src=w, tag=TAG_HEADER) for w, h in enumerate(headers)])
        decoded = [decode(h) for h in headers]
        for w, d in enumerate(decoded):
            if d != decoded[0]:
                raise RuntimeError(
                    f"parameter server rank {self.rank}: worker {w} asked for {OP_NAMES.get(d[0], d[0])} {d[2]} while "
                    f"worker 0 asked for {OP_NAMES.get(decoded[0][0], decoded[0][0])} {decoded[0][2]}: the workers "
                    "left their common sequence of operations (did one of them fail?)")
        op = decoded[0][0]
        if op not in UNCOUNTED:
            for link in self.links:
                link.to_server_messages += 1
                link.control_bytes += HEADER * 8
        return decoded[0]

    def _slices(self, groups: Groups) -> list[int]:
        return [b - a for a, b in (slice_bounds(numel, self.servers)[self.index] for _, numel in groups)]

    def _received(self, groups: Groups, counted: bool) -> list[list[torch.Tensor]]:
        """Every worker's slice of each group of a push or a MEAN, received: [group][worker]."""
        received = [[torch.empty(n, dtype=dtype) for _ in range(self.workers)]
                    for (dtype, _), n in zip(groups, self._slices(groups))]
        wait_all([self._receive(buf, w, counted) for bufs in received for w, buf in enumerate(bufs) if buf.numel()])
        return received

    def _send_all(self, pieces: list[torch.Tensor], counted: bool) -> None:
        """Each piece to every worker: a pull's or a MEAN's reply."""
        wait_all([self._send(piece, w, counted) for piece in pieces if piece.numel() for w in range(self.workers)])

    def _average(self, received: list[list[torch.Tensor]]) -> list[torch.Tensor]:
        """The workers' mean of each group: summed in worker order, then divided by m (the simulator's arithmetic)."""
        return [torch.stack(bufs).sum(0) / self.workers for bufs in received]

    def _push(self, op: int, root: int, groups: Groups) -> None:
        received = self._received(groups, True)
        t0 = time.perf_counter()
        self._kept = self._average(received)
        self._kept_groups = groups
        self.times["reduce_s"] += time.perf_counter() - t0
        self.ops["pushes"] += 1

    def _pull(self, op: int, root: int, groups: Groups) -> None:
        if groups != self._kept_groups:
            raise RuntimeError(f"parameter server rank {self.rank}: pull of {groups} after a push of {self._kept_groups}")
        self._send_all(self._kept, True)
        self.ops["pulls"] += 1

    def _mean(self, op: int, root: int, groups: Groups) -> None:
        """MEAN: the m slices in, their mean out to every worker at once, nothing counted or kept (a pull after it
        still reads the last push)."""
        self._send_all(self._average(self._received(groups, False)), False)

    def _relay(self, op: int, root: int, groups: Groups) -> None:
        """BROADCAST and OBJECT: the root's slices, sent on to every other worker."""
        if op not in (BROADCAST, OBJECT):
            raise RuntimeError(f"parameter server rank {self.rank}: unknown operation {op}")
        counted = op == BROADCAST
        pieces = [torch.empty(n, dtype=dtype) for (dtype, _), n in zip(groups, self._slices(groups))]
        wait_all([self._receive(p, root, counted) for p in pieces if p.numel()])
        wait_all([self._send(p, w, counted) for p in pieces if p.numel() for w in range(self.workers) if w != root])
        if counted:
            self.ops["broadcasts"] += 1

    def _barrier(self, op: int, root: int, groups: Groups) -> None:
        ack = torch.ones(1, dtype=torch.uint8)
        wait_all([self._dist.isend(ack, dst=w, tag=TAG_REPLY) for w in range(self.workers)])
        for link in self.links:
            link.to_worker_messages += 1
            link.control_bytes += 1
        self.ops["barriers"] += 1

    def _save(self, op: int, root: int, groups: Groups) -> None:
        """SAVE: keep the counters (links, operations, times but ``uptime_s``) that RESTORE puts back."""
        self._saved.append(([replace(link) for link in self.links], dict(self.times), dict(self.ops)))

    def _restore(self, op: int, root: int, groups: Groups) -> None:
        """RESTORE: the counters as SAVE kept them; what was served between is on none of them."""
        if not self._saved:
            raise RuntimeError(f"parameter server rank {self.rank}: a restore of its counters without a save")
        links, times, self.ops = self._saved.pop()
        self.links = links
        self.times = {**times, "uptime_s": self.times["uptime_s"]}

    def _stats(self, op: int, root: int, groups: Groups) -> None:
        self.times["uptime_s"] = time.perf_counter() - self._started
        values = [*self.times.values(), *self.ops.values()] + [v for link in self.links for v in link.values()]
        reply = torch.tensor(values, dtype=torch.float64)
        wait_all([self._dist.isend(reply, dst=w, tag=TAG_REPLY) for w in range(self.workers)])

    def _receive(self, buf: torch.Tensor, worker: int, counted: bool = True):
        if counted:
            self.links[worker].to_server_messages += 1
            self.links[worker].to_server_bytes += buf.numel() * buf.element_size()
        return self._dist.irecv(buf, src=worker, tag=TAG_DATA)

    def _send(self, piece: torch.Tensor, worker: int, counted: bool):
        if counted:
            self.links[worker].to_worker_messages += 1
            self.links[worker].to_worker_bytes += piece.numel() * piece.element_size()
        return self._dist.isend(piece, dst=worker, tag=TAG_REPLY)


def connect(servers: int = 1) -> PSCommunicator | ParameterServer:
    """Start the gloo process group; the last ``servers`` ranks get a `ParameterServer`, the others a
    `PSCommunicator`."""
    import torch.distributed as dist

    from .torch_dist import init_process_group

    if not dist.is_initialized():
        init_process_group("gloo")
    size = dist.get_world_size()
    if not 1 <= servers < size:
        raise ConfigError(f"comm.servers={servers} but the launcher started {size} process(es); "
                          "comm=ps needs 1 <= comm.servers < the number of processes")
    workers = size - servers
    return ParameterServer(dist, workers) if dist.get_rank() >= workers else PSCommunicator(dist, workers)
