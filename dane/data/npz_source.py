"""``NPZSource``: X and y in one NumPy ``.npz`` archive, dense or sparse; ``save_npz`` writes one.

Layout (keys shown for the defaults ``x_key="X"``, ``y_key="y"``):

- dense: ``X`` (n x d) and ``y`` (n, or n x 1);
- sparse CSR: ``X_data``, ``X_indices``, ``X_indptr``, ``X_shape`` (the arrays of a
  ``scipy.sparse.csr_matrix`` and its shape) and ``y``. A matrix written by
  ``scipy.sparse.save_npz`` to a separate file is not read; re-save it with `save_npz`.

The archive is opened with ``allow_pickle=False``, so object arrays are refused.
With ``sharding=column``, ``client_column`` names one more array of the archive holding each
row's client (integers, or strings saved as a NumPy string array, e.g. ``groups``, which
``save_npz(path, X, y, columns={"groups": g})`` writes); it is not part of X. A row without a client
(NaN or inf, or a text the CSV reader reads as missing: empty, ``NA``, ``NaN``, ``?``) is refused in
one line, as the CSV reader refuses it.
"""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from dane import checks
from dane.data.parts import FileSource
from dane.data.scaling import standardize_matrix
from dane.data.sharding import ShardingKeys
from dane.data.table import Table, is_number, missing_rows
from dane.errors import ConfigError, DataError, UserError, brief, plural

SPARSE_SUFFIXES = ("_data", "_indices", "_indptr", "_shape")
FIX = "write it with dane.data.files.save_npz(path, X, y)"
#: the fix for labels that are not numbers (text: 'yes', 'no'), which a model's loss cannot read
LABELS_AS_NUMBERS = "map them to numbers, e.g. 0/1 (0..K-1 for K classes: np.unique(y, return_inverse=True)[1])"


@dataclass(frozen=True)
class NPZSource(FileSource, ShardingKeys):
    """A ``.npz`` archive (``conf/data/npz.yaml``); ``x_key`` and ``y_key`` name its arrays.

    How rows are dealt to workers: ``sharding``, ``alpha``, ... (`dane.data.sharding.ShardingKeys`);
    ``sharding=column`` with ``client_column`` a key of the archive: one client per value of that array.

    ``standardize``: ``none`` (the default: X as saved), ``numeric`` (true: the columns with a
    value other than 0/1) or ``all``, over all rows: dense X to mean 0, std 1 as the CSV path
    does; sparse X scaled to std 1, not centred (`dane.data.scaling` says when that is the
    same fit). ``none`` with parts.
    """

    path: str
    x_key: str = "X"
    y_key: str = "y"
    data_dir: str | None = None
    name: str = "npz"
    standardize: str = "none"

    def __post_init__(self) -> None:
        self.check_path(columns="a key of the archive holding one value per row")
        self.check_standardize()
        for key in ("x_key", "y_key"):
            if not isinstance(getattr(self, key), str) or not getattr(self, key):
                raise ConfigError(f"data.{key} must name an array in the archive, got {getattr(self, key)!r}")
        if self.client_column in (self.x_key, self.y_key):
            raise ConfigError(f"data.client_column={self.client_column} is the archive's X or y; the clients are "
                              "another array of one value per row, name it")

    def _read(self, file: Path) -> Table:
        _check_is_archive(file)
        try:
            with np.load(file, allow_pickle=False) as archive:
                _check_declared_sizes(file, archive.files)
                sparse = self._layout(file, archive.files)
                X = _sparse(file, archive, self.x_key) if sparse else archive[self.x_key]
                y = archive[self.y_key]
                clients = None if self.client_column is None else archive[self.client_column]
        except UserError:  # ours, already one line (a DataError is also an OSError, a ConfigError a ValueError)
            raise
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, AttributeError) as err:
            # AttributeError: np.load returned a plain array (an .npy file), with no ``files``.
            raise DataError(f"{file} is not a readable .npz archive ({_short(err)}); {FIX}") from None
        X, y = _checked(file, X, y, self.x_key, self.y_key)
        kind = f"sparse, {plural(X.nnz, 'non-zero')}" if sparse else "dense"
        notes = [f"read {plural(X.shape[0], 'row')} x {plural(X.shape[1], 'feature')} ({kind}) from {file}"]
        notes += filter(None, [standardize_matrix(X, self.standardize)])
        return Table(X=X, y=y, name=f"npz:{Path(self.path).name}", notes=notes,
                     clients=None if clients is None else _clients(file, clients, self.client_column, len(y)))

    def _layout(self, file: Path, keys: list[str]) -> bool:
        """True for the sparse layout; one line naming the keys found when a key is missing."""
        sparse_keys = [self.x_key + suffix for suffix in SPARSE_SUFFIXES]
        sparse = self.x_key not in keys and all(k in keys for k in sparse_keys)
        named = ((self.x_key, "x_key"), (self.y_key, "y_key"), (self.client_column, "client_column"))
        for key, setting in (pair for pair in named if pair[0] is not None):
            if key not in keys and not (sparse and key == self.x_key):
                raise DataError(
                    f"{file} has no array '{key}' (data.{setting}); its keys are: {', '.join(keys) or 'none'}; "
                    f"set data.{setting} to one of them, or "
                    + (f"add the clients' array to the archive (dane.save_npz(path, X, y, columns={{{key!r}: "
                       "clients}))"
                       if setting == "client_column" else FIX)
                )
        return sparse

    def _count_rows(self, file: Path) -> int:
        return _member_shape(file, self.y_key)[0]

    def _width(self, file: Path) -> int | None:
        _check_is_archive(file)
        try:
            with zipfile.ZipFile(file) as archive:
                sparse = f"{self.x_key}.npy" not in archive.namelist()
        except (OSError, zipfile.BadZipFile) as err:
            raise DataError(f"{file} is not a readable .npz archive ({_short(err)}); {FIX}") from None
        if sparse:
            with np.load(file, allow_pickle=False) as archive:
                self._layout(file, archive.files)
                return int(archive[self.x_key + "_shape"][1])
        shape = _member_shape(file, self.x_key)
        return shape[1] if len(shape) == 2 else None  # _read names the bad shape


def _check_is_archive(file: Path) -> None:
    """An ``.npy`` file (one array, from ``np.save``), a text file or any other file that is no zip archive
    under an ``.npz`` name: say so rather than fail inside numpy (whose advice about ``allow_pickle`` for a
    file it cannot place must not be followed: it would unpickle, that is run, whatever the file holds)."""
    with open(file, "rb") as f:  # readable: `resolve` opened it
        head = f.read(4096)
    if head.startswith(b"\x93NUMPY"):
        raise DataError(f"{file} is a .npy file (one array, from np.save), not an .npz archive of X and y; {FIX}")
    if zipfile.is_zipfile(file):
        return
    try:
        text = b"\0" not in head and bool(head.decode("utf-8"))
    except UnicodeDecodeError as err:  # a character cut at the end of what was read is still text
        text = b"\0" not in head and err.start >= len(head) - 3
    what = "a text file (for a CSV use data=csv, for LIBSVM data=libsvm)" if text else \
        "empty" if not head else "not a zip archive"
    raise DataError(f"{file} is not an .npz archive: it is {what}; {FIX}")


def _check_declared_sizes(file: Path, members: list[str]) -> None:
    """Every array's size as its header declares it, checked before it is read: against the bytes the
    archive holds for it (a damaged header) and against the memory this process can allocate."""
    with zipfile.ZipFile(file) as archive:
        for key in members:
            info, header = archive.getinfo(f"{key}.npy"), _member_header(archive, f"{key}.npy")
            if header is None:
                continue
            shape, dtype = header
            declared = int(np.prod(shape, dtype=object)) * dtype.itemsize
            if declared > info.file_size:
                raise DataError(f"{file}: '{key}' declares {' x '.join(map(str, shape))} {dtype} "
                                f"({checks.gigabytes(declared)}) but the archive holds {info.file_size} bytes of it; "
                                f"the file is damaged or truncated, {FIX}")
            checks.fits_in_memory(f"{file}: '{key}' ({' x '.join(map(str, shape))} {dtype})", declared,
                                  "as its header declares", "use a smaller data set, or a machine with more memory")


def _member_header(archive: zipfile.ZipFile, name: str) -> tuple[tuple[int, ...], np.dtype] | None:
    """(shape, dtype) from an ``.npy`` member's header, reading no data; None for a header version
    this does not know (rare; NumPy writes 1.0 when it can), which only ``np.load`` reads."""
    with archive.open(name) as member:
        version = np.lib.format.read_magic(member)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(member)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(member)
        else:
            return None
    return shape, dtype


def _sparse(file: Path, archive, x_key: str) -> sp.csr_matrix:
    data, indices, indptr, shape = (archive[x_key + suffix] for suffix in SPARSE_SUFFIXES)
    try:
        X = sp.csr_matrix((data, indices, indptr), shape=tuple(int(s) for s in shape))
        X.check_format(full_check=True)
    except (ValueError, TypeError) as err:
        raise DataError(
            f"{file}: {x_key}_data/_indices/_indptr/_shape do not form a CSR matrix ({_short(err)}); {FIX}"
        ) from None
    return X


def _checked(file: Path, X, y: np.ndarray, x_key: str, y_key: str) -> tuple:
    """X as float64 (dense 2-D or CSR) and y as float64 (n,), or one line saying what is wrong."""
    if not sp.issparse(X) and X.ndim != 2:
        raise DataError(f"{file}: '{x_key}' has shape {X.shape}; it must be 2-D, n rows x d features")
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1:
        raise DataError(f"{file}: '{y_key}' has shape {y.shape}; it must hold one label per row")
    if y.dtype.kind in "US":
        raise DataError(f"{file}: '{y_key}' holds labels that are not numbers ({shown_values(y)}); "
                        f"{LABELS_AS_NUMBERS}, and save the archive again (dane.save_npz(path, X, y))")
    for key, array in ((x_key, X), (y_key, y)):
        if not (np.issubdtype(array.dtype, np.number) or array.dtype == bool) or np.iscomplexobj(array):
            raise DataError(f"{file}: '{key}' has dtype {array.dtype}; it must be real numbers")
    if X.shape[0] != y.shape[0]:
        raise DataError(
            f"{file}: '{x_key}' has {X.shape[0]} rows but '{y_key}' has {y.shape[0]} labels; they must match"
        )
    X = sp.csr_matrix(X, dtype=np.float64) if sp.issparse(X) else np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    values = X.data if sp.issparse(X) else X
    bad = np.count_nonzero(~np.isfinite(values))
    if bad:
        if sp.issparse(X):
            first = np.flatnonzero(~np.isfinite(X.data))[0]
            row, column = int(np.searchsorted(X.indptr, first, side="right")) - 1, int(X.indices[first])
        else:
            row, column = np.argwhere(~np.isfinite(X))[0]
        raise DataError(f"{file}: '{x_key}' holds {bad} non-finite values (first at row {row}, column {column}); "
                        "clean the data (drop or impute those rows) and save it again")
    if not np.all(np.isfinite(y)):
        row = np.flatnonzero(~np.isfinite(y))[0]
        raise DataError(f"{file}: '{y_key}' is {y[row]} at row {row}; every label must be finite")
    if X.shape[0] == 0:
        raise DataError(f"{file}: '{x_key}' has no rows; check data.path")
    return X, y


def _clients(file: Path, clients: np.ndarray, key: str, n: int) -> np.ndarray:
    """The client array (data.client_column) as one integer or string per row, or one line saying what is wrong."""
    if clients.ndim == 2 and clients.shape[1] == 1:
        clients = clients[:, 0]
    if clients.shape != (n,):
        raise DataError(f"{file}: '{key}' (data.client_column) has shape {clients.shape}; it must hold one client "
                        f"per row, {n} values")
    if clients.dtype.kind not in "biufUS":
        raise DataError(f"{file}: '{key}' (data.client_column) has dtype {clients.dtype}; save the clients as "
                        "integers or strings")
    clients = clients.astype(str) if clients.dtype.kind == "S" else clients
    missing = np.flatnonzero(missing_rows(clients))
    if missing.size:  # the CSV reader's rule (`dane.data.table.missing_rows`): a run or a push stops here
        row = int(missing[0])
        raise DataError(f"{file}: '{key}' (data.client_column) is {clients[row].item()!r} at row {row} (0-based, "
                        f"{key}[{row}]; {missing.size} of {n} rows have no client); every row needs a client: fill "
                        f"them in (e.g. -1 or 'unknown') and save the archive again, or drop those rows from X, y and "
                        f"'{key}'")
    return clients


def _member_shape(file: Path, key: str) -> tuple[int, ...]:
    """The shape of array ``key`` in the archive, read from its header alone (no data)."""
    _check_is_archive(file)
    try:
        with zipfile.ZipFile(file) as archive:
            header = _member_header(archive, f"{key}.npy")
        if header is not None:
            return header[0]
        with np.load(file, allow_pickle=False) as whole:  # a newer header version: read the array
            return whole[key].shape
    except KeyError:
        with zipfile.ZipFile(file) as archive:
            keys = ", ".join(name.removesuffix(".npy") for name in archive.namelist())
        raise DataError(f"{file} has no array '{key}'; its keys are: {keys}; {FIX}") from None
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        raise DataError(f"{file} is not a readable .npz archive ({_short(err)}); {FIX}") from None


def save_npz(path: str | Path, X, y, *, x_key: str = "X", y_key: str = "y", columns: dict | None = None) -> Path:
    """Write ``X`` (a dense array, or any scipy sparse matrix, stored as CSR) and ``y`` for `NPZSource`.

    Both are stored as float64, uncompressed (so a part's row count can be read from its
    header): labels or features that are not numbers (text) are refused in one line with the fix. ``columns``: more arrays of one value per row, by name, stored as given (integers or
    strings), e.g. ``columns={"groups": g}`` for ``data.sharding=column data.client_column=groups``; a name
    that is X's or y's key is refused. Returns the path written; NumPy adds ``.npz`` when ``path`` lacks it.
    """
    if not isinstance(path, (str, os.PathLike)) or path == "":
        raise ConfigError(f"save_npz: path must be a file's path (a str or a pathlib.Path), got {path!r}")
    if not Path(path).parent.is_dir():  # checked before any array is converted (np.savez's FileNotFoundError)
        raise DataError(f"save_npz: {path} cannot be written: folder {Path(path).parent} does not exist; create it "
                        "first, or choose another path")
    for key, array in (("X", X), ("y", y)):  # float64 would drop the imaginary part with only a warning
        if np.iscomplexobj(array.data if sp.issparse(array) else array):
            raise DataError(f"save_npz: {key} holds complex numbers; save {key}.real or abs({key}), as the model needs")
    try:
        y = np.asarray(y, dtype=np.float64)
    except (ValueError, TypeError):  # text labels: NumPy's bare "could not convert string to float"
        raise DataError(f"save_npz: y holds labels that are not numbers ({shown_values(y)}); {LABELS_AS_NUMBERS}, "
                        "before saving") from None
    try:
        if sp.issparse(X):
            X = sp.csr_matrix(X, dtype=np.float64)
            arrays = dict(zip((x_key + s for s in SPARSE_SUFFIXES), (X.data, X.indices, X.indptr, np.array(X.shape))))
        else:
            X = np.asarray(X, dtype=np.float64)
            arrays = {x_key: X}
    except (ValueError, TypeError):
        raise DataError(f"save_npz: X holds values that are not numbers ({shown_values(X)}); encode them as numbers "
                        "(a text column one-hot, e.g. pandas.get_dummies) before saving") from None
    if X.ndim != 2 or y.shape != (X.shape[0],):
        raise DataError(f"save_npz needs X of n x d and y of n, got X {X.shape} and y {y.shape}")
    arrays[y_key] = y
    for name, values in (columns or {}).items():
        arrays[name] = _column(name, values, arrays, X.shape[0])
    path = Path(path)
    written = path if path.suffix == ".npz" else path.with_name(path.name + ".npz")
    try:
        np.savez(path, **arrays)
    except OSError as err:  # a folder of that name, no permission, a full disk
        raise DataError(f"save_npz: {written} cannot be written ({(err.strerror or str(err)).lower()}); choose "
                        "another path") from None
    return written


def shown_values(values, most: int = 3) -> str:
    """The first ``most`` of the distinct values of ``values`` that ``float`` does not read, in sorted order, as a line
    shows them (``'no', 'yes'``)."""
    flat = np.asarray(values.data if sp.issparse(values) else values, dtype=object).ravel().tolist()
    distinct = sorted({str(v) for v in flat} - {str(v) for v in flat if is_number(str(v))})
    return ", ".join(map(repr, distinct[:most])) + (", ..." if len(distinct) > most else "")


def _column(name, values, arrays: dict, n: int) -> np.ndarray:
    """One of `save_npz`'s ``columns`` as the array stored, or one line: a name that X or y already takes (or
    none), a length other than the rows', or values that are not integers, reals or strings."""
    if not isinstance(name, str) or not name:
        raise DataError(f"save_npz: a column's name must be a non-empty string, got {name!r}")
    if name in arrays:
        raise DataError(f"save_npz: column {name!r} is a key X or y is stored under ({', '.join(arrays)}); give the "
                        "column another name (or X and y other keys: x_key=, y_key=)")
    column = np.asarray(values)
    if column.shape != (n,):
        raise DataError(f"save_npz: column {name!r} has shape {column.shape}; it must hold one value per row, {n} "
                        "values")
    if column.dtype.kind not in "biufUS":
        raise DataError(f"save_npz: column {name!r} has dtype {column.dtype}; give integers, reals or strings (an "
                        "object array is not stored: the archive is read without pickle)")
    return column


def _short(err: Exception) -> str:
    """An exception's message on one line, cut to a readable length."""
    return brief(err) or type(err).__name__
