"""Split training's parties built from a `RunSpec`, the round object `dane.loop.runner.run` drives, and the followers' loop.

Rank 0 (agent 0; the whole run in the simulator) runs `SplitRun` under the package's
round loop: a round is one epoch, and record t describes the model after t epochs
(train loss and accuracy on every training row, test loss and accuracy; evaluated by
rank 0, which holds agent 0's bottom and a mirror of the server's top, uncounted) and
the epoch that produced it (bytes and messages per link kind, the time split, the mean
minibatch loss ``epoch_loss``).  Under torchrun the other agents and the server follow
rank 0's commands (`follow`): an epoch, a checkpoint part, stop.  After each epoch
every process sends rank 0 its counters, and the server its top with its optimizer
state (uncounted: what the source system's server evaluates and checkpoints).
"""
from __future__ import annotations

import copy
import time

import torch
import torch.nn.functional as F
from torch import nn

from ..algorithm import Rounds
from ..errors import ConfigError
from ..seeds import STREAMS, worker_seed
from ..models import build_model
from .cut import cut_choices, cut_model
from .links import KINDS, TIME_OF, Counters
from .parties import Agent, Server
from .protocol import EpochProtocol

SAMPLER_STREAM = STREAMS["split_batch_order"].number  # an agent's batch order
STOP, EPOCH, CHECKPOINT, STATE = 0, 1, 2, 3


def network_model(problem_config, data) -> nn.Module:
    """The problem's network, initialized as `dane.problems.neural.NeuralProblemConfig.build` does (seeded)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(problem_config.seed)
        return build_model(problem_config.model.name, in_shape=data.in_shape, num_classes=data.num_classes,
                           hidden=problem_config.model.hidden)


def check_problem(problem_config) -> None:
    if not all(hasattr(problem_config, key) for key in ("dataset", "model", "data")):
        raise ConfigError(f"algorithm=split cuts a network: use a network problem (problem=digits_mlp, "
                          f"mnist_lenet5, ...), got problem={getattr(problem_config, 'name', '?')}")
    if problem_config.data.overlap:
        raise ConfigError("algorithm=split: the agents hold disjoint rows (a hand-over carries the model, not data); "
                          "set problem.data.overlap=false")
    if getattr(problem_config, "augment", False):
        raise ConfigError("algorithm=split does not augment its agents' minibatches; set problem.augment=false")
    if problem_config.l2:
        raise ConfigError(f"algorithm=split trains the plain cross-entropy; set problem.l2=0 (got {problem_config.l2})")
    # the parties' models, rows, messages, hand-overs and checkpoints are host tensors (gloo point-to-point between
    # processes); a CUDA run would need each of them moved, so it is refused rather than run on the CPU unasked
    if getattr(problem_config, "device", "cpu") == "cuda":
        raise ConfigError("algorithm=split runs its agents and server on the CPU; set problem.device=cpu (or auto, "
                          "which means the CPU for split learning)")


def build_parties(spec, local: set[int], link) -> tuple[EpochProtocol, dict]:
    """The protocol of the parties in ``local`` (ranks; the server is m) and what rank 0 evaluates with."""
    from ..data import shard_indices
    from ..problems.neural import DTYPES

    config, pc, m = spec.algorithm, spec.problem, spec.comm.workers
    check_problem(pc)
    data = pc.dataset()
    dtype = DTYPES[pc.dtype] if pc.dtype is not None else spec.control.dtype
    shards = shard_indices(data.train_y, m, seed=pc.seed, **pc.data.scheme_options())
    model = network_model(pc, data).to(dtype)
    parts = cut_model(model, config.cut, config.u_shaped)
    with torch.no_grad():
        h = parts.bottom(data.train_x[:1].to(dtype))
        z = parts.top(h) if config.u_shaped else None
    agents = {a: Agent(a, copy.deepcopy(parts.bottom), copy.deepcopy(parts.head) if parts.head is not None else None,
                       rows(data.train_x, shards[a]).to(dtype), data.train_y[shards[a]], config.solver("agent"),
                       config.batch_size, worker_seed(config.seed, a, SAMPLER_STREAM))
              for a in sorted(local) if a < m}
    server = Server(copy.deepcopy(parts.top), config.solver("server")) if m in local else None
    proto = EpochProtocol(sizes=[len(s) for s in shards], batch_size=config.batch_size, schedule=config.schedule,
                          u_shaped=config.u_shaped, agents=agents, server=server, link=link, h_shape=h.shape[1:],
                          z_shape=None if z is None else z.shape[1:], dtype=dtype)
    proto.server_solver = config.solver("server")
    proto.agent_numel = sum(p.numel() for p in parts.bottom.parameters()) + \
        (sum(p.numel() for p in parts.head.parameters()) if parts.head is not None else 0)
    share = dict(cut_choices(model, config.u_shaped))[[n for n, _ in cut_choices(model, config.u_shaped)][0]
                                                      if config.cut is None else config.cut]
    info = {"data": data, "dtype": dtype, "parts": parts, "cut_share": share, "cut_width": int(h[0].numel()),
            "cut": config.cut or cut_choices(model, config.u_shaped)[0][0]}
    return proto, info


def rows(x, shard):
    """Agent rows ``shard`` of ``x``: a tensor's rows, or of a store (``data@problem.data=mongo``: `StoreRows`) the
    rows left in the store, so that the agent reads each minibatch by id from its list when it runs it."""
    return x.subset(shard) if hasattr(x, "subset") else x[shard]


class SplitClock:
    """What `dane.loop.runner` reads of a communicator: cumulative bytes and messages, and the clock
    (simulated: the latest party's clock, restored through ``group.clock`` on resume)."""

    rank = 0

    def __init__(self, size: int, simulated: bool):
        self.size, self.simulated = size, simulated
        self.bytes_sent = self.calls = 0
        self.clock = 0.0
        self._t0 = time.perf_counter()
        if simulated:
            self.group = self

    def elapsed(self) -> float:
        return self.clock if self.simulated else time.perf_counter() - self._t0

    def reset_clock(self) -> None:
        self._t0 = time.perf_counter()

    def restore_clock(self, elapsed: float) -> None:
        """Go on from ``elapsed`` seconds (a resumed launched run's clock)."""
        self._t0 = time.perf_counter() - elapsed


def epoch_fields(stats: dict) -> dict:
    """One epoch's counters as record fields: bytes and messages per link kind, the time split, the epoch loss."""
    out = {f"{k}_{what}": int(stats[f"{k}_{what}"]) for k in KINDS for what in ("bytes", "messages")}
    out.update(agent_compute_s=stats["agent_compute_s"], server_compute_s=stats["server_compute_s"])
    for name in dict.fromkeys(TIME_OF.values()):
        out[name] = sum(stats[f"{k}_seconds"] for k, t in TIME_OF.items() if t == name)
    if stats["rows"]:
        out["epoch_loss"] = stats["loss_sum"] / stats["rows"]
    return out


class SplitRun(Rounds):
    """Rank 0's round object: evaluate the model, run one epoch (commanding the followers), collect its counters."""

    name = "split"

    def __init__(self, proto: EpochProtocol, info: dict, clock: SplitClock, link, launched: bool):
        self.proto, self.info, self.comm, self.link, self.launched = proto, info, clock, link, launched
        self.agent0 = proto.agents[0]
        self.top = proto.server if proto.server is not None else \
            Server(copy.deepcopy(info["parts"].top), proto.server_solver)  # rank 0's mirror of the server's top
        self.last = epoch_fields(Counters().values)
        self.epoch = 0  # epochs done: the round of the next record
        self.bytes_by_link = dict.fromkeys(KINDS, 0)  # the whole run's, across a resume
        self.on_epoch = None  # called with (rank, epoch) before each epoch (`dane.loop.faults.inject_faults`)

    # -- the model rank 0 evaluates ---------------------------------------------------------------
    def model(self) -> nn.Module:
        head = [self.agent0.head] if self.agent0.head is not None else []
        return nn.Sequential(self.agent0.bottom, self.top.top, *head)

    @property
    def iterate(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.model().parameters()])

    def evaluate(self) -> dict:
        data, dtype, model = self.info["data"], self.info["dtype"], self.model()
        out = {}
        with torch.no_grad():
            for split, x, y in (("train", data.train_x, data.train_y), ("test", data.test_x, data.test_y)):
                loss = correct = 0.0
                for start in range(0, len(y), 1000):
                    logits = model(x[start:start + 1000].to(dtype))
                    loss += float(F.cross_entropy(logits, y[start:start + 1000], reduction="sum"))
                    correct += float((logits.argmax(1) == y[start:start + 1000]).sum())
                out[f"{split}_loss"], out[f"{split}_accuracy"] = loss / len(y), correct / len(y)
        return {"objective": out.pop("train_loss"), **out, **self.last}

    def confusion(self):
        data, k = self.info["data"], self.info["data"].num_classes
        with torch.no_grad():
            pred = torch.cat([self.model()(data.test_x[s:s + 1000].to(self.info["dtype"])).argmax(1)
                              for s in range(0, len(data.test_y), 1000)])
        return torch.bincount(data.test_y * k + pred, minlength=k * k).view(k, k).numpy()

    # -- one round ---------------------------------------------------------------------------------
    def step(self) -> dict:
        metrics = self.evaluate()
        self.command(EPOCH, self.epoch)
        if self.on_epoch is not None:
            self.on_epoch(0, self.epoch)
        self.proto.run_epoch()
        self.collect()
        self.epoch += 1
        return metrics

    def command(self, op: int, round_: int = 0, ranks=None) -> None:
        """Send ``op`` to ``ranks`` (default: every other process), under torchrun."""
        if self.launched:
            for rank in range(1, self.proto.m + 1) if ranks is None else ranks:
                self.link.send_control(torch.tensor([op, round_]), rank)

    def collect(self) -> None:
        stats = self.proto.counters.take()
        if self.launched:
            total = torch.tensor([stats[f] for f in Counters.FIELDS], dtype=torch.float64)
            for rank in range(1, self.proto.m + 1):
                total += self.link.recv_control((len(Counters.FIELDS),), torch.float64, rank)
            stats = dict(zip(Counters.FIELDS, total.tolist()))
            self.top.unpack(self.link.recv_control((self.top.numel(),), self.proto.dtype, self.proto.m))
        self.last = epoch_fields(stats)
        for k in KINDS:
            self.bytes_by_link[k] += self.last[f"{k}_bytes"]
        self.comm.bytes_sent += sum(self.last[f"{k}_bytes"] for k in KINDS)
        self.comm.calls += sum(self.last[f"{k}_messages"] for k in KINDS)
        self.comm.clock = self.proto.elapsed()

    # -- checkpoints -----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"agents": {str(a): agent_state(agent) for a, agent in self.proto.agents.items()},
                "server": self.top.pack(), "last": self.last, "clock": list(self.proto.clock), "epoch": self.epoch,
                "bytes_by_link": dict(self.bytes_by_link)}

    def load_state_dict(self, state: dict) -> None:
        load_agents(self.proto, state)
        self.top.unpack(state["server"])
        self.last, self.proto.clock, self.epoch = dict(state["last"]), list(state["clock"]), int(state["epoch"])
        self.bytes_by_link = dict(state["bytes_by_link"])
        if self.launched:  # the server continues from the state rank 0 kept
            self.command(STATE, ranks=[self.proto.m])
            self.link.send_control(state["server"], self.proto.m)


def agent_state(agent: Agent) -> dict:
    return {"weights": agent.pack(), "generator": agent.generator.get_state()}


def load_agents(proto: EpochProtocol, state: dict) -> None:
    for key, saved in state["agents"].items():
        agent = proto.agents.get(int(key))
        if agent is not None:
            agent.unpack(saved["weights"])
            agent.generator.set_state(saved["generator"])


def follow(proto: EpochProtocol, link, on_checkpoint, on_epoch=None) -> None:
    """A follower (an agent other than 0, or the server) under torchrun: rank 0's commands until STOP;
    ``on_epoch(rank, epoch)`` before each epoch (`dane.loop.faults.inject_faults`)."""
    rank = link.rank
    while True:
        op, round_ = link.recv_control((2,), torch.int64, 0).tolist()
        if op == STOP:
            return
        if op == EPOCH:
            if on_epoch is not None:
                on_epoch(rank, round_)
            proto.run_epoch()
            link.send_control(proto.counters.vector(), 0)
            proto.counters.take()
            if proto.server is not None:
                link.send_control(proto.server.pack(), 0)
        elif op == CHECKPOINT and rank in proto.agents:  # the server's state is in rank 0's part already
            on_checkpoint(round_, {str(rank): agent_state(proto.agents[rank])})
        elif op == STATE:
            proto.server.unpack(link.recv_control((proto.server.numel(),), proto.dtype, 0))
