r"""``problem=ridge | logreg | softmax``: a linear model on any data source.

The data comes from a source in ``conf/data/`` (CSV, LIBSVM, NPZ, or a built-in set,
`dane.data.files`).  Rows are dealt to workers by ``data.sharding`` (`dane.data.sharding`: by default a
seeded permutation; Dirichlet label skew, C classes per worker, power-law sizes; one client per
value of a column of the file), identical on every backend; a presharded source (``data.path``
with ``{rank}``) gives each process only its own file, so no process holds more than its shard.

No process solves the whole problem before round 0.  ``problem.optimum`` (`dane.problems.optimum`)
asks for a reference optimum when suboptimality is wanted: ``auto`` reads it from the
cache or has the run's own workers compute it (distributed Newton-CG, each on its
shard), a path reads a saved one, and ``none`` (the default) computes nothing: records
then carry the gradient norm, and ``tol`` is relative to its value at round 0.

``problem.standardize_target`` (ridge): the workers fit y' = (y − ȳ)/s (s the population
std of y over all rows) and everything a run reports is in y's units.  With w = s·w',

    O(w) = (1/2N) Σ (ȳ + x·w − y)² + (λ/2)‖w‖² = s² O'(w'),   ∇O(w) = s ∇O'(w'),

so records' objective and suboptimality are O'·s², grad_norm ‖∇O'‖·s, the iterate s·w',
and a prediction is ȳ + x·w (ȳ is in the notes).  This is ridge on the centred target;
with ``fit_intercept`` the intercept is penalized in both, so it differs from ridge on
the raw target by the penalty on the offset ȳ only.  Algorithm parameters (μ, ρ, lr)
act on the standardized problem.

``problem.device`` (``cpu``, the default; ``cuda``; ``auto``: CUDA when torch sees one, else the
CPU): where each worker's rows and local solves live (`dane.problems.glm`, *Device*); CUDA is
pinned by local rank as for the networks (`dane.problems.neural.pick_device`), and the
simulator's workers then take turns on the one GPU (`dane.comm.threads.DeviceTurns`).  The
default stays ``cpu``: a small convex problem gains nothing from a GPU, and a run's records stay
bit-identical wherever it runs.  The device each worker resolved is in its notes.
``problem.dtype`` (null: the run's ``dtype``, float64 by default; ``float32`` is an opt-in whose
accuracy against float64 tests/test_device.py measures) is the precision of the rows, the
iterate and every solve but the reference optimum's, which is float64 in every run
(`dane.problems.optimum`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse
import torch

from .. import checks
from ..errors import ConfigError
from ..seeds import worker_seed
from ..losses import LOSSES
from .base import ProblemConfig
from .glm import SOLVER_STREAM, LinearModelShard, SolverOptions, add_intercept, to_torch
from .optimum import attach, check_mode

# Each process keeps one data set: key (`LinearModelConfig.data_key`, ...) -> (the source, what was read); the
# source is held so that no other object takes its address while its key is in use (a source of one's own
# without a __repr__ is keyed by its address).
_TABLES: dict[tuple, Any] = {}
_SHARDS: dict[tuple, Any] = {}  # (data key, loss, workers, seed) -> (source, (every worker's rows, notes)): non-iid
#: d-vectors (per class) a worker holds besides its data: the iterate, gradients, the local solver's and the
#: algorithm's state; a generous count, since the check is there to refuse a d that cannot fit at all
VECTORS_PER_WORKER = 16


def check_memory(X, classes: int, method: str, source: str, dtype: torch.dtype = torch.float64,
                 float64_copy: bool = False) -> None:
    """Refuse, before the tensors are made, a worker whose d (from the data: a LIBSVM file's largest index,
    ``data.n_features``, an .npz's ``X_shape``) cannot fit: its rows as tensors in ``dtype`` and their transpose where
    the shard builds one (sparse rows: a CSR of d rows over the same non-zeros, `dane.problems.glm.LinearModelShard`;
    dense with several classes: a copy, `dane.problems.glm.transposed`), with ``float64_copy`` (a float32 run at
    ``problem.optimum=auto``) their float64 copy and its transpose, on which the reference optimum is solved
    (`dane.problems.optimum.attach`), `VECTORS_PER_WORKER` vectors of d per class, and a d x d Hessian with its factor
    for a Cholesky local solve (float64: the reference's on the copy, or a float64 run's)."""
    n, d = X.shape
    sparse = scipy.sparse.issparse(X)
    twice = sparse or classes > 1  # the shard's transpose is a second copy of its rows

    def rows_in(value_bytes: int) -> int:  # CSR: a value and an int64 column index a non-zero, an int64 row pointer
        if sparse:  # the n-row CSR and its d-row transpose
            return 2 * (value_bytes + 8) * X.nnz + 8 * (n + d)
        return value_bytes * n * d * (2 if twice else 1)

    rows = rows_in(dtype.itemsize)
    copy = rows_in(8) if float64_copy else 0
    vectors = 8 * VECTORS_PER_WORKER * d * classes
    hessian = 8 * 2 * (d * classes) ** 2 if method == "cholesky" else 0
    parts = f"{n} rows{' and their transpose' if twice else ''} {checks.gigabytes(rows)}"
    parts += f", their float64 copy for the reference optimum {checks.gigabytes(copy)}" if copy else ""
    parts += f", {VECTORS_PER_WORKER} vectors of d {checks.gigabytes(vectors)}"
    parts += f", a d x d Hessian and its factor {checks.gigabytes(hessian)}" if hessian else ""
    fix = "use problem.local_solver=cg (no d x d matrix)" if hessian > rows + copy + vectors else \
        "check the data's feature count (data.n_features, a LIBSVM file's largest index, an .npz's X_shape)"
    fix += ", or problem.optimum=none (no float64 copy)" if copy else ""
    checks.fits_in_memory(f"data {source} with d={d} features", rows + copy + vectors + hessian, parts, fix)


@dataclass(frozen=True)
class LinearModelConfig(SolverOptions, ProblemConfig):
    """A linear model (``loss``: squared | logistic | softmax) with (λ/2)||w||² on ``data``."""

    data: Any = None
    loss: str = "squared"
    lam: float = 1e-3
    fit_intercept: bool = False
    classes: int | None = None   # softmax with presharded data: the number of classes (a part may lack some)
    optimum: Any = "none"        # none | auto | a saved w* (dane.problems.optimum): records then carry suboptimality
    standardize_target: bool = False  # ridge: fit (y - mean)/std, report in y's units (the module docstring)
    device: str = "cpu"          # cpu | cuda | auto (the module docstring)
    dtype: str | None = None     # null: the run's dtype; float32 | float64
    seed: int = 0
    name: str = "ridge"

    def __post_init__(self) -> None:
        checks.one_of("problem.loss", self.loss, tuple(LOSSES))
        checks.nonnegative("problem.lam", self.lam)
        checks.boolean("problem.fit_intercept", self.fit_intercept)
        object.__setattr__(self, "optimum", check_mode("problem.optimum", self.optimum))
        if self.classes is not None:
            checks.positive_int("problem.classes", self.classes)
            if self.loss != "softmax":  # was left unread: LogReg(X, y, classes=3) fitted two classes
                raise ConfigError(f"problem.classes={self.classes} is the class count of problem=softmax; "
                                  f"problem={self.name} does not read it: drop it, or use problem=softmax")
        if self.data is None:
            raise ConfigError(f"problem={self.name} needs data: data=csv data.path=... data.target=..., "
                              "data=libsvm data.path=..., data=npz data.path=..., or data=builtin data.dataset=...")
        self.solver  # validates the local-solver keys now
        classes = getattr(self.source, "label_classes", None)  # a source that knows its labels' classes unread
        if self.loss == "logistic" and classes is not None and classes > 2:
            raise ConfigError(f"problem={self.name} fits two classes, but {self.source.name} has {classes} (labels "
                              f"0..{classes - 1}); use problem=softmax problem.classes={classes}")
        if self.loss == "softmax" and classes is not None and (self.classes or 0) < classes \
                and (self.classes is not None or self.source.presharded):  # the parts need it: one may lack a class
            given = "problem.classes is not set" if self.classes is None else f"problem.classes={self.classes}"
            raise ConfigError(f"{given}, but {self.source.name}'s labels take {classes} classes (0..{classes - 1}); "
                              f"set problem.classes={classes}")
        if self.loss != "squared" and self.lam == 0:
            raise ConfigError(f"problem.lam must be > 0 for problem={self.name} (the {self.loss} loss alone may "
                              "have no minimizer, e.g. on separable data), got 0")
        checks.boolean("problem.standardize_target", self.standardize_target)
        from .neural import DEVICES, DTYPES

        checks.one_of("problem.device", self.device, DEVICES)
        if self.dtype is not None:
            checks.one_of("problem.dtype", self.dtype, tuple(DTYPES))
        if self.standardize_target and self.loss != "squared":
            raise ConfigError(f"problem.standardize_target=true scales a regression target; problem={self.name}'s "
                              f"labels are classes: drop it")
        if self.standardize_target and self.source.presharded:
            raise ConfigError(f"problem.standardize_target=true with per-worker parts (data.path={self.source.path}) "
                              "would scale each part's target by its own statistics; standardize y when you write "
                              "the parts")

    @property
    def source(self):
        from .neural import DataConfig

        if isinstance(self.data, DataConfig):  # a built-in set named by the neural problems' data group
            from ..data.files import BuiltinSource
            from ..data.sharding import sharding_keys

            return BuiltinSource(dataset=self.data.dataset, data_dir=self.data.data_dir, **sharding_keys(self.data))
        return self.data

    # ------------------------------------------------------------------ full data, labels, optimum
    @property
    def by_id(self) -> bool:
        """Whether the source deals rows from an (id, y) projection and each worker fetches its own by id
        (``data=mongo``: `dane.data.mongo_source`), so no process holds the whole table."""
        return getattr(self.source, "by_id", False)

    def labels(self) -> np.ndarray:
        """Every row's label, checked for the loss (and standardized with ``standardize_target``): the whole
        table's, or a by-id source's (id, y) projection's."""
        if not self.by_id:
            return self.table().y
        return self._by_id_labels()[0]

    def _by_id_labels(self) -> tuple[np.ndarray, tuple[float, float] | None, list[str], str | None]:
        """`_fitted_labels` of a by-id source's labels, kept for the process, and the push they were read from (the
        manifest's ``push_id``): every later read of the process's workers (their rows, the clients, a skewed
        column) is refused where the data set has been pushed again since (`dane.data.mongo_source.MongoSource.
        check_push`), so that no worker's rows are another push's than the labels that dealt them."""
        key = ("labels", self.data_key(), self.loss, self.standardize_target)
        if key not in _TABLES:
            _, y, manifest = self.source.labels()
            _TABLES.clear()
            fitted = self._fitted_labels(y, f"mongo:{self.source.collection}")
            _TABLES[key] = self.source, (*fitted, manifest.get("push_id"))
        return _TABLES[key][1]

    def _fitted_labels(self, y: np.ndarray, name: str) -> tuple[np.ndarray, tuple[float, float] | None, list[str]]:
        """Every row's label checked for the loss (all rows: one class is refused) and, with ``standardize_target``,
        standardized; the target's units (None: as read) and the notes that say what was done."""
        from ..data.labels import check_labels, two_class_note

        notes = [note for note in [two_class_note(y, self.loss)] if note is not None]
        y = check_labels(y, self.loss, name, whole=True)
        units = None
        if self.standardize_target:
            y, units, note = standardized_target(y)
            notes.append(note)
        return y, units, notes

    def target_units(self) -> tuple[float, float] | None:
        """(ȳ, s) of ``standardize_target`` (the module docstring)."""
        return self._by_id_labels()[1] if self.by_id else self.table().target_units

    def data_key(self) -> tuple:
        """What identifies the source's rows in this process's caches: its repr (an `ArraySource`'s holds a digest
        of its arrays) and, for a source read from files, their `dane.data.table.file_stamps` (``content_stamp``),
        so that a file rewritten since it was read is read again."""
        stamp = getattr(self.source, "content_stamp", None)
        return repr(self.source), stamp() if callable(stamp) else None

    def table(self):
        """The whole data set, labels checked for the loss (cached per process, per `data_key` and per everything
        this method does to the rows: the loss's labels, the intercept column, the target's units)."""
        key = (self.data_key(), self.loss, self.fit_intercept, self.standardize_target)
        if key not in _TABLES:
            table = self.source.load()
            table.y, units, notes = self._fitted_labels(table.y, table.name)
            table.notes.extend(notes)
            if units is not None:
                table.target_units = units
            if self.fit_intercept:
                table.X = add_intercept(table.X)
            _TABLES.clear()  # one data set at a time: a sweep over problems must not pile them up
            _TABLES[key] = self.source, table
        return _TABLES[key][1]

    def num_classes(self, y: np.ndarray) -> int:
        if self.loss != "softmax":
            return 1
        return self.classes if self.classes is not None else int(y.max()) + 1

    def prepare(self) -> None:
        """Load the data once per process, so that `build` does only a worker's own work (a by-id source:
        its labels only)."""
        if self.by_id:
            self.labels()
        elif not self.source.presharded:
            self.table()

    def attach_reference(self, problem: LinearModelShard, comm) -> None:
        """Collective: give the built worker ``problem`` its reference optimum (``problem.optimum``)."""
        key = (f"{self.loss}|lam={self.lam!r}|intercept={self.fit_intercept}|classes={problem.classes}|"
               f"d={problem.dim}")
        note = attach(problem, comm, self.optimum, key)
        if note is not None:
            problem.notes.append(note)

    def release(self) -> None:
        """Drop the cached full table: a process that runs one worker keeps only that worker's rows."""
        _TABLES.clear()
        _SHARDS.clear()

    def check_device(self) -> None:
        """Refuse ``problem.device=cuda`` where torch sees no GPU, in one line (at run time: a config may be
        composed on a host without one)."""
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("problem.device=cuda but torch sees no CUDA device; use problem.device=auto or cpu")

    def check_workers(self, workers: int) -> None:
        """Refuse, in one line, workers the rows cannot be dealt to, once per run before any process group; a by-id
        source's labels are read afresh here, so that a run reads the push its store holds now, not the one a run
        before it in this process kept (its reads would then be refused: `_by_id_labels`)."""
        self.check_device()
        if self.source.presharded:
            return  # each part is checked by the process that reads it
        if self.by_id:
            self.release()
        n = len(self.labels())
        if workers > n:
            name = f"mongo:{self.source.collection}" if self.by_id else self.table().name
            raise ConfigError(f"workers={workers} exceeds the {n} rows of {name}; use fewer workers")
        self.worker_rows(0, workers)  # a scheme that cannot deal these rows fails here, before any process group

    def worker_rows(self, rank: int, size: int) -> tuple[np.ndarray, list[str]]:
        """Worker ``rank``'s rows of the whole table (``data.sharding``: `dane.data.sharding`), and on rank 0 the
        notes that give every worker's size and histogram.  ``iid`` deals by `iid_shards`' permutation, as
        ever; the other schemes are dealt once per process and kept for the other ranks it builds."""
        from ..data.sharding import iid_shards, sharding_keys

        keys = sharding_keys(self.source)
        y = self.labels()
        if keys["sharding"] == "iid":
            return iid_shards(len(y), size, self.seed)[rank].numpy(), []
        shards, notes = self._dealt(size, keys, y)
        return shards[rank], notes if rank == 0 else []

    def _dealt(self, size: int, keys: dict, y: np.ndarray) -> tuple[list[np.ndarray], list[str]]:
        """Every worker's rows under a scheme other than ``iid`` and the notes, dealt once per process and kept
        (`_SHARDS`, per `data_key`) for the other ranks it builds."""
        from ..data.sharding import COLUMN, ShardingKeys

        key = (self.data_key(), self.loss, size, self.seed)
        if key not in _SHARDS:
            _SHARDS.clear()
            clients = None
            if not self.by_id:
                table = self.table()
                X, names, clients = table.X, table.feature_names, table.clients
            elif keys["sharding"] == COLUMN:  # by id: the clients alone, read as the (id, client) projection
                X = names = None
                clients = self.source.clients(self._by_id_labels()[3])
            elif keys["skew_on"] != "y":  # by id: the one column skewed on, read as a projection
                column, name = self.source.column(keys["skew_on"], self._by_id_labels()[3])
                X, names, keys = column[:, None], [name], {**keys, "skew_on": name}
            else:
                X = names = None  # by id: the labels alone
            _SHARDS[key] = self.source, ShardingKeys(**keys).deal(y, size, seed=self.seed, X=X, feature_names=names,
                                                                  regression=self.loss == "squared", clients=clients)
        return _SHARDS[key][1]

    def all_worker_rows(self, size: int) -> list[np.ndarray]:
        """`worker_rows`' rows for ranks 0 .. size − 1, dealt once (not once per rank: ``iid`` draws its
        permutation per call, and each call re-reads the sharding keys)."""
        from ..data.sharding import iid_shards, sharding_keys

        keys, y = sharding_keys(self.source), self.labels()
        if keys["sharding"] == "iid":
            return [part.numpy() for part in iid_shards(len(y), size, self.seed)]
        return list(self._dealt(size, keys, y)[0])

    # ------------------------------------------------------------------ all workers stacked (sim.batched)
    def stacked_form(self, size: int) -> str | None:
        """The batched simulator covers one-output models (ridge, logreg) on dense rows dealt in equal shards,
        solved exactly, with no reference optimum to attach (`dane.problems.stacked.StackedLinearModel`)."""
        if self.loss not in ("squared", "logistic"):
            return f"problem={self.name}: the {self.loss} loss has no batched form yet (ridge and logreg have)"
        if self.source.presharded:
            return "presharded data is read part by part, one per worker"
        if self.optimum != "none":
            return "the reference optimum is attached per worker; set problem.optimum=none"
        if self.by_id:
            manifest = self.source.labels()[2]
            sparse, n, d = manifest["kind"] == "sparse", manifest["n"], manifest["d"]
        else:
            table = self.table()
            sparse, n, d = scipy.sparse.issparse(table.X), len(table.y), table.X.shape[1]
        if sparse:
            return "sparse rows have no batched form"
        dim = d + int(self.fit_intercept)
        if self.solver.resolve(dim, False).method != "cholesky":
            return f"problem.local_solver={self.local_solver} has no batched form (the exact solve, cholesky, has)"
        sizes = {len(rows) for rows in self.all_worker_rows(size)}
        if len(sizes) > 1:
            return f"the {n} rows are dealt in shards of {min(sizes)} to {max(sizes)} rows, not equal ones"
        return None

    def build_stacked(self, size: int, dtype: torch.dtype = torch.float64):
        """The ``size`` shards of `build`, row for row, stacked into one `StackedLinearModel` (equal shards).

        Worker 0's shard is built (its notes, its checks, its solver); on a table held in memory and a CPU device
        the others are its rows gathered at once (m x n row indices into X and y, as `build` takes them one
        worker at a time, the same values), not m shards built one by one."""
        from .neural import DTYPES
        from .stacked import StackedLinearModel

        first = self.build(0, size, dtype)
        if self.source.presharded or self.by_id or first.device.type != "cpu":
            shards = [first, *(self.build(rank, size, dtype) for rank in range(1, size))]
            X, y = torch.stack([s.X for s in shards]), torch.stack([s.y for s in shards])
        else:
            dtype = DTYPES[self.dtype] if self.dtype is not None else dtype
            table, idx = self.table(), np.stack(self.all_worker_rows(size))
            X = torch.as_tensor(np.ascontiguousarray(table.X[idx])).to(dtype)
            y = torch.as_tensor(table.y[idx], dtype=dtype)
        problem = StackedLinearModel(X, y,
                                     first.loss, l2=first.l2, weight=first.weight, solver=first.solver,
                                     notes=first.notes, device=first.device, solver_notes=first.solver_notes)
        problem.target_units, problem.data_info = first.target_units, first.data_info
        return problem

    # ------------------------------------------------------------------ one worker
    def build(self, rank: int, size: int, dtype: torch.dtype = torch.float64) -> LinearModelShard:
        from ..data.labels import check_labels
        from .neural import DTYPES

        dtype = DTYPES[self.dtype] if self.dtype is not None else dtype
        notes = []
        if self.source.presharded:
            if self.loss == "softmax" and self.classes is None:
                raise ConfigError("problem=softmax on presharded data needs problem.classes (a part may lack a class)")
            part, n_total = self.source.load_part(rank, size)
            # every part codes the labels against the same class list, even one that lacks a class
            classes = np.arange(self.classes) if self.loss == "softmax" else None
            X, y, labels = part.X, check_labels(part.y, self.loss, part.name, classes=classes), None
            if self.fit_intercept:
                X = add_intercept(X)
            notes += part.notes
        elif self.by_id:  # deal from the labels, then fetch this worker's rows alone, by id
            y_all = self.labels()
            n_total = len(y_all)
            idx, shard_notes = self.worker_rows(rank, size)
            _, _, label_notes, push_id = self._by_id_labels()
            part = self.source.fetch(idx + 1, push_id)  # ids are 1..n in row order; the labels' push, or one line
            X, y, labels = part.X, y_all[idx], y_all
            if self.fit_intercept:
                X = add_intercept(X)
            notes += part.notes + label_notes + shard_notes
        else:
            table = self.table()
            n_total = len(table.y)
            idx, shard_notes = self.worker_rows(rank, size)
            X, y, labels = table.X[idx], table.y[idx], table.y
            notes += table.notes + shard_notes
        problem = self._shard(X, y, size=size, n_total=n_total, rank=rank, dtype=dtype, notes=notes, labels=labels)
        if self.by_id:  # the workers of a launched run check that they read one push (dane.loop.worker.check_one_push)
            problem.data_push = self.source.pushed(self._by_id_labels()[3])
        if self.standardize_target:
            problem.target_units = self.target_units()
        return problem

    def _shard(self, X, y, *, size: int, n_total: int, rank: int, dtype: torch.dtype, notes=(),
               labels: np.ndarray | None = None) -> LinearModelShard:
        """Worker ``rank``'s problem on its rows ``X, y``; ``labels``: the whole data set's, where a process read
        them, so that every worker counts the same classes (a skewed shard may lack the largest)."""
        from .neural import pick_device

        self.check_device()  # again: a caller may build without check_workers
        labels = y if labels is None else labels
        classes = self.num_classes(labels)
        y_t = torch.as_tensor(y, dtype=torch.int64 if self.loss == "softmax" else dtype)
        if self.loss == "softmax" and len(labels) and int(labels.max()) >= classes:
            raise ConfigError(f"problem.classes={classes} but the labels go up to {int(labels.max())}; raise "
                              f"problem.classes to {int(labels.max()) + 1}, or drop it (read from the labels)")
        check_memory(X, classes, self.solver.resolve(X.shape[1], scipy.sparse.issparse(X)).method,
                     getattr(self.source, "path", self.source.name), dtype,
                     float64_copy=self.optimum == "auto" and dtype != torch.float64)
        problem = LinearModelShard(to_torch(X, dtype), y_t, LOSSES[self.loss], l2=self.lam, weight=size / n_total,
                                   classes=classes, solver=self.solver,
                                   seed=worker_seed(self.seed, rank, SOLVER_STREAM), notes=notes,
                                   device=pick_device(self.device, rank))
        problem.solver_notes.worker = rank  # whose rows its SVRG nulls read
        problem.notes.append(f"local solver: {self.local_solver} -> {problem.solver.method} (d={problem.dim}, "
                             f"{'sparse' if problem.sparse else 'dense'} X, {len(y)} rows on this worker)")
        if self.device != "cpu":  # auto's choice, or the GPU cuda pinned this worker to
            problem.notes.append(f"problem.device={self.device} -> {problem.device}")
        return problem


def standardized_target(y: np.ndarray) -> tuple[np.ndarray, tuple[float, float], str]:
    """(y − ȳ)/s with s the population std, the units (ȳ, s) that map results back, and the note saying so."""
    shift, scale = float(y.mean()), float(y.std())
    if not scale > 0:
        raise ConfigError(f"problem.standardize_target=true but the target is constant ({shift:g}); drop it")
    return (y - shift) / scale, (shift, scale), \
        (f"standardized the target: y' = (y - {shift:.10g}) / {scale:.10g}; objective, suboptimality, grad_norm "
         f"and the iterate are reported in y's units, and a prediction is {shift:.10g} + x.w")
