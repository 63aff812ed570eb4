"""A launcher's SIGTERM after a peer exited, turned into the package's one-line lost-peer error.

When one process of a job exits, horovodrun and torchrun stop the others with SIGTERM
(torchrun within its ``--monitor-interval``, 0.1 s by default, and SIGKILL 30 s later).
Python's default for SIGTERM ends a process at once and silently: a survivor never says
why it stops, and the user reads only the launcher's report.  `install` makes a SIGTERM
raise `LauncherTerminated` in the main thread instead; the run's lost-peer path
(`dane.loop.faults.worker_lost`) turns it into the one line and a non-zero exit, and what the
run wrote stays (a record is one write, a file an ``os.replace``).  It is a
`BaseException`, as `KeyboardInterrupt` is (and `dane.comm.threads.Interrupted` for the
same reason): the signal lands wherever the main thread is, and an ``except Exception``
there (a damaged cache file read as "recompute", a tracker's failure read as "drop the
tracker") would swallow it, and the launcher's SIGKILL 30 s later would end the process
with no line at all.  Once a
process is reporting a lost peer, `stand_down` makes it ignore SIGTERM, so that a later
one cannot cut the report short (nor end the process in Python's own shutdown, which puts
back the default action of a signal with a Python handler, but not of an ignored one).

Under torchrun the workers of a node are the children of its agent: `install` notes each
local peer's pid and rank (from ``/proc``, once the process group is up, so every peer has
started), and `exited_peers` names those that have exited since.  torchrun reaps the
failed worker before it SIGTERMs the others, so a survivor that handles the signal at once
names exactly that one; one that handles it late (held in a long native call) may also
name a survivor that was quicker to exit.
"""
from __future__ import annotations

import os
import signal
import threading

#: torchrun sets this in every worker's environment
TORCHRUN_ENV = "TORCHELASTIC_RUN_ID"


class LauncherTerminated(BaseException):
    """The launcher stopped this worker (SIGTERM) because another process of the job exited.

    Not an `Exception`: no ``except Exception`` on the way may swallow it (the module's docstring).
    """

    def __init__(self, launcher: str, lost: list[int]):
        self.launcher, self.lost = launcher, lost
        after = (f"after rank {lost[0]} exited" if len(lost) == 1 else
                 f"after ranks {', '.join(map(str, lost))} exited" if lost else
                 "as another process exited or the job was stopped (the launcher's log says which)")
        super().__init__(f"{launcher} terminated this worker (SIGTERM) {after}")


class _State:
    launcher: str | None = None  # set while a handler is installed
    peers: dict[int, int] = {}  # local peer pid -> rank (torchrun)


def under_torchrun(env=os.environ) -> bool:
    return TORCHRUN_ENV in env


def install(launcher: str) -> None:
    """From now on a SIGTERM raises `LauncherTerminated` naming ``launcher`` (main thread only; elsewhere a no-op).

    Call it once the process group is up: under torchrun it notes the local peers then.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    _State.launcher = launcher
    _State.peers = local_peers() if launcher == "torchrun" else {}
    signal.signal(signal.SIGTERM, _terminated)


def stand_down() -> None:
    """This process is reporting a lost peer: where `install`'s handler is set, SIGTERM is ignored from now on
    (the line goes out, then the exit)."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is _terminated:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def exited_peers() -> list[int]:
    """The ranks of this node's peers (noted by `install` under torchrun) that have exited since; [] if none known."""
    return sorted(rank for pid, rank in _State.peers.items() if not running(pid))


def _terminated(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one exception: its report must not be cut short by another
    raise LauncherTerminated(_State.launcher or "the launcher", exited_peers())


def local_peers() -> dict[int, int]:
    """``{pid: rank}`` of the other processes this process's parent (torchrun's agent) started; {} if unreadable."""
    agent, me, peers = os.getppid(), os.getpid(), {}
    try:
        entries = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return {}
    for pid in entries:
        if pid == me:
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) != agent:  # field 4, after the command's parentheses
                    continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                rank = next(int(v[5:]) for v in f.read().split(b"\0") if v.startswith(b"RANK="))
        except (OSError, ValueError, IndexError, StopIteration):
            continue
        peers[pid] = rank
    return peers


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not gone, not a zombie waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False
