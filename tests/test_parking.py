"""Sampled rounds in the thread simulator run their participants only (`dane.comm.roster`, `dane.loop.parking`).

- SCAFFOLD with s of m clients a round gives the same records (time aside), summary entries and final iterate, bit
  for bit, whether the clients outside S_t sleep or run the round as before, at the round cap and when the
  tolerance stops the run with clients asleep;
- a round computes s clients' local steps (K gradients each, counted by hand) and only S_t and rank 0 enter its
  allreduce; the final evaluation takes all m;
- a parked client has no thread: at m = 120 and s = 3 a round's start finds at most s + 1 worker threads alive;
- `parks` says no where a worker's own progress is needed every round (compression, checkpoints, faults).
"""
from __future__ import annotations

import threading
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import dane
from dane.baselines import feddane, fedred, scaffold, sdane
from dane.comm import threads
from dane.loop import kinds, parking
from dane.sampling import ClientSampler

M, S, K, SEED = 8, 3, 3, 5


def ridge():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((240, 6))
    return dane.problems.Ridge(X, X @ rng.standard_normal(6) + 0.1 * rng.standard_normal(240), lam=1e-2)


def fit(monkeypatch, parked: bool, algorithm: str = "scaffold", **keys):
    monkeypatch.setattr(kinds, "parks", parking.parks if parked else lambda spec: False)
    if algorithm == "scaffold":
        keys = dict(local_steps=K, lr=0.05, **keys)
    return dane.fit(ridge(), algorithm, workers=M, seed=SEED, clients_per_round=S, **keys)


def untimed(record: dict) -> dict:
    return {key: value for key, value in record.items() if key != "time_s"}


@pytest.mark.parametrize("keys", [
    dict(rounds=7), dict(rounds=40, tol=0.05), dict(rounds=5, sampling="size"), dict(algorithm="fedprox", rounds=5),
    dict(algorithm="fedprox", local_solver="steps", rounds=5), dict(algorithm="feddane", rounds=5),
    dict(algorithm="sdane", rounds=5), dict(algorithm="sdane", accelerated=True, rounds=5)],
    ids=["cap", "tol", "size", "fedprox", "fedavg", "feddane", "sdane", "acc-sdane"])
def test_parked_clients_change_no_record(monkeypatch, keys):
    asleep, awake = fit(monkeypatch, True, **keys), fit(monkeypatch, False, **keys)
    assert [untimed(r) for r in asleep.records] == [untimed(r) for r in awake.records]
    assert torch.equal(asleep.w, awake.w)
    ignored = {"time_s", "wall_time_s", "simulated_time_s", "timeline", "setup_s", "simulated_compute_s",
               "simulated_comm_s"}
    assert {k: v for k, v in asleep.summary.items() if k not in ignored} == \
        {k: v for k, v in awake.summary.items() if k not in ignored}
    if "tol" in keys:  # stopped before the cap, with clients asleep: they end from rank 0's result
        assert asleep.status == "converged" and asleep.records[-1]["round"] < keys["rounds"]


def test_a_round_computes_its_clients_only(monkeypatch):
    rounds = 6
    grads, arrivals, lock = Counter(), Counter(), threading.Lock()
    local_grad, collective = scaffold.Scaffold.local_grad, threads.ThreadCommunicator._collective

    def counted_grad(self, w):
        with lock:
            grads[self.comm.rank] += 1
        return local_grad(self, w)

    def counted_collective(self, *args, **kwargs):
        with lock:
            arrivals[self.rank] += 1
        return collective(self, *args, **kwargs)

    monkeypatch.setattr(scaffold.Scaffold, "local_grad", counted_grad)
    monkeypatch.setattr(threads.ThreadCommunicator, "_collective", counted_collective)
    result = fit(monkeypatch, True, rounds=rounds)
    sampler = ClientSampler(SimpleNamespace(size=M, rank=0), S, seed=SEED)
    draws = [sampler.draw().tolist() for _ in range(rounds)]
    assert sum(grads.values()) == rounds * S * K  # K local gradients per client of S_t, none elsewhere
    assert grads == Counter({rank: K * sum(rank in d for d in draws) for rank in range(M) if any(rank in d for d in draws)})
    # one allreduce a round among S_t and rank 0, then the final evaluation among all m
    assert arrivals == Counter({rank: sum(rank in d or rank == 0 for d in draws) + 1 for rank in range(M)})
    assert [r["clients"] for r in result.records[:-1]] == [S] * rounds


def test_a_round_runs_its_clients_threads_only(monkeypatch):
    """At m = 120 workers and s = 3 a round, a parked client has no thread: at each round's start (rounds 2 to 7)
    the live threads are the run's main thread, rank 0 and the last round's clients (at most s + 1 workers)."""
    m, rounds, live = 120, 8, {}
    before = threading.active_count()
    round_start = parking.Parking.round_start

    def counted(self, t, final, state):
        if self.comm.rank == 0 and 2 <= t < rounds:
            for _ in range(500):  # a thread that parked may still be unwinding: wait for it to end
                if threading.active_count() - before <= S + 1:
                    break
                threading.Event().wait(0.01)
            live[t] = threading.active_count() - before
        return round_start(self, t, final, state)

    monkeypatch.setattr(parking.Parking, "round_start", counted)
    monkeypatch.setattr(kinds, "parks", parking.parks)
    monkeypatch.setattr(kinds, "batched_path", lambda spec: (False, None))  # one thread per worker
    rng = np.random.default_rng(1)
    X = rng.standard_normal((1200, 4))
    problem = dane.problems.Ridge(X, X @ np.ones(4), lam=1e-2)
    result = dane.fit(problem, "scaffold", workers=m, seed=SEED, clients_per_round=S, rounds=rounds,
                      local_steps=K, lr=0.05)
    assert [r["clients"] for r in result.records[:-1]] == [S] * rounds
    assert sorted(live) == list(range(2, rounds)) and max(live.values()) <= S + 1, live


def test_runs_that_need_every_worker_each_round_do_not_park():
    spec = SimpleNamespace(
        algorithm=SimpleNamespace(algorithm=scaffold.Scaffold, clients_per_round=S),
        comm=SimpleNamespace(workers=M, compress=None),
        control=SimpleNamespace(checkpoint_every=0, resume=None, faults=()))
    assert parking.parks(spec)
    assert not parking.parks(replace_ns(spec, "comm", compress="topk"))
    assert not parking.parks(replace_ns(spec, "control", checkpoint_every=2))
    assert not parking.parks(replace_ns(spec, "control", faults=((2, 1),)))
    assert not parking.parks(replace_ns(spec, "algorithm", clients_per_round=M))
    assert not parking.parks(replace_ns(spec, "algorithm", clients_per_round=None))
    assert not parking.parks(replace_ns(spec, "algorithm", algorithm=fedred.FedRed))
    feddane_, sdane_ = feddane.FedDANE, sdane.SDANE
    assert parking.parks(replace_ns(spec, "algorithm", algorithm=feddane_, resample=False))
    assert not parking.parks(replace_ns(spec, "algorithm", algorithm=feddane_, resample=True))  # two draws a round
    assert parking.parks(replace_ns(spec, "algorithm", algorithm=sdane_, adaptive=False))
    assert not parking.parks(replace_ns(spec, "algorithm", algorithm=sdane_, adaptive=True))  # λ's test: every client


def replace_ns(spec: SimpleNamespace, part: str, **keys) -> SimpleNamespace:
    return SimpleNamespace(**{**vars(spec), part: SimpleNamespace(**{**vars(getattr(spec, part)), **keys})})
