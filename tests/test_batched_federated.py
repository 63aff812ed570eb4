"""The first-order federated methods on the batched simulator (``sim.batched``) against the per-worker one.

- FedAvg, FedProx, SCAFFOLD (options II and I), Scaffnew and FedRed (types 1 and 2, K fixed or geometric; gradient
  steps), with all 6 clients a round and with 3 of 6 (Scaffnew refuses sampling), on dense rows (equal shards: the
  linear model's own stacked form) and on sparse rows in unequal shards (the stacked rows), have the per-worker run's
  records, every key but time_s (objective, bytes_sent, uplink and downlink bytes, comm_rounds, the local work counts:
  integers exactly, floats to RTOL), and its final iterate to RTOL;
- a sampled round computes the participants' gradients only: the stacked problem's evaluations hold |S_t| = 3
  clients' rows in every local step, all 6 only for the record's metrics, and ``local_passes`` is K·s a round;
- the stacked rows answer at a point per client, for a round's participants, as each shard at its own point;
- an exact local solve, random averaging, and FedRed's measured λ are refused batched in one clause;
- FedAvg and FedProx on a stacked network (LeNet-5), 2 of 3 clients a round, have the per-worker records;
- ``sim.batched=auto`` batches these methods from AUTO_FROM clients on, with checkpoints and sim.fail_at too.

RTOL (`test_batched.assert_same_records`: 1e-12 relative, 1e-15 absolute): the stacked sums (a client's gradient over
its rows, the mean over the clients) run in another order than the per-worker ones, so the two paths agree to
round-off, not bit for bit, over these few rounds of a few local steps; a wrong row, client or sign is far above it.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from dane.api import algorithm_config
from dane.errors import ConfigError
from dane.experiments.config import run_spec
from dane.loop.batching import AUTO_FROM, batched_path, why_not_batched
from dane.problems import stacked, stacked_rows
from dane.problems.arrays import LogReg, Ridge
from dane.loop.reference import attach_all
from dane.synthetic.sweep import compose_job
from test_batched import assert_same_records, run
from test_fednl_batched import sparse_rows

M, S = 6, 3  # clients, and clients a round when sampled
STEPS = {"local_steps": 3}
METHODS = {  # given λ and K: FedRed's defaults measure the dissimilarity per worker (refused batched, below)
    "fedavg": STEPS,
    "fedprox": {**STEPS, "mu": 0.1},
    "scaffold": STEPS,
    "scaffold_option1": {**STEPS, "option": 1},
    "scaffnew": {"p": 0.4},
    "fedred": {**STEPS, "lam": 0.1},
    "fedred_type2": {**STEPS, "lam": 0.1, "control_variate": 2},
    "fedred_geometric": {"lam": 0.1, "local_steps": 3, "p": 0.5},  # K ~ Geometric(p) from the shared coin
}
CASES = [(name, s) for name in METHODS for s in (None, S) if not (name == "scaffnew" and s)]


def dense_logreg() -> LogReg:
    """48 dense rows, 8 a client: the linear model's own stacked form (`dane.problems.stacked.StackedLinearModel`)."""
    X = np.random.default_rng(1).standard_normal((48, 5))
    return LogReg(X, (X @ np.arange(1.0, 6.0) + 0.5 * np.random.default_rng(2).standard_normal(48) > 0).astype(float),
                  lam=1e-2)


def sparse_logreg() -> LogReg:
    """63 sparse rows in shards of 10 and 11: the stacked rows (`dane.problems.stacked_rows.StackedRows`)."""
    return LogReg(*sparse_rows(n=63, d=7), lam=1e-3)


def federated(problem, name: str, clients: int | None, batched: str, **extra) -> dict:
    algorithm = name.split("_")[0]
    return run(problem, algorithm, M, batched, rounds=3, **METHODS[name], clients_per_round=clients, **extra)


@pytest.mark.parametrize("name,clients", CASES)
@pytest.mark.parametrize("make", [dense_logreg, sparse_logreg], ids=["dense", "sparse"])
def test_batched_records_equal_the_per_worker_records(make, name, clients):
    batched, threads = federated(make(), name, clients, "true"), federated(make(), name, clients, "false")
    assert_same_records(batched, threads)
    last = batched["records"][-1]
    assert last["local_passes"] > 0 and last["uplink_bytes"] > 0 and last["clients"] == (clients or M)


@pytest.mark.parametrize("keys", [{}, {"aggregate": "best"}, {"lr": 0.5}], ids=["mean", "best", "lr"])
def test_local_sgd_on_sparse_rows_runs_batched_as_per_worker(keys):
    """Full-batch local SGD on the stacked rows (sparse, unequal shards): the per-worker run's records; its
    minibatches and weighted mean need the problem's own stacked form, and say so in one clause."""
    batched, threads = (run(sparse_logreg(), "local_sgd", M, mode, rounds=3, local_steps=3, **keys)
                        for mode in ("true", "false"))
    assert_same_records(batched, threads)
    assert batched["summary"]["simulator_path"] == "batched"
    for refused in ({"batch_size": 4}, {"aggregate": "weighted"}):
        with pytest.raises(ConfigError, match="sparse rows have no batched form .algorithm.batch_size and "
                                              "algorithm.aggregate=weighted need that form"):
            run(sparse_logreg(), "local_sgd", M, "true", rounds=1, **refused)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
@pytest.mark.parametrize("name,clients", [("fedavg", S), ("fedprox", S), ("scaffold", S), ("scaffnew", None),
                                          ("fedred", S), ("fedred_type2", None)])
@pytest.mark.parametrize("make", [dense_logreg, sparse_logreg], ids=["dense", "sparse"])
def test_on_cuda_the_batched_records_equal_the_cpu_per_worker_records(make, name, clients):
    """Issue 48 item 2 on a GPU: the stacked participants on CUDA against one thread a client on the CPU."""
    batched = federated(dataclasses.replace(make(), device="cuda"), name, clients, "true")
    assert batched["w"].device.type == "cuda"
    assert_same_records({**batched, "w": batched["w"].cpu()}, federated(make(), name, clients, "false"))


@pytest.mark.parametrize("make", [lambda: Ridge(*sparse_rows(n=63, d=7), lam=1e-2, optimum="auto"),
                                  lambda: dataclasses.replace(sparse_logreg(), optimum="auto")],
                         ids=["ridge", "logreg"])
def test_with_a_reference_optimum_under_sampling(make):
    """Records with suboptimality, 3 of the 6 clients a round."""
    batched, threads = (federated(make(), "scaffold", S, mode) for mode in ("true", "false"))
    assert_same_records(batched, threads)
    assert "suboptimality" in batched["records"][0]


def test_a_sampled_round_computes_the_participants_gradients_only(monkeypatch):
    """FedAvg, 3 of 6 clients, K = 3 steps, 3 rounds: every local step evaluates a stack of the 3 participants' rows;
    the 6 clients' stack is evaluated once a round (and after the last), for the record's metrics only, which are not
    local work (`dane.work`): ``local_passes`` is K·s = 9 a round."""
    held: list[int] = []
    evaluate = stacked.StackedLinearModel.evaluate
    monkeypatch.setattr(stacked.StackedLinearModel, "evaluate",
                        lambda self, w: held.append(self.X.shape[0]) or evaluate(self, w))
    records = federated(dense_logreg(), "fedavg", S, "true")["records"]
    rounds, K = len(records) - 1, STEPS["local_steps"]
    assert sorted(held) == [S] * (K * rounds) + [M] * (rounds + 1)
    assert [r["local_passes"] for r in records] == [K * S * t for t in range(rounds + 1)]


def test_the_sparse_participants_rows_alone_are_passed(monkeypatch):
    """On the stacked rows a local step passes over the participants' 3 shards alone (30 to 33 of the 63 rows), K
    times a round (the record's metrics read all rows at the shared iterate, by the pass FedNL's records read)."""
    passed: list[int] = []
    margins = stacked_rows.each_margins
    monkeypatch.setattr(stacked_rows, "each_margins",
                        lambda X, start, xs, clients, **k: passed.append(len(clients)) or margins(X, start, xs,
                                                                                                   clients, **k))
    rounds = len(federated(sparse_logreg(), "fedavg", S, "true", lr=0.1)["records"]) - 1  # lr given: no Lanczos
    assert passed == [S] * (STEPS["local_steps"] * rounds)


def test_the_stacked_rows_answer_at_each_clients_own_point():
    """`StackedRows` at a point per client, and for a few clients (`participants`): each shard's gradient, metrics
    (objective, suboptimality) and Hessian-vector products (the majorant's and at a point) at its own point."""
    problem = Ridge(*sparse_rows(n=63, d=7), lam=1e-2, optimum="auto")
    shards = [problem.build(rank, M, torch.float64) for rank in range(M)]
    attach_all(problem, shards)
    rows = stacked_rows.StackedRows(shards)
    gen = torch.Generator().manual_seed(3)
    W, V = (torch.randn(M, rows.dim, dtype=torch.float64, generator=gen) for _ in range(2))
    idx = torch.tensor([1, 4, 5])
    view = rows.participants(idx)
    for stack, clients, points, vectors in ((rows, range(M), W, V), (view, idx.tolist(), W[idx], V[idx])):
        grads, metrics = stack.evaluate(points)
        for k, c in enumerate(clients):
            grad, metric = shards[c].evaluate(points[k])
            torch.testing.assert_close(grads[k], grad, rtol=1e-12, atol=1e-14)
            torch.testing.assert_close(metrics[k], metric, rtol=1e-12, atol=1e-14)
            torch.testing.assert_close(stack.hessian_vector(vectors)[k], shards[c].hessian_vector(vectors[k]),
                                       rtol=1e-12, atol=1e-14)
            torch.testing.assert_close(stack.hessian_vector(vectors, at=points)[k],
                                       shards[c].hessian_vector(vectors[k], at=points[k]), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("overrides,why", [
    (("algorithm=fedprox", "algorithm.local_solver=problem"), "algorithm.local_solver=problem solves each client's"),
    (("algorithm=fedred", "algorithm.lam=0.1", "algorithm.averaging=random"), "algorithm.averaging=random"),
    (("algorithm=fedred",), "algorithm.lam=null measures"),
    # a λ given: the clause names the null that is left (it named lam=null beside it)
    (("algorithm=fedred", "algorithm.lam=0.1", "algorithm.clients_per_round=2"),
     "algorithm.local_steps=null under client sampling measures"),
    # DANE's class is batchable, but the stacked problem's solve is the exact one: InexactDANE's SVRG or CG stays per worker
    (("algorithm=inexact_dane",), "algorithm.local_solver=svrg solves each worker's problem on its own"),
    (("algorithm=inexact_dane", "algorithm.local_solver=cg"), "algorithm.local_solver=cg solves each worker's"),
])
def test_what_the_batched_path_does_not_run_is_one_clause(overrides, why):
    job = ("workers=4", "problem.n_samples=80", "problem.dim=5", *overrides)
    assert why in why_not_batched(run_spec(compose_job(job)))
    with pytest.raises(ConfigError, match="sim.batched=true cannot run here") as err:
        run_spec(compose_job((*job, "sim.batched=true")))
    assert why in str(err.value)


@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox", "scaffold", "scaffnew", "fedred"])
def test_auto_batches_them_from_its_threshold(algorithm):
    extra = ("algorithm.lam=0.1",) if algorithm == "fedred" else ()
    spec = run_spec(compose_job((f"workers={AUTO_FROM}", "problem.n_samples=640", "problem.dim=10",
                                 f"algorithm={algorithm}", *extra)))
    assert batched_path(spec) == (True, None)


@pytest.mark.parametrize("kept", [("checkpoint_every=2",), ("checkpoint_every=2", "sim.fail_at=[[3,1]]")],
                         ids=["checkpoints", "faults"])
def test_auto_batches_a_sampled_run_with_checkpoints_and_faults(kept):
    """Checkpoints, resumes and sim.fail_at run on the batched path (one part for the m workers:
    `dane.loop.checkpoint`), so a checkpointed sampled run keeps it (it took one thread per client, and a part each
    per checkpoint)."""
    spec = run_spec(compose_job((f"workers={AUTO_FROM}", "problem.n_samples=640", "problem.dim=10",
                                 "algorithm=scaffold", "algorithm.clients_per_round=4", *kept)))
    assert batched_path(spec) == (True, None)


@pytest.mark.parametrize("name", ["fedavg", "fedprox"])
def test_fedavg_and_fedprox_on_a_stacked_network_with_sampled_clients(name):
    """LeNet-5 on tiny random images (`test_batched_net.tiny`, float64), 2 of 3 clients a round: the participants'
    rows, test slices and minibatch samplers (`StackedNeuralProblem.participants`)."""
    from test_batched_net import run as run_net, tiny

    keys = {"local_steps": 2, "lr": 0.1, "clients_per_round": 2, **({"mu": 0.1} if name == "fedprox" else {})}
    assert_same_records(run_net(tiny(), "true", name, keys), run_net(tiny(), "false", name, keys))
