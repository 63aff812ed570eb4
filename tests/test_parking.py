"""Sampled rounds in the thread simulator run their participants only (`dane.comm.roster`, `dane.loop.parking`).

- SCAFFOLD with s of m clients a round gives the same records (time aside), summary entries and final iterate, bit
  for bit, whether the clients outside S_t sleep or run the round as before, at the round cap and when the
  tolerance stops the run with clients asleep;
- a round computes s clients' local steps (K gradients each, counted by hand) and only S_t and rank 0 enter its
  allreduce; so does the final evaluation, the last round's S_t and rank 0;
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
from dane.comm import threads, worker_threads
from dane.comm.roster import Roster
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


def many_clients(monkeypatch, m: int, *, rows: int, data_seed: int, rounds: int, **keys):
    """SCAFFOLD with S of ``m`` clients a round on a seeded ridge table of ``rows`` rows, one thread per worker, its
    clients outside S_t parked."""
    monkeypatch.setattr(kinds, "parks", parking.parks)
    monkeypatch.setattr(kinds, "batched_path", lambda spec: (False, None))  # one thread per worker
    rng = np.random.default_rng(data_seed)
    X = rng.standard_normal((rows, 4))
    problem = dane.problems.Ridge(X, X @ np.ones(4), lam=1e-2)
    return dane.fit(problem, "scaffold", workers=m, seed=SEED, clients_per_round=S, rounds=rounds,
                    **{"local_steps": K, "lr": 0.05, **keys})


def untimed(record: dict) -> dict:
    return {key: value for key, value in record.items() if key != "time_s"}


@pytest.mark.parametrize("keys", [
    dict(rounds=7), dict(rounds=40, tol=0.05), dict(algorithm="fedprox", rounds=5),
    dict(algorithm="fedavg", rounds=5), dict(algorithm="feddane", rounds=5),
    dict(algorithm="sdane", rounds=5), dict(algorithm="sdane", accelerated=True, rounds=5),
    dict(algorithm="fedred", rounds=5), dict(algorithm="fedred", control_variate=2, rounds=6),
    dict(algorithm="fedred", control_variate=2, averaging="random", rounds=6)],
    ids=["cap", "tol", "fedprox", "fedavg", "feddane", "sdane", "acc-sdane", "fedred", "fedred-type2",
         "fedred-type2-random"])
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
    # one allreduce a round among S_t and rank 0, then the final evaluation among the last round's (the others
    # filled in from their shards: no thread is started for it)
    assert arrivals == Counter({rank: sum(rank in d or rank == 0 for d in draws) + (rank in draws[-1] or rank == 0)
                                for rank in range(M)})
    assert [r["clients"] for r in result.records[:-1]] == [S] * rounds


def test_a_round_runs_its_clients_threads_only(monkeypatch):
    """At m = 120 workers and s = 3 a round, a parked client has no thread: at each round's start (rounds 2 to 7)
    the live threads are the run's main thread, rank 0 and the last round's clients (at most s + 1 workers)."""
    m, rounds, live = 120, 8, {}
    before = threading.active_count()
    round_start = parking.Parking.round_start

    def counted(self, state):
        t = state()["round"] if self.comm.rank == 0 else None
        if t is not None and 2 <= t < rounds:
            for _ in range(500):  # a thread that parked may still be unwinding: wait for it to end
                if threading.active_count() - before <= S + 1:
                    break
                threading.Event().wait(0.01)
            live[t] = threading.active_count() - before
        return round_start(self, state)

    monkeypatch.setattr(parking.Parking, "round_start", counted)
    result = many_clients(monkeypatch, m, rows=1200, data_seed=1, rounds=rounds)
    assert [r["clients"] for r in result.records[:-1]] == [S] * rounds
    assert sorted(live) == list(range(2, rounds)) and max(live.values()) <= S + 1, live


def test_runs_that_need_every_worker_each_round_do_not_park():
    spec = SimpleNamespace(
        algorithm=SimpleNamespace(algorithm=scaffold.Scaffold, clients_per_round=S),
        comm=SimpleNamespace(workers=M, compress=None),
        control=SimpleNamespace(checkpoint_every=0, resume=None, faults=(), similarity=False))
    assert parking.parks(spec)
    assert not parking.parks(replace_ns(spec, "comm", compress="topk"))
    assert not parking.parks(replace_ns(spec, "control", checkpoint_every=2))
    assert not parking.parks(replace_ns(spec, "control", faults=((2, 1),)))
    assert not parking.parks(replace_ns(spec, "control", similarity=True))  # every worker's Hessians at the end
    assert not parking.parks(replace_ns(spec, "algorithm", clients_per_round=M))
    assert not parking.parks(replace_ns(spec, "algorithm", clients_per_round=None))
    assert parking.parks(replace_ns(spec, "algorithm", algorithm=fedred.FedRed))  # its h_i kept by each client
    feddane_, sdane_ = feddane.FedDANE, sdane.SDANE
    assert parking.parks(replace_ns(spec, "algorithm", algorithm=feddane_, resample=False))
    assert not parking.parks(replace_ns(spec, "algorithm", algorithm=feddane_, resample=True))  # two draws a round
    assert parking.parks(replace_ns(spec, "algorithm", algorithm=sdane_, adaptive=False))
    assert not parking.parks(replace_ns(spec, "algorithm", algorithm=sdane_, adaptive=True))  # λ's test: every client


def replace_ns(spec: SimpleNamespace, part: str, **keys) -> SimpleNamespace:
    return SimpleNamespace(**{**vars(spec), part: SimpleNamespace(**{**vars(getattr(spec, part)), **keys})})


def test_after_the_rounds_a_parked_clients_part_is_filled_in(monkeypatch, tmp_path):
    """A network's test confusion matrix (one allreduce after the rounds) is the same, file for file, whether the
    clients outside the last round sleep through it (their counts filled in from their shards) or take part; no
    thread is started for a parked client once the rounds are over."""
    from helpers import composed

    from dane.experiments.config import run_spec
    from dane.loop.launch import execute

    overrides = ["problem=digits_mlp", "problem.model.hidden=[8]", "algorithm=fedavg", "algorithm.lr=0.05",
                 "algorithm.clients_per_round=2", "workers=6", "rounds=2", "sim.batched=false", "progress=none"]
    spec = run_spec(composed(*overrides))
    starts, files = Counter(), {}
    start = worker_threads.WorkerThreads.start_thread

    def counted_start(self, comm, body, fresh):
        starts["woken" if not fresh else "first"] += 1
        return start(self, comm, body, fresh)

    monkeypatch.setattr(worker_threads.WorkerThreads, "start_thread", counted_start)
    for parked in (True, False):
        monkeypatch.setattr(kinds, "parks", parking.parks if parked else lambda spec: False)
        starts.clear()
        execute(spec, str(tmp_path / str(parked)))
        files[parked] = (tmp_path / str(parked) / "confusion.json").read_text()
        if parked:
            woken = starts["woken"]
    assert files[True] == files[False] and '"matrix"' in files[True]
    draws = ClientSampler(SimpleNamespace(size=6, rank=0), 2, seed=0)
    drawn = [set(draws.draw().tolist()) for _ in range(2)]
    assert woken == len((drawn[1] - drawn[0]) - {0})  # round 1's new clients; none for the evaluation or the end


def test_a_collective_of_every_worker_charges_each_fill_as_its_compute():
    """In a collective of every worker (members None) each parked worker's message is filled in from its shard and
    its compute is the fill's, as the meter reads it; in a sampled round's collective the fill is not charged (the
    parked clients' metrics are not the method's work), and a message of the wrong shapes is refused."""

    class Scripted:  # each fill reads 0.25 s
        name = "scripted"

        def start(self):
            return 0.0

        def read(self, mark):
            return 0.25

        def stop(self):
            pass

    group = threads.ThreadGroup(4, meter=Scripted())
    group.roster = roster = Roster(4, problems=[torch.tensor([float(r)]) for r in range(4)])
    roster.parked = {2, 3}
    group.set_parties(2)
    group._inbox[0], group._compute = [torch.zeros(1)], [0.1, 0.2, 0.0, 0.0]
    group._fill(None, lambda shard: [shard * 10])
    assert [t.item() for t, in group._inbox[2:]] == [20.0, 30.0] and group._compute == [0.1, 0.2, 0.25, 0.25]
    group._compute = [0.1, 0.2, 0.0, 0.0]
    group._fill([1], lambda shard: [shard])  # a round of client 1 (and rank 0): the others are filled, uncharged
    assert [t.item() for t, in group._inbox[2:]] == [2.0, 3.0] and group._compute == [0.1, 0.2, 0.0, 0.0]
    with pytest.raises(RuntimeError, match="worker 2's filled-in message has shapes"):
        group._fill(None, lambda shard: [torch.zeros(2)])


@pytest.mark.parametrize("lr", [0.05, None], ids=["given", "measured"])
def test_a_client_never_drawn_never_has_a_thread(monkeypatch, lr):
    """Rank 0 starts alone: at its first draw S_0's clients start from the beginning, the others park without a
    thread, and a client no draw takes never has one.  With ``lr`` null the gather of the L_i that sets it comes
    before the first draw, and every worker starts there, as without parking."""
    m, rounds, started = 60, 4, Counter()
    start = worker_threads.WorkerThreads.start_thread

    def counted_start(self, comm, body, fresh):
        if self.group.roster is not None:  # the run's group (not the reference optimum's)
            started[comm.rank, fresh] += 1
        return start(self, comm, body, fresh)

    monkeypatch.setattr(worker_threads.WorkerThreads, "start_thread", counted_start)
    many_clients(monkeypatch, m, rows=600, data_seed=2, rounds=rounds, lr=lr)
    fresh = {rank for (rank, first), n in started.items() if first}
    if lr is None:
        assert fresh == set(range(m))
        return
    sampler = ClientSampler(SimpleNamespace(size=m, rank=0), S, seed=SEED)
    draws = [set(sampler.draw().tolist()) for _ in range(rounds)]
    assert fresh == draws[0] | {0}
    assert {rank for rank, _ in started} == set().union(*draws) | {0}  # the others: no thread, ever
