"""The batched simulator (dane.comm.batched, ``sim.batched``) against the per-worker one (one thread a worker).

- the batched run's records equal the per-worker run's (every key but time_s: integers exactly,
  floats to round-off) and so do the iterates, for DANE and GD on ridge_synthetic with n_i < d
  (Woodbury) and n_i >= d (d x d Cholesky), and on problem=ridge (a linear model on arrays), over
  3 rounds at small m and d;
- the batched communicator's mean is the thread group's, bit for bit, and its byte counts are the ring's;
- the clock charges each worker measured / m per phase, with the straggler factors and
  the α-β cost, exactly (a fake meter of known readings);
- stacked Lanczos gives each worker's per-worker Ritz values;
- ``sim.batched=true`` where the batched path cannot run is one line naming why; ``auto``
  batches from AUTO_FROM workers on and says so in the summary.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from dane.api import algorithm_config
from dane.baselines.spectral import lanczos_extremes, start_vector
from dane.baselines.spectral_stacked import stacked_lanczos_extremes
from dane.loop.batching import AUTO_FROM, batched_path
from dane.comm import AlphaBeta, Stragglers, ThreadGroup
from dane.comm.batched import BatchedCommunicator, BatchedGroup, per_worker, run_batched
from dane.errors import ConfigError
from dane.experiments.config import run_spec
from dane.loop.launch import execute
from dane.problems import RidgeSyntheticConfig
from dane.problems.arrays import LogReg, Ridge, Softmax
from dane.loop.runner import run as loop_run
from dane.loop.stopping import StopRule
from dane.synthetic.sweep import compose_job
from helpers import on_path

RTOL = 1e-12  # the stacked sums run in another order than the per-worker ones: round-off, not bits


run = on_path  # a local run on the path sim.batched names


@pytest.mark.parametrize("algorithm,keys", [("dane", {}), ("dane", {"safeguard": False, "mu": 0.3}), ("gd", {})])
@pytest.mark.parametrize("n_samples", [48, 480])  # 12 rows a worker < d: Woodbury; 120 >= d: d x d Cholesky
def test_batched_records_equal_the_per_worker_records(algorithm, keys, n_samples):
    problem = RidgeSyntheticConfig(n_samples=n_samples, dim=20, covariance="decay")
    assert_same_records(run(problem, algorithm, 4, "true", **keys), run(problem, algorithm, 4, "false", **keys))


def assert_same_records(batched: dict, threads: dict) -> None:
    assert threads["summary"]["simulator_path"] == "threads" and batched["summary"]["simulator_path"] == "batched"
    assert len(batched["records"]) == len(threads["records"])
    for ours, theirs in zip(batched["records"], threads["records"]):
        assert ours.keys() == theirs.keys()
        for key, value in theirs.items():
            if key != "time_s":  # abs: a value that is 0 on one path may be 1e-17 on the other (e.g. a spread)
                assert ours[key] == (pytest.approx(value, rel=RTOL, abs=1e-15) if isinstance(value, float) else value)
    torch.testing.assert_close(batched["w"], threads["w"], rtol=RTOL, atol=0)


def least_squares_rows(n: int = 120, d: int = 15):
    gen = np.random.default_rng(0)
    X = gen.standard_normal((n, d))
    return X, X @ gen.standard_normal(d) + 0.1 * gen.standard_normal(n)


@pytest.mark.parametrize("algorithm", ["dane", "gd"])
def test_a_linear_least_squares_problem_runs_batched_with_the_per_worker_records(algorithm):
    """problem=ridge on arrays: one exact Newton step from a batched Cholesky of the (m, d, d) Hessians."""
    problem = Ridge(*least_squares_rows(), lam=1e-2)
    assert_same_records(run(problem, algorithm, 4, "true"), run(problem, algorithm, 4, "false"))


def test_the_mean_is_the_thread_groups_and_the_bytes_are_the_rings():
    m, d = 5, 7
    rows = torch.randn(m, d, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    metrics = torch.randn(m, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    threads = ThreadGroup(m).run(lambda comm: (comm.allreduce_mean([rows[comm.rank], metrics[comm.rank]]),
                                               comm.bytes_sent, comm.broadcast([rows[comm.rank]], root=3)[0]))
    comm = BatchedCommunicator(BatchedGroup(m))
    mean = comm.allreduce_mean([rows, metrics])
    assert all(torch.equal(a, b) for a, b in zip(mean, threads[0][0]))  # the same sum in rank order, bit for bit
    assert comm.bytes_sent == threads[0][1] == 2 * (m - 1) * 8 * (d + 2) // m
    assert torch.equal(comm.broadcast([rows], root=3)[0], rows[3]) and torch.equal(threads[0][2], rows[3])
    with pytest.raises(TypeError, match="stacked tensors"):
        comm.allreduce_mean([rows[0]])
    assert torch.equal(per_worker(comm, lambda r: torch.tensor([float(r)])), torch.arange(m, dtype=torch.float32)[:, None])


def test_a_broadcast_counts_the_roots_payload_once_for_each_other_worker():
    """bytes_sent of a broadcast from root 0: (m - 1) copies of its payload on the root (7 float64 and 3 float32 =
    68 bytes, m = 5: 272), nothing on the others; the batched communicator counts rank 0's, the same number."""
    m = 5
    rows = torch.randn(m, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    small = torch.randn(m, 3, dtype=torch.float32, generator=torch.Generator().manual_seed(2))

    def worker(comm):
        got = comm.broadcast([rows[comm.rank], small[comm.rank]], root=0)
        return comm.bytes_sent, comm.calls, got

    threads = ThreadGroup(m).run(worker)
    assert [b for b, _, _ in threads] == [(m - 1) * (7 * 8 + 3 * 4)] + [0] * (m - 1) == [272, 0, 0, 0, 0]
    assert all(calls == 1 and torch.equal(got[0], rows[0]) and torch.equal(got[1], small[0])
               for _, calls, got in threads)
    comm = BatchedCommunicator(BatchedGroup(m))
    got = comm.broadcast([rows, small], root=0)
    assert comm.bytes_sent == 272 and comm.calls == 1
    assert torch.equal(got[0], rows[0]) and torch.equal(got[1], small[0])


class FixedMeter:
    """Every compute phase reads ``seconds`` (the stacked computation of all m workers)."""

    name = "fixed"

    def __init__(self, seconds: float):
        self.seconds = seconds

    def start(self) -> float:
        return 0.0

    def read(self, mark: float) -> float:
        return self.seconds

    def stop(self) -> None:
        pass


def test_each_worker_is_charged_its_share_of_the_stacked_compute():
    m, measured = 4, 0.8
    cost = AlphaBeta(alpha=1e-3, beta=1e8)
    group = BatchedGroup(m, cost, Stragglers(slowdown=(1.0, 3.0)), FixedMeter(measured))
    comm = BatchedCommunicator(group)
    comm.begin()
    comm.allreduce_mean([torch.zeros(m, 10, dtype=torch.float64)])  # 80 bytes a worker
    comm.barrier()
    comm.next_participants([0, 2])  # only the unslowed workers: factor 1
    comm.allreduce_mean([torch.zeros(m, 10, dtype=torch.float64)])
    share = measured / m
    assert group.compute_time == pytest.approx(3 * share + 3 * share + share, rel=1e-15)
    assert group.comm_time == pytest.approx(cost.allreduce_time(80, m) + cost.allreduce_time(80, 2), rel=1e-15)
    assert group.clock == pytest.approx(group.compute_time + group.comm_time, rel=1e-15)
    assert comm.elapsed() == pytest.approx(group.clock + share, rel=1e-15)  # rank 0's share of the pending phase
    before = group.comm_time
    comm.broadcast([torch.zeros(m, 10, dtype=torch.float64)], root=1)  # priced as the per-worker path prices it
    assert group.comm_time - before == pytest.approx(cost.broadcast_time(80, m), rel=1e-12)
    assert cost.broadcast_time(80, m) == pytest.approx(2 * (1e-3 + 80 / 1e8), rel=1e-15)  # ⌈log₂ 4⌉ = 2


@pytest.mark.parametrize("algorithm", ["gd", "dane"])
def test_seeded_straggler_delays_give_both_paths_the_same_clock(algorithm):
    """sim.delay_mean > 0: the batched group draws the per-worker path's delays, draw for draw (one exponential per
    worker and collective from the seeded generator), so a run of 3 rounds on ridge shards with every compute phase
    read as 1 ms a worker (the batched meter reads the stacked 4 ms, shared by 4) has the per-worker path's clock at
    every record, to round-off.  The delays (mean 5 ms) are most of it: left out, the batched clock falls short."""
    m, rounds, each = 4, 3, 1e-3
    cost, stragglers = AlphaBeta(alpha=1e-4, beta=1e8), Stragglers(slowdown=(1.0, 2.0), delay_mean=5e-3, seed=3)
    config = RidgeSyntheticConfig(n_samples=48, dim=6)
    algo_config = algorithm_config(algorithm, **({"lr": 0.1} if algorithm == "gd" else {}))

    def worker(problem):
        def go(comm):
            records, _ = loop_run(algo_config.build(problem(comm), comm), StopRule(rounds=rounds))
            return [(r["time_s"], r["comm_rounds"]) for r in records], (comm.group.compute_time, comm.group.comm_time)
        return go

    threads = ThreadGroup(m, cost, stragglers, FixedMeter(each)).run(worker(lambda comm: config.build(comm.rank, m)))
    batched = run_batched(BatchedGroup(m, cost, stragglers, FixedMeter(m * each)),
                          worker(lambda comm: config.build_stacked(m)))
    (times, split), (batched_times, batched_split) = threads[0], batched
    assert [c for _, c in batched_times] == [c for _, c in times] and times[-1][1] >= rounds
    assert [t for t, _ in batched_times] == pytest.approx([t for t, _ in times], rel=1e-12, abs=0)
    assert batched_split == pytest.approx(split, rel=1e-12, abs=0)
    rng = np.random.default_rng(3)
    delays = sum(rng.exponential(5e-3, m).max() for _ in range(times[-1][1]))
    assert split[0] >= delays  # every phase's slowest worker waited at least the largest delay drawn


@pytest.mark.parametrize("path", ["threads", "batched"])
def test_a_barrier_off_the_clock_draws_no_delay(path):
    """A barrier entered off the clock (a checkpoint's wait for every part, `dane.loop.callbacks.Checkpoints`) ends no
    phase and draws no delay: the clocked barrier after it is the run's first phase, 1 ms of compute a worker plus the
    larger of the generator's first two delays."""
    m, stragglers = 2, Stragglers(delay_mean=5e-3, seed=3)

    def worker(comm):
        with comm.off_the_clock():
            comm.barrier()
        comm.barrier()
        return comm.group.clock

    if path == "threads":
        clock = ThreadGroup(m, AlphaBeta(), stragglers, FixedMeter(1e-3)).run(worker)[0]
    else:
        clock = run_batched(BatchedGroup(m, AlphaBeta(), stragglers, FixedMeter(m * 1e-3)), worker)
    assert clock == pytest.approx(1e-3 + np.random.default_rng(3).exponential(5e-3, m).max(), rel=1e-15)


def test_stacked_lanczos_gives_each_workers_ritz_values():
    m, d, iters = 3, 12, 6
    gen = torch.Generator().manual_seed(0)
    B = torch.randn(m, d, d, dtype=torch.float64, generator=gen)
    H = B @ B.mT
    H[2] = torch.diag(torch.tensor([2.0, 5.0] + [0.0] * (d - 2), dtype=torch.float64))  # invariant after 2 products
    v0 = start_vector(d, torch.float64, 7)
    stacked = stacked_lanczos_extremes(lambda V: (H @ V.unsqueeze(-1)).squeeze(-1), v0, iters, m)
    for i in range(m):
        assert stacked[i].tolist() == pytest.approx(lanczos_extremes(lambda v: H[i] @ v, v0, iters), rel=1e-12)


@pytest.mark.parametrize("overrides,why", [
    (("algorithm=admm",), "algorithm=admm has no stacked form"),
    (("problem.n_samples=601",), "does not split into 4 equal shards"),
    (("problem.local_solver=cg",), "problem.local_solver=cg has no batched form"),
    (("comm.compress=topk:0.5",), "comm.compress"),
    (("algorithm=gd", "workers=1"), "one worker has nothing to stack"),
])
def test_batched_true_where_it_cannot_run_is_one_line_naming_why(overrides, why):
    with pytest.raises(ConfigError, match="sim.batched=true cannot run here") as err:
        run_spec(compose_job(("workers=4", "problem.n_samples=600", "problem.dim=20", "sim.batched=true", *overrides)))
    assert why in str(err.value) and "\n" not in str(err.value) and "sim.batched=auto" in str(err.value)


def test_a_value_other_than_auto_true_false_is_one_line():
    with pytest.raises(ConfigError, match="sim.batched must be one of auto|true|false, got .maybe.") as err:
        run_spec(compose_job(("workers=4", "problem.n_samples=600", "problem.dim=20", "sim.batched=maybe")))
    assert "\n" not in str(err.value)


def test_softmax_is_refused_batched_in_one_line():
    X, y = least_squares_rows()
    with pytest.raises(ConfigError, match="problem=softmax: the softmax loss has no batched form yet"):
        run(Softmax(X, np.digitize(y, [-1.0, 1.0])), "dane", 4, "true")


@pytest.mark.parametrize("algorithm", ["dane", "gd"])
def test_a_logistic_regression_runs_batched_with_the_per_worker_records(algorithm):
    """The batched Newton local solve: each worker's own line search and stopping rule, as per worker."""
    X, y = least_squares_rows()
    problem = LogReg(X, (y > 0).astype(float), lam=1e-2)
    assert_same_records(run(problem, algorithm, 4, "true"), run(problem, algorithm, 4, "false"))


def small_logreg():
    X, y = least_squares_rows(n=48, d=6)
    return LogReg(X, (y > 0).astype(float), lam=1e-2)


@pytest.mark.parametrize("make", [lambda: RidgeSyntheticConfig(n_samples=48, dim=6), small_logreg],
                         ids=["ridge_synthetic", "logreg"])
def test_minibatch_local_sgd_runs_batched_with_the_per_worker_records(make):
    """Each worker's minibatch gradient from its own rows and its own seeded sampler (``batch_grad`` on the stacked
    problem): local SGD with algorithm.batch_size has the per-worker records, as under auto from AUTO_FROM workers."""
    keys = {"batch_size": 3, "local_steps": 4, "lr": 0.05}
    assert_same_records(run(make(), "local_sgd", 4, "true", **keys), run(make(), "local_sgd", 4, "false", **keys))


def test_auto_batches_from_its_threshold_and_false_never():
    def spec(workers: int, mode: str = "auto"):
        return run_spec(compose_job((f"workers={workers}", "problem.n_samples=640", "problem.dim=10",
                                     f"sim.batched={mode}")))

    assert batched_path(spec(AUTO_FROM)) == (True, None) and batched_path(spec(AUTO_FROM // 2)) == (False, None)
    assert batched_path(spec(AUTO_FROM, "false")) == (False, None) and batched_path(spec(2, "true")) == (True, None)
    declined = run_spec(compose_job((f"workers={AUTO_FROM}", "problem.n_samples=640", "problem.dim=10",
                                     "algorithm=admm", "rounds=1")))
    why = ("sim.batched=auto: one thread per worker, since algorithm=admm has no stacked form (its class does not "
           "declare batchable)")
    assert batched_path(declined) == (False, why)  # auto: threads, no refusal, and the run's notes say why
    assert why in execute(declined, None)["notes"]
