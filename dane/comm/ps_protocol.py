"""The parameter server's wire protocol, shared by its two ends (`dane.comm.ps` workers, `dane.comm.ps_server`).

Operation codes, the header layout ``[op, root, groups, dtype_0, numel_0, ...]``, the
tags, how a call's tensors are grouped into one flat buffer per dtype and split into
the servers' contiguous slices, and the per-link traffic record.  See `dane.comm.ps`
for the protocol itself.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

PUSH, PULL, BROADCAST, OBJECT, BARRIER, STATS, SHUTDOWN, MEAN, SAVE, RESTORE = range(1, 11)
OP_NAMES = {PUSH: "push", PULL: "pull", BROADCAST: "broadcast", OBJECT: "broadcast_object", BARRIER: "barrier",
            STATS: "stats", SHUTDOWN: "shutdown", MEAN: "uncounted_allreduce_mean", SAVE: "uncounted (its start)",
            RESTORE: "uncounted (its end)"}
UNCOUNTED = (OBJECT, STATS, SHUTDOWN, MEAN, SAVE, RESTORE)  # bookkeeping, not the algorithm's traffic
DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool)
HEADER = 3 + 2 * len(DTYPES)  # one (dtype, numel) pair per group, one group per dtype
TAG_HEADER, TAG_DATA, TAG_REPLY = 1, 2, 3
SERVER_FIELDS = ("busy_s", "wait_s", "reduce_s", "uptime_s", "pushes", "pulls", "broadcasts", "barriers")

Groups = tuple[tuple[torch.dtype, int], ...]  # (dtype, numel) of each flat buffer of one call


def slice_bounds(numel: int, servers: int) -> list[tuple[int, int]]:
    """[start, stop) of each server's contiguous slice of a ``numel``-element buffer (as ``torch.tensor_split``)."""
    base, extra = divmod(numel, servers)
    starts = [j * base + min(j, extra) for j in range(servers + 1)]
    return list(zip(starts[:-1], starts[1:]))


@dataclass
class Link:
    """Traffic on one worker-server link, as one end counts it: payload bytes and messages each way."""

    to_server_bytes: int = 0
    to_server_messages: int = 0
    to_worker_bytes: int = 0
    to_worker_messages: int = 0
    control_bytes: int = 0  # headers and acks, both ways

    def values(self) -> list[int]:
        return [getattr(self, f.name) for f in fields(self)]


def encode(op: int, groups: Groups, root: int = 0) -> torch.Tensor:
    header = torch.zeros(HEADER, dtype=torch.int64)
    header[:3] = torch.tensor([op, root, len(groups)])
    for g, (dtype, numel) in enumerate(groups):
        header[3 + 2 * g:5 + 2 * g] = torch.tensor([DTYPES.index(dtype), numel])
    return header


def decode(header: torch.Tensor) -> tuple[int, int, Groups]:
    op, root, count, *pairs = header.tolist()
    return op, root, tuple((DTYPES[pairs[2 * g]], pairs[2 * g + 1]) for g in range(count))


def layout(tensors: list[torch.Tensor]) -> tuple[list[list[int]], Groups]:
    """Indices of the tensors of each dtype (in order of first appearance) and each dtype's (dtype, numel)."""
    order = list(dict.fromkeys(t.dtype for t in tensors))
    idx = [[i for i, t in enumerate(tensors) if t.dtype == dtype] for dtype in order]
    return idx, tuple((dtype, sum(tensors[i].numel() for i in group)) for dtype, group in zip(order, idx))


def flatten(tensors: list[torch.Tensor]) -> tuple[list[list[int]], list[torch.Tensor]]:
    """`layout`'s indices and one flat CPU buffer per dtype."""
    idx, _ = layout(tensors)
    return idx, [torch.cat([tensors[i].detach().reshape(-1).cpu() for i in group]) for group in idx]


def unflatten(tensors: list[torch.Tensor], idx: list[list[int]], flats: list[torch.Tensor]) -> list[torch.Tensor]:
    out: list[torch.Tensor | None] = [None] * len(tensors)
    for group, flat in zip(idx, flats):
        for i, piece in zip(group, flat.split([tensors[i].numel() for i in group])):
            out[i] = piece.view_as(tensors[i]).to(tensors[i].device)
    return out  # type: ignore[return-value]


def wait_all(works: list) -> None:
    for work in works:
        work.wait()
