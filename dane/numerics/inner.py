r"""The inexact local solve of DANE (and ADMM) on problems without a closed form.

Worker i minimises the proximal subproblem

.. math:: \phi_i(w) = O_i(w) - \langle \ell, w\rangle + \frac{\mu}{2}\|w - a\|^2,
          \qquad
          \nabla\phi_i(w) = \nabla O_i(w) - \ell + \mu (w - a),

with ``inner_steps`` steps of a torch optimizer (SGD, Adam or L-BFGS) started at the
anchor a.  For DANE, :math:`a = w_t` and :math:`\ell = \nabla O_i(w_t) - \eta g_t`, so the
step direction is exactly
:math:`\nabla\mathrm{loss}_{batch}(w) - (\nabla O_i(w_t) - \eta g) + \mu (w - w_t)`.
The data term :math:`\nabla O_i` is a minibatch estimate (the whole shard when the batch
size is null); the linear and proximal terms are exact and are added to the parameter
gradients after the backward pass.

`MinibatchSampler` gives every component its own seeded `torch.Generator`, so minibatch
order is reproducible and can be checkpointed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from .. import checks
from ..comm.meters import start_up
from ..errors import ConfigError, plural
from ..seeds import worker_seed
from ..work import count

#: the torch optimizers that take one step per minibatch, which a network's inner solve, each side of split learning
#: (`dane.split`) and synchronous SGD (`baselines.sync_sgd`) take; the inner solve takes L-BFGS besides
STEP_OPTIMIZERS = ("sgd", "adam")
INNER_OPTIMIZERS = (*STEP_OPTIMIZERS, "lbfgs")


@dataclass(frozen=True)
class InnerSolver:
    """How the local subproblem is solved: ``steps`` steps of ``optimizer`` at ``lr``.

    For sgd and adam one step is one minibatch of ``batch_size`` rows (null: the whole
    shard; a batch larger than the shard is refused where the problem first draws one,
    `refuse_oversized`), and ``steps=None`` means one pass over the shard (n_i // batch_size
    steps, at least one), so that a round costs every worker one epoch of its data whatever m is.
    For lbfgs, ``steps`` is the iteration budget of one L-BFGS run with a
    strong-Wolfe line search on one fixed batch (by default the whole shard, so the
    subproblem is solved to near optimality: the convex reference path).
    """

    optimizer: str = "sgd"
    lr: float = 0.05
    steps: int | None = 50  # None (sgd, adam): one pass over the shard, n_i // batch_size steps
    batch_size: int | None = 100
    momentum: float = 0.0

    def __post_init__(self) -> None:
        checks.one_of("problem.inner_optimizer", self.optimizer, INNER_OPTIMIZERS)
        checks.positive("problem.inner_lr", self.lr)
        if self.steps is not None or self.optimizer == "lbfgs":
            checks.positive_int("problem.inner_steps", self.steps)
        if self.batch_size is not None:
            checks.positive_int("problem.inner_batch_size", self.batch_size)
        checks.nonnegative("problem.inner_momentum", self.momentum)
        if self.momentum >= 1:
            raise ConfigError(f"problem.inner_momentum must be < 1, got {self.momentum}")


def preload_optimizers() -> None:
    """Import what a torch optimizer's first ``step()`` imports lazily (torch._dynamo, seconds).

    Called while a worker sets up, and start-up (`dane.comm.meters.start_up`), so that the import is not billed to
    round 1's compute, nor in the simulator to whichever worker thread imports it first.
    """
    with start_up():
        import torch._dynamo  # noqa: F401


def steps_for(solver: InnerSolver, n_local: int) -> int:
    """Inner steps on a shard of ``n_local`` rows: ``solver.steps``, or one pass when it is None."""
    if solver.steps is not None:
        return solver.steps
    return one_pass_steps(n_local, solver.batch_size or whole_shard(n_local))


def one_pass_steps(n_local: int, batch_size: int) -> int:
    """``problem.inner_steps=null``: one pass over the shard, n_i // batch steps (at least one), so that a round
    costs every worker one epoch of its data whatever m is.  This package's rule (not swept)."""
    return max(1, n_local // batch_size)


def whole_shard(n_local: int) -> int:
    """``problem.inner_batch_size=null``: every step (and each of ``grad_batches``' batches) takes the whole shard,
    n_i rows.  This package's rule (not swept)."""
    return n_local


def note_inner(notes, solver: InnerSolver, n_local: int, *, steps: bool) -> None:
    """The inner solver's nulls a use of it reads, noted on the shard's ``notes``
    (`dane.numerics.local_solvers.SolverNotes`, worker ``notes.worker``'s, from its ``n_local`` rows):
    ``inner_batch_size`` (`whole_shard`) at every draw, ``inner_steps`` (`one_pass_steps`) where ``steps`` (a
    local solve's count)."""
    if solver.batch_size is None:
        notes.note("problem.inner_batch_size", whole_shard(n_local), "whole_shard", worker=notes.worker, rows=n_local)
    if steps and solver.steps is None and solver.optimizer != "lbfgs":
        notes.note("problem.inner_steps", steps_for(solver, n_local), "one_pass_steps", worker=notes.worker,
                   rows=n_local, batch_size=solver.batch_size or whole_shard(n_local))


def inner_keys(solver: InnerSolver) -> dict[str, str]:
    """The ``problem.*`` keys `note_inner` notes for ``solver``, key -> rule (`SolverNotes`' ``also``)."""
    keys = {"problem.inner_batch_size": "whole_shard"} if solver.batch_size is None else {}
    if solver.steps is None and solver.optimizer != "lbfgs":
        keys["problem.inner_steps"] = "one_pass_steps"
    return keys


def make_optimizer(solver: InnerSolver, params: Sequence[torch.Tensor], mu: float = 0.0) -> torch.optim.Optimizer:
    if solver.optimizer == "sgd":
        return torch.optim.SGD(params, lr=proximal_step(solver.lr, mu), momentum=solver.momentum)
    if solver.optimizer == "adam":
        return torch.optim.Adam(params, lr=solver.lr)
    return torch.optim.LBFGS(params, lr=solver.lr, max_iter=solver.steps, history_size=20,
                             line_search_fn="strong_wolfe", tolerance_grad=1e-12, tolerance_change=1e-16)


def proximal_step(lr: float, mu: float) -> float:
    r"""The SGD step that treats the μ term implicitly: lr / (1 + lr μ).

    .. math:: \arg\min_w \langle \nabla f(w_k), w\rangle + \frac{1}{2\,lr}\|w - w_k\|^2
              + \frac{\mu}{2}\|w - a\|^2 = w_k - \frac{lr}{1 + lr\,\mu}\,(\nabla f(w_k) + \mu (w_k - a)),

    so one step on the whole subproblem gradient with this step length is a proximal
    gradient step.  Departure from a plain inner SGD: without it a step with lr μ > 2
    diverges, and the safeguard, which raises μ after a bad round, would make the next
    local solve blow up instead of staying closer to w_t.
    """
    return lr / (1.0 + lr * mu)


def add_proximal_terms(params: Sequence[torch.Tensor], anchor: Sequence[torch.Tensor], linear: Sequence[torch.Tensor],
                       mu: float, l2: float, *, with_value: bool = True) -> torch.Tensor | None:
    r"""Add :math:`l_2 w - \ell + \mu (w - a)` to every ``p.grad``; return
    :math:`\frac{l_2}{2}\|w\|^2 - \langle \ell, w\rangle + \frac{\mu}{2}\|w - a\|^2` (None without ``with_value``:
    only L-BFGS's line search reads it).

    One multi-tensor (``torch._foreach_*``) operation per term for all parameters, and none for a term whose
    weight is 0 (the table's μ = 0, l2 = 0: one subtraction), instead of ~6 kernels per parameter tensor per
    step: on a GPU a LeNet-5 step is a few dozen kernels, so these launches were a large share of it.  The
    same floating-point operations in the same order as ``p.grad += l2 p − ℓ + μ (p − a)``, so the same bits.
    """
    with torch.no_grad():
        grads = [p.grad for p in params]
        if l2 == 0 and mu == 0:
            torch._foreach_sub_(grads, list(linear))  # g − ℓ, bitwise g + (0·p − ℓ + 0·(p − a))
        else:
            terms = torch._foreach_mul(list(params), l2) if l2 != 0 else torch._foreach_neg(list(linear))
            if l2 != 0:
                torch._foreach_sub_(terms, list(linear))
            if mu != 0:
                torch._foreach_add_(terms, torch._foreach_mul(torch._foreach_sub(list(params), list(anchor)), mu))
            torch._foreach_add_(grads, terms)
        if not with_value:
            return None
        value = torch.zeros((), dtype=params[0].dtype, device=params[0].device)
        for p, a, lin in zip(params, anchor, linear):
            diff = p - a
            value += 0.5 * l2 * (p * p).sum() - (lin * p).sum() + 0.5 * mu * (diff * diff).sum()
    return value


def solve(solver: InnerSolver, params: Sequence[torch.Tensor], data_loss: Callable[[torch.Tensor], torch.Tensor],
          next_batch: Callable[[], torch.Tensor], anchor: Sequence[torch.Tensor], linear: Sequence[torch.Tensor],
          mu: float, l2: float, steps: int) -> None:
    """Run the inner optimizer on φ_i in place on ``params`` (which start at the anchor).

    ``data_loss(idx)`` zeroes the gradients, runs forward and backward on rows ``idx``
    and returns the data term's value; ``next_batch()`` draws the next rows; ``steps`` is
    the number of sgd/adam steps (see `steps_for`).
    """
    optimizer = make_optimizer(solver, params, mu)

    def closure(idx: torch.Tensor) -> torch.Tensor:
        count("local_inner_steps")  # L-BFGS: every evaluation of its closure (line-search trials too) is a step
        count("local_inner_samples", idx.shape[-1])
        loss = data_loss(idx)
        return loss.detach() + add_proximal_terms(params, anchor, linear, mu, l2)

    if solver.optimizer == "lbfgs":
        idx = next_batch()
        optimizer.step(lambda: closure(idx))
        return
    for _ in range(steps):  # no host synchronization here: sgd and adam never read φ's value
        idx = next_batch()
        count("local_inner_steps")
        count("local_inner_samples", idx.shape[-1])
        data_loss(idx)
        add_proximal_terms(params, anchor, linear, mu, l2, with_value=False)
        optimizer.step()


def refuse_oversized(key: str, batch_size: int | None, n: int, *, null: bool = True) -> None:
    """A minibatch of ``batch_size`` rows (``key``) from this worker's ``n``: refused in one line where it exceeds them,
    since `MinibatchSampler` would draw the whole shard instead, a smaller batch than the one asked for (``null``:
    the key takes null for the whole shard, and the line says so)."""
    if batch_size is not None and batch_size > n:
        fix = "a smaller batch or null for the full shard" if null else "a batch no larger than the smallest shard"
        raise ConfigError(f"{key}={batch_size} exceeds this worker's {plural(n, 'sample')}; use {fix}")


def inner_sampler(shard):
    """A network shard's ``sampler`` (`MinibatchSampler`, or `StackedSampler` on its stacked form) at a use by its
    inner solve or its ``grad_batches``: ``problem.inner_batch_size`` (``shard.inner.batch_size``) refused in one line
    where it exceeds the shard's ``n_local`` rows (`refuse_oversized`), and its null noted on ``shard.solver_notes``
    (`note_inner`).  Refused at its first use, not at build, since a method that never solves locally (sync_sgd,
    local_sgd, gd) leaves the key unused on shards of any size."""
    refuse_oversized("problem.inner_batch_size", shard.inner.batch_size, shard.n_local)
    note_inner(shard.solver_notes, shard.inner, shard.n_local, steps=False)
    return shard.sampler


class MinibatchSampler:
    """Epoch-shuffled minibatches of ``range(n)`` from a private seeded `torch.Generator`.

    Each epoch is a fresh permutation cut into full batches (the ragged tail is
    dropped, so every step sees ``batch_size`` rows).  ``batch_size=None`` (or >= n)
    means the whole range every time; a configured batch is refused before it gets here
    (`refuse_oversized`).
    """

    def __init__(self, n: int, batch_size: int | None, seed: int):
        self.n = n
        self.batch_size = n if batch_size is None else min(batch_size, n)
        self.generator = torch.Generator().manual_seed(seed)
        self.perm = torch.randperm(n, generator=self.generator)
        self.pos = 0
        self._on_device: tuple[torch.Tensor | None, torch.Tensor] | None = None  # (perm, its copy): `next_on`

    def next(self) -> torch.Tensor:
        if self.batch_size == self.n:
            return torch.arange(self.n)
        if self.pos + self.batch_size > self.n:
            self.perm = torch.randperm(self.n, generator=self.generator)
            self.pos = 0
        idx = self.perm[self.pos:self.pos + self.batch_size]
        self.pos += self.batch_size
        return idx

    def next_on(self, device: torch.device) -> torch.Tensor:
        """`next`'s rows, on ``device``: the epoch's permutation is copied there once and sliced there, so a GPU
        step does not wait for a host-to-device copy of its rows (from pageable memory, a synchronization)."""
        self.next()  # the rows are read from the device copy below, on the CPU too (the same code on every device)
        cached = self._on_device
        source = None if self.batch_size == self.n else self.perm
        if cached is None or cached[0] is not source or cached[1].device != device:
            cached = self._on_device = (source, (torch.arange(self.n) if source is None else source).to(device))
        if source is None:
            return cached[1]
        return cached[1][self.pos - self.batch_size:self.pos]

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state(), "perm": self.perm.clone(), "pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
        self.perm = state["perm"].clone()
        self.pos = int(state["pos"])


class StackedSampler:
    """The m workers' `MinibatchSampler` s side by side, for a stacked problem (`dane.comm.batched`).

    ``seeds[i]`` seeds worker i's sampler, so row i of every `next` is exactly the batch
    worker i's own sampler draws on the per-worker path.  ``next()`` returns (m, batch_size)
    row indices (each worker's into its own shard of ``n`` rows).
    """

    def __init__(self, n: int, batch_size: int | None, seeds: Sequence[int]):
        self.samplers = [MinibatchSampler(n, batch_size, seed) for seed in seeds]
        self.n, self.batch_size = n, self.samplers[0].batch_size

    def next(self) -> torch.Tensor:
        return torch.stack([sampler.next() for sampler in self.samplers])

    def state_dict(self) -> dict:
        return {"samplers": [sampler.state_dict() for sampler in self.samplers]}

    def load_state_dict(self, state: dict) -> None:
        for sampler, own in zip(self.samplers, state["samplers"]):
            sampler.load_state_dict(own)


def worker_samplers(n: int, batch_size: int | None, seed: int, stream: int, ranks: Sequence[int], *,
                    stacked: bool) -> MinibatchSampler | StackedSampler:
    """The minibatch sampler of the workers ``ranks`` (`dane.comm.batched.worker_ranks`): one worker's own
    `MinibatchSampler`, or with ``stacked`` the `StackedSampler` of all of them, each seeded by
    ``worker_seed(seed, rank, stream)``."""
    seeds = [worker_seed(seed, rank, stream) for rank in ranks]
    return StackedSampler(n, batch_size, seeds) if stacked else MinibatchSampler(n, batch_size, seeds[0])


