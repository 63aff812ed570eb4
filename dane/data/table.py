"""The ``Table`` every data source returns, where its files are found, and how columns are scaled.

A ``Table`` is the whole design matrix of a convex problem (or one worker's part of
it): no train/test split, labels exactly as the file gives them. ``resolve`` turns a
config's ``path`` and ``data_dir`` into one existing file, or one line that lists
every place it looked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from dane.errors import ConfigError, DataError

from dane.layout import CHECKOUT  # noqa: E402

MISSING = frozenset({"", "na", "nan", "?"})  # a cell that holds no value, compared stripped and lower-cased


@dataclass
class Table:
    """Rows of a data set: ``X`` (n x d, float64; a ``csr_matrix`` stays sparse) and labels ``y``.

    ``y`` is float64 exactly as read; `dane.data.labels.check_labels` fits it to a loss.
    ``notes`` holds facts a run's log must state (rows imputed, columns one-hot
    encoded, standardization, which part of which file); the entry point prints them.
    ``clients``: each row's client (a number or a string) where ``data.sharding=column`` read
    one from the file (`dane.data.sharding.column_shards`); None otherwise.
    """

    X: np.ndarray | sp.csr_matrix
    y: np.ndarray
    name: str
    notes: list[str]
    feature_names: list[str] | None = None
    target_units: tuple[float, float] | None = None  # (ȳ, s) when y was standardized: y = ȳ + s y'
    clients: np.ndarray | None = None

    def __post_init__(self) -> None:
        # A bug in a source, not a user error: fail loudly with a traceback.
        assert self.X.dtype == np.float64 and self.X.ndim == 2, f"{self.name}: X must be 2-D float64"
        assert isinstance(self.X, (np.ndarray, sp.csr_matrix)), f"{self.name}: X is {type(self.X)}"
        assert self.y.dtype == np.float64 and self.y.shape == (self.X.shape[0],), f"{self.name}: y"
        assert self.feature_names is None or len(self.feature_names) == self.X.shape[1]
        assert self.clients is None or np.shape(self.clients) == (self.X.shape[0],), f"{self.name}: clients"

    @property
    def n(self) -> int:
        """Number of rows."""
        return self.X.shape[0]

    @property
    def d(self) -> int:
        """Number of features (columns of ``X``)."""
        return self.X.shape[1]


def is_number(text: str) -> bool:
    """Whether ``float(text)`` reads ``text`` (inf and nan included: what a cell or token holds, not whether it is
    finite)."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def missing_rows(values) -> np.ndarray:
    """Which of ``values`` (one per row) hold no value, as a boolean array: a text in `MISSING` (stripped, any
    case), a float that is not finite (NaN, inf), or None; an integer never. Text is text: ``"inf"`` is a value."""
    column = np.asarray(values)
    if column.dtype.kind in "biu":
        return np.zeros(column.shape, dtype=bool)
    if column.dtype.kind == "f":
        return ~np.isfinite(column)
    if column.dtype.kind in "US":
        return np.isin(np.char.lower(np.char.strip(column.astype(str))), list(MISSING))
    return np.array([_missing(v) for v in column.ravel()], dtype=bool).reshape(column.shape)


def _missing(value) -> bool:
    """`missing_rows` of one value of an object array (a store's documents: Python ints, floats, str, None)."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    if isinstance(value, (float, np.floating)):
        return not np.isfinite(value)
    return value is None or isinstance(value, str) and value.strip().lower() in MISSING


def resolve_dir(data_dir: str | Path | None) -> Path | None:
    """``data_dir`` as an absolute folder: a relative one is taken from the repository root
    (from the working folder where the package is installed, not a checkout).

    The repository root (not the working folder) so that the default ``../shared/data``
    means the same folder whether a run starts in the repository or in a Hydra run dir.
    """
    if data_dir is None or str(data_dir) == "":
        return None
    folder = Path(data_dir).expanduser()
    return (folder if folder.is_absolute() else (CHECKOUT or Path.cwd()) / folder).resolve()


def resolve(
    path: str | Path,
    data_dir: str | Path | None,
    *,
    fix: str = "set data.path=/absolute/path or data_dir=/folder/holding/it",
) -> Path:
    """The existing file ``path`` names: absolute as given; relative under ``data_dir``, then the cwd.

    Raises one ``DataError`` line listing every place tried, then ``fix``.
    """
    if str(path) == "":
        raise ConfigError("data.path is empty; set data.path=/absolute/path/to/file")
    given = Path(path).expanduser()
    if given.is_absolute():
        tried = [given]
    else:
        folder = resolve_dir(data_dir)
        tried = ([folder / given] if folder is not None else []) + [Path.cwd() / given]
    for candidate in tried:
        if candidate.is_file():
            return readable(candidate)
    where = ", ".join(f"{p} (a folder)" if p.is_dir() else str(p) for p in tried)
    raise DataError(f"data file {path} not found; tried {where}; {fix}")


def file_stamps(files) -> tuple[tuple[str, int, int, int], ...]:
    """What identifies the content of ``files`` without reading them: each one's resolved path, size,
    modification time (ns) and inode, the key under which a process keeps what it read from them
    (`dane.problems.linear_models.LinearModelConfig.data_key`).  A file rewritten in place or replaced gets a
    new stamp; the one rewrite it misses keeps the size and lands within the same tick of the file system's
    clock as the write before it."""
    stamps = []
    for file in files:
        path = Path(file).resolve()
        stat = path.stat()
        stamps.append((str(path), stat.st_size, stat.st_mtime_ns, stat.st_ino))
    return tuple(stamps)


def readable(file: Path) -> Path:
    """``file``, once opened for reading: a file without read permission is one line here, not a reader's traceback."""
    try:
        open(file, "rb").close()
    except OSError as err:
        raise DataError(f"data file {file} cannot be read ({err.strerror}); give read permission "
                        f"(chmod a+r {file}) or copy it somewhere readable") from None
    return file


def not_utf8(file: Path, err: UnicodeDecodeError, fix: str) -> DataError:
    """The one line for a text file (a CSV) whose bytes are not UTF-8: the first byte that is not, then ``fix``."""
    return DataError(f"{file} is not UTF-8 text (byte 0x{err.object[err.start]:02x} cannot be decoded); {fix}")


def standardize_columns(X: np.ndarray, columns: list[int]) -> list[int]:
    """Scale ``X[:, columns]`` in place to mean 0, std 1 (population std); return the constant ones.

    A constant column (all values equal, tested exactly, not by a tiny std, which
    rounding makes non-zero: 1000 copies of 0.1 have std 1.4e-17) is centred to
    exactly 0, not divided.
    """
    constant = []
    for j in columns:
        column = X[:, j]
        if column.size == 0 or np.all(column == column[0]):
            constant.append(j)
            X[:, j] = 0.0
        else:
            X[:, j] = (column - column.mean()) / column.std()
    return constant
