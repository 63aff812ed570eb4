r"""Synthetic(α, β) of the FedProx paper (Li, Sahu, Zaheer, Sanjabi, Talwalkar & Smith, MLSys 2020, §5.1):
30 clients, 60 features, 10 classes, each client labelled by its own softmax model.

For client k (`generate_synthetic`, one ``numpy.random.default_rng(seed)``, draws in this order):

.. math::
    n_k &= \lfloor \mathrm{LogNormal}(4, 2) \rfloor + 50 \qquad\text{(power-law sizes, at least 50 rows)} \\
    u_k &\sim N(0, \alpha^2), \quad B_k \sim N(0, \beta^2) \\
    v_k &\in \mathbb R^{60},\ (v_k)_j \sim N(B_k, 1) \\
    W_k &\in \mathbb R^{10\times 60},\ b_k \in \mathbb R^{10},\ \text{entries} \sim N(u_k, 1) \\
    x &\sim N(v_k, \Sigma),\ \Sigma = \mathrm{diag}(j^{-1.2})_{j=1..60}, \qquad
    y = \arg\max_c\, (W_k x + b_k)_c = \arg\max \mathrm{softmax}(W_k x + b_k)

α says how much the clients' models differ, β how much their inputs do.  The paper writes
u_k ~ N(0, α) and B_k ~ N(0, β); its public generator (``data/synthetic_*/generate_synthetic.py`` of
litian96/FedProx) draws ``np.random.normal(0, alpha)``, whose second argument is a standard deviation, so
α and β are standard deviations (variances α², β²); this module follows the generator.  b_k's entries
share W_k's mean u_k, as the generator's ``mean_b = mean_W``.

The IID variant (``iid=True``, the generator's ``generate_iid.py``): one W, b with N(0, 1) entries for
every client and v_k = 0, so every client draws from the same distribution; α and β play no part and
must be 0.

Each client's first ⌊(1 − test_fraction) n_k⌋ rows are its training rows and the rest its test rows
(the generator keeps ⌊0.9 n_k⌋ of a shuffle; the rows of a client are i.i.d., so no shuffle is needed).
Features are not standardized (the paper's are not).  ``SyntheticSource`` gives a convex problem the
training rows as the natural partition: worker k reads client k's rows (``presharded``, so ``workers``
must equal ``clients``).  With ``sharding`` set (it is null by default) the rows are one table (client 0's
first), dealt by it: ``column`` with ``client_column=client`` reads each row's client index as its client
column (`dane.data.sharding.column_shards`: client k, the k-th value numerically, is worker k), the
natural partition again, row for row; ``iid`` deals the pooled rows to any number of workers. The
skewed schemes are refused: ``alpha`` here is the paper's α, which `dane.data.sharding.sharding_keys`
would read as the Dirichlet concentration, and the clients already are the skew.
`synthetic_dataset` gives the neural problems the train/test pair (``data.dataset=synthetic_1_1`` and the
others of `PAPER_SETS`), pooled and dealt by ``data.sharding``.

Departures: a seeded ``default_rng`` instead of the generator's unseeded global state, so the draws are
not the public JSON files' rows, only their distribution; W is stored 10 x 60 (the generator's is 60 x 10,
used as x W).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from dane import checks
from dane.data.dataset import Dataset, to_dataset
from dane.data.sharding import COLUMN, SCHEMES
from dane.data.table import Table
from dane.errors import ConfigError

DIM, CLASSES, CLIENTS = 60, 10, 30
CLIENT_COLUMN = "client"  # pooled: the client column, each row's client index 0..clients-1
POOLED_SHARDINGS = ("iid", COLUMN)
SIZE_MEAN, SIZE_SIGMA, SIZE_FLOOR = 4.0, 2.0, 50  # n_k = floor(LogNormal(4, 2)) + 50
COVARIANCE_DECAY = 1.2                            # Sigma_jj = j^-1.2
#: the paper's four sets by the public repository's folder names: (alpha, beta, iid)
PAPER_SETS = {"synthetic_0_0": (0.0, 0.0, False), "synthetic_0.5_0.5": (0.5, 0.5, False),
              "synthetic_1_1": (1.0, 1.0, False), "synthetic_iid": (0.0, 0.0, True)}


@dataclass(frozen=True)
class SyntheticClients:
    """Every client's rows and model: ``X[k]`` (n_k x 60), ``y[k]`` (n_k class indices as float64), ``W`` (clients
    x 10 x 60), ``b`` (clients x 10), ``v`` (clients x 60), ``sizes`` (n_k), ``covariance`` (Σ's diagonal)."""

    X: tuple[np.ndarray, ...]
    y: tuple[np.ndarray, ...]
    W: np.ndarray
    b: np.ndarray
    v: np.ndarray
    sizes: np.ndarray
    covariance: np.ndarray


def covariance_diagonal(dim: int = DIM) -> np.ndarray:
    """Σ's diagonal, j^-1.2 for j = 1..dim."""
    return np.arange(1, dim + 1, dtype=np.float64) ** -COVARIANCE_DECAY


def check_synthetic(alpha, beta, iid, clients, seed, prefix: str = "data") -> None:
    """Each argument's range, one line naming ``prefix.key``."""
    checks.nonnegative(f"{prefix}.alpha", alpha)
    checks.nonnegative(f"{prefix}.beta", beta)
    checks.boolean(f"{prefix}.iid", iid)
    checks.positive_int(f"{prefix}.clients", clients)
    checks.seed(f"{prefix}.seed", seed)
    if iid and (alpha != 0 or beta != 0):
        raise ConfigError(f"{prefix}.iid=true shares one model and v_k = 0 on every client, so alpha and beta play "
                          f"no part; set {prefix}.alpha=0 {prefix}.beta=0 (got {alpha:g}, {beta:g})")


@functools.lru_cache(maxsize=4)
def generate_synthetic(alpha: float, beta: float, *, iid: bool = False, clients: int = CLIENTS,
                       seed: int = 0) -> SyntheticClients:
    """Synthetic(α, β), or its IID variant, for ``clients`` clients (module docstring); the same for a seed."""
    check_synthetic(alpha, beta, iid, clients, seed)
    rng = np.random.default_rng(seed)
    sizes = rng.lognormal(SIZE_MEAN, SIZE_SIGMA, clients).astype(np.int64) + SIZE_FLOOR
    u = rng.normal(0.0, alpha, clients)
    B = rng.normal(0.0, beta, clients)
    v = np.zeros((clients, DIM)) if iid else rng.normal(B[:, None], 1.0, (clients, DIM))
    if iid:
        W = np.broadcast_to(rng.normal(0.0, 1.0, (CLASSES, DIM)), (clients, CLASSES, DIM))
        b = np.broadcast_to(rng.normal(0.0, 1.0, CLASSES), (clients, CLASSES))
    else:
        W = rng.normal(u[:, None, None], 1.0, (clients, CLASSES, DIM))
        b = rng.normal(u[:, None], 1.0, (clients, CLASSES))
    scale = np.sqrt(covariance_diagonal())
    X, y = [], []
    for k, n in enumerate(sizes):
        x = v[k] + scale * rng.standard_normal((int(n), DIM))
        X.append(x)
        y.append(np.argmax(x @ W[k].T + b[k], axis=1).astype(np.float64))
    return SyntheticClients(tuple(X), tuple(y), np.array(W), np.array(b), v, sizes, covariance_diagonal())


def train_rows(n: int, test_fraction: float) -> int:
    """A client's training rows, ⌊(1 − test_fraction) n⌋ (the generator's ``int(0.9 * num_samples)``)."""
    return int((1.0 - test_fraction) * n)


@dataclass(frozen=True)
class SyntheticSource:
    """Synthetic(α, β) training rows for a convex problem (``conf/data/synthetic.yaml``; module docstring).

    ``sharding`` null (the default): the natural partition, client k's training rows worker k's part
    (``presharded``; ``workers`` must equal ``clients``).  ``sharding`` iid, or column with ``client_column`` =
    ``client`` (each row's client index): the rows pooled into one table, dealt as a file source's are; no other
    sharding key: ``alpha`` here is the paper's α, not ``data.sharding``'s Dirichlet concentration.  The
    defaults are null so that a checkpoint written before these keys existed resumes.  ``name`` defaults to
    ``synthetic(α,β)``.  Its labels are ``label_classes`` (10) classes: a linear model fits them with the softmax
    loss (``problem=softmax problem.classes=10``); the logistic loss is refused
    (`dane.problems.linear_models.LinearModelConfig` reads ``label_classes``).
    """

    alpha: float = 0.0
    beta: float = 0.0
    iid: bool = False
    clients: int = CLIENTS
    seed: int = 0
    test_fraction: float = 0.1
    sharding: str | None = None
    client_column: str | None = None
    name: str = ""

    label_classes = CLASSES  # the classes its labels take, known before any row is drawn (a part may hold fewer)

    def __post_init__(self) -> None:
        check_synthetic(self.alpha, self.beta, self.iid, self.clients, self.seed)
        self._check_sharding()
        if not (isinstance(self.test_fraction, (int, float)) and 0.0 <= self.test_fraction < 1.0):
            raise ConfigError(f"data.test_fraction must be in [0, 1), got {self.test_fraction!r}")
        if not self.name:
            name = "synthetic_iid" if self.iid else f"synthetic({self.alpha:g},{self.beta:g})"
            object.__setattr__(self, "name", name)

    def _check_sharding(self) -> None:
        """``sharding`` and ``client_column``: one line each (the class docstring)."""
        if self.sharding is not None and self.sharding not in (*SCHEMES, COLUMN):  # a misspelling is no skewed scheme
            raise ConfigError(f"data.sharding must be one of {'|'.join(POOLED_SHARDINGS)} on data=synthetic (or null: "
                              f"client k is worker k), got {self.sharding!r}")
        if self.sharding is not None and self.sharding not in POOLED_SHARDINGS:
            why = ("data.alpha is the paper's alpha (how the clients' models differ), not a Dirichlet concentration, "
                   "and " if self.sharding == "dirichlet" else "")
            raise ConfigError(f"data.sharding={self.sharding} on data=synthetic: {why}the clients are the skew; use "
                              f"data.sharding=column data.client_column={CLIENT_COLUMN}, or iid")
        if self.sharding == COLUMN and self.client_column is None:
            raise ConfigError(f"data.sharding=column on data=synthetic needs data.client_column={CLIENT_COLUMN} (each "
                              "row's client index)")
        if self.sharding == COLUMN and self.client_column != CLIENT_COLUMN:
            raise ConfigError(f"data.client_column={self.client_column}: the pooled Synthetic rows have one client "
                              f"column, each row's client index; set data.client_column={CLIENT_COLUMN}")
        if self.sharding != COLUMN and self.client_column is not None:  # null (natural) or iid
            raise ConfigError(f"data.client_column={self.client_column} names the clients of data.sharding=column; "
                              "set data.sharding=column, or drop data.client_column")

    @property
    def presharded(self) -> bool:
        """Each client one worker's part, unless ``sharding`` deals the pooled rows."""
        return self.sharding is None

    def data(self) -> SyntheticClients:
        return generate_synthetic(float(self.alpha), float(self.beta), iid=self.iid, clients=self.clients,
                                  seed=self.seed)

    def parts(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Every client's training rows (X_k, y_k)."""
        data = self.data()
        return [(x[:train_rows(len(x), self.test_fraction)], y[:train_rows(len(y), self.test_fraction)])
                for x, y in zip(data.X, data.y)]

    def note(self, rows: list[int]) -> str:
        return (f"{self.name} (FedProx's Synthetic, seed {self.seed}): {self.clients} clients, 60 features, 10 "
                f"classes, training rows {', '.join(map(str, rows))} ({1 - self.test_fraction:g} of each client's "
                f"floor(LogNormal(4, 2)) + 50), not standardized")

    def load(self) -> Table:
        """All clients' training rows, client 0's first; with ``sharding=column``, each row's client index as
        ``Table.clients``."""
        parts = self.parts()
        rows = [len(y) for _, y in parts]
        clients = np.repeat(np.arange(self.clients), rows) if self.sharding == COLUMN else None
        return Table(X=np.concatenate([x for x, _ in parts]), y=np.concatenate([y for _, y in parts]),
                     name=self.name, notes=[self.note(rows)], clients=clients)

    def load_part(self, rank: int, size: int) -> tuple[Table, int]:
        """Client ``rank``'s training rows, and N, the training rows of all clients."""
        if size != self.clients:
            raise ConfigError(f"data=synthetic has {self.clients} clients, one per worker, but the run has {size} "
                              f"workers; set workers={self.clients} (or data.clients={size})")
        parts = self.parts()
        x, y = parts[rank]
        note = self.note([len(p[1]) for p in parts]) if rank == 0 else f"{self.name}: client {rank}'s {len(y)} rows"
        return Table(X=np.array(x), y=np.array(y), name=f"{self.name}[client {rank}]", notes=[note]), \
            sum(len(p[1]) for p in parts)


def synthetic_dataset(name: str, *, seed: int, test_fraction: float = 0.1) -> Dataset:
    """One of `PAPER_SETS` as a train/test `Dataset` for the networks: every client's training rows, then
    every client's test rows (module docstring), pooled; ``data.sharding`` deals them to workers."""
    alpha, beta, iid = PAPER_SETS[name]
    data = generate_synthetic(alpha, beta, iid=iid, seed=seed)
    cut = [train_rows(len(y), test_fraction) for y in data.y]
    train_x = np.concatenate([x[:c] for x, c in zip(data.X, cut)])
    train_y = np.concatenate([y[:c] for y, c in zip(data.y, cut)])
    test_x = np.concatenate([x[c:] for x, c in zip(data.X, cut)])
    test_y = np.concatenate([y[c:] for y, c in zip(data.y, cut)])
    split = f"each client's last {test_fraction:g} of rows held out (seed {seed})"
    return to_dataset(train_x, train_y, test_x, test_y, num_classes=CLASSES, name=name, split=split,
                      notes=[f"{name}: FedProx's Synthetic, {CLIENTS} clients pooled, seed {seed}; {split}"])
