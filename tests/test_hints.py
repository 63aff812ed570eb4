"""Every hint a divergence message gives names an override the algorithm's config accepts (or, for a problem's local
solver key, one a convex problem's config accepts)."""
from __future__ import annotations

import pytest
import yaml

from dane.api import CONF_DIR, algorithm_config
from dane.loop.launch import recovery_overrides

ALGORITHMS = sorted(p.stem for p in (CONF_DIR / "algorithm").glob("*.yaml"))


@pytest.mark.parametrize("name", ALGORITHMS)
@pytest.mark.parametrize("overrides", [{}, {"safeguard": False}, {"adaptive_rho": False}])
def test_each_suggested_override_is_accepted(name, overrides):
    keys = yaml.safe_load((CONF_DIR / "algorithm" / f"{name}.yaml").read_text())
    overrides = {k: v for k, v in overrides.items() if k in keys}
    hints = recovery_overrides(algorithm_config(name, **overrides))
    assert hints, name
    for hint in hints:
        key, _, value = hint.split(" ")[0].partition("=")
        if key == "algorithm":
            assert (CONF_DIR / "algorithm" / f"{value}.yaml").is_file()
            continue
        if key.startswith("problem."):  # DANE's safeguard on a local solve that diverged: the convex problems' key
            from dane.problems import RidgeSyntheticConfig

            field = key.removeprefix("problem.")
            assert getattr(RidgeSyntheticConfig(**{field: yaml.safe_load(value)}), field) == yaml.safe_load(value)
            continue
        field = key.removeprefix("algorithm.")
        built = algorithm_config(name, **{**overrides, field: yaml.safe_load(value)})
        assert getattr(built, field) == yaml.safe_load(value)
    if name == "giant":  # GIANT has no mu; its safeguard (the shifts) is named only where it was turned off
        assert not any(h.startswith("algorithm.mu") for h in hints)
        assert ("algorithm.safeguard=true" in hints) == (overrides.get("safeguard") is False)


def test_a_step_that_is_not_positive_is_not_shrunk():
    """A config of one's own that does not check its lr ran lr=-5 to divergence and was told algorithm.lr=-0.5."""
    from dataclasses import dataclass

    import dane

    @dataclass(frozen=True)
    class Unchecked(dane.AlgorithmConfig):
        lr: float = -5.0
        name: str = "unchecked"

    assert recovery_overrides(Unchecked()) == ["algorithm=dane (safeguarded)"]
    assert recovery_overrides(Unchecked(lr=5.0)) == ["algorithm.lr=0.5", "algorithm=dane (safeguarded)"]


def test_a_hint_is_a_finite_value():
    """algorithm.lr=1e400 (Hydra reads inf) diverged and was told algorithm.lr=inf; a μ of 1e308 damping the step,
    algorithm.mu=inf.  A hint is a value one can set, or no hint for that key."""
    from dataclasses import dataclass

    import dane

    @dataclass(frozen=True)
    class Unchecked(dane.AlgorithmConfig):
        lr: float = float("inf")
        mu: float = 0.0
        name: str = "unchecked"
        mu_role = "damping"

    for config in (Unchecked(), Unchecked(mu=1e308), Unchecked(mu=float("inf")), Unchecked(lr=5e-324)):
        hints = recovery_overrides(config)
        assert not any(h.endswith(("=inf", "=0")) for h in hints), hints
    assert recovery_overrides(Unchecked()) == \
        ["algorithm.mu=0.001", "algorithm=dane (safeguarded)"]
    assert "algorithm.mu=1e+308" in recovery_overrides(Unchecked(mu=1e307))
    assert "algorithm.lr=1e+307" in recovery_overrides(Unchecked(lr=1e308))


@pytest.mark.parametrize("name, mu, expected", [
    ("dane", 0.1, "algorithm.mu=1"),                    # a proximal weight: ten-fold
    ("fedprox", 1e-5, "algorithm.mu=0.001"),            # at least 1e-3
    ("fednl", 0.2, "algorithm.mu=2"),                   # option 1's Hessian floor: a larger one, a shorter step
    ("acc_sdane", 1e300, "algorithm.mu=null (the default, from the problem: a μ above the objective's strong "
                         "convexity overstates it)"),  # was algorithm.mu=1e+301
    ("sdane", 0.5, "algorithm.mu=null (the default, from the problem: a μ above the objective's strong "
                   "convexity overstates it)"),
    ("adiana", 0.5, "algorithm.mu=null (the default, from the problem: a μ above the objective's strong "
                    "convexity overstates it)"),
])
def test_the_mu_hint_follows_what_mu_is(name, mu, expected):
    """A larger μ is safer where it damps the step (a proximal weight, a Hessian floor); where it is the objective's
    strong convexity (S-DANE, Acc-S-DANE, ADIANA), raising an overestimate was the wrong advice."""
    hints = [h for h in recovery_overrides(algorithm_config(name, mu=mu)) if h.startswith("algorithm.mu=")]
    assert hints == [expected]


@pytest.mark.parametrize("name", ALGORITHMS)
def test_every_config_with_a_mu_says_what_it_is(name):
    """The hint reads ``mu_role`` from the config class, not the key's name: each method with a ``mu`` declares it."""
    keys = yaml.safe_load((CONF_DIR / "algorithm" / f"{name}.yaml").read_text())
    role = type(algorithm_config(name)).mu_role
    assert role in (("damping", "strong_convexity") if "mu" in keys else (None,)), (name, role)


def test_a_mu_of_ones_own_gets_no_hint_unless_declared():
    from dataclasses import dataclass

    import dane

    @dataclass(frozen=True)
    class Own(dane.AlgorithmConfig):
        mu: float = 0.1
        name: str = "own"

    @dataclass(frozen=True)
    class Damped(Own):
        mu_role = "damping"

    assert recovery_overrides(Own()) == ["algorithm=dane (safeguarded)"]
    assert recovery_overrides(Damped()) == ["algorithm.mu=1", "algorithm=dane (safeguarded)"]


@pytest.mark.parametrize("stopped_by, remedy", [
    ("a note of one's own: set algorithm.eta below 2, it says", None),  # prose, not a remedy: the config's guesses
    ("the method's own reason", "set algorithm.eta below 2 (the paper's is 1)"),  # declared: named alone
])
def test_the_divergence_line_names_the_declared_remedy_not_what_stopped_by_says(monkeypatch, tmp_path, stopped_by,
                                                                                 remedy):
    """The line reads the summary's ``remedy`` (what the method declared, `dane.algorithm.Finished`), never the text
    of ``stopped_by``: a ": set <key> ..." in that text was taken for a remedy, and a remedy the text did not spell
    that way was lost to the config's guesses."""
    from dane.errors import DivergenceError
    from dane.loop import launch
    from dane.loop.spec import Communication, RunControl, RunSpec
    from dane.loop.stopping import StopRule
    from dane.problems import RidgeSyntheticConfig

    spec = RunSpec(problem=RidgeSyntheticConfig(n_samples=200, dim=10), algorithm=algorithm_config("dane"),
                   comm=Communication(workers=2), control=RunControl(stop=StopRule(rounds=3), quiet=True))
    summary = {"algorithm": "dane", "rounds": 1, "final_objective": 1.5, "status": "diverged",
               "stopped_by": stopped_by, "remedy": remedy}
    monkeypatch.setattr(launch, "start", lambda *args: summary)
    with pytest.raises(DivergenceError) as diverged:
        launch.execute(spec, str(tmp_path))
    told = remedy or "try " + " or ".join(recovery_overrides(spec.algorithm))
    assert str(diverged.value) == f"dane diverged at round 1 (objective 1.5); results so far are in {tmp_path}; {told}"
