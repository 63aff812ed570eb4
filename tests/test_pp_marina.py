"""PP-MARINA (baselines/marina.py with algorithm.clients_per_round, Gorbunov et al. 2021, Algorithm 4): GD at p = 1
and r = m, a NumPy transcription of its sampled rounds with the sampler's and the workers' draws, its participants'
bits by hand, its defaults, its checkpoint, and the batched path against the per-worker one."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from dane.baselines.defaults import pp_marina_step
from dane.baselines.gd import GDConfig
from dane.baselines.marina import COIN_STREAM, MARINAConfig
from dane.compress import make
from dane.errors import ConfigError
from dane.sampling import sampler_seed
from helpers import straight_and_resumed
from test_compressed_methods import D, LOGREG, M, RIDGE, ROUNDS, SEED, fit, gradient, iterates, numpy_shards, \
    on_both_paths, randk, streams

R = 2  # clients a compressed round draws


@pytest.fixture(scope="module")
def shards():
    LOGREG.prepare()
    return [LOGREG.build(rank, M) for rank in range(M)]


def draws(seed, r=R):
    """The shared sampler's generator (`dane.sampling.sampler_seed`): I'_k = r i.i.d. uniform clients."""
    generator = torch.Generator().manual_seed(sampler_seed(seed))
    return lambda: torch.randint(M, (r,), generator=generator).numpy()


def test_pp_marina_with_every_client_and_p_one_is_gd_bit_for_bit(shards):
    marina, records = iterates(MARINAConfig(compressor="randk:3", p=1.0, lr=0.3, clients_per_round=M), shards)
    gd, gd_records = iterates(GDConfig(lr=0.3), shards)
    assert all(torch.equal(a, b) for a, b in zip(marina, gd, strict=True))
    assert [r["objective"] for r in records] == [r["objective"] for r in gd_records]
    assert [r["clients_uplink_bits"] for r in records] == [t * M * 64 * D for t in range(ROUNDS + 1)]  # to reach w_t


@pytest.mark.parametrize("r", [R, M])
def test_pp_marina_equals_its_numpy_transcription_with_the_sampler_and_seeded_randk(shards, r):
    """Algorithm 4 line by line: c_k from the shared coin; on c_k = 0, I'_k (with replacement) and
    g^{k+1} = g^k + (1/r) Σ_j Q_j(∇f_{i_j}(x^{k+1}) − ∇f_{i_j}(x^k)), one Q a draw, a client drawn twice drawing
    two in turn from its stream."""
    data, k, lr, p = numpy_shards(shards), 5, 0.2, 0.4
    coin = np.random.default_rng(np.random.SeedSequence([SEED, COIN_STREAM]))
    draw, w, gens, out, flips, drawn, repeated = draws(SEED, r), np.zeros(D), streams(), [], [], [], []
    grads = np.stack([gradient(data[i], w) for i in range(M)])
    g = grads.mean(0)
    for _ in range(ROUNDS):
        out.append(w.copy())
        w_next = w - lr * g
        full = coin.random() < p
        flips.append(float(full))
        new = np.stack([gradient(data[i], w_next) for i in range(M)])
        if full:
            g = new.mean(0)
        else:
            picks = draw()
            drawn.append(len(set(picks.tolist())))
            repeated.append(len(out) < ROUNDS and drawn[-1] < r)   # a repeat whose g moves w_{t+2}, t + 2 ≤ T
            g = g + sum(randk(new[i] - grads[i], k, gens[i]) for i in picks) / r
        w, grads = w_next, new
    out.append(w)                                                  # w_0..w_T, T = ROUNDS
    got, records = iterates(MARINAConfig(compressor=f"randk:{k}", lr=lr, p=p, seed=SEED, clients_per_round=r), shards)
    np.testing.assert_allclose(np.stack([t.numpy() for t in got]), np.stack(out), rtol=0, atol=1e-12)
    assert [record["full_round"] for record in records[1:ROUNDS]] == flips[:ROUNDS - 1]
    assert 0 < sum(flips) < ROUNDS  # both kinds of round happen here
    compressed = [record["clients"] for record in records[1:ROUNDS] if not record["full_round"]]
    assert compressed == drawn[:len(compressed)]
    assert any(repeated)  # a client drawn twice in a round whose iterate is compared


def test_a_sampled_round_sends_the_drawn_clients_bits_by_hand():
    k, rounds = 5, 8
    records, summary = fit(MARINAConfig(compressor=f"randk:{k}", lr=0.2, p=0.4, seed=0, clients_per_round=R),
                           rounds=rounds)
    flags, draw = [r["full_round"] for r in records[:-1]], draws(0)
    assert flags[0] == 1.0 and 0 < sum(flags[1:]) < rounds - 1
    picks = [None if full else draw().tolist() for full in flags]
    clients = [M if full else len(set(drawn)) for full, drawn in zip(flags, picks)]   # distinct clients that sent
    assert [r["clients"] for r in records[:-1]] == clients and R in clients[1:] and 1 in clients[1:]
    bits = np.cumsum([0] + [M * 64 * D if full else R * 64 * k for full in flags]).tolist()  # a message a draw
    assert [r["clients_uplink_bits"] for r in records] == bits  # record t: what reaching w_t cost
    assert [r["uplink_bytes"] for r in records] == [b // 8 for b in bits]
    assert [r["downlink_bytes"] for r in records] == [t * M * 8 * D for t in range(rounds + 1)]  # g_k to all
    assert summary["clients_uplink_bits"] == bits[-1] and records[-1]["clients"] == R
    plain, _ = fit(MARINAConfig(compressor=f"randk:{k}", lr=0.2, p=0.4, seed=0), rounds=2)
    assert "clients_uplink_bits" not in plain[-1] and "clients" not in plain[-1]  # MARINA's records as before


def test_pp_marina_defaults_are_its_theorem_rules():
    _, summary = fit(MARINAConfig(compressor="randk:3", clients_per_round=R), rounds=1)
    p, lr = summary["defaults"]
    assert (p["rule"], lr["rule"]) == ("pp_marina_probability", "pp_marina_step")
    assert p["value"] == 3 * R / (D * M)
    stats, omega = lr["stats"], D / 3 - 1
    assert stats["omega"] == omega and stats["clients"] == R and stats["p"] == p["value"]
    assert lr["value"] == pp_marina_step(stats["smoothness"], stats["smoothness_rms"], omega, p["value"], R)


@pytest.mark.parametrize("path", ["threads", "batched"])
def test_checkpointed_pp_marina_goes_on_as_if_never_stopped(path, shards):
    config = MARINAConfig(compressor="randk:5", lr=0.2, p=0.4, seed=SEED, clients_per_round=R)
    problem = shards if path == "threads" else RIDGE.build_stacked(M)  # batched: each worker's stream saved
    for straight, resumed, w_straight, w_resumed in straight_and_resumed(config, problem):
        assert straight == resumed and torch.equal(w_straight, w_resumed)


def test_sampling_by_size_and_too_many_clients_are_refused(shards):
    with pytest.raises(ConfigError, match="algorithm.sampling=size; set algorithm.sampling=uniform"):
        MARINAConfig(clients_per_round=2, sampling="size")
    with pytest.raises(ConfigError, match="algorithm.clients_per_round=5 exceeds the 4 clients"):
        fit(MARINAConfig(compressor="randk:3", lr=0.1, p=0.5, clients_per_round=5), rounds=1)


@pytest.mark.parametrize("clients", [R, 3])
def test_the_batched_simulator_gives_the_per_worker_records(clients):
    """The drawn clients' rows among zeros on the stacked path, each one's Q from its own stream: the per-worker
    path's iterates to round-off and its counts exactly."""
    algorithm = MARINAConfig(compressor="randk:5", p=0.4, lr=0.05, seed=SEED, clients_per_round=clients)
    (threads, per_worker), (stacked, batched) = on_both_paths(algorithm)
    assert batched["simulator_path"] == "batched"
    assert sum(r["full_round"] for r in threads[:-1]) < ROUNDS  # a sampled round happened
    assert any(not r["full_round"] and r["clients"] < clients for r in threads[:-1])  # a client drawn twice
    keys = ("uplink_bits", "downlink_bits", "bytes_sent", "comm_rounds", "full_round", "clients",
            "clients_uplink_bits", "uplink_bytes", "downlink_bytes")
    for a, b in zip(threads, stacked, strict=True):
        for key in keys:
            assert a.get(key) == b.get(key), key
        assert a["objective"] == pytest.approx(b["objective"], rel=1e-12)


def test_the_mean_of_r_independent_draws_has_the_variance_the_step_rule_reads():
    """E‖(1/r) Σ_j Q_j(Δ_{i_j}) − Δ̄‖² = ((1 + ω) mean_i ‖Δ_i‖² − ‖Δ̄‖²)/r ≤ (1 + ω)/r · mean_i ‖Δ_i‖² (the bound
    `pp_marina_step` reads), exactly, over every I'_k and every RandK support (d = 4, K = 2, m = 3, r = 2); one Q for
    a client's c_i draws, c_i Q(Δ_i), would exceed it by ω mean_i ‖Δ_i‖² (1 − 1/r)/m."""
    m, r, d, k = 3, 2, 4, 2
    omega = make(f"randk:{k}").omega(d)
    delta = np.arange(m * d, dtype=float).reshape(m, d) / 7 - 0.8
    mean, second = delta.mean(0), (delta ** 2).sum(1).mean()
    supports = list(itertools.combinations(range(d), k))

    def q(x, support):  # RandK on one support: d/K times the kept entries
        out = np.zeros(d)
        out[list(support)] = x[list(support)] * d / k
        return out

    independent = shared = 0.0
    for picks in itertools.product(range(m), repeat=r):       # I'_k, each tuple of weight m^-r
        for kept in itertools.product(supports, repeat=r):    # one support a draw, each of weight C(d, K)^-r
            estimate = sum(q(delta[i], s) for i, s in zip(picks, kept)) / r
            independent += ((estimate - mean) ** 2).sum() / (m * len(supports)) ** r
        clients = sorted(set(picks))
        for kept in itertools.product(supports, repeat=len(clients)):
            estimate = sum(picks.count(i) * q(delta[i], s) for i, s in zip(clients, kept)) / r
            shared += ((estimate - mean) ** 2).sum() / (m ** r * len(supports) ** len(clients))
    assert independent == pytest.approx(((1 + omega) * second - (mean ** 2).sum()) / r, rel=1e-12)
    assert independent <= (1 + omega) * second / r
    assert shared - independent == pytest.approx(omega * second * (1 - 1 / r) / m, rel=1e-12)
