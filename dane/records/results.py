"""The one log schema: ``rounds.jsonl`` (one JSON record per round, append-only) and ``summary.json``.

Every record has ``round, time_s, bytes_sent, comm_rounds, objective`` and, where the
problem knows them, ``suboptimality`` and ``grad_norm``; algorithms add their own keys
(``mu``, ``accepted``, ``primal_residual``, ...), and a round where a rule moved a number carries the moves as
``adapted``, each event made by `adaptation`.  ``time_s`` is wall time under a
launcher and simulated parallel time in the in-process simulator; ``bytes_sent`` is what
rank 0 sent.  Figures read these files and nothing else.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import threading
from pathlib import Path
from typing import Callable

from ..errors import ConfigError, DataError
from .lock import take_lock
from .provenance import run_provenance

ROUNDS_FILE = "rounds.jsonl"
SUMMARY_FILE = "summary.json"


TEMPORARY = re.compile(r"\.(.+)\.\d+\.\d+\.tmp")  # `atomic_write`'s temporary file: group 1 names its target


def atomic_write(path: str | Path, write) -> None:
    """``write(file)`` into a temporary file next to ``path``, flushed to disk, then renamed over ``path``.

    The temporary file is this thread's (``.NAME.PID.THREAD.tmp``): the simulator's workers, its progress and its
    trackers are threads of one process, and two of them writing one ``path`` at once each replace it with a whole
    file of their own, never with the other's half-written one.  It is made by `open`, so ``path`` gets the mode
    any new file gets here."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if isinstance(err, OSError) and not err.filename:  # a write names no file: say which
            raise OSError(err.errno, err.strerror, str(path)) from None
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode()))


def output_file(path: str | Path, option: str, example: str) -> Path:
    """``path`` where a command's ``option`` (``--out``) names the file it writes after its work (a benchmark's
    JSON, a calibration, a figure), checked before that work: a folder, a path under a file or in a folder this
    process cannot write is a `ConfigError` naming ``option`` and the fix (``example``: a file name to suggest in
    a folder), not a traceback once the work is done.  `atomic_write` makes the missing folders."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{option} {path} is a folder, not a file; name a file, such as {path / example}")
    if path.exists() and not path.is_file():  # a device or a pipe: the write would replace it
        raise ConfigError(f"{option} {path} is not a regular file; choose another {option}")
    _writable_place(path, option)
    return path


def output_folder(path: str | Path, option: str) -> Path:
    """As `output_file`, for an ``option`` that names the folder a command writes its files into: a file there,
    or a folder that cannot be made or written, is a `ConfigError`."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{option} {path} is a file, not a folder; choose another {option}")
    _writable_place(path, option, itself=True)
    return path


def _writable_place(path: Path, option: str, itself: bool = False) -> None:
    """The nearest folder that exists of ``path``'s parents (and of ``path``, ``itself``) is a folder this process
    can make a file in: tried, with an empty hidden file removed at once (permissions alone do not say it for
    root, nor for a read-only or a virtual file system)."""
    import tempfile

    place = next((p for p in ((path,) if itself else ()) + tuple(path.parents) if p.exists()), Path("."))
    if not place.is_dir():
        raise ConfigError(f"{option} {path} cannot be made: {place} is a file, not a folder; choose another {option}")
    try:
        fd, probe = tempfile.mkstemp(prefix=".write-probe.", dir=place)
    except OSError as err:
        raise ConfigError(f"{option} {path} cannot be written: {place} takes no new file "
                          f"({(err.strerror or str(err)).lower()}); choose another {option}") from None
    os.close(fd)
    os.unlink(probe)


def json_safe(value):
    """``value`` with every inf or nan float as its string ("inf", "-inf", "nan"), in dicts, lists and tuples too
    (tuples become lists): JSON has no inf or nan, and a diverged run's records, a default's statistics or a
    benchmark's table stay readable as strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def line(record: dict) -> str:
    """``record`` as one line of JSON, its inf and nan as strings (`json_safe`); the plain encoding where it has
    none (the same text: `json_safe` changes nothing else that JSON writes differently)."""
    try:
        return json.dumps(record, allow_nan=False)
    except ValueError:  # an inf or a nan somewhere in it
        return json.dumps({k: json_safe(v) for k, v in record.items()})


#: the prefixes of an ``adapted`` event's key (`adaptation`): the method's numbers and the problem's; ``status`` is the
#: one other key, the run's status a rule changed
ADAPTED_GROUPS = ("algorithm.", "problem.")


def adaptation(key: str, before, after, trigger: str, *, round: int | None = None,
               workers: list[list] | None = None, resolves: int | None = None) -> dict:
    """One ``adapted`` event, the one form of every mid-run move a record carries (the summary lists them, each with
    its round, as ``adaptations``): ``{"key", "from": before, "to": after, "trigger"}``, then what is given of
    ``round`` (the round the event belongs to, where a later record carries it: S-DANE's re-solves, read from the
    next record's local work; it comes first, as the summary puts every event's round), ``workers`` (``[i, from,
    to]`` for each worker whose own value moved, as far as the recording rank knows: GIANT's μ_i, the rank's
    re-derived SVRG setting) and ``resolves`` (the local solves made again).

    ``key`` names where the value lives, as the run's config and the records name it: ``algorithm.<name>``, the
    method's config key where the number is one (``algorithm.mu``, ``algorithm.rho``, ``algorithm.lam``), else its
    record key (GIANT's ``algorithm.mu``, AIDE's ``algorithm.zeta``, Acc-S-DANE's ``algorithm.A``);
    ``problem.<name>`` for the problem's local-solve settings; ``status`` where a rule ended the run."""
    if key != "status" and not key.startswith(ADAPTED_GROUPS):
        raise ValueError(f"adapted event key {key!r} says not whose number moved; name it algorithm.{key}, "
                         f"problem.{key} or status")
    return {**({"round": round} if round is not None else {}), "key": key, "from": before, "to": after,
            "trigger": trigger, **({"workers": workers} if workers is not None else {}),
            **({"resolves": resolves} if resolves is not None else {})}


#: the other files and folders a run writes into its directory beside its records (the command line's config, the
#: final iterate, a network's confusion matrix and its plot, an asynchronous run's update log, the TensorBoard
#: events): ``overwrite`` removes them with the records, so that none of the replaced run's is left beside the new
#: one's summary (MLflow's store, which keeps runs apart by itself, stays)
RUN_FILES = ("config.yaml", "iterate.pt", "confusion.json", "confusion.png", "updates.jsonl", "tensorboard")


def held_run(out_dir: str | Path) -> list[str]:
    """The run files ``out_dir`` holds (rounds.jsonl, summary.json): a run's, which a new run may not mix with."""
    return [name for name in (ROUNDS_FILE, SUMMARY_FILE) if (Path(out_dir) / name).exists()]


def occupied(out_dir: str | Path, held: list[str], resume_offer: str = "", out_dir_key: str = "out_dir") -> str:
    """The refusal of a run directory that holds a run (``held``, `held_run`); resume is named only where it can
    continue the run (``resume_offer``: a committed checkpoint).  ``out_dir_key`` is the setting the user changes
    to choose a new directory: ``out_dir``, or ``hydra.sweep.dir`` for a sweep's job in the folder the sweep chose
    (`dane.loop.spec.RunControl.out_dir_key`)."""
    return (f"out_dir={out_dir} already holds a run ({', '.join(held)}); choose a new {out_dir_key},{resume_offer} "
            "or replace it with overwrite=true (dane.fit: overwrite=True)")


class RunWriter:
    """Appends round records and writes the summary; flushes every line so a crash loses nothing.

    The summary also gets ``provenance`` (`dane.records.provenance.run_provenance`, taken when the
    writer opens: commit, command, start time, host, load average; the code of one's own that the run's resolved
    config ``config_text`` names, and the yamls of one's own folders ``config_dirs`` it was composed from).

    A run owns its directory: the writer takes ``<out_dir>/.lock`` (`dane.records.lock.take_lock`: created
    exclusively, holding host and pid; released by `close`, after the summary), so a second run into the same
    directory stops with one line.  A run that ends before its first record leaves the directory as it was
    (`close`).  A directory that already holds a run's records is refused unless ``resume`` (the run continues
    there: ``prepare`` cuts its records back to the checkpoint) or ``overwrite`` (the old records are removed
    first); the refusal offers ``resume_offer``, the caller's clause for continuing it
    (`dane.loop.checkpoint.resume_offer`: none where no checkpoint can), and names ``out_dir_key`` as the setting to
    change (`occupied`).  ``prepare`` is called once the lock is held, before anything else in the directory is
    touched: a resume refused by a live run's lock leaves that run's files as they were.

    ``trackers`` (`dane.records.trackers.Trackers`, set by `attach`) get each record and the summary after they are
    on disk, so a tracker that fails loses none of them.
    """

    def __init__(self, out_dir: str | Path, *, resume: bool = False, overwrite: bool = False,
                 resume_offer: str = "", out_dir_key: str = "out_dir", prepare: Callable[[], object] | None = None,
                 config_text: str = "", config_dirs: tuple[tuple[str, tuple[str, ...]], ...] = ()):
        self.out_dir = Path(out_dir)
        self.trackers = None
        self._wrote = 0  # records and the summary written: close keeps a directory that has any
        self._made_dirs = [p for p in (self.out_dir, *self.out_dir.parents) if not p.exists()]  # innermost first
        self._made_files: set[str] = set()  # what `_discard` removes again: made by this writer
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            file = next((p for p in (self.out_dir, *self.out_dir.parents) if p.exists()), self.out_dir)
            what = f"out_dir={out_dir} is" if file == self.out_dir else f"out_dir={out_dir} cannot be made: {file} is"
            raise ConfigError(f"{what} a file, not a directory; choose another out_dir") from None
        except OSError as err:  # permission denied, a read-only file system, a path under /proc
            raise ConfigError(f"out_dir={out_dir} cannot be created ({err.strerror.lower()}); "
                              "choose another out_dir") from None
        try:
            self._lock = take_lock(self.out_dir)
        except BaseException:
            self._remove_made_dirs()
            raise
        try:
            if prepare is not None:
                prepare()
            old = held_run(self.out_dir)
            if old and not resume:
                if not overwrite:
                    raise ConfigError(occupied(out_dir, old, resume_offer, out_dir_key))
                for name in (*old, *RUN_FILES):
                    path = self.out_dir / name
                    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)
            self.provenance = run_provenance(config_text, config_dirs)
            self._note_made(ROUNDS_FILE)
            self._rounds = open(self.out_dir / ROUNDS_FILE, "a", buffering=1)
        except BaseException:
            self._lock.unlink(missing_ok=True)
            self._remove_made_dirs()
            raise

    def attach(self, trackers) -> None:
        """Send every later record and the summary also to ``trackers`` (`dane.records.trackers.Trackers`)."""
        self.trackers = trackers

    def write_round(self, record: dict) -> None:
        try:
            self._rounds.write(line(record) + "\n")
        except OSError as err:  # a write names no file: say which (a full or read-only file system)
            raise OSError(err.errno, err.strerror, str(self.out_dir / ROUNDS_FILE)) from None
        self._wrote += 1
        if self.trackers is not None:
            self.trackers.log_round(record)

    def write_summary(self, summary: dict) -> None:
        summary = {**summary, "provenance": summary.get("provenance", self.provenance)}
        self._wrote += 1
        atomic_write_text(self.out_dir / SUMMARY_FILE,
                          json.dumps({k: json_safe(v) for k, v in summary.items()}, indent=2) + "\n")
        if self.trackers is not None:
            self.trackers.finish(summary)

    def write_text(self, name: str, text: str) -> None:
        self._note_made(name)
        atomic_write_text(self.out_dir / name, text)

    def finish_rounds(self) -> None:
        """Close rounds.jsonl (the run's rounds are over); the directory stays locked for the summary."""
        try:
            self._rounds.close()  # flushes: may fail like a write on a full file system; a second call is a no-op
        except OSError as err:
            raise OSError(err.errno, err.strerror, str(self.out_dir / ROUNDS_FILE)) from None

    def close(self) -> None:
        """Close rounds.jsonl and release the directory, last: no other run writes there before the summary is in.

        A run that wrote no record or summary (it failed or was stopped before its first round) leaves it as
        it found it: what this writer made (config.yaml, the empty rounds.jsonl, the folder) is removed, so
        the same command can run there again."""
        try:
            self.finish_rounds()
        finally:
            try:
                if not self._wrote:
                    self._discard()
            finally:
                self._lock.unlink(missing_ok=True)
                if not self._wrote:
                    self._remove_made_dirs()

    def _discard(self) -> None:
        """Remove the files this writer made (none of a run it continues or a file that was there before)."""
        for name in self._made_files:
            (self.out_dir / name).unlink(missing_ok=True)
        self._made_files.clear()

    def _note_made(self, name: str) -> None:
        if not (self.out_dir / name).exists():
            self._made_files.add(name)

    def _remove_made_dirs(self) -> None:
        """The folders this writer made for out_dir, innermost first, each only if it is empty."""
        for folder in self._made_dirs:
            try:
                folder.rmdir()
            except OSError:  # not empty (a tracker's files, another run's), or gone: keep what is there
                return


def read_safe(value):
    """`json_safe`'s inverse: the strings "inf", "-inf" and "nan" back to the floats they were, in dicts and lists
    too (an ``adapted`` event's numbers, a default's statistics), every other value as read."""
    if isinstance(value, str):
        return float(value) if value in ("inf", "-inf", "nan") else value
    if isinstance(value, dict):
        return {k: read_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [read_safe(v) for v in value]
    return value


#: the keys a reader may index in every record (the module docstring lists what a run writes)
RECORD_KEYS = ("round",)


class RoundsUnreadable(DataError):
    """A rounds.jsonl that cannot be read whole: missing, not a readable file, or a line before the last that is
    no record.  ``problem`` is the short form a table shows (``no rounds.jsonl``, ``rounds.jsonl damaged (line 3)``),
    ``records`` the whole records before the damage; the message names the file (and line) and the fix."""

    def __init__(self, message: str, problem: str, records: list[dict] | None = None):
        super().__init__(message)
        self.problem, self.records = problem, records or []


def _fix(run_dir: Path, why: str = "the run was cut short or the file damaged") -> str:
    return f"{why}; restore it, or rerun the run (out_dir={run_dir} overwrite=true replaces it)"


def scan_rounds(run_dir: str | Path) -> tuple[list[dict], int | None]:
    """The records of ``run_dir``'s rounds.jsonl and the number of a torn last line left out (None where there is
    none): a last line without its newline (a crash or a full disk mid-write, or a run still writing) is left out,
    as a resume drops it.  A missing or unreadable file (a directory, no permission), and any other line that is
    no record (not JSON, not UTF-8, not an object, or without `RECORD_KEYS`), is a `RoundsUnreadable` naming the
    file, the line and the fix."""
    run_dir = Path(run_dir)
    path = run_dir / ROUNDS_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise RoundsUnreadable(f"{path} is missing; {_fix(run_dir, 'not a run directory, or its log was moved')}",
                               f"no {ROUNDS_FILE}") from None
    except OSError as err:  # a directory, no permission, an I/O error
        why = (err.strerror or str(err)).lower()
        raise RoundsUnreadable(f"{path} cannot be read ({why}); {_fix(run_dir)}",
                               f"{ROUNDS_FILE} unreadable ({why})") from None
    lines = data.split(b"\n")
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line.decode())
            if not isinstance(record, dict):
                raise ValueError(f"a JSON {type(record).__name__}, not an object")
            missing = [key for key in RECORD_KEYS if key not in record]
            if missing:
                raise ValueError(f"no {', '.join(repr(k) for k in missing)}")
        except ValueError as exc:  # not JSON, not UTF-8 (both ValueErrors), or not a record
            if number == len(lines):  # the last line, unterminated: the write a crash cut short
                return records, number
            raise RoundsUnreadable(f"{path}, line {number}, is not a record ({exc}); {_fix(run_dir)}",
                                   f"{ROUNDS_FILE} damaged (line {number})", records) from None
        records.append(read_safe(record))
    return records, None


def run_folder(run_dir):
    """``run_dir`` as `read_rounds` and `read_summary` take it, a folder's path; else one line (None or a number was
    pathlib's TypeError)."""
    if not isinstance(run_dir, (str, os.PathLike)):
        raise ConfigError(f"run_dir must be a run folder's path (a str or a pathlib.Path: its out_dir), got "
                          f"{run_dir!r}")
    return run_dir


def read_rounds(run_dir: str | Path) -> list[dict]:
    """The records of ``run_dir``'s rounds.jsonl (`scan_rounds`: a torn last line is left out; a missing or
    unreadable file, or any other line that is no record, is a `DataError` naming it and the fix)."""
    return scan_rounds(run_folder(run_dir))[0]


def read_config(run_dir: str | Path) -> dict:
    """The run's config.yaml ({} where it has none, or it is empty), by PyYAML's safe loader in C where PyYAML has
    libyaml: the same documents, several times faster (a figure or a sweep's index reads every run's)."""
    import yaml

    path = Path(run_folder(run_dir)) / "config.yaml"
    if not path.exists():
        return {}
    return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}


def read_summary(run_dir: str | Path) -> dict:
    """The run's summary.json; a `DataError` naming the file where it is not a JSON object (a write cut short)."""
    path = Path(run_folder(run_dir)) / SUMMARY_FILE
    try:
        loaded = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{path} is damaged ({exc}); rerun the job, or remove its folder") from None
    except OSError as err:  # missing, a directory, no permission
        what = "is missing" if isinstance(err, FileNotFoundError) else \
            f"cannot be read ({(err.strerror or str(err)).lower()})"
        raise DataError(f"{path} {what} (a run writes it when it ends); rerun the job, or remove its folder") from None
    if not isinstance(loaded, dict):
        raise DataError(f"{path} is damaged (a JSON {type(loaded).__name__}, not an object); rerun the job, or "
                        "remove its folder")
    return read_safe(loaded)


def find_runs(root: str | Path) -> list[Path]:
    """Every run directory (one holding a summary.json) under ``root``, sorted."""
    return sorted(p.parent for p in Path(root).rglob(SUMMARY_FILE))


def in_target_units(record: dict, units: tuple[float, float] | None, *, back: bool = False) -> dict:
    """A record of a problem whose target was standardized (y = ȳ + s y', ``units`` = (ȳ, s):
    `dane.problems.linear_models`) in the target's units: objective and suboptimality times s², grad_norm times s
    (``back``: a logged record in the standardized units again, divided by them); ``units`` None: the record itself."""
    if units is None:
        return record
    scale = units[1]
    factors = {"objective": scale ** 2, "suboptimality": scale ** 2, "grad_norm": scale}
    if back:
        return {k: v / factors[k] if k in factors else v for k, v in record.items()}
    return {k: v * factors[k] if k in factors else v for k, v in record.items()}
