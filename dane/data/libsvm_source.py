"""``LibSVMSource``: a LIBSVM / SVMlight text file, kept sparse.

Each line is ``<label> <index>:<value> <index>:<value> ...`` with increasing indices
(``#`` starts a comment; ``qid:`` entries are ignored, except that ``sharding=column`` with
``client_column=qid`` makes each line's ``qid:<n>`` its client: then every line needs one, ``<n>`` an
integer). The file is read by scikit-learn's ``load_svmlight_file``; ``X`` stays a ``scipy.sparse.csr_matrix``.
Per-worker parts (``{rank}`` in ``path``) need ``n_features``, because one part alone
cannot know d: its largest index may be smaller than another part's.
"""

from __future__ import annotations

import bz2
import gzip
import itertools
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from sklearn.datasets import load_svmlight_file

from dane import checks
from dane.data.parts import FileSource, count_lines
from dane.data.scaling import standardize_matrix
from dane.data.sharding import ShardingKeys
from dane.data.table import Table, is_number
from dane.errors import ConfigError, DataError, brief, plural

FORMAT = "each line is '<label> <index>:<value> ...' with increasing indices"
QID = "qid"  # the one client column a LIBSVM line has: its qid:<n> field
QID_FORMAT = ("with data.client_column=qid each line is '<label> qid:<n> <index>:<value> ...', <n> an integer (the "
              "line's client)")


@dataclass(frozen=True)
class LibSVMSource(FileSource, ShardingKeys):
    """A LIBSVM file (``conf/data/libsvm.yaml``).

    How rows are dealt to workers: ``sharding``, ``alpha``, ... (`dane.data.sharding.ShardingKeys`);
    ``sharding=column`` takes ``client_column=qid``: one client per ``qid:`` value, which is no feature.

    ``n_features``: d; ``None`` takes the largest index in the file (required for parts).
    ``zero_based``: whether index 0 is the first feature; ``"auto"`` (scikit-learn's
    rule) treats the file as 0-based if any index is 0, else 1-based. ``auto`` is not
    allowed with parts, which could each guess differently.
    ``standardize``: ``none`` (the default: X as read), ``numeric`` (true: the columns with a
    value other than 0/1) or ``all``: each column divided by its std over all rows, not centred,
    so X stays sparse (`dane.data.scaling` says when that is the same fit as centring too).
    ``none`` with parts.
    """

    path: str
    n_features: int | None = None
    zero_based: bool | str = "auto"
    data_dir: str | None = None
    name: str = "libsvm"
    standardize: str = "none"

    def __post_init__(self) -> None:
        self.check_path(columns="which for LIBSVM is qid (the qid:<n> field of each line)")
        if self.client_column not in (None, QID):
            raise ConfigError(f"data.client_column={self.client_column}: a LIBSVM line's only client field is "
                              "qid:<n>; set data.client_column=qid (or use data=csv|npz for a named column)")
        self.check_standardize()
        if self.n_features is not None:
            checks.positive_int("data.n_features", self.n_features)
        if not (self.zero_based == "auto" or isinstance(self.zero_based, bool)):
            raise ConfigError(f"data.zero_based must be true, false or auto, got {self.zero_based!r}")
        if self.presharded and self.n_features is None:
            raise ConfigError(
                f"data.n_features is required with per-worker parts (data.path={self.path}): each part "
                "alone cannot know d, since its largest index may be below another part's; set data.n_features=d"
            )
        if self.presharded and self.zero_based == "auto":
            raise ConfigError(
                f"data.zero_based=auto with per-worker parts (data.path={self.path}) lets each part guess "
                "its own index base; set data.zero_based=true (indices from 0) or false (from 1)"
            )

    def _read(self, file: Path) -> Table:
        try:
            X, y, *qid = load_svmlight_file(str(file), dtype=np.float64, zero_based=self.zero_based,
                                            query_id=self.client_column == QID)
        except (ValueError, TypeError, OverflowError) as err:
            raise DataError(_explain(file, err, self.zero_based, qid=self.client_column == QID)) from None
        except (OSError, EOFError, zlib.error) as err:  # a damaged .gz/.bz2 stream (BadGzipFile is an OSError)
            raise DataError(f"{file} cannot be read ({brief(err, 80) or type(err).__name__}); "
                            "is the compressed file complete? re-download it or give the uncompressed file") from None
        X = sp.csr_matrix(X)
        if X.shape[0] == 0:
            raise DataError(f"{file} holds no rows; {FORMAT}; check data.path")
        d = X.shape[1] if self.n_features is None else self.n_features
        if X.shape[1] > d:
            raise DataError(
                f"{file} has a feature index that needs {X.shape[1]} features but data.n_features={d}; "
                f"raise data.n_features to at least {X.shape[1]} (or check data.zero_based)"
            )
        X = sp.csr_matrix((X.data, X.indices, X.indptr), shape=(X.shape[0], d))
        bad = np.count_nonzero(~np.isfinite(X.data)) + np.count_nonzero(~np.isfinite(y))
        if bad:
            raise DataError(_non_finite(file, X, y, bad))
        notes = [f"read {plural(X.shape[0], 'row')} x {plural(d, 'feature')} ({plural(X.nnz, 'non-zero')}, sparse) "
                 f"from {file}"]
        notes += filter(None, [standardize_matrix(X, self.standardize)])
        return Table(X=X, y=np.asarray(y, dtype=np.float64), name=f"libsvm:{Path(self.path).name}", notes=notes,
                     clients=_every_line_has_a_qid(file, qid[0], X.shape[0]) if qid else None)

    def _count_rows(self, file: Path) -> int:
        return count_lines(file, skip_comments=True)

    def _width(self, file: Path) -> int | None:
        return None  # every part is read with n_features columns


def _every_line_has_a_qid(file: Path, qid: np.ndarray, n: int) -> np.ndarray:
    """The qid of each row (scikit-learn returns one per line that has it), or one line naming a line without."""
    if len(qid) == n:
        return np.asarray(qid, dtype=np.int64)
    number = next((number for number, text in _data_lines(file) if " qid:" not in f" {text}"), "?")
    raise DataError(f"{file} line {number} has no qid: field ({n - len(qid)} of its {n} rows lack one); with "
                    "data.client_column=qid every line is '<label> qid:<n> <index>:<value> ...'")


def _explain(file: Path, err: Exception, zero_based: bool | str, *, qid: bool = False) -> str:
    """One line for a file scikit-learn could not parse: the first bad line, when we can find it (``qid``: read with
    its qid fields, which scikit-learn parses as integers)."""
    try:
        found = _first_bad_line(file, qid=qid)
    except (OSError, EOFError, zlib.error):  # a damaged compressed stream: say what the parser said
        found = None
    if found is not None:
        line, text, why, form = found
        return f"{file} line {line} is not LIBSVM ({why}: {text[:60]!r}); {form}; fix the line"
    reason = brief(err)
    if "Invalid index 0" in reason and zero_based is False:
        return f"{file} has feature index 0 but data.zero_based=false; set data.zero_based=true"
    return f"{file} is not a LIBSVM file ({reason}); {FORMAT}; fix the file or check data.path"


def _non_finite(file: Path, X: sp.csr_matrix, y: np.ndarray, count: int) -> str:
    """One line naming the first nan or inf: its line, its entry, and the fix."""
    rows = np.flatnonzero(~np.isfinite(y)).tolist()
    positions = np.flatnonzero(~np.isfinite(X.data))
    if positions.size:
        rows.append(int(np.searchsorted(X.indptr, positions[0], side="right")) - 1)
    number, text = next(itertools.islice(_data_lines(file), min(rows), None))
    label, *pairs = text.split()
    entry = "the label" if not _finite(label) else "feature " + next(
        (index for index, _, value in (p.partition(":") for p in pairs) if not _finite(value)), "?")
    return (f"{file} holds {count} non-finite values (nan/inf), the first at line {number}, {entry}; clean the "
            "file (a zero feature is left out of its line, not written as nan)")


def _finite(token: str) -> bool:
    try:
        return np.isfinite(float(token))
    except ValueError:
        return True  # not a number at all: the parser has already refused such a line


def _open(file: Path):
    """The file as bytes, decompressed as scikit-learn's reader does (by its .gz or .bz2 suffix)."""
    if file.suffix == ".gz":
        return gzip.open(file, "rb")
    if file.suffix == ".bz2":
        return bz2.open(file, "rb")
    return open(file, "rb")


def _data_lines(file: Path):
    """(line number, text without its comment) of every line that holds a row."""
    with _open(file) as f:
        for number, raw in enumerate(f, start=1):
            text = raw.decode("utf-8", "replace").split("#", 1)[0].strip()
            if text:
                yield number, text


def _first_bad_line(file: Path, *, qid: bool = False) -> tuple[int, str, str, str] | None:
    """(line number, its text, why, the format it breaks) of the first line that breaks the format, or None;
    ``qid``: a ``qid:`` value must be an integer, as scikit-learn reads it (``int``), else it is skipped."""
    with _open(file) as f:
        for number, raw in enumerate(f, start=1):
            text = raw.decode("utf-8", "replace").split("#", 1)[0].strip()
            if not text:
                continue
            label, *pairs = text.split()
            why = None if is_number(label) else "the label is not a number"
            form = FORMAT
            last = -1
            for pair in pairs:
                index, _, value = pair.partition(":")
                if index == "qid":
                    if qid and why is None and not _integer(value):
                        why = f"qid:{value} is not an integer" if value else "qid: has no value"
                        form = QID_FORMAT
                    continue
                if not (index.isdigit() and is_number(value)):
                    why = why or f"{pair[:20]!r} is not index:value"
                elif int(index) <= last:
                    why = why or "indices do not increase"
                else:
                    last = int(index)
            if why:
                return number, raw.decode("utf-8", "replace").strip(), why, form
    return None


def _integer(token: str) -> bool:
    try:
        int(token)
    except ValueError:
        return False
    return True
