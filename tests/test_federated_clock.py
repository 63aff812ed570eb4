"""The simulator's modelled clock under client sampling counts the participants only (issue 33, item 2).

A collective that `dane.sampling.sampled_mean` gives to the sampled clients S is charged

    max_{i in S} compute_i + cost.allreduce_time(bytes, |S|)

and every other collective max over all m workers plus the ring over m.  Compute is made exact with a
meter that reads a fixed number of seconds per worker and phase, so the clock is asserted against the
closed form to round-off.
"""
from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from dane.baselines import ScaffoldConfig
from dane.comm import AlphaBeta, ThreadGroup
from dane.comm.roster import Roster
from dane.loop.runner import run
from dane.loop.stopping import StopRule
from dane.sampling import ClientSampler, nbytes, sampled_mean
from helpers import ridge_shards
from test_federated import SMALL

COMPUTE = (0.05, 0.01, 0.2, 0.03)  # seconds of compute per phase, worker by worker: worker 2 is the slowest
COST = AlphaBeta(alpha=1e-3, beta=1e6)


class FixedCompute:
    """A meter under which worker r computes exactly COMPUTE[r] seconds in every phase."""

    name = "fixed"

    def start(self) -> float:
        return 0.0

    def read(self, mark: float) -> float:
        return COMPUTE[int(threading.current_thread().name.split("-")[1])]

    def stop(self) -> None:
        pass


def test_a_sampled_allreduce_is_charged_to_its_participants():
    d = 25
    group = ThreadGroup(4, COST, meter=FixedCompute())

    def worker(comm):
        x = torch.full((d,), float(comm.rank), dtype=torch.float64)
        (sampled,), _ = sampled_mean(comm, torch.tensor([1, 3]), [x])      # S = {1, 3}
        (everyone,), _ = sampled_mean(comm, torch.arange(4), [x])          # S = all: the plain allreduce
        return sampled, everyone

    results = group.run(worker)
    torch.testing.assert_close(results[0][0], torch.full((d,), 2.0, dtype=torch.float64), rtol=0, atol=1e-15)
    n = d * 8
    sampled = max(COMPUTE[1], COMPUTE[3]) + 2 * 1 / 2 * n / COST.beta + 2 * 1 * COST.alpha   # ring over |S| = 2
    everyone = max(COMPUTE) + 2 * 3 / 4 * n / COST.beta + 2 * 3 * COST.alpha
    assert group.clock == pytest.approx(sampled + everyone, rel=1e-12)
    assert group.comm_time == pytest.approx(COST.allreduce_time(n, 2) + COST.allreduce_time(n, 4), rel=1e-12)


@pytest.mark.parametrize("parked", [False, True])
def test_scaffold_with_two_of_four_clients_is_timed_over_the_sampled_clients(parked):
    """A whole run: every round is one allreduce of S_t's (Δy, Δc) with the metrics riding, then the final
    evaluation is one allreduce over all four; the same clock when the clients outside S_t sleep through the round
    (`dane.comm.roster`)."""
    m, s, rounds, seed = 4, 2, 5, 3
    config = ScaffoldConfig(local_steps=3, lr=0.05, clients_per_round=s, seed=seed)
    problems = ridge_shards(m, SMALL)
    group = ThreadGroup(m, COST, meter=FixedCompute())
    group.roster = Roster(m, problems) if parked else None

    def worker(comm):
        algo = config.build(problems[comm.rank], comm)
        records, _ = run(algo, StopRule(rounds=rounds))
        return records, nbytes(algo.payload(algo.w))

    (records, payload), *_ = group.run(worker)
    sampler = ClientSampler(SimpleNamespace(size=m, rank=0), s, seed=seed)
    draws = [sampler.draw().tolist() for _ in range(rounds)]
    assert any(2 not in S for S in draws) and any(2 in S for S in draws)  # the slowest worker sits some rounds out
    round_bytes = 2 * SMALL.dim * 8 + payload  # Δy, Δc and the riding metrics
    expected = sum(max(COMPUTE[r] for r in S) + COST.allreduce_time(round_bytes, s) for S in draws)
    final_bytes = payload + SMALL.dim * 8  # the final evaluation (`Algorithm.evaluate`): metrics and the gradient
    expected += max(COMPUTE) + COST.allreduce_time(final_bytes, m)  # every worker
    assert [r["clients"] for r in records[:-1]] == [s] * rounds
    assert group.clock == pytest.approx(expected, rel=1e-12)
