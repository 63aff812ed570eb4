"""What the federated DANE line shares: client sampling, the participants' traffic, and the local solve.

Every method of the line (`baselines.fedprox`, `scaffold`, `scaffnew`, `feddane`, `sdane`, `fedred`)
is a `Federated` algorithm: its round draws the clients S_t from the shared `dane.sampling.ClientSampler`,
averages over them with `dane.sampling.sampled_mean` (the metrics of the round's starting iterate ride
in the first allreduce from every worker), and counts the participants' uplink and downlink bytes
(`dane.sampling.Traffic`).  A local solve of

.. math:: \\min_w\\; O_i(w) - \\langle \\ell, w\\rangle + \\frac{\\mu}{2}\\|w - a\\|^2

is ``local_solver``: ``problem`` (the problem's own: the exact Cholesky solve on a quadratic, Newton
on a GLM, the inner torch optimizer on a network, `dane.numerics.inner`), one of the package's convex solvers
(``cholesky``, ``cg``, ``svrg``, ``lbfgs``: `dane.numerics.local_solvers`), or ``steps``: ``local_steps``
gradient steps from the anchor with step ``lr`` (null: 1/(max_i L_i + μ), the L_i by local Lanczos
and one allreduce of an m-vector before round 0, as `baselines.local_sgd`).

On the batched simulator (`dane.comm.batched`: FedAvg, FedProx, SCAFFOLD, Scaffnew and FedRed with ``steps``) the
same round runs on stacked tensors: `Federated.members` hands the round's local work the participants' stacked problem
(``problem.participants``: their rows alone, so the round costs s clients' work, not m), a client's own state is an
m x d stack read and written at the participants' rows (`Federated.held`, `Federated.hold`), and
`dane.sampling.sampled_mean` places the participants' rows among the others' zeros.

A subclass writes its paper's round as ``round`` and takes numbers.  Its config's ``build`` resolves each ``null``
first (`baselines.defaults`, from statistics `baselines.measure` takes before round 0, each noted in the run's
``defaults``) and attaches the mid-run adaptations that apply (`baselines.adaptive`); `Federated.step` runs the round,
then those wrappers, and the record carries what they changed (``adapted``).
"""
from __future__ import annotations

import math

from dataclasses import dataclass, replace

import numpy as np
import torch

from dane import checks
from dane.algorithm import Algorithm, Column, Finished, evaluation
from dane.comm import Communicator
from dane.comm.batched import per_worker, stacked
from dane.errors import ConfigError
from dane.comm.roster import fill_parked
from dane.numerics.local_solvers import LocalSolver
from dane.problems import Problem
from dane.sampling import ClientSampler, SamplingKeys, Traffic, sampled_mean
from dane.work import uncounted

from .adaptive import Adaptation, AdaptKeys, SamplingFloor
from .defaults import (GAP_BALANCE, HETEROGENEITY_DIVISOR, SAMPLED_PROX_PER_CURVATURE, Resolution,
                       balanced_prox_weight, local_step, prox_weight)
from .measure import hessian_dissimilarity, largest_smoothness
from .metrics import global_metrics, local_payload, logs_gradient, payload_kinds

FED_SOLVERS = ("problem", "steps", "cholesky", "cg", "svrg", "lbfgs")


def resolve_prox_weight(problem: Problem, comm: Communicator, key: str, resolution: Resolution, *, s: int, m: int,
                        divisor: float = HETEROGENEITY_DIVISOR, balance: float = GAP_BALANCE,
                        per_curvature: float = SAMPLED_PROX_PER_CURVATURE) -> tuple[float, float]:
    """(λ, δ_A): ``algorithm.<key>`` null by `baselines.defaults.prox_weight`, from δ_A, ‖H‖ and, for d ≤ 512, the
    preconditioner gap's balanced weight, measured at w_0 (`baselines.measure.hessian_dissimilarity`: two allreduces
    for d ≤ 512), and noted in ``resolution``."""
    found = hessian_dissimilarity(problem, comm, f"algorithm.{key}", gap=True)
    delta_a, norm, balanced = found["delta_a"], found["hessian_norm"], None
    if "gap" in found:  # the exact measurement (d ≤ 512)
        balanced = balanced_prox_weight(found["gap_weights"], found["gap"], found["curvature_min"] + found["shift"],
                                        balance)
    lam = prox_weight(delta_a, norm, balanced=balanced, s=s, m=m, divisor=divisor, per_curvature=per_curvature)
    resolution.add(key, lam, "prox_weight", delta_a=delta_a, hessian_norm=norm, balanced=balanced, s=s, m=m,
                   divisor=divisor, balance=balance if "gap" in found else None, per_curvature=per_curvature)
    return lam, delta_a


@dataclass(frozen=True)
class LocalKeys:
    """The ``algorithm.*`` keys every federated local solve reads (module docstring): the solver, the steps' ``lr``
    and the Lanczos iterations behind its null; `LocalSolveKeys` adds the count of ``steps``.  Alone, the keys of a
    method that draws its step count itself (Scaffnew), whose run's config then holds no ``local_steps`` it ignores."""

    local_solver: str = "problem"
    lr: float | None = None
    power_iters: int = 20

    def check_local(self) -> None:
        checks.one_of("algorithm.local_solver", self.local_solver, FED_SOLVERS)
        if self.lr is not None:
            checks.positive("algorithm.lr", self.lr)
        checks.positive_int("algorithm.power_iters", self.power_iters)

    def stacked_solve(self) -> str | None:
        """None where the batched path can run this local solve (``steps``: gradient steps on the participants'
        stacked rows); else why not, a clause of ``sim.batched=true``'s refusal (`dane.loop.batching`)."""
        if self.local_solver == "steps":
            return None
        return (f"algorithm.local_solver={self.local_solver} solves each client's problem on its own (the batched "
                f"path runs algorithm.local_solver=steps)")

    def solver(self, problem: LocalSolver | None = None) -> LocalSolver | None:
        """The `LocalSolver` handed to ``problem.prox_solve``: the method ``local_solver`` with every other setting the
        problem's (``problem``: its resolved solver, the ``problem.local_tol``, ``local_max_iter``, ``newton_steps``
        and ``svrg_*`` keys; None: `LocalSolver`'s defaults); None: the problem's own (or ``steps``)."""
        if self.local_solver in ("problem", "steps"):
            return None
        problem = problem or LocalSolver()
        if self.local_solver == "cg" and problem.tol == 0 and problem.max_iter is None:
            raise ConfigError("algorithm.local_solver=cg with problem.local_tol=0 needs problem.local_max_iter "
                              "(a fixed count of CG products)")
        return replace(problem, method=self.local_solver)

    def solves_with(self, problem) -> LocalSolver | None:
        """The `LocalSolver` the local solves run on ``problem``: `solver`'s, or the problem's own at
        ``local_solver=problem``; None for ``steps`` (or a problem without one)."""
        if self.local_solver == "problem":
            return getattr(problem, "solver", None)
        return self.solver(getattr(problem, "solver", None))


@dataclass(frozen=True)
class LocalSolveKeys(LocalKeys):
    """The ``algorithm.*`` keys of a federated local solve (module docstring): `LocalKeys` and ``local_steps``."""

    local_steps: int = 10

    def check_local(self) -> None:
        super().check_local()
        checks.positive_int("algorithm.local_steps", self.local_steps)


#: the width of a value in a message a method counts itself (`ClientBits`): float64
VALUE_BITS = 64


class ClientBits:
    """For a method that counts its clients' messages itself, exactly (FedNL's line): ``uplink_bits``, the record's
    ``clients_uplink_bits`` (cumulative, summed over the round's clients), in the records, the last evaluation and
    the checkpoints (``bits``), and the participants' traffic (`dane.sampling.Traffic`): ⌈bits/8⌉ bytes up and
    ``down`` values of `VALUE_BITS` down per client; and `own`, its clients' rows as its communicator takes them.
    Listed before `Federated` among the bases."""

    uplink_bits: int = 0

    def own(self, rows: np.ndarray) -> torch.Tensor:
        """This worker's clients' values (one row per client) as its communicator takes them: the stack on a batched
        one (`dane.comm.batched`), else the one client's row."""
        return torch.from_numpy(rows) if stacked(self.comm) else torch.from_numpy(rows[0])

    def count(self, clients: int, bits: int, *, down: int) -> None:
        """``clients`` clients each sent ``bits`` and received ``down`` values."""
        self.uplink_bits += clients * bits
        self.traffic.uplink += clients * math.ceil(bits / 8)
        self.traffic.downlink += clients * down * VALUE_BITS // 8

    def evaluate(self) -> dict[str, float]:
        return {**super().evaluate(), "clients_uplink_bits": self.uplink_bits}

    def spent(self) -> dict[str, int]:
        return {**super().spent(), "clients_uplink_bits": self.uplink_bits}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "bits": self.uplink_bits}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.uplink_bits = int(state["bits"])


class Federated(Algorithm):
    """Sampler, traffic and local-solve plumbing of a federated method.  A subclass writes its paper's round as
    `round` (one whose round runs the local solve is a `LocalSolving`); `step` runs it, then the adaptations its config
    attached (`baselines.adaptive`), and the round's record carries what they changed (``adapted``).  Every number
    arrives resolved (`baselines.defaults`); ``defaults`` lists the package rules that resolved them."""

    #: the `state_dict` keys that are the client's own, where the thread simulator may let the clients outside S_t
    #: sleep through the round (`dane.comm.roster`; the rest of the state every worker holds alike); None: it may
    #: not (a round that draws more than once, or changes state, or communicates, before its draw)
    own_state: tuple[str, ...] | None = None

    @classmethod
    def sleeps_out(cls, config) -> bool:
        """Whether a run of ``config`` may let the clients outside S_t sleep (`own_state`; a config whose round
        draws twice, or takes a collective over every client, says no)."""
        return cls.own_state is not None
    synchronous_because = "its rounds average the sampled clients' results from the same iterate"
    columns = (Column("clients", "{:>7d}"),)
    summary_keys = (*Algorithm.summary_keys, "uplink_bytes", "downlink_bytes")  # the participants' (dane.sampling)
    local: LocalKeys

    def __init__(self, problem: Problem, comm: Communicator, *, sampling: SamplingKeys, seed: int = 0,
                 local: LocalKeys | None = None, w0: torch.Tensor | None = None, smoothness: float = 0.0,
                 adaptations: tuple[Adaptation, ...] = (), defaults: tuple[dict, ...] = ()):
        super().__init__(problem, comm, w0)
        sampling.check_draw(comm.size)  # sampling=size (`dane.sampling`): refused by a run's spec first, here bare
        self.sampler = ClientSampler(comm, sampling.clients_per_round, sampling=sampling.sampling, seed=seed,
                                     n_local=problem.n_local)
        self.traffic = Traffic()
        self.with_grad = logs_gradient(problem)
        self.local = local or LocalKeys()
        self.solver = self.local.solver(problem.solver)  # its tolerance and caps: the problem's keys
        if self.solver is not None and problem.strong_convexity is None:
            raise ConfigError(f"algorithm.local_solver={self.local.local_solver} exists on the convex problems only, "
                              f"got {type(problem).__name__}; use algorithm.local_solver=problem (the inner optimizer)")
        self.lr = self.local.lr
        self.L_max = smoothness  # max_i L_i, for local gradient steps at lr null (`step_size`)
        self.local_problem = problem  # the round's local work: this worker's shard, or the participants' stack
        self.adaptations, self.defaults = tuple(adaptations), tuple(defaults)

    def round(self) -> dict[str, float]:
        """One round of the paper's method: the global metrics of the iterate it started from."""
        raise NotImplementedError

    def step(self) -> dict[str, float]:
        out = self.round()
        fired = [event for adaptation in self.adaptations for event in adaptation.after(self, out)]
        return {**out, "adapted": fired} if fired else out

    def read_work(self, t: int, work: dict[str, float]) -> list[dict]:
        return [event for adaptation in self.adaptations for event in adaptation.read_work(t, work)]

    @property
    def damps_itself(self) -> bool:
        return any(adaptation.damps for adaptation in self.adaptations)

    def step_size(self, shift: float) -> float:
        """``lr``, or 1/(max_i L_i + shift) (`baselines.defaults.local_step`) for steps on O_i + (shift/2)‖·‖²."""
        return self.local.lr if self.local.lr is not None else local_step(self.L_max, shift)

    # --------------------------------------------------------------- pieces of a round
    def members(self) -> tuple[torch.Tensor, bool]:
        """(S_t, whether this worker is in it).  On the batched path (`dane.comm.batched`) the round's local work runs
        on the participants' rows alone, |S_t| of the m: `local_problem` is their stacked problem
        (``problem.participants``; the whole stack without sampling), and "in it" is true, its rows being S_t's."""
        members = self.sampler.draw()
        if not stacked(self.comm):
            if not self.sampler.full:
                self.comm.drew(members.tolist())  # the thread simulator may park this worker here (`dane.comm.roster`)
            return members, bool((members == self.comm.rank).any())
        full = len(members) == self.comm.size
        self.local_problem = self.problem if full else self.problem.participants(members)
        return members, True

    def client_state(self, value: torch.Tensor) -> torch.Tensor:
        """A state each client keeps (SCAFFOLD's c_i, a control variate h_i), starting at ``value``: this worker's,
        or on the batched path the m clients' stack (m, ...)."""
        return per_worker(self.comm, lambda rank: value.clone())

    def held(self, state: torch.Tensor, members: torch.Tensor) -> torch.Tensor:
        """The participants' part of a `client_state`: this worker's own, or the stack's rows of S_t."""
        if not stacked(self.comm) or len(members) == self.comm.size:
            return state
        return state.index_select(0, members.to(state.device))

    def hold(self, state: torch.Tensor, members: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """``state`` with the participants' part replaced by ``value`` (`held`'s shape); the others' rows kept."""
        if not stacked(self.comm) or len(members) == self.comm.size:
            return value
        return state.index_copy(0, members.to(state.device), value)

    def payload(self, w: torch.Tensor) -> list[torch.Tensor]:
        """The local metrics of w (and ∇O_i(w) where records need it), to ride in an allreduce."""
        return local_payload(self.problem, w, with_grad=self.with_grad)

    def grad_and_payload(self, w: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(∇O_i(w), `payload` of w) from one evaluation."""
        grad, metrics = self.problem.evaluate(w)
        return grad, [metrics, grad] if self.with_grad else [metrics]

    def average(self, members: torch.Tensor, sampled: list[torch.Tensor], rides: list[torch.Tensor] = (),
                *, down: list[torch.Tensor] = (), metrics: bool = True) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Means over S_t of ``sampled`` (and over all of ``rides``); counts ``sampled`` up and ``down`` down.
        On the batched path ``sampled`` holds the participants' rows, and a client's message is one row.
        ``metrics``: ``rides`` start with ``payload(self.w)`` (where there are rides; the run's measurement,
        `ride_kinds`), else they are all zero outside S_t (`absent_message`)."""
        up = [t[0] for t in sampled] if stacked(self.comm) else sampled
        self.traffic.add(len(members), up=up, down=down)
        kinds = self.ride_kinds() if metrics and rides else ()
        return sampled_mean(self.comm, members, sampled, rides, self.absent_message(sampled, rides, metrics), kinds)

    def ride_kinds(self) -> tuple[str | None, ...]:
        """The kinds of `payload`'s tensors where they ride: the run's measurement (`payload_kinds`), left out of
        ``comm.compress``'s bit counts, as the participants' traffic leaves them out.  An adaptation that reads the
        round's objective reads it from the record, after the paper's round (`baselines.adaptive`)."""
        return payload_kinds([self.w] * (1 + self.with_grad))

    def absent_message(self, sampled: list[torch.Tensor], rides: list[torch.Tensor], metrics: bool = True):
        """What a client outside S_t would send, from its shard, where the simulator parks it (`own_state`):
        zeros for ``sampled`` and, where there are ``rides``, the metrics of w (`payload`; not where ``metrics`` is
        False) and zeros for the rides after them (a method that parks starts its rides with ``payload(self.w)``,
        or says it does not, and its other rides are zero outside S_t).  None elsewhere, and on every rank but 0,
        whose the group reads."""
        if self.own_state is None or self.comm.rank != 0 or \
                getattr(getattr(self.comm, "group", None), "roster", None) is None:
            return None
        zeros = [torch.zeros_like(t) for t in sampled]
        if not rides or not metrics:
            return lambda problem: [*zeros, *(torch.zeros_like(t) for t in rides)]
        w, with_grad = self.w.detach().clone(), self.with_grad
        after = [torch.zeros_like(t) for t in rides[1 + with_grad:]]
        return lambda problem: [*zeros, *local_payload(problem, w, with_grad=with_grad), *after]

    def evaluate(self) -> dict[str, float]:
        """The last iterate's metrics (one allreduce, not a round of the method) and the traffic so far.  A client
        the thread simulator parked sends its part from its shard (`dane.comm.roster.fill_parked`), uncounted as
        every evaluation after the last round's snapshot of the local work."""
        w = self.w.detach().clone()

        def parked(problem: Problem) -> list[torch.Tensor]:
            with uncounted():
                return evaluation(problem, w)

        fill_parked(self.comm, parked)
        return {**super().evaluate(), **self.traffic.record(self.sampler.s)}

    def spent(self) -> dict[str, int]:
        return {**super().spent(), **self.traffic.spent()}

    def record(self, reduced: list[torch.Tensor], members: torch.Tensor) -> dict[str, float]:
        return {**global_metrics(self, reduced), **self.traffic.record(len(members))}

    def floor_diagnosis(self, floor: SamplingFloor) -> str:
        """The one line a run at its sampling floor ends with (`baselines.adaptive.FloorStop`)."""
        return (f"the objective has not improved for {floor.rounds - 1 - floor.best_round} rounds: under "
                f"client sampling ({self.sampler.s} of {self.sampler.m}) the sampled gradient is not zero at the "
                f"optimum when the shards differ, so {self.name} stalls at a floor; algorithm.clients_per_round=null "
                f"(all clients) removes it")

    #: where the paper's round itself cannot go on (DINGO's direction, NL1's learned coefficients, not finite): the
    #: run ends diverged on that round's record, with the key to change (`dane.algorithm.Finished`)
    ended: Finished | None = None

    @property
    def finished(self) -> tuple[str, str] | Finished | None:
        """The round's own ending (``ended``), else the first adaptation's (status, why) that ended the run
        (`baselines.adaptive`)."""
        return self.ended or next(filter(None, (a.finished for a in self.adaptations)), None)

    def local_grad(self, w: torch.Tensor) -> torch.Tensor:
        """∇O_i(w) for the round's participants (`members`)."""
        return self.local_problem.evaluate(w)[0]

    # --------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        state = {**super().state_dict(), "sampler": self.sampler.state_dict(), "traffic": self.traffic.state_dict()}
        for adaptation in self.adaptations:
            state.update(adaptation.state_dict())
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.sampler.load_state_dict(state["sampler"])
        self.traffic.load_state_dict(state["traffic"])
        for adaptation in self.adaptations:
            adaptation.load_state_dict(state)


class LocalSolving(Federated):
    """A federated method whose round runs the local solve `prox` (module docstring), so its keys are
    `LocalSolveKeys`: ``local_solver=steps`` takes their ``local_steps``."""

    local: LocalSolveKeys

    def __init__(self, problem: Problem, comm: Communicator, *, local: LocalSolveKeys | None = None, **kwargs):
        super().__init__(problem, comm, local=local or LocalSolveKeys(), **kwargs)

    def prox(self, anchor: torch.Tensor, linear: torch.Tensor, mu: float, *,
             anchor_grad: torch.Tensor | None = None) -> torch.Tensor:
        """≈ argmin_w O_i(w) − ⟨linear, w⟩ + (μ/2)‖w − anchor‖² by ``local_solver`` (module docstring)."""
        if self.local.local_solver == "steps":
            lr, w = self.step_size(mu), anchor
            for k in range(self.local.local_steps):
                grad = anchor_grad if k == 0 and anchor_grad is not None else self.local_grad(w)
                w = w - lr * (grad - linear + mu * (w - anchor))
            return w
        kwargs = {"solver": self.solver} if self.solver else {}
        return self.local_problem.prox_solve(anchor, linear, mu, anchor_grad=anchor_grad, **kwargs)


@dataclass(frozen=True)
class PolicyKeys(AdaptKeys):
    """The ``algorithm.*`` keys that say which package rules a federated run may apply (`baselines.adaptive`)."""

    def clients(self, comm: Communicator) -> tuple[int, int]:
        """(s, m): the clients a round draws and all of them."""
        return comm.size if self.clients_per_round is None else int(self.clients_per_round), comm.size

    def measured_smoothness(self, problem: Problem, comm: Communicator, resolution: Resolution) -> float:
        """max_i L_i where the local solve takes gradient steps at ``lr`` null (one allreduce before round 0), else 0;
        the step it gives is noted in ``resolution`` by the caller, which knows the shift."""
        if self.local_solver != "steps" or self.lr is not None:
            return 0.0
        return largest_smoothness(problem, comm, iters=self.power_iters, seed=self.seed)
