r"""DANE: Distributed Approximate NEwton (Shamir, Srebro & Zhang, ICML 2014).

Round t on worker i of m, with step size η > 0 and proximal weight μ ≥ 0:

.. math::
    g_t &= \frac1m \sum_{i} \nabla O_i(w_t)  &&\text{(allreduce 1)} \\
    w_i &= \arg\min_w\; O_i(w) - \langle \nabla O_i(w_t) - \eta\, g_t, w\rangle
           + \frac{\mu}{2}\|w - w_t\|^2           &&\text{(local solve)} \\
    w_{t+1} &= \frac1m \sum_i w_i                 &&\text{(allreduce 2)}

For a quadratic the local solve is :math:`w_i = w_t - \eta (H_i + \mu I)^{-1} g_t`.

Departure from the paper: with ``safeguard=True`` (the default) μ is adapted so that
the method cannot diverge; see `MuSafeguard`.  The check needs the global objective of
w_{t+1}, which rides in the next round's first allreduce, so an accepted round costs
no extra communication; a rejected one costs the round it undoes.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .algorithm import Algorithm
from .comm import Communicator
from . import checks
from .problems import Problem


@dataclass(frozen=True)
class DANEConfig:
    eta: float = 1.0
    mu: float = 0.0
    safeguard: bool = True
    name: str = "dane"

    def __post_init__(self) -> None:
        checks.positive("algorithm.eta", self.eta)
        checks.nonnegative("algorithm.mu", self.mu)

    def build(self, problem: Problem, comm: Communicator) -> "DANE":
        return DANE(problem, comm, eta=self.eta, mu=self.mu, safeguard=self.safeguard)


class DANE(Algorithm):
    name = "dane"

    def __init__(self, problem: Problem, comm: Communicator, *, eta: float = 1.0, mu: float = 0.0,
                 safeguard: bool = True, w0: torch.Tensor | None = None):
        super().__init__(problem, comm, w0)
        self.eta = eta
        self.mu = mu
        self.guard = MuSafeguard(mu) if safeguard else None

    def step(self) -> dict[str, float]:
        w = self.w
        local_grad, local_metrics = self.problem.evaluate(w)
        g, metrics = self.comm.allreduce_mean([local_grad, local_metrics])          # 1. g = mean ∇O_i(w_t)
        extra = {}
        if self.guard is not None:
            w, local_grad, g, metrics, extra = self.guard.review(w, local_grad, g, metrics)
            self.mu = self.guard.mu
        w_local = self.problem.prox_solve(w, local_grad - self.eta * g, self.mu)    # 2. local solve
        (self.w,) = self.comm.allreduce_mean([w_local])                              # 3. w_{t+1} = mean w_i
        return {**self.metrics(g, metrics), "mu": self.mu, **extra}

    def state_dict(self) -> dict:
        state = {**super().state_dict(), "mu": self.mu}
        if self.guard is not None:
            state["guard"] = self.guard.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.mu = state["mu"]
        if self.guard is not None:
            self.guard.load_state_dict(state["guard"])


class MuSafeguard:
    """Accept an averaged iterate only if the global objective did not increase.

    On a rejection the worker returns to the last accepted iterate, whose gradients it
    kept, and redoes the local solve with a larger μ.  The first nonzero μ is a fraction
    of the secant curvature ‖g_{t+1} - g_t‖ / ‖w_{t+1} - w_t‖ along the rejected step, so
    the rule needs no problem-specific scale; later rejections multiply μ by ``grow``.
    After ``patience`` accepted rounds in a row μ is divided by ``shrink``, down to the
    configured μ, so an early scare does not slow the whole run.
    """

    def __init__(self, mu: float, *, grow: float = 4.0, shrink: float = 2.0, patience: int = 3,
                 initial_fraction: float = 0.1, rtol: float = 1e-12):
        self.mu_floor = self.mu = mu
        self.grow, self.shrink, self.patience = grow, shrink, patience
        self.initial_fraction, self.rtol = initial_fraction, rtol
        self.accepted: tuple | None = None
        self.streak = 0

    def review(self, w, local_grad, g, metrics):
        objective = float(metrics[0])
        if self.accepted is not None:
            w0, _, g0, metrics0 = self.accepted
            best = float(metrics0[0])
            if not objective <= best + self.rtol * abs(best):  # also rejects nan and inf
                self._raise_mu(w - w0, g - g0)
                return (*self.accepted, {"accepted": False})
        self.accepted = (w, local_grad, g, metrics)
        self.streak += 1
        if self.streak >= self.patience and self.mu > self.mu_floor:
            self.mu = max(self.mu / self.shrink, self.mu_floor)
            self.streak = 0
        return w, local_grad, g, metrics, {"accepted": True}

    def state_dict(self) -> dict:
        return {"mu": self.mu, "streak": self.streak, "accepted": self.accepted}

    def load_state_dict(self, state: dict) -> None:
        self.mu, self.streak = state["mu"], state["streak"]
        self.accepted = None if state["accepted"] is None else tuple(state["accepted"])

    def _raise_mu(self, dw: torch.Tensor, dg: torch.Tensor) -> None:
        self.streak = 0
        if self.mu > 0:
            self.mu *= self.grow
            return
        dw_norm = float(torch.linalg.vector_norm(dw))
        curvature = float(torch.linalg.vector_norm(dg)) / dw_norm if dw_norm > 0 else 1.0
        self.mu = self.initial_fraction * curvature if torch.isfinite(torch.tensor(curvature)) and curvature > 0 else 1.0
