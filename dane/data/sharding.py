r"""Split training rows across workers: IID, or heterogeneous on purpose (``data.sharding``).

DANE's analysis assumes each worker holds an i.i.d. sample; the other schemes break
that on purpose to study heterogeneous shards. Every source takes the same keys
(`ShardingKeys`: the CSV, LIBSVM and NPZ files, the built-in sets, and the neural
problems' data sets), and this module is the one place that deals rows:

- ``iid``: a seeded permutation cut into pieces whose sizes differ by at most one. The linear
  models deal by `iid_shards` (the rows ``dane.shards`` gives); the neural problems by
  `shard_indices`, whose permutation is drawn from another generator.
- ``dirichlet`` (Hsu, Qi and Brown, 2019): for each group c, proportions
  p_c ~ Dir(α·1_m) divide c's rows among the m workers; small α gives each worker
  few groups, large α tends to IID.
- ``classes`` ("C classes per client", as in McMahan et al. 2017 and NIID-Bench): the
  K groups, in a seeded order π, go round-robin, worker i holding
  π[(iC + j) mod K] for j < C; each group's rows are split evenly among its holders.
  Every worker holds exactly C groups (when each group has at least as many rows as
  holders), and m·C ≥ K is required so that every row is dealt.
- ``quantity`` (quantity skew): IID content, power-law sizes
  n_i ≈ N (i+1)^{-γ} / Σ_j (j+1)^{-γ} (`power_law_sizes`), worker 0 the largest.
- ``column`` (natural partitions, `column_shards`): a column of the data names each row's
  client (``client_column``: a CSV header, an ``.npz`` key, LIBSVM's ``qid``); each distinct
  value is one client, and client i, in the order of the values (numerically when every value
  is a number, else as text), is worker i. The number of workers must equal the number of
  values: a run with another count stops with one line giving the count, rather than group
  clients silently (a worker that held several values would be a client the data does not
  have, and client sampling would draw such groups, not the data's clients). The column is
  no feature. No seed enters.

The groups of ``dirichlet`` and ``classes`` are, with ``skew_on=y`` (the default), the
labels of a classification problem, or for a regression target its ``bins`` quantile
bins; with ``skew_on`` naming a feature column (by name or 0-based index), that
covariate's quantile bins (`quantile_bins`). A scheme never leaves a worker empty
(`fill_empty`). Shards depend only on the groups, the worker count and the seed (a
``numpy.random.default_rng(seed)``, no global state), so every process and every
backend computes the same shards without communicating. Per-worker parts (``{rank}``
in ``data.path``) are natural partitions: only ``iid`` (read: as written) applies to them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache

import numpy as np
import torch

from dane import checks
from dane.data.table import is_number, missing_rows
from dane.errors import ConfigError, DataError, plural

SCHEMES = ("iid", "dirichlet", "classes", "quantity")
COLUMN = "column"  # clients from a column of the data: `column_shards`, not a scheme of `shard_indices`
SHARDINGS = (*SCHEMES, COLUMN)
COLUMN_SOURCES = "data=csv|npz|libsvm|mongo"  # the sources a client column is read from (data.client_column)
GROUPED = ("dirichlet", "classes")  # the schemes that deal by group (label or quantile bin)
SKEW_ON_Y = "y"
#: the stream of `iid_permutation`'s generator, ``numpy.random.default_rng([seed, PERMUTATION_STREAM])``
PERMUTATION_STREAM = 1


@lru_cache(maxsize=16)
def iid_permutation(n_rows: int, seed: int) -> np.ndarray:
    """The order in which `iid_shards` deals ``n_rows`` rows for ``seed``: a permutation of 0..n_rows-1.

    Cached and shared between calls (each rank of a synthetic ridge run reads it): read it, do not change it.
    """
    return np.random.default_rng([seed, PERMUTATION_STREAM]).permutation(n_rows)


@lru_cache(maxsize=16)
def iid_shards(n_rows: int, workers: int, seed: int) -> list[torch.Tensor]:
    """The rows (sorted int64) each of ``workers`` workers holds under ``iid`` in a linear model's run (any backend).

    Worker r holds the r-th of ``workers`` contiguous parts of `iid_permutation` (``numpy.array_split``: sizes that
    differ by at most one). The list is cached and shared between calls: read it, do not change it.
    """
    return [torch.from_numpy(np.sort(part)) for part in np.array_split(iid_permutation(n_rows, seed), workers)]


def check_workers(n_rows: int, workers: int) -> None:
    """``workers`` is at least 1 and at most ``n_rows`` (one line each), so that no worker is left without rows."""
    if workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}")
    if workers > n_rows:
        raise ConfigError(
            f"workers={workers} exceeds the {n_rows} training samples; use fewer workers or more data"
        )


def shard_indices(
    labels: torch.Tensor | np.ndarray, workers: int, *, scheme: str = "iid", alpha: float = 1.0,
    classes_per_worker: int = 2, exponent: float = 1.0, seed: int
) -> list[torch.Tensor]:
    """Partition ``range(len(labels))`` into ``workers`` non-empty shards of sorted int64 indices.

    ``labels`` are the groups of ``dirichlet`` and ``classes`` (ignored by ``iid`` and
    ``quantity``); ``alpha`` is the Dirichlet concentration, ``classes_per_worker`` the C
    of ``classes``, ``exponent`` the γ ≥ 0 of ``quantity``. The module docstring states
    each scheme.
    """
    n = len(labels)
    if scheme not in SCHEMES:
        raise ConfigError(f"unknown sharding scheme '{scheme}'; use one of: {', '.join(SCHEMES)}")
    check_workers(n, workers)
    if scheme == "dirichlet":  # data.alpha='x': a TypeError comparing it (checked here, as only dirichlet reads it:
        checks.positive("data.alpha", alpha)  # data=synthetic's alpha is the paper's, 0 allowed)
    rng = np.random.default_rng(seed)
    if scheme == "iid":
        shards = np.array_split(rng.permutation(n), workers)
    elif scheme == "quantity":
        shards = np.split(rng.permutation(n), np.cumsum(power_law_sizes(n, workers, exponent))[:-1])
    else:
        groups = torch.as_tensor(labels).cpu().numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
        deal = _dirichlet_shards if scheme == "dirichlet" else _class_shards
        shards = fill_empty(deal(groups, workers, alpha if scheme == "dirichlet" else classes_per_worker, rng))
    return [torch.as_tensor(np.sort(shard), dtype=torch.int64) for shard in shards]


def power_law_sizes(n: int, workers: int, exponent: float) -> np.ndarray:
    r"""Shard sizes n_i, i < m, that sum to n: N p_i with p_i = (i+1)^{-γ} / Σ_j (j+1)^{-γ}, rounded.

    Each n_i is ⌊N p_i⌋ or ⌈N p_i⌉ (the largest remainders round up, ties to the lower
    i), so |n_i − N p_i| < 1; then a size that rounded to 0 takes one row from the largest
    (at most m − 1 moves, since n ≥ m). γ = 0 gives sizes that differ by at most one.
    """
    if not (isinstance(exponent, (int, float)) and not isinstance(exponent, bool) and exponent >= 0):
        raise ConfigError(f"data.exponent must be >= 0 (0: equal sizes), got {exponent!r}")
    weights = np.arange(1, workers + 1, dtype=np.float64) ** -float(exponent)
    exact = n * weights / weights.sum()
    sizes = np.floor(exact).astype(np.int64)
    short = n - int(sizes.sum())
    sizes[np.argsort(-(exact - sizes), kind="stable")[:short]] += 1
    for empty in np.flatnonzero(sizes == 0):
        sizes[np.argmax(sizes)] -= 1
        sizes[empty] = 1
    return sizes


def quantile_bins(values: np.ndarray, bins: int) -> np.ndarray:
    """Bin 0..bins-1 of each value by its rank: the k-th smallest of n goes to bin ⌊k·bins/n⌋.

    So the bins hold n/bins rows each (±1) whatever the ties; tied values are ordered by
    row (a stable sort), so the bins are a function of the values alone.
    """
    order = np.argsort(np.asarray(values, dtype=np.float64), kind="stable")
    out = np.empty(len(order), dtype=np.int64)
    out[order] = np.arange(len(order)) * bins // max(len(order), 1)
    return out


def fill_empty(shards: list[np.ndarray]) -> list[np.ndarray]:
    """No shard left empty: while one is, it takes one sample (the last) from the currently largest.

    A worker with no data has no gradient or Hessian to contribute. Because there are at
    least as many samples as workers, the largest shard then holds at least two, so the
    move never empties it, and each move fills one empty shard: the loop ends after at
    most ``workers - 1`` moves and changes the skew by only that many samples.
    """
    for empty in [w for w, shard in enumerate(shards) if len(shard) == 0]:
        donor = max(range(len(shards)), key=lambda w: len(shards[w]))
        shards[empty], shards[donor] = shards[donor][-1:], shards[donor][:-1]
    return shards


def column_shards(values, workers: int, *, name: str = "the client column"
                  ) -> tuple[list[np.ndarray], list[str]]:
    """One shard per distinct value of ``values`` (one per row): the sorted int64 rows holding it, and the value.

    Clients are in the order of their values: numerically when every value is a number (so
    ``2`` before ``10``), else as text; so the client of worker i depends on the data alone.
    ``values`` may be numbers or strings (a NumPy array or a sequence); a value that names no client
    (`dane.data.table.missing_rows`: NaN, inf, or a text the CSV reader reads as missing such as ``''``
    or ``'nan'``) is refused, as is a count of distinct values other than ``workers``: one line, naming
    ``name`` (the setting that chose the column, e.g. ``data.client_column=country``) and the worker
    count to use.
    """
    checks.positive_int("workers", workers)
    column = np.asarray(values)
    if column.ndim != 1:
        raise DataError(f"{name} must hold one value per row, got shape {column.shape}")
    missing = np.flatnonzero(missing_rows(column))
    if missing.size:  # the sources refuse these when they read them; this is for any other caller
        row = int(missing[0])
        raise DataError(f"{name} is {column[row].item()!r} at row {row} (0-based); every row needs a client, "
                        "fill it in")
    distinct, codes = np.unique(column if column.dtype.kind in "biuf" else column.astype(str), return_inverse=True)
    labels = [_client_label(v) for v in distinct]
    if distinct.dtype.kind not in "biuf" and all(is_number(v) for v in labels):
        order = sorted(range(len(labels)), key=lambda k: (float(labels[k]), labels[k]))
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order))
        codes, labels = rank[codes], [labels[k] for k in order]
    k = len(labels)
    if k != workers:
        raise ConfigError(f"{name} has {k} distinct values (clients), one per worker, but workers={workers}; "
                          f"set workers={k} (under horovodrun or torchrun: launch {k} processes)")
    rows = np.argsort(codes.ravel(), kind="stable")  # stable: each client's rows stay in file order
    shards = np.split(rows.astype(np.int64), np.cumsum(np.bincount(codes.ravel(), minlength=k))[:-1])
    return shards, labels


def _dirichlet_shards(labels: np.ndarray, workers: int, alpha: float, rng: np.random.Generator) -> list[np.ndarray]:
    pieces: list[list[np.ndarray]] = [[] for _ in range(workers)]
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        proportions = rng.dirichlet(np.full(workers, alpha))
        cuts = (np.cumsum(proportions)[:-1] * len(members)).astype(np.int64)
        for worker, part in enumerate(np.split(members, cuts)):
            pieces[worker].append(part)
    return [np.concatenate(parts) for parts in pieces]


def _class_shards(labels: np.ndarray, workers: int, per_worker: int, rng: np.random.Generator) -> list[np.ndarray]:
    classes = np.unique(labels)
    k = len(classes)
    checks.positive_int("data.classes_per_worker", per_worker)
    if per_worker > k:
        raise ConfigError(f"data.classes_per_worker={per_worker} exceeds the {k} groups of the data; use at most {k}")
    if workers * per_worker < k:
        raise ConfigError(
            f"data.classes_per_worker={per_worker} with {workers} workers holds {workers * per_worker} of the {k} "
            f"groups, so some rows would go to no worker; raise data.classes_per_worker to {-(-k // workers)}"
        )
    order = rng.permutation(k)
    holders: list[list[int]] = [[] for _ in range(k)]
    for worker in range(workers):
        for j in range(per_worker):
            holders[order[(worker * per_worker + j) % k]].append(worker)
    pieces: list[list[np.ndarray]] = [[] for _ in range(workers)]
    for c, group in enumerate(classes):
        members = rng.permutation(np.flatnonzero(labels == group))
        for worker, part in zip(holders[c], np.array_split(members, len(holders[c]))):
            pieces[worker].append(part)
    return [np.concatenate(parts) if parts else np.empty(0, dtype=np.int64) for parts in pieces]


@dataclass(frozen=True, kw_only=True)
class ShardingKeys:
    """The ``data.sharding`` keys, the same on every data source (``conf/data/*.yaml``).

    ``sharding``: iid | dirichlet | classes | quantity, and column on a file source (the module docstring).
    ``alpha`` (> 0): the Dirichlet concentration. ``classes_per_worker`` (C ≥ 1): groups per
    worker under ``classes``. ``exponent`` (γ ≥ 0): the power law of ``quantity``.
    ``skew_on``: what ``dirichlet`` and ``classes`` group rows by: ``y`` (the labels; a
    regression target's quantile bins) or a feature column, by name or 0-based index (its
    quantile bins). ``bins`` (≥ 2): the number of quantile bins. ``client_column`` (``column``
    only, and required there): the column whose values are the clients; the source reads it
    into ``Table.clients`` and leaves it out of the features.
    """

    sharding: str = "iid"
    alpha: float = 1.0
    classes_per_worker: int = 2
    exponent: float = 1.0
    skew_on: str | int = SKEW_ON_Y
    bins: int = 10
    client_column: str | None = None

    def check_sharding(self, prefix: str = "data", *, columns: str | None = None) -> None:
        """Each key's range, one line naming ``prefix.key`` (called by the source's ``__post_init__``).

        ``columns`` says what names a client column in this source (``a header name``); None for a
        source that has none, which refuses ``sharding=column``.
        """
        self._check_client_column(prefix, columns)
        if columns is None and self.sharding not in SCHEMES:  # column: a file's client column (docs/own_data.md)
            raise ConfigError(f"{prefix}.sharding must be one of {'|'.join(SCHEMES)} here, got {self.sharding!r} "
                              f"({COLUMN} needs a file with a client column: {COLUMN_SOURCES} and "
                              "data.client_column)")
        checks.one_of(f"{prefix}.sharding", self.sharding, SHARDINGS)
        checks.positive(f"{prefix}.alpha", self.alpha)
        checks.positive_int(f"{prefix}.classes_per_worker", self.classes_per_worker)
        checks.nonnegative(f"{prefix}.exponent", self.exponent)
        checks.positive_int(f"{prefix}.bins", self.bins)
        if self.bins < 2:
            raise ConfigError(f"{prefix}.bins must be >= 2 (quantile bins to skew on), got {self.bins}")
        column = self.skew_on
        named = isinstance(column, str) and column != ""
        indexed = isinstance(column, int) and not isinstance(column, bool) and column >= 0
        if not (named or indexed):
            raise ConfigError(f"{prefix}.skew_on must be y or a feature column (a name, or a 0-based index), "
                              f"got {column!r}")

    def _check_client_column(self, prefix: str, columns: str | None) -> None:
        column = self.client_column
        if self.sharding != COLUMN:
            if column is not None:
                raise ConfigError(f"{prefix}.client_column={column} names the clients of {prefix}.sharding=column; "
                                  f"set {prefix}.sharding=column, or drop {prefix}.client_column")
            return
        if columns is None:
            raise ConfigError(f"{prefix}.sharding=column reads each row's client from a column of a data file, "
                              f"which this data set has not; use {COLUMN_SOURCES} with data.client_column=NAME")
        if column is None:
            raise ConfigError(f"{prefix}.sharding=column needs {prefix}.client_column=NAME, {columns}")
        if not (isinstance(column, str) and column):
            raise ConfigError(f"{prefix}.client_column must name the clients' column, {columns}; got {column!r}")

    def scheme_options(self) -> dict:
        """The keyword arguments of `shard_indices` for labels that are classes (the neural problems)."""
        if self.skew_on != SKEW_ON_Y:
            raise ConfigError(f"data.skew_on={self.skew_on} groups rows by a feature column, which this problem's "
                              "shards do not support; drop data.skew_on (the labels are the groups)")
        return {"scheme": self.sharding, "alpha": self.alpha, "classes_per_worker": self.classes_per_worker,
                "exponent": self.exponent}

    def groups(self, y: np.ndarray, X=None, feature_names=None, *, regression: bool = False
               ) -> tuple[np.ndarray, str]:
        """The group of every row for ``dirichlet`` and ``classes``, and what they are (for the notes)."""
        if self.skew_on == SKEW_ON_Y:
            return self._label_groups(y, regression)
        j = self._column(X, feature_names)
        column = X[:, j].toarray().ravel() if hasattr(X, "toarray") else np.asarray(X[:, j])  # CSR: one dense column
        name = feature_names[j] if feature_names else f"column {j}"
        return quantile_bins(column, self.bins), f"{self.bins} quantile bins of {name} ({_edges(column, self.bins)})"

    def _label_groups(self, y: np.ndarray, regression: bool) -> tuple[np.ndarray, str]:
        """The labels, or a real target's ``bins`` quantile bins, and what they are (for the notes)."""
        if not regression:
            return np.asarray(y), "labels"
        return quantile_bins(y, self.bins), f"{self.bins} quantile bins of y ({_edges(y, self.bins)})"

    def deal(self, y: np.ndarray, workers: int, *, seed: int, X=None, feature_names=None,
             regression: bool = False, clients=None) -> tuple[list[np.ndarray], list[str]]:
        """Every worker's rows (sorted indices into ``y``) and, but for ``iid``, the notes that describe them:
        the scheme, then each worker's size and group histogram. ``clients``: each row's value of
        ``client_column`` (`dane.data.table.Table.clients`), which ``column`` deals by. ``iid`` gives the rows a
        linear model's run deals for ``seed``: `iid_shards`, the rows of ``dane.shards(len(y), workers, seed)``."""
        checks.positive_int("workers", workers)
        checks.seed("seed", seed)
        if self.sharding == COLUMN:
            if clients is None:  # dane.ShardingKeys(sharding="column", ...).deal(y, m, seed=s) of one's own
                raise ConfigError(f"data.sharding=column deals by each row's client: pass deal(..., clients=) the "
                                  f"values of data.client_column={self.client_column}, one per row")
            shards, labels = column_shards(clients, workers, name=f"data.client_column={self.client_column}")
            return shards, self.describe(shards, *self._label_groups(y, regression), seed, clients=labels)
        if self.sharding == "iid":
            check_workers(len(y), workers)
            return [rows.numpy() for rows in iid_shards(len(y), workers, seed)], []
        options = {"scheme": self.sharding, "alpha": self.alpha, "classes_per_worker": self.classes_per_worker,
                   "exponent": self.exponent}
        if self.sharding in GROUPED:
            groups, what = self.groups(y, X, feature_names, regression=regression)
        else:
            groups, what = np.zeros(len(y), dtype=np.int64), ""
        shards = [s.numpy() for s in shard_indices(groups, workers, seed=seed, **options)]
        return shards, self.describe(shards, groups, what, seed)

    def describe(self, shards: list[np.ndarray], groups: np.ndarray, what: str, seed: int, *,
                 clients: list[str] | None = None) -> list[str]:
        """One note for the scheme and one per worker: its rows and, for a grouped scheme, its histogram.

        With ``clients`` (``column``: each worker's value), each worker's note names its value and
        gives the histogram of ``groups`` (``what``: the labels, or y's quantile bins).
        """
        if clients is not None:
            notes = [f"sharding: column (data.client_column={self.client_column}: one client per distinct value, "
                     f"in sorted order; histograms of {what}): {plural(len(shards), 'worker')}, "
                     f"rows {', '.join(str(len(s)) for s in shards)}"]
            return notes + [f"worker {w} ({self.client_column}={c}): {plural(len(rows), 'row')}; {histogram}"
                            for w, (c, rows, histogram) in enumerate(zip(clients, shards, _histograms(groups, shards)))]
        law = {"dirichlet": f"alpha={self.alpha:g}", "classes": f"C={self.classes_per_worker}",
               "quantity": f"sizes ~ (i+1)^-{self.exponent:g}", "iid": "equal sizes"}[self.sharding]
        on = f" on {what}" if what else ""
        notes = [f"sharding: {self.sharding} ({law}){on}, seed {seed}: {plural(len(shards), 'worker')}, "
                 f"rows {', '.join(str(len(s)) for s in shards)}"]
        histograms = _histograms(groups, shards) if self.sharding in GROUPED else [None] * len(shards)
        for worker, (rows, histogram) in enumerate(zip(shards, histograms)):
            text = f"worker {worker}: {plural(len(rows), 'row')}"
            if histogram is not None:
                text += "; " + histogram
            notes.append(text)
        return notes

    def check_parts(self, path: str) -> None:
        """Per-worker parts are the partition: a scheme other than iid would be ignored, so it is refused."""
        if self.sharding != "iid":
            raise ConfigError(
                f"data.sharding={self.sharding} with per-worker parts (data.path={path}): the parts are the "
                "partition, each worker reads its own; drop data.sharding, or give one file without {rank}"
            )

    def _column(self, X, feature_names) -> int:
        if X is None:
            raise ConfigError(f"data.skew_on={self.skew_on} names a feature column, but this data has no feature "
                              "matrix here; use data.skew_on=y")
        d = X.shape[1]
        if isinstance(self.skew_on, int):
            if self.skew_on >= d:
                raise ConfigError(f"data.skew_on={self.skew_on} is not a column index of the {d} features; "
                                  f"use 0..{d - 1}")
            return self.skew_on
        names = list(feature_names or [])
        if self.skew_on not in names:
            shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
            known = f"its columns are: {shown}" if names else "it has no column names, give a 0-based index"
            raise ConfigError(f"data.skew_on={self.skew_on} is not a feature of this data; {known}")
        return names.index(self.skew_on)


def sharding_keys(source) -> dict:
    """The `ShardingKeys` fields of ``source`` (their defaults, iid, for one that has none)."""
    return {f.name: getattr(source, f.name, f.default) for f in fields(ShardingKeys)}


def _edges(values: np.ndarray, bins: int) -> str:
    qs = np.quantile(np.asarray(values, dtype=np.float64), np.linspace(0, 1, bins + 1))
    return "edges " + ", ".join(f"{q:.4g}" for q in qs)


def _histogram(groups: np.ndarray) -> str:
    values, counts = np.unique(groups, return_counts=True)
    return ", ".join(f"{_label(v)}: {c}" for v, c in zip(values, counts))


#: the most cells (workers x distinct groups) `_histograms` counts in one table; beyond, worker by worker
HISTOGRAM_CELLS = 50_000_000


def _histograms(groups: np.ndarray, shards: list[np.ndarray]) -> list[str]:
    """`_histogram` of each shard's groups, from one count table (workers x distinct groups) rather than one
    ``numpy.unique`` per worker (100,000 workers: seconds); the same values, counts and order."""
    groups = np.asarray(groups)
    values, codes = np.unique(groups, return_inverse=True)
    if len(shards) * len(values) > HISTOGRAM_CELLS or len(values) == 0:
        return [_histogram(groups[rows]) for rows in shards]
    sizes = np.fromiter((len(rows) for rows in shards), dtype=np.int64, count=len(shards))
    rows = np.concatenate([np.asarray(r, dtype=np.int64) for r in shards]) if len(shards) else np.zeros(0, np.int64)
    owner = np.repeat(np.arange(len(shards)), sizes)
    counts = np.bincount(owner * len(values) + codes.reshape(-1)[rows],
                         minlength=len(shards) * len(values)).reshape(len(shards), len(values))
    labels = [_label(v) for v in values]
    return [", ".join(f"{labels[k]}: {c}" for k, c in enumerate(row.tolist()) if c) for row in counts]


def _label(value) -> str:
    number = float(value)
    return str(int(number)) if number.is_integer() else f"{number:g}"


def _client_label(value) -> str:
    """A client's value as the notes show it: an integral number without ``.0``, text as given."""
    if isinstance(value, (np.floating, float)) and float(value).is_integer():
        return str(int(value))
    return str(value.item() if isinstance(value, np.generic) else value)
