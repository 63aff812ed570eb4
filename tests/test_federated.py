"""The federated DANE line (baselines/fedprox, scaffold, scaffnew, feddane, sdane, fedred) and client sampling.

Closed forms and invariants: SCAFFOLD with one local step and η_g = 1 is GD; Scaffnew with p = 1 is GD
with a fixed step; S-DANE with one client and an exact solve is the proximal point method; FedProx with
one client solves the proximal step exactly; FedAvg is local SGD with a mean; FedDANE and DANE+ without
sampling are DANE; on unequal shards FedAvg is McMahan et al.'s round at one local step and the paper's steps at
s_k·lr after; sampled sets agree across ranks and across a resume; SCAFFOLD's control variates under sampling match a
hand computation; the averaging methods refuse sampling by size where a round draws, FedNL-PP keeps it.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dane.baselines import (AccSDANEConfig, FedDANEConfig, FedNLConfig, FedProxConfig, FedRedConfig, GDConfig,
                            LocalSGDConfig, SDANEConfig, ScaffnewConfig, ScaffoldConfig)
from dane.baselines.sdane import extrapolation
from dane.comm import LocalCommunicator, ThreadGroup
from dane.dane import DANEConfig
from dane.errors import ConfigError
from dane.experiments.config import run_spec
from dane.loop.spec import Communication, RunSpec
from dane.problems import RidgeSyntheticConfig
from dane.problems.arrays import LogReg
from dane.sampling import ClientSampler, sampled_mean
from helpers import composed, ridge_shards, simulate, simulate_stacked, straight_and_resumed

SMALL = RidgeSyntheticConfig(n_samples=240, dim=12, lam=0.01, noise_std=0.5)


def iterates(config, m=4, rounds=6, problem=SMALL, tol=None):
    """The iterates w_0 .. w_{T-1} every worker holds (worker 0's), and the records."""
    out = simulate(config, ridge_shards(m, problem), rounds, tol)
    for _, _, ws in out[1:]:  # every worker holds the same iterate
        for a, b in zip(out[0][2], ws):
            assert torch.equal(a, b)
    return out[0][2], out[0][1]


def stacked_iterates(config, m=4, rounds=6, problem=SMALL):
    """`iterates` on the batched communicator (`helpers.simulate_stacked`): the m shards stacked, one computation
    for all m workers, where the method is batchable: for the identities, whose point is not the per-worker path."""
    (_, records, ws), = simulate_stacked(config, problem.build_stacked(m), rounds)
    return ws, records


def assert_same_iterates(a, b, atol=1e-12):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=atol)


# ------------------------------------------------------------------ closed forms
def test_scaffold_with_one_local_step_is_gd():
    w_scaffold, _ = stacked_iterates(ScaffoldConfig(local_steps=1, lr=0.05))
    w_gd, _ = stacked_iterates(GDConfig(lr=0.05))
    assert_same_iterates(w_scaffold, w_gd)


def test_scaffnew_with_p_one_is_gd_with_its_step():
    w_new, records = stacked_iterates(ScaffnewConfig(p=1.0, lr=0.05))
    w_gd, _ = stacked_iterates(GDConfig(lr=0.05))
    assert_same_iterates(w_new, w_gd)
    assert all(r["local_steps"] == 1 for r in records[:-1])  # the last record is the final evaluation


def test_sdane_with_one_client_and_an_exact_solve_is_the_proximal_point_method():
    lam = 0.3
    w, _ = iterates(SDANEConfig(lam=lam), m=1, rounds=5)
    (shard,) = ridge_shards(1, SMALL)
    H = shard.A + 2 * shard.lam * torch.eye(SMALL.dim, dtype=torch.float64)
    v = torch.zeros(SMALL.dim, dtype=torch.float64)
    for k in range(1, 5):
        v = torch.linalg.solve(H + lam * torch.eye(SMALL.dim, dtype=torch.float64), lam * v + shard.b)  # prox_{O/λ}(v)
        torch.testing.assert_close(w[k], v, rtol=0, atol=1e-12)


def test_fedprox_with_one_client_solves_the_proximal_step_exactly():
    mu = 0.2
    w, _ = stacked_iterates(FedProxConfig(mu=mu, local_solver="problem"), m=1, rounds=3)
    (shard,) = ridge_shards(1, SMALL)
    H = shard.A + 2 * shard.lam * torch.eye(SMALL.dim, dtype=torch.float64)
    prox = torch.linalg.solve(H + mu * torch.eye(SMALL.dim, dtype=torch.float64), shard.b)  # argmin O + (μ/2)‖w‖²
    torch.testing.assert_close(w[1], prox, rtol=0, atol=1e-12)


def test_fedavg_is_local_sgd_with_a_mean():
    from dane.api import algorithm_config

    w_fedavg, _ = stacked_iterates(algorithm_config("fedavg"))
    w_local, _ = stacked_iterates(LocalSGDConfig(aggregate="mean"))
    assert 2 <= len(w_fedavg) <= len(w_local)  # FedAvg may end early at its drift floor (FedProx.finished)
    assert_same_iterates(w_fedavg, w_local[: len(w_fedavg)], atol=0)


def test_fedavg_on_unequal_shards_departs_from_mcmahans_round_after_one_step():
    """Shards of 8, 8, 7 and 7 rows (`baselines.fedprox`, departure on unequal shards): client k steps on
    O_k = s_k F_k + (λ/2)‖w‖², s_k = m n_k/N, and the server takes the plain mean.  At K = 1 that is McMahan et al.'s
    round (steps on F_k + (λ/2)‖w‖² at one lr, the mean weighted by n_k/N); at K = 3 it is the paper's steps at s_k·lr,
    not the paper's round.  Local SGD's weighted mean is McMahan's round with the ℓ2 term at λ/s_k on client k."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((30, 3))
    lam, lr, m = 0.05, 0.5, 4
    shards = [LogReg(X, (X @ [1.0, -2.0, 0.5] + rng.standard_normal(30) > 0).astype(float), lam=lam).build(
        rank, m, torch.float64) for rank in range(m)]
    rows = [(shard.X.numpy(), shard.y.numpy()) for shard in shards]
    n = np.array([len(y) for _, y in rows])
    assert n.tolist() == [8, 8, 7, 7]
    scale = m * n / n.sum()  # s_k

    def mean_loss_grad(k, w):  # ∇F_k: the mean logistic loss over client k's rows
        A, y = rows[k]
        return -(A * (y / (1 + np.exp(y * (A @ w))))[:, None]).mean(0)

    def one_round(steps, local, weights):  # K local steps of w ← w − lr·local(k, w) from 0, then the weighted mean
        ends = []
        for k in range(m):
            w = np.zeros(3)
            for _ in range(steps):
                w = w - lr * local(k, w)
            ends.append(w)
        return sum(c * w for c, w in zip(weights, ends))

    def mcmahan(steps, l2=np.full(m, lam)):
        return one_round(steps, lambda k, w: mean_loss_grad(k, w) + l2[k] * w, n / n.sum())

    def fitted(config):
        return simulate(config, shards, rounds=1)[0][2][1].numpy()

    fedavg = [fitted(FedProxConfig(name="fedavg", mu=0.0, local_steps=K, lr=lr)) for K in (1, 3)]
    here = one_round(3, lambda k, w: scale[k] * mean_loss_grad(k, w) + lam * w, np.full(m, 1 / m))
    np.testing.assert_allclose(fedavg[0], mcmahan(1), rtol=0, atol=1e-15)
    np.testing.assert_allclose(fedavg[1], here, rtol=0, atol=1e-15)
    assert np.abs(fedavg[1] - mcmahan(3)).max() > 5e-4  # the steps' scale, far above round-off
    weighted = fitted(LocalSGDConfig(aggregate="weighted", local_steps=3, lr=lr))
    np.testing.assert_allclose(weighted, mcmahan(3, l2=lam / scale), rtol=0, atol=1e-15)
    assert np.abs(weighted - mcmahan(3)).max() > 5e-5  # the ℓ2 term's weight, far above round-off


def test_feddane_and_dane_plus_without_sampling_are_dane():
    w_dane, _ = stacked_iterates(DANEConfig(mu=0.1, safeguard=False))
    w_fed, _ = iterates(FedDANEConfig(mu=0.1))  # FedDANE has no stacked form: one thread per worker
    w_plus, _ = stacked_iterates(FedRedConfig(lam=0.1, local_solver="problem"))
    assert_same_iterates(w_fed, w_dane)
    assert_same_iterates(w_plus, w_dane)


def test_acc_sdane_step_solves_its_equation():
    for lam, A, B in [(0.5, 0.0, 1.0), (2.0, 3.0, 1.7), (1e-3, 10.0, 5.0)]:
        a = extrapolation(lam, A, B)
        assert a > 0 and math.isclose(lam * a * a, (A + a) * B, rel_tol=1e-12)


@pytest.mark.parametrize("config", [
    ScaffoldConfig(), ScaffnewConfig(), SDANEConfig(lam=0.05), AccSDANEConfig(lam=0.05), FedRedConfig(lam=0.05),
    FedRedConfig(lam=0.05, control_variate=2), FedDANEConfig(mu=0.05), SDANEConfig(lam=0.05, local_solver="steps"),
    SDANEConfig(lam=0.05, local_solver="cg")], ids=lambda c: f"{c.name}")
def test_drift_corrected_methods_reach_the_optimum(config):
    _, records = iterates(config, rounds=400, tol=1e-10)  # O(w_0) − O* is about 3 here
    assert records[-1]["suboptimality"] <= 1e-10


# ------------------------------------------------------------------ client sampling
class FakeComm(LocalCommunicator):
    def __init__(self, rank, size):
        super().__init__()
        self.rank, self.size = rank, size


def test_sampled_sets_are_the_same_on_every_rank_and_after_a_resume():
    samplers = [ClientSampler(FakeComm(r, 10), 3, seed=5) for r in range(10)]
    draws = [[s.draw() for _ in range(4)] for s in samplers]
    for d in draws[1:]:
        assert all(torch.equal(a, b) for a, b in zip(d, draws[0]))
    for S in draws[0]:
        assert len(S) == 3 and len(set(S.tolist())) == 3 and torch.equal(S, S.sort().values)
    resumed = ClientSampler(FakeComm(0, 10), 3, seed=5)
    fresh = ClientSampler(FakeComm(0, 10), 3, seed=5)
    fresh.draw(), fresh.draw()
    resumed.load_state_dict(fresh.state_dict())
    assert torch.equal(resumed.draw(), draws[0][2]) and torch.equal(resumed.draw(), draws[0][3])


def test_size_weighted_sampling_draws_big_shards_more_often():
    sizes = [1, 1, 1, 1, 100]

    def run(comm):
        sampler = ClientSampler(comm, 2, sampling="size", seed=0, n_local=sizes[comm.rank])
        return [sampler.draw().tolist() for _ in range(200)]

    results = ThreadGroup(5).run(run)
    assert all(r == results[0] for r in results)
    assert sum(4 in S for S in results[0]) >= 190  # P(4 ∈ S) = 1 − (4/104)(3/103)... ≈ 0.99
    with pytest.raises(ConfigError, match="clients_per_round=6 exceeds the 5 clients"):
        ClientSampler(FakeComm(0, 5), 6)


def test_sampled_mean_is_the_mean_over_the_members():
    members = torch.tensor([1, 3])

    def run(comm):
        x = torch.tensor([float(comm.rank + 1)], dtype=torch.float64)
        (mean,), (everyone,) = sampled_mean(comm, members, [x], [x])
        return float(mean), float(everyone)

    for mean, everyone in ThreadGroup(4).run(run):
        assert mean == (2 + 4) / 2 and everyone == 10 / 4


@pytest.mark.parametrize("option", [1, 2])
def test_scaffold_control_variates_under_sampling_match_a_hand_computation(option):
    m, s, lr, K, rounds = 4, 2, 0.05, 3, 4
    config = ScaffoldConfig(local_steps=K, lr=lr, clients_per_round=s, seed=3, option=option)
    w_run, records = stacked_iterates(config, m=m, rounds=rounds)
    shards = ridge_shards(m, SMALL)
    sampler = ClientSampler(FakeComm(0, m), s, seed=3)
    w, c = torch.zeros(SMALL.dim, dtype=torch.float64), torch.zeros(SMALL.dim, dtype=torch.float64)
    c_i = [torch.zeros_like(w) for _ in range(m)]
    for t in range(rounds):
        torch.testing.assert_close(w_run[t], w, rtol=0, atol=1e-12)
        S = sampler.draw().tolist()
        dy, dc = [], []
        for i in S:
            y = w
            for _ in range(K):
                y = y - lr * (shards[i].grad(y) - c_i[i] + c)
            plus = shards[i].grad(w) if option == 1 else c_i[i] - c + (w - y) / (K * lr)
            dy.append(y - w), dc.append(plus - c_i[i])
            c_i[i] = plus
        w = w + sum(dy) / s
        c = c + sum(dc) / m  # (|S|/m) mean_S Δc_i
    assert all(r["clients"] == s for r in records)
    d = SMALL.dim * 8
    assert records[-1]["uplink_bytes"] == rounds * s * 2 * d and records[-1]["downlink_bytes"] == rounds * s * 2 * d


def test_scaffold_option_is_one_or_two():
    with pytest.raises(ConfigError, match=r"^algorithm.option must be one of 1\|2, got 3$"):
        ScaffoldConfig(option=3)


@pytest.mark.parametrize("resample", [False, True])
def test_feddane_under_sampling_matches_a_hand_computation(resample):
    """One round of FedDANE on ridge shards, by hand: g = mean_S ∇O_i(0) = −mean_S b_i, w_i = −η(H_i + μI)⁻¹ g,
    w_1 = mean_S' w_i, with S from the run's sampler and S' = S (the authors' code) or its next draw (the paper's
    Algorithm 1 as printed)."""
    m, s, mu, eta = 4, 2, 0.05, 1.0
    w, _ = iterates(FedDANEConfig(mu=mu, clients_per_round=s, seed=3, resample=resample), m=m, rounds=1)
    sampler = ClientSampler(FakeComm(0, m), s, seed=3)
    S = sampler.draw().tolist()
    S_solve = sampler.draw().tolist() if resample else S
    assert resample == (S_solve != S)  # seed 3 draws two different sets, so the test tells the modes apart
    shards = ridge_shards(m, SMALL)
    eye = torch.eye(SMALL.dim, dtype=torch.float64)
    g = -sum(shards[i].b for i in S) / s  # ∇O_i(0) = −b_i
    local = [-eta * torch.linalg.solve(shards[i].A + 2 * shards[i].lam * eye + mu * eye, g) for i in S_solve]
    torch.testing.assert_close(w[1], sum(local) / s, rtol=0, atol=1e-12)


@pytest.mark.parametrize("config, up, down", [
    # FedDANE, 4 clients: ∇O_i(w_t) and w_i up; w_t, then g down (w_t was counted twice)
    (FedDANEConfig(mu=0.3), [8, 8], [8, 8]),
    # adaptive S-DANE, 4 clients: its acceptance test's x̄ goes down too (was not counted)
    (SDANEConfig(lam=0.3, adaptive=True), None, [12, 12]),
    # FedRed type 1, random averaging, 3 of 4: ∇O_i(x̃) up from 3 and x_j from 1; x̃ and mean_S ∇O_j down to all 3
    (FedRedConfig(lam=0.3, lr=0.2, local_steps=5, averaging="random", clients_per_round=3), [4, 4], [6, 6]),
    # type 2: round 0's ∇O_i(x̃) and x_i up, x̃, mean_S ∇O_j and x̄ down; then x_i up, x̃ and x̄ down
    (FedRedConfig(lam=0.3, lr=0.2, local_steps=5, averaging="random", control_variate=2, clients_per_round=3),
     [6, 3], [9, 6]),
    # mean averaging under sampling: x̄ too, since x_{r+1} goes to the next sample, not to all of this one
    (FedRedConfig(lam=0.3, lr=0.2, local_steps=5, control_variate=2, clients_per_round=3), [6, 3], [9, 6]),
    # every client and mean averaging: x_{r+1} gives every client x̄ (x̃ and mean_S ∇O_j down in round 0, then x̃)
    (FedRedConfig(lam=0.3, lr=0.2, local_steps=5, control_variate=2, server_lr=0.5), [8, 4], [8, 4]),
])
def test_a_round_counts_the_vectors_its_clients_send_and_need(config, up, down):
    """The participants' traffic of two rounds, in vectors of d float64 summed over the clients (`dane.sampling.Traffic`):
    what each client sends and what it must receive before its part of the round."""
    _, records = iterates(config, m=4, rounds=2)
    d = SMALL.dim * 8
    assert [r["downlink_bytes"] for r in records[1:3]] == [down[0] * d, (down[0] + down[1]) * d]
    if up is not None:
        assert [r["uplink_bytes"] for r in records[1:3]] == [up[0] * d, (up[0] + up[1]) * d]


def test_feddane_resampled_counts_w_for_the_solvers_outside_the_gradient_set():
    m, s = 4, 2
    _, records = iterates(FedDANEConfig(mu=0.05, clients_per_round=s, seed=3, resample=True), m=m, rounds=2)
    sampler, d, down = ClientSampler(FakeComm(0, m), s, seed=3), SMALL.dim * 8, 0
    for t in range(2):
        S, S_solve = set(sampler.draw().tolist()), set(sampler.draw().tolist())
        down += len(S) + len(S_solve) + len(S_solve - S)  # w_t to S, g to S', w_t to S' \ S
        assert records[t + 1]["downlink_bytes"] == down * d
    assert down > 2 * 2 * s  # seed 3's draws differ, so the test sees the extra w_t


def test_fedred_random_averaging_takes_no_server_step():
    with pytest.raises(ConfigError, match=r"^algorithm.server_lr=2 is the step of mean averaging; algorithm.averaging="
                                          r"random takes one client's iterate as it is: set server_lr=1$"):
        FedRedConfig(averaging="random", server_lr=2.0)


def test_fedred_notes_only_the_defaults_its_round_reads():
    """Type 1 has no weight c and a Geometric(p) count replaces K: neither is a default the run applied."""
    from dane.api import fit

    for keys in ({}, {"p": 0.3}):
        summary = fit(SMALL, "fedred", workers=4, rounds=1, lam=0.3, lr=0.2, **keys,
                      **({} if keys else {"local_steps": 5})).summary
        assert summary["defaults"] == [] and summary["package_rules_applied"] is False
    summary = fit(SMALL, "fedred", workers=4, rounds=1, lam=0.3, lr=0.2, local_steps=5, control_variate=2).summary
    assert [(e["key"], e["value"]) for e in summary["defaults"]] == [("algorithm.cv_weight", 1 / 5 / 0.2)]


@pytest.mark.parametrize("method, knob", [("feddane", "mu"), ("sdane", "lam")])
def test_a_sampled_run_ends_at_its_floor_and_says_why(method, knob):
    """With 2 of 4 clients the sampled gradient at w* is mean_S ∇O_i(w*) ≠ 0: the objective stalls above O*, and the
    run ends with status sampling_floor once its best is max(10, best round / 2) rounds old (`SamplingFloor`), its
    stop line naming the override; under full participation the same run converges."""
    from dane.api import fit
    from dane.baselines.adaptive import FLOOR_ROUNDS

    sampled = fit(SMALL, method, workers=4, rounds=200, tol=1e-14, clients_per_round=2, **{knob: 0.05})
    objectives = [r["objective"] for r in sampled.records]
    best = objectives.index(min(objectives))
    assert sampled.status == "sampling_floor" and sampled.records[-1]["suboptimality"] > 1e-12
    assert sampled.summary["rounds"] == best + max(FLOOR_ROUNDS, best // 2) < 200  # the first round the rule allows
    assert "under client sampling (2 of 4)" in sampled.summary["stopped_by"]
    assert f"algorithm.{knob}" in sampled.summary["stopped_by"]
    assert "algorithm.clients_per_round=null" in sampled.summary["stopped_by"]
    full = fit(SMALL, method, workers=4, rounds=200, tol=1e-14, **{knob: 0.05})
    assert full.status == "converged"


def test_sdane_with_exact_solves_is_feddane_solving_on_its_gradient_clients():
    """Exact local solves: mean_S ∇F_i(x_i) = 0 makes S-DANE's v-update return v = x, so S-DANE is FedDANE with
    η = 1, μ = λ and S'_t = S_t, under sampling too (the same sampler draws the same sets)."""
    w_s, _ = iterates(SDANEConfig(lam=0.05, clients_per_round=2, seed=3), rounds=6)
    w_f, _ = iterates(FedDANEConfig(mu=0.05, clients_per_round=2, seed=3), rounds=6)
    assert_same_iterates(w_s, w_f, atol=1e-10)
    w_r, _ = iterates(FedDANEConfig(mu=0.05, clients_per_round=2, seed=3, resample=True), rounds=6)
    assert max(float((a - b).abs().max()) for a, b in zip(w_r, w_s)) > 1e-3  # the paper's fresh draw is not


def test_scaffnew_refuses_client_sampling_in_one_line():
    with pytest.raises(ConfigError, match=r"^algorithm=scaffnew does not take algorithm.clients_per_round=2: .*"
                                          r"set algorithm.clients_per_round=null$"):
        ScaffnewConfig(clients_per_round=2)


@pytest.mark.parametrize("config, keys, line", [
    (SDANEConfig, {"local_steps": 0}, "algorithm.local_steps must be a positive integer, got 0"),
    (ScaffoldConfig, {"local_steps": 1.5}, "algorithm.local_steps must be a positive integer, got 1.5"),
    (SDANEConfig, {"local_solver": "newton"},
     "algorithm.local_solver must be one of problem|steps|cholesky|cg|svrg|lbfgs, got 'newton'"),
    (FedProxConfig, {"lr": 0.0}, "algorithm.lr must be > 0, got 0.0"),
    (ScaffoldConfig, {"power_iters": 0}, "algorithm.power_iters must be a positive integer, got 0"),
    (ScaffnewConfig, {"lr": -1.0}, "algorithm.lr must be > 0, got -1.0"),
    (ScaffnewConfig, {"power_iters": 0}, "algorithm.power_iters must be a positive integer, got 0"),
])
def test_the_local_solve_keys_are_checked_in_one_line(config, keys, line):
    """`LocalKeys` (solver, lr, power_iters), which Scaffnew takes alone, and `LocalSolveKeys`, which adds
    ``local_steps``: each key is checked when the config is made, by both."""
    with pytest.raises(ConfigError) as err:
        config(**keys)
    assert str(err.value) == line


def size_sampled_spec(*overrides: str):
    """The run spec of ``overrides`` over 4 workers with algorithm.sampling=size, as ``dane train`` checks it."""
    return run_spec(composed("problem.n_samples=240", "problem.dim=12", "workers=4", "algorithm.sampling=size",
                             *overrides))


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "scaffold", "feddane", "sdane", "acc_sdane", "fedred"])
def test_an_averaging_method_refuses_sampling_by_size_where_a_round_draws(name):
    """Each O_i carries m·n_i/N, so a mean over clients drawn by size would weight them by n_i² (`dane.sampling`):
    refused when the spec is checked, before any worker starts."""
    with pytest.raises(ConfigError) as refused:
        size_sampled_spec(f"algorithm={name}", "algorithm.clients_per_round=2")
    assert str(refused.value) == (
        f"algorithm={name} with algorithm.clients_per_round=2 of 4 clients: algorithm.sampling=size draws clients by "
        f"shard size, and each client's objective already carries its size (m·n_i/N), so the mean over the sampled "
        f"clients would weight clients by n_i²; set algorithm.sampling=uniform")


@pytest.mark.parametrize("name", ["fedavg", "fedprox"])
def test_sampling_by_size_is_accepted_where_no_round_draws(name):
    """s = m: every client every round, no draw, so nothing is weighted twice."""
    spec = size_sampled_spec(f"algorithm={name}", "algorithm.clients_per_round=4")
    assert (spec.algorithm.name, spec.algorithm.sampling, spec.algorithm.clients_per_round) == (name, "size", 4)


def test_fednl_pp_keeps_sampling_by_size():
    """FedNL-PP's step reads every client's stored state through means over all m clients: a draw by size decides
    only who refreshes it (`baselines.fednl.FedNLConfig.size_sampling`)."""
    X = np.random.default_rng(0).standard_normal((40, 3))
    spec = RunSpec(problem=LogReg(X, (X[:, 0] > 0).astype(float), lam=1e-2), comm=Communication(workers=4),
                   algorithm=FedNLConfig(variant="pp", clients_per_round=2, sampling="size"))
    assert (spec.algorithm.variant, spec.algorithm.sampling, spec.algorithm.clients_per_round) == ("pp", "size", 2)


def test_a_build_outside_a_run_refuses_sampling_by_size_too():
    """`baselines.federated.Federated` checks what a run's spec checks first, for a config built by hand."""
    config = FedProxConfig(name="fedavg", mu=0.0, clients_per_round=1, sampling="size")
    with pytest.raises(ConfigError, match=r"^algorithm=fedavg with algorithm.clients_per_round=1 of 2 clients: "
                                          r"algorithm.sampling=size draws clients by shard size, .* set "
                                          r"algorithm.sampling=uniform$"):
        ThreadGroup(2).run(lambda comm: config.build(ridge_shards(2, SMALL)[comm.rank], comm))


@pytest.mark.parametrize("config", [
    ScaffoldConfig(clients_per_round=2), AccSDANEConfig(lam=0.05, clients_per_round=3),
    SDANEConfig(lam=0.5, adaptive=True),
    FedRedConfig(control_variate=2, averaging="random", p=0.3, clients_per_round=2), ScaffnewConfig(p=0.4),
    FedDANEConfig(clients_per_round=2), FedProxConfig(clients_per_round=3)], ids=lambda c: c.name)
def test_a_resumed_run_continues_exactly(config):
    for straight, again, w1, w2 in straight_and_resumed(config, ridge_shards(4, SMALL)):
        assert straight == again and torch.equal(w1, w2)


@pytest.mark.parametrize("m, rows", [(2, 4000), (24, 240)])  # δ_A/‖H‖ below and above 1/sqrt(32): 10 rows a shard in d = 12 differ a lot
def test_default_lambda_balances_the_preconditioner_gap(m, rows):
    """λ = min(δ_A·max(1/512, (δ_A/‖H‖)²/16), the λ where ½·mean_i φ_i(λ) = λ/(μ + λ)), φ_i(λ) = ‖(I + A_i)⁻¹A_i²‖,
    A_i = K^{-1/2}(H_i − H)K^{-1/2}, K = H + λI (H with the regularizer), here from explicit inverses and numpy's norms
    of the shards' Hessians on the measurement's octaves (the rule's interpolation: test_balanced_weight_*)."""
    import numpy as np

    from dane.baselines.defaults import balanced_prox_weight, prox_per_dissimilarity
    from dane.numerics.similarity import GAP_OCTAVES

    problem = RidgeSyntheticConfig(n_samples=rows, dim=12, lam=0.01, noise_std=0.5)
    shards = ridge_shards(m, problem)
    eye = np.eye(SMALL.dim)
    data = [s.A.numpy() for s in shards]
    H_data = sum(data) / m
    H = H_data + 2 * problem.lam * eye
    delta = math.sqrt(sum(np.linalg.norm(h - H_data, 2) ** 2 for h in data) / m)
    norm = np.linalg.norm(H_data, 2)
    weights = [norm * 2.0 ** -k for k in range(GAP_OCTAVES + 1)]
    gaps = []
    for lam in weights:
        w, Q = np.linalg.eigh(H + lam * eye)
        root = Q @ np.diag(w ** -0.5) @ Q.T  # K^{-1/2}
        gaps.append(np.mean([np.linalg.norm(np.linalg.inv(eye + A) @ A @ A, 2)
                             for A in (root @ (h - H_data) @ root for h in data)]))
    mu = float(np.linalg.eigvalsh(H)[0])
    ratio = delta / norm
    assert prox_per_dissimilarity(delta, norm) == pytest.approx(max(1 / 512, ratio ** 2 / 16), rel=1e-12)
    balanced, by_delta = balanced_prox_weight(weights, gaps, mu), delta * max(1 / 512, ratio ** 2 / 16)
    assert balanced > by_delta  # isotropic shards: the δ_A rule binds (ill-conditioned ones: the next test)
    expected = min(balanced, by_delta)
    _, records = iterates(SDANEConfig(), m=m, rounds=2, problem=problem)
    assert math.isclose(records[0]["lam"], expected, rel_tol=1e-9)
    _, records = iterates(FedDANEConfig(), m=m, rounds=2, problem=problem)
    assert math.isclose(records[0]["mu"], expected, rel_tol=1e-9)


def test_on_ill_conditioned_shards_the_default_lambda_is_the_balanced_one_far_below_the_delta_rule():
    """bench_defaults' ill-conditioned family (feature scales over 1e6), 400 rows over 4 workers, ridge with λ = 1e-5:
    the shards are similar relative to their curvature, and the default is the balanced weight, computed here from
    the built shards' dense Hessians with explicit inverses, many times below the δ_A rule's."""
    import numpy as np

    import dane
    from dane.baselines.defaults import balanced_prox_weight
    from dane.numerics.similarity import GAP_OCTAVES
    from dane.synthetic.defaults_data import make

    X, y, fit_intercept = make("ill_conditioned", "squared", n=400)
    problem = dane.problems.Ridge(X, y, lam=1e-5, fit_intercept=fit_intercept)
    shards = [problem.build(rank, 4) for rank in range(4)]
    w0, d = shards[0].initial_point(), shards[0].dim
    eye = torch.eye(d, dtype=torch.float64)
    data = [torch.stack([s.hessian_vector(eye[j], at=w0, with_reg=False) for j in range(d)]).numpy() for s in shards]
    reg = float(shards[0].strong_convexity)
    H_data = sum(data) / 4
    H = H_data + reg * np.eye(d)
    delta = math.sqrt(sum(np.linalg.norm(h - H_data, 2) ** 2 for h in data) / 4)
    norm = np.linalg.norm(H_data, 2)
    weights = [norm * 2.0 ** -k for k in range(GAP_OCTAVES + 1)]
    gaps = []
    for lam in weights:
        w, Q = np.linalg.eigh(H + lam * np.eye(d))
        root = Q @ np.diag(w ** -0.5) @ Q.T
        gaps.append(np.mean([np.linalg.norm(np.linalg.inv(np.eye(d) + A) @ A @ A, 2)
                             for A in (root @ (h - H_data) @ root for h in data)]))
    balanced = balanced_prox_weight(weights, gaps, float(np.linalg.eigvalsh(H)[0]))
    assert balanced < delta * max(1 / 512, (delta / norm) ** 2 / 16) / 10
    lam = dane.fit(problem, "sdane", workers=4, rounds=1).records[0]["lam"]
    assert lam == pytest.approx(balanced, rel=1e-8)


def test_adaptive_lambda_halves_after_accepted_rounds_and_converges():
    # one client, exact solve: <∇O(x), v − x> = λ‖x − v‖² ≥ ‖∇O(x)‖²/(2λ) = λ‖x − v‖²/2, so every round is accepted
    _, records = iterates(SDANEConfig(lam=1.0, adaptive=True), m=1, rounds=4)
    assert [r["lam"] for r in records[:-1]] == [1.0, 0.5, 0.25, 0.125] and all(r["accepted"] for r in records[:-1])
    _, records = iterates(AccSDANEConfig(lam=1.0, adaptive=True), rounds=200, tol=1e-10)
    assert records[-1]["suboptimality"] <= 1e-10
    assert any(not r.get("accepted", True) for r in records)  # λ went below what the shards allow, and came back
    with pytest.raises(ConfigError, match="adaptive=true does not take algorithm.clients_per_round=2"):
        SDANEConfig(adaptive=True, clients_per_round=2)


def test_adaptive_lambda_doubles_on_a_rejection_by_its_numpy_transcription():
    """`SDANE.accepts` and `SDANE.line_search` (adaptive=true, μ = 0, exact solves on 4 ridge shards) against their
    transcription: per round h_i = ∇O_i(v) − ḡ, x_i = (H_i + λI)⁻¹(b_i + h_i + λv), x̄ = mean x_i, G = mean ∇O_i(x_i);
    accepted iff mean_i⟨∇O_i(x_i) − ∇O_i(x̄), v − x_i⟩ + ⟨mean_j ∇O_j(x̄), v − x̄⟩ ≥ ‖G‖²/(2λ), then v = v − G/λ and
    λ/2, else v stays and 2λ.  The rounds straddle the boundary: rejected at ratios lhs/rhs of 0.53 and 0.99 (the
    first below 1 but above 1/2), accepted at 1.01."""
    lam, rounds, m = 0.16, 7, 4
    w, records = iterates(SDANEConfig(lam=lam, adaptive=True, mu=0.0), m=m, rounds=rounds)
    shards = ridge_shards(m, SMALL)
    eye = torch.eye(SMALL.dim, dtype=torch.float64)
    H = [shard.A + 2 * shard.lam * eye for shard in shards]

    def grad(i, x):
        return H[i] @ x - shards[i].b

    v, ratios = torch.zeros(SMALL.dim, dtype=torch.float64), []
    for t in range(rounds):
        g_bar = sum(grad(i, v) for i in range(m)) / m
        x_i = [torch.linalg.solve(H[i] + lam * eye, shards[i].b + grad(i, v) - g_bar + lam * v) for i in range(m)]
        x_bar = sum(x_i) / m
        G = sum(grad(i, x) for i, x in enumerate(x_i)) / m
        lhs = (sum(float((grad(i, x) - grad(i, x_bar)) @ (v - x)) for i, x in enumerate(x_i)) / m
               + float(sum(grad(j, x_bar) for j in range(m)) / m @ (v - x_bar)))
        ratios.append(lhs / (float(G @ G) / (2 * lam)))
        accepted = ratios[-1] >= 1
        assert (records[t]["lam"], records[t]["accepted"]) == (lam, accepted)
        if accepted:
            v = v - G / lam
            torch.testing.assert_close(w[t + 1], x_bar, rtol=0, atol=1e-10)
        lam = lam / 2 if accepted else 2 * lam
    assert [r >= 1 for r in ratios] == [False, False, True, False, True, True, True]
    assert 0.5 < ratios[1] < 0.6 and 0.98 < ratios[3] < 1 < ratios[6] < 1.02


def test_fedprox_stops_at_its_fixed_point_and_says_why():
    """With exact local solves FedProx's round is the affine map T(w) = M w + c, M = μ mean_i (H_i + μI)⁻¹, whose
    fixed point w̃ is not w* (a linear system here).  Under full participation the run ends early with status
    client_drift (`FedProx.finished`), where T contracts: ‖w − w̃‖ ≤ ‖T(w) − w‖/(1 − ‖M‖₂), and ‖T(w) − w‖ has
    fallen below `FIXED_POINT` of its round-0 value times the clients' moves."""
    from dane.baselines.fedprox import FIXED_POINT
    from dane.api import fit

    mu, m, cap = 0.05, 4, 120
    result = fit(SMALL, "fedprox", workers=m, rounds=cap, tol=1e-12, mu=mu, local_solver="problem")
    eye = torch.eye(SMALL.dim, dtype=torch.float64)
    shards = ridge_shards(m, SMALL)
    inverses = [torch.linalg.inv(s.A + 2 * s.lam * eye + mu * eye) for s in shards]
    M, c = mu * sum(inverses) / m, sum(P @ s.b for P, s in zip(inverses, shards)) / m
    fixed = torch.linalg.solve(eye - M, c)
    optimum = torch.linalg.solve(sum(s.A + 2 * s.lam * eye for s in shards) / m, sum(s.b for s in shards) / m)
    assert torch.linalg.vector_norm(fixed - optimum) > 1e-3  # the floor is real: the shards differ
    assert result.status == "client_drift" and "client drift" in result.summary["stopped_by"]
    assert result.summary["rounds"] < cap
    w = result.w
    step = torch.linalg.vector_norm(M @ w + c - w)
    q = float(torch.linalg.matrix_norm(M, ord=2))
    assert q < 1 and float(torch.linalg.vector_norm(w - fixed)) <= float(step) / (1 - q) + 1e-12
    first_step = torch.linalg.vector_norm(c)  # T(w_0) - w_0 at w_0 = 0
    assert step <= 10 * FIXED_POINT * first_step  # near w̃: its step fell by ~FIXED_POINT (clients' moves vary)


@pytest.mark.parametrize("delta_a, norm", [(0.5, 1.0), (0.05, 1.0)])
def test_acc_sdane_default_lambda_is_larger_on_heterogeneous_shards(monkeypatch, delta_a, norm):
    """λ = null where the measurement has no gap curve (Lanczos, d > 512): S-DANE takes δ_A·max(1/512, (δ_A/‖H‖)²/16),
    Acc-S-DANE δ_A·max(1/512, (δ_A/‖H‖)²/4); with δ_A/‖H‖ = 0.05 the floor binds both."""
    import dane.baselines.federated as federated

    measured = lambda problem, comm, key, gap=False: {"delta_a": delta_a, "hessian_norm": norm}  # noqa: E731
    monkeypatch.setattr(federated, "hessian_dissimilarity", measured)
    shard, comm = ridge_shards(1, SMALL)[0], LocalCommunicator()
    r2 = (delta_a / norm) ** 2
    assert SDANEConfig().build(shard, comm).lam == pytest.approx(delta_a * max(1 / 512, r2 / 16), rel=1e-15)
    assert AccSDANEConfig().build(shard, comm).lam == pytest.approx(delta_a * max(1 / 512, r2 / 4), rel=1e-15)


def test_scaffold_at_the_cap_names_its_step_and_local_steps():
    """At the round cap SCAFFOLD's stop line names K and η_l = min(2/(L + μ̲), 1.9/L, 1/(K μ̲)), L = max_i L_i,
    μ̲ = max(2λ, mean_i λ_min(H_i)) (H_i = A_i + 2λI, Lanczos exact at d = 12 < its 20 iterations), and the two
    overrides (each branch of the rule: tests/test_scaffold.py)."""
    from dane.api import fit

    m, K = 4, 10
    result = fit(SMALL, "scaffold", workers=m, rounds=2, tol=1e-14)
    spectra = [torch.linalg.eigvalsh(s.A + 2 * s.lam * torch.eye(SMALL.dim, dtype=torch.float64))
               for s in ridge_shards(m, SMALL)]
    L_max = max(float(e[-1]) for e in spectra)
    mu_low = max(2 * SMALL.lam, sum(float(e[0]) for e in spectra) / m)
    lr = min(2 / (L_max + mu_low), 1.9 / L_max, 1 / (K * mu_low))
    assert lr == 1 / (K * mu_low)  # these shards are well conditioned (L_max / mu_low < K): the rule's last branch
    assert result.status == "max_rounds"
    lrs = [r["lr"] for r in result.records if "lr" in r]  # each round's record (bench_defaults' grid reads it)
    assert len(lrs) == 2 and all(x == pytest.approx(lr, rel=1e-10) for x in lrs)
    assert f"SCAFFOLD moves at most 10 local steps of lr {lr:.3g} a round" in result.summary["stopped_by"]
    assert "scaled by the server step 1.5 (algorithm.server_lr)" in result.summary["stopped_by"]  # K = 10, lr null
    assert "algorithm.local_steps" in result.summary["stopped_by"] and "algorithm.lr" in result.summary["stopped_by"]


@pytest.mark.parametrize("m, s", [(6, 1), (6, 2), (6, 3), (6, 6), (5, 4)])
def test_sampling_variance_factor_is_the_variance_of_a_sampled_mean(m, s):
    """q = (m − s)/(s(m − 1)): over every s-subset S of m vectors, mean_S ‖mean_{i∈S} z_i − z̄‖² = q mean_i ‖z_i − z̄‖²."""
    from itertools import combinations

    from dane.baselines.defaults import sampling_variance_factor

    z = torch.randn(m, 3, generator=torch.Generator().manual_seed(m + s), dtype=torch.float64)
    spread = float(((z - z.mean(0)) ** 2).sum(1).mean())
    subsets = list(combinations(range(m), s))
    exact = sum(float(((z[list(S)].mean(0) - z.mean(0)) ** 2).sum()) for S in subsets) / len(subsets)
    assert sampling_variance_factor(s, m) * spread == pytest.approx(exact, rel=1e-12)


@pytest.mark.parametrize("delta_a, norm", [(0.05, 1.0), (0.5, 1.0), (0.9, 1.0)])
def test_sampled_default_lambda_grows_with_the_sampling_variance(monkeypatch, delta_a, norm):
    """λ = null under sampling: max(λ_full, c q (‖H‖ + 2δ_A)), q = (m − s)/(s(m − 1)), c = 0.5 for S-DANE and FedDANE's μ,
    1.0 for Acc-S-DANE (λ_full here the Lanczos path's, divisor 4 for Acc-S-DANE); at s = m (and null) the
    full-participation rule, unchanged."""
    import dane.baselines.federated as federated
    from dane.baselines.defaults import SAMPLED_PROX_PER_CURVATURE

    monkeypatch.setattr(federated, "hessian_dissimilarity",
                        lambda problem, comm, key, gap=False: {"delta_a": delta_a, "hessian_norm": norm})
    shard, m = ridge_shards(1, SMALL)[0], 10
    r2 = (delta_a / norm) ** 2
    for config, divisor, knob, c in [(SDANEConfig, 16, "lam", 0.5), (AccSDANEConfig, 4, "lam", 1.0),
                                     (FedDANEConfig, 16, "mu", 0.5)]:
        full = delta_a * max(1 / 512, r2 / divisor)
        for s in (None, m):
            assert getattr(config(clients_per_round=s).build(shard, FakeComm(0, m)), knob) == full
        for s in (1, 2, 5, 9):
            q = (m - s) / (s * (m - 1))
            expected = max(full, c * q * (norm + 2 * delta_a))
            assert getattr(config(clients_per_round=s).build(shard, FakeComm(0, m)), knob) == pytest.approx(
                expected, rel=1e-15)
    assert SAMPLED_PROX_PER_CURVATURE == 0.5
    assert SDANEConfig(clients_per_round=1).build(shard, FakeComm(0, m)).lam == pytest.approx(
        0.5 * (norm + 2 * delta_a), rel=1e-15)  # q = 1


def test_fedprox_calls_a_stalled_objective_its_floor_only_where_the_suboptimality_no_longer_contracts():
    """Scripted records: the objective falls from 1 to 0.05 in 10 rounds, then 100 rounds move it by less than
    `STALLED` of that.  With the suboptimality flat (a floor) the diagnosis names FedProx's fixed point; with it still
    shrinking 0.989 a round (a slow run near the optimum, as on mushrooms over 80 iid clients) there is none."""
    from dane.baselines.fedprox import STALLED

    algorithm = FedProxConfig(mu=0.01, local_solver="problem").build(ridge_shards(1, SMALL)[0], LocalCommunicator())

    def records(suboptimality):
        head = [1.0 - 0.095 * t for t in range(10)]
        tail = [0.05 + s for s in suboptimality]
        return [{"round": t, "objective": f, "suboptimality": s}
                for t, (f, s) in enumerate(zip(head + tail, [0.95] * 10 + list(suboptimality)))]

    flat = [3e-5] * 100
    shrinking = [3e-5 * 0.989 ** t for t in range(100)]
    assert max(shrinking) - min(shrinking) < STALLED * 0.95
    assert "FedProx's fixed point" in algorithm.diagnosis(records(flat))
    assert "a larger algorithm.mu (now 0.01)" in algorithm.diagnosis(records(flat))
    assert algorithm.diagnosis(records(shrinking)) is None
    fedavg = FedProxConfig(mu=0.0, local_solver="steps", lr=0.1).build(ridge_shards(1, SMALL)[0], LocalCommunicator())
    assert "FedAvg's fixed point" in fedavg.diagnosis(records(flat))  # no prox term: its knobs are K and the step
    assert "fewer algorithm.local_steps (now 10) or a smaller algorithm.lr" in fedavg.diagnosis(records(flat))


def test_scaffnew_default_p_reads_a_true_lower_bound_of_the_strong_convexity():
    """p = sqrt(μ̲/L): μ̲ is the ℓ2 weight on the logistic loss (its Lanczos λ_min would be the curvature majorant's, an
    upper bound, and is not measured), the larger mean λ_min(H_i) on a quadratic, whose Lanczos runs to d products
    (a shorter one's smallest Ritz value lies above λ_min: `test_default_rules`)."""
    import numpy as np

    import dane

    X = np.random.default_rng(0).standard_normal((80, 4))
    y = (X @ np.ones(4) > 0).astype(float)
    ridge = dane.problems.Ridge(X, X @ np.ones(4), lam=1e-3)
    for problem, quadratic in ((dane.problems.LogReg(X, y, lam=1e-3), False), (ridge, True)):
        result = dane.fit(problem, "scaffnew", workers=4, rounds=1)
        (p,) = [e for e in result.summary["defaults"] if e["key"] == "algorithm.p"]
        mu_low, smoothness = p["stats"]["mu_low"], p["stats"]["smoothness"]
        assert (mu_low > 1e-3) if quadratic else (mu_low == 1e-3)
        assert p["stats"]["lanczos_exact"] is quadratic  # the summary says which bound it read
        assert p["value"] == math.sqrt(mu_low / smoothness)
