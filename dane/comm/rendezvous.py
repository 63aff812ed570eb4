"""The simulator's threads themselves: a barrier for thousands of them, their stack, a Ctrl-C while they start.

A collective is one pass through a `Rendezvous` (waiters released one by one: O(m) wake-ups, where
`threading.Barrier` wakes all m at once); worker threads get `WORKER_STACK_BYTES` of stack, and `thread_limit` is
the line for a simulator whose threads could not all start; `ctrl_c_held` holds a Ctrl-C back while they start, and
`Interrupted` is what a worker raises at its next collective once its group is stopped (`dane.comm.threads`).
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Callable

from ..errors import ConfigError



#: stack address space per simulated worker thread (touched pages only count as memory); the default is
#: the process's stack limit (8 MiB here), 80 GB of address space at 10,000 workers
WORKER_STACK_BYTES = 4 * 2 ** 20


def thread_limit(workers: int, started: int, exc: RuntimeError) -> ConfigError:
    """The line for a simulator whose worker threads could not all start, naming the limit and the fix."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    limit = "" if soft == resource.RLIM_INFINITY else f" (ulimit -v is {soft // 1024} KiB)"
    total = workers * WORKER_STACK_BYTES
    total = f"{total / 2 ** 30:.1f} GiB" if total >= 2 ** 30 else f"{total >> 20} MiB"
    return ConfigError(f"workers={workers}: the simulator started {started} worker threads, then no more ({exc}): "
                       f"each reserves {WORKER_STACK_BYTES >> 20} MiB of stack, {total} of address space in all, "
                       f"beyond the process's limit on address space{limit} or threads (ulimit -u); use fewer "
                       "workers, or raise ulimit -v")


class Rendezvous:
    """A reusable barrier for many threads; the last to arrive runs ``action`` before anyone leaves.

    The waiters of a generation block on that generation's gate, a lock held closed; the
    last arrival runs the action and releases the gate, and each waiter, once through,
    releases it for the next: one wake-up per waiter.  `abort` breaks the rendezvous for
    good: the current gate opens and every wait, now or later, raises
    `threading.BrokenBarrierError`, as `threading.Barrier.abort` does.  Waiting threads
    must call `wait` in the same order of generations (the m workers of a collective).
    """

    def __init__(self, parties: int, action: Callable[[], None] | None = None):
        self.parties = parties
        self._action = action
        self._mutex = threading.Lock()
        self._arrived = 0
        self._gate = _closed_gate()
        self.broken = False

    def wait(self) -> None:
        with self._mutex:
            if self.broken:
                raise threading.BrokenBarrierError
            gate = self._gate
            self._arrived += 1
            last = self._arrived == self.parties
            if last:
                self._arrived = 0
        if last:
            try:
                if self._action is not None:
                    self._action()
            except BaseException:
                self.abort()
                raise
            with self._mutex:
                self._gate = _closed_gate()  # the next generation's; nobody can arrive there before `gate` opens
        else:
            gate.acquire()  # blocks until the previous thread through hands the gate on
        _open(gate)
        if self.broken:
            raise threading.BrokenBarrierError

    def abort(self) -> None:
        with self._mutex:
            self.broken = True
            _open(self._gate)


def _closed_gate() -> threading.Lock:
    gate = threading.Lock()
    gate.acquire()
    return gate


def _open(gate: threading.Lock) -> None:
    """Release ``gate``; an `abort` may have released it first, which is just as open."""
    try:
        gate.release()
    except RuntimeError:
        pass


@contextmanager
def ctrl_c_held():
    """Hold a Ctrl-C (SIGINT) back until the block ends, then deliver it to the main thread.

    A `KeyboardInterrupt` raised inside ``Thread.start`` (which waits for the new thread to
    come up) leaves the caller not knowing which workers run.  Held back, it is raised just
    after the block, where every worker has started and can be stopped and waited for.
    Only the main thread can set a signal handler; elsewhere the block runs as it is.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        yield  # None: a handler set outside Python, which could not be put back
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            signal.raise_signal(signal.SIGINT)  # to the handler that was there before


class Interrupted(BaseException):
    """Raised in a simulated worker at its next collective once the group is stopped (a Ctrl-C).

    A `BaseException`, like `KeyboardInterrupt`, so that no ``except Exception`` in
    algorithm code swallows it.
    """

