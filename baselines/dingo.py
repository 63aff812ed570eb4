r"""DINGO: distributed Newton-type method for gradient-norm optimization (Crane & Roosta, NeurIPS 2019).

DINGO descends on ‖∇O‖², not O: at x_k with g = ∇O(x_k) (one allreduce), client i forms from its Hessian
H_i = ∇²O_i(x_k) and H̃_i = [H_i; φI] (2d x d), g̃ = [g; 0]:

.. math::
    H_i g,\qquad H_i^\dagger g,\qquad \tilde H_i^\dagger\tilde g = (H_i^2 + \phi^2 I)^{-1} H_i g
    \qquad\text{(one allreduce of the three)}

and with h = mean_i H_i g (= ∇²O(x_k) g) the server picks the first direction of descent for ‖∇O‖² it can trust:

1. p = −mean_i H_i† g if ⟨h, mean_i H_i† g⟩ ≥ θ‖g‖²;
2. else p = −mean_i H̃_i†g̃ if ⟨h, mean_i H̃_i†g̃⟩ ≥ θ‖g‖²;
3. else p = mean_i p_i (one more allreduce), p_i = −H̃_i†g̃ where ⟨H̃_i†g̃, h⟩ ≥ θ‖g‖², otherwise
   p_i = −H̃_i†g̃ − λ_i (H̃_iᵀH̃_i)⁻¹h with λ_i = (θ‖g‖² − ⟨H̃_i†g̃, h⟩)/⟨h, (H̃_iᵀH̃_i)⁻¹h⟩ (so ⟨p_i, h⟩ = −θ‖g‖²).

Then x_{k+1} = x_k + a p, a the first of 1, 1/2, 1/4, … with ‖∇O(x_k + a p)‖² ≤ ‖g‖² + 2aρ⟨p, h⟩ (one allreduce of
gradients a trial; at most `LS_TRIALS`, after which the round keeps x_k, a = 0; a direction that is not finite, case
3's λ_i overflowing at a huge θ‖g‖², keeps x_k with no trial and ends the run diverged, naming θ: `DINGO.not_finite`).
θ = ``theta``, φ = ``phi``, ρ = ``rho``: the paper's and FedNL-Public's 1e-4, 1e-6, 1e-4.  The paper takes θ, φ > 0 (φ here at most `PHI_MAX`,
so that φ² is a finite float) and ρ ∈ (0, 1), as any
Armijo condition must: on a quadratic ‖∇O(x_k + a p)‖² = ‖g‖² + 2a⟨p, h⟩ + a²‖∇²O p‖², so where ⟨p, h⟩ < 0 no
a > 0 passes with ρ ≥ 1 and every round would spend its `LS_TRIALS` trials to keep x_k.  H_i includes the ℓ2 term λI; where λ > 0 it is
positive definite and H_i† is its inverse (a Cholesky solve).  Departure from the paper: H_i† is that inverse only, not
the pseudo-inverse of a singular H_i (λ = 0 and fewer rows than features), which the run refuses in one line
(`client_vectors`); no key of DINGO's shifts H_i (φ regularizes the third vector only).

*Bits* (record ``clients_uplink_bits``, cumulative, FedNL's convention; ``step_size`` a, ``case`` 1-3): per client
a round 64·d (its gradient) + 3·64·d (the three vectors) + 64·d in case 3 (p_i) + 64·d per line-search trial (its
gradient there).  FedNL-Public's ``DINGO`` counts 32-bit values in both directions (32·d up and down per exchange).
*Work* per client a round: one pass forms ∇O_i(x_k) and H_i; two factorizations (H_i's Cholesky factor, H_i² + φ²I's
LU; one more in case 3, for (H̃_iᵀH̃_i)⁻¹h); one pass per line-search trial.

Departures from FedNL-Public's ``DINGO``, which follows the paper elsewhere: it caps the step at 1e-2 in its first
four rounds (``n_steps < 5``, counted from 1) and floors it at 2⁻¹⁰ after the search, which the paper does not (not
done here); and in case 3 it sets p to the failing client's vector in place of adding it (the paper's mean is taken
here).  Run side by side (scripts/peers/fednl_public.py, paper_figs/evidence/fednl_public.json), this round from
each of the reference's iterates gives its next iterate to round-off once the caps are off.

Linear models with one output on rows (as FedNL), one client per worker or all m on the stacked rows.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import numpy as np
import scipy.linalg
import torch

from dane import checks
from dane.algorithm import AlgorithmConfig, Column, Finished
from dane.comm import Communicator
from dane.errors import ConfigError, NotPositiveDefinite
from dane.problems import Problem
from dane.problems.stacked_hessians import unpack
from dane.sampling import SamplingKeys, sampled_mean
from dane.work import count

from .federated import ClientBits, Federated
from .fednl_server import LS_TRIALS
from .newton_star import VALUE_BITS, linear_rows

#: the largest φ whose square is a finite float64 (√ of its largest value): φ² I enters H_i² + φ²I
PHI_MAX = math.sqrt(sys.float_info.max)


def client_vectors(H: np.ndarray, g: np.ndarray, phi: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(H g, H⁻¹g, (H² + φ²I)⁻¹ H g) of one client's symmetric positive definite Hessian H (else one line)."""
    Hg = H @ g
    try:
        factor = scipy.linalg.cho_factor(H, lower=True)
    except np.linalg.LinAlgError:
        raise NotPositiveDefinite("the local Hessian is not positive definite on this shard (DINGO's H_i^-1 g is a "
                                  "Cholesky solve); use problem.lam > 0") from None
    inverse = scipy.linalg.cho_solve(factor, g)
    regularized = np.linalg.solve(H @ H + phi * phi * np.eye(len(g)), Hg)
    return Hg, inverse, regularized


def fallback(H: np.ndarray, hat: np.ndarray, h: np.ndarray, phi: float, floor: float) -> np.ndarray:
    """Case 3's p_i (module docstring): −H̃†g̃, moved along −(H̃ᵀH̃)⁻¹h until ⟨p_i, h⟩ = −θ‖g‖² (``floor`` = θ‖g‖²)."""
    if hat @ h >= floor:
        return -hat
    solved = np.linalg.solve(H @ H + phi * phi * np.eye(len(h)), h)
    return -hat - (floor - hat @ h) / (h @ solved) * solved


class DINGO(ClientBits, Federated):
    """DINGO on one worker = one client, or all m on stacked rows (module docstring)."""

    name = "dingo"
    needs_rows = True  # its clients' rows (`baselines.newton_star.linear_rows`)
    label = "DINGO"
    batchable = True
    stacked_needs = "oracles"
    columns = (*Federated.columns, Column("step_size", "{:>9.3g}"), Column("case", "{:>4d}"),
               Column("clients_uplink_bits", "{:>12.4g}"))
    summary_keys = (*Federated.summary_keys, "clients_uplink_bits")

    def __init__(self, problem: Problem, comm: Communicator, *, theta: float = 1e-4, phi: float = 1e-6,
                 rho: float = 1e-4, sampling: SamplingKeys, seed: int = 0):
        super().__init__(problem, comm, sampling=sampling, seed=seed)
        self.clients = linear_rows(problem, comm, self.name)
        self.d, self.theta, self.phi, self.rho = self.clients.d, theta, phi, rho
        self.uplink_bits = 0

    def mean_gradient(self, w: torch.Tensor) -> np.ndarray:
        """∇O(w): one allreduce of the clients' gradients (a line-search trial)."""
        (g,) = self.comm.allreduce_mean([self.local_grad(w)])
        return g.to(torch.float64).numpy()

    def round(self) -> dict[str, float]:
        x, d = self.w.numpy(), self.d
        members = self.sampler.draw_all()
        grads, compact = self.clients.gradients_hessians(x)                              # ∇O_i, ∇²O_i: one pass
        (g,), reduced = sampled_mean(self.comm, members, [self.own(grads)], self.payload(self.w),  # g = ∇O(x_k)
                                     ride_kinds=self.ride_kinds())
        g = g.to(torch.float64).numpy()
        hessians = unpack(self.clients.expand(compact), d)                               # H_i, (clients, d, d)
        vectors = np.stack([np.concatenate(client_vectors(H, g, self.phi)) for H in hessians])
        count("local_factorizations", 2.0)  # per client: H_i's Cholesky factor, H_i² + φ²I's LU
        (means,) = self.comm.allreduce_mean([self.own(vectors)])
        h, inverse, hat = np.split(means.numpy(), 3)
        floor, sent = self.theta * float(g @ g), 4 * d
        if h @ inverse >= floor:
            case, p = 1, -inverse
        elif h @ hat >= floor:
            case, p = 2, -hat
        else:
            case, sent = 3, sent + d
            mine = np.stack([fallback(H, v[2 * d:], h, self.phi, floor) for H, v in zip(hessians, vectors)])
            count("local_factorizations", 1.0)  # per client: H_i² + φ²I's LU again, for h
            (p,) = self.comm.allreduce_mean([self.own(mine)])
            p = p.numpy()
        a, trials = 0.0, 0
        if np.isfinite(p).all():  # else no trial is finite: the round keeps x_k and the run ends (`not_finite`)
            a, slope = 1.0, 2 * self.rho * float(p @ h)
            for trials in range(1, LS_TRIALS + 1):                                    # on ‖∇O‖²
                trial = self.mean_gradient(self.w + torch.from_numpy(a * p).to(self.w.dtype))
                if trial @ trial <= g @ g + a * slope:
                    break
                a *= 0.5
            else:
                a = 0.0
        else:
            self.ended = self.not_finite(case, floor)
        if a > 0:  # a = 0 keeps x_k
            self.w = self.w + torch.from_numpy(a * p).to(self.w.dtype)
        self.count(len(members), VALUE_BITS * (sent + trials * d), down=(2 + trials + (case == 3)) * d)
        return {**self.record(reduced, members), "step_size": a, "case": case,
                "clients_uplink_bits": self.uplink_bits}

    def not_finite(self, case: int, floor: float) -> Finished:
        """The run's end where the round's direction p is not finite (the same p, so the same verdict, on every
        worker): case 3's λ_i = (θ‖g‖² − ⟨H̃_i†g̃, h⟩)/⟨h, (H̃_iᵀH̃_i)⁻¹h⟩ overflows at a θ‖g‖² that is not finite or
        huge; the remedy names θ where it is above the paper's 1e-4, else none (the divergence line's guesses)."""
        why = f"DINGO's direction p is not finite (case {case}, θ‖g‖² = {floor:.3g}); the round kept x_k"
        remedy = f"set algorithm.theta below {self.theta:g} (the paper's is 1e-4)" if self.theta > 1e-4 else None
        return Finished("diverged", why, remedy)


@dataclass(frozen=True)
class DINGOConfig(AlgorithmConfig, SamplingKeys):
    theta: float = 1e-4
    phi: float = 1e-6
    rho: float = 1e-4
    seed: int = 0
    name: str = "dingo"
    algorithm = DINGO

    def __post_init__(self) -> None:
        checks.positive("algorithm.theta", self.theta)
        if checks.positive("algorithm.phi", self.phi) > PHI_MAX:
            raise ConfigError(f"algorithm.phi must be at most {PHI_MAX:.4g}, got {self.phi}: φ² enters H_i² + φ²I and "
                              f"must be a finite float; the paper's is 1e-6")
        if not 0 < checks.positive("algorithm.rho", self.rho) < 1:
            raise ConfigError(f"algorithm.rho must be in (0, 1), got {self.rho}: DINGO's Armijo constant (Crane & "
                              f"Roosta 2019 take ρ ∈ (0, 1); from 1 on no step passes on a quadratic, and each round "
                              f"keeps x_k); the default is 1e-4")
        self.check_sampling()
        self.refuse_sampling("dingo", "its step needs every client's gradient and Hessian products")
        checks.seed("algorithm.seed", self.seed)

    def build(self, problem: Problem, comm: Communicator) -> DINGO:
        return DINGO(problem, comm, theta=self.theta, phi=self.phi, rho=self.rho, sampling=self, seed=self.seed)
