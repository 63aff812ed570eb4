r"""The reference optimum of a convex problem, computed by the workers themselves and cached on disk; a run makes it
before its clock and counters start (`dane.loop.reference`).

Suboptimality :math:`O(w_t) - O^*` is a research measurement, not a precondition of a
run, so a run asks for it (``problem.optimum``):

- ``none``: no reference.  Records carry ``grad_norm``, and ``tol`` applies to
  :math:`\|\nabla O(w_t)\| / \|\nabla O(w_0)\|` (`dane.loop.stopping.StopRule`).
- ``auto``: the problem's closed form when it has one (``ridge_synthetic``); otherwise the
  cached reference for this data set and objective, and when there is none yet, a
  distributed solve by the run's own workers (`distributed_newton`), each holding only
  its shard, before round 0.  Its cost is not in the run's records: the counters and the
  clock start after it, and the solve's own rounds and seconds are in the run's notes.
- a file: ``.pt`` (a tensor, or a dict with ``w`` as this module writes), ``.npy`` or
  ``.npz`` (array ``w``), holding w*.  O* is always O(w*) evaluated by the run's workers
  (one allreduce), so suboptimality is exact on every backend.

*The distributed solve.*  Newton's method on :math:`O = \frac1m\sum_i O_i`, started at the
problem's initial point, with the Newton system :math:`H v = g` solved by conjugate
gradient on the global Hessian (each product :math:`Hu = \frac1m\sum_i \nabla^2O_i(w)u` is
one allreduce), preconditioned, as in DiSCO (Zhang & Xiao 2015), by worker 0's own
:math:`\nabla^2 O_0(w)` (solved on worker 0 and broadcast) when its problem factors a dense
Hessian, and unpreconditioned otherwise.  The step length comes from a backtracking
(Armijo) search whose candidate objectives share one allreduce.  Near the optimum the
forcing term :math:`\min(\tfrac12, \sqrt{\|g\|/\|g_0\|})` of the inexact Newton method
(Dembo, Eisenstat & Steihaug 1982) becomes 1e-14, and the method stops once the gradient
norm stops falling: the reference is as accurate as float64 allows on this data, and its
final ‖∇O(w*)‖ is recorded beside it.  The solve is in float64 whatever the run's dtype: a
float32 run's workers solve on float64 copies of their shards (`LinearModelShard.with_dtype`,
released after it), and its O* is O(w*) as the run itself computes it, in float32 (one more
allreduce), as for a file.

*The cache* (``$DANE_CACHE_DIR/optimum``, else ``$XDG_CACHE_HOME/dane/optimum``,
``~/.cache/dane/optimum``) is keyed by the objective (loss, λ, intercept, classes,
dimension) and by a fingerprint of the data that does not depend on how the rows are
dealt to workers, nor on the run's dtype (every reference is solved in float64; rows that
float32 rounds have other sums, so another key): the allreduced sums of a few fixed
functions of the rows (counts, random projections and their powers, the labels), rounded
to 10 significant digits so that a backend's summation order does not change the key.  The optimum of
:math:`O = \frac1N\sum_j f(x_j, y_j) + \frac\lambda2\|w\|^2` depends only on the set of rows,
so a reference made with 2 workers serves 8, and a rerun on the same data reads it in
milliseconds.
"""
from __future__ import annotations

import hashlib
import math
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..comm.threads import ThreadGroup
from ..errors import ConfigError
from ..numerics.linalg import cg
from ..numerics.local_solvers import FLAT_SLOPE
from ..records.results import atomic_write

OPTIMUM_MODES = ("auto", "none")
FINGERPRINT_DIGITS = 10
LINE_SEARCH_STEPS = 12  # candidate steps 1, 1/2, ..., 2^-11, evaluated in one allreduce


@dataclass(frozen=True)
class Reference:
    """w* and O* of the global objective, with how they were obtained."""

    w: torch.Tensor
    objective: float
    grad_norm: float | None
    source: str          # "closed form", "cache <path>", "file <path>", "distributed Newton (...)"


def check_mode(key: str, value) -> str:
    """``problem.optimum`` as a mode or a path; booleans of older configs map to auto (true) and none (false)."""
    if value is True:
        return "auto"
    if value is False or value is None:
        return "none"
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key} must be auto, none or the path of a saved optimum (.pt, .npy, .npz), got {value!r}")
    if value in OPTIMUM_MODES:
        return value
    if not value.endswith((".pt", ".npy", ".npz")):
        raise ConfigError(f"{key}={value} is neither auto, none nor a saved optimum (.pt, .npy or .npz file)")
    if not os.path.isfile(value):
        raise ConfigError(f"{key}={value}: no such file; give the path of a saved optimum, or auto or none")
    return value


# ---------------------------------------------------------------------- fingerprint and cache
def data_moments(X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Sums over a worker's rows of fixed non-negative functions of (x_j, y_j), float64.

    Sums of non-negative terms are computed to a relative accuracy of about n·eps in any
    order, so the fingerprint's rounding absorbs a backend's summation order.
    """
    gen = torch.Generator().manual_seed(20141212)
    R = torch.randn(X.shape[1], 2, generator=gen, dtype=torch.float64)
    Z = X.to(torch.float64) @ R
    y = y.to(torch.float64).reshape(len(y), -1).sum(1)
    values = X.values() if X.layout == torch.sparse_csr else X
    return torch.stack([torch.tensor(float(len(y)), dtype=torch.float64), values.to(torch.float64).square().sum(),
                        Z[:, 0].square().sum(), Z[:, 1].square().sum(), Z[:, 0].pow(4).sum(),
                        y.square().sum(), (y - Z[:, 0]).square().sum(), (y + Z[:, 1]).square().sum(),
                        torch.exp(-Z[:, 0].square()).sum()])


def fingerprint(problem, comm, objective_key: str) -> str:
    """A key for (data set, objective) that every worker agrees on, whatever the shards (one allreduce)."""
    # on the host whatever the shard's device: the same sums, so the same key, for a GPU run and a CPU run
    (total,) = comm.allreduce_mean([data_moments(problem.X.cpu(), problem.y.cpu())])
    total = (total * comm.size).tolist()
    rounded = ",".join(f"{x:.{FINGERPRINT_DIGITS}g}" for x in total)
    return hashlib.sha256(f"{objective_key}|{rounded}".encode()).hexdigest()[:32]


def cache_dir(part: str = "optimum") -> Path:
    """The folder of the package's cache ``part``: under $DANE_CACHE_DIR, else $XDG_CACHE_HOME/dane, else
    ~/.cache/dane (the reference optima of this module, ``optimum``; the synthetic ridge's closed forms,
    ``ridge_optimum``, `dane.problems.ridge`)."""
    base = os.environ.get("DANE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "dane")
    return Path(base) / part


_READ_LOCK = threading.Lock()


def read_saved(path: str | Path, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """w* from a saved optimum, or one line saying what is wrong with the file.

    One reader at a time: numpy parses an .npy header with `ast`, which CPython 3.11 does not
    allow in several threads at once (the simulator's workers all read the file).
    """
    path = str(path)
    with _READ_LOCK:
        return _read_saved(path, dim, dtype)


def _read_saved(path: str, dim: int, dtype: torch.dtype) -> torch.Tensor:
    try:
        if path.endswith(".pt"):
            saved = torch.load(path, map_location="cpu", weights_only=True)
            w = saved.get("w") if isinstance(saved, dict) else saved
        elif path.endswith(".npz"):
            with np.load(path, allow_pickle=False) as archive:
                if "w" not in archive.files:
                    raise ConfigError(f"{path} has no array named w (it has: {', '.join(archive.files) or 'none'}); "
                                      "save it with numpy.savez(path, w=w)")
                w = archive["w"]
        else:
            w = np.load(path, allow_pickle=False)
    except ConfigError:
        raise
    except Exception as exc:  # a truncated, foreign or unreadable file
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
        raise ConfigError(f"cannot read the saved optimum {path} ({type(exc).__name__}: {first}); "
                          "give a .pt, .npy or .npz file holding w*, or problem.optimum=auto") from None
    if w is None or not isinstance(w, (torch.Tensor, np.ndarray)):
        raise ConfigError(f"{path} holds no tensor w; give a .pt file saved by a run (or torch.save(w, path))")
    w = torch.as_tensor(w)
    if w.dim() != 1 or w.numel() != dim:
        raise ConfigError(f"the saved optimum {path} has shape {tuple(w.shape)} but this problem has {dim} "
                          "parameters; give the optimum of this problem (same data, loss, lam and intercept)")
    if not torch.isfinite(w).all():
        raise ConfigError(f"the saved optimum {path} holds nan or inf; recompute it with problem.optimum=auto")
    return w.to(dtype)


def save(path: Path, reference: Reference, key: str) -> None:
    """Write a reference atomically (`dane.records.results.atomic_write`: a crash or a failed write leaves the old
    file or none, never half of one, and no temporary file)."""
    saved = {"w": reference.w.detach().to(torch.float64).clone(), "objective": reference.objective,
             "grad_norm": reference.grad_norm, "key": key, "source": reference.source}
    atomic_write(path, lambda f: torch.save(saved, f))


# ---------------------------------------------------------------------- the distributed solve
def global_value_grad(problem, comm, w: torch.Tensor) -> tuple[float, torch.Tensor]:
    """(O(w), ∇O(w)): one allreduce."""
    grad, metrics = problem.evaluate(w)
    g, m = comm.allreduce_mean([grad, metrics[:1]])
    return float(m[0]), g


def distributed_newton(problem, comm, *, max_steps: int = 100) -> tuple[Reference, int]:
    """argmin O by Newton-CG across the workers (module docstring); the reference and the collectives spent."""
    calls0 = comm.calls
    w = problem.initial_point()
    value, g = global_value_grad(problem, comm, w)
    gnorm = g0 = float(torch.linalg.vector_norm(g))
    precondition = _worker0_preconditioner(problem, comm)
    best = (w, value, gnorm)
    stalls = 0
    for _ in range(max_steps):
        if gnorm == 0.0 or not math.isfinite(gnorm):
            break
        rel = gnorm / g0
        rtol = 1e-14 if problem.quadratic or rel < 1e-6 else min(0.5, math.sqrt(rel))

        def hessian_vector(u: torch.Tensor, at=w) -> torch.Tensor:
            (Hu,) = comm.allreduce_mean([problem.hessian_vector(u, at=at)])
            return Hu

        step = cg(hessian_vector, -g, rtol=rtol, max_iter=20 * problem.dim,
                  precond=(lambda r, at=w: precondition(r, at)) if precondition is not None else None).x
        w, value, g = _line_search(problem, comm, w, value, g, step)
        gnorm = float(torch.linalg.vector_norm(g))
        if gnorm < best[2]:
            best, stalls = (w, value, gnorm), 0
        else:
            stalls += 1  # round-off: the gradient norm no longer falls
            if stalls >= 2:
                break
    w, value, gnorm = best
    rounds = comm.calls - calls0
    return Reference(w, value, gnorm, f"distributed Newton-CG ({rounds} collectives)"), rounds


def _worker0_preconditioner(problem, comm):
    """P⁻¹ r with P = ∇²O_0(w), solved on worker 0 and broadcast; None unless worker 0 factors a dense Hessian."""
    cholesky = problem.solver is not None and problem.solver.method == "cholesky" and problem.strong_convexity > 0
    (flag,) = comm.broadcast([torch.tensor([float(cholesky)], dtype=torch.float64)], root=0)
    if not bool(flag.item()):
        return None

    def apply(r: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
        s = problem.solve_hessian(r, at=at, shift=0.0, with_reg=True) if comm.rank == 0 else torch.zeros_like(r)
        (s,) = comm.broadcast([s], root=0)
        return s

    return apply


def _line_search(problem, comm, w, value, g, step):
    """The largest of 1, 1/2, ... with Armijo's decrease (all candidates in one allreduce), then ∇O there.

    On a quadratic, and near the optimum where the predicted decrease is below the
    round-off of O, the full step is taken; the caller keeps the best iterate by gradient norm.
    """
    slope = float(g @ step)
    if problem.quadratic or abs(slope) <= FLAT_SLOPE * max(1.0, abs(value)):
        t = 1.0
    else:
        ts = [0.5 ** k for k in range(LINE_SEARCH_STEPS)]
        local = torch.stack([problem.objective(w + t * step) for t in ts])
        (values,) = comm.allreduce_mean([local])
        ok = [t for t, v in zip(ts, values.tolist()) if v <= value + 1e-4 * t * slope]
        t = ok[0] if ok else ts[-1]
    w = w + t * step
    value, g = global_value_grad(problem, comm, w)
    return w, value, g


# ---------------------------------------------------------------------- attach to a run
def attach(problem, comm, mode: str, objective_key: str) -> str | None:
    """Give ``problem`` its reference (``mode``: auto or a file); a note for the run's log, or None.

    Collective: every worker calls it with the same mode, and all make the same calls.
    Rank 0 alone reads and writes the cache; what it found is broadcast.
    """
    if mode == "none":
        return None
    start = time.perf_counter()
    dim, dtype = problem.dim, problem.dtype
    precision = ""
    if mode != "auto":
        w = read_saved(mode, dim, dtype)
        reference = _evaluated(problem, comm, w, f"file {mode}")
    else:
        key = fingerprint(problem, comm, objective_key)
        path = cache_dir() / f"{key}.pt"
        found = None
        if comm.rank == 0 and path.is_file():
            try:
                found = read_saved(path, dim, torch.float64)
            except ConfigError:
                found = None  # a damaged cache entry is recomputed and replaced
        (hit,) = comm.broadcast([torch.tensor([float(found is not None)], dtype=torch.float64)], root=0)
        in_float64 = problem.with_dtype(torch.float64)  # the shard itself in a float64 run
        if bool(hit.item()):
            w = found if comm.rank == 0 else torch.zeros(dim, dtype=torch.float64)
            (w,) = comm.broadcast([w], root=0)
            reference = _evaluated(in_float64, comm, w, f"cache {path}")
        else:
            reference, _ = distributed_newton(in_float64, comm)
            if comm.rank == 0:
                try:
                    save(path, reference, objective_key)
                except OSError as exc:  # a read-only or full cache: the run goes on, recomputing next time
                    reference = Reference(reference.w, reference.objective, reference.grad_norm,
                                          f"{reference.source}; not cached ({exc.strerror or exc})")
        if in_float64 is not problem:  # O* as this run computes it; ‖∇O(w*)‖ stays the float64 solve's
            value, _ = global_value_grad(problem, comm, reference.w.to(dtype))
            reference = Reference(reference.w, value, reference.grad_norm, reference.source)
            precision = f" (w* and ||grad O(w*)|| in float64, O* = O(w*) in this run's {str(dtype)[6:]})"
    problem.set_reference(reference.w.to(dtype), reference.objective)
    norm = f"{reference.grad_norm:.2e}" if reference.grad_norm is not None else "not recorded"
    return (f"reference optimum from {reference.source} in {time.perf_counter() - start:.2f} s: "
            f"O* = {reference.objective:.17g}, ||grad O(w*)|| = {norm}{precision}")


def _evaluated(problem, comm, w: torch.Tensor, source: str) -> Reference:
    """A reference whose O* and ‖∇O(w*)‖ the workers evaluate at a given w* (one allreduce).

    O* is always O(w*) as this run computes it, so that suboptimality is exactly
    O(w_t) − O(w*) on every backend, whatever a file says.
    """
    value, g = global_value_grad(problem, comm, w)
    return Reference(w, value, float(torch.linalg.vector_norm(g)), source)


def asks_reference(config) -> bool:
    """Whether a problem config asks for a reference optimum (``optimum`` not none, with an ``attach_reference``)."""
    return config.attach_reference is not None and config.optimum != "none"


def attach_shards(config, problems) -> None:
    """``config.attach_reference`` for m simulated workers' built ``problems``, in a thread group of its own (its
    clock is not the run's); no group where no reference is asked for (its m threads would do nothing)."""
    if asks_reference(config):
        ThreadGroup(len(problems)).run(lambda comm: config.attach_reference(problems[comm.rank], comm))


def solve(problems) -> Reference:
    """The reference of m built worker shards, by `distributed_newton` on m threads (notebooks and tests)."""
    return ThreadGroup(len(problems)).run(lambda comm: distributed_newton(problems[comm.rank], comm)[0])[0]
