"""Presharded data: one file per worker, named by a ``{rank}`` placeholder in ``data.path``.

``data.path=part-{rank}.csv`` with 4 workers means ``part-0.csv`` .. ``part-3.csv``;
worker r reads only its own part and learns the total row count N by counting the
lines of every part, which costs a pass over the bytes but no parsing. The number of
parts must equal the number of workers, and every part must have the same width d.

`FileSource` holds what the file sources (CSV, LIBSVM, NPZ) share: ``presharded``,
``load`` and ``load_part``; each source says how to read one file, count its rows and
find its width.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from dane import checks
from dane.data.scaling import STANDARDIZE, standardize_mode
from dane.data.table import Table, file_stamps, resolve
from dane.errors import ConfigError, DataError, UserError, plural

PLACEHOLDER = "{rank}"


def is_presharded(path: str) -> bool:
    """True when ``path`` names per-worker parts: it contains the literal ``{rank}``."""
    return PLACEHOLDER in str(path)


def part_files(path: str, data_dir: str | None, size: int) -> list[Path]:
    """The ``size`` part files ``path.format(rank=r)``, checked to be exactly ``size`` of them."""
    found = 0  # parts 0, 1, ... that exist, up to the first gap
    while _exists(path.format(rank=found), data_dir):
        found += 1
    if found < size:
        resolve(
            path.format(rank=found),
            data_dir,
            fix=f"a run of {plural(size, 'worker')} reads parts 0..{size - 1} of {path}; launch as many workers as "
            "parts, or write the missing part (or check data.path and data_dir)",
        )
    if found > size:
        raise DataError(
            f"{path.format(rank=size)} exists but the run launched only {plural(size, 'worker')}; there are "
            f"{found} parts of {path}, so launch {found} workers (as many workers as parts)"
        )
    return [resolve(path.format(rank=rank), data_dir) for rank in range(size)]


def _exists(path: str, data_dir: str | None) -> bool:
    try:
        resolve(path, data_dir)
    except DataError:
        return False
    return True


def check_same_width(widths: Sequence[int | None], files: Sequence[Path]) -> None:
    """One line naming the first two files whose feature counts d differ (``None``: not known)."""
    known = [(d, f) for d, f in zip(widths, files) if d is not None]
    for d, f in known[1:]:
        if d != known[0][0]:
            raise DataError(
                f"d mismatch between files {known[0][1]} (d={known[0][0]}) and {f} (d={d}); "
                "write every part with the same feature columns"
            )


def check_same_header(headers: Sequence[list[str] | None], files: Sequence[Path]) -> None:
    """One line naming the first two files whose column names differ (``None``: no header)."""
    known = [(h, f) for h, f in zip(headers, files) if h is not None]
    for h, f in known[1:]:
        if h != known[0][0]:
            raise DataError(
                f"columns differ between files {known[0][1]} ({', '.join(known[0][0])}) and {f} "
                f"({', '.join(h)}); write every part with the same header"
            )


def count_lines(path: Path, *, skip_comments: bool = False) -> int:
    """Non-blank lines of ``path`` (and not ``#`` comments if asked), counted without parsing."""
    count = 0
    with open(path, "rb") as f:
        for line in f:
            stripped = line.strip()
            if stripped and not (skip_comments and stripped.startswith(b"#")):
                count += 1
    return count


class FileSource:
    """A source read from ``self.path``, whole (``load``) or as this worker's part (``load_part``).

    Subclasses are frozen dataclasses with ``path``, ``data_dir`` and ``name`` fields and
    implement ``_read(file) -> Table``, ``_count_rows(file) -> int`` (cheap) and
    ``_width(file) -> int | None`` (cheap; ``None`` when every part has a fixed width);
    ``_header(file)`` returns the column names where the format has them.  Their ``__post_init__`` calls the
    hooks `check_path` (the path and the sharding keys) and `check_standardize` (``data.standardize``).
    """

    path: str
    data_dir: str | None
    name: str
    standardize: str  # numeric | all | none: `check_standardize`
    # and the `dane.data.sharding.ShardingKeys` (data.sharding, data.alpha, ...): a subclass is one too

    @property
    def presharded(self) -> bool:
        """Whether ``path`` names one file per worker (it contains ``{rank}``)."""
        return is_presharded(self.path)

    def check_path(self, columns: str | None = None) -> None:
        """Config checks shared by every file source, for ``__post_init__``: the path, and the sharding keys
        (`dane.data.sharding.ShardingKeys`; per-worker parts are the partition, so only iid with them);
        ``columns`` says what names this source's client column (``data.sharding=column``).  A path given as an
        ``os.PathLike`` (a `pathlib.Path`) is kept as its str, as the command line gives it."""
        for key in ("path", "data_dir"):
            if isinstance(getattr(self, key), os.PathLike):
                object.__setattr__(self, key, os.fspath(getattr(self, key)))  # bytes stay refused below
        if not isinstance(self.path, str) or not self.path:
            raise ConfigError(f"data.path must be a file name (a str or a pathlib.Path), got {self.path!r}")
        if self.data_dir is not None and not isinstance(self.data_dir, str):
            raise ConfigError(f"data.data_dir must be a folder name (a str or a pathlib.Path) or null, got "
                              f"{self.data_dir!r}")
        try:
            self.path.format(rank=0)
        except (KeyError, IndexError, ValueError):
            raise ConfigError(
                f"data.path={self.path} has braces other than {{rank}}; the only placeholder is {{rank}}, "
                "write literal braces as {{ and }}"
            ) from None
        self.check_sharding(columns=columns)
        if self.presharded:
            self.check_parts(self.path)

    def check_standardize(self) -> None:
        """``data.standardize``: the boolean aliases resolved, one of numeric|all|none, and none with parts
        (each part's own statistics would scale each worker's rows differently)."""
        object.__setattr__(self, "standardize", standardize_mode(self.standardize))
        checks.one_of("data.standardize", self.standardize, STANDARDIZE)
        if self.presharded and self.standardize != "none":
            raise ConfigError(
                f"data.standardize={self.standardize} with per-worker parts (data.path={self.path}) would scale "
                "each part by its own statistics; standardize when you write the parts and set data.standardize=none"
            )

    def content_stamp(self) -> tuple | None:
        """`dane.data.table.file_stamps` of the file `load` reads, so that a process reads it again once it is
        rewritten; None for per-worker parts (read by each worker as it builds, and kept by none) and for a file
        not found (`load` says so in one line)."""
        if self.presharded:
            return None
        try:
            return file_stamps([resolve(self.path, self.data_dir)])
        except (UserError, OSError):
            return None

    def load(self) -> Table:
        """Read the whole data set from ``path`` (not presharded)."""
        if self.presharded:
            raise ConfigError(
                f"data.path={self.path} names one part per worker; each worker reads its own "
                "with load_part(rank, size), or give one file without {rank}"
            )
        return self._read(resolve(self.path, self.data_dir))

    def load_part(self, rank: int, size: int) -> tuple[Table, int]:
        """Worker ``rank``'s rows from ``path.format(rank=rank)``, and N, the rows of all ``size`` parts."""
        if not self.presharded:
            raise ConfigError(
                f"data.path={self.path} is one file, not per-worker parts; read it with load(), "
                "or write one file per worker and put {rank} in data.path"
            )
        checks.positive_int("workers", size)
        if not (isinstance(rank, int) and 0 <= rank < size):
            raise ConfigError(f"rank must be in 0..{size - 1}, got {rank!r}")
        files = part_files(self.path, self.data_dir, size)
        check_same_width([self._width(f) for f in files], files)
        check_same_header([self._header(f) for f in files], files)
        counts = [self._count_rows(f) for f in files]
        table = self._read(files[rank])
        if table.n != counts[rank]:
            raise DataError(
                f"{files[rank]} parsed to {table.n} rows but has {counts[rank]} data lines; "
                "a part file must hold one row per line (no quoted line breaks)"
            )
        total = sum(counts)
        table.notes.append(f"part {rank} of {size}: {files[rank]} holds {table.n} of the N={total} rows")
        return table, total

    def _read(self, file: Path) -> Table:
        raise NotImplementedError

    def _count_rows(self, file: Path) -> int:
        raise NotImplementedError

    def _width(self, file: Path) -> int | None:
        raise NotImplementedError

    def _header(self, file: Path) -> list[str] | None:
        return None
