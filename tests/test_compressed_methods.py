"""DIANA, ADIANA, MARINA, DASHA and EF21 (baselines/diana.py, adiana.py, marina.py, dasha.py, ef21.py): each reduces
to GD (ADIANA to the accelerated gradient method) where its paper says so (DIANA, MARINA and DASHA, which stack, on
the batched simulator), each equals a NumPy transcription of its paper's algorithm on the per-worker simulator, GD
and the four that stack give the per-worker records on the batched simulator (equal ridge shards, and sparse rows in
unequal shards: the rows stacked), its bits are hand counts, the defaults a run resolves are its rules' values (the
rules by hand: test_default_rules.py), and comm.compress is
refused beside its own compressor."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from dane.baselines.adiana import ADIANAConfig
from dane.baselines.dasha import DASHAConfig
from dane.baselines.defaults import (adiana_beta, adiana_gamma, adiana_probability, adiana_step, adiana_theta1,
                                     dasha_momentum, dasha_step, diana_shift_step, diana_step)
from dane.baselines.diana import DIANAConfig
from dane.baselines.ef21 import EF21Config
from dane.baselines.ef21p import EF21PConfig
from dane.baselines.gd import GDConfig
from dane.baselines.marina import COIN_STREAM, MARINAConfig
from dane.comm.compression import compression_seed
from dane.comm.local import LocalCommunicator
from dane.errors import ConfigError
from dane.loop.batching import why_not_batched
from dane.loop.launch import execute
from dane.loop.stopping import StopRule
from dane.problems import RidgeSyntheticConfig
from dane.problems.arrays import LogReg
from dane.problems.linear_models import LinearModelConfig
from dane.problems.neural import DataConfig
from dane.loop.spec import Communication, RunControl, RunSpec
from helpers import simulate, simulate_stacked, straight_and_resumed
from test_fednl_batched import sparse_rows

M, ROUNDS, SEED = 4, 5, 3
LOGREG = LinearModelConfig(data=DataConfig(dataset="breast_cancer"), loss="logistic", name="logreg", lam=1e-2, seed=0)
D = 30  # breast_cancer's features, no intercept
RIDGE = RidgeSyntheticConfig(n_samples=400, dim=20, lam=0.05)  # equal shards: a stacked form
LOGREG_OPTIMUM = replace(LOGREG, optimum="auto")  # the same shards, with a reference optimum: suboptimality logged
METRICS = 1  # the objective rides with each message (float64): in bytes_sent, not in the bits (the run's measurement)


@pytest.fixture(scope="module")
def shards():
    LOGREG.prepare()
    return [LOGREG.build(rank, M) for rank in range(M)]


@pytest.fixture(scope="module")
def stacked():
    """RIDGE's M equal shards stacked: one computation for the M workers (`helpers.simulate_stacked`), for the
    identities between methods, where the per-worker path is not the point."""
    return RIDGE.build_stacked(M)


def iterates(config, shards, rounds=ROUNDS):
    """Worker 0's iterates w_0..w_T and records on the per-worker simulator (`helpers.simulate`), or on the batched
    one when ``shards`` is one stacked problem (`helpers.simulate_stacked`)."""
    run = simulate(config, shards, rounds) if isinstance(shards, list) else simulate_stacked(config, shards, rounds)
    _, records, ws = run[0]
    return ws, records


def fit(algorithm, rounds=ROUNDS, compress=None, error_feedback=False, problem=LOGREG, batched="auto"):
    """(records, summary) of ``algorithm`` on ``problem``'s M simulated workers."""
    spec = RunSpec(problem=problem, algorithm=algorithm,
                   comm=Communication(backend="local", workers=M, compress=compress, error_feedback=error_feedback,
                                      batched=batched),
                   control=RunControl(stop=StopRule(rounds=rounds), quiet=True, progress="none"))
    collected: dict = {}
    summary = execute(spec, None, collect=collected)
    return collected["records"], summary


# ------------------------------------------------------------------ each one GD where its paper says so
def test_diana_without_compression_is_gd_at_the_same_step(stacked):
    diana, _ = iterates(DIANAConfig(compressor="none", lr=0.3, alpha=1.0), stacked)
    gd, _ = iterates(GDConfig(lr=0.3), stacked)
    for a, b in zip(diana, gd, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-14)  # ĝ = h + (mean ∇ − h): GD's gradient to round-off


def test_marina_with_p_one_is_gd_bit_for_bit(stacked):
    marina, records = iterates(MARINAConfig(compressor="randk:3", p=1.0, lr=0.3), stacked)
    gd, gd_records = iterates(GDConfig(lr=0.3), stacked)
    assert all(torch.equal(a, b) for a, b in zip(marina, gd, strict=True))
    assert [r["full_round"] for r in records[:-1]] == [1.0] * ROUNDS
    assert [r["objective"] for r in records] == [r["objective"] for r in gd_records]


ADIANA_GIVEN = dict(lr=0.2, theta1=0.2, gamma=0.5, beta=0.9)  # every parameter given: no measurement


def accelerated(data, lr, theta1, gamma, beta, rounds=ROUNDS):
    """The deterministic accelerated method ADIANA is at ω = 0 and p = 1 (w^k = y^{k−1}, g^k = ∇f(x^k)): y^k."""
    y = z = w = np.zeros(D)
    out = []
    for _ in range(rounds):
        out.append(y.copy())
        x = theta1 * z + 0.5 * w + (0.5 - theta1) * y
        g = np.mean([gradient(parts, x) for parts in data], axis=0)
        y, w = x - lr * g, y
        z = beta * z + (1 - beta) * x - gamma * g
    return out


def test_adiana_without_compression_and_p_one_is_the_accelerated_gradient_method(shards):
    data = numpy_shards(shards)
    got, records = iterates(ADIANAConfig(compressor="none", p=1.0, alpha=1.0, **ADIANA_GIVEN), shards)
    reference = np.stack(accelerated(data, **ADIANA_GIVEN))
    np.testing.assert_allclose(np.stack([t.numpy() for t in got[:ROUNDS]]), reference, rtol=0, atol=1e-13)  # h + mean(∇O_i − h_i): the mean gradient to round-off
    assert [r["w_refreshed"] for r in records[:-1]] == [1.0] * ROUNDS


def test_dasha_without_compression_is_gd(stacked):
    dasha, _ = iterates(DASHAConfig(compressor="none", lr=0.3), stacked)  # a = 1/(2·0 + 1) = 1
    gd, _ = iterates(GDConfig(lr=0.3), stacked)
    for a, b in zip(dasha, gd, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-14)  # g + mean(∇O_i − g_i): GD's gradient to round-off


def test_ef21_without_compression_is_gd(shards):
    ef21, _ = iterates(EF21Config(compressor="none", lr=0.3), shards)
    gd, _ = iterates(GDConfig(lr=0.3), shards)
    for a, b in zip(ef21, gd, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-14)  # g_i + (∇O_i − g_i)


def test_ef21_the_method_is_gd_with_the_ef21_option():
    method, method_summary = fit(EF21Config(compressor="topk:4", lr=0.3))
    option, option_summary = fit(GDConfig(lr=0.3), compress="topk:4", error_feedback=True)
    drop = ("time_s",)
    assert [{k: v for k, v in r.items() if k not in drop} for r in method] == \
        [{k: v for k, v in r.items() if k not in drop} for r in option]
    assert method_summary["compression"] == option_summary["compression"]
    assert method_summary["defaults"] == option_summary["defaults"] == []  # every number given


# ------------------------------------------------------------------ NumPy transcriptions of the papers' algorithms
def numpy_shards(shards):
    """(X_i, y_i, weight_i, λ) per worker, and the reference gradient checked against the package's at one point."""
    data = [(s.X.numpy(), s.y.numpy(), s.weight, s.l2) for s in shards]
    w = np.linspace(-0.3, 0.3, D)
    for shard, parts in zip(shards, data):
        np.testing.assert_allclose(gradient(parts, w), shard.evaluate(torch.from_numpy(w))[0].numpy(), rtol=1e-13)
    return data


def gradient(parts, w):
    """∇O_i(w) = weight Xᵀ(−y σ(−y Xw)) + λw, the logistic loss with ±1 labels."""
    X, y, weight, lam = parts
    z = X @ w
    return weight * X.T @ (-y / (1 + np.exp(y * z))) + lam * w


def randk(x, k, generator):
    """RandK as the package draws it: the first k of a permutation from the worker's stream, scaled d/k."""
    idx = torch.randperm(len(x), generator=generator)[:k].numpy()
    out = np.zeros_like(x)
    out[idx] = x[idx] * (len(x) / k)
    return out


def streams():
    return [torch.Generator().manual_seed(compression_seed(SEED, rank)) for rank in range(M)]


def test_diana_equals_its_numpy_transcription_with_seeded_randk(shards):
    data, k, lr, alpha = numpy_shards(shards), 5, 0.2, 0.1
    w, h, h_i, gens, out = np.zeros(D), np.zeros(D), np.zeros((M, D)), streams(), []
    for _ in range(ROUNDS):
        out.append(w.copy())
        deltas = np.stack([randk(gradient(data[i], w) - h_i[i], k, gens[i]) for i in range(M)])
        h_i += alpha * deltas
        g = h + deltas.mean(0)
        h = h + alpha * deltas.mean(0)
        w = w - lr * g
    got, _ = iterates(DIANAConfig(compressor=f"randk:{k}", lr=lr, alpha=alpha, seed=SEED), shards)
    np.testing.assert_allclose(np.stack([t.numpy() for t in got[:ROUNDS]]), np.stack(out), rtol=0, atol=1e-13)


def test_marina_equals_its_numpy_transcription_with_seeded_randk_and_the_shared_coin(shards):
    data, k, lr, p = numpy_shards(shards), 5, 0.2, 0.4
    coin = np.random.default_rng(np.random.SeedSequence([SEED, COIN_STREAM]))
    w, gens, out, flips = np.zeros(D), streams(), [], []
    grads = np.stack([gradient(data[i], w) for i in range(M)])
    g = grads.mean(0)                                             # g⁰ = ∇f(x⁰)
    for _ in range(ROUNDS):
        out.append(w.copy())
        w_next = w - lr * g                                       # x^{k+1} = x^k − γ g^k
        full = coin.random() < p                                  # c_k
        flips.append(float(full))
        new = np.stack([gradient(data[i], w_next) for i in range(M)])
        g = new.mean(0) if full else g + np.stack([randk(new[i] - grads[i], k, gens[i]) for i in range(M)]).mean(0)
        w, grads = w_next, new
    got, records = iterates(MARINAConfig(compressor=f"randk:{k}", lr=lr, p=p, seed=SEED), shards)
    np.testing.assert_allclose(np.stack([t.numpy() for t in got[:ROUNDS]]), np.stack(out), rtol=0, atol=1e-13)
    assert [r["full_round"] for r in records[1:ROUNDS]] == flips[:ROUNDS - 1]  # record k carries c_{k-1}
    assert 0 < sum(flips) < ROUNDS  # both kinds of round happen here


def test_adiana_equals_its_numpy_transcription_with_seeded_randk_and_the_shared_coin(shards):
    """Li et al. 2020's ADIANA line by line, h_i⁰ = 0; Q(∇f_i(x^k) − h_i) drawn before Q(∇f_i(w^k) − h_i)."""
    data, k, lr, p, alpha, theta1, theta2, gamma, beta = numpy_shards(shards), 5, 0.2, 0.4, 0.1, 0.2, 0.5, 0.5, 0.9
    coin = np.random.default_rng(np.random.SeedSequence([SEED, COIN_STREAM]))
    y, z, w, h, h_i, gens, out, flips = np.zeros(D), np.zeros(D), np.zeros(D), np.zeros(D), np.zeros((M, D)), \
        streams(), [], []
    for _ in range(ROUNDS):
        out.append(y.copy())
        x = theta1 * z + theta2 * w + (1 - theta1 - theta2) * y
        deltas, deltas_w = np.zeros((M, D)), np.zeros((M, D))
        for i in range(M):
            deltas[i] = randk(gradient(data[i], x) - h_i[i], k, gens[i])
            deltas_w[i] = randk(gradient(data[i], w) - h_i[i], k, gens[i])
            h_i[i] += alpha * deltas_w[i]
        g = deltas.mean(0) + h
        h = h + alpha * deltas_w.mean(0)
        y_next = x - lr * g
        z = beta * z + (1 - beta) * x + (gamma / lr) * (y_next - x)
        refresh = coin.random() < p
        flips.append(float(refresh))
        w = y if refresh else w                                   # w^{k+1} = y^k with probability p
        y = y_next
    got, records = iterates(ADIANAConfig(compressor=f"randk:{k}", lr=lr, p=p, alpha=alpha, theta1=theta1,
                                         gamma=gamma, beta=beta, seed=SEED), shards)
    np.testing.assert_allclose(np.stack([t.numpy() for t in got[:ROUNDS]]), np.stack(out), rtol=0, atol=1e-13)
    assert [r["w_refreshed"] for r in records[:ROUNDS]] == flips
    assert 0 < sum(flips) < ROUNDS  # both kinds of round happen here


def test_dasha_equals_its_numpy_transcription_with_seeded_randk(shards):
    """Tyurin & Richtárik's Algorithm 1 (gradient setting), g_i⁰ = h_i⁰ = ∇f_i(x⁰)."""
    data, k, lr, a = numpy_shards(shards), 5, 0.2, 0.3
    x, gens, out = np.zeros(D), streams(), []
    h_i = np.stack([gradient(data[i], x) for i in range(M)])
    g_i = h_i.copy()
    g = g_i.mean(0)
    for _ in range(ROUNDS):
        out.append(x.copy())
        x = x - lr * g                                            # x^{t+1} = x^t − γ g^t
        h_next = np.stack([gradient(data[i], x) for i in range(M)])
        m_i = np.stack([randk(h_next[i] - h_i[i] - a * (g_i[i] - h_i[i]), k, gens[i]) for i in range(M)])
        g_i, h_i, g = g_i + m_i, h_next, g + m_i.mean(0)
    got, _ = iterates(DASHAConfig(compressor=f"randk:{k}", lr=lr, momentum=a, seed=SEED), shards)
    np.testing.assert_allclose(np.stack([t.numpy() for t in got[:ROUNDS]]), np.stack(out), rtol=0, atol=1e-13)


def test_ef21_equals_its_numpy_transcription_with_topk(shards):
    data, k, lr = numpy_shards(shards), 4, 0.3
    w, g_i, out = np.zeros(D), np.zeros((M, D)), []
    for _ in range(ROUNDS):
        out.append(w.copy())
        for i in range(M):
            diff = gradient(data[i], w) - g_i[i]
            keep = np.argsort(-np.abs(diff), kind="stable")[:k]
            c = np.zeros(D)
            c[keep] = diff[keep]
            g_i[i] += c                                           # g_i ← g_i + C(∇f_i(x) − g_i)
        w = w - lr * g_i.mean(0)
    got, _ = iterates(EF21Config(compressor=f"topk:{k}", lr=lr), shards)
    np.testing.assert_allclose(np.stack([t.numpy() for t in got[:ROUNDS]]), np.stack(out), rtol=0, atol=1e-13)


@pytest.mark.parametrize("path", ["threads", "batched"])
def test_checkpointed_diana_and_marina_go_on_as_if_never_stopped(path, shards, stacked):
    """On the batched simulator the state holds every worker's compression stream (`baselines.diana.streams_state`),
    on a worker's own path the counter's (`Algorithm.state_dict`): the resumed draws are the straight run's."""
    for config in (DIANAConfig(compressor="randk:5", lr=0.2, seed=SEED),
                   MARINAConfig(compressor="randk:5", lr=0.2, p=0.4, seed=SEED),
                   ADIANAConfig(compressor="randk:5", p=0.4, seed=SEED, **ADIANA_GIVEN),
                   DASHAConfig(compressor="randk:5", lr=0.2, seed=SEED)):
        for straight, resumed, w_straight, w_resumed in straight_and_resumed(
                config, shards if path == "threads" else stacked):
            assert straight == resumed and torch.equal(w_straight, w_resumed)


# ------------------------------------------------------------------ bits, by hand
def test_bits_per_message_are_the_hand_counts():
    """The papers' counts: each method's message alone.  The logged objective rides the same allreduce but is the
    run's measurement (`dane.comm.compression.METRICS`), in no bit count (it was, 64 bits a metric, before)."""
    k = 5
    down = 64 * D  # a dense d-vector
    records, summary = fit(DIANAConfig(compressor=f"randk:{k}", lr=0.2))
    assert [r["uplink_bits"] for r in records] == [t * 64 * k for t in range(ROUNDS + 1)]  # Δ_i's values only
    assert [r["downlink_bits"] for r in records] == [t * down for t in range(ROUNDS + 1)]  # ĝ dense
    assert summary["uplink_bits"] == ROUNDS * 64 * k
    # bytes_sent still prices the metric (it is on the wire): the ring's share of ⌈64k/8⌉ + 8 bytes
    assert records[1]["bytes_sent"] == 2 * (M - 1) * (8 * k + 8 * METRICS) // M
    records, _ = fit(EF21Config(compressor=f"topk:{k}", lr=0.2))
    up = k * (64 + 5)  # k (value, index) pairs, ⌈log₂ 30⌉ = 5 bits an index
    assert [r["uplink_bits"] for r in records] == [t * up for t in range(ROUNDS + 1)]
    records, _ = fit(MARINAConfig(compressor=f"randk:{k}", lr=0.2, p=0.4, seed=0), rounds=8)
    flags = [r["full_round"] for r in records[:-1]]
    assert 0 < sum(flags[1:]) < 7 and flags[0] == 1.0  # round 0 is full; later ones by the coin
    sent = np.cumsum([0] + [64 * D if full else 64 * k for full in flags])
    assert [r["uplink_bits"] for r in records] == sent.tolist()
    records, _ = fit(ADIANAConfig(compressor=f"randk:{k}", p=0.4, **ADIANA_GIVEN))
    assert [r["uplink_bits"] for r in records] == [t * 2 * 64 * k for t in range(ROUNDS + 1)]
    assert [r["downlink_bits"] for r in records] == [t * 64 * 2 * D for t in range(ROUNDS + 1)]
    records, _ = fit(DASHAConfig(compressor=f"randk:{k}", lr=0.2))
    first = 64 * D                                                # round 0: the full gradient
    assert [r["uplink_bits"] for r in records] == [0] + [first + t * 64 * k for t in range(ROUNDS)]
    assert [r["downlink_bits"] for r in records] == [t * down for t in range(ROUNDS + 1)]
    records, _ = fit(DIANAConfig(compressor="natural", lr=0.2), rounds=2)
    assert records[-1]["uplink_bits"] == 2 * 12 * D  # sign and 11 exponent bits an entry


#: each method uncompressed, with its bits a round per worker, up and down, as docs/federated.md states them
#: ("Compressed first-order methods"): one dense d-vector each way, two for ADIANA
UNCOMPRESSED = {
    "diana": (DIANAConfig(compressor="none", lr=0.2), {}, 64 * D, 64 * D),
    "adiana": (ADIANAConfig(compressor="none", p=0.4, **ADIANA_GIVEN), {}, 2 * 64 * D, 2 * 64 * D),
    "marina": (MARINAConfig(compressor="none", lr=0.2, p=0.4), {}, 64 * D, 64 * D),
    "dasha": (DASHAConfig(compressor="none", lr=0.2), {}, 64 * D, 64 * D),
    "ef21p": (EF21PConfig(compressor="none", compressor_down="none", lr=0.2), {}, 64 * D, 64 * D),
    "gd": (GDConfig(lr=0.2), {"compress": "none"}, 64 * D, 64 * D),
}


@pytest.mark.parametrize("name", UNCOMPRESSED)
def test_uncompressed_bits_are_the_closed_forms_and_measuring_changes_none(name):
    """Per round per worker the method's message alone; the same records with a reference optimum (one logged metric
    more, suboptimality) as without: what a run measures does not change what its method is charged."""
    config, keys, up, down = UNCOMPRESSED[name]
    records, _ = fit(config, rounds=3, **keys)
    measured, _ = fit(config, rounds=3, problem=LOGREG_OPTIMUM, **keys)
    assert "suboptimality" in measured[0] and "suboptimality" not in records[0]
    assert [r["uplink_bits"] for r in records] == [t * up for t in range(4)]
    assert [r["downlink_bits"] for r in records] == [t * down for t in range(4)]
    for key in ("uplink_bits", "downlink_bits"):
        assert [r[key] for r in measured] == [r[key] for r in records]
    # the metrics are on the wire: bytes_sent carries the second one, 8 bytes a round at the ring's share each way
    assert measured[1]["bytes_sent"] - records[1]["bytes_sent"] == 2 * (M - 1) * 8 // M


def test_diana_charges_its_compressed_difference_alone_with_or_without_a_reference_optimum():
    """The reviewer's case: DIANA randk:K sends Q(∇O_i − h_i), 64 K bits a round, and the server ĝ, 64 d, whether
    the records carry suboptimality or not (before, 64 bits more per logged metric each way)."""
    k = 3
    for problem in (LOGREG, LOGREG_OPTIMUM):
        records, _ = fit(DIANAConfig(compressor=f"randk:{k}", lr=0.2), rounds=3, problem=problem)
        assert [r["uplink_bits"] for r in records] == [t * 64 * k for t in range(4)]
        assert [r["downlink_bits"] for r in records] == [t * 64 * D for t in range(4)]


# ------------------------------------------------------------------ the defaults a run resolved (rules: test_default_rules.py)
def test_resolved_defaults_are_the_rules_of_the_measured_constants_and_land_in_the_summary():
    _, summary = fit(DIANAConfig(compressor="randk:3"), rounds=1)
    alpha, lr = summary["defaults"]
    assert alpha["key"] == "algorithm.alpha" and alpha["value"] == diana_shift_step(D / 3 - 1)
    stats = lr["stats"]
    assert lr["key"] == "algorithm.lr" and stats["workers"] == M and stats["omega"] == D / 3 - 1
    assert lr["value"] == diana_step(stats["smoothness"], stats["mu_low"], stats["omega"], M, stats["alpha"])
    assert stats["lanczos_exact"] is False and stats["mu_low"] == LOGREG.lam
    _, summary = fit(MARINAConfig(compressor="randk:3"), rounds=1)
    assert [(e["key"], e["rule"]) for e in summary["defaults"]] == [("algorithm.p", "marina_probability"),
                                                                   ("algorithm.lr", "marina_step")]
    assert summary["defaults"][0]["value"] == 0.1
    _, summary = fit(ADIANAConfig(compressor="randk:3"), rounds=1)
    found = {e["key"].split(".")[1]: e for e in summary["defaults"]}
    assert list(found) == ["alpha", "p", "lr", "mu", "theta1", "gamma", "beta"]  # the theorem's order
    value = {key: e["value"] for key, e in found.items()}
    omega, smoothness = D / 3 - 1, found["lr"]["stats"]["smoothness"]
    assert value["alpha"] == diana_shift_step(omega) and value["p"] == adiana_probability(omega, M)
    assert value["lr"] == adiana_step(smoothness, omega, M, value["p"])
    # μ̲ on the logistic loss is the ℓ2 weight: the Lanczos λ_min(H_i) there is the curvature majorant's, an upper bound
    assert value["mu"] == LOGREG.lam < found["mu"]["stats"]["mean_lowest"]
    assert found["mu"]["stats"]["lanczos_exact"] is False  # and the summary says why it was not read
    assert value["theta1"] == adiana_theta1(value["lr"], value["mu"], value["p"])
    assert value["gamma"] == adiana_gamma(value["lr"], value["mu"], value["theta1"])
    assert value["beta"] == adiana_beta(value["gamma"], value["mu"])
    _, summary = fit(ADIANAConfig(compressor="randk:3"), rounds=1, problem=RIDGE)
    (mu,) = [e for e in summary["defaults"] if e["key"] == "algorithm.mu"]
    assert mu["value"] == max(RIDGE.lam, mu["stats"]["mean_lowest"]) > RIDGE.lam  # a quadratic's: its Hessians' λ_min
    assert mu["stats"]["lanczos_exact"] is True
    _, summary = fit(DASHAConfig(compressor="randk:3"), rounds=1)
    momentum, lr = summary["defaults"]
    stats = lr["stats"]
    assert momentum["key"] == "algorithm.momentum" and momentum["value"] == dasha_momentum(D / 3 - 1)
    assert lr["value"] == dasha_step(stats["smoothness"], stats["smoothness_rms"], D / 3 - 1, M)
    _, summary = fit(EF21Config(compressor="topk:3"), rounds=1)
    (entry,) = summary["defaults"]
    assert entry["rule"] == "ef21_step" and entry["stats"]["delta"] == 0.1


# ------------------------------------------------------------------ refusals, one line each
def test_comm_compress_and_biased_compressors_are_refused():
    for algorithm in (DIANAConfig(), ADIANAConfig(), MARINAConfig(), DASHAConfig(), EF21Config()):
        with pytest.raises(ConfigError, match="compresses its own messages.*set comm.compress=null"):
            RunSpec(problem=LOGREG, algorithm=algorithm, comm=Communication(workers=M, compress="none"))
    with pytest.raises(ConfigError, match="algorithm=diana needs an unbiased compressor"):
        DIANAConfig(compressor="topk:3")
    with pytest.raises(ConfigError, match="algorithm=marina needs an unbiased compressor"):
        MARINAConfig(compressor="topk:3")
    with pytest.raises(ConfigError, match=r"algorithm.p must be in \(0, 1\]"):
        MARINAConfig(p=1.5)
    with pytest.raises(ConfigError, match="algorithm=adiana needs an unbiased compressor"):
        ADIANAConfig(compressor="topk:3")
    with pytest.raises(ConfigError, match=r"algorithm.theta1 must be in \(0, 0.5\]"):
        ADIANAConfig(theta1=0.6)
    with pytest.raises(ConfigError, match="algorithm=dasha needs an unbiased compressor"):
        DASHAConfig(compressor="topk:3")
    with pytest.raises(ConfigError, match=r"algorithm.momentum must be in \(0, 1\]"):
        DASHAConfig(momentum=0.0)
    with pytest.raises(ConfigError, match="d×d matrices"):
        EF21Config(compressor="rank:1")


def test_a_shift_step_above_the_bound_is_refused(shards):
    with pytest.raises(ConfigError, match=r"algorithm.alpha must be <= 1/\(omega \+ 1\)"):
        DIANAConfig(compressor="randk:3", alpha=0.5, lr=0.1).build(shards[0], LocalCommunicator())



def test_ef21_runs_one_thread_per_worker():
    """The batched communicator compresses nothing itself: EF21, GD's subclass, must not inherit GD's batched form."""
    spec = RunSpec(problem=LOGREG, algorithm=EF21Config(), comm=Communication(workers=64))
    assert why_not_batched(spec) == "algorithm=ef21 has no stacked form (its class does not declare batchable)"


def sparse_logreg() -> LogReg:
    """63 sparse rows in shards of 16, 16, 16 and 15, which the linear model's own stacked form refuses: the methods
    that ask only for gradients (and the defaults' Hessian products) run on the rows stacked
    (`dane.problems.stacked_rows.StackedRows`, ``stacked_needs = "gradients"``)."""
    return LogReg(*sparse_rows(n=63, d=7), lam=1e-3)


def on_both_paths(algorithm, problem=lambda: RIDGE) -> tuple[tuple[list[dict], dict], tuple[list[dict], dict]]:
    """`fit` on ``problem``'s make (called for each run; `RIDGE`, equal shards, by default) one thread per worker, then
    as one stacked computation."""
    return fit(algorithm, problem=problem(), batched="false"), fit(algorithm, problem=problem(), batched="true")


@pytest.mark.parametrize("problem", [lambda: RIDGE, sparse_logreg], ids=["ridge_equal_shards", "sparse_rows"])
@pytest.mark.parametrize("algorithm", [GDConfig(seed=SEED),
                                       DIANAConfig(compressor="randk:5", seed=SEED),
                                       DIANAConfig(compressor="natural", lr=0.05, seed=SEED),
                                       MARINAConfig(compressor="randk:5", p=0.4, seed=SEED),
                                       MARINAConfig(compressor="randk:5", p=0.4, clients_per_round=2, seed=SEED),
                                       ADIANAConfig(compressor="randk:5", p=0.4, seed=SEED),
                                       DASHAConfig(compressor="randk:5", seed=SEED)],
                         ids=["gd", "diana", "diana_natural", "marina", "pp_marina", "adiana", "dasha"])
def test_the_batched_simulator_gives_the_per_worker_records(algorithm, problem):
    """Each worker's Q from its own stream on both paths: the same draws, the same records to round-off (every key but
    time_s: floats to 1e-12 relative, the bit, byte, round and local-work counts exactly), the same defaults (GD's
    lr, L_est and mu_est with them), on equal shards of a ridge problem (its own stacked form) and on sparse rows in
    unequal shards (the rows stacked)."""
    (threads, per_worker), (stacked, batched) = on_both_paths(algorithm, problem)
    assert batched["simulator_path"] == "batched" and per_worker.get("compression") == batched.get("compression")
    assert len(threads) == len(stacked) == ROUNDS + 1
    for a, b in zip(threads, stacked, strict=True):
        assert a.keys() == b.keys() and {"bytes_sent", "comm_rounds", "local_passes"} <= a.keys()
        for key, value in a.items():
            if key != "time_s":
                exact = not isinstance(value, float) or key.startswith("local_")  # local work: counts, as floats
                assert b[key] == (value if exact else pytest.approx(value, rel=1e-12, abs=1e-15)), key
    assert [e["value"] for e in per_worker["defaults"]] == pytest.approx([e["value"] for e in batched["defaults"]],
                                                                         rel=1e-10)  # Lanczos, stacked or not


@pytest.mark.parametrize("method", ["diana", "adiana", "marina", "dasha", "ef21", "ef21p", "fednl", "fednl_bc",
                                    "newton_3pc"])
def test_a_bad_compressor_is_named_by_its_key(method):
    """Every method that takes ``algorithm.compressor`` names the key in a bad spec's line, as ``comm.compress``'s
    does (some named only the spec)."""
    from dane.api import algorithm_config

    with pytest.raises(ConfigError, match=r"^algorithm\.compressor=randk:0: randk:K needs K >= 1, got 0; write e\.g\. "
                                          r"randk:8$"):
        algorithm_config(method, compressor="randk:0")
