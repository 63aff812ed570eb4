"""FedRed's local step count under client sampling (issue 33 item 1): ``local_steps=null`` is 10 under full
participation (the same iterates, bit for bit, as ``local_steps=10``) and ⌈1/(γ λ_S)⌉ held in [10, 100] under
sampling, λ_S = S-DANE's sampled default λ, checked against a hand computation from the shards' Hessians; and the
stop each control variate needs under sampling: type 1 has a floor (computed here) and ends at it, type 2 converges."""
from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from dane.baselines import FedDANEConfig, FedRedConfig
from dane.comm import LocalCommunicator
from dane.errors import ConfigError
from dane.problems import RidgeSyntheticConfig
from dane.sampling import ClientSampler
from helpers import ridge_shards, simulate

SMALL = RidgeSyntheticConfig(n_samples=240, dim=12, lam=0.01, noise_std=0.5)



def at_floor(algo) -> str | None:
    """The line a run at its sampling floor ended with (`baselines.adaptive.FloorStop`), else None."""
    return None if algo.finished is None else algo.finished[1]

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


# ----------------------------------------------------------------------------- the stop each control variate needs
class FakeComm(LocalCommunicator):
    def __init__(self, rank, size):
        super().__init__()
        self.rank, self.size = rank, size


def hessian(shard) -> torch.Tensor:
    """∇²O_i of a ridge shard: A_i + 2·lam·I (∇O_i(w) = ∇²O_i w − b_i)."""
    return shard.A + 2 * shard.lam * torch.eye(shard.b.numel(), dtype=torch.float64)


def hand_round(shards, x, S, lam, gamma, steps):
    """One sampled type-1 round of FedRed by hand (module docstring): h_i = ∇O_i(x) − mean_S ∇O_j(x), K doubly
    regularized steps from x on each i in S, the mean over S."""
    grads = {i: hessian(shards[i]) @ x - shards[i].b for i in S}
    g_bar = sum(grads.values()) / len(S)
    local = []
    for i in S:
        z = x
        for _ in range(steps):
            z = (z / gamma + lam * x - (hessian(shards[i]) @ z - shards[i].b) + grads[i] - g_bar) / (1 / gamma + lam)
        local.append(z)
    return sum(local) / len(S)


def stationary_floor(shards, s, lam, gamma, steps):
    """(E[O(x) − O*] once the sampled iteration is stationary, w*, {S: (T_S, c_S)}): each round is affine in e = x − w*,
    e⁺ = T_S e + c_S, S uniform over the s-subsets; the mean μ and second moment P of e solve μ = E[T]μ + E[c],
    P = E[T P Tᵀ] + E[T μ c_Sᵀ + c_S μᵀ Tᵀ] + E[c cᵀ], and E[O − O*] = ½ tr(H P)."""
    m, d = len(shards), shards[0].b.numel()
    H = sum(hessian(shard) for shard in shards) / m
    w_star = torch.linalg.solve(H, sum(shard.b for shard in shards) / m)
    maps = []
    for S in itertools.combinations(range(m), s):
        c = hand_round(shards, w_star, S, lam, gamma, steps) - w_star
        T = torch.stack([hand_round(shards, w_star + e, S, lam, gamma, steps) - w_star - c
                         for e in torch.eye(d, dtype=torch.float64)], dim=1)
        maps.append((S, T, c))
    n, eye = len(maps), torch.eye(d, dtype=torch.float64)
    by_set, maps = {S: (T, c) for S, T, c in maps}, [(T, c) for _, T, c in maps]
    mu = torch.linalg.solve(eye - sum(T for T, _ in maps) / n, sum(c for _, c in maps) / n)
    kron = sum(torch.kron(T, T) for T, _ in maps) / n  # vec(T P Tᵀ) = (T ⊗ T) vec(P), row-major vec
    rest = sum(torch.outer(T @ mu, c) + torch.outer(c, T @ mu) + torch.outer(c, c) for T, c in maps) / n
    P = torch.linalg.solve(torch.eye(d * d, dtype=torch.float64) - kron, rest.reshape(-1)).reshape(d, d)
    return 0.5 * float(torch.trace(H @ P)), w_star, by_set


def test_fedred_type1_under_sampling_has_a_floor_and_ends_at_it():
    """Type 1 under sampling: at x* the local gradient is mean_S ∇O_j(x*) ≠ 0, so x* is not a fixed point of a
    sampled round (c_S ≠ 0) and the stationary suboptimality, computed from the rounds' affine maps, is positive.
    The run's iterates are the hand recursion's, it ends with status sampling_floor at the first round the rule
    allows, its stop line names the knobs; the same run with all clients converges."""
    from dane.baselines.adaptive import FLOOR_ROUNDS

    m, s, lam, steps = 4, 2, 0.5, 10
    shards = ridge_shards(m, SMALL)
    config = FedRedConfig(lam=lam, local_steps=steps, clients_per_round=s, seed=3)
    algo, records, iterates = simulate(config, shards, 200, tol=1e-14)[0]
    floor, w_star, maps = stationary_floor(shards, s, lam, algo.gamma, steps)
    assert min(float(c.norm()) for _, c in maps.values()) > 1e-2  # w* moves in every sampled round (c_S ≠ 0) ...
    assert floor > 1e-3  # ... and the floor is far above round-off
    sampler = ClientSampler(FakeComm(0, m), s, seed=3)
    x = iterates[0]
    for t, w in enumerate(iterates[1:], start=1):  # every iterate, by hand, with the run's sampled sets
        x = hand_round(shards, x, sampler.draw().tolist(), lam, algo.gamma, steps)
        torch.testing.assert_close(w, x, rtol=0, atol=1e-11, msg=f"round {t}")
    objectives = [r["objective"] for r in records]
    best = objectives.index(min(objectives))
    assert at_floor(algo) is not None and len(records) - 1 == best + max(FLOOR_ROUNDS, best // 2) < 200
    assert "fewer algorithm.local_steps (now 10)" in at_floor(algo)
    assert "algorithm.control_variate=2 has no floor" in at_floor(algo)
    # random averaging: type 2's correction against x̄ keeps Σ_i h_i = 0 there too (tests/test_fedred_type2.py)
    algo = simulate(FedRedConfig(lam=lam, local_steps=steps, averaging="random", clients_per_round=s, seed=3),
                    shards, 200)[0][0]
    assert at_floor(algo) is not None and "algorithm.control_variate=2 has no floor" in at_floor(algo)
    # The floor is the long-run mean of the recursion (20,000 rounds of random sets after 100: within 5%) ...
    rng, e, total = random.Random(0), torch.zeros(SMALL.dim, dtype=torch.float64), 0.0
    H = sum(hessian(shard) for shard in shards) / m
    for t in range(20100):
        T, c = maps[tuple(sorted(rng.sample(range(m), s)))]
        e = T @ e + c
        total += 0.5 * float(e @ H @ e) if t >= 100 else 0.0
    assert math.isclose(total / 20000, floor, rel_tol=0.05)
    # ... and the run's stalled rounds sit about it: their mean is one sample path's average over a few correlated
    # rounds, so it is held to a factor of 2 of the stationary expectation, not to a tolerance
    stalled = [r["suboptimality"] for r in records[best:]]
    assert floor / 2 < sum(stalled) / len(stalled) < 2 * floor
    full = simulate(FedRedConfig(lam=lam, local_steps=steps), shards, 200, tol=1e-12)[0][1]
    assert full[-1]["suboptimality"] <= 1e-12 and len(full) < 200
    # with all clients the floor stop never fires, though the objective stops improving once at round-off
    algo, full, _ = simulate(FedRedConfig(lam=lam, local_steps=steps), shards, 80)[0]
    assert len(full) == 81 and at_floor(algo) is None and full[40]["suboptimality"] < 1e-14


def test_fedred_type2_under_sampling_converges_its_control_variates_summing_to_zero():
    """Type 2 keeps (x*, h_i = ∇O_i(x*)) a fixed point under sampling once Σ_i h_i = 0: the clients outside S_0 start
    at h_i = 0, mean averaging keeps the sum, and the sampled run converges to the optimum (no floor stop)."""
    m, s = 4, 2
    shards = ridge_shards(m, SMALL)
    config = FedRedConfig(lam=0.5, local_steps=10, control_variate=2, clients_per_round=s, seed=3)
    first = simulate(config, shards, 1)
    S_0 = ClientSampler(FakeComm(0, m), s, seed=3).draw().tolist()
    assert all(torch.equal(algo.h, torch.zeros_like(algo.h)) for rank, (algo, _, _) in enumerate(first)
               if rank not in S_0)
    torch.testing.assert_close(sum(algo.h for algo, _, _ in first), torch.zeros(SMALL.dim, dtype=torch.float64),
                               rtol=0, atol=1e-12)
    done = simulate(config, shards, 1000, tol=1e-14)
    algo, records, _ = done[0]
    assert records[-1]["suboptimality"] <= 1e-14 and len(records) < 1000 and at_floor(algo) is None
    H = sum(hessian(shard) for shard in shards) / m
    w_star = torch.linalg.solve(H, sum(shard.b for shard in shards) / m)
    assert float((algo.w - w_star).norm()) < 1e-6  # suboptimality 1e-14, λ_min(H) ≈ 1.3: ‖e‖ ≈ 1e-7
    torch.testing.assert_close(sum(a.h for a, _, _ in done), torch.zeros(SMALL.dim, dtype=torch.float64),
                               rtol=0, atol=1e-12)
    for rank, (a, _, _) in enumerate(done):  # h_i → ∇O_i(x*) (norms about 0.3), lagging the iterate by about 10x
        torch.testing.assert_close(a.h, hessian(shards[rank]) @ w_star - shards[rank].b, rtol=0, atol=1e-5)
