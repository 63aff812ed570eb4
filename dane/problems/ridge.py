r"""Ridge regression, synthetic (docs/design.md, "The source paper's experiments") or from given data.

.. math:: O(w) = \frac1N \sum_{j=1}^N (\langle x_j, w\rangle - y_j)^2 + \lambda\|w\|^2

Worker i's shard S_i enters its local objective with weight m/N,
:math:`O_i(w) = \frac{m}{N}\sum_{j\in S_i}(\langle x_j, w\rangle - y_j)^2 + \lambda\|w\|^2`,
so that the mean of the O_i is exactly O even when N is not a multiple of m.

*Synthetic rows, made by the worker that holds them.*  `dane.data.sharding.iid_shards` deals the rows
by a seeded permutation π (`dane.data.sharding.iid_permutation`): worker r of m holds π[k] for the
positions k of the r-th of m contiguous parts of 0..N-1.  Row π[k] of the data set is position k of a stream cut into
blocks of `ROW_BLOCK` positions; block b draws the x's of its positions (d standard
normals each, then scaled for ``decay``) and their noises from two generators of its own,
seeded (seed, `X_STREAM`, b) and (seed, `NOISE_STREAM`, b).  So the data set is a function of (N, d, covariance,
noise_std, seed) alone, the same for every number of workers, and a worker draws only
the blocks its positions fall in; the last block drawn is kept (`_shared_block`), so that
m shards built in rank order draw each block once even when a shard has a few rows.

*Reference optimum.*  w* = argmin O is computed once from the stream in chunks (the Gram
matrix XᵀX accumulated chunk by chunk, then one Cholesky solve; CG on the full X when
d > `AUTO_MAX_DIM`), kept per process, and kept on disk under
``$DANE_CACHE_DIR/ridge_optimum`` (default ``~/.cache/dane/ridge_optimum``: `dane.problems.optimum.cache_dir`)
when computing it costs at least `DISK_CACHE_MIN_WORK` multiply-adds: a synthetic problem's closed form, which is
``problem.optimum=auto`` here (`dane.problems.optimum`).  ``problem.optimum=none`` skips it: the
records then carry no suboptimality and ``tol`` applies to the relative gradient norm.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import checks
from ..data.sharding import iid_permutation, iid_shards
from ..errors import ConfigError
from ..numerics.linalg import capacitance_factor, cg, woodbury_solve
from ..numerics.local_solvers import AUTO_MAX_DIM, LocalSolver, SolverNotes
from ..losses import SQUARED
from ..seeds import worker_seed
from ..records.results import atomic_write
from ..work import count_once, counted, rows_fraction
from .base import ProblemConfig
from .glm import SOLVER_STREAM, LinearModelShard, SolverOptions
from .optimum import OPTIMUM_MODES, cache_dir, check_mode
from .quadratic import FACTORIZATIONS, QuadraticProblem, auto_factorization, not_positive_definite, note_factorization

COVARIANCES = ("iso", "decay")
ROW_BLOCK = 256                       # stream positions per seeded block
X_STREAM, NOISE_STREAM = 2, 3         # after the permutation's, `dane.data.sharding.PERMUTATION_STREAM`
OPTIMUM_CHUNK = 16 * ROW_BLOCK        # rows per chunk when the optimum's Gram matrix is accumulated
DISK_CACHE_MIN_WORK = 1e9             # N d^2 below this: recomputing the optimum is cheap, no file is written
GRAM_BLOCK = 256                      # columns per panel of `gram`
WOODBURY_FACTORS = 2                  # low-rank capacitance factors kept: DANE's safeguard moves μ up, rarely back


@dataclass(frozen=True)
class RidgeSyntheticConfig(SolverOptions, ProblemConfig):
    """y = <x, w*> + noise, x ~ N(0, Σ), w* = all ones; Σ = I (iso) or diag(j^-1.2) (decay: feature j scaled by j^-0.6).

    ``optimum``: compute the reference optimum (records carry suboptimality).
    ``factorization``: how the exact (Cholesky-path) local solve factors A_i + μI:
    ``cholesky`` per μ, ``eigh`` once for every μ, ``woodbury`` (the n_i x n_i matrix of the
    Woodbury identity, per μ), or ``auto``: woodbury when a worker has fewer rows than d,
    else cholesky then eigh (`dane.problems.quadratic`).
    """

    n_samples: int = 18000
    dim: int = 500
    lam: float = 0.005
    covariance: str = "iso"
    noise_std: float = 1.0
    seed: int = 0
    optimum: Any = "auto"
    factorization: str = "auto"
    device: str = "cpu"          # cpu | cuda | auto: where the shards live (`RidgeShard`, dane/problems/linear_models.py)
    name: str = "ridge_synthetic"

    def __post_init__(self) -> None:
        checks.positive_int("problem.n_samples", self.n_samples)
        checks.positive_int("problem.dim", self.dim)
        checks.nonnegative("problem.lam", self.lam)
        checks.one_of("problem.covariance", self.covariance, COVARIANCES)
        checks.nonnegative("problem.noise_std", self.noise_std)
        object.__setattr__(self, "optimum", check_mode("problem.optimum", self.optimum))
        if self.optimum not in OPTIMUM_MODES:
            raise ConfigError(f"problem.optimum={self.optimum}: ridge_synthetic has a closed-form optimum; "
                              "use problem.optimum=auto (it) or none")
        checks.one_of("problem.factorization", self.factorization, FACTORIZATIONS)
        from .neural import DEVICES

        checks.one_of("problem.device", self.device, DEVICES)
        self.solver  # validates the local-solver keys now

    @property
    def data_key(self) -> tuple:
        return (self.n_samples, self.dim, self.covariance, float(self.noise_std), self.seed)

    def check_workers(self, workers: int) -> None:
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("problem.device=cuda but torch sees no CUDA device; use problem.device=auto or cpu")
        if self.n_samples < workers:
            raise ConfigError(
                f"problem.n_samples={self.n_samples} is fewer than workers={workers}; "
                f"every worker needs at least one sample: raise n_samples or use fewer workers"
            )

    def low_rank(self, workers: int) -> bool:
        """Whether every one of ``workers`` shards solves exactly by Woodbury's n_i x n_i matrices, no d x d one."""
        return uses_woodbury(self.factorization, -(-self.n_samples // workers), self.dim)

    def prepare(self) -> None:
        """Compute (or load) the reference optimum, so that `build` does only a worker's own work."""
        if self.optimum == "auto":
            reference_optimum(*self.data_key, float(self.lam))

    def stacked_form(self, size: int) -> str | None:
        """The batched simulator needs equal shards solved exactly (`dane.problems.stacked.StackedRidge`)."""
        if self.n_samples % size:
            return (f"problem.n_samples={self.n_samples} does not split into {size} equal shards (a multiple of "
                    f"workers does)")
        method = self.solver.resolve(self.dim, sparse=False).method
        if method != "cholesky":
            return f"problem.local_solver={method} has no batched form (the exact solve, auto or cholesky, has)"
        return None

    def build_stacked(self, size: int, dtype: torch.dtype = torch.float64):
        """The ``size`` shards of `build`, row for row, stacked into one `StackedRidge` (equal shards only)."""
        from .neural import pick_device
        from .stacked import StackedRidge

        self.check_workers(size)
        X, y = synthesize(*self.data_key)  # all rows in row order; shard r is rows iid_shards(...)[r], as `build` has
        rows = torch.stack(iid_shards(self.n_samples, size, self.seed))
        w_star = reference_optimum(*self.data_key, float(self.lam)).to(dtype) if self.optimum == "auto" else None
        n = self.n_samples // size
        notes = SolverNotes(self.solver, also={"problem.factorization": "auto_factorization"}
                            if self.factorization == "auto" else {})  # as worker 0's `RidgeShard` (cholesky) notes
        notes.worker = 0
        return StackedRidge(X[rows].to(dtype), y[rows].to(dtype), self.lam, scale=size / self.n_samples,
                            w_star=w_star, low_rank=uses_woodbury(self.factorization, n, self.dim),
                            device=pick_device(self.device, 0), solver_notes=notes, factorization=self.factorization)

    def build(self, rank: int, size: int, dtype: torch.dtype = torch.float64) -> QuadraticProblem:
        self.check_workers(size)
        X, y = synthesize(*self.data_key, *shard_positions(self.n_samples, size, rank))
        w_star = reference_optimum(*self.data_key, float(self.lam)).to(dtype) if self.optimum == "auto" else None
        from .neural import pick_device

        problem = RidgeShard(X.to(dtype), y.to(dtype), self.lam, scale=size / self.n_samples, w_star=w_star,
                             solver=self.solver, seed=worker_seed(self.seed, rank, SOLVER_STREAM),
                             factorization=self.factorization, device=pick_device(self.device, rank))
        problem.solver_notes.worker = rank  # whose rows its SVRG nulls read
        if self.device != "cpu":  # auto's choice, or the GPU cuda pinned this worker to
            problem.notes = [f"problem.device={self.device} -> {problem.device}"]
        return problem


# ---------------------------------------------------------------------- shards and synthetic rows
def shard_positions(n_samples: int, size: int, rank: int) -> tuple[int, int]:
    """The positions [start, stop) of the permutation that worker ``rank`` of ``size`` holds (as np.array_split)."""
    base, extra = divmod(n_samples, size)
    start = rank * base + min(rank, extra)
    return start, start + base + int(rank < extra)


def synthesize(n_samples: int, dim: int, covariance: str, noise_std: float, seed: int,
               start: int = 0, stop: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows π[start:stop] of the synthetic data set, in increasing row order (float64; module docstring).

    With the default range, the whole data set; with a shard's `shard_positions`, exactly
    the rows ``iid_shards(...)[rank]`` of it.
    """
    stop = n_samples if stop is None else stop
    rows = iid_permutation(n_samples, seed)[start:stop]
    dest = np.empty(len(rows), dtype=np.int64)
    dest[np.argsort(rows)] = np.arange(len(rows))  # position k goes to the rank of its row among `rows`
    X, noise = np.empty((len(rows), dim)), np.empty(len(rows))
    for block in range(start // ROW_BLOCK, -(-stop // ROW_BLOCK)):
        first, end = block * ROW_BLOCK, min(n_samples, (block + 1) * ROW_BLOCK)
        lo, hi = max(start, first), min(stop, end)
        target = dest[lo - start:hi - start]
        if (lo, hi) == (first, end):  # the whole block is ours
            X[target], noise[target] = _draw_block(seed, dim, block, end - first)
        else:  # shared with the neighbouring shard, which is usually built next: drawn once for both
            x_block, noise_block = _shared_block(seed, dim, block, end - first)
            X[target], noise[target] = x_block[lo - first:hi - first], noise_block[lo - first:hi - first]
    if covariance == "decay":
        X *= np.arange(1, dim + 1) ** -0.6
    y = X.sum(axis=1) + noise_std * noise  # a per-row sum: the same bits whichever rows share the array
    return torch.from_numpy(X), torch.from_numpy(y)


def _draw_block(seed: int, dim: int, block: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``rows`` positions of stream block ``block``: their x's (rows x dim) and noises."""
    x = np.random.default_rng([seed, X_STREAM, block]).standard_normal((rows, dim))
    return x, np.random.default_rng([seed, NOISE_STREAM, block]).standard_normal(rows)


@lru_cache(maxsize=1)
def _shared_block(seed: int, dim: int, block: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """`_draw_block`, kept for the next shard: m shards of a few rows each would otherwise draw each block up
    to ROW_BLOCK / n_i times (the simulator builds shard r + 1 right after shard r).  Read-only."""
    x, noise = _draw_block(seed, dim, block, rows)
    x.flags.writeable = noise.flags.writeable = False
    return x, noise


@lru_cache(maxsize=2)
def generate(n_samples: int, dim: int, covariance: str, noise_std: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The full data set, identical in every process for the same arguments (float64)."""
    return synthesize(n_samples, dim, covariance, noise_std, seed)


def gram(X: torch.Tensor) -> torch.Tensor:
    """XᵀX, exactly symmetric, from the panels of its lower triangle (about half the flops of X.T @ X)."""
    d = X.shape[1]
    G = torch.empty(d, d, dtype=X.dtype, device=X.device)
    for lo in range(0, d, GRAM_BLOCK):
        hi = min(d, lo + GRAM_BLOCK)
        G[lo:hi, :hi] = X[:, lo:hi].T @ X[:, :hi]
        diagonal = G[lo:hi, lo:hi]
        diagonal.copy_(torch.tril(diagonal) + torch.tril(diagonal, -1).T)
        G[:lo, lo:hi] = G[lo:hi, :lo].T
    return G


# ---------------------------------------------------------------------- the reference optimum
@lru_cache(maxsize=4)
def reference_optimum(n_samples: int, dim: int, covariance: str, noise_std: float, seed: int,
                      lam: float) -> torch.Tensor:
    """argmin O of the synthetic data set (float64), from the disk cache when it is worth one (module docstring)."""
    key = (n_samples, dim, covariance, float(noise_std), seed, float(lam))
    path = optimum_cache_path(*key) if n_samples * dim ** 2 >= DISK_CACHE_MIN_WORK else None
    if path is not None:
        cached = _load_optimum(path, key)
        if cached is not None:
            return cached
    w_star = synthetic_optimum(*key)
    if path is not None:
        _save_optimum(path, key, w_star)
    return w_star


def optimum_cache_path(n_samples: int, dim: int, covariance: str, noise_std: float, seed: int, lam: float) -> Path:
    """Where `reference_optimum` keeps this optimum: ``ridge_optimum`` of the package's cache
    (`dane.problems.optimum.cache_dir`: $DANE_CACHE_DIR, else $XDG_CACHE_HOME/dane, ~/.cache/dane)."""
    key = (n_samples, dim, covariance, float(noise_std), seed, float(lam))
    return cache_dir("ridge_optimum") / f"{hashlib.sha256(repr(key).encode()).hexdigest()[:24]}.pt"


def _load_optimum(path: Path, key: tuple) -> torch.Tensor | None:
    try:
        stored = torch.load(path, weights_only=True)
    except Exception:  # noqa: BLE001 - absent, truncated or damaged (torch.load fails in many ways): recompute
        return None
    if not isinstance(stored, dict) or tuple(stored.get("key", ())) != key + (ROW_BLOCK,):  # ROW_BLOCK: the scheme
        return None
    return stored["w_star"]


def _save_optimum(path: Path, key: tuple, w_star: torch.Tensor) -> None:
    """Atomic (`dane.records.results.atomic_write`: a temporary file of this thread in the same folder, then
    os.replace, so concurrent processes leave one whole file, and a failed write no temporary one)."""
    try:
        atomic_write(path, lambda f: torch.save({"key": list(key + (ROW_BLOCK,)), "w_star": w_star}, f))
    except OSError:
        pass  # a read-only cache folder costs a recomputation next time, nothing else


def synthetic_optimum(n_samples: int, dim: int, covariance: str, noise_std: float, seed: int,
                      lam: float) -> torch.Tensor:
    """argmin O from the stream in chunks of `OPTIMUM_CHUNK` rows: no N x d array unless d > AUTO_MAX_DIM."""
    if dim > AUTO_MAX_DIM:
        return ridge_optimum(*synthesize(n_samples, dim, covariance, noise_std, seed), lam)
    G = torch.zeros(dim, dim, dtype=torch.float64)
    Xty = torch.zeros(dim, dtype=torch.float64)
    for start in range(0, n_samples, OPTIMUM_CHUNK):
        X, y = synthesize(n_samples, dim, covariance, noise_std, seed, start, min(n_samples, start + OPTIMUM_CHUNK))
        G += gram(X)
        Xty += X.T @ y
    return _normal_solve(G, Xty, n_samples, lam)


def ridge_optimum(X: torch.Tensor, y: torch.Tensor, lam: float) -> torch.Tensor:
    """argmin (1/n)||Xw - y||² + λ||w||²: a dense solve up to d = AUTO_MAX_DIM, else CG to 1e-14 (no d x d matrix)."""
    n, d = X.shape
    if d > AUTO_MAX_DIM:
        rhs = (2.0 / n) * (X.T @ y)
        return cg(lambda v: (2.0 / n) * (X.T @ (X @ v)) + 2 * lam * v, rhs, rtol=1e-14, max_iter=20 * d).x
    return _normal_solve(gram(X), X.T @ y, n, lam)


def _normal_solve(G: torch.Tensor, Xty: torch.Tensor, n: int, lam: float) -> torch.Tensor:
    """((2/n) G + 2λI)⁻¹ (2/n) Xᵀy, G = XᵀX."""
    H = (2.0 / n) * G
    H.diagonal().add_(2 * lam)
    return torch.linalg.solve(H, (2.0 / n) * Xty)


def uses_woodbury(factorization: str, rows: int, dim: int) -> bool:
    """The low-rank exact solve: asked for, or ``auto`` with fewer rows than columns (`RidgeShard`)."""
    return factorization == "woodbury" or (factorization == "auto" and auto_factorization(rows, dim) == "woodbury")


def quadratic_shard(X: torch.Tensor, y: torch.Tensor, lam: float, *, scale: float, w_star=None) -> "RidgeShard":
    """O_i(w) = scale * ||X w - y||^2 + lam ||w||^2 as a `QuadraticProblem` that keeps its rows."""
    return RidgeShard(X, y, lam, scale=scale, w_star=w_star)


class RidgeShard(QuadraticProblem):
    r"""A ridge shard that keeps its rows X_i, y_i, for minibatch gradients and row-based local solvers.

    A minibatch B of the n_i local rows gives the unbiased estimate

    .. math:: \widehat{\nabla O_i}(w) = 2\,\text{scale}\,\frac{n_i}{|B|} X_B^\top (X_B w - y_B) + 2\lambda w,

    which equals ∇O_i(w) when B is the whole shard.  A_i = 2 scale X_iᵀX_i is formed only
    when the local solver is Cholesky on the d x d path (or something asks for ``A``);
    otherwise every product goes through X_i, and the cg, svrg and lbfgs local solvers run
    on the squared-loss view of the same rows (`dane.problems.glm.LinearModelShard` with
    row weight 2 scale and ℓ2 weight 2λ, the same O_i).

    ``low_rank`` (``factorization=woodbury``, or ``auto`` with n_i < d): the exact solve of
    (A_i + sI) goes through the Woodbury identity (`dane.numerics.linalg.woodbury_solve`), with
    the row Gram matrix X_iX_iᵀ and the Cholesky factors of sI + 2 scale X_iX_iᵀ
    (n_i x n_i, the last `WOODBURY_FACTORS` shifts) as the only matrices besides X_i.
    The gradient and the suboptimality are products with X_i, so such a shard holds
    O(n_i d) numbers, not O(d²).

    ``device``: where X_i, y_i, A_i, their factors and every local solve live; each method
    returns its result on the device its input came from, as `dane.problems.glm.LinearModelShard`
    does (the algorithms' vectors stay in host memory; on the CPU every move is a no-op).
    """

    keeps_rows = True

    def __init__(self, X: torch.Tensor, y: torch.Tensor, lam: float, *, scale: float, w_star=None,
                 solver: LocalSolver = LocalSolver("cholesky"), seed: int = 0, factorization: str = "auto",
                 device: str | torch.device = "cpu"):
        self.device = torch.device(device)
        X, y = X.to(self.device), y.to(self.device)
        w_star = None if w_star is None else w_star.to(self.device)
        self.X, self.y, self.scale = X, y, float(scale)
        self._A = None
        self.rows = LinearModelShard(X, y, SQUARED, l2=2 * lam, weight=2 * scale, solver=solver, seed=seed,
                                     device=self.device)
        self.low_rank = uses_woodbury(factorization, *X.shape)
        if self.rows.solver.method == "cholesky" and not self.low_rank:
            self._A = gram(X).mul_(2 * scale)
        super().__init__(self._A, 2 * scale * (X.T @ y), scale * float(y @ y), lam, w_star=w_star,
                         factorization=factorization)
        self.solver, self.solver_notes = self.rows.solver, self.rows.solver_notes  # one set of problem.* keys
        if factorization == "auto" and self.solver.method == "cholesky":  # the exact solve notes auto's choice
            self.solver_notes.also["problem.factorization"] = "auto_factorization"
        self._row_gram: torch.Tensor | None = None  # X_i X_iᵀ (low rank), made at the first solve
        self._capacitance: OrderedDict[float, torch.Tensor] = OrderedDict()  # shift -> factor, least recent first

    @property
    def A(self) -> torch.Tensor:
        if self._A is None:
            self._A = gram(self.X).mul_(2 * self.scale)
        count_once(("gram",), ("local_hessians",))  # once, at its first use in the rounds (also one formed at set-up)
        return self._A

    @A.setter
    def A(self, value) -> None:
        self._A = value

    # ------------------------------------------------------------------ in from the caller's device, out to it
    def hessian_vector(self, v: torch.Tensor, *, with_reg: bool = True, at: torch.Tensor | None = None) -> torch.Tensor:
        where, v = v.device, v.to(self.device)
        if self._A is not None:
            return super().hessian_vector(v, with_reg=with_reg).to(where)
        # the squared loss's Hessian is its majorant, the same at every point: no margins at a point to compute
        return (self.rows.hessian_vector(v, with_reg=False) + (2 * self.lam * v if with_reg else 0.0)).to(where)

    def evaluate(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        grad, metrics = super().evaluate(w.to(self.device))
        return grad.to(w.device), metrics.to(w.device)

    def objective(self, w: torch.Tensor) -> torch.Tensor:
        return super().objective(w.to(self.device)).to(w.device)

    def grad(self, w: torch.Tensor, *, with_reg: bool = True) -> torch.Tensor:
        return super().grad(w.to(self.device), with_reg=with_reg).to(w.device)

    def solve_hessian(self, r: torch.Tensor, *, at: torch.Tensor | None = None, shift: float, with_reg: bool,
                      solver: LocalSolver | None = None, rtol: float | None = None) -> torch.Tensor:
        return super().solve_hessian(r.to(self.device), shift=shift, with_reg=with_reg, solver=solver,
                                     rtol=rtol).to(r.device)

    def shifted_solve(self, r: torch.Tensor, shift: float) -> torch.Tensor:
        """(A_i + shift I)⁻¹ r, exactly: by the Woodbury identity when ``low_rank``, else the d x d path
        (``factorization=auto``'s choice noted: `note_factorization`)."""
        note_factorization(self.solver_notes, self.factorization, *self.X.shape)
        if not self.low_rank:
            return super().shifted_solve(r, shift)
        return woodbury_solve(self.X, 2 * self.scale, float(shift), self._capacitance_factor(shift), r)

    def _capacitance_factor(self, shift: float) -> torch.Tensor:
        """Cholesky factor of shift I + 2 scale X_iX_iᵀ, kept for the last `WOODBURY_FACTORS` shifts."""
        key = float(shift)
        L = self._capacitance.pop(key, None)
        if L is None:
            if self._row_gram is None:
                self._row_gram = gram(self.X.T)
            L, ok = capacitance_factor(self._row_gram, 2 * self.scale, key)
            if not ok:
                raise not_positive_definite(key)
            while len(self._capacitance) >= WOODBURY_FACTORS:
                self._capacitance.popitem(last=False)
        # each once in the rounds, at its first use there, wherever it was made (the reference solve's: before them)
        count_once(("row_gram",), ("local_hessians",))  # the n_i x n_i row Gram stands in for H_i
        count_once(("capacitance", key), ("local_factorizations",))
        self._capacitance[key] = L
        return L

    def prox_solve(self, anchor: torch.Tensor, linear: torch.Tensor, mu: float, *, with_reg: bool = True,
                   anchor_grad: torch.Tensor | None = None, solver: LocalSolver | None = None) -> torch.Tensor:
        method = (solver or self.solver).resolve(self.dim, sparse=False).method
        if method not in ("cholesky", "cg"):  # the rows' solvers (svrg, lbfgs) move their own vectors
            return self.rows.prox_solve(anchor, linear, mu, with_reg=with_reg, anchor_grad=anchor_grad, solver=solver)
        anchor_grad = None if anchor_grad is None else anchor_grad.to(self.device)
        return super().prox_solve(anchor.to(self.device), linear.to(self.device), mu, with_reg=with_reg,
                                  anchor_grad=anchor_grad, solver=solver).to(anchor.device)

    @property
    def n_local(self) -> int:
        return self.X.shape[0]

    @property
    def row_nonzeros(self) -> int:
        return self.X.numel()

    @counted("local_passes")
    def validation_objective(self, w: torch.Tensor) -> torch.Tensor:
        """Local SGD's election score (`dane.problems.Problem.validation_objective`): the mean squared residual per
        row plus λ‖w‖², (1/n_i)‖X_i w − y_i‖² + λ‖w‖², O_i(w) with its shard weight scale · n_i = m n_i / N divided
        out.  On an equal shard (scale = m/N = 1/n_i, the same number) O_i(w) as `evaluate` gives it; on another
        by one product with X_i.  An empty shard scores inf."""
        if not self.n_local:
            return torch.tensor(float("inf"), dtype=w.dtype, device=w.device)
        if self.scale == 1.0 / self.n_local:
            return super().validation_objective(w)
        where, x = w.device, w.to(self.device)
        r = self.X @ x - self.y
        return ((1.0 / self.n_local) * (r @ r) + self.lam * (x @ x)).to(where)

    def state_dict(self) -> dict:
        return self.rows.state_dict()  # the SVRG solver's generator

    def load_state_dict(self, state: dict) -> None:
        self.rows.load_state_dict(state)

    @counted("local_passes", rows_fraction)
    def batch_grad(self, w: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        where, w, idx = w.device, w.to(self.device), idx.to(self.device)
        X, y = self.X[idx], self.y[idx]
        return ((2 * self.scale * self.n_local / idx.numel()) * (X.T @ (X @ w - y)) + 2 * self.lam * w).to(where)
