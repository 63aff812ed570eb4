"""The statistics the federated line's default rules read (`baselines.defaults`), measured before round 0.

Each is counted as the run's communication (the allreduces and their bytes appear in round 0's ``comm_rounds`` and
``bytes_sent``), as it was when the algorithm classes measured them themselves.
"""
from __future__ import annotations

import numpy as np
import torch

from dane.comm import Communicator
from dane.comm.batched import stacked
from dane.errors import ConfigError
from dane.problems import Problem
from dane.problems.stacked_rows import shard_rows
from dane.numerics.similarity import hessian_dissimilarity as measured_dissimilarity

from .defaults import dissimilarity
from .spectral import largest_local_smoothness
from .spectral_stacked import local_spectra


def hessian_dissimilarity(problem: Problem, comm: Communicator, key: str, *, gap: bool = False) -> dict:
    r"""`dane.numerics.similarity.hessian_dissimilarity` of the local Hessians at w_0 (exact for d ≤ 512: two allreduces, the
    d x d Hessians then an m-vector; Lanczos beyond), counted as this run's communication, with ``delta_a`` =
    `baselines.defaults.dissimilarity`.  ``gap``: also the preconditioner gap's curve (exact method only;
    `dane.numerics.similarity.preconditioner_gap`), shifted by the problem's strong convexity (``shift``)."""
    if problem.hessian_vector is None:
        raise ConfigError(f"{key}=null is the Hessian dissimilarity of the local Hessians, which "
                          f"{type(problem).__name__} cannot give (no Hessian-vector products); set {key} to a number")
    shift = float(problem.strong_convexity or 0.0) if gap else None
    found = measured_dissimilarity(problem, comm, problem.initial_point(), gap_shift=shift, counted=True)
    return {**found, "delta_a": dissimilarity(found["delta_mean_square"], found["hessian_norm"]), "shift": shift}


def largest_smoothness(problem: Problem, comm: Communicator, *, iters: int, seed: int,
                       per: torch.Tensor | None = None) -> float:
    """max_i L_i (``per``: max_i L_i / per_i, this worker's divisor, (m, 1) on a stacked problem): a local Lanczos
    each, every worker's gathered by one collective (`baselines.spectral.largest_local_smoothness`; every worker's
    at once on a stacked problem)."""
    if not stacked(comm):
        return largest_local_smoothness(problem, comm, iters=iters, seed=seed, per=per)
    high, _ = highest_and_lowest(problem, comm, iters=iters, seed=seed, key="algorithm.lr")
    every, _ = comm.gather(high if per is None else high / per.to(high))
    return float(every.max())


def smoothness_and_lowest(problem: Problem, comm: Communicator, *, iters: int, seed: int,
                          key: str = "algorithm.lr") -> tuple[float, float]:
    """(max_i L_i, mean_i λ_min(H_i)) from one local Lanczos each and one collective (SCAFFOLD's ``lr`` null)."""
    high, low = highest_and_lowest(problem, comm, iters=iters, seed=seed, key=key)
    every, (mean_low,) = comm.gather(high, [low])
    return float(every.max()), float(mean_low)


def mean_lowest(problem: Problem, comm: Communicator, *, iters: int, seed: int, key: str) -> float:
    """mean_i λ_min(H_i): a local Lanczos each, one allreduce of a scalar (Scaffnew's ``p`` null)."""
    _, low = highest_and_lowest(problem, comm, iters=iters, seed=seed, key=key)
    (mean_low,) = comm.allreduce_mean([low])
    return float(mean_low)


def highest_and_lowest(problem: Problem, comm: Communicator, *, iters: int, seed: int,
                       key: str) -> tuple[torch.Tensor, torch.Tensor]:
    """([L_i], [λ_min(H_i)]) from this worker's local Lanczos (`local_spectra`), ready for `Communicator.gather` and
    an allreduce; on a stacked problem every worker's, row i worker i's: (m, 1) each."""
    spectra = local_spectra(problem, iters=iters, seed=seed, key=key)
    if stacked(comm):
        return spectra[:, 1:2].to(problem.dtype), spectra[:, 0:1].to(problem.dtype)
    low, high = spectra
    point = problem.initial_point()
    return point.new_tensor([high]), point.new_tensor([low])


def smoothness_moments(problem: Problem, comm: Communicator, *, iters: int, seed: int,
                       key: str = "algorithm.lr") -> dict[str, float]:
    """The constants of the compressed methods' step rules, from GD's local Lanczos (`local_spectra`: each worker's
    extreme Ritz values, no communication; every worker's at once on a stacked problem) and one collective:
    ``max`` = max_i L_i, ``mean`` = L̄ = mean_i L_i (≥ the global L), ``rms`` = sqrt(mean_i L_i²) and
    ``mean_lowest`` = mean_i λ_min(H_i)."""
    high, low = highest_and_lowest(problem, comm, iters=iters, seed=seed, key=key)
    every, (moments,) = comm.gather(high, [torch.cat([low, high, high * high], -1)])
    return {"max": float(every.max()), "mean": float(moments[1]), "rms": float(moments[2]) ** 0.5,
            "mean_lowest": float(moments[0])}


def mean_row_cubes(problem: Problem, comm: Communicator) -> float:
    """(1/N)Σ_j ‖a_j‖³ over every worker's rows a_j (FedNL-CR's M, `baselines.defaults.cubic_constant`): each worker's
    row weight m/N times its Σ‖a_j‖³, one allreduce of a scalar (every worker's at once on the stacked rows)."""
    if stacked(comm):
        cubes = row_norms(problem.X) ** 3
        local = torch.from_numpy(problem.weight * np.bincount(problem.row_client, weights=cubes,
                                                              minlength=problem.stacked_workers)[:, None])
    else:
        local = torch.tensor([problem.weight * (row_norms(shard_rows(problem)) ** 3).sum()], dtype=torch.float64)
    (mean,) = comm.allreduce_mean([local])
    return float(mean.reshape(-1)[0])


def row_norms(X) -> np.ndarray:
    """‖a_j‖ of each row of a SciPy sparse matrix."""
    return np.sqrt(np.asarray(X.multiply(X).sum(1)).ravel())
