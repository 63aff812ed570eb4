"""HorovodCommunicator's wait for a collective: Horovod's own loop (poll, then sched_yield), which a launcher's
SIGTERM still interrupts; its mean, the simulator's; and the machine record every benchmark JSON carries (kernel,
CPU model, numpy, scipy and numpy's BLAS and LAPACK)."""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import scipy
import torch

from dane.comm import ThreadGroup, launcher_signals
from dane.comm.horovod import HorovodCommunicator
from dane.synthetic.bench_file import machine


class FakeHorovod:
    """``poll`` is False ``pending`` times, then True (never, with pending=None); ``synchronize`` returns the result."""

    def __init__(self, pending: int | None):
        self.pending, self.polls, self.synchronized = pending, 0, []

    def poll(self, handle) -> bool:
        self.polls += 1
        return self.pending is not None and self.polls > self.pending

    def synchronize(self, handle):
        self.synchronized.append(handle)
        return f"result of {handle}"


def communicator(hvd: FakeHorovod) -> HorovodCommunicator:
    comm = HorovodCommunicator.__new__(HorovodCommunicator)  # no hvd.init: only the wait is under test
    comm._hvd = hvd
    return comm


def test_the_wait_yields_the_core_between_polls_as_synchronize_does_and_returns_synchronizes_result(monkeypatch):
    """One ``sched_yield`` per unfinished poll (Horovod's C++ loop, ``std::this_thread::yield``), no sleep: a
    ``time.sleep(0)`` is a timer wake-up, not a yield (the module's docstring says what it cost)."""
    yields, sleeps = [], []
    monkeypatch.setattr(os, "sched_yield", lambda: yields.append(1))
    monkeypatch.setattr(time, "sleep", lambda s: sleeps.append(s))
    hvd = FakeHorovod(pending=5)
    assert communicator(hvd)._wait(7) == "result of 7"
    assert hvd.polls == 6 and len(yields) == 5 and sleeps == [] and hvd.synchronized == [7]


def test_a_sigterm_while_waiting_for_a_collective_that_never_completes_raises_launcher_terminated():
    """A collective posted after a peer died is never completed: the launcher's SIGTERM still reaches the handler
    of `launcher_signals.install`, which raises `LauncherTerminated` out of the wait (the lost-peer line's path)."""
    previous = signal.getsignal(signal.SIGTERM)
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM))
    try:
        launcher_signals.install("horovodrun")
        hvd = FakeHorovod(pending=None)
        start = time.perf_counter()
        timer.start()
        with pytest.raises(launcher_signals.LauncherTerminated, match="^horovodrun terminated this worker"):
            communicator(hvd)._wait(3)
        assert time.perf_counter() - start < 10 and hvd.polls > 1 and hvd.synchronized == []
    finally:
        timer.cancel()
        signal.signal(signal.SIGTERM, previous)


class SummingHorovod(FakeHorovod):
    """Rank 0 of ``len(messages)`` ranks, each sending its list of ``messages``: a grouped allreduce returns the sum,
    or under Average, as Horovod's postscale does, the sum times fl(1/m)."""

    Sum, Average = "sum", "average"

    def __init__(self, messages: list[list[torch.Tensor]]):
        super().__init__(pending=0)
        self.messages = messages

    def grouped_allreduce_async(self, tensors, op, name):
        totals = [sum(column[1:], column[0]) for column in zip(tensors, *self.messages[1:])]
        return [total * (1 / len(self.messages)) for total in totals] if op == self.Average else totals

    def synchronize(self, handle):
        return handle


def test_horovods_mean_is_the_simulators_bit_for_bit_at_three_workers():
    """The sum divided by m, as torch.distributed's and the simulator's: Horovod's Average multiplies by fl(1/3),
    and 25 * fl(1/3) = 8.333333333333332 is not 25 / 3.  One rank's value in each entry, so that the three add it
    alike whatever their order."""
    X = torch.tensor([[25.0, 0, 0, 1 / 3], [0, 7.0, 0, 0], [0, 0, 2016911.6666666667, 0]], dtype=torch.float64)
    simulated = ThreadGroup(3).run(lambda comm: comm.allreduce_mean([X[comm.rank]])[0])[0]
    comm = communicator(SummingHorovod([[row] for row in X]))
    comm.size = 3
    (mean,) = comm._allreduce_mean([X[0].clone()])
    assert torch.equal(mean, simulated) and torch.equal(mean, X.sum(0) / 3)
    assert mean[0] == 25 / 3 != 25 * (1 / 3)


def test_every_benchmark_records_the_kernel_and_the_cpu_model():
    record = machine()
    assert record["kernel"] == os.uname().release
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                 if line.startswith("model name")]
        assert not names or record["cpu"] == names[0]
    assert len(record["load_avg"]) == 3


def test_every_benchmark_records_numpy_scipy_and_the_blas_and_lapack_numpy_was_built_with():
    """An SVD's singular-vector signs are LAPACK's choice (FedNL-Public's FedNL-CR step depends on them): the record
    names the build, as numpy's own config does."""
    record = machine()
    built = np.show_config(mode="dicts")["Build Dependencies"]
    assert (record["numpy"], record["scipy"]) == (np.__version__, scipy.__version__)
    assert {key: record[key] for key in ("blas", "lapack")} == \
        {key: {"name": built[key]["name"], "version": built[key]["version"]} for key in ("blas", "lapack")}
