r"""One-shot parameter averaging: every worker solves its own problem exactly, then one average.

.. math:: w_1 = \frac1m \sum_i \arg\min_w O_i(w)

Round 0 does the local solve and the one averaging allreduce (w_0's metrics ride in it);
round 1 evaluates w_1 in one allreduce, and the run ends there: more rounds could not move
w_1.  It ends ``converged`` when w_1 meets ``tol``, else with status ``one_shot`` and
``stopped_by`` "the one-shot average is final" with w_1's suboptimality (`finished`, read
by `dane.loop.runner.run`), so that a table does not read OSA's answer as a run out of budget.
Its last record, round 1, cost one allreduce (the average).  A cap of ``rounds=1`` ends at
the same record; ``rounds=0`` only evaluates w_0.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dane.algorithm import Algorithm, AlgorithmConfig
from dane.comm import Communicator
from dane.problems import Problem

from .metrics import global_metrics, local_payload, logs_gradient, payload_kinds


class OneShotAveraging(Algorithm):
    name = "osa"
    label = "OSA"
    synchronous_because = "one-shot averaging communicates once; there is nothing to make asynchronous"

    def __init__(self, problem: Problem, comm: Communicator, *, w0: torch.Tensor | None = None):
        super().__init__(problem, comm, w0)
        self.with_grad = logs_gradient(problem)
        self.averaged = False
        self._final: dict[str, float] | None = None  # metrics of the fixed average, once evaluated
        self.defaults = ()  # it takes no number: no package rule applies

    def step(self) -> dict[str, float]:
        if self.averaged:
            return self.evaluate()
        w_local = self.problem.prox_solve(self.w, torch.zeros_like(self.w), 0.0)             # argmin O_i, exactly
        payload = local_payload(self.problem, self.w, with_grad=self.with_grad)
        self.w, *reduced = self.comm.allreduce_mean([w_local, *payload],                      # the one average
                                                    kinds=(None, *payload_kinds(payload)))
        self.averaged = True
        return global_metrics(self, reduced)

    @property
    def finished(self) -> tuple[str, str] | None:
        """Once w_1's metrics are reported: the run's status and why it ends (`dane.loop.runner.run`)."""
        return ("one_shot", "the one-shot average is final") if self._final is not None else None

    def evaluate(self) -> dict[str, float]:
        if self._final is not None:
            return dict(self._final)
        payload = local_payload(self.problem, self.w, with_grad=self.with_grad)
        metrics = global_metrics(self, self.comm.allreduce_mean(payload, kinds=payload_kinds(payload)))
        if self.averaged:
            self._final = metrics
        return dict(metrics)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "averaged": self.averaged, "final": self._final}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.averaged, self._final = state["averaged"], state["final"]


@dataclass(frozen=True)
class OSAConfig(AlgorithmConfig):
    name: str = "osa"
    algorithm = OneShotAveraging

    def build(self, problem: Problem, comm: Communicator) -> "OneShotAveraging":
        return OneShotAveraging(problem, comm)
