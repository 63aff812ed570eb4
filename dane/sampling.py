r"""Client sampling (partial participation) for the federated methods, the same on every backend.

Round t draws a set S_t of s of the m clients (``algorithm.clients_per_round=s``; null: all m, no draw):

- ``sampling=uniform``: s distinct clients, every s-subset equally likely (``torch.randperm``);
- ``sampling=size``: s distinct clients drawn one after another with probability proportional
  to the shard sizes n_i among those not yet drawn (``torch.multinomial`` without replacement).

*Sampling by size, and the methods that refuse it.*  A client's objective O_i already carries its shard's weight
m·n_i/N (`dane.problems`), so that O = (1/m) Σ_i O_i is the loss over all N rows.  A round that averages its
participants' messages x_i over S_t (a plain mean, `sampled_mean`) has, at s = 1 drawn with P(i) = n_i/N,

.. math:: \mathbb E\,x_{i_t} = \sum_i \frac{n_i}{N}\,x_i \quad\text{where the full round takes}\quad
    \frac1m\sum_i x_i ,

and for gradients E ∇O_{i_t} = Σ_i (n_i/N)(m n_i/N) ∇F_i (F_i the shard's mean loss), which weights the clients
by n_i², not ∇O = Σ_i (n_i/N) ∇F_i; for s > 1 the inclusion probabilities still grow with n_i.  Size sampling with
a plain mean is the weighting of papers whose local objective is F_i unweighted; here it counts a client's size
twice.  So a method declares whether a draw by size keeps its full-participation target
(`SamplingKeys.size_sampling`), and one that does not refuses ``sampling=size`` where a round draws (s < m; at s = m
there is no draw) in one line, when the run's spec is checked (`SamplingKeys.check_draw`).  Every method whose round
averages over S_t refuses it: FedAvg and FedProx, SCAFFOLD, FedDANE, S-DANE and Acc-S-DANE, FedRed (SCAFFOLD's and
FedRed type 2's control variates keep the optimum a fixed point under any draw, but their rounds' expected steps are
weighted so all the same).  The one that keeps it is FedNL-PP, whose server step reads every client's stored state
through means over all m clients, the draw deciding only which clients refresh theirs (`baselines.fednl`).
PP-MARINA refuses it for its own reason (its paper draws uniformly, `baselines.marina`).

Every worker holds the same `ClientSampler` (one `torch.Generator` seeded from the run's seed,
not the rank) and draws the same sets in the same order, so horovodrun, torchrun and the
simulator agree without a broadcast; its generator is in the algorithm's state_dict, so a
resumed run draws the sets it would have drawn.  The shard sizes of ``size`` come from one
gather when the sampler is built (`Communicator.gather`: an allreduce of an m-vector, one communication round,
counted before round 0's).

*How the non-sampled take part.*  Under a launcher every rank still enters each collective (a
collective needs all ranks of its group); a client outside S_t contributes zeros, and
`sampled_mean` rescales the allreduced mean by m/s into the mean over S_t,

.. math:: \frac1s\sum_{i\in S_t} x_i = \frac ms\cdot\frac1m\sum_{i=1}^m [i\in S_t]\,x_i .

With s = m the factor is 1.0 and the mean is the unsampled one, bit for bit.  The logged
metrics of the round's starting iterate still ride in that allreduce from every client (they
are the run's measurement, not part of the method).  So the communicator's ``bytes_sent`` and
``comm_rounds`` count the collectives as run, all m ranks; the method's own traffic in the
client-server model, participants only, is `Traffic`: records carry ``uplink_bytes`` (what the
sampled clients sent to the server, summed over them) and ``downlink_bytes`` (what the server
sent to them), cumulative to the record's iterate as every counter is (`Algorithm.spent`), and
``clients`` (|S_t|, those of the round that moves on from it).  The simulator's clock charges a sampled
collective to the participants only (`Communicator.next_participants`): the slowest client of
S_t sets the compute before it (a client outside S_t does none of the method's work, only the
metrics) and the modelled allreduce is a ring over the |S_t| participants (no cost at |S_t| = 1).
In the thread simulator the clients outside S_t of a method that declares its client state do not run the
round at all (`dane.comm.roster`): the allreduce fills in their zeros and metrics, the same numbers.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from . import checks, work
from .comm import Communicator
from .comm.batched import per_worker, stacked
from .errors import ConfigError, plural
from .seeds import STREAMS, shared_seed

SAMPLINGS = ("uniform", "size")
#: why a method whose round averages over S_t refuses ``sampling=size`` (module docstring)
SIZE_COUNTED_TWICE = ("algorithm.sampling=size draws clients by shard size, and each client's objective already "
                      "carries its size (m·n_i/N), so the mean over the sampled clients would weight clients by n_i²")
SAMPLER_STREAM = STREAMS["client_sampler"].number  # the shared client sampler (`sampler_seed`)


def sampler_seed(seed: int) -> int:
    """The shared sampler's 63-bit seed: from the run's seed alone, so that every rank draws the same sets."""
    return shared_seed(seed, SAMPLER_STREAM)


@dataclass(frozen=True)
class SamplingKeys:
    """The ``algorithm.*`` keys of client sampling, shared by the federated methods."""

    clients_per_round: int | None = None  # s; None: every client every round
    sampling: str = "uniform"             # uniform | size (probability proportional to the shard size)
    #: whether a draw by size keeps the method's full-participation target (module docstring): False where a round
    #: averages its participants' messages over S_t; True where the update reads every client's stored state and the
    #: draw decides only which clients refresh theirs (FedNL-PP)
    size_sampling: ClassVar[bool] = False

    def check_sampling(self) -> None:
        if self.clients_per_round is not None:
            checks.positive_int("algorithm.clients_per_round", self.clients_per_round)
        checks.one_of("algorithm.sampling", self.sampling, SAMPLINGS)

    def check_draw(self, clients: int) -> None:
        """``sampling=size`` against the run's ``clients`` (m): one line where a round draws (s < m) and the method's
        round averages over S_t (`size_sampling` false); at s = m nothing is drawn, and size is accepted."""
        s = self.clients_per_round
        if self.sampling == "size" and not self.size_sampling and s is not None and s < clients:
            raise ConfigError(f"algorithm={getattr(self, 'name', 'this method')} with algorithm.clients_per_round={s} "
                              f"of {clients} clients: {SIZE_COUNTED_TWICE}; set algorithm.sampling=uniform")

    def refuse_sampling(self, algorithm: str, why: str) -> None:
        """One line for a method whose update is undefined under partial participation."""
        if self.clients_per_round is not None:
            raise ConfigError(f"algorithm={algorithm} does not take algorithm.clients_per_round="
                              f"{self.clients_per_round}: {why}; set algorithm.clients_per_round=null")


class ClientSampler:
    """Draws S_t ⊆ {0..m-1}, |S_t| = s, from a generator every worker shares (module docstring)."""

    def __init__(self, comm: Communicator, clients_per_round: int | None, *, sampling: str = "uniform",
                 seed: int = 0, n_local: int | None = None):
        m = comm.size
        self.m, self.rank = m, comm.rank
        self.s = m if clients_per_round is None else int(clients_per_round)
        if self.s > m:
            raise ConfigError(f"algorithm.clients_per_round={clients_per_round} exceeds the {plural(m, 'client')}; "
                              f"use at most {m} (or null for all)")
        self.sampling = sampling
        self.generator = torch.Generator().manual_seed(sampler_seed(seed))
        self.weights = None
        if sampling == "size" and self.s < m:
            if n_local is None:
                raise ConfigError("algorithm.sampling=size needs the shard sizes, which this problem does not "
                                  "give; use algorithm.sampling=uniform")
            sizes = per_worker(comm, lambda rank: torch.tensor([float(n_local[rank] if np.ndim(n_local) else n_local)],
                                                               dtype=torch.float64))
            every, _ = comm.gather(sizes)  # every n_i
            self.weights = every[:, 0].round()

    @property
    def full(self) -> bool:
        return self.s == self.m

    def draw(self) -> torch.Tensor:
        """The next round's clients, sorted; all m (and no draw) without sampling."""
        if self.full:
            return torch.arange(self.m)
        if self.weights is not None:
            chosen = torch.multinomial(self.weights, self.s, replacement=False, generator=self.generator)
        else:
            chosen = torch.randperm(self.m, generator=self.generator)[: self.s]
        work.take_part(chosen)  # the clients left out only measure the record's metrics (`dane.work`)
        return chosen.sort().values

    def draw_with_replacement(self) -> tuple[torch.Tensor, torch.Tensor]:
        """s i.i.d. uniform draws of a client, with replacement (PP-MARINA's I'_k, `baselines.marina`): (the distinct
        clients drawn, sorted; each client's multiplicity, an m-vector of integers summing to s).  It draws at s = m
        too (the multiset of m draws is not every client); ``sampling=uniform`` only."""
        picks = torch.randint(self.m, (self.s,), generator=self.generator)
        counts = torch.bincount(picks, minlength=self.m)
        members = torch.nonzero(counts).reshape(-1)
        work.take_part(members)
        return members, counts

    def draw_all(self) -> torch.Tensor:
        """Every client (no draw): a collective outside the sampled rounds."""
        return torch.arange(self.m)

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])


def sampled_mean(comm: Communicator, members: torch.Tensor, sampled: list[torch.Tensor],
                 rides: list[torch.Tensor] = (), absent=None,
                 ride_kinds: tuple[str | None, ...] = ()) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(mean over ``members`` of each of ``sampled``, mean over all workers of each of ``rides``), in one
    grouped allreduce; a worker outside ``members`` sends zeros in place of its ``sampled``.  ``ride_kinds``: the
    kinds of the first rides (`Communicator.allreduce_mean`; the round's logged metrics are
    `dane.comm.compression.METRICS`), the others none.  On a batched
    communicator (`dane.comm.batched`) ``sampled`` holds the members' rows alone, (|S|, ...) in their order, and the
    others' rows are those zeros.  ``absent(problem)``: a worker's whole message from its shard, for a simulator whose
    non-participants sleep (`dane.comm.roster`)."""
    padded = stacked(comm) and len(members) < comm.size
    if padded:
        payload = [zero_stack(comm, i, t).index_copy_(0, members.to(t.device), t) for i, t in enumerate(sampled)]
    elif stacked(comm):
        payload = list(sampled)
    else:
        inside = bool((members == comm.rank).any())
        payload = [t if inside else torch.zeros_like(t) for t in sampled]
    payload += list(rides)
    try:
        if len(members) < comm.size:  # the simulator charges the participants only
            comm.next_participants(members.tolist(), **({} if absent is None else {"absent": absent}))
        reduced = comm.allreduce_mean(payload, kinds=(*(None for _ in sampled), *ride_kinds))
    finally:
        for t in payload[: len(sampled)] if padded else ():
            t.index_fill_(0, members.to(t.device), 0.0)  # zeros again for the next round
    scale = comm.size / len(members)
    means = [t if scale == 1.0 else t * scale for t in reduced[: len(sampled)]]
    return means, reduced[len(sampled):]


#: batched communicator -> {(slot, row shape, dtype, device): an (m, ...) stack of zeros}
ZERO_STACKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def zero_stack(comm: Communicator, slot: int, rows: torch.Tensor) -> torch.Tensor:
    """An (m, ...) stack of zeros for the ``slot``-th sampled tensor (rows like ``rows``), kept per communicator:
    `sampled_mean` fills the participants' rows and clears them after the allreduce, so that a round maps no new
    m-row array (40 MB at 100,000 clients and d = 50, which glibc maps and unmaps each time); the sum it takes is
    that of the same zeros and rows."""
    stacks = ZERO_STACKS.setdefault(comm, {})
    key = (slot, tuple(rows.shape[1:]), rows.dtype, rows.device)
    if key not in stacks:
        stacks[key] = rows.new_zeros((comm.size, *rows.shape[1:]))
    return stacks[key]


def nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class Traffic:
    """The method's own client-server traffic, participants only: cumulative uplink and downlink bytes."""

    def __init__(self) -> None:
        self.uplink = 0
        self.downlink = 0

    def add(self, clients: int, *, up: list[torch.Tensor] = (), down: list[torch.Tensor] = ()) -> None:
        """``clients`` participants each sent ``up`` to the server and received ``down`` from it."""
        self.uplink += clients * nbytes(list(up))
        self.downlink += clients * nbytes(list(down))

    def record(self, clients: int) -> dict[str, int]:
        """A round's record of ``clients`` participants; its bytes are replaced by `spent`'s, taken before the
        round (`dane.algorithm.Algorithm.spent`)."""
        return {"clients": clients, **self.spent()}

    def spent(self) -> dict[str, int]:
        """The bytes so far, as records count them: to reach the record's iterate."""
        return {"uplink_bytes": self.uplink, "downlink_bytes": self.downlink}

    def state_dict(self) -> dict:
        return {"uplink": self.uplink, "downlink": self.downlink}

    def load_state_dict(self, state: dict) -> None:
        self.uplink, self.downlink = int(state["uplink"]), int(state["downlink"])
