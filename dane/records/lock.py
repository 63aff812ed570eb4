"""A folder's lock, ``<folder>/.lock`` (`take_lock`): one process writes into the folder at a time.  A run directory's
(`dane.records.results.RunWriter` takes it when it opens and releases it when it closes; `RUN_DIR` words its
refusals), and an embedded data store's while a push writes it (`dane.data.mongo_store.pushing`).  Readers beside a
writer (`flocked`): an ``flock`` of the folder itself, shared by each read, exclusive while the writer writes."""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from ..errors import ConfigError

LOCK_FILE = ".lock"

#: a lock with no owner in it (an older version's, or a file system without hard links that failed between the
#: create and the write) older than this is stale: a run writes its owner microseconds after the create
OWNERLESS_STALE_S = 60.0


@dataclass(frozen=True)
class Refusals:
    """How a lock's refusals name the folder it guards and its fix: templates of ``{folder}`` and ``{path}`` (the
    lock), and in ``held`` of ``{owner}`` (``<host> pid <pid>``)."""

    held: str        #: another live process holds the lock
    ownerless: str   #: a lock naming no owner, younger than `OWNERLESS_STALE_S`
    subject: str     #: the folder, as a line that it is not writable names it
    elsewhere: str   #: the fix where it is not writable: where else to write
    stuck: str       #: a stale lock that came back after it was removed, twice


RUN_DIR = Refusals(
    held="out_dir={folder} is in use by another run ({owner}); choose another out_dir, or wait for that run to end "
         "(remove {path} if no run uses the directory)",
    ownerless="out_dir={folder} is locked by {path}, which names no run; remove {path} if no run uses the directory",
    subject="out_dir={folder}",
    elsewhere="choose another out_dir",
    stuck="out_dir={folder}: could not take {path}; remove it if no run uses the directory")


def take_lock(run_dir: Path, refusals: Refusals = RUN_DIR) -> Path:
    """Take ``run_dir/.lock``, holding ``<host> <pid>``; one line naming the problem and the fix where it cannot
    (``refusals``: how the line names the folder; a run directory's by default).

    The owner is written to a temporary file first and hard-linked to ``.lock`` (``os.link`` fails if it
    exists), so a lock is never empty and a failed write (a full disk) leaves no lock behind.  A lock left
    by a dead process on this host, or one with no owner older than `OWNERLESS_STALE_S`, is taken over; a
    younger ownerless one is refused with the fix.  A file system without hard links gets an exclusive
    create and write, the lock removed if the write fails.
    """
    path = run_dir / LOCK_FILE
    me = f"{socket.gethostname()} {os.getpid()}"
    tmp = run_dir / f"{LOCK_FILE}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        tmp.write_text(me)
    except OSError as err:  # permission denied, a read-only or a full file system
        tmp.unlink(missing_ok=True)
        raise _not_writable(run_dir, err, refusals) from None
    try:
        for _ in range(2):
            try:
                _link_or_create(tmp, path, me)
                return path
            except FileExistsError:
                if _stale(path) and _removed(path):
                    continue
                raise ConfigError(_held(run_dir, path, refusals)) from None
            except OSError as err:
                raise _not_writable(run_dir, err, refusals) from None
    finally:
        tmp.unlink(missing_ok=True)
    raise ConfigError(refusals.stuck.format(folder=run_dir, path=path))


@contextlib.contextmanager
def flocked(folder: Path, *, exclusive: bool, busy: Callable[[], None]) -> Iterator[None]:
    """The block run holding ``flock`` of ``folder`` itself (its own open descriptor: no file of its own, so a reader
    needs no write access), shared or ``exclusive``: readers together, a writer alone.  Where another descriptor holds
    it the other way, ``busy()`` is called first (it raises to refuse instead of waiting), then it waits; a wait the
    file system fails is one line (`_wait_for`).  A folder that cannot be opened, or a file system without ``flock``,
    runs the block unheld (`take_lock` still keeps writers apart).  On NFS a folder's ``flock`` is held on this
    machine alone (Linux's NFS client has no directory locks and keeps them local): a process on another machine
    neither sees nor waits for it."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        fd = None
    try:
        if fd is not None:
            mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
            except BlockingIOError:
                busy()
                _wait_for(fd, mode, folder)
            except OSError:  # ENOLCK, EBADF: some network file systems
                pass
        yield
    finally:
        if fd is not None:
            os.close(fd)


def _wait_for(fd: int, mode: int, folder: Path) -> None:
    """The blocking ``flock`` after another process was found holding it; one line where the file system fails it
    (ENOLCK: some NFS mounts lend no lock to wait on): going on unheld would read or write beside that process."""
    try:
        fcntl.flock(fd, mode)
    except OSError as err:
        raise ConfigError(f"{folder} is locked by another process, and its file system cannot wait for the lock "
                          f"({(err.strerror or str(err)).lower()}, as on some NFS mounts); put the folder on a local "
                          "disk") from None


def lock_refusal(run_dir: str | Path, refusals: Refusals = RUN_DIR) -> str | None:
    """What `take_lock` would refuse ``run_dir`` with now because another process holds its lock (one not `_stale`),
    worded by ``refusals``, or None: a launched job's rank 0 asks before its ranks' first collective
    (`dane.loop.callbacks.refusal`), so that every rank stops with the line instead of the others reporting a lost
    peer when rank 0 is refused later; a run on an embedded store asks whether a push is writing it
    (`dane.data.mongo_store.push_refusal`)."""
    path = Path(run_dir) / LOCK_FILE
    if not path.exists() or _stale(path):
        return None
    return _held(Path(run_dir), path, refusals)


def _held(run_dir: Path, path: Path, refusals: Refusals) -> str:
    """The refusal of ``run_dir`` whose lock ``path`` another process holds."""
    owner = _owner(path)
    if owner is None:
        return refusals.ownerless.format(folder=run_dir, path=path)
    return refusals.held.format(folder=run_dir, path=path, owner=" pid ".join(owner))


def _not_writable(run_dir: Path, err: OSError, refusals: Refusals) -> ConfigError:
    fix = f"free space there or {refusals.elsewhere}" if err.errno in (errno.ENOSPC, errno.EDQUOT) else \
        refusals.elsewhere
    subject = refusals.subject.format(folder=run_dir)
    return ConfigError(f"{subject} is not writable ({(err.strerror or str(err)).lower()}); {fix}")


def _link_or_create(tmp: Path, path: Path, owner: str) -> None:
    """``path`` made, holding ``owner``, or FileExistsError: a hard link of ``tmp``, or where the file system has
    none, an exclusive create whose failed write removes it again."""
    try:
        os.link(tmp, path)
        return
    except FileExistsError:
        raise
    except OSError as err:
        if err.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.ENOSYS):
            raise
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(owner)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def _owner(path: Path) -> list[str] | None:
    """``[host, pid]`` from a lock; None where it names none (empty, unreadable, not ``<host> <pid>``)."""
    try:
        owner = path.read_text().split()
    except (OSError, UnicodeDecodeError):
        return None
    return owner if len(owner) == 2 and owner[1].isdigit() else None


def _removed(path: Path) -> bool:
    try:
        path.unlink(missing_ok=True)
    except OSError:  # not ours to remove (another user's lock in a shared folder): the line names the fix
        return False
    return True


def _stale(path: Path) -> bool:
    """A lock no run holds: its owner is a process of this host that is gone, or it names no owner and is old."""
    owner = _owner(path)
    if owner is not None:
        return owner[0] == socket.gethostname() and not _alive(int(owner[1]))
    try:
        return time.time() - path.stat().st_mtime > OWNERLESS_STALE_S
    except FileNotFoundError:
        return True  # released since: try again


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
