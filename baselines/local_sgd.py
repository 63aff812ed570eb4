r"""Local SGD / periodic model averaging: K local steps, then one aggregation.

.. math::
    w_i &\leftarrow w_i - \text{lr}\cdot \widehat{\nabla O_i}(w_i) \quad (K \text{ times, from } w_i = w_t) \\
    w_{t+1} &= \mathrm{aggregate}(w_1, \dots, w_m)

where :math:`\widehat{\nabla O_i}` is the full local gradient (``batch_size=None``) or a
minibatch estimate on ``batch_size`` rows, epoch-shuffled by a per-worker
`dane.numerics.inner.MinibatchSampler` (its generator seeded from ``seed`` and the rank).  The aggregations:

- ``mean``: :math:`\frac1m\sum_i w_i`, one allreduce;
- ``weighted`` (FedAvg's weighting, McMahan et al. 2017): each worker steps on its mean loss
  per row, :math:`O_i / s_i` with :math:`s_i = n_i / \bar n` the shard weight
  :math:`m n_i / N` that :math:`O_i` carries (so that the mean of the :math:`O_i` is the loss
  over all rows), i.e. at ``lr`` / :math:`s_i`, and the server averages
  :math:`\sum_i n_i w_i / \sum_i n_i = \frac1m\sum_i n_i w_i / \bar n`, one allreduce of
  :math:`n_i w_i`; :math:`\bar n` comes from one allreduce of :math:`n_i` before round 0
  (counted in round 0), the one that gives :math:`s_i`.  With K=1 and full batches a round is
  a gradient step on O, as ``mean``'s.  Stepping on :math:`O_i` itself and weighting by
  :math:`n_i` would count the shard weight twice (K=1 would step on
  :math:`\sum_i (n_i/N) s_i \nabla F_i`, whose fixed point is not O's optimum).  Departure
  from the paper: the shared regulariser R enters worker i's local objective as
  :math:`R / s_i` (the paper's clients carry R whole; the same where R = 0 or the shards are
  equal);
- ``best`` ("best election"): each worker scores its own w_i by its mean loss per row on its
  own shard plus the regularizer (the problem's ``validation_objective``: O_i(w_i) with the
  shard weight m n_i / N divided out, which O_i carries so that the mean of the O_i is the
  loss over all rows, and which would make the smallest shard win on unequal shards; on
  equal shards O_i(w_i) itself), by a forward pass where the problem has one, counted as one
  pass; an allreduce of the one-hot-scaled scores tells every worker the argmin, whose model
  is broadcast from that rank.  Two collectives per round; records carry ``elected``.

With K=1, full batches and ``mean`` this is distributed gradient descent, iterate by
iterate.  ``lr=None`` takes 1/max_i L_i, the largest local smoothness constant (``weighted``:
of the objective a worker steps on, max_i L_i / s_i), so that full-batch local steps cannot
diverge (local Lanczos estimates, no communication except one allreduce of an m-vector,
counted in round 0); minibatches may need a smaller lr.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from dane import checks
from dane.algorithm import Algorithm, AlgorithmConfig, Column
from dane.comm import Communicator
from dane.comm.batched import per_worker, stacked, worker_ranks
from dane.errors import ConfigError
from dane.numerics.inner import refuse_oversized, worker_samplers
from dane.problems import Problem, ProblemConfig
from dane.seeds import STREAMS

from .defaults import Resolution, local_step
from .metrics import global_metrics, local_payload, logs_gradient, payload_kinds
from .measure import largest_smoothness
from .spectral import one_hot

AGGREGATES = ("mean", "weighted", "best")
SAMPLER_STREAM = STREAMS["local_sgd_minibatch"].number  # this algorithm's minibatch generator


def local_steps(w: torch.Tensor, gradient: Callable[[torch.Tensor], torch.Tensor], *, lr: float,
                steps: int) -> torch.Tensor:
    """``steps`` iterations of w <- w - lr * gradient(w)."""
    for _ in range(steps):
        w = w - lr * gradient(w)
    return w


class LocalSGD(Algorithm):
    name = "local_sgd"
    label = "local SGD"
    asynchronous = True  # worker_update: K local steps; AveragingServer applies the change
    batchable = True  # its step reads the same on stacked tensors; the samplers and spectra are stacked by helpers
    stacked_needs = "gradients"  # gradients only: where the problem has no stacked form, its rows stacked
    columns = (Column("L_est", "{:>8.4g}"),)

    def __init__(self, problem: Problem, comm: Communicator, *, lr: float, local_steps: int = 10,
                 batch_size: int | None = None, aggregate: str = "mean", seed: int = 0, L_est: float | None = None,
                 sizes: tuple[torch.Tensor, torch.Tensor] | None = None, w0: torch.Tensor | None = None,
                 defaults: tuple[dict, ...] = ()):
        """``sizes``: (n_i, n̄) of `shard_sizes`, read by ``weighted`` only (None: measured here).  The problem is
        checked by `LocalSGDConfig.build` (`check_problem`), before any collective."""
        super().__init__(problem, comm, w0)
        if aggregate == "weighted" and sizes is None:
            sizes = shard_sizes(problem, comm)
        self.local_steps, self.batch_size, self.aggregate = local_steps, batch_size, aggregate
        self.local_lr, self.shard_size, self.mean_shard_size = lr, None, None  # the local step: lr on O_i
        if aggregate == "weighted":  # lr / s_i (on O_i / s_i, the mean loss per row), (m, 1) when stacked
            self.local_lr = lr / (sizes[0] / sizes[1]).to(self.w)
            # n_i and n̄ on the iterate's dtype and device (a stacked net: on the GPU), for the server's average
            self.shard_size, self.mean_shard_size = (t.to(self.w) for t in sizes)
        self.with_grad = logs_gradient(problem)
        self.sampler = (worker_samplers(problem.n_local, batch_size, seed, SAMPLER_STREAM, worker_ranks(comm),
                                        stacked=stacked(comm)) if batch_size is not None else None)
        self.lr, self.L_est, self.defaults = lr, L_est, tuple(defaults)  # L_est: the max_i L_i lr null was set from
        self.updates_per_round = 1  # per worker, when asynchronous (dane.loop.asynchronous)

    def gradient(self, w: torch.Tensor) -> torch.Tensor:
        if self.sampler is None:
            return self.problem.evaluate(w)[0]  # the exact local gradient, as distributed GD computes it
        return self.problem.batch_grad(w, self.sampler.next())

    def step(self) -> dict[str, float]:
        payload = local_payload(self.problem, self.w, with_grad=self.with_grad)  # w_t's metrics ride along
        w_local = local_steps(self.w, self.gradient, lr=self.local_lr, steps=self.local_steps)
        if self.aggregate == "mean":
            self.w, *reduced = self.comm.allreduce_mean([w_local, *payload], kinds=(None, *payload_kinds(payload)))
            extra = {}
        elif self.aggregate == "weighted":
            nw, *reduced = self.comm.allreduce_mean([self.shard_size * w_local, *payload],
                                                    kinds=(None, *payload_kinds(payload)))
            self.w = nw / self.mean_shard_size  # Σ n_i w_i / Σ n_i, n̄ from before round 0
            extra = {}
        else:
            own = dict(zip(worker_ranks(self.comm), self.score(w_local)))  # this worker's score (each one's, stacked)
            votes = per_worker(self.comm, lambda rank: one_hot(own[rank], rank, self.comm.size, self.w.dtype))
            scores, *reduced = self.comm.allreduce_mean([votes, *payload], kinds=(None, *payload_kinds(payload)))
            elected = int(torch.nan_to_num(scores, nan=torch.inf).argmin())
            (self.w,) = self.comm.broadcast([w_local], root=elected)
            extra = {"elected": elected}
        return {**global_metrics(self, reduced), **extra, **self.extra()}

    # Asynchronous and stale-synchronous local SGD (comm.staleness > 0, dane.loop.asynchronous): the worker's half;
    # the server's is AveragingServer (LocalSGDConfig.async_server).
    def worker_update(self, w: torch.Tensor) -> list[torch.Tensor]:
        """K local steps from the parameters the worker pulled; it pushes the change w_i - w."""
        return [local_steps(w, self.gradient, lr=self.local_lr, steps=self.local_steps) - w]

    def score(self, w: torch.Tensor) -> list[float]:
        """The election score of this worker's model (of each worker's, on a stacked problem): the problem's
        `dane.problems.Problem.validation_objective`, its mean loss per row plus the regularizer (O_i(w) with the
        shard weight divided out: comparable across shards of unequal size)."""
        return torch.as_tensor(self.problem.validation_objective(w)).reshape(-1).tolist()

    def evaluate(self) -> dict[str, float]:
        payload = local_payload(self.problem, self.w, with_grad=self.with_grad)
        reduced = self.comm.allreduce_mean(payload, kinds=payload_kinds(payload))
        return {**global_metrics(self, reduced), **self.extra()}

    def state_dict(self) -> dict:
        state = super().state_dict()
        return state | ({"sampler": self.sampler.state_dict()} if self.sampler is not None else {})

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if self.sampler is not None:
            self.sampler.load_state_dict(state["sampler"])

    def extra(self) -> dict[str, float]:
        return {"lr": self.lr} | ({"L_est": self.L_est} if self.L_est is not None else {})


@dataclass(frozen=True)
class LocalSGDConfig(AlgorithmConfig):
    local_steps: int = 10
    batch_size: int | None = None
    lr: float | None = None
    aggregate: str = "mean"
    power_iters: int = 20
    seed: int = 0
    name: str = "local_sgd"
    algorithm = LocalSGD

    def __post_init__(self) -> None:
        checks.positive_int("algorithm.local_steps", self.local_steps)
        if self.batch_size is not None:
            checks.positive_int("algorithm.batch_size", self.batch_size)
        if self.lr is not None:
            checks.positive("algorithm.lr", self.lr)
        checks.one_of("algorithm.aggregate", self.aggregate, AGGREGATES)
        checks.positive_int("algorithm.power_iters", self.power_iters)
        checks.seed("algorithm.seed", self.seed)

    def stacked_form(self, problem: ProblemConfig, size: int) -> str | None:
        """Minibatches and weighted averaging read the problem's own stacked form (its batched samplers and shard
        sizes); full-batch mean or best-election rounds also run on its rows stacked (sparse or unequal shards)."""
        own = problem.stacked_form(size)
        if own is not None and (self.batch_size is not None or self.aggregate == "weighted"):
            return f"{own} (algorithm.batch_size and algorithm.aggregate=weighted need that form)"
        return super().stacked_form(problem, size)

    def build(self, problem: Problem, comm: Communicator) -> "LocalSGD":
        """``lr`` null resolved first (`baselines.defaults.local_step`: 1/max_i L_i, one allreduce before round 0)."""
        resolution, lr, L_est = Resolution(), self.lr, None
        check_problem(problem, self.batch_size, self.aggregate)
        sizes = shard_sizes(problem, comm) if self.aggregate == "weighted" else None
        if lr is None:
            L_est = largest_smoothness(problem, comm, iters=self.power_iters, seed=self.seed,
                                       per=None if sizes is None else sizes[0] / sizes[1])
            lr = resolution.add("lr", local_step(L_est), "local_step", smoothness=L_est)
        return LocalSGD(problem, comm, local_steps=self.local_steps, batch_size=self.batch_size, lr=lr, L_est=L_est,
                        aggregate=self.aggregate, seed=self.seed, sizes=sizes, defaults=resolution.entries)

    def async_server(self, w0: torch.Tensor, sizes: list[float]) -> "AveragingServer":
        """The server of an asynchronous run (``comm.staleness > 0``), from w_0 and the workers' shard sizes."""
        return AveragingServer(w0, shares(sizes, self.aggregate))


def check_problem(problem: Problem, batch_size: int | None, aggregate: str) -> None:
    name = type(problem).__name__
    if batch_size is not None:
        if problem.batch_grad is None:
            raise ConfigError(f"algorithm.batch_size={batch_size} needs minibatch gradients, which {name} lacks; "
                              f"set algorithm.batch_size=null")
        refuse_oversized("algorithm.batch_size", batch_size, problem.n_local)
    if aggregate == "weighted" and problem.n_local is None:
        raise ConfigError(f"algorithm.aggregate=weighted needs shard sizes, which {name} lacks; use mean or best")


def shard_sizes(problem: Problem, comm: Communicator) -> tuple[torch.Tensor, torch.Tensor]:
    """(n_i, n̄ = mean_j n_j), float64, from one allreduce of n_i: this worker's shard size (each worker's, (m, 1),
    on a stacked problem) and their mean.  s_i = n_i / n̄ is the weight m n_i / N of worker i's shard in O_i."""
    n_i = per_worker(comm, lambda rank: torch.tensor([float(problem.n_local)], dtype=torch.float64))
    (mean,) = comm.allreduce_mean([n_i])
    return n_i, mean


def shares(sizes: list[float], aggregate: str) -> list[float]:
    """Each worker's weight in the mean: 1/m (``mean``) or n_i / sum_j n_j (``weighted``)."""
    if aggregate == "best":
        raise ConfigError("algorithm.aggregate=best elects among all m models of one round, which an asynchronous "
                          "run never has; use mean or weighted with comm.staleness > 0")
    weights = sizes if aggregate == "weighted" else [1.0] * len(sizes)
    return [n / sum(weights) for n in weights]


class AveragingServer:
    r"""The parameter server of asynchronous local SGD: each worker's change counts with its share,

    .. math:: w \leftarrow w + s_i (w_i - w^{(i)}) \qquad \text{on arrival},

    with w^{(i)} the parameters worker i pulled and s_i = 1/m (``mean``) or n_i / Σ n_j
    (``weighted``).  When every worker pulled the same w_t, one update from each gives the
    synchronous round's w_{t+1}.
    """

    def __init__(self, w: torch.Tensor, shares: list[float]):
        self.w, self.shares = w, shares

    def apply(self, update: list[torch.Tensor], rank: int) -> None:
        self.w = self.w + self.shares[rank] * update[0]
