r"""Linear-model shards with one output stacked on their rows: sparse or dense rows, shards of any sizes.

The batched simulator (``sim.batched``, `dane.comm.batched`) runs an algorithm's ordinary step once, on a
problem whose methods answer for all m workers, row i worker i's.  The dense stacked forms
(`dane.problems.stacked.StackedLinearModel`, `StackedRidge`) carry exact local solves and so need dense rows
dealt in equal shards.  A method that asks its problem for values, gradients and Hessians at a shared point
only, never a local solve (``stacked_needs = "oracles"``, `dane.algorithm.Algorithm`: FedNL), stacks on the rows
themselves: `StackedRows` holds the m shards' CSR rows one after another (worker c's rows ``start[c]..start[c+1]``,
targets y, row weight w = m/N, ℓ2 weight λ), so sparse rows and unequal shards stack alike, on every source the
per-worker form reads (LIBSVM, CSV, NPZ, arrays, built-ins) and under every ``data.sharding`` (`rows_form`,
`build_rows`).  Its methods take the shared iterate (d,) only:

.. math:: O_c(x) = w\sum_{j\in S_c} f(x_j^\top x, y_j) + \tfrac{\lambda}{2}\|x\|^2,\qquad
          \nabla O_c(x) = w\,X_c^\top f'(X_c x) + \lambda x

for every worker from one pass over all rows (`row_pass`), and the suboptimality O_c(x) − O* (a quadratic f:
½ eᵀ∇²O_c e, e = x − x*, as the shard computes it), the reference optimum attached to the built shards as the
per-worker simulator attaches it (`dane.problems.optimum.attach_shards`).  The sums run over the rows in another order than
a shard's own, so records agree with the per-worker run's to round-off.  The workers' Hessians, kept on their
supports, are `dane.problems.stacked_hessians.CompactHessians` over these rows.

*The passes.*  For the rows j of worker c:

.. math:: z_j = x_j^\top x,\qquad v_c = w\sum_{j\in S_c} f(z_j, y_j),\qquad
          g_c = \sum_{j\in S_c} (w\,x_j)\,f'(z_j, y_j),\qquad h_j = f''(z_j, y_j).

`row_pass` gives them for all m workers or for a few (FedNL-PP's sampled clients): z by SciPy's CSR product
(a few workers' rows: the same loop, compiled, on their row ranges), f, f' and f'' by the loss's own torch
functions (`dane.losses`, and `dane.losses.ROW_VALUES` for f; on a few workers' rows worker by
worker, as each worker alone computes them), and the sums v_c and g_c by one compiled loop (numba) that
scatters each row into its worker's gradient row, reading X once; `block_products` is the compact Hessians'
product P h, all workers' or a few's.

Every sum runs in one fixed order: row by row, within a worker the rows in order; a term of g_c is the weight
w·x_ja, rounded, times f'(z_j); v_c adds as ``numpy.bincount`` adds.  The loops index through unsigned views of
the CSR arrays (`unsigned`), so that numba tests no index for a negative value.  What the passes cost a round is
``phase_s_per_round`` (``oracles``) of ``make bench`` section ``fednl``.
"""
from __future__ import annotations

import copy
import functools
from typing import Callable, NamedTuple, Sequence

import numpy as np
import scipy.sparse
import torch

from ..errors import ConfigError
from ..work import counted
from .base import Problem, ProblemConfig
from .optimum import attach_shards
from ..losses import ROW_VALUES
from .row_losses import client_losses
from ..numerics import jit

NOTE = ("sim.batched: the {m} workers ran as one stacked computation, each charged 1/m of its measured "
        "compute (dane/comm/batched.py)")


def rows_form(problem: ProblemConfig, size: int) -> str | None:
    """None when `build_rows` stacks ``problem``'s ``size`` shards: a linear model with one output (problem=logreg or
    ridge) on any rows; else why not, a clause of ``sim.batched=true``'s refusal."""
    from .linear_models import LinearModelConfig

    if not isinstance(problem, LinearModelConfig) or problem.loss not in ("squared", "logistic"):
        return f"the stacked rows hold linear models with one output (problem=logreg or ridge), not {problem.name}"
    return None


def rows_refusal(method: str, got: str) -> str:
    """The one line of ``algorithm=method``, which needs what `rows_form` accepts, given ``got`` instead."""
    return (f"algorithm={method} needs a linear model with one output on rows (problem=logreg, or problem=ridge with "
            f"data=...), got {got}")


def build_rows(problem: ProblemConfig, size: int, dtype: torch.dtype) -> StackedRows:
    """The ``size`` shards of ``problem`` stacked on their rows, the reference optimum (``problem.optimum``) attached
    to them as on the per-worker path (`dane.problems.optimum.attach_shards`; in the summary's ``setup_s``, which it
    is not there; the batched simulator marks its end on the timeline, `dane.loop.kinds.batched_simulator`)."""
    shards = [problem.build(rank, size, dtype) for rank in range(size)]
    attach_shards(problem, shards)
    return StackedRows(shards)


class StackedRows(Problem):
    """The m linear-model shards (`dane.problems.glm.LinearModelShard`: same d, loss, λ and row weight) of one
    problem, stacked on their rows (module docstring); row c of every result is the c-th shard's.  Dense shards
    are read as sparse.  ``rows_at`` keeps the last pass, which a round's oracles and its record's metrics share."""

    convex = True
    #: the workers' Hessians on their supports over these rows, where built (`dane.problems.stacked_hessians`:
    #: ``CompactHessians.kept``, which a method's config may call in the run's set-up, as FedNL's does); None: not built
    hessians = None

    def __init__(self, shards: Sequence):
        first = shards[0]
        if first.classes != 1:
            raise ConfigError(f"the stacked rows hold a model with one output (ridge or logistic), got "
                              f"{first.classes} classes; use problem=logreg or problem=ridge")
        self.shards = list(shards)
        self.stacked_workers = m = len(self.shards)
        self.dim, self.dtype = first.dim, first.dtype
        self.quadratic, self.strong_convexity = first.quadratic, first.strong_convexity
        self.metric_names = first.metric_names
        self.w_star, self.f_star = first.w_star, first.f_star
        self.notes = [*first.notes, NOTE.format(m=m)]
        self.target_units, self.data_info = first.target_units, first.data_info
        self.loss, self.l2 = first.loss, first.l2
        parts = [scipy.sparse.csr_matrix(shard_rows(s)) for s in self.shards]
        for part in parts:
            part.sort_indices()
        self.X = scipy.sparse.vstack(parts, format="csr")
        self.y = torch.cat([s.y.detach().to(torch.float64) for s in self.shards]).numpy()
        sizes = np.array([p.shape[0] for p in parts])
        self.start = np.concatenate([[0], np.cumsum(sizes)])
        self.row_client = np.repeat(np.arange(m), sizes)
        self.row_nonzeros = np.diff(self.X.indptr[self.start])  # each worker's, for `dane.work`
        weights = {s.weight for s in self.shards}
        if len(weights) != 1:
            raise ConfigError(f"the stacked shards must share one row weight m/N, got {sorted(weights)}; "
                              "build every shard of one problem with the same worker count")
        self.weight = weights.pop()
        self.unit = unit_values(self.X)  # binary rows (w8a, a9a): X's values all 1.0, which the passes then do not read
        self.n_local = sizes  # each worker's rows (client sampling by shard size)
        self.clients: np.ndarray | None = None  # the workers this stack answers for (`participants`); None: all m
        self._at: RowPass | None = None  # `rows_at`'s last pass

    def initial_point(self) -> torch.Tensor:
        return torch.zeros(self.dim, dtype=self.dtype)

    def rows_at(self, x: np.ndarray, *, curvature: bool = False) -> RowPass:
        """Every worker's pass at x (`row_pass`: margins, weighted data losses (m,), data gradients without λx (m, d),
        curvatures with ``curvature``), kept for the last x: a round's oracles and its record's metrics (`evaluate`)
        read the same point under full participation, so the rows are passed once for both.  Read-only: a caller
        that changes them copies."""
        at = self._at
        if at is None or not np.array_equal(at.x, x) or (curvature and at.curv is None):
            at = self._at = row_pass(self.X, self.y, self.start, x, self.loss, self.weight, curvature=curvature,
                                     unit=self.unit)
        return at

    def client_sums(self, row_values: torch.Tensor) -> np.ndarray:
        """Σ_{j ∈ S_c} of per-row values, for every worker c: (m,)."""
        return np.bincount(self.row_client, weights=row_values.numpy(), minlength=self.stacked_workers)

    @counted("local_passes")
    def objective(self, w: torch.Tensor) -> torch.Tensor:
        """O_c(w) for every worker: (m,), in the problem's dtype (what a worker of the per-worker path sends)."""
        x = w.detach().to(torch.float64).numpy()
        values = row_pass(self.X, self.y, self.start, x, self.loss, self.weight, gradients=False,
                          unit=self.unit).values
        return torch.from_numpy(values + 0.5 * self.l2 * float(x @ x)).to(self.dtype)

    @counted("local_passes")
    def validation_objective(self, w: torch.Tensor) -> torch.Tensor:
        r"""Local SGD's election score (`dane.problems.Problem.validation_objective`) for every worker this stack
        answers for, at x shared (d,) or one per worker (m, d): (1/n_c) Σ_{j∈S_c} f(x_jᵀx_c, y_j) + (λ/2)‖x_c‖², O_c
        with its shard weight w n_c = m n_c / N divided out, (m,).  `evaluate`'s pass without its gradients, its sums
        scaled by 1/n_c instead of w: on equal shards (w = m/N = 1/n_c, the same number) `evaluate`'s O_c bit for
        bit.  An empty shard scores inf (no rows to judge its model by)."""
        if w.dim() == 2 or self.clients is not None:  # as `evaluate_each`
            clients, xs = self.points(w)
            sums = each_pass(self.X, self.y, self.start, xs, clients, self.loss, 1.0, unit=self.unit,
                             gradients=False).values
            regularizer = 0.5 * self.l2 * (xs * xs).sum(-1)
        else:  # as `evaluate` at a shared x
            clients, x = np.arange(self.stacked_workers), w.detach().to(torch.float64).numpy()
            sums = row_pass(self.X, self.y, self.start, x, self.loss, 1.0, gradients=False, unit=self.unit).values
            regularizer = 0.5 * self.l2 * float(x @ x)
        sizes = self.start[clients + 1] - self.start[clients]
        with np.errstate(divide="ignore", invalid="ignore"):
            means = np.where(sizes > 0, (1.0 / sizes) * sums, np.inf)
        return torch.from_numpy(means + regularizer).to(self.dtype)

    def participants(self, idx: torch.Tensor) -> "StackedRows":
        """The workers ``idx`` alone (`dane.problems.Problem.participants`): the same rows, its passes over theirs."""
        view = copy.copy(self)
        view.clients = np.asarray(idx.tolist(), dtype=np.int64)
        view.stacked_workers, view.n_local, view._at = len(view.clients), self.n_local[view.clients], None
        return view

    @counted("local_passes")
    def evaluate(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(∇O_c(w), [O_c(w), suboptimality]) for every worker: (m, d) and (m, k), from one pass over the rows (kept:
        under full participation a round's oracles have just read the same point).  At one point per worker (w of
        shape (m, d)) or for a few workers (`participants`), `each_pass`."""
        if w.dim() == 2 or self.clients is not None:
            return self.evaluate_each(w)
        x = w.detach().to(torch.float64).numpy()
        at = self.rows_at(x)
        grads = at.grads + self.l2 * x
        values = at.values + 0.5 * self.l2 * float(x @ x)
        metrics = [values]
        if self.w_star is not None:
            metrics.append(self.suboptimality(x, values))
        return torch.from_numpy(grads).to(self.dtype), torch.from_numpy(np.stack(metrics, -1)).to(self.dtype)

    def points(self, w: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """(the workers this stack answers for, their points (s, d)): w shared (d,) or one row each."""
        clients = np.arange(self.stacked_workers) if self.clients is None else self.clients
        x = w.detach().to(torch.float64).numpy()
        return clients, np.ascontiguousarray(np.broadcast_to(x, (len(clients), self.dim)))

    def evaluate_each(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`evaluate` at a point per worker, or for `participants`: row k worker clients[k]'s, at its own point."""
        clients, xs = self.points(w)
        at = each_pass(self.X, self.y, self.start, xs, clients, self.loss, self.weight, unit=self.unit)
        grads = at.grads + self.l2 * xs
        values = at.values + 0.5 * self.l2 * (xs * xs).sum(-1)
        metrics = [values]
        if self.w_star is not None and not self.quadratic:
            metrics.append(values - self.f_star)
        elif self.w_star is not None:  # ½ eᵀ∇²O_c e, e = x_c − x*: the shard's rule
            e = xs - self.w_star.detach().to(torch.float64).cpu().numpy()
            metrics.append(0.5 * ((e * (self.data_hessian_products(e, clients, None) + self.l2 * e)).sum(-1)))
        return torch.from_numpy(grads).to(self.dtype), torch.from_numpy(np.stack(metrics, -1)).to(self.dtype)

    @counted("local_hvps")
    def hessian_vector(self, v: torch.Tensor, *, at: torch.Tensor | None = None, with_reg: bool = True) -> torch.Tensor:
        """∇²O_c(at) v for every worker (or `participants`), v and ``at`` shared or one row each; without ``at`` the
        majorant w c_f X_cᵀX_c v + λv, as the shard's."""
        clients, vs = self.points(v)
        ats = None if at is None else self.points(at)[1]
        Hv = self.data_hessian_products(vs, clients, ats)
        return torch.from_numpy(Hv + self.l2 * vs if with_reg else Hv).to(self.dtype)

    def data_hessian_products(self, vs: np.ndarray, clients: np.ndarray, ats: np.ndarray | None) -> np.ndarray:
        """∇²D_c(at_c) v_c for ``clients``, row by row (``ats`` None: the majorant's curvature c_f)."""
        zv = each_margins(self.X, self.start, vs, clients, unit=self.unit)
        y = np.concatenate([self.y[self.start[c]:self.start[c + 1]] for c in clients])
        if ats is None:
            curv = self.loss.curvature * zv
        else:
            za = each_margins(self.X, self.start, ats, clients, unit=self.unit)
            curv = self.loss.hess(torch.from_numpy(za), torch.from_numpy(y), torch.from_numpy(zv)).numpy()
        return client_sums(self.X, self.start, clients, self.weight, curv, self.unit)[1]

    def suboptimality(self, x: np.ndarray, values: np.ndarray) -> np.ndarray:
        """Each worker's share of O(x) − O*: O_c(x) − O*, or ½ eᵀ∇²O_c e for a quadratic f (the shard's rule)."""
        if not self.quadratic:
            return values - self.f_star
        e = x - self.w_star.detach().to(torch.float64).cpu().numpy()
        ze = torch.from_numpy(self.X @ e)
        curvature = ze * self.loss.hess(ze, torch.from_numpy(self.y), ze)
        return 0.5 * (self.weight * self.client_sums(curvature) + self.l2 * float(e @ e))

    def mean_objective(self, x: np.ndarray) -> float:
        """O(x) = mean_c O_c(x) = (w/m) Σ_j f(z_j, y_j) + (λ/2)‖x‖² (every shard has the weight w = m/N)."""
        data = float(self.loss.value(torch.from_numpy(self.X @ x), torch.from_numpy(self.y)))
        return self.weight / self.stacked_workers * data + 0.5 * self.l2 * float(x @ x)

    def mean_gradient(self, x: np.ndarray) -> np.ndarray:
        """∇O(x) = mean_c ∇O_c(x)."""
        dz = self.loss.dz(torch.from_numpy(self.X @ x), torch.from_numpy(self.y)).numpy()
        return self.weight / self.stacked_workers * (self.X.T @ dz) + self.l2 * x


def shard_rows(shard) -> scipy.sparse.csr_matrix:
    """A `LinearModelShard`'s X as a SciPy CSR matrix (dense X converted)."""
    X = shard.X
    if X.layout == torch.sparse_csr:
        return scipy.sparse.csr_matrix((X.values().detach().numpy(), X.col_indices().numpy(),
                                        X.crow_indices().numpy()), shape=tuple(X.shape))
    return scipy.sparse.csr_matrix(X.detach().numpy())


class RowPass(NamedTuple):
    """`row_pass`'s outputs at ``x``: z and h at the clients' rows (in their order), v (s,) (None for a few
    clients), g (s, d) (None without gradients), h (None without curvature)."""

    x: np.ndarray
    z: np.ndarray
    values: np.ndarray
    grads: np.ndarray | None
    curv: np.ndarray | None


def row_pass(X: scipy.sparse.csr_matrix, y: np.ndarray, start: np.ndarray, x: np.ndarray, loss, weight: float,
             clients: np.ndarray | None = None, *, gradients: bool = True, curvature: bool = False,
             unit: bool = False) -> RowPass:
    """The module docstring's (z, v, g, h) for ``clients`` (stack rows, in this order; None: all m, z and h then
    over all N rows in order, and v; a few clients: v None), ``loss`` a `dane.losses.Loss` with one output.
    ``unit``: every stored value of X is 1.0 (binary features; `unit_values`)."""
    d = X.shape[1]
    indptr, indices = unsigned(X.indptr), unsigned(X.indices)
    every = clients is None
    clients = np.arange(len(start) - 1) if every else np.asarray(clients, dtype=np.int64)
    sizes = start[clients + 1] - start[clients]
    if every and not unit:
        z = X @ x
    else:
        z = each_margins(X, start, np.broadcast_to(x, (len(clients), d)), clients, unit=unit)  # one x, a view
    if every:
        zt, yt = torch.from_numpy(z), torch.from_numpy(y)
        values = ROW_VALUES[loss.name](zt[:, None], yt[:, None]).numpy()
        dz = loss.dz(zt, yt).numpy() if gradients else np.zeros(0)
        curv = loss.hess(zt, yt, torch.ones_like(zt)).numpy() if curvature else None
    else:
        values, dz, curv = None, np.empty(len(z)), np.empty(len(z)) if curvature else None
        at = 0
        for c, n_c in zip(clients, sizes):  # torch on each client's rows alone: its vector loop then rounds them as
            rows = slice(at, at + n_c)       # the per-worker path does (a longer array shifts which rows take its tail)
            zt, yt = torch.from_numpy(z[rows]), torch.from_numpy(y[start[c]:start[c + 1]])
            dz[rows] = loss.dz(zt, yt).numpy()
            if curvature:
                curv[rows] = loss.hess(zt, yt, torch.ones_like(zt)).numpy()
            at += n_c
    grads = np.zeros((len(clients), d if gradients else 0))
    sums = np.zeros(len(clients))
    _kernels()[1](indptr, indices, X.data, unit, float(weight), dz, np.zeros(0) if values is None else values,
                  unsigned(start), unsigned(clients), gradients, values is not None, grads, sums)
    return RowPass(x.copy(), z, None if values is None else weight * sums, grads if gradients else None, curv)


def each_margins(X: scipy.sparse.csr_matrix, start: np.ndarray, xs: np.ndarray, clients: np.ndarray, *,
                 unit: bool = False) -> np.ndarray:
    """z_j = x_jᵀ x_c for the rows j of each client c of ``clients`` (in order), at its own point xs[k] (s, d)."""
    z = np.empty(int((start[clients + 1] - start[clients]).sum()))
    _kernels()[0](unsigned(X.indptr), unsigned(X.indices), X.data, unit, np.asarray(xs, dtype=np.float64),
                  unsigned(start), unsigned(clients), z)
    return z


def client_sums(X: scipy.sparse.csr_matrix, start: np.ndarray, clients: np.ndarray, weight: float, dz: np.ndarray,
                unit: bool, values: np.ndarray | None = None, *,
                gradients: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(Σ_{j ∈ S_c} values_j (zeros without ``values``), w Σ_{j ∈ S_c} x_j dz_j) for ``clients``: (s,) and (s, d),
    ``dz`` and ``values`` given at their rows in order (`row_pass`'s loop); without ``gradients`` the second is
    (s, 0), not computed."""
    grads, sums = np.zeros((len(clients), X.shape[1] if gradients else 0)), np.zeros(len(clients))
    _kernels()[1](unsigned(X.indptr), unsigned(X.indices), X.data, unit, float(weight), dz,
                  np.zeros(0) if values is None else values, unsigned(start), unsigned(clients), gradients,
                  values is not None, grads, sums)
    return sums, grads


def each_pass(X: scipy.sparse.csr_matrix, y: np.ndarray, start: np.ndarray, xs: np.ndarray, clients: np.ndarray,
              loss, weight: float, *, unit: bool = False, gradients: bool = True) -> RowPass:
    """`row_pass`'s (z, v, g) for ``clients``, each at its own point xs[k] (local steps of a federated method):
    z by `each_margins`, f and f' as the loss's torch functions give them on each client's rows alone (as it alone
    computes them: `dane.problems.row_losses.client_losses`), v and g by `row_pass`'s loop (g None without
    ``gradients``).  ``x`` of the result is ``xs``."""
    z = each_margins(X, start, xs, clients, unit=unit)
    sizes = start[clients + 1] - start[clients]
    rows = np.arange(len(z)) + np.repeat(start[clients] - (np.cumsum(sizes) - sizes), sizes)
    values, dz = client_losses(loss, z, y[rows], sizes)
    sums, grads = client_sums(X, start, clients, weight, dz, unit, values, gradients=gradients)
    return RowPass(xs, z, weight * sums, grads if gradients else None, None)


def block_products(P: scipy.sparse.csc_matrix, slots: np.ndarray, h: np.ndarray, start: np.ndarray,
                   clients: np.ndarray | None, S: int, *, value: float | None = None, threads: int = 1) -> np.ndarray:
    """(s, S): rows c·S .. c·S + S − 1 of the product P h for each c in ``clients`` (None: all, in order), h given
    at the clients' rows only, in their order (`row_pass`'s); P (CSC) has the stacked rows as its columns, and
    ``slots[p]`` is the row of P's stored entry p within its client's block (its row index minus c·S, in the
    smallest unsigned type holding S).

    Column by column: each row j of client c adds P_rj·h_j to its slots, j ascending, so every slot's sum runs in
    the order of SciPy's CSR product row by row (its columns sorted), from 0.0, bit for bit; a row's products go
    to one client's block (its S numbers, in the first- or second-level cache) instead of a CSR row's few reads
    of h per slot.  ``value``: every stored value of P (binary rows: the row weight), which then is not read.
    ``threads``: the clients split in that many blocks, one a thread (`in_threads`; each block's numbers alike)."""
    clients = np.arange(len(start) - 1) if clients is None else np.asarray(clients, dtype=np.int64)
    out = np.empty((len(clients), S))
    first_row = np.concatenate([[0], np.cumsum(start[clients + 1] - start[clients])])  # of each client's in h
    kernel = _kernels()[2]  # compiled here, once, not in the threads

    def block(lo: int, hi: int) -> None:
        kernel(unsigned(P.indptr), slots, P.data, value is not None, 0.0 if value is None else value,
               h[first_row[lo]:], unsigned(start), unsigned(clients[lo:hi]), out[lo:hi])

    in_threads(block, len(clients), threads)
    return out


def in_threads(work: Callable[[int, int], None], n: int, threads: int) -> None:
    """``work(lo, hi)`` over ``threads`` consecutive blocks of range(n), each in a thread of a pool kept for the
    process (one block: in this thread).  For work that releases the GIL (numba's ``nogil`` loops, NumPy's
    selections) and whose rows do not depend on one another, so that the result is the one-block result."""
    threads = max(1, min(threads, n))
    if threads == 1:
        work(0, n)
        return
    bounds = [n * t // threads for t in range(threads + 1)]
    for future in [_pool(threads).submit(work, lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:])]:
        future.result()


@functools.cache
def _pool(threads: int):
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(threads, thread_name_prefix="stacked")


def unit_values(A: scipy.sparse.csr_matrix, value: float = 1.0) -> bool:
    """Whether every stored value of A is ``value`` (then the passes do not read them: a third of the memory)."""
    return bool(A.nnz) and bool(np.all(A.data == value))


def unsigned(index: np.ndarray) -> np.ndarray:
    """Non-negative integer indices as an unsigned view (module docstring; other integer types copied to int64)."""
    index = np.asarray(index)
    if index.dtype not in (np.int32, np.int64):
        index = index.astype(np.int64)
    return index.view(np.uint32 if index.dtype == np.int32 else np.uint64)


@functools.cache
def _kernels():
    """(margins, sums, block_products), compiled by numba on first use (``cache=True``: once per machine)."""
    numba = jit.numba()

    @numba.njit(cache=True, nogil=True)
    def margins(indptr, indices, data, unit, xs, start, clients, z):  # z: the clients' rows, in order
        at = 0
        for k in range(len(clients)):  # client k's rows at its own point xs[k] (one shared x: a broadcast view)
            c, x = clients[k], xs[k]
            for j in range(start[c], start[c + 1]):
                s = 0.0
                if unit:  # 1.0 · x_a is x_a: the same sum without reading the values
                    for p in range(indptr[j], indptr[j + 1]):
                        s += x[indices[p]]
                else:
                    for p in range(indptr[j], indptr[j + 1]):
                        s += data[p] * x[indices[p]]
                z[at] = s
                at += 1

    @numba.njit(cache=True, nogil=True)
    def sums(indptr, indices, data, unit, weight, dz, values, start, clients, gradients, with_values, grads, totals):
        at = 0
        for k in range(len(clients)):
            c = clients[k]
            g = grads[k]  # the client's gradient row (empty without gradients)
            total = 0.0
            for j in range(start[c], start[c + 1]):
                if with_values:
                    total += values[at]
                if gradients:
                    if unit:  # (1.0 · w) f' is w f'
                        step = weight * dz[at]
                        for p in range(indptr[j], indptr[j + 1]):
                            g[indices[p]] += step
                    else:
                        for p in range(indptr[j], indptr[j + 1]):
                            g[indices[p]] += (data[p] * weight) * dz[at]
                at += 1
            totals[k] = total

    @numba.njit(cache=True, nogil=True)
    def block_products_(colptr, slots, data, constant, value, h, start, clients, out):
        at = 0  # where h holds the current row (h: the clients' rows only, in order)
        for k in range(len(clients)):
            c = clients[k]
            block = out[k]
            block[:] = 0.0
            for j in range(start[c], start[c + 1]):
                if constant:  # every product is ``value``: the same term without reading them
                    term = value * h[at]
                    for p in range(colptr[j], colptr[j + 1]):
                        block[slots[p]] += term
                else:
                    for p in range(colptr[j], colptr[j + 1]):
                        block[slots[p]] += data[p] * h[at]
                at += 1

    return margins, sums, block_products_
