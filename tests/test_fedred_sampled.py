"""FedRed's local step count under client sampling (issue 33 item 1): ``local_steps=null`` is 10 under full
participation (the same iterates, bit for bit, as ``local_steps=10``) and ⌈1/(γ λ_S)⌉ held in [10, 100] under
sampling, λ_S = S-DANE's sampled default λ, checked against a hand computation from the shards' Hessians."""
from __future__ import annotations

import math

import pytest
import torch

from dane.baselines import FedDANEConfig, FedRedConfig
from dane.errors import ConfigError
from dane.problems import RidgeSyntheticConfig
from helpers import ridge_shards, simulate

SMALL = RidgeSyntheticConfig(n_samples=240, dim=12, lam=0.01, noise_std=0.5)


def test_fedred_null_local_steps_is_ten_under_full_participation_bit_for_bit():
    shards = ridge_shards(4, SMALL)
    default = simulate(FedRedConfig(), shards, 6)[0]
    ten = simulate(FedRedConfig(local_steps=10), shards, 6)[0]
    assert all(torch.equal(a, b) for a, b in zip(default[2], ten[2])) and len(default[2]) == len(ten[2]) == 7
    assert [r["local_steps"] for r in default[1][:-1]] == [10] * 6
    for a, b in zip(default[1], ten[1]):  # the same traffic, the same allreduces before round 0 (no extra measurement)
        assert {k: v for k, v in a.items() if k != "time_s"} == {k: v for k, v in b.items() if k != "time_s"}


def rule_by_hand(shards, s):
    """(⌈1/(γ λ_S)⌉, λ, γ) from the shards' Hessians: the module docstring's K before its bounds."""
    m = len(shards)
    A = [shard.A for shard in shards]  # the data term's Hessians; O_i's is A_i + 2·lam·I
    H = sum(A) / m
    delta_a = math.sqrt(sum(float(torch.linalg.eigvalsh(a - H).abs().max()) ** 2 for a in A) / m)
    norm = float(torch.linalg.eigvalsh(H).max())
    lam = delta_a * max(1 / 512, (delta_a / norm) ** 2 / 16)  # the full-participation default, kept
    q = (m - s) / (s * (m - 1))
    lam_s = max(lam, 0.5 * q * (norm + 2 * delta_a))
    L_max = max(float(torch.linalg.eigvalsh(a).max()) for a in A) + 2 * shards[0].lam
    return math.ceil(L_max / lam_s), lam, 1 / L_max


def test_fedred_sampled_local_steps_follow_the_rule_by_hand():
    shards = ridge_shards(8, SMALL)
    expected, lam, gamma = rule_by_hand(shards, 6)  # q = 2/42
    algo, records, _ = simulate(FedRedConfig(clients_per_round=6, seed=3), shards, 4)[0]
    assert 10 < expected < 100  # the rule, not a bound, sets K here
    assert [r["local_steps"] for r in records[:-1]] == [expected] * 4
    assert math.isclose(algo.lam, lam, rel_tol=1e-9) and math.isclose(algo.gamma, gamma, rel_tol=1e-9)
    # 15 of 16 clients on alike shards: q = 1/225, and the rule's K is held at the cap
    shards = ridge_shards(16, RidgeSyntheticConfig(n_samples=3200, dim=12, lam=0.01, noise_std=0.5))
    assert rule_by_hand(shards, 15)[0] > 100
    _, records, _ = simulate(FedRedConfig(clients_per_round=15, seed=3), shards, 1)[0]
    assert records[0]["local_steps"] == 100
    # an explicit local_steps, or p, is taken as given under sampling too
    _, records, _ = simulate(FedRedConfig(clients_per_round=6, seed=3, local_steps=7), ridge_shards(8, SMALL), 2)[0]
    assert [r["local_steps"] for r in records[:-1]] == [7, 7]


def test_dane_plus_under_sampling_takes_feddanes_sampled_default_and_its_iterates():
    """Type 1, an exact solve, mean averaging: FedDANE's round (S'_t = S_t), so its default λ is FedDANE's μ."""
    shards = ridge_shards(6, SMALL)
    plus, _, w_plus = simulate(FedRedConfig(local_solver="problem", clients_per_round=2, seed=3), shards, 5)[0]
    fed, _, w_fed = simulate(FedDANEConfig(clients_per_round=2, seed=3), shards, 5)[0]
    full, _, _ = simulate(FedRedConfig(local_solver="problem"), shards, 1)[0]
    assert plus.lam == fed.mu > full.lam  # the sampled default is above the full-participation one here
    assert len(w_plus) == len(w_fed) and all(torch.equal(a, b) for a, b in zip(w_plus, w_fed))


def test_the_sampled_step_rule_without_hessian_products_names_the_key_to_set():
    shards = ridge_shards(4, SMALL)
    for shard in shards:
        shard.hessian_vector = None  # as a network's problem: no Hessian-vector products (the check comes first)
    with pytest.raises(ConfigError, match=r"^algorithm.local_steps=null under client sampling .*"
                                          r"set algorithm.local_steps$"):
        simulate(FedRedConfig(lam=0.05, lr=0.1, clients_per_round=2), shards, 1)
