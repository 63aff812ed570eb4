r"""Local work: what each client computed, counted where it is computed, and summed over the clients per record.

Every record of an algorithm's run carries, cumulative since round 0 (like ``comm_rounds``: the work that
produced the record's iterate w_t), summed over the clients and, with the suffix ``_max``, the largest
per-client total (the busiest client):

- ``local_passes``: gradient passes, rows touched / n_i: a full local gradient (or value) is 1, a minibatch of
  b rows b/n_i, an SVRG correction ∇f_j(w) − ∇f_j(w̃) of b rows 2b/n_i (two row gradients);
- ``local_hvps``: Hessian-vector products; ``local_hessians``: Hessians formed (a dense ∇²O_i, a Gram matrix);
- ``local_factorizations``: Cholesky factorizations and eigendecompositions; a factor of a fixed matrix (a
  quadratic's H_i + sI, kept by shift) once per worker and run (`count_once`), however often it is reused or made
  again after a cache eviction or a restart, and at its first use in the rounds if it was made before them (by the
  reference solve), one at a new point (a Newton step on a logistic loss) each time;
- ``local_solver_iters``: iterations of a local solver as run: CG/PCG iterations (operator products),
  SVRG inner steps, L-BFGS iterations;
- ``local_inner_steps`` and ``local_inner_samples``: the inner torch optimizer's steps and the rows they drew;
- ``local_resolves``: local solves made again because the first failed the method's accuracy test (S-DANE's and
  Acc-S-DANE's ``local_retry``, `baselines.adaptive.LocalRetry`; 0 for every other method), each re-solve's own work
  counted in the keys above;
- ``local_flops``: the estimate Σ_k count_k · cost_k per client (`unit_costs`), summed or maxed like the rest.

*Where.*  The problems' methods (`counted`: evaluate, the value and gradient, Hessian-vector products, row
gradients, Hessian formation and factorization), `dane.numerics.linalg.cg`, the local solvers, `dane.numerics.inner.solve` and
the methods' own kernels call `count` on the ledger of the worker running them (`Ledger`, one per simulated
thread or launched process; one with a row per worker on the batched path).  A counted method that calls
another (an evaluation's Hessian product on a quadratic) counts once.  Nothing is counted outside
`dane.loop.runner.run`'s rounds (the reference optimum, the defaults' measurements, the similarity callback), nor
inside `uncounted` (the records' metrics, `dane.problems.Problem.local_metrics`).

*Participants only.*  Under client sampling a worker's counts after the round's draw (`take_part`) stand only
if it was drawn (in any of the round's draws): the others' evaluations only measure the record's metrics.

*Summing over the workers* (`reduce_over_workers`).  On the batched path the ledger holds every worker's row.
In the thread simulator each worker leaves its snapshot on a board its group shares, which the group's
reduction copies at every collective (no time, bytes or calls); rank 0 reads the copy after the round.
Under a launcher every rank sends its snapshot as an m x 18 table with the round's first allreduce, in the same call
(`dane.comm.Communicator.ride_next`; a round that makes no allreduce sends it after the round by
`dane.comm.Communicator.uncounted_allreduce_mean`, as comm=ps always does): not in ``bytes_sent``, ``comm_rounds`` or
the bit counts (under comm=ps not on the servers' links either).  The table comes back exact, every count as the rank
counted it, whatever the backend's mean (`gathered`).
"""
from __future__ import annotations

import functools
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable

import numpy as np
import torch

#: the counters, in the ledger's column order
COUNTS = ("local_passes", "local_hvps", "local_hessians", "local_factorizations", "local_solver_iters",
          "local_inner_steps", "local_inner_samples", "local_resolves")
#: each count's column in a ledger's table
COLUMN = {key: column for column, key in enumerate(COUNTS)}
FLOPS = "local_flops"
#: every record key this module writes, totals then maxima
KEYS = (*COUNTS, FLOPS, *(f"{key}_max" for key in (*COUNTS, FLOPS)))
#: flops of one solver iteration and of one inner step beyond their products (counted as hvps or passes):
#: a few vector updates of length d
SOLVER_ITER_VECTOR_OPS = 10
INNER_STEP_VECTOR_OPS = 4

_here = threading.local()


class Ledger:
    """One worker's cumulative counts (or, batched, one row per worker: ``ranks``), with the unit costs of
    its shard (`unit_costs`)."""

    def __init__(self, ranks: tuple[int, ...] | range, costs: np.ndarray):
        self.ranks = np.asarray(list(ranks), dtype=np.int64)
        self.counts = np.zeros((len(self.ranks), len(COUNTS)))
        self.costs = np.broadcast_to(np.asarray(costs, dtype=np.float64), self.counts.shape)
        self.active = np.ones(len(self.ranks))  # 1: this round's counts stand (drawn, or no draw yet)
        self.drawn = False
        self.depth = 0  # inside a counted method: its own calls of counted methods are not counted again
        self.quiet = 0  # inside `uncounted`
        self.made: set[tuple] = set()  # what `count_once` has counted: factors kept across rounds

    def add(self, key: str, amount) -> None:
        if self.depth or self.quiet:
            return
        self.counts[:, COLUMN[key]] += np.asarray(amount, dtype=np.float64) * self.active

    def take_part(self, members: torch.Tensor) -> None:
        """This round's draw of clients: counts from now on stand for the drawn rows (and those of earlier draws)."""
        inside = np.isin(self.ranks, np.asarray(members.tolist(), dtype=np.int64)).astype(np.float64)
        self.active = np.maximum(self.active, inside) if self.drawn else inside
        self.drawn = True

    def new_round(self) -> np.ndarray:
        """The counts so far with each row's flops (rows x 9); participation starts afresh."""
        self.active, self.drawn = np.ones(len(self.ranks)), False
        flops = (self.counts * self.costs).sum(1, keepdims=True)
        return np.concatenate([self.counts, flops], 1)

    def state_dict(self, table: np.ndarray | None = None) -> dict:
        """This worker's counts, and on rank 0 ``table``, every rank's (`checkpoint_state`)."""
        state = {"ranks": self.ranks.tolist(), "counts": self.counts.tolist(), "made": sorted(map(list, self.made))}
        return state if table is None else {**state, "table": table[:, :len(COUNTS)].tolist()}

    def load_state_dict(self, state: dict | None, size: int) -> None:
        """Continue from ``state`` (None: a checkpoint written before the counters, from zero).  A rank's own part
        (a checkpoint on disk) gives its counts; rank 0's part on every rank (a Horovod elastic reset) gives each
        rank its row of the table, and after a change of world size rank 0 the old total (the busiest client's
        count then restarts).  A checkpoint's counts from before a counter was added (fewer columns) continue with
        that counter at 0."""
        if state is None:
            return
        counts = _all_columns(state["counts"])
        if list(state.get("ranks", [])) == self.ranks.tolist() and counts.shape == self.counts.shape:
            self.counts = counts
            self.made = {tuple(tag) for tag in state.get("made", [])}
        table = _all_columns(state.get("table", np.zeros((0, len(COUNTS)))))
        if len(table) == size and len(self.ranks) == 1:
            self.counts = table[self.ranks]
            self.made = {tuple(tag) for tag in state.get("made", [])}  # the same shards: the same factors
        elif len(table) and len(self.ranks) == 1:
            self.counts = table.sum(0, keepdims=True) if self.ranks[0] == 0 else np.zeros_like(self.counts)


def _all_columns(counts) -> np.ndarray:
    """A checkpoint's rows x counters as floats, the counters it predates (the last columns of `COUNTS`) at 0."""
    counts = np.array(counts, dtype=np.float64)
    counts = counts if counts.ndim == 2 else counts.reshape(len(counts), 0)  # an empty table: no rows, no columns
    return np.pad(counts, ((0, 0), (0, len(COUNTS) - counts.shape[1])))


def current() -> Ledger | None:
    """The ledger of the worker this thread runs, inside its rounds; None elsewhere."""
    return getattr(_here, "ledger", None)


def counting() -> bool:
    """Whether what runs now is the method's counted work: inside a worker's rounds, outside `uncounted`."""
    ledger = current()
    return ledger is not None and not ledger.quiet


def count(key: str, amount=1.0) -> None:
    """Add ``amount`` (a number, or one per worker on the batched path) of ``key`` to this worker's ledger."""
    ledger = current()
    if ledger is not None:
        ledger.add(key, amount)


def count_once(tag: tuple, keys: tuple[str, ...], amount=1.0) -> None:
    """Count one of each of ``keys`` the first time this worker makes what ``tag`` names in the run (a factor of
    H_i + sI, kept by shift): one made again after its cache dropped it, or after a restart, counts once."""
    ledger = current()
    if ledger is None or ledger.depth or ledger.quiet or tag in ledger.made:
        return
    ledger.made.add(tag)
    for key in keys:
        ledger.add(key, amount)


def take_part(members: torch.Tensor) -> None:
    """The round's clients were drawn (`dane.sampling.ClientSampler.draw`): see the module docstring."""
    ledger = current()
    if ledger is not None:
        ledger.take_part(members)


@contextmanager
def uncounted():
    """Nothing computed in the block is counted: a measurement, not the method's work."""
    ledger = current()
    if ledger is None:
        yield
        return
    ledger.quiet += 1
    try:
        yield
    finally:
        ledger.quiet -= 1


def counted(key: str, amount: float | Callable[..., Any] = 1.0):
    """Decorate a problem's method: each call counts ``amount`` of ``key`` (or ``amount(self, *args)``: the
    rows of a minibatch over n_i), and counted methods it calls are not counted again."""

    def wrap(method):
        @functools.wraps(method)
        def inner(self, *args, **kwargs):
            ledger = current()
            if ledger is None or ledger.depth or ledger.quiet:
                return method(self, *args, **kwargs)
            ledger.add(key, amount(self, *args, **kwargs) if callable(amount) else amount)
            ledger.depth += 1
            try:
                return method(self, *args, **kwargs)
            finally:
                ledger.depth -= 1
        return inner

    return wrap


def rows_fraction(self, w, idx, *rest, **kwargs):
    """``counted``'s amount for a minibatch ``idx`` (per worker when stacked): its rows over n_i."""
    return idx.shape[-1] / self.n_local


def unit_costs(problem) -> np.ndarray:
    r"""Flops of one unit of each counter on ``problem``'s shard (d = dim, n = n_i, z = nonzeros of X_i times
    its classes):

    - a pass and a Hessian-vector product: 4z (X w, then Xᵀ u) on a shard with rows; 2d² on a quadratic given
      by its Hessian A_i alone; 6 d n on a network (forward and backward, d parameters, n rows);
    - a Hessian formed: 2 z d (Xᵀ D X); 0 on a shard given by its Hessian;
    - a factorization: d³/3 (Cholesky);
    - a solver iteration: `SOLVER_ITER_VECTOR_OPS` · d, an inner step: `INNER_STEP_VECTOR_OPS` · d (their
      products and gradients are counted as hvps and passes); an inner sample and a re-solve: 0 (in the passes, and
      a re-solve's work in its own counts).
    """
    d = float(problem.dim)
    nnz, n = problem.row_nonzeros, problem.n_local  # either may be one per worker on a stacked problem
    if nnz is not None:
        product = 4.0 * np.asarray(nnz, dtype=np.float64)
        hessian = product * d / 2
    elif n is None:
        product, hessian = np.float64(2.0 * d * d), np.float64(0.0)
    else:
        product = 6.0 * d * np.asarray(n, dtype=np.float64)
        hessian = np.zeros_like(product)
    columns = [product, product, hessian, d ** 3 / 3, SOLVER_ITER_VECTOR_OPS * d, INNER_STEP_VECTOR_OPS * d, 0.0, 0.0]
    return np.stack(np.broadcast_arrays(*columns), -1)


@contextmanager
def opened(ledger: Ledger):
    """``ledger`` is this thread's while the block runs (`dane.loop.runner.run`)."""
    previous = current()
    _here.ledger = ledger
    try:
        yield ledger
    finally:
        _here.ledger = previous


class Board:
    """The thread simulator's table of every worker's last snapshot, copied at each collective
    (`dane.comm.threads.ThreadGroup`), where no worker moves."""

    def __init__(self, size: int):
        self.table = np.zeros((size, len(COUNTS) + 1))
        self.captured = self.table.copy()
        self.dirty = False
        self.posts = np.zeros(size, dtype=np.int64)  # snapshots each worker has left: one a round, in lockstep

    def put(self, rank: int, row: np.ndarray) -> None:
        self.table[rank] = row
        self.posts[rank] += 1
        self.dirty = True

    def wait_for_all(self, comm) -> np.ndarray | None:
        """Every worker's snapshot of the round ``comm``'s worker has reached (a checkpoint's table), off its clock:
        the others leave theirs without a collective in between.  None if a worker failed meanwhile."""
        with comm.off_the_clock():
            while not (self.posts >= self.posts[comm.rank]).all():
                if comm.group.broken:
                    return None
                time.sleep(1e-4)
        return self.table.copy()

    def capture(self) -> None:
        if self.dirty:
            self.captured, self.dirty = self.table.copy(), False


_boards = threading.Lock()


def board_of(group) -> Board:
    """The `Board` of a thread group, made by the first worker that asks."""
    with _boards:
        if getattr(group, "work_board", None) is None:
            group.work_board = Board(group.size)
        return group.work_board


def post(comm, snapshot: np.ndarray) -> None:
    """At the round's start: a simulated thread leaves its snapshot (rows x 9) on its group's board; a launched rank
    sends it with the round's first allreduce (`dane.comm.Communicator.ride_next`)."""
    kind = _kind(comm)
    if kind == "threads":
        board_of(comm.group).put(comm.rank, snapshot[0])
    elif kind == "launched":
        comm.ride_next([_table_row(comm, snapshot)])


def reduce_over_workers(comm, snapshot: np.ndarray) -> dict[str, float] | None:
    """The record's work keys from every worker's snapshot of the round's start (after the round's collectives);
    None on a rank that writes no record.  Every rank of a launched run must call it: the table came with the round's
    first allreduce (`post`), or, in a round that made none, comes by an uncounted allreduce of its own."""
    kind = _kind(comm)
    if kind == "threads":
        if comm.rank != 0:
            return None
        table = board_of(comm.group).captured
    elif kind == "launched":
        table = gathered(comm, snapshot, comm.ridden())
        if comm.rank != 0:
            return None
    else:
        table = snapshot
    return record_keys(table)


def checkpoint_state(comm, ledger: Ledger, snapshot: np.ndarray) -> dict:
    """A checkpoint's ``work`` entry: the ledger's counts and, on rank 0, every rank's (under a launcher one more
    uncounted allreduce, at checkpoints only; in the thread simulator rank 0 waits for the board), which a Horovod
    elastic reset hands each rank from rank 0's state."""
    kind, table = _kind(comm), None
    if kind == "launched":
        table = gathered(comm, snapshot)
    elif kind == "threads" and comm.rank == 0:
        table = board_of(comm.group).wait_for_all(comm)
    return ledger.state_dict(table)


def gathered(comm, snapshot: np.ndarray, ridden: list[torch.Tensor] | None = None) -> np.ndarray:
    """Every rank's snapshot row (ranks x 9), exactly: from the mean of the table's shares that rode an allreduce
    (``ridden``, `post`), else by one `dane.comm.Communicator.uncounted_allreduce_mean`.

    A backend's mean is a sum divided by m (torch.distributed, the servers of comm=ps) or multiplied by fl(1/m)
    (Horovod's average), so a value v sent as it is comes back as fl(v/m), and m times that is v only to round-off
    (m = 3, v = 25: 24.999999999999996 after fl(1/3)).  So each value goes as two halves of 26 significant bits each,
    v = hi + lo (`_halves`), each times m, exact for m < 2^27.  Each entry of the sum is that of one rank and zeros,
    exact in any order; the mean is then hi (lo) within a few units in the last place, and the nearest number of 26
    significant bits to it is hi (lo) itself: whatever rounding the mean makes, hi + lo is v."""
    (mean,) = ridden or comm.uncounted_allreduce_mean([_table_row(comm, snapshot)])
    hi, lo = mean.double().chunk(2, dim=1)
    return (_halves(hi)[0] + _halves(lo)[0]).numpy()


def _table_row(comm, snapshot: np.ndarray) -> torch.Tensor:
    """This rank's share of the ranks x 18 table: its snapshot's halves (`_halves`) times m in its row, zeros
    elsewhere (`gathered`)."""
    rows = torch.zeros(comm.size, 2 * snapshot.shape[1], dtype=torch.float64)
    rows[comm.rank] = torch.cat(_halves(torch.from_numpy(snapshot[0]).double())) * comm.size
    return rows


#: Dekker's splitter for float64: 2^27 + 1 cuts 53 significant bits into two parts of at most 26 each
_SPLITTER = 2.0 ** 27 + 1


def _halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo), hi the nearest number of 26 significant bits to ``x`` and lo = x - hi, also of at most 26 (Dekker's
    split, exact in round-to-nearest float64 for |x| below about 1e300)."""
    scaled = x * _SPLITTER
    hi = scaled - (scaled - x)
    return hi, x - hi


def record_keys(table: np.ndarray) -> dict[str, float]:
    """{key: sum over the workers, key_max: the largest} of a workers x 9 table (a column per `COUNTS` name, then
    `FLOPS`); another shape raises ValueError."""
    names = (*COUNTS, FLOPS)
    if table.ndim != 2 or table.shape[1] != len(names) or table.shape[0] == 0:
        raise ValueError(f"the local work table must be workers x {len(names)} ({', '.join(names)}), "
                         f"got shape {tuple(table.shape)}")
    totals, largest = table.sum(0), table.max(0)
    return {**{k: float(v) for k, v in zip(names, totals)}, **{f"{k}_max": float(v) for k, v in zip(names, largest)}}


def _kind(comm) -> str:
    kind = _kind_of(type(comm))
    return "local" if kind == "local" or comm.size == 1 else kind  # one worker makes no collective the board reads


def _kind_of(cls: type) -> str:
    """As the communicator's class declares it (`dane.comm.Communicator.local_work_path`), so that this module,
    below the communicators, imports none of them."""
    path = getattr(cls, "local_work_path", "stacked")
    return "local" if path == "stacked" else path  # stacked, or no communicator: every count is this ledger's
