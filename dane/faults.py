"""Losing a worker on purpose, and stopping a simulated run by Ctrl-C.

``sim.fail_at`` loses a simulated worker at a given round (`SimulatedFault`); the
test-only `TEST_KILL_ENV` makes a real worker SIGKILL itself there; a Ctrl-C stops every
simulated worker at its next collective (`RunInterrupted`).  Each planned fault fires
once per run directory, so a run restarted from its checkpoint gets past it.
"""
from __future__ import annotations

import os
import signal

from .checkpoint import CHECKPOINT_DIR

#: test-only fault hook: rank 1 (or rank `TEST_KILL_RANK_ENV`) kills itself (SIGKILL) when it reaches this round,
#: once per run directory
TEST_KILL_ENV = "DANE_TEST_KILL_AT_ROUND"
TEST_KILL_RANK_ENV = "DANE_TEST_KILL_RANK"


class RunInterrupted(SystemExit, KeyboardInterrupt):
    """A simulated run stopped by Ctrl-C after writing its summary (``status: interrupted``).

    A `KeyboardInterrupt` to a caller that catches one, and a `SystemExit` with status 130
    (the shell's code for Ctrl-C) when nothing does, so the program ends without a traceback.
    """

    def __init__(self, message: str):
        super().__init__(130)
        self.message = message

    def __str__(self) -> str:
        return self.message


class SimulatedFault(RuntimeError):
    """A simulated worker lost on purpose (``sim.fail_at``): the run ends as a crashed job would."""


def inject_faults(faults: tuple[tuple[int, int], ...], rank: int, round_: int, out_dir: str | None) -> None:
    """``sim.fail_at`` (and the test-only `TEST_KILL_ENV`): lose this worker at ``round_``, once per run directory.

    A marker in the run's checkpoint folder remembers a fault that fired, so the restarted
    run (``resume=auto``, same command) gets past it, as a restarted job on healthy machines would.
    """
    kill_at, kill_rank = os.environ.get(TEST_KILL_ENV), int(os.environ.get(TEST_KILL_RANK_ENV, 1))
    planned = [(r, w, "fault") for r, w in faults] + ([(int(kill_at), kill_rank, "kill")] if kill_at else [])
    for r, w, kind in planned:
        if (r, w) != (round_, rank):
            continue
        marker = os.path.join(out_dir, CHECKPOINT_DIR, f"{kind}_round{r}_worker{w}") if out_dir else None
        if marker is not None:
            if os.path.exists(marker):
                continue
            os.makedirs(os.path.dirname(marker), exist_ok=True)
            open(marker, "w").close()
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise SimulatedFault(f"simulated worker {rank} was lost at round {round_} (sim.fail_at); "
                             "the last committed checkpoint stays: rerun with resume=auto to continue")
