"""EF21-P with an EF21 uplink (baselines/ef21p.py): GD and EF21 where the compressors are the identity, a NumPy
transcription of its rounds with TopK both ways and with the server's RandK, hand-counted bits both ways, its
resolved step in the summary, and a checkpoint that goes on as if never stopped."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dane.baselines.defaults import ef21_step, ef21p_step
from dane.baselines.ef21 import EF21Config
from dane.baselines.ef21p import EF21PConfig
from dane.baselines.gd import GDConfig
from dane.comm import AlphaBeta
from dane.comm.compression import downlink_seed
from dane.errors import ConfigError
from dane.loop.launch import execute
from dane.loop.stopping import StopRule
from dane.problems.linear_models import LinearModelConfig
from dane.problems.neural import DataConfig
from dane.loop.spec import Communication, RunControl, RunSpec
from helpers import simulate, straight_and_resumed

M, ROUNDS, SEED = 4, 5, 3
LOGREG = LinearModelConfig(data=DataConfig(dataset="breast_cancer"), loss="logistic", name="logreg", lam=1e-2, seed=0)
D = 30  # breast_cancer's features, no intercept
COST = AlphaBeta(alpha=1e-4, beta=1e8)


@pytest.fixture(scope="module")
def shards():
    LOGREG.prepare()
    return [LOGREG.build(rank, M) for rank in range(M)]


def iterates(config, shards):
    """Every worker's iterates w_0..w_{T-1} on the per-worker simulator."""
    return [[w.numpy() for w in ws[:ROUNDS]] for _, _, ws in simulate(config, shards, ROUNDS)]


def fit(algorithm, rounds=ROUNDS):
    spec = RunSpec(problem=LOGREG, algorithm=algorithm, comm=Communication(backend="local", workers=M, cost=COST),
                   control=RunControl(stop=StopRule(rounds=rounds), quiet=True, progress="none", seed=SEED))
    collected: dict = {}
    summary = execute(spec, None, collect=collected)
    return collected["records"], summary


def gradient(shard, w):
    return shard.evaluate(torch.from_numpy(w))[0].numpy()


def topk(x, k):
    keep = np.argsort(-np.abs(x), kind="stable")[:k]
    out = np.zeros_like(x)
    out[keep] = x[keep]
    return out


def test_with_the_identity_both_ways_it_is_gd_and_with_an_exact_downlink_it_is_ef21(shards):
    gd = iterates(GDConfig(lr=0.3), shards)[0]
    for w, reference in zip(iterates(EF21PConfig(compressor="none", compressor_down="none", lr=0.3), shards)[0], gd,
                            strict=True):
        np.testing.assert_allclose(w, reference, rtol=0, atol=1e-14)  # w = x to round-off: GD's iterates
    ef21 = iterates(EF21Config(compressor="topk:4", lr=0.3), shards)[0]
    for w, reference in zip(iterates(EF21PConfig(compressor="topk:4", compressor_down="none", lr=0.3), shards)[0],
                            ef21, strict=True):
        np.testing.assert_allclose(w, reference, rtol=0, atol=1e-14)


def test_equals_its_numpy_transcription_with_topk_both_ways_on_every_worker(shards):
    k, kp, lr = 4, 6, 0.3
    x, w, g_i, out = np.zeros(D), np.zeros(D), np.zeros((M, D)), []
    for _ in range(ROUNDS):
        out.append(w.copy())
        for i in range(M):
            g_i[i] += topk(gradient(shards[i], w) - g_i[i], k)       # g_i ← g_i + C(∇O_i(w) − g_i)
        x = x - lr * g_i.mean(0)                                     # server: x ← x − γ g
        w = w + topk(x - w, kp)                                      # w ← w + C_P(x − w)
    for ws in iterates(EF21PConfig(compressor=f"topk:{k}", compressor_down=f"topk:{kp}", lr=lr), shards):
        np.testing.assert_allclose(np.stack(ws), np.stack(out), rtol=0, atol=1e-14)


def test_the_randk_downlink_draws_from_the_server_stream_scaled_as_ef21_scales_it(shards):
    k, kp, lr = 4, 10, 0.2
    server = torch.Generator().manual_seed(downlink_seed(0))  # the config's seed, 0
    x, w, g_i, out = np.zeros(D), np.zeros(D), np.zeros((M, D)), []
    for _ in range(ROUNDS):
        out.append(w.copy())
        for i in range(M):
            g_i[i] += topk(gradient(shards[i], w) - g_i[i], k)
        x = x - lr * g_i.mean(0)
        idx = torch.randperm(D, generator=server)[:kp].numpy()
        s = np.zeros(D)
        s[idx] = (x - w)[idx] * (D / kp)
        w = w + s / (D / kp)                                         # C_P/(ω + 1), ω = D/kp − 1
    for ws in iterates(EF21PConfig(compressor=f"topk:{k}", compressor_down=f"randk:{kp}", lr=lr), shards):
        np.testing.assert_allclose(np.stack(ws), np.stack(out), rtol=0, atol=1e-14)


def test_bits_both_ways_are_the_hand_counts_and_the_cost_charges_each():
    k, kp = 4, 6
    records, summary = fit(EF21PConfig(compressor=f"topk:{k}", compressor_down=f"topk:{kp}", lr=0.3))
    up, down = k * (64 + 5), kp * (64 + 5)  # ⌈log₂ 30⌉ = 5 bits an index; the logged metric rides uncounted
    assert [r["uplink_bits"] for r in records] == [t * up for t in range(ROUNDS + 1)]
    assert [r["downlink_bits"] for r in records] == [t * down for t in range(ROUNDS + 1)]
    assert summary["uplink_bits"] == ROUNDS * up and summary["downlink_bits"] == ROUNDS * down
    assert summary["compression"] == {"compress": f"topk:{k}", "error_feedback": True,
                                      "compressed_messages": ["gradient"], "compress_down": f"topk:{kp}"}
    up_bytes, down_bytes = math.ceil(k * 69 / 8) + 8, math.ceil(kp * 69 / 8) + 8  # the metric's 8 bytes priced
    assert records[1]["bytes_sent"] == (M - 1) * (up_bytes + down_bytes) // M
    final = COST.allreduce_time(8 * (D + 1), M, 8 * (D + 1))  # the last iterate's metrics, dense both ways
    assert summary["simulated_comm_s"] == pytest.approx(ROUNDS * COST.allreduce_time(up_bytes, M, down_bytes) + final,
                                                        rel=1e-12)


def test_the_resolved_step_is_the_rule_of_the_measured_constants_and_lands_in_the_summary():
    _, summary = fit(EF21PConfig(compressor="topk:3", compressor_down="topk:15"), rounds=1)
    (entry,) = summary["defaults"]
    stats = entry["stats"]
    assert entry["key"] == "algorithm.lr" and entry["rule"] == "ef21p_step"
    assert stats["delta"] == 0.1 and stats["delta_down"] == 0.5
    assert entry["value"] == ef21p_step(stats["smoothness"], stats["smoothness_rms"], 0.1, 0.5)
    uplink, downlink = ef21_step(stats["smoothness"], stats["smoothness_rms"], 0.1), 0.5 / (16 * stats["smoothness"])
    assert entry["value"] == min(uplink, downlink)  # EF21's step at δ, Theorem D.1's α/(16L) at δ_P
    assert ef21p_step(2.0, 3.0, 0.75, 1.0) == ef21_step(2.0, 3.0, 0.75) == 0.2  # an exact downlink: EF21's rule
    assert ef21p_step(2.0, 3.0, 1.0, 0.25) == 0.25 / 32  # an exact uplink: the paper's EF21-P, Theorem D.1


def test_the_default_step_of_an_exact_uplink_is_theorem_d1s_and_of_an_exact_downlink_efs():
    for compressor, compressor_down, expected in (("none", "topk:15", lambda s: 0.5 / (16 * s["smoothness"])),
                                                  ("topk:3", "none",
                                                   lambda s: ef21_step(s["smoothness"], s["smoothness_rms"], 0.1))):
        _, summary = fit(EF21PConfig(compressor=compressor, compressor_down=compressor_down), rounds=1)
        (entry,) = summary["defaults"]
        assert entry["value"] == expected(entry["stats"])


def test_checkpointed_ef21p_goes_on_as_if_never_stopped(shards):
    config = EF21PConfig(compressor="randk:5", compressor_down="randk:7", lr=0.2, seed=SEED)
    for straight, resumed, w_straight, w_resumed in straight_and_resumed(config, shards):
        assert straight == resumed and torch.equal(w_straight, w_resumed)


def test_bad_keys_and_comm_compress_are_refused():
    with pytest.raises(ConfigError, match="algorithm.compressor_down=rank:1 compresses d×d matrices"):
        EF21PConfig(compressor_down="rank:1")
    with pytest.raises(ConfigError, match="algorithm.compressor_down=topk:0"):
        EF21PConfig(compressor_down="topk:0")
    with pytest.raises(ConfigError, match="compresses its own messages.*set comm.compress=null"):
        RunSpec(problem=LOGREG, algorithm=EF21PConfig(), comm=Communication(compress="none", compress_down="none"))
