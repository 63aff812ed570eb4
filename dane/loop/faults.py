"""Losing a worker, on purpose or not, and stopping a simulated run by Ctrl-C.

``sim.fail_at`` loses a simulated worker at a given round (`SimulatedFault`); the
test-only `TEST_KILL_ENV` makes a real worker SIGKILL itself there; a Ctrl-C (or a SIGTERM:
`sigterm_as_ctrl_c`) stops every simulated worker at its next collective (`RunInterrupted`).
Each planned fault fires once per run directory, so a run restarted from its checkpoint gets past it.  A worker
that really is lost leaves its peers a one-line `WorkerLost` (`worker_lost`) instead of
a backend's traceback.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading

from ..comm.launcher_signals import LauncherTerminated, exited_peers, stand_down
from ..errors import WorkerLost

#: test-only fault hook: rank 1 (or rank `TEST_KILL_RANK_ENV`) kills itself (SIGKILL) when it reaches this round,
#: once per run directory
TEST_KILL_ENV = "DANE_TEST_KILL_AT_ROUND"
TEST_KILL_RANK_ENV = "DANE_TEST_KILL_RANK"


class RunInterrupted(SystemExit, KeyboardInterrupt):
    """A simulated run stopped by Ctrl-C (or SIGTERM: `sigterm_as_ctrl_c`) after writing its summary
    (``status: interrupted``).

    A `KeyboardInterrupt` to a caller that catches one, and a `SystemExit` with status 130
    (the shell's code for Ctrl-C; 143 for SIGTERM) when nothing does, so the program ends without a traceback.
    """

    def __init__(self, message: str, code: int = 130):
        super().__init__(code)
        self.message = message

    def __str__(self) -> str:
        return self.message


class _Signal:
    taken: int | None = None  # the SIGTERM `sigterm_as_ctrl_c` took since the run started, else None


@contextlib.contextmanager
def sigterm_as_ctrl_c():
    """In one process (the simulator, a run without workers=) a SIGTERM stops the run as a Ctrl-C does: a scheduler's
    time limit (Slurm's, say, SIGKILL following after a grace period) or a ``kill`` gets the interrupted summary, the
    records kept and one line, where Python's default ended the process silently.  The signal goes to whatever takes
    a Ctrl-C at that moment (`dane.comm.rendezvous.ctrl_c_held`, `dane.comm.batched.ctrl_c_stops`, Python's
    KeyboardInterrupt), and `interrupted_by` names it.  Only the main thread can set a signal handler; elsewhere,
    and where SIGTERM is ignored or its handler was set outside Python, the block runs as it is."""
    previous = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread() or previous in (None, signal.SIG_IGN):
        yield
        return

    def as_ctrl_c(signum, frame):
        _Signal.taken = signum
        ctrl_c = signal.getsignal(signal.SIGINT)
        (ctrl_c if callable(ctrl_c) else signal.default_int_handler)(signal.SIGINT, frame)

    _Signal.taken = None
    signal.signal(signal.SIGTERM, as_ctrl_c)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        _Signal.taken = None


def interrupted_by() -> tuple[str, int]:
    """What stopped this process's run, as its summary's ``stopped_by`` says it, and the exit status it ends with:
    ("interrupted", 130) for a Ctrl-C, ("SIGTERM", 143) for a SIGTERM (`sigterm_as_ctrl_c`)."""
    if _Signal.taken is None:
        return "interrupted", 130
    return signal.Signals(_Signal.taken).name, 128 + _Signal.taken


class SimulatedFault(RuntimeError):
    """A simulated worker lost on purpose (``sim.fail_at``): the run ends as a crashed job would."""


def inject_faults(faults: tuple[tuple[int, int], ...], rank: int | range | tuple[int, ...], round_: int,
                  out_dir: str | None, checkpoint_every: int = 0) -> None:
    """``sim.fail_at`` (and the test-only `TEST_KILL_ENV`): lose this worker at ``round_``, once per run directory
    (``rank``: the worker, or the ranks this process holds: all m on the simulator's batched path, where losing one
    ends the run as losing its thread does on the per-worker path).

    A marker in the run's checkpoint folder remembers a fault that fired, so the restarted
    run (``resume=auto``, same command) gets past it, as a restarted job on healthy machines would; a run without
    ``checkpoint_every`` has nothing to resume from, so its fault leaves no marker and its line says so.
    """
    kill_at = os.environ.get(TEST_KILL_ENV)
    if not faults and not kill_at:  # the common case, every round on every worker
        return
    from .checkpoint import CHECKPOINT_DIR  # torch, imported at use: the entry point imports this module before it

    kill_rank = int(os.environ.get(TEST_KILL_RANK_ENV, 1))
    planned = [(r, w, "fault") for r, w in faults] + ([(int(kill_at), kill_rank, "kill")] if kill_at else [])
    ranks = (rank,) if isinstance(rank, int) else rank
    for r, w, kind in planned:
        if r != round_ or w not in ranks:
            continue
        resumable = out_dir is not None and (checkpoint_every > 0 or kind == "kill")
        marker = os.path.join(out_dir, CHECKPOINT_DIR, f"{kind}_round{r}_worker{w}") if resumable else None
        if marker is not None:
            if os.path.exists(marker):
                continue
            os.makedirs(os.path.dirname(marker), exist_ok=True)
            open(marker, "w").close()
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if resumable:
            then = "the last committed checkpoint stays: rerun with resume=auto to continue"
        else:
            kept = f"the records before it stay in {out_dir}; " if out_dir else ""
            then = (f"{kept}without checkpoint_every there is no checkpoint to resume from (checkpoint_every=K "
                    "writes one every K rounds)")
        raise SimulatedFault(f"simulated worker {w} was lost at round {round_} (sim.fail_at); {then}")


#: what the backends say when a peer's connection goes: gloo (torch.distributed, comm=ps) and Horovod
PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Horovod has been shut down")


def worker_lost(exc: BaseException, who: str, out_dir: str | None, checkpoint_every: int,
                name=lambda rank: f"rank {rank}") -> WorkerLost | None:
    """The one-line `WorkerLost` for ``exc`` if it says that a peer of ``who`` ("worker 1") went away, else None.

    ``exc`` is a backend's broken connection or the launcher's SIGTERM after a peer exited
    (`dane.comm.launcher_signals.LauncherTerminated`).  From here on this process only
    reports: a launcher's SIGTERM no longer interrupts it (`stand_down`).  The lost process
    is named (``name(rank)``) where this node's torchrun peers show which one exited.
    """
    terminated = isinstance(exc, LauncherTerminated)
    if not terminated and (not isinstance(exc, RuntimeError) or not any(text in str(exc) for text in PEER_LOST)):
        return None
    stand_down()
    lost = exc.lost if terminated else exited_peers()
    gone = " and ".join(name(rank) for rank in lost)
    if terminated:  # no peer known to have exited: the job itself may have been stopped (Ctrl-C, scancel)
        why = f"{exc.launcher} terminated it with SIGTERM " + (f"after {gone} exited" if lost else
                                                            "as another process exited or the job was stopped: "
                                                            "the launcher's log says which")
    else:
        why = f"{gone} exited" if lost else "a worker crashed or was killed: the launcher's log names it"
    kept = f"the rounds logged so far are in {out_dir}" if out_dir else "rank 0's run directory keeps the rounds logged so far"
    again = ("rerun the same command with resume=auto to continue from the last checkpoint" if checkpoint_every
             else "set checkpoint_every=K (and resume=auto) so that a rerun continues instead of starting over")
    left = torchrun_restarts_left()
    if left:  # torchrun stops the survivors and starts every worker again by itself
        again = (f"torchrun restarts the workers ({left} of --max-restarts left), which continue from the last "
                 "checkpoint where the command has resume=auto" if checkpoint_every else
                 f"torchrun restarts the workers ({left} of --max-restarts left), which start over: add "
                 "checkpoint_every=K resume=auto to the command to continue instead")
    return WorkerLost(f"{who} lost a peer mid-run ({why}); {kept}; {again}")


def torchrun_restarts_left(env=os.environ) -> int:
    """How often torchrun (``--max-restarts``) will still restart this job's workers; 0 elsewhere."""
    try:
        return max(int(env.get("TORCHELASTIC_MAX_RESTARTS", 0)) - int(env.get("TORCHELASTIC_RESTART_COUNT", 0)), 0)
    except ValueError:
        return 0
