"""comm.compress_down: the server's reply compressed (dane/comm/compression.py), its bits counted beside the uplink's,
the cost model charging both directions (dane/comm/cost.py); without it every record is as before."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dane.baselines.admm import ADMMConfig
from dane.baselines.diana import DIANAConfig
from dane.baselines.gd import GDConfig
from dane.comm import AlphaBeta
from dane.comm.compression import MessageCompression, downlink_seed
from dane.comm.cost import ParameterServerCost
from dane.comm.threads import ThreadGroup
from dane.compress import Identity, RandK, TopK, make
from dane.dane import DANEConfig
from dane.errors import ConfigError
from dane.loop.launch import execute
from dane.loop.runner import run
from dane.loop.stopping import StopRule
from dane.problems.linear_models import LinearModelConfig
from dane.problems.neural import DataConfig
from dane.loop.spec import Communication, RunControl, RunSpec

M, ROUNDS, SEED = 4, 5, 3
LOGREG = LinearModelConfig(data=DataConfig(dataset="breast_cancer"), loss="logistic", name="logreg", lam=1e-2, seed=0)
D = 30  # breast_cancer's features, no intercept
METRICS = 1  # the objective rides with the gradient (float64): in the bytes, not in the bits (the run's measurement)
COST = AlphaBeta(alpha=1e-4, beta=1e8)


@pytest.fixture(scope="module")
def shards():
    LOGREG.prepare()
    return [LOGREG.build(rank, M) for rank in range(M)]


def fit(algorithm, rounds=ROUNDS, compress=None, compress_down=None, error_feedback=False):
    spec = RunSpec(problem=LOGREG, algorithm=algorithm,
                   comm=Communication(backend="local", workers=M, compress=compress, compress_down=compress_down,
                                      error_feedback=error_feedback, cost=COST),
                   control=RunControl(stop=StopRule(rounds=rounds), quiet=True, progress="none", seed=SEED))
    collected: dict = {}
    summary = execute(spec, None, collect=collected)
    return collected["records"], summary


def compressed_iterates(config, shards, up: str, down: str, error_feedback=False):
    """Every worker's iterates w_0..w_T on the per-worker simulator, comm.compress=up and comm.compress_down=down
    installed as `dane.loop.worker.run_worker` installs them."""

    def worker(comm):
        comm.use_compression(MessageCompression(make(up), config.algorithm.compressible, seed=SEED, rank=comm.rank,
                                                error_feedback=error_feedback, downlink=make(down)))
        algo = config.build(shards[comm.rank], comm)
        iterates = [algo.iterate.clone()]
        records, _ = run(algo, StopRule(rounds=ROUNDS), lambda record: iterates.append(algo.iterate.clone()))
        return iterates[: len(records)]

    return ThreadGroup(len(shards)).run(worker)


def gradient(shard, w):
    return shard.evaluate(torch.from_numpy(w))[0].numpy()


def without(records, *drop):
    return [{k: v for k, v in r.items() if k not in drop} for r in records]


# ------------------------------------------------------------------ no downlink compressor: as before
def test_the_identity_downlink_is_the_dense_reply_and_prices_it_as_before():
    plain, plain_summary = fit(GDConfig(lr=0.3), compress="none")
    down, summary = fit(GDConfig(lr=0.3), compress="none", compress_down="none")
    assert without(down, "time_s") == without(plain, "time_s")  # bits, bytes, iterates: all the same
    per_round = 64 * D  # the mean gradient; the objective riding along is not counted
    assert [r["downlink_bits"] for r in down] == [t * per_round for t in range(ROUNDS + 1)]
    assert summary["compression"] == {**plain_summary["compression"], "compress_down": "none"}
    # the two-halves charge of equal halves is the ring's charge of one message (to round-off)
    assert summary["simulated_comm_s"] == pytest.approx(plain_summary["simulated_comm_s"], rel=1e-14)
    # a compressed uplink with the dense reply named: each half at its own size (without compress_down the ring
    # prices the reply at the uplink's compressed size, as before)
    ef, _ = fit(GDConfig(lr=0.3), compress="topk:4", compress_down="none", error_feedback=True, rounds=1)
    up_bytes = math.ceil(4 * 69 / 8) + 8 * METRICS
    assert ef[1]["bytes_sent"] == (M - 1) * (up_bytes + 8 * (D + METRICS)) // M


def test_the_cost_models_charge_each_direction_at_its_size():
    up, down, m = 1000, 200, 4
    assert COST.allreduce_time(up, m, down) == 3 / 4 * 1200 / 1e8 + 6 * 1e-4
    assert COST.allreduce_time(up, m, up) == pytest.approx(COST.allreduce_time(up, m), rel=1e-15)
    assert COST.allreduce_time(up, 1, down) == 0.0
    ps = ParameterServerCost(alpha=1e-4, beta=1e8, gamma=1e9, servers=2)
    assert ps.allreduce_time(up, m, down) == pytest.approx(m * (2e-4 + (500 + 100) / 1e8) + m * 500 / 1e9, rel=1e-15)
    assert ps.allreduce_time(up, m, up) == pytest.approx(ps.allreduce_time(up, m), rel=1e-15)


# ------------------------------------------------------------------ bits and bytes, by hand
def test_downlink_bits_bytes_and_time_are_the_hand_counts():
    k = 4
    records, summary = fit(GDConfig(lr=0.3), compress="none", compress_down=f"topk:{k}")
    up, down = 64 * D, k * (64 + 5)  # TopK: k (value, index) pairs, ⌈log₂ 30⌉ = 5; the metrics uncounted
    assert [r["uplink_bits"] for r in records] == [t * up for t in range(ROUNDS + 1)]
    assert [r["downlink_bits"] for r in records] == [t * down for t in range(ROUNDS + 1)]
    assert summary["uplink_bits"] == ROUNDS * up and summary["downlink_bits"] == ROUNDS * down
    up_bytes, down_bytes = 8 * (D + METRICS), math.ceil(k * 69 / 8) + 8 * METRICS
    assert records[1]["bytes_sent"] == (M - 1) * (up_bytes + down_bytes) // M  # reduce-scatter up, allgather down
    final = COST.allreduce_time(up_bytes, M, up_bytes)  # the last iterate's metrics: no compressible kind, dense
    assert summary["simulated_comm_s"] == pytest.approx(ROUNDS * COST.allreduce_time(up_bytes, M, down_bytes) + final,
                                                        rel=1e-12)
    assert summary["compression"]["compress_down"] == f"topk:{k}"
    records, _ = fit(GDConfig(lr=0.3), compress="randk:3", compress_down="natural", rounds=2)
    assert records[-1]["uplink_bits"] == 2 * 64 * 3      # RandK: values only
    assert records[-1]["downlink_bits"] == 2 * 12 * D    # sign and 11 exponent bits an entry


def test_dane_compresses_the_mean_gradient_down_and_sends_the_averaged_iterate_exactly():
    k = 6
    records, _ = fit(DANEConfig(mu=0.0), rounds=2, compress="none", compress_down=f"topk:{k}")
    # round 1: the gradient down as topk, beside the safeguard's objective and statistic (DANE reads them: counted);
    # round 2: the averaged iterate dense.  Count each round's reply against the uplink's dense size.
    per_round_up = records[1]["uplink_bits"]
    per_round_down = records[1]["downlink_bits"]
    assert per_round_up - per_round_down == 64 * D - k * (64 + 5)  # the gradient's slot alone is compressed
    assert records[2]["downlink_bits"] == 2 * per_round_down


# ------------------------------------------------------------------ iterates: a NumPy transcription, every worker alike
def test_gd_with_a_topk_downlink_is_its_numpy_transcription_on_every_worker(shards):
    k, lr = 4, 0.3
    w, out = np.zeros(D), []
    for _ in range(ROUNDS):
        out.append(w.copy())
        g = np.mean([gradient(s, w) for s in shards], axis=0)
        keep = np.argsort(-np.abs(g), kind="stable")[:k]
        step = np.zeros(D)
        step[keep] = g[keep]                                         # the server sends TopK(mean ∇O_i(w))
        w = w - lr * step
    per_worker = compressed_iterates(GDConfig(lr=lr), shards, "none", f"topk:{k}")
    for ws in per_worker:
        np.testing.assert_allclose(np.stack([t.numpy() for t in ws[:ROUNDS]]), np.stack(out), rtol=0, atol=1e-14)


def test_a_random_downlink_draws_from_the_server_stream_that_every_worker_holds(shards):
    k, lr = 5, 0.2
    server = torch.Generator().manual_seed(downlink_seed(SEED))
    w, out = np.zeros(D), []
    for _ in range(ROUNDS):
        out.append(w.copy())
        g = np.mean([gradient(s, w) for s in shards], axis=0)
        idx = torch.randperm(D, generator=server)[:k].numpy()
        step = np.zeros(D)
        step[idx] = g[idx] * (D / k)                                 # RandK(mean), its indices from the server's seed
        w = w - lr * step
    per_worker = compressed_iterates(GDConfig(lr=lr), shards, "none", f"randk:{k}")
    for ws in per_worker:  # each worker decodes the same reply
        np.testing.assert_allclose(np.stack([t.numpy() for t in ws[:ROUNDS]]), np.stack(out), rtol=0, atol=1e-14)


def test_error_feedback_at_the_server_is_ef21_on_the_mean(shards):
    k, lr = 4, 0.3
    w, v, out = np.zeros(D), np.zeros(D), []
    for _ in range(ROUNDS):
        out.append(w.copy())
        g = np.mean([gradient(s, w) for s in shards], axis=0)
        diff = g - v
        keep = np.argsort(-np.abs(diff), kind="stable")[:k]
        v[keep] += diff[keep]                                        # v ← v + TopK(mean − v)
        w = w - lr * v
    (ws, *_) = compressed_iterates(GDConfig(lr=lr), shards, "none", f"topk:{k}", error_feedback=True)
    np.testing.assert_allclose(np.stack([t.numpy() for t in ws[:ROUNDS]]), np.stack(out), rtol=0, atol=1e-14)


def test_the_server_stream_is_the_seeds_alone_and_is_checkpointed():
    a = MessageCompression(Identity(), ("gradient",), seed=7, rank=0, downlink=RandK(k=3))
    b = MessageCompression(Identity(), ("gradient",), seed=7, rank=5, downlink=RandK(k=3))
    mean = torch.linspace(-1, 1, 12, dtype=torch.float64)
    assert torch.equal(a.decode_down([mean], ["gradient"])[0], b.decode_down([mean], ["gradient"])[0])
    state = a.state_dict()
    after = a.decode_down([mean], ["gradient"])[0]
    b.load_state_dict(state)
    assert torch.equal(b.decode_down([mean], ["gradient"])[0], after)
    ef = MessageCompression(Identity(), ("gradient",), error_feedback=True, downlink=TopK(k=2))
    ef.decode_down([mean], ["gradient"])
    again = MessageCompression(Identity(), ("gradient",), error_feedback=True, downlink=TopK(k=2))
    again.load_state_dict(ef.state_dict())
    assert isinstance(again.feedback["down.gradient.0"].compressor, TopK)
    assert torch.equal(again.feedback["down.gradient.0"].g, ef.feedback["down.gradient.0"].g)


# ------------------------------------------------------------------ refusals, one line each
def test_a_downlink_compressor_is_refused_where_it_does_not_apply():
    with pytest.raises(ConfigError, match="comm.compress_down=topk:4 needs comm.compress set.*comm.compress=none"):
        Communication(compress_down="topk:4")
    with pytest.raises(ConfigError, match="comm.compress_down=rank:1 compresses d×d matrices"):
        Communication(compress="none", compress_down="rank:1")
    with pytest.raises(ConfigError, match="comm.compress_down=topk:x"):
        Communication(compress="none", compress_down="topk:x")
    with pytest.raises(ConfigError, match="declares no message safe to compress .*; set comm.compress_down=none or "
                                          "null, or use"):  # the key that compresses, not comm.compress=none
        RunSpec(problem=LOGREG, algorithm=ADMMConfig(), comm=Communication(compress="none", compress_down="topk:4"))
    RunSpec(problem=LOGREG, algorithm=ADMMConfig(), comm=Communication(compress="none", compress_down="none"))
    with pytest.raises(ConfigError, match="compresses its own messages"):
        RunSpec(problem=LOGREG, algorithm=DIANAConfig(), comm=Communication(compress="none", compress_down="topk:4"))
