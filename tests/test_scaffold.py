"""SCAFFOLD's default local step (baselines/scaffold.py): η_l = min(2/(L + μ̲), lr_factor/L, 1/(K μ̲)),
L = max_i L_i, μ̲ = max(ℓ2 curvature, mean_i λ_min(H_i)) (a quadratic whose Lanczos is exact: d = 12 below its 20
iterations), each branch against the closed form from eigvalsh, and SCAFFOLD with one local step and η_g = 1 at that
default step is GD with the same step."""
from __future__ import annotations

import pytest
import torch

from dane.baselines import GDConfig, ScaffoldConfig
from dane.errors import ConfigError
from dane.problems import RidgeSyntheticConfig
from helpers import ridge_shards, simulate, simulate_stacked

M = 4
#: 60 rows a shard over 12 features: well conditioned (L/μ̲ about 5)
WELL = RidgeSyntheticConfig(n_samples=240, dim=12, lam=0.01, noise_std=0.5)
#: 8 rows a shard over 12 features: every H_i is singular but for the ℓ2 term, μ̲ = 2λ ≪ L
SINGULAR = RidgeSyntheticConfig(n_samples=32, dim=12, lam=1e-4, noise_std=0.5)


def spectrum(config: RidgeSyntheticConfig) -> tuple[float, float]:
    """(L, μ̲) = (max_i λ_max(H_i), max(2λ, mean_i λ_min(H_i))), H_i = A_i + 2λI, from numpy's eigvalsh."""
    eigs = [torch.linalg.eigvalsh(s.A + 2 * s.lam * torch.eye(config.dim, dtype=torch.float64))
            for s in ridge_shards(M, config)]
    return max(float(e[-1]) for e in eigs), max(2 * config.lam, sum(float(e[0]) for e in eigs) / M)


def default_lr(config, problem: RidgeSyntheticConfig) -> float:
    """η_l of round 0's record (what lr null chose), the same on every worker."""
    out = simulate(config, ridge_shards(M, problem), rounds=2)
    lrs = {records[0]["lr"] for _, records, _ in out}
    assert len(lrs) == 1
    return lrs.pop()


def test_the_default_step_is_the_smallest_of_its_three_bounds():
    for problem, K, binding in ((WELL, 10, 2), (WELL, 1, 0), (SINGULAR, 10, 1)):
        L, mu_low = spectrum(problem)
        bounds = (2 / (L + mu_low), 1.9 / L, 1 / (K * mu_low))
        assert min(range(3), key=bounds.__getitem__) == binding, (problem, K, bounds)  # each branch once
        assert default_lr(ScaffoldConfig(local_steps=K), problem) == pytest.approx(min(bounds), rel=1e-10)
    L, _ = spectrum(SINGULAR)
    assert default_lr(ScaffoldConfig(lr_factor=1.5), SINGULAR) == pytest.approx(1.5 / L, rel=1e-10)


def test_one_local_step_at_the_default_step_is_gd_with_that_step():
    L, mu_low = spectrum(WELL)
    lr = min(2 / (L + mu_low), 1.9 / L)
    problem = WELL.build_stacked(M)  # the identity is the point: the M workers as one stacked computation
    _, _, w_scaffold = simulate_stacked(ScaffoldConfig(local_steps=1), problem, rounds=6)[0]
    _, _, w_gd = simulate_stacked(GDConfig(lr=lr), problem, rounds=6)[0]
    assert len(w_scaffold) == len(w_gd)
    for a, b in zip(w_scaffold, w_gd):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)  # lr agrees to Lanczos' round-off, not bit for bit


@pytest.mark.parametrize("factor", [0.0, 2.0, 3.5])
def test_lr_factor_outside_zero_two_is_refused(factor):
    with pytest.raises(ConfigError, match="algorithm.lr_factor"):
        ScaffoldConfig(lr_factor=factor)


@pytest.mark.parametrize("keys, server_lr", [({}, 1.5), ({"local_steps": 3}, 1.0), ({"lr": 0.05}, 1.0)])
def test_the_default_server_step(keys, server_lr):
    """server_lr null is 1.5 with the rule's local step and an even K, else the paper's 1 (module docstring).  With
    one client c_i = c and the correction vanishes, so a round is K gradient steps y ← y − η_l ∇O(y) from w and
    w ← w + η_g (y − w): the iterates against that transcription, with η_l from the records."""
    shard = ridge_shards(1, WELL)
    _, records, iterates = simulate(ScaffoldConfig(**keys), shard, rounds=4)[0]
    assert {r["server_lr"] for r in records if "lr" in r} == {server_lr}  # the last record: evaluated, not stepped
    lr, K = records[0]["lr"], keys.get("local_steps", 10)
    w = iterates[0]
    for got in iterates[1:]:
        y = w
        for _ in range(K):
            y = y - lr * shard[0].grad(y)
        w = w + server_lr * (y - w)
        torch.testing.assert_close(got, w, rtol=0, atol=1e-12)
