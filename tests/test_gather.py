"""`Communicator.gather`: every worker's k values as the rows of an (m, k) tensor, in one collective.

Its definition is the grouped allreduce of a one-hot (m, k) block and the riding tensors (what a launched run sends,
`dane.comm.base`); the thread and batched simulators move each worker's k values alone.  Held here: the same numbers
bit for bit, the same bytes, calls and simulated clock as the one-hot allreduce, and a thread worker's message of k
values, not m x k (a measurement over 10,000 simulated workers otherwise held m² values)."""
from __future__ import annotations

import contextlib

import torch

from dane.comm import AlphaBeta, ThreadGroup
from dane.comm.base import Communicator
from dane.comm.batched import BatchedCommunicator, BatchedGroup
from dane.comm.rendezvous import Rendezvous

M, K = 7, 3
#: each worker's values, a ride, and values whose one-hot mean times m is not the value (v/m*m != v for m = 7)
VALUES = torch.tensor([[0.4528688488811142 + r, -(2.0 ** -(r + 3)), 1 / 3 + r] for r in range(M)], dtype=torch.float64)
RIDES = torch.randn(M, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
COST = AlphaBeta(alpha=1e-3, beta=1e6)


def one_hot(comm):
    """The definition, on any backend: `Communicator.gather` as the base class runs it."""
    return Communicator.gather(comm, VALUES[comm.rank], [RIDES[comm.rank]])


def gathered(comm):
    return comm.gather(VALUES[comm.rank], [RIDES[comm.rank]])


def run(how):
    """Each worker's (rows, means), bytes and calls under ``how``; the group's modelled communication time."""
    group = ThreadGroup(M, COST)
    out = group.run(lambda comm: (*how(comm), comm.bytes_sent, comm.calls))
    return out, group.comm_time


def test_the_thread_gather_is_the_one_hot_allreduce_bit_for_bit_and_counts_the_same():
    (defined, time_defined), (fast, time_fast) = run(one_hot), run(gathered)
    rows, means, bytes_sent, calls = defined[0]
    for worker in fast:
        assert torch.equal(worker[0], rows) and torch.equal(worker[1][0], means[0])
        assert worker[2:] == (bytes_sent, calls) == (2 * (M - 1) * 8 * (M * K + 2) // M, 1)
    assert time_fast == time_defined == COST.allreduce_time(8 * (M * K + 2), M)
    assert rows[0, 0] != VALUES[0, 0]  # the definition's v/m*m, not v itself (0.4528...: one that differs), kept so
    assert torch.allclose(rows, VALUES, rtol=1e-15, atol=0)
    assert torch.equal(means[0], RIDES.sum(0) / M)


def test_a_thread_worker_sends_its_k_values_not_an_m_by_k_block():
    group, sent = ThreadGroup(M), []
    reduce = group._reduce

    def spy():
        sent.append([[t.numel() for t in message] for message in group._inbox])
        reduce()

    group._barrier = Rendezvous(M, action=spy)
    group.run(gathered)
    assert sent == [[[K, 2]] * M]


def test_the_batched_gather_is_the_per_worker_gather():
    comm = BatchedCommunicator(BatchedGroup(M, COST))
    rows, means = comm.gather(VALUES, [RIDES])
    (threads, *_), _ = run(gathered)
    assert torch.equal(rows, threads[0]) and torch.equal(means[0], threads[1][0])
    assert (comm.bytes_sent, comm.calls) == (2 * (M - 1) * 8 * (M * K + 2) // M, 1)
    assert comm.group.comm_time == COST.allreduce_time(8 * (M * K + 2), M)


def test_a_ride_goes_in_the_next_allreduce_uncounted_and_comes_back_once():
    """`Communicator.ride_next` (a launched rank's local-work table, `dane.work.post`): the method's means, bytes,
    calls and clock are those without it; its mean comes back once, from the allreduce that carried it (not a
    broadcast); a ride no allreduce carried, or one a backend does not carry, gives None and rides no later call."""
    def worker(comm, ride: bool, carries: bool = True):
        comm.carries_rides = carries  # as the launched backends declare; the thread group is a real in-process one
        if ride:
            comm.ride_next([RIDES[comm.rank]])
        comm.broadcast([VALUES[0]])
        (mean,) = comm.allreduce_mean([VALUES[comm.rank]])
        ridden, again = comm.ridden(), comm.ridden()
        comm.ride_next([RIDES[comm.rank]])
        unsent = comm.ridden()  # taken back before any allreduce: it no longer rides
        comm.allreduce_mean([VALUES[comm.rank]])
        return mean, ridden, again, unsent, comm.ridden(), comm.bytes_sent, comm.calls

    def run_with(**how):
        group = ThreadGroup(M, COST)
        return group.run(lambda comm: worker(comm, **how)), group.comm_time

    (plain, time_plain), (ridden, time_ridden), (ignored, _) = (run_with(ride=False), run_with(ride=True),
                                                                 run_with(ride=True, carries=False))
    for without, worker_out, not_carried in zip(plain, ridden, ignored):
        assert torch.equal(worker_out[0], without[0]) and worker_out[5:] == without[5:]
        assert torch.equal(worker_out[1][0], RIDES.sum(0) / M) and worker_out[2:5] == (None, None, None)
        assert without[1] is None and not_carried[1] is None and torch.equal(not_carried[0], without[0])
    assert time_ridden == time_plain


def test_the_allreduce_timer_is_around_each_backend_allreduce_and_says_which_are_counted():
    """`Communicator.allreduce_timer`: entered before the backend's `_allreduce_mean` and left after it, once per
    allreduce, counted or not (a ride goes in its allreduce's one call); the means and counters are those without."""
    def worker(comm, timed: bool):
        events = []

        @contextlib.contextmanager
        def timer(counted):
            events.append(("enter", counted, comm.calls))
            yield
            events.append(("exit", counted, comm.calls))

        if timed:
            comm.allreduce_timer = timer
        comm.carries_rides = True
        comm.ride_next([RIDES[comm.rank]])
        (first,) = comm.allreduce_mean([VALUES[comm.rank]])
        (uncounted,) = comm.uncounted_allreduce_mean([VALUES[comm.rank]])
        comm.broadcast([VALUES[0]])  # not an allreduce
        (second,) = comm.allreduce_mean([VALUES[comm.rank]])
        return events, first, uncounted, second, comm.bytes_sent, comm.calls

    timed = ThreadGroup(M).run(lambda comm: worker(comm, True))
    plain = ThreadGroup(M).run(lambda comm: worker(comm, False))
    for with_timer, without in zip(timed, plain):
        assert with_timer[0] == [("enter", True, 1), ("exit", True, 1), ("enter", False, 1), ("exit", False, 1),
                                 ("enter", True, 3), ("exit", True, 3)]
        assert without[0] == []
        assert all(torch.equal(a, b) for a, b in zip(with_timer[1:4], without[1:4])) and with_timer[4:] == without[4:]
