"""``CSVSource``: a delimited text file with a header row, one column of which is the label.

Columns named in ``categorical`` are one-hot encoded, one column per distinct value in
sorted order (numerically when every value is a number); every other column must be
numeric. A cell that is empty, ``NA``, ``NaN`` or ``?`` (any case), or a number that is
not finite (``inf``), is missing: numeric features are imputed with the column mean or
median, or refused (``impute="error"``); a missing categorical value becomes an all-zero
one-hot row; a missing label is always an error. Then, by default, every numeric
feature column is standardized over all rows (``standardize=numeric``; ``all`` also the
one-hot columns, ``none`` nothing). Each of these steps is stated in ``Table.notes``.
With ``sharding=column``, the column ``client_column`` names each row's client: it is read
as text (stripped), is no feature, and a row without a value is refused. Columns named in
``drop`` (an ID, a name, a free-text comment) are left out unread: neither feature, label nor
client, whatever they hold.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dane import checks
from dane.data.parts import FileSource, count_lines
from dane.data.sharding import ShardingKeys
from dane.data.table import MISSING, Table, is_number, missing_rows, not_utf8, standardize_columns
from dane.errors import ConfigError, DataError, plural

IMPUTE = ("mean", "median", "error")


@dataclass(frozen=True)
class CSVSource(FileSource, ShardingKeys):
    """A CSV file (``conf/data/csv.yaml``); ``path`` with ``{rank}`` names one file per worker.

    How rows are dealt to workers: ``sharding``, ``alpha``, ... (`dane.data.sharding.ShardingKeys`);
    ``sharding=column`` with ``client_column`` a header name: one client per value of that column.

    ``target``: the label column. ``categorical``: columns to one-hot encode.
    ``standardize``: scale feature columns to mean 0, std 1 over all rows: ``numeric``
    (true), the numeric columns; ``all``, the one-hot columns too (a rare value's column
    then has entries of size sqrt(N / count), which is what makes a shard without it
    misjudge the global Hessian: docs/design.md, "A rare feature"); ``none`` (false). Only ``none``
    is allowed with parts, whose statistics would differ. ``impute``: mean | median | error.
    ``delimiter``: one character. ``data_dir``: where relative paths are looked up first.
    ``drop``: columns left out (an ID column, a name): read for no purpose, each one a column of the header.
    """

    path: str
    target: str
    categorical: tuple[str, ...] = ()
    standardize: str = "numeric"
    impute: str = "mean"
    delimiter: str = ","
    data_dir: str | None = None
    name: str = "csv"
    drop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.check_path(columns="a column of the header")
        if not isinstance(self.target, str) or not self.target:
            raise ConfigError(f"data.target must name the label column, got {self.target!r}")
        for key in ("categorical", "drop"):  # None or a number: a TypeError from iterating it
            value = getattr(self, key)
            if not isinstance(value, (str, Iterable)) or isinstance(value, Mapping):
                raise ConfigError(f"data.{key} must be a column name or a list of them, got {value!r}; give [] "
                                  "for none")
        columns = (self.categorical,) if isinstance(self.categorical, str) else self.categorical
        object.__setattr__(self, "categorical", tuple(str(c) for c in columns))
        dropped = (self.drop,) if isinstance(self.drop, str) else self.drop
        object.__setattr__(self, "drop", tuple(dict.fromkeys(str(c) for c in dropped)))
        for column, key, what in ((self.target, "data.target", "the label"),
                                  (self.client_column, "data.client_column", "the clients' column")):
            if column in self.drop:
                raise ConfigError(f"{key}={column} is also in data.drop; {what} cannot be left out, remove it from "
                                  "data.drop")
        both = [c for c in self.categorical if c in self.drop]
        if both:
            raise ConfigError(f"data.categorical and data.drop both name {', '.join(both)}; a column is either "
                              "one-hot encoded or left out, remove it from one of them")
        if self.target in self.categorical:
            raise ConfigError(
                f"data.target={self.target} is also in data.categorical; the label is not a feature, "
                "remove it from data.categorical"
            )
        if self.client_column == self.target:
            raise ConfigError(f"data.client_column={self.client_column} is the label (data.target); the clients "
                              "are another column, name it")
        if self.client_column in self.categorical:
            raise ConfigError(f"data.client_column={self.client_column} is also in data.categorical; the client "
                              "column is not a feature, remove it from data.categorical")
        self.check_standardize()
        checks.one_of("data.impute", self.impute, IMPUTE)
        if self.delimiter == "\\t":  # what a shell passes for data.delimiter='\t' (--delimiter '\t'): a tab
            object.__setattr__(self, "delimiter", "\t")
        if not isinstance(self.delimiter, str) or len(self.delimiter) != 1:
            raise ConfigError(f"data.delimiter must be one character (e.g. ';', or '\\t' for a tab), got "
                              f"{self.delimiter!r}")
        if self.presharded and self.categorical:
            raise ConfigError(
                f"data.categorical with per-worker parts (data.path={self.path}) would one-hot encode "
                "each part by its own values; one-hot encode when you write the parts"
            )

    def _read(self, file: Path) -> Table:
        header, rows, lines = _read_cells(file, self.delimiter)
        for column in (self.target, *self.categorical):
            if column not in header:
                raise DataError(_no_column(file, column, header, self.delimiter))
        for column in self.drop:
            if column not in header:
                raise DataError(_no_column(file, column, header, self.delimiter, "data.drop"))
        clients = self.client_column is not None
        if clients and self.client_column not in header:
            raise DataError(_no_column(file, self.client_column, header, self.delimiter, "data.client_column"))
        cells = dict(zip(header, zip(*rows)))
        y = _numbers(cells[self.target], file, self.target, lines, label=True)
        missing_label = np.flatnonzero(np.isnan(y))
        if missing_label.size:
            row = missing_label[0]
            cell = cells[self.target][row]
            what = "is not a finite number" if _not_finite(cell) else "is missing"
            raise DataError(
                f"{file} line {lines[row]}: the label (column '{self.target}') {what} "
                f"({cell!r}); every row needs a label, fill it in or remove the row"
            )
        blocks, names, numeric, notes = [], [], [], []
        for column in header:
            if column == self.target or column == self.client_column or column in self.drop:
                continue
            if column in self.categorical:
                block, values, note = _one_hot(cells[column], file, column, lines, self.impute)
                names += [f"{column}={v}" for v in values]
            else:
                block, note = _numeric_feature(cells[column], file, column, lines, self.impute)
                numeric.append(len(names))
                names.append(column)
            blocks.append(block)
            notes += [note] if note else []
        if not blocks:
            others = f" besides the columns of data.drop ({', '.join(self.drop)})" if self.drop else ""
            raise DataError(f"{file} has only the label column '{self.target}'{others}; add at least one feature "
                            "column" + (" or leave fewer out" if self.drop else ""))
        X = np.column_stack(blocks)
        notes.insert(0, f"read {plural(X.shape[0], 'row')} x {plural(X.shape[1], 'feature')} from {file}")
        if self.drop:
            notes.insert(1, f"left out column(s) {', '.join(self.drop)} (data.drop)")
        columns = list(range(X.shape[1])) if self.standardize == "all" else numeric if self.standardize == "numeric" else []
        if columns:
            notes.append(_standardized(X, columns, names, "" if self.standardize == "all" else "numeric "))
        return Table(X=X, y=y, name=f"csv:{Path(self.path).name}", notes=notes, feature_names=names,
                     clients=_clients(cells[self.client_column], file, self.client_column, lines) if clients else None)

    def _count_rows(self, file: Path) -> int:
        return max(count_lines(file) - 1, 0)  # less the header

    def _width(self, file: Path) -> int | None:  # less the label and the columns left out; no categorical in parts
        header = self._header(file)
        return len(header) - 1 - sum(column in header for column in self.drop)

    def _header(self, file: Path) -> list[str]:
        return _read_cells(file, self.delimiter, header_only=True)[0]


def _read_cells(
    file: Path, delimiter: str, *, header_only: bool = False
) -> tuple[list[str], list[list[str]], list[int]]:
    """(header, rows of cells, the 1-based line number of each row); blank lines are skipped."""
    header, rows, lines = None, [], []
    try:
        with open(file, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f, delimiter=delimiter)
            for row in reader:
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                if header is None:
                    header = [cell.strip() for cell in row]
                    if header_only:
                        break
                    continue
                if len(row) != len(header):
                    raise DataError(
                        f"{file} line {reader.line_num} has {len(row)} cells but the header has "
                        f"{len(header)} columns; fix the row (or set data.delimiter if it is not {delimiter!r})"
                    )
                rows.append(row)
                lines.append(reader.line_num)
    except UnicodeDecodeError as err:
        raise not_utf8(file, err, "is it a CSV file? save it as UTF-8 CSV, or use data=libsvm or data=npz") from None
    except csv.Error as err:
        raise DataError(f"{file} line {reader.line_num} is not CSV ({err}); fix the line or check data.path") from None
    _check_header(file, header, rows, header_only)
    return header, rows, lines


def _check_header(file: Path, header: list[str] | None, rows: list, header_only: bool) -> None:
    if header is None:
        raise DataError(f"{file} is empty; a CSV needs a header row naming the columns, then one row per example")
    if not header_only and not rows:
        raise DataError(f"{file} has a header ({', '.join(header)}) but no data rows; add rows or check data.path")
    if all(is_number(cell) for cell in header):
        raise DataError(
            f"{file}: the first line ({', '.join(header)}) looks like data, not a header; "
            "add a header row naming the columns"
        )
    repeated = sorted({c for c in header if header.count(c) > 1})
    if repeated:
        raise DataError(
            f"{file}: the header names column(s) {', '.join(repeated)} twice; give every column its own name"
        )


def _no_column(file: Path, column: str, header: list[str], delimiter: str, setting: str = "") -> str:
    hint = f" (one column: is data.delimiter={delimiter!r} right?)" if len(header) == 1 else ""
    return (
        f"{file} has no column '{column}'; its columns are: {', '.join(header)}{hint}; "
        f"set {setting or 'data.target / data.categorical'} to one of them"
    )


def _clients(cells: tuple[str, ...], file: Path, column: str, lines: list[int]) -> np.ndarray:
    """The client column as stripped text; a missing cell is one line (a client the data does not name)."""
    tokens = np.array([cell.strip() for cell in cells])
    missing = np.flatnonzero(missing_rows(tokens))
    if missing.size:
        raise DataError(
            f"{file} line {lines[missing[0]]}, column '{column}' (data.client_column): value missing "
            f"({cells[missing[0]]!r}); every row needs a client: fill it in (e.g. 'unknown') or remove the row"
        )
    return tokens


def _not_finite(cell: str) -> bool:
    """inf, or a number beyond float64 (1e999): a value, not a missing marker such as NaN."""
    token = cell.strip()
    return token.lower() not in MISSING and is_number(token)


def _numbers(cells: tuple[str, ...], file: Path, column: str, lines: list[int], *, label: bool = False) -> np.ndarray:
    """A column as float64, nan where missing; a cell that is neither is one line naming it."""
    try:
        values = np.array(cells, dtype=np.float64)
    except ValueError:  # missing markers or text: go cell by cell to find out which
        values = np.empty(len(cells))
        for i, cell in enumerate(cells):
            token = cell.strip()
            if token.lower() in MISSING:
                values[i] = np.nan
            elif is_number(token):
                values[i] = float(token)
            else:
                fix = (
                    "write the labels as numbers (0/1 for logreg, 0..K-1 for softmax) or clean the file"
                    if label else f"list it under data.categorical=[{column}] to one-hot encode it, or leave it out "
                                  f"with data.drop=[{column}] (an ID, a name), or clean the file"
                )
                kind = "the label column" if label else "column"
                raise DataError(f"{file} line {lines[i]}, {kind} '{column}': {token[:40]!r} is not a number; {fix}")
    values[~np.isfinite(values)] = np.nan
    return values


def _numeric_feature(
    cells: tuple[str, ...], file: Path, column: str, lines: list[int], impute: str
) -> tuple[np.ndarray, str | None]:
    """A numeric feature column with its missing values imputed, and the note saying how many."""
    values = _numbers(cells, file, column, lines)
    missing = np.isnan(values)
    if not missing.any():
        return values, None
    first = np.flatnonzero(missing)[0]
    if impute == "error" and _not_finite(cells[first]):
        raise DataError(
            f"{file} line {lines[first]}, column '{column}': {cells[first].strip()!r} is not a finite number and "
            "data.impute=error; clean the file, or set data.impute=mean or data.impute=median to treat it as missing"
        )
    if impute == "error":
        raise DataError(
            f"{file} line {lines[first]}, column '{column}': value missing ({cells[first]!r}) and "
            "data.impute=error; fill it in, or set data.impute=mean or data.impute=median"
        )
    if missing.all():
        raise DataError(f"{file}: column '{column}' has no values at all; remove it from the file")
    fill = np.mean(values[~missing]) if impute == "mean" else np.median(values[~missing])
    values[missing] = fill
    return values, f"imputed {missing.sum()} missing value(s) in '{column}' with the column {impute} {fill:.6g}"


def _one_hot(
    cells: tuple[str, ...], file: Path, column: str, lines: list[int], impute: str
) -> tuple[np.ndarray, list[str], str]:
    """One 0/1 column per distinct value (sorted), the values, and the note."""
    tokens = [cell.strip() for cell in cells]
    missing = [i for i, t in enumerate(tokens) if t.lower() in MISSING]
    if missing and impute == "error":
        raise DataError(
            f"{file} line {lines[missing[0]]}, column '{column}': value missing ({cells[missing[0]]!r}) "
            "and data.impute=error; fill it in, or set data.impute=mean to leave it all-zero"
        )
    values = sorted({t for t in tokens if t.lower() not in MISSING})
    if all(is_number(v) for v in values):
        values.sort(key=float)
    index = {v: k for k, v in enumerate(values)}
    block = np.zeros((len(tokens), len(values)))
    rows = [i for i, t in enumerate(tokens) if t in index]
    block[rows, [index[tokens[i]] for i in rows]] = 1.0
    shown = ", ".join(values[:8]) + (", ..." if len(values) > 8 else "")
    note = f"one-hot: '{column}' -> {plural(len(values), 'column')} ({shown})"
    if missing:
        note += f"; {len(missing)} missing value(s) left as all-zero rows"
    return block, values, note


def _standardized(X: np.ndarray, columns: list[int], names: list[str], kind: str) -> str:
    """Standardize ``columns`` of ``X`` in place; the note that says so (``kind``: "numeric " or "")."""
    constant = standardize_columns(X, columns)
    note = f"standardized {len(columns)} {kind}column(s) to mean 0, std 1 over {plural(X.shape[0], 'row')}"
    if constant:
        note += f"; constant column(s) centred to 0, not scaled: {', '.join(names[j] for j in constant)}"
    return note
