r"""ADIANA: accelerated DIANA (Li, Kovalev, Qian & Richtárik 2020, "Acceleration for compressed gradient descent in
distributed and federated optimization", arXiv:2002.11364, the distributed algorithm ADIANA).

Every worker holds the server's four points x, y, z, w (all w_0 at the start) and its shift h_i, the server
h = mean_i h_i (zero).  Round k, one allreduce, then c_k ~ Bernoulli(p) drawn alike on every worker:

.. math::
    x^k &= \theta_1 z^k + \theta_2 w^k + (1 - \theta_1 - \theta_2) y^k\\
    \Delta_i &= Q(\nabla O_i(x^k) - h_i),\quad \Delta^w_i = Q(\nabla O_i(w^k) - h_i),\quad
        h_i \leftarrow h_i + \alpha\,\Delta^w_i &&\text{(worker: sends } \Delta_i, \Delta^w_i\text{)}\\
    g^k &= h + \tfrac1m\textstyle\sum_i\Delta_i,\quad h \leftarrow h + \alpha\,\tfrac1m\textstyle\sum_i\Delta^w_i\\
    y^{k+1} &= x^k - \eta\, g^k,\quad z^{k+1} = \beta z^k + (1 - \beta) x^k + \tfrac{\gamma}{\eta}(y^{k+1} - x^k),
    \quad w^{k+1} = y^k \text{ if } c_k = 1, \text{ else } w^k

Q = ``compressor``, unbiased with variance ω (RandK, natural, dithering, ``none``; TopK refused, as in
`baselines.diana`), two independent draws a round from the worker's stream, Δ_i first.  With ``none`` (ω = 0)
g^k = mean_i ∇O_i(x^k) and, at p = 1, ADIANA is the deterministic accelerated gradient method of the same four
lines with w^k = y^{k−1} (tests/test_compressed_methods.py).  The coin draws from the run's seed alone
(`baselines.marina.coin_generator`), alike on every rank; records carry ``w_refreshed`` (c_k).

*Defaults* (nulls resolved by the config's ``build``, `baselines.defaults`, in the run's first lines and the
summary's ``defaults``), the parameters of the paper's theorem for μ-strongly convex f with L-smooth f_i (its
strongly convex ADIANA theorem, α = 1/(ω + 1), θ₂ = 1/2, β = 1 − γμ, γ = η/(2(θ₁ + ημ)), θ₁ = min(1/4, sqrt(ημ/p)),
η and p as below), in the form the FedNL paper's public code (Rustem-Islamov/FedNL-Public, ``methods.py``,
``adiana``) runs them, with which its figures compare ADIANA:

- α = ``alpha`` null: 1/(ω + 1) (`baselines.defaults.diana_shift_step`); a larger α is refused;
- p = ``p`` null: min(1, max(1, sqrt(m/(32ω)) − 1)/(2(1 + ω))) (`baselines.defaults.adiana_probability`; 1 at ω = 0);
- η = ``lr`` null: min(1/(2L), m/(64ωL(2p(ω + 1) + 1)²)) (`baselines.defaults.adiana_step`; 1/(2L) at ω = 0),
  L = max_i L_i;
- μ = ``mu`` null: μ̲, max(ℓ2 weight, mean_i λ_min(H_i)) on a quadratic whose Lanczos ran d products
  (``power_iters`` ≥ d, or d ≤ 2000), else the ℓ2 weight (`baselines.defaults.strong_convexity_bound`), refused at 0;
- θ₁, γ, β = ``theta1``, ``gamma``, ``beta`` null: `adiana_theta1`, `adiana_gamma`, `adiana_beta`; θ₂ = 1/2
  (`baselines.defaults.ADIANA_THETA2`).

L and μ̲ come from GD's local Lanczos and one allreduce before round 0 (`baselines.measure.smoothness_moments`,
counted in round 0's ``comm_rounds`` and ``bytes_sent``), only where a null needs them.

*Messages and bits* as DIANA's (`baselines.diana`: its own compressor, ``comm.compress`` refused, the communicator
counting the already compressed message): per worker a round ``uplink_bits`` += 2 bits(Q on d entries),
``downlink_bits`` += 64 · 2d (the two means, dense: from them every worker forms g^k and h); the logged metrics ride
along uncounted (`dane.comm.compression.METRICS`).

*The logged point* is y^k, the paper's output sequence (FedNL-Public's curves are f(y^k) too): each round evaluates
O_i at y^k for the record, and its gradient is ∇O_i(w^{k+1}) when the coin refreshes w.  ``local_passes`` counts the
method's gradients, once per point: at round 0 one, at y^0 = z^0 = w^0 = x^0 (x^0 is y^0 bit for bit where the
weighted sum rounds to it, as at w_0 = 0; else ∇O_i(x^0) is a second pass), then ∇O_i(x^k) every round and
∇O_i(y^k) where the coin refreshes w at k ≥ 1 (a refresh at round 0 sets w^1 = y^0 = w^0, whose gradient is
counted), 1 + p a round in expectation after round 0; the evaluation for the record alone is not counted.  The
logged ``grad_norm`` is ‖g^k‖, the estimate ADIANA steps with (at x^k).  It runs on the batched simulator as DIANA does.

Departures: none in the round; as DIANA's, L is a Lanczos estimate of max_i λ_max(H_i) at w_0 and μ̲ a lower
bound of μ.  The theorem's parameters are taken from the case split the public code implements; the paper's
Algorithm is stated with general h_i⁰, here zero, as DIANA's.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dane import checks
from dane.algorithm import Algorithm, AlgorithmConfig, Column
from dane.comm import Communicator
from dane.comm.compression import METRICS
from dane.errors import ConfigError
from dane.problems import Problem
from dane.work import count, uncounted

from .defaults import (ADIANA_THETA2, Resolution, adiana_beta, adiana_gamma, adiana_probability, adiana_step,
                       adiana_theta1, diana_shift_step)
from .diana import (SENT, CompressedKeys, compress_each, load_streams, own_compression, streams_state,
                    unbiased_compressor, worker_streams)
from .marina import coin_generator


class ADIANA(Algorithm):
    name = "adiana"
    label = "ADIANA"
    compressed_messages = True  # its own Q, its bits counted in the communicator (module docstring)
    synchronous_because = "ADIANA's server averages every worker's compressed differences at the same point"
    columns = (Column("w_refreshed", "{:>5.0f}"),)
    batchable = True  # its round reads the same on stacked tensors, each worker's Q from its own stream
    stacked_needs = "gradients"  # gradients at the iterate (and the defaults' Hessian products): any rows stack

    def __init__(self, problem: Problem, comm: Communicator, *, compressor: str = "none", lr: float, p: float,
                 alpha: float, theta1: float, gamma: float, beta: float, theta2: float = ADIANA_THETA2,
                 seed: int = 0, defaults: tuple[dict, ...] = ()):
        super().__init__(problem, comm)
        self.compressor = unbiased_compressor(compressor, self.name)
        self.lr, self.p, self.alpha, self.defaults = lr, p, alpha, tuple(defaults)
        self.theta1, self.theta2, self.gamma, self.beta = theta1, theta2, gamma, beta
        self.y, self.z, self.x_w = self.w.clone(), self.w.clone(), self.w.clone()  # y^k, z^k, w^k (self.w is y^k)
        self.h_i = torch.zeros_like(self.w)   # this worker's shift
        self.h = torch.zeros_like(self.w)
        self.grad_w: torch.Tensor | None = None  # ∇O_i(w^k), computed when w^k was the logged y
        self.coin = coin_generator(seed)
        self.counter = own_compression(comm, self.compressor, seed=seed)
        self.generators = worker_streams(comm, self.counter, seed)

    def step(self) -> dict[str, float]:
        with uncounted():                             # the record's metrics; its gradient is work only where used:
            grad_y, metrics = self.problem.evaluate(self.y)
        first = self.grad_w is None
        if first:                                     # round 0: w^0 = y^0
            self.grad_w = grad_y
            count("local_passes", 1.0)
        x = self.theta1 * self.z + self.theta2 * self.x_w + (1 - self.theta1 - self.theta2) * self.y
        # round 0's x^0 = y^0 (= z^0 = w^0) where the weighted sum rounds to it: the gradient just counted, no second pass
        grad_x = grad_y if first and torch.equal(x, self.y) else self.problem.evaluate(x)[0]
        delta = compress_each(self.compressor, grad_x - self.h_i, self.generators)          # Q(∇O_i(x^k) − h_i)
        delta_w = compress_each(self.compressor, self.grad_w - self.h_i, self.generators)   # Q(∇O_i(w^k) − h_i)
        self.h_i = self.h_i + self.alpha * delta_w
        mean, mean_w, metrics = self.comm.allreduce_mean([delta, delta_w, metrics], kinds=(SENT, SENT, METRICS))
        g = self.h + mean
        self.h = self.h + self.alpha * mean_w
        y_next = x - self.lr * g
        self.z = self.beta * self.z + (1 - self.beta) * x + (self.gamma / self.lr) * (y_next - x)
        refresh = bool(self.coin.random() < self.p)   # c_k: w^{k+1} = y^k
        if refresh:
            self.x_w, self.grad_w = self.y, grad_y
            if not first:                             # at round 0 w^1 = y^0 = w^0: its gradient is counted above
                count("local_passes", 1.0)
        self.y = y_next
        self.w = self.y
        return {**self.metrics(g, metrics), "lr": self.lr, "w_refreshed": float(refresh)}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "y": self.y.clone(), "z": self.z.clone(), "x_w": self.x_w.clone(),
                "h_i": self.h_i.clone(), "h": self.h.clone(), "grad_w": self.grad_w,
                "coin": self.coin.bit_generator.state, **streams_state(self.comm, self.generators)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.y, self.z, self.x_w = state["y"].clone(), state["z"].clone(), state["x_w"].clone()
        self.w = self.y
        self.h_i, self.h, self.grad_w = state["h_i"].clone(), state["h"].clone(), state["grad_w"]
        self.coin.bit_generator.state = state["coin"]
        load_streams(self.generators, state)


@dataclass(frozen=True)
class ADIANAConfig(AlgorithmConfig, CompressedKeys):
    p: float | None = None
    alpha: float | None = None
    mu: float | None = None
    theta1: float | None = None
    gamma: float | None = None
    beta: float | None = None
    name: str = "adiana"
    algorithm = ADIANA
    mu_role = "strong_convexity"

    def __post_init__(self) -> None:
        self.check_keys()
        unbiased_compressor(self.compressor, self.name)
        for key in ("alpha", "mu", "gamma"):
            if getattr(self, key) is not None:
                checks.positive(f"algorithm.{key}", getattr(self, key))
        for key in ("p", "beta"):
            value = getattr(self, key)
            if value is not None:
                checks.fraction(f"algorithm.{key}", value)
        if self.theta1 is not None and not 0 < self.theta1 <= 1 - ADIANA_THETA2:
            raise ConfigError(f"algorithm.theta1 must be in (0, {1 - ADIANA_THETA2}] (theta2 = {ADIANA_THETA2}), "
                              f"got {self.theta1}")

    def build(self, problem: Problem, comm: Communicator) -> ADIANA:
        """The nulls resolved in the theorem's order (`baselines.defaults`): α and p from ω and m, η from L, ω, m
        and p, then θ₁, γ, β from η, μ and p."""
        resolution, m = Resolution(), comm.size
        omega = self.compressor_built().omega(problem.dim)
        bound = diana_shift_step(omega)
        if self.alpha is not None and self.alpha > bound * (1 + 1e-12):
            raise ConfigError(f"algorithm.alpha must be <= 1/(omega + 1) = {bound:.4g} for {self.compressor} on "
                              f"d = {problem.dim} (ADIANA's shift step), got {self.alpha}; leave it null for that "
                              "bound")
        alpha = self.alpha if self.alpha is not None else resolution.add("alpha", bound, "diana_shift_step",
                                                                         omega=omega)
        p = self.p if self.p is not None else resolution.add("p", adiana_probability(omega, m), "adiana_probability",
                                                             omega=omega, workers=m)
        needs_mu = self.mu is None and None in (self.theta1, self.gamma, self.beta)
        found = self.moments(problem, comm) if self.lr is None or needs_mu else {}
        lr = self.lr
        if lr is None:
            lr = resolution.add("lr", adiana_step(found["max"], omega, m, p), "adiana_step", smoothness=found["max"],
                                omega=omega, workers=m, p=p)
        mu = self.mu
        if needs_mu:
            if found["mu_low"] <= 0:
                raise ConfigError("algorithm=adiana's theorem needs mu > 0 and the measured lower bound is "
                                  f"{found['mu_low']:.3g}; set algorithm.mu (or theta1, gamma and beta)")
            mu = resolution.add("mu", found["mu_low"], "strong_convexity_bound", mean_lowest=found["mean_lowest"],
                                lanczos_exact=found["lanczos_exact"], l2=float(problem.strong_convexity or 0.0))
        theta1 = self.theta1 if self.theta1 is not None else resolution.add(
            "theta1", adiana_theta1(lr, mu, p), "adiana_theta1", lr=lr, mu=mu, p=p)
        gamma = self.gamma if self.gamma is not None else resolution.add(
            "gamma", adiana_gamma(lr, mu, theta1), "adiana_gamma", lr=lr, mu=mu, theta1=theta1)
        beta = self.beta if self.beta is not None else resolution.add("beta", adiana_beta(gamma, mu), "adiana_beta",
                                                                      gamma=gamma, mu=mu)
        return ADIANA(problem, comm, compressor=self.compressor, lr=lr, p=p, alpha=alpha, theta1=theta1,
                      gamma=gamma, beta=beta, seed=self.seed, defaults=resolution.entries)
