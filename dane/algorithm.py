"""The worker-side interface every distributed method implements, DANE and the baselines alike.

An `Algorithm` holds one worker's state and runs one round per `step`.  The same object
runs under horovodrun, torchrun, or as one thread of the in-process simulator; only the
`Communicator` differs.  Every round evaluates the iterate it starts from inside its
first grouped allreduce (the local metrics ride along with the gradient or iterate), so
logging costs no extra communication round.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch

from .comm import Communicator
from .problems import Problem


class Algorithm(ABC):
    name: ClassVar[str]

    def __init__(self, problem: Problem, comm: Communicator, w0: torch.Tensor | None = None):
        self.problem = problem
        self.comm = comm
        self.w = problem.initial_point() if w0 is None else w0.clone()

    @abstractmethod
    def step(self) -> dict[str, float]:
        """One round: returns the global metrics of the iterate the round started from, then moves on."""

    def evaluate(self) -> dict[str, float]:
        """Global metrics of the current iterate, in one grouped allreduce."""
        local_grad, local_metrics = self.problem.evaluate(self.w)
        global_grad, metrics = self.comm.allreduce_mean([local_grad, local_metrics])
        return self.metrics(global_grad, metrics)

    def metrics(self, global_grad: torch.Tensor | None, metrics: torch.Tensor) -> dict[str, float]:
        out = dict(zip(self.problem.metric_names, metrics.tolist()))
        if global_grad is not None:
            out["grad_norm"] = float(torch.linalg.vector_norm(global_grad))
        return out

    @property
    def iterate(self) -> torch.Tensor:
        return self.w

    def diagnosis(self, records: list[dict]) -> str | None:
        """At the round cap, what this method's own state says about why it is slow, naming the override
        to try (appended to ``stopped_by``); None: nothing to add.  ``records``: the run's, last one last."""
        return None

    def state_dict(self) -> dict:
        """What a resumed run needs to continue exactly as if never stopped.

        The base keeps the iterate and the problem's own state (its minibatch
        generators); subclasses with more state (a safeguard, dual variables, an
        optimizer) extend both methods.
        """
        state = {"w": self.w.detach().clone()}
        if hasattr(self.problem, "state_dict"):
            state["problem"] = self.problem.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        with torch.no_grad():
            self.w.copy_(state["w"])  # in place: an optimizer may hold self.w as its parameter
        if "problem" in state:
            self.problem.load_state_dict(state["problem"])

    def load_elastic_state(self, state: dict) -> None:
        """Continue from rank 0's committed state after a Horovod elastic reset (`dane.elastic`).

        Only rank 0's state survives a reset (it is broadcast to every worker), and the
        shards are dealt anew for the new world size, so this worker may hold other rows
        than the worker that wrote ``state``.  The default keeps everything but the
        problem's own state (minibatch generators of the old shard: this worker's start
        as in a fresh run of the new size); a subclass with state that depends on the
        shard derives it again from its new shard (`dane.dane.DANE`).
        """
        self.load_state_dict({key: value for key, value in state.items() if key != "problem"})
