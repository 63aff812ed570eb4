"""``problem=controlled_quadratic`` (dane/problems/controlled_quadratic.py): the dissimilarity, the mean Hessian and
the optimum it states, checked on the shards it builds, and its config's refusals."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dane.errors import ConfigError
from dane.numerics.similarity import measure
from dane.problems import ControlledQuadratic


def test_the_controlled_quadratic_has_the_dissimilarity_it_is_given():
    """max_i ‖H_i − H‖₂ = δ exactly, mean_i H_i = H = A + μI with A's spectrum log-spaced on [1e-6, L] (mean_i E_i = 0),
    every local Hessian at least μI (the exact local solves need convex local problems), and w° the optimum of the mean
    objective; the clients' linear terms differ too."""
    config = ControlledQuadratic(dim=40, delta=0.05, mu=1e-3, seed=2)
    shards = [config.build(rank, 5) for rank in range(5)]
    eye = torch.eye(40, dtype=torch.float64)
    H_i = [s.A + 2 * s.lam * eye for s in shards]
    H = sum(H_i) / 5
    assert max(float(torch.linalg.eigvalsh(h - H).abs().max()) for h in H_i) == pytest.approx(0.05, rel=1e-12)
    assert min(float(torch.linalg.eigvalsh(h)[0]) for h in H_i) >= 1e-3 * (1 - 1e-9)
    spectrum = torch.linalg.eigvalsh(H - 1e-3 * eye).numpy()
    np.testing.assert_allclose(spectrum, np.geomspace(1e-6, 1.0, 40), rtol=1e-8, atol=1e-12)  # L = 1
    w_star = torch.linalg.solve(H, sum(s.b for s in shards) / 5)
    torch.testing.assert_close(w_star, shards[0].w_star, rtol=0, atol=1e-9)
    assert np.linalg.norm(shards[0].b.numpy() - shards[1].b.numpy()) > 0


def test_the_measured_dissimilarity_is_the_one_set():
    """`dane.numerics.similarity.measure` (what the federated benchmark reports) finds δ at any w: the Hessians are
    constant; δ_A, the mean-square one, is at most δ."""
    config = ControlledQuadratic(dim=30, delta=0.2, mu=1e-6, seed=0)
    shards = [config.build(rank, 4) for rank in range(4)]
    found = measure(shards, torch.zeros(30, dtype=torch.float64))
    assert found["delta"] == pytest.approx(0.2, rel=1e-9)
    H = sum(s.A for s in shards) / 4  # δ_A = sqrt(mean_i ‖H_i − H‖₂²), by hand from the shards' matrices
    spread = [float(torch.linalg.eigvalsh(s.A - H).abs().max()) for s in shards]
    assert found["delta_mean_square"] == pytest.approx(math.sqrt(sum(x * x for x in spread) / 4), rel=1e-9)
    assert found["delta_mean_square"] < found["delta"]  # the shards are not all 0.2 away


def test_the_yaml_builds_it_and_bad_values_are_one_line():
    from dane.experiments.config import run_spec
    from dane.synthetic.sweep import compose_job

    spec = run_spec(compose_job(("problem=controlled_quadratic", "problem.dim=12", "workers=3", "seed=4")))
    assert spec.problem == ControlledQuadratic(dim=12, seed=4)
    with pytest.raises(ConfigError, match=r"problem.delta must be in \(0, problem.L = 1\], got 2"):
        ControlledQuadratic(delta=2.0)
    with pytest.raises(ConfigError, match="needs workers >= 2, got 1"):
        ControlledQuadratic(dim=4).check_workers(1)
