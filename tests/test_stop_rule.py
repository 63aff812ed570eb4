"""The stop rule (issue 23, item 5 and item 3): ``tol`` relative to |O*|, ``tol_abs`` an absolute
floor, divergence caught early (above the start for ``diverge_after`` rounds, or past ``blowup``),
and the test that ended a run named in the summary."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import dane
from dane.runner import StopRule, run


class Scripted:
    """An algorithm whose round t reports objective ``values[t]``: the runner's rules in isolation."""

    class Comm:
        bytes_sent = calls = 0
        _t0 = 0.0  # what `restore_cost` moves back on a resume

        def elapsed(self):
            return 0.0

        def reset_clock(self):
            pass

    def __init__(self, values, optimum=None):
        self.values, self.optimum, self.t = list(values), optimum, 0
        self.comm, self.iterate = self.Comm(), torch.zeros(1)

    def _metrics(self):
        value = self.values[min(self.t, len(self.values) - 1)]
        return {"objective": value} if self.optimum is None else \
            {"objective": value, "suboptimality": value - self.optimum}

    def step(self):
        metrics = self._metrics()
        self.t += 1
        return metrics

    evaluate = _metrics

    def state_dict(self):
        return {"t": self.t}

    def load_state_dict(self, state):
        self.t = state["t"]


def test_tol_is_relative_to_the_optimum_and_tol_abs_is_a_floor():
    optimum = 2.4e9  # an unscaled target's O*: an absolute 1e-8 would ask for 4e-18 relative
    record = {"objective": optimum + 20.0, "suboptimality": 20.0}
    assert StopRule(tol=1e-8).status(record, record) == "converged"        # 20 <= 1e-8 * 2.4e9 = 24
    assert StopRule(tol=1e-9).status(record, record) is None               # 20 > 2.4
    assert StopRule(tol=1e-9, tol_abs=25.0).status(record, record) == "converged"  # the floor: max(2.4, 25)
    assert StopRule(tol_abs=19.0).status(record, record) is None           # tol_abs alone is the absolute test
    assert StopRule(tol=1e-9, tol_abs=25.0).rule(record) == "suboptimality <= max(1e-09 x |O*|, 25)"
    assert StopRule(tol_abs=25.0).rule(record) == "suboptimality <= 25"
    assert StopRule(tol_abs=25.0).rule({"grad_norm": 1.0}) is None          # no reference: tol_abs has nothing to test


def test_relative_tol_stops_in_the_same_round_when_the_targets_are_scaled():
    """O* scales with y², so an absolute tol moved with the units; the relative one does not."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((400, 8)) * np.logspace(0, 1, 8)
    y = X @ rng.standard_normal(8) + rng.standard_normal(400)
    rounds = []
    for scale in (1.0, 1e5):
        result = dane.fit(dane.problems.Ridge(X, y * scale, lam=1e-3, optimum="auto"), "dane", workers=4,
                          rounds=60, tol=1e-10, safeguard=False, mu=0.0)
        sub = result.table["suboptimality"]
        optimum = result.records[-1]["objective"] - sub[-1]
        assert result.status == "converged" and sub[-1] <= 1e-10 * abs(optimum) < sub[-2]
        assert result.summary["stop_rule"] == result.summary["stopped_by"] == "suboptimality <= 1e-10 x |O*|"
        rounds.append(result.summary["rounds"])
    assert rounds[0] == rounds[1] >= 2


def test_a_run_above_its_start_for_diverge_after_rounds_is_diverged():
    # round:   0    1    2    3    4    5    6    7    8    9
    values = [1.0, 0.9, 1.1, 1.2, 0.99, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8]
    records, status = run(algo := Scripted(values), StopRule(rounds=30, diverge_after=5))
    assert status == "diverged" and records[-1]["round"] == 9  # above 1.0 at rounds 5..9; the dip at 4 reset the count
    assert algo.stopped_by == "objective above its round-0 value for 5 rounds"
    records, status = run(Scripted(values), StopRule(rounds=10, diverge_after=None))
    assert status == "max_rounds" and len(records) == 11


def test_a_rise_past_blowup_or_a_non_finite_objective_stops_at_once():
    records, status = run(algo := Scripted([2.0, 3.0, 2.0e4 + 1.0, 1.0]), StopRule(rounds=10, blowup=1e4))
    assert status == "diverged" and records[-1]["round"] == 2  # 20001 > 1e4 x max(1, 2) = 20000
    assert algo.stopped_by == "|objective| > 10000 x max(1, |objective at round 0|)"
    records, status = run(algo := Scripted([2.0, math.nan]), StopRule(rounds=10))
    assert status == "diverged" and records[-1]["round"] == 1 and algo.stopped_by == "objective not finite"


def test_the_divergence_count_survives_a_checkpoint():
    values = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6]
    states = []
    run(Scripted(values), StopRule(rounds=3, diverge_after=5), on_checkpoint=states.append, checkpoint_every=3)
    assert states[-1]["divergence"] == {"above": 2}  # the state before round 3: rounds 1 and 2 above
    records, status = run(Scripted(values), StopRule(rounds=30, diverge_after=5), resume=states[-1])
    assert status == "diverged" and records[-1]["round"] == 5  # rounds 1..5 above: three more after the resume at 3


def test_slow_divergence_ends_early_with_the_records_kept():
    """GD with a step 2.2/L grows the top eigendirection by |1 - 2.2| = 1.2 a round: slow, but above the start
    for good once it gets there; the run stops five rounds later, far below the old 1e8 x start."""
    rng = np.random.default_rng(1)
    X = rng.standard_normal((200, 5)) * np.array([1.0, 1.0, 1.0, 1.0, 3.0])
    y = X @ np.ones(5)
    problem = dane.problems.Ridge(X, y, lam=1e-3)
    lipschitz = float(np.linalg.eigvalsh(X.T @ X / 200).max()) + 1e-3  # of (1/2N)||Xw - y||^2 + (lam/2)||w||^2
    result = dane.fit(problem, "gd", workers=2, rounds=200, lr=2.2 / lipschitz)
    objectives = result.table["objective"]
    assert result.status == "diverged"
    assert result.summary["stopped_by"] == "objective above its round-0 value for 5 rounds"
    assert all(v > objectives[0] for v in objectives[-5:]) and objectives[-6] <= objectives[0]
    assert objectives[-1] < 1e3 * objectives[0]


@pytest.mark.slow  # three launches of the command line (~20 s each under load); the fast tests above hold the rules
def test_a_launched_slow_divergence_exits_3_with_a_hint_the_config_accepts(tmp_path):
    """GD at 2.2/L on diabetes ridge from the command line: caught by diverge_after, exit 3, records kept, and
    the hint's override (algorithm.lr=...) is a key gd has: rerunning with it converges."""
    from dane.data.files import BuiltinSource
    from dane.problems.linear_models import LinearModelConfig
    from tests.helpers import train

    X = LinearModelConfig(data=BuiltinSource("diabetes"), fit_intercept=True).table().X
    lipschitz = float(np.linalg.eigvalsh(X.T @ X / len(X)).max()) + 1e-3
    base = ("problem=ridge", "algorithm=gd", "workers=2", "rounds=300", "quiet=true")
    proc = train(*base, f"algorithm.lr={2.2 / lipschitz!r}", f"out_dir={tmp_path / 'a'}")
    assert proc.returncode == 3, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("error: gd diverged at round") and "try algorithm.lr=" in line
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["stopped_by"] == "objective above its round-0 value for 5 rounds" and summary["rounds"] < 60
    hint = line.split("try ", 1)[1].split(" or ")[0]
    again = train(*base, hint, "rounds=40", f"out_dir={tmp_path / 'b'}")
    assert again.returncode == 0, again.stderr
    objectives = [json.loads(line)["objective"] for line in (tmp_path / "b" / "rounds.jsonl").read_text().splitlines()]
    assert all(b <= a for a, b in zip(objectives, objectives[1:]))  # lr = 0.22/L: a descent method again


def test_tol_abs_and_diverge_after_are_read_from_the_config_and_checked_in_one_line():
    from omegaconf import OmegaConf

    from dane.errors import ConfigError
    from dane.experiments.config import stop_rule

    cfg = OmegaConf.create({"rounds": 30, "tol_abs": 1e-3, "diverge_after": None})
    assert stop_rule(cfg, 1e-8) == StopRule(rounds=30, tol=1e-8, tol_abs=1e-3, diverge_after=None)
    assert stop_rule(OmegaConf.create({"rounds": 30}), None).diverge_after == 5  # the default
    for key, value, message in (("tol_abs", -1, "tol_abs must be > 0, got -1"),
                                ("diverge_after", 0, "diverge_after must be a positive integer, got 0")):
        with pytest.raises(ConfigError, match=f"^{message}$"):
            stop_rule(OmegaConf.create({"rounds": 30, key: value}), None)
