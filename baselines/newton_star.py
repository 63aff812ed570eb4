r"""Newton-Star: Newton's method with the Hessian at the optimum (Islamov, Qian & Richtárik 2021, the idealized
baseline the FedNL papers plot).

The server knows H_* = ∇²O(x*) = mean_i ∇²O_i(x*) and steps, one allreduce a round (the clients' gradients):

.. math:: x_{k+1} = x_k - H_*^{-1}\,\nabla O(x_k).

On a quadratic H_* is the Hessian everywhere and the first step lands on x* (to round-off); on a strongly convex
O with a Lipschitz Hessian the rate is local and quadratic, ‖x_{k+1} − x*‖ ≤ (L_H / 2μ)‖x_k − x*‖².  It is no
practical method: x* is what the run looks for.  Here x* is the run's reference optimum (``problem.optimum=auto``
or a saved file, `dane.problems.optimum`), required: without it the method refuses to start in one line.

*Messages and bits* (record ``clients_uplink_bits``, cumulative, FedNL's convention, `baselines.fednl`): before
round 0 each client sends ∇²O_i(x*) once as its packed upper triangle, 64·d(d+1)/2 bits (counted in round 0's
record); each round 64·d bits, its gradient.  FedNL-Public counts the same messages at 32-bit floats
(32·d(d+1)/2 once, 32·d a round: its ``Newton_Star``); the package sends float64.

Departures: FedNL-Public's ``Newton_Star`` inverts H_* each round; here H_* is factored once (Cholesky) and each
round solves with the factor, the same iterate to round-off.

Linear models with one output on rows (as FedNL: ``problem=logreg``, or ``problem=ridge`` with data), one client per
worker, or all m at once on the batched simulator's stacked rows (`dane.problems.stacked_rows.StackedRows`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg
import torch

from dane import checks
from dane.algorithm import AlgorithmConfig, Column
from dane.comm import Communicator
from dane.comm.batched import stacked
from dane.errors import ConfigError
from dane.problems import Problem
from dane.problems.glm import LinearModelShard
from dane.problems.stacked_hessians import CompactHessians, PackedRows, packed_size, unpack
from dane.problems.stacked_rows import StackedRows, rows_refusal
from dane.sampling import SamplingKeys, sampled_mean

from .federated import VALUE_BITS, ClientBits, Federated



def require_rows(problem: Problem, comm: Communicator, method: str) -> None:
    """Refuse, in one line, any problem but a one-output linear model on rows (the stacked rows on a batched
    communicator)."""
    if isinstance(problem, StackedRows if stacked(comm) else LinearModelShard) and (
            stacked(comm) or problem.classes == 1):
        return
    got = f"a softmax model ({problem.classes} outputs)" if isinstance(problem, LinearModelShard) else \
        f"a problem without rows of a linear model ({type(problem).__name__})"
    raise ConfigError(rows_refusal(method, got))


def client_rows(problem: Problem, comm: Communicator, method: str) -> StackedRows:
    """The clients' rows: all m on a batched communicator (the stacked rows it holds), else this worker's one
    (`require_rows`)."""
    require_rows(problem, comm, method)
    return problem if stacked(comm) else StackedRows([problem])


def linear_rows(problem: Problem, comm: Communicator, method: str) -> CompactHessians:
    """The clients' Hessians on their supports (`dane.problems.stacked_hessians`) over `client_rows`."""
    rows = client_rows(problem, comm, method)
    return CompactHessians.kept(rows) if stacked(comm) else CompactHessians(rows, ids=[comm.rank])


def packed_message(clients: CompactHessians, compact: np.ndarray, comm: Communicator) -> torch.Tensor | PackedRows:
    """The clients' packed triangles as the communicator takes them: stacked rows on a batched one, else the row."""
    if stacked(comm):
        return PackedRows(clients, compact)
    return torch.from_numpy(clients.expand(compact)[0])


class NewtonStar(ClientBits, Federated):
    """Newton-Star on one worker = one client (module docstring); H_*'s Cholesky factor is kept on every worker."""

    name = "newton_star"
    needs_rows = True  # its clients' rows (`require_rows`)
    label = "Newton-Star"
    batchable = True  # the stacked rows give all m clients' gradients at once
    stacked_needs = "oracles"
    columns = (*Federated.columns, Column("clients_uplink_bits", "{:>12.4g}"))
    summary_keys = (*Federated.summary_keys, "clients_uplink_bits")

    def __init__(self, problem: Problem, comm: Communicator, *, sampling: SamplingKeys, seed: int = 0):
        super().__init__(problem, comm, sampling=sampling, seed=seed)
        clients = linear_rows(problem, comm, self.name)
        if problem.w_star is None:
            raise ConfigError("algorithm=newton_star steps with the Hessian at the optimum x*; set "
                              "problem.optimum=auto (or the path of a saved x*)")
        self.d = clients.d
        x_star = problem.w_star.detach().to(torch.float64).cpu().numpy()
        _, hessians = clients.gradients_hessians(x_star)                           # ∇²O_i(x*)
        (H,), _ = sampled_mean(comm, self.sampler.draw_all(), [packed_message(clients, hessians, comm)])
        self.factor = scipy.linalg.cho_factor(unpack(H.numpy(), self.d), lower=True)  # H_*, once
        self.uplink_bits = 0
        self.count(comm.size, VALUE_BITS * packed_size(self.d), down=0)

    def round(self) -> dict[str, float]:
        members = self.sampler.draw_all()
        grad, payload = self.grad_and_payload(self.w)
        (g,), reduced = sampled_mean(self.comm, members, [grad], payload,           # uplink: ∇O_i(x_k)
                                     ride_kinds=self.ride_kinds())
        step = scipy.linalg.cho_solve(self.factor, g.to(torch.float64).numpy())       # H_*⁻¹ ∇O(x_k)
        self.w = self.w - torch.from_numpy(step).to(self.w.dtype)
        self.count(len(members), VALUE_BITS * self.d, down=self.d)
        return {**self.record(reduced, members), "clients_uplink_bits": self.uplink_bits}



@dataclass(frozen=True)
class NewtonStarConfig(AlgorithmConfig, SamplingKeys):
    seed: int = 0
    name: str = "newton_star"
    algorithm = NewtonStar

    def __post_init__(self) -> None:
        self.check_sampling()
        self.refuse_sampling("newton_star", "its step needs every client's gradient")
        checks.seed("algorithm.seed", self.seed)

    def build(self, problem: Problem, comm: Communicator) -> NewtonStar:
        return NewtonStar(problem, comm, sampling=self, seed=self.seed)
