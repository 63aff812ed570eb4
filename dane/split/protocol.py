"""One epoch of split training, written once for every party: each process runs the parts that are its own.

Ranks: agents 0 .. m-1, the server m.  In the simulator every party is in this process
(a `SimLink`); under torchrun each process holds one party (a `DistLink`) and the same
loop skips the parts of the others, so a real run makes the simulator's messages in
the simulator's order.

- ``sequential``: agent 0's minibatches, then agent 1's, ...; after its turn agent a
  hands its bottom (U-shaped: and head) with the optimizer state to agent a+1 mod m
  (m hand-overs an epoch for m > 1, the last one back to agent 0, which ends every
  epoch holding the model);
- ``splitfed``: step k serves batch k of every agent that has one, agents in order;
  at the end of the epoch every bottom goes to the server, which sends back
  Σ_a (n_a/N) bottom_a (summed in agent order) to all.

The simulated clock follows each party: an agent's compute, its messages (α + bytes/β),
the server's compute when the message arrives and the server is free; a hand-over
makes the next agent wait for it.  In a sequential run that is the sum of everything;
in SplitFed the agents overlap and the server is the queue.
"""
from __future__ import annotations

import math
import time

import torch

from .links import Counters


class EpochProtocol:
    """The parties of this process and the plan every party shares."""

    def __init__(self, *, sizes: list[int], batch_size: int, schedule: str, u_shaped: bool, agents: dict,
                 server, link, h_shape: tuple, z_shape: tuple | None, dtype: torch.dtype):
        self.m, self.sizes, self.batch_size = len(sizes), sizes, batch_size
        self.schedule, self.u_shaped = schedule, u_shaped
        self.agents, self.server, self.link = agents, server, link
        self.h_shape, self.z_shape, self.dtype = tuple(h_shape), z_shape and tuple(z_shape), dtype
        self.SERVER = self.m
        self.clock = [0.0] * (self.m + 1)  # simulated: each agent's clock, then the server's

    @property
    def counters(self) -> Counters:
        return self.link.counters

    def batches(self, a: int) -> int:
        return math.ceil(self.sizes[a] / self.batch_size)

    def rows(self, a: int, k: int) -> int:
        return min(self.batch_size, self.sizes[a] - k * self.batch_size)

    def run_epoch(self) -> None:
        for agent in self.agents.values():
            agent.start_epoch()
        if self.schedule == "sequential":
            for a in range(self.m):
                for k in range(self.batches(a)):
                    self.step(a, k)
                if self.m > 1:
                    self.hand_over(a, (a + 1) % self.m)
        else:
            for k in range(max(self.batches(a) for a in range(self.m))):
                for a in range(self.m):
                    if k < self.batches(a):
                        self.step(a, k)
            self.average()

    # -- one minibatch ---------------------------------------------------------------------------
    def _timed(self, who: str, fn, *args):
        t0 = time.thread_time()
        out = fn(*args)
        seconds = time.thread_time() - t0
        self.counters.add(f"{who}_compute_s", seconds)
        return out, seconds

    def _server_reply(self, t: float, dt: float, kind: str, out: torch.Tensor, a: int) -> float:
        """The server computes for dt once it is free and the message (sent at t) is in; its reply to agent a
        arrives at the returned time."""
        self.clock[self.SERVER] = max(self.clock[self.SERVER], t) + dt
        return self.clock[self.SERVER] + self.link.send(kind, out, a)

    def step(self, a: int, k: int) -> None:
        if self.u_shaped:
            return self._step_u(a, k)
        agent, S, b = self.agents.get(a), self.SERVER, self.rows(a, k)
        t = self.clock[a]
        if agent is not None:  # agent: h = bottom(x_B) -> server, with y_B
            h, dt = self._timed("agent", agent.forward, k)
            t += dt + self.link.send("activations", h, S) + self.link.send("labels", agent.labels(k), S)
        if self.server is not None:  # server: loss of top(h), step, dloss/dh -> agent
            h = self.link.recv("activations", (b, *self.h_shape), self.dtype, a, S)
            y = self.link.recv("labels", (b,), torch.int64, a, S)
            (loss, grad_h), dt = self._timed("server", self.server.step, h, y)
            self.counters.add("loss_sum", float(loss) * b)
            self.counters.add("rows", b)
            t = self._server_reply(t, dt, "cut_gradients", grad_h, a)
        if agent is not None:  # agent: backprop the bottom from dloss/dh, step
            grad_h = self.link.recv("cut_gradients", (b, *self.h_shape), self.dtype, S, a)
            _, dt = self._timed("agent", agent.backward, grad_h)
            self.clock[a] = t + dt

    def _step_u(self, a: int, k: int) -> None:
        """U-shaped: h up, z = middle(h) down, the loss at the agent, dloss/dz up, dloss/dh down."""
        agent, S, b = self.agents.get(a), self.SERVER, self.rows(a, k)
        t = self.clock[a]
        if agent is not None:
            h, dt = self._timed("agent", agent.forward, k)
            t += dt + self.link.send("activations", h, S)
        if self.server is not None:
            h = self.link.recv("activations", (b, *self.h_shape), self.dtype, a, S)
            z, dt = self._timed("server", self.server.forward, h)
            t = self._server_reply(t, dt, "activations", z, a)
        if agent is not None:
            z = self.link.recv("activations", (b, *self.z_shape), self.dtype, S, a)
            (loss, grad_z), dt = self._timed("agent", agent.head_loss, k, z)
            self.counters.add("loss_sum", float(loss) * b)
            self.counters.add("rows", b)
            t += dt + self.link.send("cut_gradients", grad_z, S)
        if self.server is not None:
            grad_z = self.link.recv("cut_gradients", (b, *self.z_shape), self.dtype, a, S)
            grad_h, dt = self._timed("server", self.server.backward, grad_z)
            t = self._server_reply(t, dt, "cut_gradients", grad_h, a)
        if agent is not None:
            grad_h = self.link.recv("cut_gradients", (b, *self.h_shape), self.dtype, S, a)
            _, dt = self._timed("agent", agent.backward, grad_h)
            self.clock[a] = t + dt

    # -- between turns and at the end of an epoch -------------------------------------------------
    def hand_over(self, a: int, b: int) -> None:
        """Sequential: agent a's weights and optimizer state to agent b (peer to peer)."""
        t = self.clock[a]
        if a in self.agents:
            t += self.link.send("handover", self.agents[a].pack(), b)
        if b in self.agents:
            agent = self.agents[b]
            agent.unpack(self.link.recv("handover", (agent.numel(),), self.dtype, a, b))
            self.clock[b] = max(self.clock[b], t)

    def average(self) -> None:
        """SplitFed: every agent's weights to the server, Σ_a (n_a/N) w_a back to every agent."""
        S, total = self.SERVER, sum(self.sizes)
        arrive = [0.0] * self.m
        for a, agent in self.agents.items():
            arrive[a] = self.clock[a] + self.link.send("averaging", agent.pack(with_state=False), S)
        numel = self._agent_numel()
        if self.server is not None:
            t0 = time.thread_time()
            mean = torch.zeros(numel, dtype=self.dtype)
            for a in range(self.m):
                mean += (self.sizes[a] / total) * self.link.recv("averaging", (numel,), self.dtype, a, S)
            dt = time.thread_time() - t0
            self.counters.add("server_compute_s", dt)
            self.clock[S] = max([self.clock[S], *arrive]) + dt
            back = [self.clock[S] + self.link.send("averaging", mean, a) for a in range(self.m)]
        for a, agent in self.agents.items():
            agent.unpack(self.link.recv("averaging", (numel,), self.dtype, S, a), with_state=False)
            if self.server is not None:
                self.clock[a] = back[a]

    def _agent_numel(self) -> int:
        """Elements of an agent's weights (every agent's are shaped alike)."""
        if self.agents:
            return next(iter(self.agents.values())).numel(with_state=False)
        return self.agent_numel  # the server of a launched run is told it (`dane.split.run`)

    def elapsed(self) -> float:
        """The simulated time of everything so far: the latest party's clock."""
        return max(self.clock)
