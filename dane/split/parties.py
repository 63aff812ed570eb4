r"""The two sides of a cut network: an agent (rows, bottom, optionally the head) and the server (the top).

One step on agent a's minibatch B (docs/split_learning.md):

.. math::
    h = \mathrm{bottom}(x_B) \;\to\; \text{server: } \ell = \mathrm{CE}(\mathrm{top}(h), y_B),
    \text{ update top} \;\to\; \partial\ell/\partial h \;\to\; \text{agent: backprop bottom, update bottom}

U-shaped, the server returns its output z = middle(h) instead; the agent computes the loss
with its head, updates nothing yet, and sends ∂ℓ/∂z; the server backpropagates the middle
and returns ∂ℓ/∂h.  Each side steps its own optimizer (`dane.numerics.inner.make_optimizer`: SGD
with momentum or Adam) once per minibatch, on gradients computed before either side
stepped, so the pair makes exactly the plain-SGD step of the uncut model.

`pack`/`unpack` turn a side's weights and optimizer state into one flat vector (a
hand-over "snapshot" or the server's state in a checkpoint) and back; `state_layout`
says what the optimizer state holds, so an agent that has not stepped yet can receive one.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..numerics.inner import InnerSolver, make_optimizer

#: torch's per-parameter state of each optimizer, in pack order
STATE_KEYS = {"sgd": ("momentum_buffer",), "adam": ("step", "exp_avg", "exp_avg_sq")}


class Side:
    """Modules, their parameters and one optimizer over them: what an agent or the server holds."""

    def __init__(self, modules: list[nn.Module], solver: InnerSolver):
        self.modules = modules
        self.params = [p for m in modules for p in m.parameters()]
        self.solver = solver
        self.optimizer = make_optimizer(solver, self.params)

    def keys(self) -> tuple[str, ...]:
        if self.solver.optimizer == "sgd" and self.solver.momentum == 0:
            return ()  # torch's SGD keeps no state without momentum
        return STATE_KEYS[self.solver.optimizer]

    def numel(self, with_state: bool = True) -> int:
        """Elements of `pack`: the parameters, then each parameter's optimizer state."""
        n = sum(p.numel() for p in self.params)
        if not with_state:
            return n
        return n + sum(1 if key == "step" else p.numel() for p in self.params for key in self.keys())

    def pack(self, with_state: bool = True) -> torch.Tensor:
        parts = [p.detach().reshape(-1) for p in self.params]
        if with_state:
            dtype = self.params[0].dtype
            for p in self.params:
                state = self.optimizer.state[p]
                parts += [state[key].detach().reshape(-1).to(dtype) for key in self.keys()]
        return torch.cat(parts)

    def unpack(self, flat: torch.Tensor, with_state: bool = True) -> None:
        pieces = iter(flat.split(self._sizes(with_state)))
        with torch.no_grad():
            for p in self.params:
                p.copy_(next(pieces).view_as(p))
            if with_state:
                for p in self.params:
                    state = self.optimizer.state[p]
                    for key in self.keys():
                        piece = next(pieces)
                        state[key] = piece.reshape(()).to(torch.float32).clone() if key == "step" \
                            else piece.view_as(p).clone()

    def _sizes(self, with_state: bool) -> list[int]:
        sizes = [p.numel() for p in self.params]
        if with_state:
            sizes += [1 if key == "step" else p.numel() for p in self.params for key in self.keys()]
        return sizes

    def train(self) -> None:
        for m in self.modules:
            m.train()


class Agent(Side):
    """Agent a: its rows, a bottom copy (and, U-shaped, a head copy), its optimizer and its batch order."""

    def __init__(self, index: int, bottom: nn.Module, head: nn.Module | None, x: torch.Tensor, y: torch.Tensor,
                 solver: InnerSolver, batch_size: int, seed: int):
        super().__init__([bottom] + ([head] if head is not None else []), solver)
        self.index, self.bottom, self.head = index, bottom, head
        self.x, self.y, self.batch_size = x, y, batch_size
        self.generator = torch.Generator().manual_seed(seed)
        self.batches: list[torch.Tensor] = []

    def start_epoch(self) -> None:
        """This epoch's minibatches: a fresh permutation of the agent's rows in ``batch_size`` pieces (the last may be short)."""
        self.batches = list(torch.randperm(len(self.y), generator=self.generator).split(self.batch_size))

    def forward(self, k: int) -> torch.Tensor:
        """h = bottom(x_B) for batch k; the graph is kept for `backward`."""
        self.optimizer.zero_grad()
        self._h = self.bottom(self.x[self.batches[k]])
        return self._h.detach()

    def labels(self, k: int) -> torch.Tensor:
        return self.y[self.batches[k]]

    def head_loss(self, k: int, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """U-shaped: the loss of head(z) on batch k and ∂loss/∂z (the head's gradients are kept for the step)."""
        z = z.detach().requires_grad_(True)
        loss = F.cross_entropy(self.head(z), self.labels(k))
        loss.backward()
        return loss.detach(), z.grad

    def backward(self, grad_h: torch.Tensor) -> None:
        """Backpropagate the bottom from ∂loss/∂h and step (bottom and, U-shaped, head together)."""
        self._h.backward(grad_h)
        self.optimizer.step()
        self._h = None


class Server(Side):
    """The server's top (U-shaped: the middle) and its optimizer."""

    def __init__(self, top: nn.Module, solver: InnerSolver):
        super().__init__([top], solver)
        self.top = top

    def step(self, h: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Labels at the server: the loss of top(h), the top's step, and ∂loss/∂h."""
        h = h.detach().requires_grad_(True)
        self.optimizer.zero_grad()
        loss = F.cross_entropy(self.top(h), y)
        loss.backward()
        self.optimizer.step()
        return loss.detach(), h.grad

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """U-shaped, first half: z = middle(h), the graph kept for `backward`."""
        self._h = h.detach().requires_grad_(True)
        self.optimizer.zero_grad()
        self._z = self.top(self._h)
        return self._z.detach()

    def backward(self, grad_z: torch.Tensor) -> torch.Tensor:
        """U-shaped, second half: backpropagate the middle from ∂loss/∂z, step, return ∂loss/∂h."""
        self._z.backward(grad_z)
        self.optimizer.step()
        grad_h, self._h, self._z = self._h.grad, None, None
        return grad_h
