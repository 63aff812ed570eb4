r"""Synchronous minibatch SGD: the data-parallel baseline of Horovod's ``DistributedOptimizer``.

Every step, worker i draws a minibatch B_i of its shard and

.. math::
    g &= \frac1m \sum_i \widehat{\nabla O_i}(w; B_i)   &&\text{(allreduce, every step)} \\
    w &\leftarrow \mathrm{opt.step}(w, g)               &&\text{(torch SGD or Adam, same on every worker)}

which is what ``hvd.DistributedOptimizer`` does around a torch optimizer, written against
the `Communicator` instead of importing horovod: one allreduce per minibatch step.  All
workers start from the same w and apply the same averaged gradient with the same
deterministic optimizer, so their iterates stay identical without a broadcast.

A logged *round* is ``steps_per_round`` steps, so ``comm_rounds`` grows by
``steps_per_round`` per round; the metrics of the round's starting iterate ride in its
first allreduce.  Null: one pass over the mean shard, n̄ // ``batch_size`` steps, n̄ the mean
of the workers' row counts, which rides in round 0's first allreduce (8 bytes, no round): every
worker must take the same number of steps, and unequal shards (``data.sharding``) give each its
own n_i.  The summary's ``defaults`` holds the count.  Asynchronous workers (``comm.staleness``)
need no agreement (the server's updates per round are counted from rank 0's pass, `dane.loop.asynchronous`).  The learning rate is used
as given (Horovod's recipe of scaling it by m is left to the config); the global batch is
m × ``batch_size``, so a ``batch_size`` above a worker's rows is refused as it is built
(`dane.numerics.inner.refuse_oversized`) rather than drawn as its whole shard.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dane import checks
from dane.algorithm import Algorithm, AlgorithmConfig
from dane.comm import Communicator
from dane.comm.compression import METRICS
from dane.errors import ConfigError
from dane.numerics.inner import STEP_OPTIMIZERS, MinibatchSampler, preload_optimizers, refuse_oversized
from dane.seeds import STREAMS, worker_seed
from dane.problems import Problem

from .defaults import Resolution, sgd_steps_per_round

SAMPLER_STREAM = STREAMS["sync_sgd_minibatch"].number  # this algorithm's minibatch generator


def make_optimizer(name: str, w: torch.Tensor, *, lr: float, momentum: float) -> torch.optim.Optimizer:
    if name == "adam":
        return torch.optim.Adam([w], lr=lr)
    return torch.optim.SGD([w], lr=lr, momentum=momentum)


class SyncSGD(Algorithm):
    name = "sync_sgd"
    label = "sync SGD"
    asynchronous = True  # worker_update: a minibatch gradient; GradientServer takes one optimizer step with it

    def __init__(self, problem: Problem, comm: Communicator, *, lr: float = 0.05, optimizer: str = "sgd",
                 momentum: float = 0.0, batch_size: int = 100, steps_per_round: int | None = 10, seed: int = 0,
                 w0: torch.Tensor | None = None):
        super().__init__(problem, comm, w0)
        for needed, offered in (("batch_grad", problem.batch_grad), ("n_local", problem.n_local)):
            if offered is None:
                raise ConfigError(f"algorithm=sync_sgd needs minibatch gradients ({type(problem).__name__}.{needed}); "
                                  "use algorithm=gd on this problem")
        refuse_oversized("algorithm.batch_size", batch_size, problem.n_local, null=False)  # before any collective
        self.batch_size = batch_size
        self.steps_per_round = steps_per_round or sgd_steps_per_round(problem.n_local, batch_size)  # null: its own,
        self.agree = steps_per_round is None  # until round 0 agrees on the mean shard's (module docstring)
        self.defaults = None if self.agree else ()
        self.pending_defaults = {"algorithm.steps_per_round": "sgd_steps_per_round"} if self.agree else {}
        self.sampler = MinibatchSampler(problem.n_local, batch_size, worker_seed(seed, comm.rank, SAMPLER_STREAM))
        preload_optimizers()
        self.w.requires_grad_(True)  # the optimizer's one parameter is the flat vector itself
        self.optimizer = make_optimizer(optimizer, self.w, lr=lr, momentum=momentum)
        self.updates_per_round = self.steps_per_round  # per worker, when asynchronous (dane.loop.asynchronous)

    def local_metrics(self) -> torch.Tensor:
        return self.problem.local_metrics(self.w.detach())  # a network: forward passes only, no gradient

    def step(self) -> dict[str, float]:
        metrics, s = self.local_metrics(), 0
        while s < self.steps_per_round:
            grad = self.problem.batch_grad(self.w.detach(), self.sampler.next())
            if s == 0:
                rows = [grad.new_tensor([float(self.problem.n_local)])] if self.agree else []
                g, metrics, *rows = self.comm.allreduce_mean([grad, metrics, *rows],  # w_t's metrics ride along
                                                             kinds=(None, METRICS))
                if rows:  # round 0 of steps_per_round=null: n̄ rode along too
                    self.agreed(float(rows[0][0]))
            else:
                (g,) = self.comm.allreduce_mean([grad])                  # g = mean_i minibatch gradient
            self.w.grad = g
            self.optimizer.step()                                        # w <- opt.step(w, g)
            s += 1
        return self.metrics(None, metrics)

    def agreed(self, mean_rows: float, stat: str = "mean_rows") -> None:
        """steps_per_round=null: n̄ // batch_size steps on every worker from now on, noted for the summary (``stat``:
        the rows' name there; an asynchronous worker's are its own)."""
        self.steps_per_round, self.agree = sgd_steps_per_round(mean_rows, self.batch_size), False
        resolution = Resolution()
        resolution.add("steps_per_round", self.steps_per_round, "sgd_steps_per_round",
                       **{stat: mean_rows}, batch_size=self.batch_size)
        self.defaults = tuple(resolution.entries)

    # Asynchronous and stale-synchronous SGD (comm.staleness > 0, dane.loop.asynchronous): the worker's half of a step;
    # the server's half is GradientServer (SyncSGDConfig.async_server).
    def worker_update(self, w: torch.Tensor) -> list[torch.Tensor]:
        """One worker step at the parameters it pulled: its minibatch gradient, pushed to the server."""
        if self.agree:  # steps_per_round=null, asynchronous: no round 0 to agree in; a pass over its own rows, noted
            self.agreed(float(self.problem.n_local), "rows")
        return [self.problem.batch_grad(w, self.sampler.next())]

    def evaluate(self) -> dict[str, float]:
        (metrics,) = self.comm.allreduce_mean([self.local_metrics()], kinds=(METRICS,))
        return self.metrics(None, metrics)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "sampler": self.sampler.state_dict(), "optimizer": self.optimizer.state_dict(),
                **({"mean_rows": self.defaults[0]["stats"]["mean_rows"]} if self.defaults else {})}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.sampler.load_state_dict(state["sampler"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.agree and "mean_rows" in state:  # agreed in round 0 of the run this one resumes
            self.agreed(state["mean_rows"])


@dataclass(frozen=True)
class SyncSGDConfig(AlgorithmConfig):
    lr: float = 0.05
    optimizer: str = "sgd"
    momentum: float = 0.9
    batch_size: int = 100
    steps_per_round: int | None = None  # None: one pass over the mean shard, mean n_i // batch_size steps (agreed;
    #                                     `baselines.defaults.sgd_steps_per_round`)
    seed: int = 0
    name: str = "sync_sgd"
    algorithm = SyncSGD

    def __post_init__(self) -> None:
        checks.positive("algorithm.lr", self.lr)
        checks.one_of("algorithm.optimizer", self.optimizer, STEP_OPTIMIZERS)
        if not 0 <= checks.nonnegative("algorithm.momentum", self.momentum) < 1:
            raise ConfigError(f"algorithm.momentum must be in [0, 1), got {self.momentum}")
        checks.positive_int("algorithm.batch_size", self.batch_size)
        if self.steps_per_round is not None:
            checks.positive_int("algorithm.steps_per_round", self.steps_per_round)

    def build(self, problem: Problem, comm: Communicator) -> "SyncSGD":
        return SyncSGD(problem, comm, lr=self.lr, optimizer=self.optimizer, momentum=self.momentum,
                       batch_size=self.batch_size, steps_per_round=self.steps_per_round, seed=self.seed)

    def async_server(self, w0: torch.Tensor, sizes: list[float]) -> "GradientServer":
        """The server of an asynchronous run (``comm.staleness > 0``), from w_0 and the workers' shard sizes."""
        return GradientServer(w0, name=self.optimizer, lr=self.lr, momentum=self.momentum)


class GradientServer:
    r"""The parameter server of asynchronous SGD: each pushed gradient is one step of the synchronous optimizer,

    .. math:: w \leftarrow \mathrm{opt.step}(w, g_i) \qquad \text{on arrival of } g_i,

    where a synchronous step takes the mean of m gradients instead.  So a pass over the data
    takes m times as many steps at the same ``lr``: lower it (or raise ``batch_size``) to
    compare the two per step size.
    """

    def __init__(self, w: torch.Tensor, *, name: str, lr: float, momentum: float):
        self.w = w.requires_grad_(True)
        self.optimizer = make_optimizer(name, self.w, lr=lr, momentum=momentum)

    def apply(self, update: list[torch.Tensor], rank: int) -> None:
        self.w.grad = update[0]
        self.optimizer.step()  # w <- opt.step(w, g_i), as SyncSGD.step does with the mean gradient
