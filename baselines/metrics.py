"""The local contributions to a round's logged metrics, to ride in the round's allreduce.

The global gradient is sent only where the stop rule needs it: when the problem knows
its optimum, records carry ``suboptimality`` and the baselines that do not otherwise
communicate a gradient (ADMM, one-shot averaging, local SGD) leave ``grad_norm`` out, so
their ``bytes_sent`` counts only what the method itself needs (plus a few scalars).  The payload is the run's
measurement: `payload_kinds` marks it so (`dane.comm.compression.METRICS`), and the bit counts leave it out.
"""
from __future__ import annotations

import torch

from dane.algorithm import Algorithm
from dane.comm.compression import METRICS
from dane.problems import Problem
from dane.work import uncounted


def logs_gradient(problem: Problem) -> bool:
    """Whether records need ``grad_norm``: the stop rule uses it when suboptimality is unknown."""
    return "suboptimality" not in problem.metric_names


def local_payload(problem: Problem, w: torch.Tensor, *, with_grad: bool) -> list[torch.Tensor]:
    """[local metric vector] or [local metric vector, ∇O_i(w)]: a measurement, not counted as local work.  Without
    the gradient, the problem's `local_metrics` (a forward pass where the problem has one)."""
    with uncounted():
        if not with_grad:
            return [problem.local_metrics(w)]
        grad, metrics = problem.evaluate(w)
    return [metrics, grad]


def payload_kinds(payload: list[torch.Tensor]) -> tuple[str, ...]:
    """The kinds of `local_payload`'s tensors in an allreduce: every one the run's measurement (`METRICS`)."""
    return (METRICS,) * len(payload)


def global_metrics(algo: Algorithm, reduced: list[torch.Tensor]) -> dict[str, float]:
    """The record entries from the allreduced `local_payload`."""
    metrics, *grad = reduced
    return algo.metrics(grad[0] if grad else None, metrics)
