"""The simulator at federated scale: workers with fewer rows than d, and thousands of threads.

- the low-rank exact solve (Woodbury identity, `dane.numerics.linalg.woodbury_solve`) equals the
  d x d Cholesky solve to 1e-12 for n_i < d, at several shifts, μ = 0 included (λ > 0);
- DANE's iterates on a ridge_synthetic with n_i < d follow those of the Cholesky path to 1e-10;
- such a shard holds no d x d tensor, before and after a run;
- `dane.comm.threads.Rendezvous` and the allreduce at m = 2000 threads: the mean of the
  inputs, in rank order, and a broken rendezvous releases every waiter;
- what a sampled FedAvg or SCAFFOLD run holds at its end (`retained`: every object its workers' run loops reach, each
  tensor's storage once) grows from R to 3R rounds by at most twice its records' growth, on the batched path
  (m = 1000, 100 a round) and on the thread path (m = 20, 10 a round); each simulated worker keeping its own copy of
  every round's record would add s or m record dictionaries a round where rank 0's records add one.
"""
from __future__ import annotations

import gc
import sys
import threading
import types

import numpy as np
import pytest
import torch

import dane.loop.worker
from dane.api import algorithm_config
from dane.comm import ThreadGroup
from dane.comm.threads import Rendezvous
from dane.dane import DANEConfig
from dane.errors import ConfigError
from dane.loop.callbacks import Callback, worker_callbacks
from dane.loop.launch import execute
from dane.loop.spec import Communication, RunControl, RunSpec
from dane.loop.stopping import StopRule
from dane.problems import RidgeSyntheticConfig
from dane.problems.arrays import LogReg
from dane.problems.ridge import RidgeShard
from helpers import ridge_shards, simulate

# n_i = 30 rows per worker against d = 60 columns
SMALL = dict(n_samples=600, dim=60, covariance="decay", seed=7)


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


def tensors(obj, seen=None) -> list[torch.Tensor]:
    """Every tensor an object holds, through its attributes, dicts, lists and tuples (one level of objects deep)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in tensors(v, seen)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in tensors(v, seen)]
    if hasattr(obj, "__dict__") and type(obj).__module__.startswith("dane"):
        return [t for v in vars(obj).values() for t in tensors(v, seen)]
    return []


def stored_numbers(obj) -> int:
    """The numbers behind an object's tensors, each storage once (X and its transpose view share one)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() // t.element_size() for t in tensors(obj)}
    return sum(storages.values())


@pytest.mark.parametrize("lam", [0.005, 0.05])
def test_woodbury_solve_equals_the_dense_cholesky_solve(lam):
    config = dict(SMALL, lam=lam)
    dense = RidgeSyntheticConfig(**config, factorization="cholesky").build(3, 20)
    low = RidgeSyntheticConfig(**config).build(3, 20)  # auto: n_i = 30 < d = 60
    assert low.low_rank and not dense.low_rank and low.n_local == 30
    gen = torch.Generator().manual_seed(0)
    for mu in (0.0, 1e-3, 0.05, 0.297, 3.0):
        r = torch.randn(60, dtype=torch.float64, generator=gen)
        shift = mu + 2 * lam
        assert relative(low.shifted_solve(r, shift), dense.shifted_solve(r, shift)) <= 1e-12, mu
        anchor, linear = torch.randn(60, dtype=torch.float64, generator=gen), r
        a, b = low.prox_solve(anchor, linear, mu), dense.prox_solve(anchor, linear, mu)
        assert relative(a - anchor, b - anchor) <= 1e-12, mu
    assert len(low._capacitance) == 2  # the last two shifts' factors, not one per shift
    assert low._A is None and not low._factors and low._eigen is None


def test_woodbury_refuses_a_singular_hessian_and_a_problem_without_rows():
    config = RidgeSyntheticConfig(**SMALL, lam=0.0)
    (low,) = [config.build(0, 20)]
    r = torch.ones(60, dtype=torch.float64)
    with pytest.raises(ConfigError, match=r"plus 0.0 I is not positive definite on this shard; use a strongly convex problem \(problem.lam > 0; "):
        low.shifted_solve(r, 0.0)  # rank 30 < 60: A_i alone is singular
    x = low.shifted_solve(r, 0.1)  # any μ > 0 is fine
    assert relative(low.hessian_vector(x, with_reg=False) + 0.1 * x, r) <= 1e-12
    from dane.problems import QuadraticProblem

    with pytest.raises(ConfigError, match="problem.factorization=woodbury needs the shard's rows"):
        QuadraticProblem(torch.eye(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64), 0.0, 0.1,
                         factorization="woodbury")


def test_dane_iterates_with_woodbury_follow_the_cholesky_path():
    def run(factorization):
        config = RidgeSyntheticConfig(**SMALL, factorization=factorization)
        problems = ridge_shards(20, config)
        results = simulate(DANEConfig(), problems, rounds=12)
        return problems, results[0][1], results[0][2]

    low_problems, low_records, low_iterates = run("auto")
    _, dense_records, dense_iterates = run("cholesky")
    assert all(p.low_rank for p in low_problems)
    assert len(low_iterates) == len(dense_iterates) == 13
    for a, b in zip(low_iterates[1:], dense_iterates[1:]):
        assert relative(a, b) <= 1e-10
    assert [r.get("mu") for r in low_records] == [r.get("mu") for r in dense_records]
    assert len({r["mu"] for r in low_records if "mu" in r}) >= 3  # the safeguard moved μ: the factor cache was used
    for a, b in zip(low_records, dense_records):
        assert abs(a["suboptimality"] - b["suboptimality"]) <= 1e-10 * max(1.0, b["suboptimality"])


def test_a_low_rank_shard_holds_no_d_by_d_tensor():
    n_samples, dim, m = 2000, 400, 100  # n_i = 20 rows of d = 400: a d x d tensor is 160,000 numbers
    problems = ridge_shards(m, RidgeSyntheticConfig(n_samples=n_samples, dim=dim, seed=1))
    simulate(DANEConfig(), problems, rounds=4)  # every cache the rounds fill is filled
    n_i = n_samples // m
    for p in problems[:5]:
        assert isinstance(p, RidgeShard) and p.low_rank and p.n_local == n_i
        held = tensors(p)
        assert held and max(t.numel() for t in held) <= n_i * dim  # X_i; nothing d x d
        assert not any(t.dim() == 2 and min(t.shape) >= dim for t in held)
        # X_i (n_i d), y_i, b_i, H w*, w* and the n_i x n_i row Gram and two factors: O(n_i d), not O(d²)
        assert stored_numbers(p) <= n_i * dim + 3 * n_i ** 2 + 5 * dim + n_i
    dense = RidgeSyntheticConfig(n_samples=n_samples, dim=dim, seed=1, factorization="cholesky").build(0, m)
    assert max(t.numel() for t in tensors(dense)) == dim * dim  # the reference path does hold A_i


def test_rendezvous_releases_every_waiter_and_breaks_for_all():
    done = []
    barrier = Rendezvous(50, action=lambda: done.append(len(done)))

    def wait_three_times():
        for _ in range(3):
            barrier.wait()

    threads = [threading.Thread(target=wait_three_times) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert done == [0, 1, 2] and not any(t.is_alive() for t in threads)

    broken = Rendezvous(4)
    errors = []

    def wait_once():
        try:
            broken.wait()
        except threading.BrokenBarrierError:
            errors.append("broken")

    waiters = [threading.Thread(target=wait_once) for _ in range(3)]  # one party short: they wait
    for t in waiters:
        t.start()
    broken.abort()
    for t in waiters:
        t.join(timeout=30)
    assert errors == ["broken"] * 3
    with pytest.raises(threading.BrokenBarrierError):
        broken.wait()  # broken for good


def test_allreduce_at_two_thousand_threads_is_the_mean_in_rank_order():
    m = 2000

    def worker(comm):
        x = torch.tensor([float(comm.rank), 1.0 / (comm.rank + 1)], dtype=torch.float64)
        (mean,) = comm.allreduce_mean([x])
        (again,) = comm.allreduce_mean([mean * (comm.rank % 2)])
        return mean, again

    results = ThreadGroup(m).run(worker)
    inputs = torch.stack([torch.tensor([float(r), 1.0 / (r + 1)], dtype=torch.float64) for r in range(m)])
    expected = inputs.sum(0) / m
    assert all(torch.equal(mean, expected) for mean, _ in results)
    assert all(torch.equal(again, results[0][1]) for _, again in results)
    torch.testing.assert_close(results[0][1], expected / 2, rtol=1e-15, atol=0)


@pytest.mark.slow
def test_dane_with_two_thousand_workers_of_two_rows_takes_its_first_step_exactly():
    """One DANE round at m = 2000 (n_i = 2 < d = 5): w_1 = w_0 - mean_i (H_i + 2λ... )⁻¹ g, computed directly."""
    config = RidgeSyntheticConfig(n_samples=4000, dim=5, seed=2)
    m = 2000
    problems = ridge_shards(m, config)
    results = simulate(DANEConfig(), problems, rounds=2)
    w1 = results[0][2][1]
    assert all(torch.equal(r[2][1], w1) for r in results)
    # the first round: μ = 0 and η = 1 from w_0 = 0, exactly (A_i + 2λI)⁻¹ of the mean gradient
    w0 = torch.zeros(5, dtype=torch.float64)
    g = sum(p.grad(w0) for p in problems) / m
    eye = torch.eye(5, dtype=torch.float64)
    expected = sum(w0 - torch.linalg.solve(p.A + 2 * p.lam * eye, g) for p in problems) / m
    assert relative(w1, expected) <= 1e-10
    # plain DANE (μ = 0) diverges with 2 rows per worker: the safeguard rejects that step and raises μ
    assert results[0][1][1]["accepted"] is False and results[0][1][1]["mu"] > 0


#: what `retained` does not walk into: the code (modules, classes, functions, frames) and the threads themselves, which
#: the thread path starts and prunes in amortized batches (`dane.comm.worker_threads`), not memory a round keeps
CODE_AND_THREADS = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
                    types.FrameType, types.TracebackType, types.CodeType, threading.Thread, threading.local)


def retained(roots) -> int:
    """Bytes reachable from ``roots``: each object's sys.getsizeof once and each tensor's storage once (torch's memory,
    which tracemalloc does not see), not through `CODE_AND_THREADS`.  A seeded run ends in the same state every time
    (the thread path's records too, bit for bit), so the count does not vary from run to run: no margin for noise.
    tracemalloc's traced memory, read at rank 0's end of the thread path, moves with the thread list's pruning and
    with the other workers still closing, by more than the records a round add."""
    seen, storages, total, stack = set(), set(), 0, list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, CODE_AND_THREADS):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, torch.Tensor) and obj.layout == torch.strided:
            storage = obj.untyped_storage()
            if storage.data_ptr() not in storages:
                storages.add(storage.data_ptr())
                total += storage.nbytes()
        stack.extend(gc.get_referents(obj))
    return total


class KeepLoops(Callback):
    """Every worker's run loop (`dane.loop.driver.Loop`), kept past the run's end: what the run held then."""

    def __init__(self):
        self.loops = []

    def on_start(self, loop) -> None:
        self.loops.append(loop)


#: path -> (sim.batched, clients m, clients a round s)
SAMPLED = {"batched": ("true", 1000, 100), "threads": ("false", 20, 10)}


def held_at_end(monkeypatch, method: str, path: str, rounds: int) -> tuple[int, int, int]:
    """A sampled run of ``method`` on ``path`` for ``rounds`` rounds: what its loops hold at its end, its records'
    own size (`retained` of rank 0's records alone), and how many workers ran a loop."""
    batched, m, s = SAMPLED[path]
    keep = KeepLoops()
    monkeypatch.setattr(dane.loop.worker, "worker_callbacks",
                        lambda spec, loop, collect=None: [*worker_callbacks(spec, loop, collect), keep])
    X = np.random.default_rng(0).standard_normal((2 * m, 4))  # two rows of d = 4 a client
    spec = RunSpec(problem=LogReg(X, (X @ np.arange(1.0, 5.0) > 0).astype(float), lam=1e-2),
                   algorithm=algorithm_config(method, clients_per_round=s, local_steps=2),
                   comm=Communication(backend="local", workers=m, batched=batched),
                   control=RunControl(stop=StopRule(rounds=rounds), quiet=True))
    collected: dict = {}
    execute(spec, None, collect=collected)
    assert collected["summary"]["simulator_path"] == path and len(collected["records"]) == rounds + 1
    return retained(keep.loops), retained([collected["records"]]), len(keep.loops)


@pytest.mark.parametrize("path", list(SAMPLED))
@pytest.mark.parametrize("method", ["fedavg", "scaffold"])
def test_what_a_sampled_run_holds_grows_with_rounds_by_its_records_alone(monkeypatch, method, path):
    """From R to 3R rounds the loops' memory grows by the records rank 0 keeps (`dane.loop.runner.run`: the other
    simulated workers keep their last record only) and, on the thread path, by the last record of each client first
    drawn after round R (with s = m/2 a client is left out of the first R = 8 rounds with probability 2⁻⁸): at most
    twice the records' growth.  A copy of every round's record per simulated worker would add a record dictionary a
    round per client drawn on the thread path (s = 10) and per client on the batched path (m = 1000), where rank 0's
    records add one."""
    rounds = 8
    held, records, workers = held_at_end(monkeypatch, method, path, rounds)
    held_3, records_3, workers_3 = held_at_end(monkeypatch, method, path, 3 * rounds)
    # the thread path: a loop per client, every one started for round 0's measured step size (lr null)
    assert workers == workers_3 == (1 if path == "batched" else SAMPLED[path][1])
    assert records_3 - records > 2 * rounds * 1000  # 16 records of over 1 kB each: the bound below is not vacuous
    assert held_3 - held <= 2 * (records_3 - records), (held, held_3, records, records_3)
