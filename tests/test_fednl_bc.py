"""FedNL-BC (baselines/bc_newton.py): FedNL where the broadcast is exact and every round sends gradients, a NumPy
transcription of its rounds (the coin, the gradient-free rounds' g = H(w − z) + ∇O(z), the compressed model), bits
both ways by hand, the batched simulator's records, a resumed run, and its refusals."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from dane.baselines.bc_newton import COIN_STREAM, FedNLBCConfig, model_step, server_matrix_product
from dane.baselines.fednl import FedNLConfig
from dane.comm.compression import downlink_seed
from dane.compress import make
from dane.errors import ConfigError
from dane.problems.stacked_hessians import packed_size, pack
from helpers import simulate, straight_and_resumed
from test_batched import assert_same_records, run
from test_fednl import LAM, shards_of, sparse_logistic
from test_fednl_batched import sparse_rows

M, ROUNDS = 4, 6


@pytest.fixture(scope="module")
def data():
    return sparse_logistic(ones=0.0)  # real-valued rows: TopK's ties broken alike on every path


def worker_iterates(config, X, y, rounds=ROUNDS):
    out = simulate(config, shards_of(X, y, M), rounds)
    for _, _, ws in out[1:]:  # every worker holds the same model
        assert all(torch.equal(a, b) for a, b in zip(out[0][2], ws))
    return [w.numpy() for w in out[0][2]], out[0][1]


def dense_shards(X, y):
    """Per client (∇O_i, ∇²O_i) of `test_fednl.shards_of`'s shards: weight·(logistic loss sum) + (λ/2)‖w‖²."""
    parts, n = np.array_split(np.arange(X.shape[0]), M), X.shape[0]
    out = []
    for p in parts:
        A, b, weight = X[p].toarray(), y[p], M / n

        def grad(w, A=A, b=b, weight=weight):
            return weight * A.T @ (-b / (1 + np.exp(b * (A @ w)))) + LAM * w

        def hess(w, A=A, weight=weight):
            s = 1 / (1 + np.exp(-(A @ w)))
            return weight * (A.T * (s * (1 - s))) @ A + LAM * np.eye(A.shape[1])

        out.append((grad, hess))
    return out


@pytest.mark.parametrize("option", [1, 2])
def test_an_exact_broadcast_with_a_gradient_every_round_is_fednl(data, option):
    X, y = data
    keys = {"compressor": "topk:15", "option": option}
    fednl, _ = worker_iterates(FedNLConfig(**keys), X, y)
    bc, records = worker_iterates(FedNLBCConfig(**keys, model_compressor="none", p=1.0), X, y)
    for a, b in zip(bc, fednl, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)  # w = w + (x − w): x to round-off
    assert all(r["full_round"] == 1.0 for r in records[:-1])


def test_equals_its_numpy_transcription_with_the_coin_and_a_topk_broadcast(data):
    X, y = data
    kp, p, seed = 5, 0.5, 2
    clients = dense_shards(X, y)
    d = X.shape[1]
    coin = np.random.default_rng(np.random.SeedSequence([seed, COIN_STREAM]))
    w = np.zeros(d)
    H_i = [hess(w) for _, hess in clients]                  # H_i⁰ = ∇²O_i(x⁰)
    H = np.mean(H_i, axis=0)
    full, z, G, out, flags = True, None, None, [], []
    for _ in range(ROUNDS):
        out.append(w.copy())
        flags.append(full)
        l = np.mean([np.linalg.norm(hess(w) - H_i[i]) for i, (_, hess) in enumerate(clients)])  # option 2's l_k
        if full:
            z, G = w.copy(), np.mean([grad(w) for grad, _ in clients], axis=0)
        g = G if full else (H + l * np.eye(d)) @ (w - z) + G
        x = w - np.linalg.solve(H + l * np.eye(d), g)       # x_{k+1} = w_k − (H + l I)⁻¹ g_k
        shift = x - w
        keep = np.argsort(-np.abs(shift), kind="stable")[:kp]
        w = w.copy()
        w[keep] += shift[keep]                              # w ← w + C_M(x − w), TopK, η = 1
        new = [hess(out[-1]) for _, hess in clients]        # C = none, α = 1: H_i ← ∇²O_i(w_k)
        H, H_i = np.mean(new, axis=0), new
        full = bool(coin.random() < p)
    got, records = worker_iterates(FedNLBCConfig(model_compressor=f"topk:{kp}", p=p, seed=seed), X, y)
    assert [r["full_round"] for r in records[:-1]] == [float(f) for f in flags]
    assert 0 < sum(flags[1:]) < ROUNDS - 1  # both kinds of round after round 0
    np.testing.assert_allclose(np.stack(got[:ROUNDS]), np.stack(out), rtol=0, atol=1e-12)


def test_bits_both_ways_are_the_hand_counts(data):
    X, y = data
    k, kp, d = 15, 5, X.shape[1]
    _, records = worker_iterates(FedNLBCConfig(compressor=f"topk:{k}", model_compressor=f"topk:{kp}", p=0.5,
                                               seed=2), X, y)
    T, index = packed_size(d), (packed_size(d) - 1).bit_length()
    first = M * 64 * T                                     # H_i⁰ whole, before round 0
    up, up_full = k * (64 + index) + 64, k * (64 + index) + 64 + 64 * d  # S_i, l_i (option 2), and ∇O_i if ξ_k
    down = kp * (64 + (d - 1).bit_length())                # C_M on d entries
    flags = [r["full_round"] for r in records[:-1]]
    assert flags[0] == 1.0 and 0 < sum(flags[1:]) < ROUNDS - 1
    # record t: what reaching w_t cost, before round t (record 0: H_i⁰ alone); the last, the final iterate's
    # evaluation, every round's
    expect_up = np.cumsum([first] + [M * (up_full if f else up) for f in flags]).tolist()
    assert [r["clients_uplink_bits"] for r in records] == expect_up
    expect_down = [t * M * down for t in range(ROUNDS + 1)]
    assert [r["clients_downlink_bits"] for r in records] == expect_down
    assert records[-1]["downlink_bytes"] == ROUNDS * M * -(-down // 8)


def test_the_batched_simulator_gives_the_per_worker_records():
    X, y = sparse_rows()
    from dane.problems.arrays import LogReg

    problem = LogReg(X, y, lam=1e-3)
    for keys in ({"compressor": "topk:10", "model_compressor": "topk:4"},
                 {"compressor": "randk:10", "model_compressor": "randk:4", "option": 1}):
        assert_same_records(run(problem, "fednl_bc", 5, "true", rounds=4, **keys),
                            run(problem, "fednl_bc", 5, "false", rounds=4, **keys))


def test_a_resumed_run_continues_exactly(data):
    X, y = data
    config = FedNLBCConfig(compressor="randk:9", model_compressor="randk:4", p=0.4, seed=3)
    for straight, again, w1, w2 in straight_and_resumed(config, shards_of(X, y, M)):
        drop = ("time_s", "bytes_sent", "comm_rounds")  # the second build's setup allreduce counts on the communicator
        assert [{k: v for k, v in r.items() if k not in drop} for r in straight] == \
            [{k: v for k, v in r.items() if k not in drop} for r in again]
        assert torch.equal(w1, w2)


def test_the_model_step_and_the_projected_product():
    assert model_step(make("topk:3"), 12, None) == 1.0
    assert model_step(make("randk:3"), 12, None) == 0.25   # 1/(ω + 1), ω = 12/3 − 1
    with pytest.raises(ConfigError, match="algorithm.model_lr must be <= 1/\\(omega \\+ 1\\) = 0.25"):
        model_step(make("randk:3"), 12, 0.5)
    H = np.diag([3.0, 0.5, -1.0])
    v = np.array([1.0, 2.0, 3.0])
    packed = pack(H[None])[0]
    np.testing.assert_allclose(server_matrix_product(packed, v, 0.0, option=1, mu=1.0), [3.0, 2.0, 3.0])
    np.testing.assert_allclose(server_matrix_product(packed, v, 2.0, option=2, mu=0.0), [5.0, 5.0, 3.0])
    assert downlink_seed(0) != downlink_seed(1)


def test_the_resolved_model_step_lands_in_the_summary(data):
    from dane.loop.launch import execute
    from dane.loop.stopping import StopRule
    from dane.problems.arrays import LogReg
    from dane.loop.spec import Communication, RunControl, RunSpec

    X, y = data
    for spec, value in (("randk:4", 4 / 13), ("topk:4", 1.0)):
        run_spec = RunSpec(problem=LogReg(X, y, lam=LAM), algorithm=FedNLBCConfig(model_compressor=spec),
                           comm=Communication(backend="local", workers=2),
                           control=RunControl(stop=StopRule(rounds=1), quiet=True, progress="none"))
        (entry,) = [e for e in execute(run_spec, None)["defaults"] if e["key"] == "algorithm.model_lr"]
        assert entry["rule"] == "model_learning_rate"
        assert entry["value"] == pytest.approx(value, rel=1e-15)
    run_spec = RunSpec(problem=LogReg(X, y, lam=LAM), algorithm=FedNLBCConfig(model_lr=0.5, alpha=1.0, option=2),
                       comm=Communication(backend="local", workers=2),
                       control=RunControl(stop=StopRule(rounds=1), quiet=True, progress="none"))
    assert execute(run_spec, None).get("defaults", []) == []  # every number given


@pytest.mark.parametrize("keys, words", [
    ({"variant": "ls"}, "algorithm=fednl_bc runs FedNL's plain round"),
    ({"model_compressor": "rank:1"}, "algorithm.model_compressor=rank:1 compresses d×d matrices"),
    ({"model_compressor": "topk:zero"}, "algorithm.model_compressor=topk:zero"),
    ({"p": 0.0}, "algorithm.p must be"),
    ({"p": 1.5}, "algorithm.p must be in \\(0, 1\\]"),
    ({"model_lr": 2.0}, "algorithm.model_lr must be in \\(0, 1\\]"),
])
def test_bad_keys_are_one_line(keys, words):
    with pytest.raises(ConfigError, match=words):
        FedNLBCConfig(**keys)
