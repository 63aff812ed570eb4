"""The stacked network shard (dane.problems.stacked_net) and local SGD on it, against the per-worker path.

- every method of `StackedNeuralProblem` (gradient and metrics at a shared and at per-worker
  points, minibatch gradients, the inner-SGD local solve, the confusion matrix) equals the m
  per-worker `NeuralProblem` s' results row by row, with either engine (loop, vmap): in float64
  to round-off (RTOL), in float32 to F32_RTOL; the loop engine's minibatch gradients are the
  per-worker ones bit for bit;
- `StackedSampler` draws, row for row, the batches of the m per-worker samplers;
- local SGD (each aggregation) and DANE run batched (``sim.batched=true``) have the per-worker run's
  records and iterate;
- ``sim.batched=true`` where the shards differ in size, or with an inner optimizer that has no
  stacked form, is one line naming why; ``auto`` keeps threads for a network on the CPU.

Data: random 1 x 32 x 32 images (`TinyImages`, 8 training rows a worker at m = 3, so the runs take
seconds), LeNet-5; the MNIST check skips where the shared data is absent.
"""
from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from dane.api import algorithm_config
from dane.loop.batching import AUTO_FROM, batched_path
from dane.data import Dataset
from dane.errors import ConfigError
from dane.numerics.inner import MinibatchSampler, StackedSampler, worker_seed
from dane.loop.launch import execute
from dane.baselines.local_sgd import local_steps
from dane.problems import neural, stacked_net
from dane.problems.neural import DataConfig, ModelConfig, NeuralProblemConfig
from dane.problems.stacked_net import ENGINES
from dane.loop.stopping import StopRule
from dane.loop.spec import Communication, RunControl, RunSpec

RTOL = 1e-12  # float64: the stacked sums (vmap, grouped convolutions) run in another order, so round-off, not bits
#: float32 on random images: the sums' other order costs a few float32 ulps of the largest entry (1e-7 relative);
#: a wrong row, sample or sign gives 1e-2.  Random pixels, because on images with flat blocks (scikit-learn's
#: digits, upsampled) max-pool windows hold ties that float32 rounding may break the other way, routing a
#: gradient to another pixel: a legitimate difference far above round-off
F32_RTOL = 1e-5
M = 3
MNIST = Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist"


@dataclass(frozen=True)
class TinyImages(NeuralProblemConfig):
    """LeNet-5 on ``train_rows`` random 1 x 32 x 32 images of 10 classes (and 6 test images)."""

    train_rows: int = 8 * M

    def dataset(self) -> Dataset:
        g = torch.Generator().manual_seed(0)
        image = lambda n: torch.rand(n, 1, 32, 32, generator=g)  # noqa: E731
        label = lambda n: torch.randint(0, 10, (n,), generator=g)  # noqa: E731
        return Dataset(image(self.train_rows), label(self.train_rows), image(6), label(6), 10, "tiny_images")


def tiny(dtype: str = "float64", **keys) -> TinyImages:
    return TinyImages(model=ModelConfig(name="lenet5"), dtype=dtype, inner_batch_size=4, inner_steps=2,
                      inner_momentum=0.9, l2=1e-3, eval_batch_size=4, device="cpu", **keys)  # 2 chunks a shard


def rows_equal(stacked: torch.Tensor, per_worker: list[torch.Tensor], rtol: float) -> None:
    """Row i of ``stacked`` equals ``per_worker[i]`` to ``rtol`` of the largest entry."""
    for row, theirs in zip(stacked, per_worker):
        torch.testing.assert_close(row, theirs, rtol=0, atol=rtol * float(theirs.abs().max()))


@pytest.fixture(params=ENGINES)
def engine(request, monkeypatch):
    """Each engine of the stacked network (the CPU's default is loop; vmap is the accelerators')."""
    monkeypatch.setattr(stacked_net, "default_engine", lambda device: request.param)
    return request.param


@pytest.mark.parametrize("dtype,rtol", [("float64", RTOL), ("float32", F32_RTOL)])
def test_the_stacked_problem_is_the_per_worker_problems_row_by_row(dtype, rtol, engine):
    config = tiny(dtype)
    with config.numerics():  # one intra-op thread, as in a run (two threads on a busy 2-core machine stall)
        check_rows(config, rtol)


def test_the_loop_engine_computes_the_per_worker_minibatch_gradients_bit_for_bit():
    config = tiny("float32")
    with config.numerics():
        stacked, workers = config.build_stacked(M), [config.build(rank, M) for rank in range(M)]
        assert stacked.engine == "loop"  # the CPU's default
        w = stacked.initial_point()
        W = w + 0.05 * torch.randn(M, w.numel(), generator=torch.Generator().manual_seed(0))
        grads = stacked.batch_grad(W, stacked.sampler.next())
        for i, p in enumerate(workers):
            assert torch.equal(grads[i], p.batch_grad(W[i], p.sampler.next()))


def check_rows(config: NeuralProblemConfig, rtol: float) -> None:
    stacked = config.build_stacked(M)
    workers = [config.build(rank, M) for rank in range(M)]
    assert stacked.stacked_workers == M and stacked.n_local == workers[0].n_local == 8
    w = stacked.initial_point()
    torch.testing.assert_close(w, workers[0].initial_point(), rtol=0, atol=0)  # the same seeded model
    W = w + 0.05 * torch.randn(M, w.numel(), generator=torch.Generator().manual_seed(0)).to(w.dtype)
    for point, own in ((w, [w] * M), (W, list(W))):  # a point shared by the workers, then one per worker
        grads, metrics = stacked.evaluate(point)
        theirs = [p.evaluate(v) for p, v in zip(workers, own)]
        rows_equal(grads, [t[0] for t in theirs], rtol)
        rows_equal(metrics, [t[1] for t in theirs], rtol)
    rows_equal(stacked.batch_grad(W, stacked.sampler.next()),
               [p.batch_grad(W[i], p.sampler.next()) for i, p in enumerate(workers)], rtol)
    linear = 1e-3 * torch.randn(M, w.numel(), generator=torch.Generator().manual_seed(1)).to(w.dtype)
    rows_equal(stacked.prox_solve(w, linear, 0.5), [p.prox_solve(w, linear[i], 0.5) for i, p in enumerate(workers)],
               rtol)
    counts = stacked.confusion_matrix(W)
    for i, p in enumerate(workers):
        assert torch.equal(counts[i], p.confusion_matrix(W[i]))  # counts: exact
    assert float(counts.sum()) == M * 6  # m times the counts of slices that cover the 6 test rows once


def test_the_stacked_sampler_draws_each_workers_own_batches():
    seeds = [worker_seed(7, rank, 3) for rank in range(4)]
    stacked, own = StackedSampler(10, 3, seeds), [MinibatchSampler(10, 3, seed) for seed in seeds]
    for _ in range(5):  # past an epoch (3 batches of 3 out of 10), where each reshuffles
        assert torch.equal(stacked.next(), torch.stack([s.next() for s in own]))


def run(config: NeuralProblemConfig, batched: str, algorithm: str, keys: dict) -> dict:
    spec = RunSpec(problem=config, algorithm=algorithm_config(algorithm, **keys),
                   comm=Communication(backend="local", workers=M, batched=batched),
                   control=RunControl(stop=StopRule(rounds=2), quiet=True))
    collected: dict = {}
    execute(spec, None, collect=collected)
    return collected


@functools.cache
def _per_worker(algorithm: str, keys: tuple) -> dict:
    return run(tiny(), "false", algorithm, dict(keys))


def per_worker(algorithm: str, keys: dict) -> dict:
    """``run(tiny(), "false", algorithm, keys)``, once a session (a copy): the per-worker path builds no stacked
    problem, so the cases that differ only in the stacked engine share it."""
    return copy.deepcopy(_per_worker(algorithm, tuple(sorted(keys.items()))))


LOCAL_SGD = {"local_steps": 2, "batch_size": 4, "lr": 0.1}


@pytest.mark.parametrize("algorithm,keys", [
    ("local_sgd", {**LOCAL_SGD, "aggregate": "mean"}),
    pytest.param("local_sgd", {**LOCAL_SGD, "aggregate": "mean", "engine": "vmap"}, id="local_sgd-vmap"),
    pytest.param("local_sgd", {**LOCAL_SGD, "aggregate": "weighted"}, marks=pytest.mark.slow),
    pytest.param("local_sgd", {**LOCAL_SGD, "aggregate": "best"}, marks=pytest.mark.slow),
    pytest.param("dane", {}, marks=pytest.mark.slow),  # the stacked inner SGD and the non-convex safeguard
])
def test_batched_runs_have_the_per_worker_records(algorithm, keys, monkeypatch):
    keys = dict(keys)
    if "engine" in keys:  # the accelerators' engine, on the CPU
        monkeypatch.setattr(stacked_net, "default_engine", lambda device, engine=keys.pop("engine"): engine)
    config = tiny()
    batched, threads = run(config, "true", algorithm, keys), per_worker(algorithm, keys)
    assert batched["summary"]["simulator_path"] == "batched" and threads["summary"]["simulator_path"] == "threads"
    assert len(batched["records"]) == len(threads["records"]) == 3
    for ours, theirs in zip(batched["records"], threads["records"]):
        assert ours.keys() == theirs.keys()
        for key, value in theirs.items():
            if key != "time_s":
                assert ours[key] == (pytest.approx(value, rel=RTOL) if isinstance(value, float) else value), key
    assert batched["records"][-1]["objective"] < batched["records"][0]["objective"]  # it trained
    torch.testing.assert_close(batched["w"], threads["w"], rtol=0, atol=RTOL * float(threads["w"].abs().max()))


def test_an_unknown_engine_is_refused_at_construction(monkeypatch):
    monkeypatch.setattr(stacked_net, "default_engine", lambda device: "grouped")
    with pytest.raises(ValueError, match="Invalid engine: 'grouped'; use one of loop, vmap"):
        tiny().build_stacked(M)


def test_the_stacked_state_stays_on_the_problems_device(engine, monkeypatch):
    """The problem built on the meta device (tensors with shapes and no values) stands in for a GPU: a copy
    to the host raises ("Cannot copy out of meta tensor") and arithmetic with a host tensor is an error, so
    the local loops below pass only if the iterate, the gradients and the momentum buffer stay on the device."""
    monkeypatch.setattr(neural, "pick_device", lambda device, rank: torch.device("meta"))
    stacked = tiny().build_stacked(M)
    w = stacked.initial_point()
    assert stacked.device.type == w.device.type == "meta"
    W = local_steps(w, lambda v: stacked.batch_grad(v, stacked.sampler.next()), lr=0.1, steps=2)  # local SGD's loop
    assert W.shape == (M, w.numel()) and W.device.type == "meta"
    grads, metrics = stacked.evaluate(W)
    assert grads.device.type == metrics.device.type == "meta"
    assert stacked.prox_solve(w, grads, 0.5).device.type == "meta"  # DANE's local solve, momentum 0.9


@pytest.mark.parametrize("config,why", [
    (TinyImages(train_rows=25), "the 2 workers' shards of tiny_images differ in size (12 to 13 rows); a stacked "
     "network needs equal shards (workers dividing the training rows, iid sharding, no overlap)"),  # 25 rows over 2
    (tiny(inner_optimizer="adam"), "problem.inner_optimizer=adam has no stacked form (sgd has)"),
])
def test_batched_true_where_a_network_cannot_stack_is_one_line(config, why):
    with pytest.raises(ConfigError) as err:
        RunSpec(problem=config, algorithm=algorithm_config("local_sgd", batch_size=4, lr=0.1),
                comm=Communication(backend="local", workers=2, batched="true"),
                control=RunControl(stop=StopRule(rounds=1), quiet=True))
    assert str(err.value) == (f"sim.batched=true cannot run here: {why} (algorithm.batch_size and "
                              "algorithm.aggregate=weighted need that form); use sim.batched=auto (one thread per "
                              "worker where the batched path cannot run)")


def test_auto_keeps_threads_for_a_network_on_the_cpu_and_true_stacks_it():
    def spec(batched: str) -> RunSpec:
        return RunSpec(problem=TinyImages(train_rows=2 * AUTO_FROM, device="cpu"),
                       algorithm=algorithm_config("local_sgd", batch_size=2, lr=0.1),
                       comm=Communication(backend="local", workers=AUTO_FROM, batched=batched),
                       control=RunControl(stop=StopRule(rounds=1), quiet=True))

    assert batched_path(spec("auto")) == (False, "sim.batched=auto: one thread per worker, since problem=neural is "
                                                "not stacked by default on this device (sim.batched=true stacks it)")
    assert batched_path(spec("true")) == (True, None)


@pytest.mark.skipif(not (MNIST / "t10k-images-idx3-ubyte.gz").exists(), reason=f"no MNIST files in {MNIST}")
def test_on_mnist_the_stacked_minibatch_gradients_are_the_per_worker_ones():
    config = NeuralProblemConfig(data=DataConfig(dataset="mnist", data_dir=str(MNIST.parent)),
                                 model=ModelConfig(name="lenet5"), dtype="float64", inner_batch_size=32, device="cpu")
    m = 4  # 8,000 training rows of the t10k split: 2,000 a worker
    stacked, workers = config.build_stacked(m), [config.build(rank, m) for rank in range(m)]
    w = stacked.initial_point()
    with config.numerics():
        check_batches(stacked, workers, w)


def check_batches(stacked, workers, w) -> None:
    for _ in range(2):  # two draws of each worker's sampler
        rows_equal(stacked.batch_grad(w, stacked.sampler.next()), [p.batch_grad(w, p.sampler.next()) for p in workers],
                   RTOL)
