"""Worker i's network problem (`dane.problems.neural`, whose module docstring gives O_i, the metrics and the
inexact local solve): its shard and model on a flat vector, built by `dane.problems.neural.NeuralProblemConfig`.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector

from ..data.augment import augment
from ..numerics.inner import (InnerSolver, MinibatchSampler, inner_keys, inner_sampler, note_inner,
                              preload_optimizers, solve, steps_for)
from ..numerics.local_solvers import SolverNotes
from ..models import LogisticRegression
from ..work import counted
from .base import Problem, SharedL2


class NeuralProblem(SharedL2, Problem):
    """Worker i's shard and model; see `dane.problems.neural`'s module docstring for O_i and the metrics."""

    metric_names = ("objective", "test_loss", "test_accuracy")

    def __init__(self, model: torch.nn.Module, train_x, train_y, test_x, test_y, *, weight: float, test_weight: float,
                 num_classes: int, workers: int, l2: float, inner: InnerSolver, grad_batches: int | None, eval_batch_size: int,
                 device: torch.device, dtype: torch.dtype, sampler_seed: int, notes=(), augment_seed: int | None = None):
        preload_optimizers()
        self.device, self.dtype = device, dtype
        self.convex = isinstance(model, LogisticRegression)  # cross-entropy of a linear model; a network is not
        self.model = model.to(device=device, dtype=dtype)
        self.params = list(self.model.parameters())
        self._sizes = [p.numel() for p in self.params]
        self.dim = sum(self._sizes)
        self.train_x, self.train_y = train_x.to(device, dtype), train_y.to(device)
        self.test_x, self.test_y = test_x.to(device, dtype), test_y.to(device)
        self.weight, self.test_weight, self.l2 = weight, test_weight, l2
        self.num_classes, self.workers = num_classes, workers
        self.inner, self.grad_batches, self.eval_batch_size = inner, grad_batches, eval_batch_size
        self.sampler = MinibatchSampler(self.n_local, inner.batch_size, sampler_seed)
        self.solver_notes = SolverNotes(also=inner_keys(inner))  # the inner solver's nulls its uses read (`note_inner`)
        # problem.augment: training minibatches (batch_grad, the inner solve) shifted and rotated (dane.data.augment)
        self.augmenter = None if augment_seed is None else torch.Generator().manual_seed(augment_seed)
        self.notes = list(notes)
        self._w0 = self._flat_params()

    # ------------------------------------------------------------------ the Problem protocol
    @property
    def n_local(self) -> int:
        return len(self.train_y)

    def initial_point(self) -> torch.Tensor:
        return self._w0.clone()

    def evaluate(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(∇O_i(w), [O_i(w), test-loss and test-accuracy contributions])."""
        self._load(w)
        if self.grad_batches is None:
            data_loss = self._data_loss(torch.arange(self.n_local, device=self.device))
        else:
            self._zero_grad()
            sampler = inner_sampler(self)
            for _ in range(self.grad_batches):  # gradient estimated on minibatches, objective still exact
                self._data_loss(sampler.next_on(self.device), scale=1 / self.grad_batches, zero=False)
            data_loss = self._train_loss()
        grad = self._flat_grads() + self.l2 * w.to(self.dtype)
        return grad, self._metrics(data_loss, w)

    def local_metrics(self, w: torch.Tensor) -> torch.Tensor:
        """The metric vector of `evaluate` without the gradient (forward passes only)."""
        self._load(w)
        return self._metrics(self._train_loss(), w)

    @counted("local_passes")
    def validation_objective(self, w: torch.Tensor) -> torch.Tensor:
        """Local SGD's election score (`dane.problems.Problem.validation_objective`): the mean cross-entropy per row
        on this shard plus (l2/2)‖w‖², O_i(w) with its weight m n_i / Σ_j n_j divided out.  `evaluate`'s value
        computed as it computes it, with that weight 1 and no backward pass: on equal shards (weight 1) O_i(w) bit
        for bit.  An empty shard scores inf (no rows to judge its model by)."""
        if not self.n_local:
            return torch.tensor(float("inf"), dtype=w.dtype)
        self._load(w)
        if self.grad_batches is None:
            data_loss = self._data_loss(torch.arange(self.n_local, device=self.device), weight=1.0, backward=False)
        else:
            data_loss = self._train_loss(weight=1.0)
        return (data_loss.double().cpu() + 0.5 * self.l2 * float(w.double() @ w.double())).to(w.dtype)

    def batch_grad(self, w: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Unbiased estimate of ∇O_i(w) from the local rows ``idx``."""
        self._load(w)
        self._data_loss(idx.to(self.device), augmented=True)
        return self._flat_grads() + self.l2 * w.to(self.dtype)

    def prox_solve(self, anchor: torch.Tensor, linear: torch.Tensor, mu: float, *, with_reg: bool = True,
                   anchor_grad: torch.Tensor | None = None) -> torch.Tensor:
        r"""≈ argmin_w O_i(w) − <linear, w> + (μ/2)||w − anchor||², by the inner solver started at the anchor."""
        sampler = inner_sampler(self)
        note_inner(self.solver_notes, self.inner, self.n_local, steps=True)
        self._load(anchor)
        anchor_parts = [a.view_as(p) for a, p in zip(anchor.to(self.device, self.dtype).split(self._sizes), self.params)]
        linear_parts = [g.view_as(p) for g, p in zip(linear.to(self.device, self.dtype).split(self._sizes), self.params)]
        solve(self.inner, self.params, lambda idx: self._data_loss(idx, augmented=True),
              lambda: sampler.next_on(self.device),
              anchor_parts, linear_parts, mu, self.l2 if with_reg else 0.0, steps_for(self.inner, self.n_local))
        return self._flat_params().to(anchor.dtype)

    def confusion_matrix(self, w: torch.Tensor) -> torch.Tensor:
        """This worker's share of the global test confusion matrix [true, predicted], as float64.

        It is m times the counts on this worker's test slice, so the allreduced mean is
        the matrix of the whole test set.
        """
        self._load(w)
        counts = torch.zeros(self.num_classes ** 2, dtype=torch.float64)
        with torch.no_grad():
            for x, y in self._chunks(self.test_x, self.test_y):
                cell = y * self.num_classes + self.model(x).argmax(1)
                counts += torch.bincount(cell.cpu(), minlength=self.num_classes ** 2).double()
        return self.workers * counts.view(self.num_classes, self.num_classes)

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict:
        """The samplers' generators, and the ``problem.*`` nulls the solves used so far (none: no key)."""
        state = {"sampler": self.sampler.state_dict()}
        if self.augmenter is not None:
            state["augment"] = self.augmenter.get_state()
        return self.solver_notes.kept(state)

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state["sampler"])
        self.solver_notes.restore(state)
        if self.augmenter is not None and "augment" in state:
            self.augmenter.set_state(state["augment"])

    # ------------------------------------------------------------------ plumbing
    def _load(self, w: torch.Tensor) -> None:
        # Copy, never alias: vector_to_parameters would make the parameters views of w, and
        # the inner optimizer would then overwrite the caller's iterate in place.
        with torch.no_grad():
            for p, chunk in zip(self.params, w.detach().split(self._sizes)):
                p.copy_(chunk.view_as(p))

    def _flat_params(self) -> torch.Tensor:
        return parameters_to_vector(self.params).detach().cpu().clone()

    def _flat_grads(self) -> torch.Tensor:
        return parameters_to_vector([p.grad for p in self.params]).cpu()

    def _zero_grad(self) -> None:
        for p in self.params:  # None, as optimizer.zero_grad() does: backward then writes the gradient, no fill kernel
            p.grad = None

    def _chunks(self, x: torch.Tensor, y: torch.Tensor):
        for start in range(0, len(y), self.eval_batch_size):
            yield x[start:start + self.eval_batch_size], y[start:start + self.eval_batch_size]

    @counted("local_passes", lambda self, idx, **kwargs: len(idx) / self.n_local)
    def _data_loss(self, idx: torch.Tensor, *, weight: float | None = None, scale: float = 1.0,
                   backward: bool = True, zero: bool = True, augmented: bool = False) -> torch.Tensor:
        """``scale`` × ``weight`` (None: the shard's, m n_i / Σ_j n_j) × mean CE over rows ``idx``, in chunks of
        ``eval_batch_size`` rows, their losses summed in the problem's dtype.  ``backward``: each chunk's gradient
        accumulated into ``p.grad`` (cleared first when ``zero``); otherwise forward passes only, without autograd.
        ``augmented`` (a training step) shifts and rotates the images when ``problem.augment`` is on."""
        if backward and zero:
            self._zero_grad()
        total = torch.zeros((), dtype=self.dtype, device=self.device)
        factor = scale * (self.weight if weight is None else weight) / len(idx)
        with contextlib.nullcontext() if backward else torch.no_grad():
            for start in range(0, len(idx), self.eval_batch_size):
                rows = idx[start:start + self.eval_batch_size]
                x = self.train_x[rows]
                if augmented and self.augmenter is not None:
                    x = augment(x, self.augmenter)
                loss = factor * F.cross_entropy(self.model(x), self.train_y[rows], reduction="sum")
                if backward:
                    loss.backward()
                    loss = loss.detach()
                total += loss
        return total

    # The sums are float64 on the model's device and come to the host once (one synchronization, not one per chunk).
    def _train_loss(self, weight: float | None = None) -> torch.Tensor:
        """``weight`` (None: the shard's, m n_i / Σ_j n_j) × mean CE over the shard, summed in float64."""
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        with torch.no_grad():
            for x, y in self._chunks(self.train_x, self.train_y):
                total += F.cross_entropy(self.model(x), y, reduction="sum").double()
        return total.cpu() * ((self.weight if weight is None else weight) / self.n_local)

    def _metrics(self, data_loss: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        sums = torch.zeros(2, dtype=torch.float64, device=self.device)  # test loss, correct
        with torch.no_grad():
            for x, y in self._chunks(self.test_x, self.test_y):
                logits = self.model(x)
                sums[0] += F.cross_entropy(logits, y, reduction="sum").double()
                sums[1] += (logits.argmax(1) == y).sum().double()
        test_loss, correct, data_sum = torch.cat([sums, data_loss.detach().double().reshape(1).to(self.device)]).cpu()
        objective = data_sum + 0.5 * self.l2 * float(w.double() @ w.double())
        return torch.stack([objective, self.test_weight * test_loss, self.test_weight * correct]).to(w.dtype)
