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
from dane.algorithm import Rounds
from dane.errors import ConfigError
from dane.loop.runner import run
from dane.loop.stopping import DivergenceWatch, EarlyStopping, StopRule


class Scripted(Rounds):
    """An algorithm whose round t reports objective ``values[t]``: the runner's rules in isolation."""

    class Comm:
        bytes_sent = calls = 0

        def elapsed(self):
            return 0.0

        def restore_clock(self, elapsed):
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


def test_tol_of_one_or_more_without_a_reference_is_refused_at_the_first_record_with_one_it_is_a_test(tmp_path):
    """tol=1 without a reference optimum stopped every run "converged (grad_norm <= 1 x grad_norm at round 0) after
    0 rounds", having done nothing: the gradient test holds at round 0 for any tol >= 1.  It is refused in one line
    at the first record, before the run writes it; with a reference, tol=2 is a relative suboptimality that can fail
    (here at 3 |O*|), and tol below 1 is the gradient test as before."""
    line = ("tol=1 would stop this run at round 0, having done nothing: without a reference optimum its test is "
            "grad_norm <= tol x grad_norm at round 0, which holds there for any tol >= 1; set tol below 1, or measure "
            "the suboptimality, which problem.optimum=auto gives where the problem can solve for it")
    first = {"round": 0, "objective": 4.0, "grad_norm": 2.0}
    with pytest.raises(ConfigError) as refused:
        StopRule(tol=1.0).status(first, first)
    assert str(refused.value) == line
    assert StopRule(tol=0.5).status(first, first) is None
    assert StopRule(tol=0.5).status({**first, "round": 1, "grad_norm": 1.0}, first) == "converged"
    record = {"round": 0, "objective": 4.0, "suboptimality": 3.0}  # O* = 1
    assert StopRule(tol=2.0).status(record, record) is None
    assert StopRule(tol=3.0).status(record, record) == "converged"

    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 3))
    with pytest.raises(ConfigError) as refused:
        dane.fit(dane.problems.LogReg(X, (X[:, 0] > 0).astype(float), lam=0.1), "gd", workers=2, tol=1,
                 out_dir=str(tmp_path / "run"))
    assert str(refused.value) == line
    assert not (tmp_path / "run" / "rounds.jsonl").exists() and not (tmp_path / "run" / "summary.json").exists()


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


def test_a_run_above_its_start_in_diverge_after_of_twice_as_many_rounds_is_diverged():
    line = "objective above its round-0 value in 5 of the last 10 rounds"
    # round:   0    1    2    3    4    5    6    7    8    9
    values = [1.0, 0.9, 1.1, 1.2, 0.99, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8]
    records, status = result = run(Scripted(values), StopRule(rounds=30, diverge_after=5))
    assert status == "diverged" and records[-1]["round"] == 7  # above 1.0 at 2, 3, 5, 6, 7 (five running: 9)
    assert result.stopped_by == line
    # a cycle between a point below the start and one above it (plain DANE on breast_cancer logistic, m=4,
    # 0.610 <-> 1.366 from 0.693): never five rounds running, five of ten by round 10
    cycle = [0.693] + [0.610, 1.366] * 10
    records, status = result = run(Scripted(cycle), StopRule(rounds=30, diverge_after=5))
    assert status == "diverged" and records[-1]["round"] == 10 and result.stopped_by == line
    # a rise for a round or two now and then (ADMM's consensus point, AIDE's extrapolation) is not divergence
    bumps = [1.0, 1.2, 1.1, 0.9, 0.8, 0.7, 1.05, 0.6, 0.5, 0.4, 1.01, 0.3, 0.2, 0.1, 1.02, 0.05]
    records, status = run(Scripted(bumps), StopRule(rounds=len(bumps) - 1, diverge_after=5))
    assert status == "max_rounds" and len(records) == len(bumps)  # at most four of any ten rounds above 1.0
    records, status = run(Scripted(values), StopRule(rounds=10, diverge_after=None))
    assert status == "max_rounds" and len(records) == 11


def test_a_rise_past_blowup_or_a_non_finite_objective_stops_at_once():
    records, status = result = run(Scripted([2.0, 3.0, 2.0e4 + 1.0, 1.0]), StopRule(rounds=10, blowup=1e4))
    assert status == "diverged" and records[-1]["round"] == 2  # 20001 > 1e4 x max(1, 2) = 20000
    assert result.stopped_by == "|objective| > 10000 x max(1, |objective at round 0|)"
    records, status = result = run(Scripted([2.0, math.nan]), StopRule(rounds=10))
    assert status == "diverged" and records[-1]["round"] == 1 and result.stopped_by == "objective not finite"


def test_a_record_exactly_at_the_tolerance_is_converged():
    """``suboptimality <= max(tol · |O*|, tol_abs)`` and ``grad_norm <= tol · grad_norm_0``, equality included (binary
    fractions: O* = 2.5 - 0.5 = 2, 0.25 · 2 = 0.5 exactly)."""
    record = {"objective": 2.5, "suboptimality": 0.5}
    assert StopRule(tol=0.25).status(record, record) == "converged"
    assert StopRule(tol_abs=0.5).status(record, record) == "converged"
    assert StopRule(tol_abs=0.25).status(record, record) is None
    first = {"objective": 3.0, "grad_norm": 4.0}
    assert StopRule(tol=0.25).status({"objective": 2.0, "grad_norm": 1.0}, first) == "converged"


def test_blowup_is_relative_to_at_least_one_so_a_tiny_start_is_not_a_tiny_bound():
    """Past ``blowup`` x max(1, |O(w_0)|): from O(w_0) = 1e-3 the bound is 1e4, not 10."""
    first = {"objective": 1e-3}
    assert StopRule(blowup=1e4).status({"objective": 20.0}, first) is None
    assert StopRule(blowup=1e4).status({"objective": 1e4}, first) is None
    assert StopRule(blowup=1e4).status({"objective": -1.5e4}, first) == "diverged"


def test_the_patient_window_rule_wants_a_rise_so_a_plateau_above_the_start_is_not_divergence():
    """Above round 0 in each of the last 2 · diverge_after rounds *and* the newer half's sum above the older half's:
    a flat run at 2 (sums 4 = 4) goes on; one that ends at 3 diverges."""
    first = {"objective": 1.0}
    plateau = DivergenceWatch(StopRule(diverge_after=2), patient=True)
    assert [plateau.update({"objective": 2.0}, first) for _ in range(5)] == [None] * 5
    rising = DivergenceWatch(StopRule(diverge_after=2), patient=True)
    assert [rising.update({"objective": v}, first) for v in (2.0, 2.0, 2.0, 3.0)] == [None, None, None, "diverged"]


def test_early_stopping_with_min_delta_0_stops_patience_rounds_into_an_exact_plateau():
    """An equal value is no improvement (it must beat the best by more than min_delta = 0): the best stays at round 1,
    and round 1 + patience stops the run."""
    watch = EarlyStopping(StopRule(patience=2))
    verdicts = [watch.update({"round": t, "test_accuracy": a}) for t, a in enumerate([0.5, 0.75, 0.75, 0.75])]
    assert verdicts == [None, None, None, "early_stopped"] and watch.best_round == 1


def test_the_divergence_count_survives_a_checkpoint():
    values = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6]
    states = []
    run(Scripted(values), StopRule(rounds=3, diverge_after=5), on_checkpoint=states.append, checkpoint_every=3)
    assert states[-1]["divergence"] == {"above": [False, True, True]}  # the state before round 3: rounds 0..2
    records, status = run(Scripted(values), StopRule(rounds=30, diverge_after=5), resume=states[-1])
    assert status == "diverged" and records[-1]["round"] == 5  # rounds 1..5 above: three more after the resume at 3
    old = DivergenceWatch(StopRule(diverge_after=5))  # a checkpoint written before the window: a count of rounds running
    old.load_state_dict({"above": 2})
    assert [old.update({"objective": 2.0}, {"objective": 1.0}) for _ in range(3)] == [None, None, "diverged"]


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
    assert result.summary["stopped_by"] == "objective above its round-0 value in 5 of the last 10 rounds"
    assert all(v > objectives[0] for v in objectives[-5:]) and objectives[-6] <= objectives[0]
    assert objectives[-1] < 1e3 * objectives[0]


@pytest.mark.slow  # three launches of the command line (~20 s each under load); the fast tests above hold the rules
def test_a_launched_slow_divergence_exits_3_with_a_hint_the_config_accepts(tmp_path):
    """GD at 2.2/L on diabetes ridge from the command line: caught by diverge_after, exit 3, records kept, and
    the hint's override (algorithm.lr=null, back to GD's rule) is a key gd has: rerunning with it converges."""
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
    assert summary["stopped_by"] == "objective above its round-0 value in 5 of the last 10 rounds" and summary["rounds"] < 60
    hint = line.split("try ", 1)[1].split(" or ")[0].split(" (")[0]  # the override, without its reason
    again = train(*base, hint, "rounds=40", f"out_dir={tmp_path / 'b'}")
    assert again.returncode == 0, again.stderr
    objectives = [json.loads(line)["objective"] for line in (tmp_path / "b" / "rounds.jsonl").read_text().splitlines()]
    assert all(b <= a for a, b in zip(objectives, objectives[1:]))  # lr=null, GD's rule: a descent method again


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


class ScriptedGradient(Scripted):
    """`Scripted` without a reference optimum but with a gradient norm ``grads[t]`` at round t."""

    def __init__(self, values, grads):
        super().__init__(values)
        self.grads = list(grads)

    def _metrics(self):
        return {"objective": self.values[min(self.t, len(self.values) - 1)],
                "grad_norm": self.grads[min(self.t, len(self.grads) - 1)]}

    evaluate = _metrics


def test_a_run_at_its_cap_says_how_many_more_rounds_its_rate_needs():
    """Suboptimality 1e-2 x 0.9^t with O* = 2: the fit over the last 20 rounds is the rate itself, and the rounds
    still needed are the closed form ceil(log(tol |O*| / v_30) / log 0.9), rounded to two digits in the line."""
    optimum, rate = 2.0, 0.9
    subopts = [1e-2 * rate ** t for t in range(31)]
    stop = StopRule(rounds=30, tol=1e-8)
    records, status = result = run(Scripted([optimum + v for v in subopts], optimum=optimum), stop)
    trend = stop.trend(records, records[0])
    assert status == "max_rounds" and trend.rate == pytest.approx(rate, rel=1e-9) and trend.span == 20
    assert trend.value == records[-1]["suboptimality"] == pytest.approx(subopts[30], rel=1e-9)  # (2 + v) - 2: round-off
    assert trend.target == pytest.approx(1e-8 * optimum, rel=1e-12)
    more = math.ceil(math.log(1e-8 * optimum / subopts[30]) / math.log(rate))
    assert trend.more_rounds() == more == 95
    assert result.stopped_by == (f"rounds = 30; suboptimality {subopts[30] / optimum:.1e} x |O*|, shrinking 0.90x per "
                               "round over the last 20 rounds: about 95 more rounds to tol 1e-08 (try rounds=130)")
    # tol_abs binding: the absolute target, shown in absolute units
    records, _ = result = run(Scripted([optimum + v for v in subopts], optimum=optimum),
                     StopRule(rounds=30, tol_abs=1e-6))
    assert result.stopped_by.endswith(f"about {math.ceil(math.log(1e-6 / subopts[30]) / math.log(rate))} more rounds "
                                    "to tol_abs 1e-06 (try rounds=88)")
    assert f"suboptimality {subopts[30]:.1e}," in result.stopped_by


def test_a_stalled_or_growing_run_at_its_cap_says_so_and_projects_nothing():
    flat = [2.0 + 1e-3 * (1 + 1e-5 * (-1) ** t) for t in range(31)]  # moves log v by far less than 1 % over 20 rounds
    records, _ = result = run(Scripted(flat, optimum=2.0), StopRule(rounds=30, tol=1e-8))
    assert result.stopped_by == "rounds = 30; suboptimality 5.0e-04 x |O*|, stalled (no progress over the last 20 rounds)"
    growing = [2.0 + 1e-3 * 1.05 ** t for t in range(31)]
    records, _ = result = run(Scripted(growing, optimum=2.0), StopRule(rounds=30, tol=1e-8, diverge_after=None))
    assert result.stopped_by == (f"rounds = 30; suboptimality {1e-3 * 1.05 ** 30 / 2:.1e} x |O*|, not contracting "
                               "(growing 1.050x per round over the last 20 rounds)")
    assert StopRule(rounds=30, tol=1e-8).trend(records, records[0]).more_rounds() is None
    records, _ = result = run(Scripted(growing[:2], optimum=2.0), StopRule(rounds=1, tol=1e-8))
    assert result.stopped_by == "rounds = 1"  # two records, one round: too few to fit
    # converged as far as float64 goes (no tol set): 20 ulps of O* = 2 is the objective's round-off, not a stall
    at_floor = [2.0 + 2.0 ** -52 * 40 * (1 + 0.5 * (-1) ** t) for t in range(31)]
    records, _ = result = run(Scripted(at_floor, optimum=2.0), StopRule(rounds=30))
    assert result.stopped_by.startswith("rounds = 30; suboptimality ") and \
        result.stopped_by.endswith(" x |O*|, at the objective's round-off (set tol to stop sooner)"), result.stopped_by


def test_a_slow_but_steady_run_is_projected_over_the_later_half_not_called_stalled():
    """Suboptimality 1e-3 x 0.9997^t (GD on an ill-conditioned ridge): the last 20 rounds move log v by 0.6 %, under
    the 1 % that counts as progress, so the fit is taken again over the later 50 of 100 rounds (1.5 %)."""
    optimum, rate = 2.0, 0.9997
    subopts = [1e-3 * rate ** t for t in range(101)]
    stop = StopRule(rounds=100, tol=1e-8)
    records, _ = result = run(Scripted([optimum + v for v in subopts], optimum=optimum), stop)
    trend = stop.trend(records, records[0])
    assert trend.span == 50 and trend.rate == pytest.approx(rate, rel=1e-9)
    more = math.ceil(math.log(1e-8 * optimum / subopts[100]) / math.log(rate))
    assert trend.more_rounds() == more and 35_000 < more < 37_000
    assert result.stopped_by == (f"rounds = 100; suboptimality {subopts[100] / optimum:.1e} x |O*|, shrinking 0.99970x "
                               f"per round over the last 50 rounds: about {round(more, -3):,} more rounds to tol 1e-08 "
                               f"(try rounds={-(-(100 + more) // 1000) * 1000})")


def test_without_a_reference_the_projection_reads_the_gradient_norm():
    """grad_norm 5 x 0.8^t, tol 1e-12 of round 0's: ceil(log(1e-12 / 0.8^25) / log 0.8) more rounds."""
    grads = [5.0 * 0.8 ** t for t in range(26)]
    records, status = result = run(ScriptedGradient([1.0 / (t + 1) for t in range(26)], grads),
                          StopRule(rounds=25, tol=1e-12))
    more = math.ceil(math.log(1e-12 / 0.8 ** 25) / math.log(0.8))
    assert status == "max_rounds" and more == 99
    assert result.stopped_by == (f"rounds = 25; grad_norm {0.8 ** 25:.1e} x its round-0 value, shrinking 0.80x per "
                               "round over the last 20 rounds: about 99 more rounds to tol 1e-12 (try rounds=130)")
    records, _ = result = run(ScriptedGradient([1.0] * 26, grads), StopRule(rounds=25))  # no tol: the rate alone
    assert result.stopped_by == (f"rounds = 25; grad_norm {0.8 ** 25:.1e} x its round-0 value, shrinking 0.80x per "
                               "round over the last 20 rounds")
    # a gradient norm flat at 1e-16 of round 0's (far below 64 ulps): its round-off, though the window still falls
    floor = [5.0 * 0.5 ** t if t < 16 else 5e-16 for t in range(26)]
    _, _ = result = run(ScriptedGradient([1.0] * 26, floor), StopRule(rounds=25))
    assert result.stopped_by == "rounds = 25; grad_norm 1.0e-16 x its round-0 value, at the gradient's round-off (set " \
                                "tol to stop sooner)"
    # tol_abs bounds a suboptimality these records cannot show: the line says it tested nothing
    _, _ = result = run(ScriptedGradient([1.0] * 26, grads), StopRule(rounds=25, tol_abs=1e-10))
    assert result.stopped_by.endswith("over the last 20 rounds; tol_abs 1e-10 not applied: the run has no reference "
                                      "optimum to measure the suboptimality by, which problem.optimum=auto gives "
                                      "where the problem can solve for it")


def test_a_network_whose_loss_falls_is_not_called_stalled_for_its_gradient_norm():
    """A network's gradient norm is not monotone: ADMM on digits_mlp kept it at 1.0x its round-0 value while its
    objective fell 2.333 -> 1.370 and its test accuracy rose 0.142 -> 0.797, and the line read "stalled (no progress
    over the last 2 rounds)"; DANE on mnist_lenet5 "not contracting" as its accuracy rose.  The line now says what
    improved over the fitted rounds first and the gradient norm's fit as a separate fact; a run where nothing
    improved, or whose gradient norm shrinks, reads as before."""
    def records(objective, grads, **tests):
        return [{"round": t, "objective": o, "grad_norm": g, **{k: v[t] for k, v in tests.items()}}
                for t, (o, g) in enumerate(zip(objective, grads))]

    def line(rows, **stop):
        return StopRule(rounds=len(rows) - 1, **stop).stopped_by("max_rounds", rows[-1], rows[0], rows)

    admm = records([2.33263373, 1.84391522, 1.37048697], [0.7105, 0.7572, 0.7169],
                   test_loss=[2.3160, 1.8367, 1.3775], test_accuracy=[0.1417, 0.5639, 0.7972])
    assert line(admm) == ("rounds = 2; objective 2.333 -> 1.370 and test accuracy 0.142 -> 0.797 over the last 2 "
                          "rounds; grad_norm 1.0e+00 x its round-0 value, flat")
    growing = records([2.30468512, 2.20588279, 1.98477054], [0.04782, 0.2673, 1.052])
    assert line(growing, tol=1e-6) == ("rounds = 2; objective 2.305 -> 1.985 over the last 2 rounds; grad_norm "
                                       "2.2e+01 x its round-0 value, growing 4.69x per round")
    # the objective flat (a training loss at its floor) but the test loss falling: that, and not the objective
    held = records([0.5, 0.5, 0.5], [1.0, 1.5, 2.25], test_loss=[0.9, 0.8, 0.7])
    assert line(held) == ("rounds = 2; test loss 0.9000 -> 0.7000 over the last 2 rounds; grad_norm 2.2e+00 x its "
                          "round-0 value, growing 1.50x per round")
    # nothing improved by FELL (a convex run at its floor): the verdict stands
    flat = records([1.0, 1.0 - 1e-5, 1.0 - 2e-5], [1.0, 1.0, 1.0], test_accuracy=[0.9, 0.9, 0.9])
    assert line(flat) == "rounds = 2; grad_norm 1.0e+00 x its round-0 value, stalled (no progress over the last 2 rounds)"
    worse = records([1.0, 1.1, 1.2], [1.0, 2.0, 4.0])
    assert line(worse) == ("rounds = 2; grad_norm 4.0e+00 x its round-0 value, not contracting (growing 2.00x per "
                           "round over the last 2 rounds)")
    # a shrinking gradient norm is progress already: the line is unchanged
    shrinking = records([2.0, 1.5, 1.0], [1.0, 0.5, 0.25])
    assert line(shrinking) == "rounds = 2; grad_norm 2.5e-01 x its round-0 value, shrinking 0.50x per round over the " \
                              "last 2 rounds"


def test_gd_stopped_at_its_cap_converges_where_the_projection_said():
    """Gradient descent on a ridge contracts at a fixed rate once its fast modes are gone: the projection from a
    run capped at 40 rounds names the round at which the uncapped run converges, within two rounds."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 5)) * np.array([1.0, 1.0, 1.0, 1.0, 3.0])
    y = X @ rng.standard_normal(5) + rng.standard_normal(200)
    capped = dane.fit(dane.problems.Ridge(X, y, lam=1e-3, optimum="auto"), "gd", workers=2, rounds=40, tol=1e-10)
    more = int(capped.summary["stopped_by"].split("about ")[1].split(" more rounds")[0].replace(",", ""))
    assert capped.status == "max_rounds" and "shrinking" in capped.summary["stopped_by"] and more > 20
    whole = dane.fit(dane.problems.Ridge(X, y, lam=1e-3, optimum="auto"), "gd", workers=2, rounds=400, tol=1e-10)
    assert whole.status == "converged" and abs(whole.summary["rounds"] - (40 + more)) <= 2


def test_under_client_sampling_the_projection_fits_the_later_half_of_the_run():
    """Suboptimality 0.99^t times a swing that rises over the last 20 rounds (a sampled run's noise): the 20-round
    fit grows, "not contracting"; with the records' ``clients`` below the workers the line fits rounds 50 to 100,
    whose least-squares rate is computed here by hand, and reads "shrinking"."""
    from dane.records.projection import fit
    from dane.loop.runner import why_stopped

    t = np.arange(101)
    sub = 0.99 ** t * np.exp(np.where(t > 80, 0.02 * (t - 80), 0.05 * np.sin(t)))
    records = [{"round": int(k), "objective": 1.0 + float(s), "suboptimality": float(s), "clients": 8} for k, s in
               zip(t, sub)]
    half = t[50:]
    slope = np.polyfit(half, np.log(sub[50:]), 1)[0]
    assert fit(records, "suboptimality")[0] > 1.0
    rate, span, _ = fit(records, "suboptimality", noisy=True)
    assert (span, rate) == (50, pytest.approx(math.exp(slope), rel=1e-12)) and rate < 1.0

    class Comm:
        size = 80

    stop = StopRule(rounds=100, tol=1e-8)
    sampled = why_stopped(Rounds(), stop, "max_rounds", records, records[0], DivergenceWatch(stop, Comm()))
    full = why_stopped(Rounds(), stop, "max_rounds", records, records[0], None)
    assert f"shrinking {math.exp(slope):.4f}x per round over the last 50 rounds" in sampled
    assert "not contracting" in full


def test_a_rate_never_reads_one_or_zero():
    """Two significant digits of the distance from 1, or of the rate itself below 0.1 (it read "0.00" for a run
    contracting by 1e-3 a round)."""
    from dane.records.projection import rate_text

    assert [rate_text(r) for r in (0.996, 0.988, 1.02, 0.9, 0.5, 0.0012, 3.4e-5)] == \
        ["0.9960", "0.988", "1.020", "0.90", "0.50", "0.0012", "3.4e-05"]


def test_only_a_counted_divergence_is_told_it_may_turn_the_watch_off():
    """diverge_after=null turns off the count test (an overshoot that falls back trips it), not the blow-up test: the
    line offers it for the one, not the other (a gd past blowup was told it too)."""
    from sklearn.datasets import load_diabetes

    import dane
    from dane.api import algorithm_config
    from dane.errors import DivergenceError
    from dane.loop.launch import execute
    from dane.loop.spec import Communication, RunControl, RunSpec

    X, y = load_diabetes(return_X_y=True)
    L = float(np.linalg.eigvalsh(X.T @ X / len(X)).max()) + 1e-3

    def line(lr: float) -> str:
        spec = RunSpec(problem=dane.problems.Ridge(X, y, lam=1e-3), algorithm=algorithm_config("gd", lr=lr),
                       comm=Communication(workers=2), control=RunControl(stop=StopRule(rounds=300), quiet=True))
        with pytest.raises(DivergenceError) as diverged:
            execute(spec, None)
        return str(diverged.value)

    assert line(2.2 / L).endswith("; where its objective overshot and is falling back, diverge_after=null lets it "
                                  "go on")
    assert "diverge_after" not in line(100.0 / L)  # past blowup at once


def test_a_blow_up_under_diverge_after_null_is_the_divergence_line(tmp_path):
    """diverge_after=null turns off the count test only: a gd past blowup still stops with the one-line
    DivergenceError (exit 3), its summary written; the line has no count test to offer (it raised TypeError on 2 *
    None)."""
    import dane
    from dane.api import algorithm_config
    from dane.errors import DivergenceError
    from dane.loop.launch import execute
    from dane.records.results import read_summary
    from dane.loop.spec import Communication, RunControl, RunSpec

    stop = StopRule(rounds=50, diverge_after=None)
    assert stop.counted_divergence() is None
    spec = RunSpec(problem=dane.problems.RidgeSyntheticConfig(n_samples=48, dim=10),
                   algorithm=algorithm_config("gd", lr=5.0), comm=Communication(workers=4),
                   control=RunControl(stop=stop, quiet=True))
    with pytest.raises(DivergenceError, match=r"^gd diverged at round 2 \(objective 2.35e\+05\); results so far are "
                                              r"in .*; try algorithm.lr=null \(the default, which the package's "
                                              r"rule picks\) or algorithm=dane \(safeguarded\)$"):
        execute(spec, str(tmp_path))
    # a process that writes no folder (a launched rank other than 0, which gets out_dir None): no folder named
    with pytest.raises(DivergenceError) as diverged:
        execute(spec, None)
    assert str(diverged.value) == "gd diverged at round 2 (objective 2.35e+05); try algorithm.lr=null (the " \
                                  "default, which the package's rule picks) or algorithm=dane (safeguarded)"
    summary = read_summary(tmp_path)
    assert (summary["status"], summary["stopped_by"]) == ("diverged", "|objective| > 10000 x max(1, |objective at "
                                                                      "round 0|)")


def test_a_methods_own_ending_gives_stopped_by_its_reason_and_remedy_and_the_result_its_remedy():
    """`dane.algorithm.Finished`: ``stopped_by`` reads "<why>: <remedy>" (as DANE's safeguard wrote it), and the
    remedy is kept apart for the summary; a plain (status, why) names none, and a stop test's status none either."""
    from dane.algorithm import Finished
    from dane.loop.runner import own_ending, why_stopped

    records, stop = [{"round": 0, "objective": 2.0}, {"round": 1, "objective": 2.0}], StopRule(rounds=5)
    algo = Rounds()
    algo.finished = Finished("diverged", "gave up", remedy="set algorithm.eta below 2 (the paper's is 1)")
    assert why_stopped(algo, stop, "diverged", records, records[0]) == \
        "gave up: set algorithm.eta below 2 (the paper's is 1)"
    assert own_ending(algo, "diverged", records, None).remedy == "set algorithm.eta below 2 (the paper's is 1)"
    assert own_ending(algo, "max_rounds", records, None) is None
    algo.finished = ("one_shot", "the one-shot average is final")
    assert why_stopped(algo, stop, "one_shot", records, records[0]) == "the one-shot average is final"
    assert own_ending(algo, "one_shot", records, None) == ("one_shot", "the one-shot average is final", None)
