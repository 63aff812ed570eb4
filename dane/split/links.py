"""The messages of split training, counted per link kind, in one process (simulated) or between processes.

Kinds: ``activations`` (agent → server: h; U-shaped also server → agent: z),
``labels`` (agent → server, unless U-shaped), ``cut_gradients`` (server → agent:
∂ℓ/∂h; U-shaped also agent → server: ∂ℓ/∂z), ``handover`` (sequential: agent → next
agent, the bottom's weights and optimizer state) and ``averaging`` (SplitFed: each
bottom to the server and the weighted mean back).  The sender counts each message's
payload bytes and one message; ``seconds`` is, simulated, the α-β time of each message
(α + bytes/β, `dane.comm.AlphaBeta`'s link) and, between processes, the wall time the
sender spent in its blocking send.

`SimLink` is a mailbox shared by every party of a one-process run; `DistLink` is one
process's end of ``torch.distributed`` point-to-point sends (gloo), each kind on its own tag.
"""
from __future__ import annotations

import time
from collections import defaultdict, deque

import torch

KINDS = ("activations", "labels", "cut_gradients", "handover", "averaging")
#: time-split names of the kinds (labels ride with the activations)
TIME_OF = {"activations": "activations_s", "labels": "activations_s", "cut_gradients": "gradients_s",
           "handover": "handover_s", "averaging": "handover_s"}
TAGS = {kind: 31 + i for i, kind in enumerate(KINDS)}
TAG_CONTROL = 40  # uncounted: rank 0's commands, the epoch-end sync to rank 0, a resumed server's state


class Counters:
    """Bytes, messages and seconds per kind, and the compute seconds of the agents and of the server."""

    FIELDS = [f"{k}_{what}" for k in KINDS for what in ("bytes", "messages", "seconds")] + \
        ["agent_compute_s", "server_compute_s", "loss_sum", "rows"]

    def __init__(self):
        self.values = dict.fromkeys(self.FIELDS, 0.0)

    def count(self, kind: str, tensor: torch.Tensor, seconds: float) -> None:
        self.values[f"{kind}_bytes"] += tensor.numel() * tensor.element_size()
        self.values[f"{kind}_messages"] += 1
        self.values[f"{kind}_seconds"] += seconds

    def add(self, key: str, value: float) -> None:
        self.values[key] += value

    def vector(self) -> torch.Tensor:
        return torch.tensor([self.values[f] for f in self.FIELDS], dtype=torch.float64)

    def take(self) -> dict[str, float]:
        """The counts so far; the counters start again at zero."""
        out, self.values = self.values, dict.fromkeys(self.FIELDS, 0.0)
        return out


class SimLink:
    """Every party in one process: a send is queued, charged α + bytes/β, and popped by the matching recv."""

    def __init__(self, cost):
        self.cost = cost
        self.counters = Counters()
        self._queues: dict[tuple[int, str], deque] = defaultdict(deque)

    def local(self, rank: int) -> bool:
        return True

    def message_time(self, nbytes: int) -> float:
        return self.cost.alpha + nbytes / self.cost.beta

    def send(self, kind: str, tensor: torch.Tensor, dst: int) -> float:
        seconds = self.message_time(tensor.numel() * tensor.element_size())
        self.counters.count(kind, tensor, seconds)
        self._queues[(dst, kind)].append(tensor.detach().clone())
        return seconds

    def recv(self, kind: str, shape, dtype, src: int, dst: int) -> torch.Tensor:
        return self._queues[(dst, kind)].popleft()


class DistLink:
    """This process's end: rank ``rank`` of m agents (0 .. m-1) and the server (rank m)."""

    def __init__(self, rank: int, dist=None):
        if dist is None:
            import torch.distributed as dist

        self.dist, self.rank = dist, rank  # ``dist``: torch.distributed, or a stand-in with its send/recv (tests)
        self.counters = Counters()

    def local(self, rank: int) -> bool:
        return rank == self.rank

    def send(self, kind: str, tensor: torch.Tensor, dst: int) -> float:
        start = time.perf_counter()
        self.dist.send(tensor.detach().contiguous(), dst=dst, tag=TAGS[kind])
        seconds = time.perf_counter() - start
        self.counters.count(kind, tensor, seconds)
        return seconds

    def recv(self, kind: str, shape, dtype, src: int, dst: int) -> torch.Tensor:
        buf = torch.empty(shape, dtype=dtype)
        self.dist.recv(buf, src=src, tag=TAGS[kind])
        return buf

    def send_control(self, tensor: torch.Tensor, dst: int) -> None:
        self.dist.send(tensor.contiguous(), dst=dst, tag=TAG_CONTROL)

    def recv_control(self, shape, dtype, src: int) -> torch.Tensor:
        buf = torch.empty(shape, dtype=dtype)
        self.dist.recv(buf, src=src, tag=TAG_CONTROL)
        return buf
