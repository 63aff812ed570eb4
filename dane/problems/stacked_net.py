r"""All m workers' network shards as one stacked problem, for the batched simulator (`dane.comm.batched`).

`StackedNeuralProblem` is the batched form of `dane.problems.neural.NeuralProblem`: the m
equal training shards stacked, ``train_x`` of shape (m, n, ...) and ``train_y`` (m, n), one
model architecture, and the m workers' parameters as one (m, P) array of flat vectors
(row i worker i's).  Worker i's objective is the per-worker one,

.. math:: O_i(w) = \frac{m\,n_i}{N}\,\frac1{n_i}\sum_{j\in S_i} \mathrm{CE}(f_w(x_j), y_j)
                  + \frac{l_2}{2}\|w\|^2 ,

and every method takes a point shared by the workers, shape (P,), or one per worker,
(m, P), and returns per-worker results with a leading axis of m.  The m losses and their
gradients come from one of two engines (``engine``):

- ``vmap`` (the default on an accelerator): one call, ``torch.func.vmap`` over
  ``grad_and_value`` of the model applied by ``torch.func.functional_call`` to each worker's
  parameters (a dict of (m, ...) views of the rows, so the gradient is written once, not
  through a split of the flat row); torch lowers the m convolutions to one grouped
  convolution and the m linear layers to batched products: one kernel launch for m workers.
- ``loop`` (the default on the CPU): the per-worker path's own computation, one worker after
  another in this one thread (load row i into the model, forward and backward chunk by chunk,
  read the gradients), so the result is the per-worker one bit for bit.  On the CPU stacking buys
  no arithmetic: the workers share no weights, so each worker's convolutions stay small
  (6 and 16 channels) however they are batched, and oneDNN runs them fastest one worker at a
  time, with that worker's activations still in cache; grouped convolutions and im2col + batched
  GEMMs were slower (``make bench``: ``roofline`` of scripts/bench_batched_net.py gives the
  achieved GFLOP/s against this machine's GEMM rate).  What the batched path saves on the CPU is
  the m threads, not arithmetic.

State stays on ``device``: `initial_point` is there, so an algorithm's iterate, its local-step
arithmetic and its momentum buffers live on the device, and a method given a point on the
device returns its results there (the inner loop of `prox_solve` never leaves it); a point on
another device is moved in and the results moved back to it.  Only the samplers' row indices
(m x batch integers) and the metric sums cross to the host.

Minibatches are drawn exactly as on the per-worker path: worker i's rows come from its own
`dane.numerics.inner.MinibatchSampler`, seeded with ``worker_seed(seed, i, SAMPLER_STREAM)``
(`dane.numerics.inner.StackedSampler` holds the m of them), the full-shard gradient and every
batch are cut into chunks of ``eval_batch_size`` rows as there, and the test set is cut
into the same m contiguous slices.  So the iterates equal the per-worker path's to the
round-off of summing in another order: in float64 to about 1e-12 relative, in float32 to
float32's (``tests/test_batched_net.py`` states the bounds it checks).

Departures from the per-worker path, each refused in one line by
`NeuralProblemConfig.stacked_form` so that the simulator keeps one thread per worker:
shards of unequal size (N not a multiple of m, ``data.overlap``, non-iid sizes), an inner
optimizer other than SGD (the stacked local solve is SGD with momentum on the (m, P) array,
the update of ``torch.optim.SGD``), and ``problem.augment`` (its shifts are drawn per
worker).  The test slices may differ by one row: they are padded and masked.
"""
from __future__ import annotations

import contextlib
import copy
from typing import Sequence

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad_and_value, vmap
from torch.nn.utils import parameters_to_vector

from ..numerics.inner import (InnerSolver, StackedSampler, inner_keys, inner_sampler, note_inner, proximal_step,
                              steps_for)
from ..numerics.local_solvers import SolverNotes
from ..work import count, counted
from .base import Problem, SharedL2
from .stacked import rows_of

ENGINES = ("loop", "vmap")


def default_engine(device: torch.device) -> str:
    """``loop`` on the CPU, ``vmap`` on an accelerator (module docstring)."""
    return "loop" if torch.device(device).type == "cpu" else "vmap"


class StackedNeuralProblem(SharedL2, Problem):
    """m equal network shards stacked (module docstring); the batched form of `NeuralProblem`.

    ``engine`` (``loop`` or ``vmap``; None: `default_engine` of the device) may also be set between calls.
    """

    metric_names = ("objective", "test_loss", "test_accuracy")
    convex = False

    def __init__(self, model: torch.nn.Module, train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor,
                 test_y: torch.Tensor, test_slices: Sequence[torch.Tensor], *, weight: float, test_weight: float,
                 num_classes: int, l2: float, inner: InnerSolver, grad_batches: int | None, eval_batch_size: int,
                 device: torch.device, dtype: torch.dtype, sampler_seeds: Sequence[int], notes=(),
                 engine: str | None = None):
        self.device, self.dtype = torch.device(device), dtype
        self.engine = default_engine(self.device) if engine is None else engine
        if self.engine not in ENGINES:
            raise ValueError(f"Invalid engine: {self.engine!r}; use one of {', '.join(ENGINES)}")
        # w_0 read before the move: a meta device (tests/test_batched_net.py) keeps no values
        w0 = parameters_to_vector(model.parameters()).detach().to(dtype)
        self.model = model.to(device=self.device, dtype=dtype)
        self.params = list(self.model.parameters())
        self.names = [name for name, _ in self.model.named_parameters()]
        self.shapes = [p.shape for p in self.params]
        self.sizes = [p.numel() for p in self.params]
        self.dim = sum(self.sizes)
        self.stacked_workers, self.n_local = train_y.shape
        self.train_x, self.train_y = train_x.to(self.device, dtype), train_y.to(self.device)
        self.test_x, self.test_y = test_x.to(self.device, dtype), test_y.to(self.device)
        self.weight, self.test_weight, self.l2 = weight, test_weight, l2
        self.num_classes, self.inner = num_classes, inner
        self.grad_batches, self.eval_batch_size = grad_batches, eval_batch_size
        self.sampler = StackedSampler(self.n_local, inner.batch_size, sampler_seeds)
        self.solver_notes = SolverNotes(also=inner_keys(inner))  # as worker 0's shard notes them (equal shards)
        self.solver_notes.worker = 0
        how = ("torch.func.vmap" if self.engine == "vmap"
               else "the per-worker kernels one worker after another in one thread")
        self.notes = [*notes, f"sim.batched: the {self.stacked_workers} workers' networks ran as one stacked "
                              f"computation ({how}), each charged 1/m of its measured compute"]
        self._w0 = w0.to(self.device)
        # worker i's test rows: its slice, padded to the longest with row 0 and masked out of the sums
        longest = max(len(s) for s in test_slices)
        self._test_rows = torch.stack([torch.cat([s, s.new_zeros(longest - len(s))]) for s in test_slices]).to(self.device)
        self._test_mask = torch.stack([torch.arange(longest) < len(s) for s in test_slices]).to(self.device)
        self._grad_value = vmap(grad_and_value(self._loss), in_dims=(0, 0, 0, None))
        self._value = vmap(self._loss, in_dims=(0, 0, 0, None))
        self._vmap_logits = vmap(self._forward)

    # ------------------------------------------------------------------ the model on one worker's parameters (vmap)
    def _forward(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return functional_call(self.model, params, (x,))

    def _loss(self, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor, factor: float) -> torch.Tensor:
        return factor * F.cross_entropy(self._forward(params, x), y, reduction="sum")

    def _views(self, W: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each parameter of the m workers as an (m, ...) view of the rows of W."""
        return {name: chunk.view(len(W), *shape) for name, chunk, shape in zip(self.names, W.split(self.sizes, 1),
                                                                              self.shapes)}

    def _load(self, row: torch.Tensor) -> None:
        """One worker's parameters into the model, copied (`NeuralProblem._load`)."""
        with torch.no_grad():
            for p, chunk in zip(self.params, row.split(self.sizes)):
                p.copy_(chunk.view_as(p))

    def _logits(self, W: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Each worker's logits on its rows ``x[i]``: (m, rows, C), without gradients."""
        if self.engine == "vmap":
            return self._vmap_logits(self._views(W), x)
        out = []
        for i in range(self.stacked_workers):
            self._load(W[i])
            out.append(self.model(x[i]))
        return torch.stack(out)

    # ------------------------------------------------------------------ the Problem protocol, per worker
    def initial_point(self) -> torch.Tensor:
        """w_0 on the problem's device, so the algorithm's state stays there (module docstring)."""
        return self._w0.clone()

    def participants(self, idx: torch.Tensor) -> "StackedNeuralProblem":
        """The workers ``idx`` alone (`dane.problems.Problem.participants`): their training rows and test slices, and
        their own minibatch samplers (the same objects: a batch drawn here is one the per-worker path draws)."""
        view = copy.copy(self)
        rows = idx.to(self.device)
        view.train_x, view.train_y = self.train_x.index_select(0, rows), self.train_y.index_select(0, rows)
        view._test_rows, view._test_mask = self._test_rows.index_select(0, rows), self._test_mask.index_select(0, rows)
        view.sampler = copy.copy(self.sampler)
        view.sampler.samplers = [self.sampler.samplers[i] for i in idx.tolist()]
        view.stacked_workers = len(idx)
        return view

    def evaluate(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(∇O_i(w), [O_i(w), test-loss and test-accuracy contributions]) for every worker: (m, P) and (m, 3)."""
        W = rows_of(w.to(self.device, self.dtype), self.stacked_workers)
        if self.grad_batches is None:
            grads, data_loss = self._data_loss(W, None)
        else:  # gradient estimated on minibatches, objective still exact
            sampler = inner_sampler(self)
            grads = sum(self._data_loss(W, sampler.next(), scale=1 / self.grad_batches)[0]
                        for _ in range(self.grad_batches))
            data_loss = self._train_loss(W)
        return (grads + self.l2 * W).to(w.device), self._metrics(data_loss, W).to(w.device, w.dtype)

    def local_metrics(self, w: torch.Tensor) -> torch.Tensor:
        """The metric rows of `evaluate` without the gradients (forward passes only): (m, 3)."""
        W = rows_of(w.to(self.device, self.dtype), self.stacked_workers)
        return self._metrics(self._train_loss(W), W).to(w.device, w.dtype)

    @counted("local_passes")
    def validation_objective(self, w: torch.Tensor) -> torch.Tensor:
        """Local SGD's election score for every worker (`dane.problems.Problem.validation_objective`): its mean
        cross-entropy per row plus (l2/2)‖w_i‖², (m,), O_i with its weight m n / N divided out (1 here: the shards
        are equal).  `evaluate`'s value computed as it computes it (the same chunks, sums and factor), without the
        backward pass: on the CPU O_i bit for bit with either engine."""
        W = rows_of(w.to(self.device, self.dtype), self.stacked_workers)
        if self.grad_batches is None:
            data_loss = self._data_loss(W, None, weight=1.0, backward=False)[1]
        else:
            data_loss = self._train_loss(W, weight=1.0)
        Wd = W.double()
        return (data_loss.double() + 0.5 * self.l2 * (Wd * Wd).sum(-1)).to(w.device, w.dtype)

    def batch_grad(self, w: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Each worker's unbiased estimate of ∇O_i(w) from its rows ``idx[i]``: (m, P)."""
        W = rows_of(w.to(self.device, self.dtype), self.stacked_workers)
        return (self._data_loss(W, idx)[0] + self.l2 * W).to(w.device)

    def prox_solve(self, anchor: torch.Tensor, linear: torch.Tensor, mu: float, *, with_reg: bool = True,
                   anchor_grad: torch.Tensor | None = None) -> torch.Tensor:
        r"""≈ argmin_w O_i(w) − <linear_i, w> + (μ/2)||w − anchor||² for every worker: the inner SGD of
        `dane.numerics.inner.solve` (step lr / (1 + lr μ), heavy-ball momentum as ``torch.optim.SGD``) on the (m, P) array."""
        m, where = self.stacked_workers, anchor.device
        A = rows_of(anchor.to(self.device, self.dtype), m)
        lin = rows_of(linear.to(self.device, self.dtype), m)
        l2 = self.l2 if with_reg else 0.0
        lr, momentum = proximal_step(self.inner.lr, mu), self.inner.momentum
        W, buf, sampler = A.clone(), None, inner_sampler(self)
        note_inner(self.solver_notes, self.inner, self.n_local, steps=True)
        for _ in range(steps_for(self.inner, self.n_local)):
            idx = sampler.next()
            count("local_inner_steps")
            count("local_inner_samples", idx.shape[-1])
            step = self._data_loss(W, idx)[0]
            step.add_(l2 * W - lin + mu * (W - A))  # `dane.numerics.inner.add_proximal_terms`
            if momentum:
                buf = step.clone() if buf is None else buf.mul_(momentum).add_(step)
                step = buf
            W.add_(step, alpha=-lr)
        return W.to(where, anchor.dtype)

    def confusion_matrix(self, w: torch.Tensor) -> torch.Tensor:
        """Each worker's share of the test confusion matrix [true, predicted], m times its slice's counts: (m, C, C)."""
        W = rows_of(w.to(self.device, self.dtype), self.stacked_workers)
        C = self.num_classes
        with torch.no_grad():
            predicted = self._test_logits(W).argmax(-1)
        cells = self.test_y[self._test_rows] * C + predicted  # (m, L)
        one_hot = F.one_hot(cells, C * C).to(torch.float64) * self._test_mask.unsqueeze(-1)
        return self.stacked_workers * one_hot.sum(1).cpu().view(-1, C, C)

    def state_dict(self) -> dict:
        return self.solver_notes.kept({"sampler": self.sampler.state_dict()})

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state["sampler"])
        self.solver_notes.restore(state)

    # ------------------------------------------------------------------ plumbing
    @counted("local_passes", lambda self, W, idx, **kwargs: 1.0 if idx is None else idx.shape[-1] / self.n_local)
    def _data_loss(self, W: torch.Tensor, idx: torch.Tensor | None, *, weight: float | None = None,
                   scale: float = 1.0, backward: bool = True) -> tuple[torch.Tensor | None, torch.Tensor]:
        """``scale`` × ``weight`` (None: the shards', m n / N) × mean CE over each worker's rows ``idx[i]`` (None: its
        whole shard) and, with ``backward``, its gradient (otherwise forward passes only, without autograd, and
        None for it), in chunks of ``eval_batch_size`` rows as `NeuralProblem._data_loss` takes them:
        ((m, P), (m,))."""
        idx = None if idx is None else idx.to(self.device)  # the samplers draw on the CPU
        rows = self.n_local if idx is None else idx.shape[1]
        factor = scale * (self.weight if weight is None else weight) / rows
        with contextlib.nullcontext() if backward else torch.no_grad():
            if self.engine == "loop":
                return self._data_loss_loop(W, idx, rows, factor, backward)
            workers = torch.arange(self.stacked_workers, device=self.device).unsqueeze(1)
            params = self._views(W)
            grads, total = None, None
            for start in range(0, rows, self.eval_batch_size):
                stop = min(start + self.eval_batch_size, rows)
                if idx is None:
                    x, y = self.train_x[:, start:stop], self.train_y[:, start:stop]
                else:
                    x, y = self.train_x[workers, idx[:, start:stop]], self.train_y[workers, idx[:, start:stop]]
                if backward:
                    g, loss = self._grad_value(params, x, y, factor)
                    g = torch.cat([g[name].reshape(len(W), -1) for name in self.names], 1)
                    grads = g if grads is None else grads + g
                else:
                    loss = self._value(params, x, y, factor)
                total = loss if total is None else total + loss
            return grads, total

    def _data_loss_loop(self, W: torch.Tensor, idx: torch.Tensor | None, rows: int, factor: float, backward: bool
                        ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """`_data_loss` as the per-worker path computes it, worker by worker (`NeuralProblem._data_loss`: the chunks'
        gradients accumulated in ``p.grad``, their losses summed in the problem's dtype)."""
        grads, totals = torch.empty_like(W) if backward else None, W.new_zeros(self.stacked_workers)
        for i in range(self.stacked_workers):
            self._load(W[i])
            if backward:
                for p in self.params:
                    p.grad = None
            total = torch.zeros((), dtype=self.dtype, device=self.device)
            for start in range(0, rows, self.eval_batch_size):
                stop = min(start + self.eval_batch_size, rows)
                own = slice(start, stop) if idx is None else idx[i, start:stop]
                loss = factor * F.cross_entropy(self.model(self.train_x[i, own]), self.train_y[i, own], reduction="sum")
                if backward:
                    loss.backward()
                    loss = loss.detach()
                total += loss
            if backward:
                grads[i] = parameters_to_vector([p.grad for p in self.params])
            totals[i] = total
        return grads, totals

    def _train_loss(self, W: torch.Tensor, weight: float | None = None) -> torch.Tensor:
        """``weight`` (None: the shards', m n / N) × mean CE over each worker's whole shard, summed in float64: (m,)."""
        total = torch.zeros(self.stacked_workers, dtype=torch.float64, device=self.device)
        with torch.no_grad():
            for start in range(0, self.n_local, self.eval_batch_size):
                x, y = self.train_x[:, start:start + self.eval_batch_size], self.train_y[:, start:start + self.eval_batch_size]
                logits = self._logits(W, x)
                total += F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(y.shape).double().sum(1)
        return total * ((self.weight if weight is None else weight) / self.n_local)

    def _test_logits(self, W: torch.Tensor) -> torch.Tensor:
        """Each worker's logits on its (padded) test slice: (m, L, C)."""
        parts = [self._logits(W, self.test_x[self._test_rows[:, start:start + self.eval_batch_size]])
                 for start in range(0, self._test_rows.shape[1], self.eval_batch_size)]
        return torch.cat(parts, 1)

    def _metrics(self, data_loss: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
        """(m, 3): [O_i(w_i), m/N_test × test CE sum on slice i, m/N_test × correct on slice i], in float64."""
        with torch.no_grad():
            logits = self._test_logits(W)
        y = self.test_y[self._test_rows]
        losses = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(y.shape).double()
        mask = self._test_mask.double()
        test_loss = (losses * mask).sum(1)
        correct = ((logits.argmax(-1) == y).double() * mask).sum(1)
        Wd = W.double()
        objective = data_loss.double() + 0.5 * self.l2 * (Wd * Wd).sum(-1)
        return torch.stack([objective, self.test_weight * test_loss, self.test_weight * correct], -1)
