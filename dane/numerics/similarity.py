r"""Hessian dissimilarity δ: how far each worker's local Hessian is from the global one.

With O(w) = (1/m) Σ_i O_i(w), H_i = ∇²O_i(w) and H = ∇²O(w) = (1/m) Σ_i H_i, the DANE
line's rates (DANE, S-DANE, FedRed; docs/federated.md) are stated in

    δ    = max_i ‖H_i − H‖₂                        (``delta``)
    δ_A  = ( (1/m) Σ_i ‖H_i − H‖₂² )^{1/2}         (``delta_mean_square``)
    δ_F  = ( (1/m) Σ_i ‖H_i − H‖_F² )^{1/2}        (``delta_frobenius``)

measured here on the problem's own O_i, the ones the algorithm runs on (a worker with
more rows has a larger O_i: its weight is m/N per row), at a point w. The regularizer,
shared by every O_i, cancels. Identical shards give δ = 0.

`hessian_dissimilarity` is collective: every worker calls it at the same w and all get
the same numbers. Two methods, from Hessian-vector products only:

- ``exact`` (d ≤ ``exact_dim``): each worker forms H_i from d products, one allreduce
  of H_i (d x d) gives H, and the eigenvalues of H_i − H (``torch.linalg.eigvalsh``) give
  ‖·‖₂ and ‖·‖_F exactly; one more allreduce of an m-vector gathers them. 2 allreduces.
- ``lanczos`` (no d x d matrix): m + 1 Lanczos processes in lockstep, one per operator
  D_j = H_j − H and one for H, each started from its own seeded vector, with full
  reorthogonalisation (as `baselines.spectral.lanczos_extremes`). Every worker runs all
  m + 1 processes (the same arithmetic on the same numbers, so the same result), so
  an iteration needs one allreduce: worker i sends H_i q_p for every process p and, in
  its own row of an m x d block, H_i q_i; the mean gives H q_p and (times m) every
  H_j q_j, hence D_j q_j = H_j q_j − H q_j. ‖D_j‖₂ is the largest |Ritz value| of
  process j; it never exceeds the true norm and is exact once the Krylov space is
  invariant (at the latest after d iterations). δ_F is Hutchinson's estimate
  ‖D‖_F² ≈ (1/s) Σ_k ‖D z_k‖² over ``probes`` shared Rademacher vectors z_k (unbiased),
  whose products ride in the first allreduce. ``iters`` + 1 allreduces of (2m + 1 + s)
  d-vectors; each worker does m + 1 products per iteration and holds (m + 1)·iters d-vectors.

The collectives are kept off the run's accounting (`dane.comm.Communicator.uncounted`: this
worker's counters and its backend's, comm=ps's links and servers), and the dict says what the
measurement cost (``allreduces``, ``bytes_sent``); ``counted=True`` counts them as the caller's
traffic (a default rule's measurement, `baselines.measure`). A simulator's clock is its own:
run the measurement in a thread group of its own (`measure`), as `dane.loop.reference.attach_all`
does.
"""
from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Callable, Sequence

import torch

from dane.comm import Communicator
from dane.errors import ConfigError

METHODS = ("auto", "exact", "lanczos")
EXACT_DIM = 512  # auto: exact up to this d (d products and a d x d allreduce), Lanczos above


def hessian_dissimilarity(problem, comm: Communicator, w: torch.Tensor, *, method: str = "auto",
                          iters: int = 30, probes: int = 8, exact_dim: int = EXACT_DIM, seed: int = 0,
                          gap_shift: float | None = None, counted: bool = False) -> dict:
    """Collective: δ, δ_A and δ_F of the workers' Hessians at ``w`` (module docstring), the same on every worker.

    ``problem`` is this worker's shard, with ``hessian_vector(v, at=w, with_reg=False)`` (∇²O_i(w) v).
    ``method``: exact | lanczos | auto (exact when d ≤ ``exact_dim``). ``iters`` (lanczos): products per
    operator, capped at d. ``probes`` (lanczos): Hutchinson vectors for δ_F. ``seed``: the start and probe
    vectors. Returns a dict of floats: ``delta``, ``delta_mean_square``, ``delta_frobenius``,
    ``hessian_norm`` (‖H‖₂ without the regularizer), ``per_worker`` (‖H_i − H‖₂ for i < m; rank 0's only), ``method``,
    ``allreduces`` and ``bytes_sent`` (what the measurement cost; on no counter unless ``counted``).
    With ``gap_shift`` (r ≥ 0, the regularizer's curvature) the exact method also returns `preconditioner_gap`'s
    curve: ``gap_weights`` (λ_k = ‖H‖·2^-k), ``gap`` (its mean over the workers at each λ_k) and
    ``curvature_min`` (λ_min(H)), riding in the same two allreduces.
    """
    if method not in METHODS:
        raise ConfigError(f"similarity method must be one of {'|'.join(METHODS)}, got {method!r}")
    for key, value in (("iters", iters), ("probes", probes), ("exact_dim", exact_dim)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"similarity {key} must be a positive integer, got {value!r}")
    if not callable(getattr(problem, "hessian_vector", None)):
        raise ConfigError(f"Hessian dissimilarity needs Hessian-vector products, which {type(problem).__name__} "
                          "does not provide; measure it on a convex problem (ridge, logreg, softmax)")
    dim = int(problem.dim)
    use_exact = method == "exact" or (method == "auto" and dim <= exact_dim)
    hv = _hessian_product(problem, w)
    with nullcontext() if counted else comm.uncounted():
        counters = (comm.bytes_sent, comm.calls)
        if use_exact:
            result = _exact(hv, dim, problem.dtype, comm, gap_shift)
        else:
            result = _lanczos(hv, dim, problem.dtype, comm, iters=min(iters, dim), probes=probes, seed=seed)
        result["allreduces"] = comm.calls - counters[1]
        result["bytes_sent"] = comm.bytes_sent - counters[0]
    return result


def offered(problem) -> bool:
    """Whether δ is measured for ``problem``: a convex one with Hessian-vector products (a run's summary hook
    asks this on every worker, so all of them call `hessian_dissimilarity` or none does)."""
    return bool(getattr(problem, "convex", True)) and callable(getattr(problem, "hessian_vector", None))


def measure(problems: Sequence, w: torch.Tensor, **options) -> dict:
    """`hessian_dissimilarity` of m built shards (simulated workers) in a thread group of its own."""
    from dane.comm.threads import ThreadGroup

    return ThreadGroup(len(problems)).run(
        lambda comm: hessian_dissimilarity(problems[comm.rank], comm, w, **options))[0]


def _hessian_product(problem, w: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    at = w.detach().to(problem.dtype)
    return lambda v: problem.hessian_vector(v, at=at, with_reg=False)


def _summary(per_worker: torch.Tensor, frobenius_sq: torch.Tensor, hessian_norm: float, method: str,
             rank: int) -> dict:
    """The result's numbers; ``per_worker`` on rank 0 alone (the worker that writes): m simulated workers would
    otherwise hold m lists of m floats."""
    norms = per_worker.tolist()
    return {
        "delta": max(norms),
        "delta_mean_square": math.sqrt(sum(x * x for x in norms) / len(norms)),
        "delta_frobenius": math.sqrt(max(float(frobenius_sq.mean()), 0.0)),
        "hessian_norm": hessian_norm,
        **({"per_worker": norms} if rank == 0 else {}),
        "method": method,
    }


def _gather(values: Sequence[float], dtype: torch.dtype, comm: Communicator) -> torch.Tensor:
    """Every worker's ``values`` (a size x len(values) tensor): one collective (`Communicator.gather`)."""
    every, _ = comm.gather(torch.tensor(values, dtype=dtype))
    return every


def _exact(hv, dim: int, dtype: torch.dtype, comm: Communicator, gap_shift: float | None = None) -> dict:
    eye = torch.eye(dim, dtype=dtype)
    H_local = torch.stack([hv(eye[:, j]) for j in range(dim)], 1)
    H_local = 0.5 * (H_local + H_local.T)  # symmetric to round-off: symmetrize so the mean is too
    (H,) = comm.allreduce_mean([H_local])
    deviation = H_local - H
    eig = torch.linalg.eigvalsh(deviation)
    spectral, frobenius_sq = float(eig.abs().max()), float((eig * eig).sum())
    hessian_norm = float(torch.linalg.eigvalsh(H).abs().max())  # eigvalsh's, with or without the gap: the same bits
    if gap_shift is None:
        every = _gather([spectral, frobenius_sq], dtype, comm)
        return _summary(every[:, 0], every[:, 1], hessian_norm, "exact", comm.rank)
    curvatures, basis = torch.linalg.eigh(H)
    weights = [hessian_norm * 2.0 ** -k for k in range(GAP_OCTAVES + 1)]
    gaps = preconditioner_gap(basis.T @ deviation @ basis, curvatures + gap_shift, weights)
    every = _gather([spectral, frobenius_sq, *gaps], dtype, comm)
    return {**_summary(every[:, 0], every[:, 1], hessian_norm, "exact", comm.rank), "gap_weights": weights,
            "gap": every[:, 2:].mean(0).tolist(), "curvature_min": float(curvatures[0])}


#: `preconditioner_gap`'s weights in `hessian_dissimilarity`: ‖H‖ down to ‖H‖·2^-this, by octaves
GAP_OCTAVES = 40


def preconditioner_gap(deviation: torch.Tensor, curvatures: torch.Tensor, weights: Sequence[float]) -> list[float]:
    r"""φ_i(λ) for each λ in ``weights``: how far a worker's proximal local model is from the global one.

    ``deviation`` is H_i − H in the eigenbasis of H + rI, ``curvatures`` that matrix's eigenvalues (r: the
    regularizer's curvature, shared by every O_i).  With K = H + (r + λ)I and A_i = K^{-1/2}(H_i − H)K^{-1/2},

    .. math:: φ_i(λ) = \max_{a \in \mathrm{eig}(A_i)} \frac{a^2}{1 + a} = \|(I + A_i)^{-1}A_i^2\|_2,

    the term by which the local preconditioner departs from the global one: K^{1/2}(H_i + (r + λ)I)^{-1}K^{1/2} =
    (I + A_i)^{-1} = I − A_i + (I + A_i)^{-1}A_i², and the A_i average to zero, so the mean over the workers is
    I + mean_i (I + A_i)^{-1}A_i², within mean_i φ_i(λ) of the identity.  It grows without bound as a worker's
    shifted Hessian nears singular (1 + a → 0: a shard without curvature where the others have it); inf where
    H_i + (r + λ)I is not positive definite."""
    out = []
    for lam in weights:
        if float(curvatures.min()) + lam <= 0.0:  # not convex here: K is not positive definite
            out.append(math.inf)
            continue
        scale = (curvatures + lam).rsqrt()
        a = torch.linalg.eigvalsh(scale[:, None] * deviation * scale[None, :])
        out.append(math.inf if float(a.min()) <= -1.0 else float((a * a / (1.0 + a)).max()))
    return out


def _lanczos(hv, dim: int, dtype: torch.dtype, comm: Communicator, *, iters: int, probes: int, seed: int) -> dict:
    m, rank = comm.size, comm.rank
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(m + 1, dim, generator=generator, dtype=torch.float64).to(dtype)  # process p < m: D_p; m: H
    q = q / torch.linalg.vector_norm(q, dim=1, keepdim=True)
    z = (torch.randint(0, 2, (probes, dim), generator=generator) * 2 - 1).to(dtype)  # Rademacher probes
    basis, alphas, betas = [q], [], []
    active = torch.ones(m + 1, dtype=torch.bool)  # a process whose Krylov space became invariant stops
    frobenius_local, scale = None, 0.0
    for k in range(iters):
        products = torch.stack([hv(v) for v in q])  # H_rank q_p for every process p
        own = torch.zeros(m, dim, dtype=dtype)
        own[rank] = products[rank]
        payload = [products, own]
        if k == 0:
            local_probes = torch.stack([hv(v) for v in z])
            payload.append(local_probes)
        reduced = comm.allreduce_mean(payload)
        Hq, own_all = reduced[0], reduced[1] * m
        if k == 0:
            diff = local_probes - reduced[2]  # (H_rank − H) z_k
            frobenius_local = float((diff * diff).sum()) / probes
        Aq = Hq.clone()
        Aq[:m] = own_all - Hq[:m]  # D_j q_j = H_j q_j − H q_j
        alpha = (q * Aq).sum(1)
        stacked = torch.stack(basis, 1)  # (m + 1) x k x d
        r = Aq
        for _ in range(2):  # Gram-Schmidt twice keeps each basis orthogonal to round-off
            r = r - torch.einsum("pkd,pk->pd", stacked, torch.einsum("pkd,pd->pk", stacked, r))
        beta = torch.linalg.vector_norm(r, dim=1)
        alphas.append(torch.where(active, alpha, torch.zeros_like(alpha)))
        scale = max(scale, float(alpha.abs().max()))  # about ‖H‖ (process m), the scale of every D_j's round-off
        if k == iters - 1:
            break
        active = active & (beta > 1e-12 * scale)
        if not bool(active.any()):
            break
        betas.append(torch.where(active, beta, torch.zeros_like(beta)))
        q = torch.where(active[:, None], r / torch.where(active, beta, torch.ones_like(beta))[:, None],
                        torch.zeros_like(r))
        basis.append(q)
    extremes = [_ritz_extremes([float(a[p]) for a in alphas], [float(b[p]) for b in betas]) for p in range(m + 1)]
    spectral = torch.tensor([max(abs(lo), abs(hi)) for lo, hi in extremes[:m]], dtype=torch.float64)
    every = _gather([frobenius_local], dtype, comm)
    return _summary(spectral, every[:, 0], max(abs(v) for v in extremes[m]), "lanczos", rank)


def _ritz_extremes(alphas: list[float], betas: list[float]) -> tuple[float, float]:
    """Smallest and largest eigenvalues of the tridiagonal matrix, cut where a process stopped (β = 0)."""
    size = len(alphas)
    for j, b in enumerate(betas):
        if b == 0.0:
            size = j + 1
            break
    T = torch.diag(torch.tensor(alphas[:size], dtype=torch.float64))
    off = torch.tensor(betas[:size - 1], dtype=torch.float64)
    T = T + torch.diag(off, 1) + torch.diag(off, -1)
    ritz = torch.linalg.eigvalsh(T)
    return float(ritz[0]), float(ritz[-1])
