"""The divergence watch under client sampling (issue 33 item 2): a sampled run is diverged once its objective is
above round 0's in every one of the last 2 · diverge_after rounds and rising over them; full participation keeps
its "diverge_after of the last 2 · diverge_after rounds" (tests/test_stop_rule.py)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import dane
from dane.algorithm import Rounds
from dane.loop.runner import run
from dane.loop.stopping import DivergenceWatch, StopRule

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"

# S-DANE at four times its sampled default λ (0.261) on phishing over 80 Dirichlet (α = 0.5) clients, 8 a round,
# rounds 0..11 (scripts/bench_sampled_lambda.py's cell; the run went on to 0.32 by round 120): above 0.69315 at
# rounds 1, 2, 3, 6, 7, so the full-participation window stopped it as diverged at round 7
PHISHING_SDANE_4X = [0.69315, 0.73886, 0.74821, 0.69682, 0.64795, 0.64337, 0.79634, 0.75418, 0.64624, 0.56374,
                     0.56987, 0.55843]


class Scripted(Rounds):
    """Round t reports ``values[t]`` with ``clients`` of ``workers`` taking part."""

    class Comm:
        bytes_sent = calls = 0

        def __init__(self, size):
            self.size = size

        def elapsed(self):
            return 0.0

        def restore_clock(self, elapsed):
            pass

    def __init__(self, values, clients, workers):
        self.values, self.clients, self.t = list(values), clients, 0
        self.comm, self.iterate = self.Comm(workers), torch.zeros(1)

    def step(self):
        value = self.values[min(self.t, len(self.values) - 1)]
        self.t += 1
        return {"objective": value, "clients": self.clients}

    def evaluate(self):
        return {"objective": self.values[min(self.t, len(self.values) - 1)], "clients": self.clients}

    def state_dict(self):
        return {"t": self.t}

    def load_state_dict(self, state):
        self.t = state["t"]


def test_a_noisy_sampled_run_above_its_start_in_five_of_ten_rounds_is_not_diverged():
    stop = StopRule(rounds=len(PHISHING_SDANE_4X) - 1, diverge_after=5)
    records, status = run(Scripted(PHISHING_SDANE_4X, clients=8, workers=80), stop)
    assert status == "max_rounds" and len(records) == len(PHISHING_SDANE_4X)
    # the same objectives with every client taking part: the full-participation rule, unchanged, fires at round 7
    records, status = run(Scripted(PHISHING_SDANE_4X, clients=80, workers=80), stop)
    assert status == "diverged" and records[-1]["round"] == 7


def test_a_sampled_climb_is_diverged_once_ten_rounds_above_the_start_and_rising():
    # round:  0    1 .. 10 above and rising: stopped at round 10; a dip below the start restarts the count
    climb = [1.0] + [1.0 + 0.1 * t for t in range(1, 30)]
    records, status = result = run(Scripted(climb, clients=2, workers=4), StopRule(rounds=40, diverge_after=5))
    assert status == "diverged" and records[-1]["round"] == 10
    assert result.stopped_by == ("objective above its round-0 value in each of the last 10 rounds and rising over "
                                 "them (the rule under client sampling: 2 of 4 clients a round)")
    dipped = [1.0] + [1.0 + 0.1 * t for t in range(1, 6)] + [0.9] + [1.0 + 0.1 * t for t in range(7, 30)]
    records, status = run(Scripted(dipped, clients=2, workers=4), StopRule(rounds=40, diverge_after=5))
    assert status == "diverged" and records[-1]["round"] == 16  # rounds 7..16 above
    # above the start for good but falling: a slow sampled descent from a rise, not divergence
    falling = [1.0] + [2.0 - 0.02 * t for t in range(1, 30)]
    records, status = run(Scripted(falling, clients=2, workers=4), StopRule(rounds=29, diverge_after=5))
    assert status == "max_rounds" and all(v > 1.0 for v in falling[1:])


def test_the_sampled_window_survives_a_checkpoint_and_full_participation_state_is_unchanged():
    climb = [1.0] + [1.0 + 0.1 * t for t in range(1, 30)]
    states = []
    run(Scripted(climb, 2, 4), StopRule(rounds=4, diverge_after=5), on_checkpoint=states.append, checkpoint_every=4)
    assert states[-1]["divergence"] == {"above": [False, True, True, True], "objectives": climb[:4]}
    records, status = run(Scripted(climb, 2, 4), StopRule(rounds=40, diverge_after=5), resume=states[-1])
    assert status == "diverged" and records[-1]["round"] == 10
    full = DivergenceWatch(StopRule(diverge_after=5), Scripted.Comm(4))
    full.update({"objective": 1.0, "clients": 4}, {"objective": 1.0})
    assert full.state_dict() == {"above": [False]}


def test_a_truly_diverging_sampled_run_is_still_stopped():
    """FedAvg (FedProx with μ = 0, one step) at 2.2/L on 2 of 4 ridge clients is sampled GD whose top direction
    grows about 1.2 times a round: stopped by the sampled window, far below ``blowup``."""
    rng = np.random.default_rng(1)
    X = rng.standard_normal((200, 5)) * np.array([1.0, 1.0, 1.0, 1.0, 3.0])
    y = X @ np.ones(5)
    problem = dane.problems.Ridge(X, y, lam=1e-3)
    lipschitz = float(np.linalg.eigvalsh(X.T @ X / 200).max()) + 1e-3
    result = dane.fit(problem, "fedprox", workers=4, rounds=200, mu=0.0, local_steps=1, lr=2.2 / lipschitz,
                      clients_per_round=2)
    objectives = result.table["objective"]
    assert result.status == "diverged"
    assert result.summary["stopped_by"].startswith("objective above its round-0 value in each of the last 10 rounds")
    assert all(v > objectives[0] for v in objectives[-10:]) and sum(objectives[-5:]) > sum(objectives[-10:-5])
    assert objectives[-1] < 1e3 * objectives[0] and len(objectives) < 60


@pytest.mark.slow  # about 10 s: the run itself, on the real table (skips without it)
def test_the_phishing_false_positive_itself_runs_on():
    """The run PHISHING_SDANE_4X was recorded from, to round 12: the objectives are those above (to the digits
    kept), the full-participation rule would have stopped it at round 7, and the sampled rule lets it run."""
    if not (SHARED_DATA / "libsvm" / "phishing").is_file():
        pytest.skip(f"{SHARED_DATA / 'libsvm' / 'phishing'} is absent")
    from helpers import composed

    from dane.experiments.config import run_spec
    from dane.loop.launch import execute

    job = ["algorithm=sdane", "problem=logreg", "data=libsvm", "data.path=libsvm/phishing", "workers=80",
           "data.sharding=dirichlet", "data.alpha=0.5", "rounds=11", "quiet=true", f"data_dir={SHARED_DATA}",
           "algorithm.clients_per_round=8", "algorithm.lam=0.2610771413870375"]
    cfg = composed(*job)
    collected = {}
    assert execute(run_spec(cfg), None, collect=collected)["status"] == "max_rounds"
    objectives = [r["objective"] for r in collected["records"]]
    np.testing.assert_allclose(objectives, PHISHING_SDANE_4X, rtol=0, atol=5e-6)
    above = [v > objectives[0] for v in objectives]
    assert sum(above[:8]) == 5  # five of rounds 0..7 above the start: the old window's verdict at round 7
