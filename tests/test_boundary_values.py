"""Boundary values of the algorithms' keys (1e308, 0, null where a number is taken): each ends in one line that names
the key, a refusal at set-up where a bound can be stated, else the run ended as diverged with its records and summary
kept (exit 3, `dane.errors.DivergenceError`), never a traceback nor a line that names another cause."""
from __future__ import annotations

import json
import math
import warnings

import pytest
import torch

from dane.api import algorithm_config
from dane.baselines.admm import ADMMConfig
from dane.baselines.bc_newton import FedNLBCConfig
from dane.baselines.dingo import PHI_MAX, DINGOConfig
from dane.baselines.feddane import FedDANEConfig
from dane.baselines.fednl import FedNLConfig
from dane.baselines.newton_3pc import Newton3PCConfig
from dane.baselines.nl1 import NL1Config
from dane.baselines.sdane import SDANEConfig
from dane.dane import DANEConfig
from dane.errors import ConfigError, DivergenceError
from dane.loop.launch import execute, recovery_overrides
from dane.loop.spec import Communication, RunControl, RunSpec
from dane.loop.stopping import StopRule
from dane.numerics.local_solvers import LocalSolver
from dane.problems.controlled_quadratic import ControlledQuadratic
from dane.problems.linear_models import LinearModelConfig
from dane.problems.neural import DataConfig, ModelConfig, NeuralProblemConfig
from dane.split.config import SplitConfig

LOGREG = LinearModelConfig(data=DataConfig(dataset="breast_cancer"), loss="logistic", name="logreg", lam=1e-3, seed=0)


def diverged(algorithm, out_dir, problem=LOGREG, rounds: int = 3, collect: dict | None = None,
             batched: str = "auto") -> tuple[str, list[dict], dict]:
    """The divergence line of ``algorithm`` on 2 simulated workers, with the records and summary it kept."""
    spec = RunSpec(problem=problem, algorithm=algorithm, comm=Communication(backend="local", workers=2,
                                                                            batched=batched),
                   control=RunControl(stop=StopRule(rounds=rounds), quiet=True, progress="none"))
    with pytest.raises(DivergenceError) as raised:
        execute(spec, str(out_dir), collect=collect)
    records = [json.loads(line) for line in (out_dir / "rounds.jsonl").read_text().splitlines()]
    return str(raised.value), records, json.loads((out_dir / "summary.json").read_text())


@pytest.mark.parametrize("batched", ["false", "true"])
def test_dingo_direction_not_finite_keeps_x_and_names_theta(tmp_path, batched):
    """θ = 1e308: θ‖g‖² = inf, case 3's p is not finite; the round keeps x_0 = 0 with no line-search trial and the
    run ends diverged on round 0's record, naming θ.  Before, x_1 = x_0 + 0·p was NaN and round 1's Cholesky
    factorization raised a traceback, no summary written."""
    collected: dict = {}
    line, records, summary = diverged(DINGOConfig(theta=1e308), tmp_path, collect=collected, batched=batched)
    assert line == (f"dingo diverged at round 0 (objective 0.693); results so far are in {tmp_path}; "
                    "set algorithm.theta below 1e+308 (the paper's is 1e-4)")
    assert summary["stopped_by"].startswith("DINGO's direction p is not finite (case 3, θ‖g‖² = inf); the round kept")
    assert [(r["round"], r["step_size"], r["case"], r["clients_uplink_bits"]) for r in records] == [(0, 0.0, 3, 0)]
    assert collected["w"].abs().max() == 0  # x_0, not NaN


def test_overflowing_linear_term_names_eta_not_a_singular_hessian(tmp_path):
    """η = 1e308 overflows DANE's local solve (its Newton direction is not finite): the solve ends there, the
    safeguard rejects the trial and names η; before, the next Newton step factored the Hessian at that point and the
    run stopped with exit 2 on "the local Hessian plus 0.001 I is not positive definite"."""
    line, records, summary = diverged(DANEConfig(eta=1e308), tmp_path / "dane")
    assert line.endswith("set algorithm.eta below 1e+308 (the paper's is 1)")
    assert summary["status"] == "diverged" and summary["remedy"] == "set algorithm.eta below 1e+308 (the paper's is 1)"
    assert [r["accepted"] for r in records] == [True, False] and records[1]["objective"] == records[0]["objective"]
    line, records, summary = diverged(FedDANEConfig(eta=1e308), tmp_path / "feddane")
    assert "diverged at round 1 (objective nan)" in line and "; try algorithm.eta=1 (the paper's) or " in line
    assert [r["round"] for r in records] == [0, 1] and summary["status"] == "diverged"
    # S-DANE's v-update (B v + aμ x − a G)/(B + aμ) is inf/inf at μ = 1e308: v is not finite, the solve from it too
    line, records, summary = diverged(SDANEConfig(mu=1e308), tmp_path / "sdane")
    assert "diverged at round 2 (objective nan)" in line and "try algorithm.mu=null (the default" in line
    assert records[1]["objective"] < records[0]["objective"]  # x_1 is the mean of finite solves


@pytest.mark.parametrize("batched", ["false", "true"])
def test_nl1_coefficients_not_finite_keep_x_and_name_eta(tmp_path, batched):
    """η = 1e308 overflows the clients' changes η n_i/K (α_j − h_j) of B: round 0 keeps x_0 = 0 and the run ends on
    its record, naming η.  Before, B_1 was not finite and round 1's cho_factor raised a traceback, no summary."""
    collected: dict = {}
    line, records, summary = diverged(NL1Config(eta=1e308), tmp_path, collect=collected, batched=batched)
    assert line.endswith("; set algorithm.eta below 1e+308, or null (K/n_i, at which a kept h_j becomes α_j)")
    assert line.startswith("nl1 diverged at round 0 (objective 0.693)") and summary["status"] == "diverged"
    assert summary["stopped_by"].startswith("NL1's learned Hessian coefficients are not finite")
    assert [r["round"] for r in records] == [0] and collected["w"].abs().max() == 0


def test_split_step_above_the_model_dtype_is_refused_at_set_up():
    """torch's SGD and Adam take the step in the parameters' dtype: 1e308 > float32's 3.403e38 stopped the first step
    with "value cannot be converted to type float without overflow" (a traceback); now the spec refuses it, naming
    the key, and takes it where the model is float64 (problem.dtype=null: the run's dtype)."""
    def spec(dtype, run_dtype=torch.float64, **keys):
        network = NeuralProblemConfig(data=DataConfig(dataset="digits"), model=ModelConfig(name="mlp"), dtype=dtype,
                                      device="cpu", seed=0)
        return RunSpec(problem=network, algorithm=SplitConfig(**keys), comm=Communication(backend="local", workers=2),
                       control=RunControl(dtype=run_dtype))
    with pytest.raises(ConfigError) as raised:
        spec("float32", agent_lr=1e308)
    assert str(raised.value) == ("algorithm.agent_lr=1e+308 exceeds the largest float32 (3.403e+38), the model's dtype "
                                 "(problem.dtype), in which the optimizer takes its step; the default is 0.05")
    with pytest.raises(ConfigError, match=r"^algorithm.server_lr=3.5e\+38 exceeds the largest float32"):
        spec("float32", server_optimizer="adam", server_lr=3.5e38)
    assert spec(None, agent_lr=1e308).algorithm.agent_lr == 1e308 and spec("float32", agent_lr=3.4e38)
    with pytest.raises(ConfigError) as raised:  # problem.dtype=null: the run's dtype= is the key that made it float32
        spec(None, torch.float32, agent_lr=1e308)
    assert "the model's dtype (dtype), in which" in str(raised.value)


def test_rowless_quadratic_names_the_key_that_chose_the_solver():
    """InexactDANE's SVRG is its own key (a `LocalSolver` with keys="algorithm"): the refusal on a problem without
    rows named problem.local_solver, which controlled_quadratic does not even have."""
    shard = ControlledQuadratic(dim=20).build(0, 2)
    r = torch.ones(20, dtype=torch.float64)
    with pytest.raises(ConfigError) as raised:
        shard.solve_hessian(r, shift=1.0, with_reg=True, solver=LocalSolver(method="svrg", keys="algorithm"))
    assert str(raised.value) == ("algorithm.local_solver=svrg needs the shard's rows; QuadraticProblem has only its "
                                 "Hessian: use algorithm.local_solver=cholesky or cg")
    with pytest.raises(ConfigError, match=r"^problem.local_solver=lbfgs needs the shard's rows; .*: use "
                                          r"problem.local_solver=cholesky or cg$"):
        shard.solve_hessian(r, shift=1.0, with_reg=True, solver=LocalSolver(method="lbfgs"))


@pytest.mark.parametrize("value", [0, -1, 1e308, "local_retry"])
def test_adapt_that_is_no_list_is_refused_naming_the_key(value):
    """``algorithm.adapt=0`` was "algorithm: TypeError("'int' object is not iterable")" (``tuple(0)``), and a bare
    name was taken letter by letter ("must be one of ..., got l")."""
    with pytest.raises(ConfigError) as raised:
        SDANEConfig(adapt=value)
    assert str(raised.value) == ("algorithm.adapt must be a list of algorithm=sdane's adaptation names ([double_weight, "
                                 "sampling_floor, local_retry] or some of them, [] for none, null for each that "
                                 f"applies), got {value!r}")
    with pytest.raises(ConfigError, match=r"^algorithm.adapt must be a list of algorithm=admm's adaptation names "
                                          r"\(\[rho_refresh\] or some"):
        ADMMConfig(adapt=value)
    assert SDANEConfig(adapt=["local_retry"]).adapt == ("local_retry",)


@pytest.mark.parametrize("config", [FedNLConfig, FedNLBCConfig])
@pytest.mark.parametrize("key", ["ls_c", "ls_gamma"])
def test_line_search_constant_null_is_refused_naming_the_key(config, key):
    """``algorithm.ls_c=null`` was "algorithm: TypeError("'<' not supported between instances of 'int' and
    'NoneType'")"; a number outside the range keeps its line."""
    with pytest.raises(ConfigError) as raised:
        config(**{key: None})
    assert str(raised.value) == f"algorithm.{key} must be a number, got None"
    with pytest.raises(ConfigError) as raised:
        config(**{key: 0})
    assert str(raised.value) == f"algorithm.{key} must be in {dict(ls_c='(0, 0.5]', ls_gamma='(0, 1)')[key]}, got 0"
    top = {"ls_c": 0.5, "ls_gamma": math.nextafter(1.0, 0.0)}[key]  # the range's top is taken, the next float is not
    assert getattr(config(**{key: top}), key) == top
    with pytest.raises(ConfigError, match=rf"^algorithm.{key} must be in "):
        config(**{key: math.nextafter(top, 2.0)})


def test_a_given_step_goes_back_to_the_rule_where_the_default_is_null():
    """GD's lr=1e308 was told algorithm.lr=1e+307, which diverges too, and ADIANA's gamma=1e308 nothing: where the
    config's default is null (a rule of the package picks the step) the hint is that null; synchronous SGD's lr
    (default 0.05, no rule) still gets a tenth."""
    rule = "=null (the default, which the package's rule picks)"
    assert recovery_overrides(algorithm_config("gd", lr=1e308)) == [f"algorithm.lr{rule}", "algorithm=dane (safeguarded)"]
    assert recovery_overrides(algorithm_config("adiana", gamma=1e308))[0] == f"algorithm.gamma{rule}"
    assert recovery_overrides(algorithm_config("sync_sgd", lr=1e308))[0] == "algorithm.lr=1e+307"
    assert not any(h.startswith("algorithm.lr") for h in recovery_overrides(algorithm_config("gd")))  # null: none


def test_dingo_phi_whose_square_overflows_is_refused():
    """φ = 1e308: φ² = inf in H_i² + φ²I, a RuntimeWarning on stderr of a run that finished; now refused at set-up."""
    with pytest.raises(ConfigError) as raised:
        DINGOConfig(phi=1e308)
    assert str(raised.value) == ("algorithm.phi must be at most 1.341e+154, got 1e+308: φ² enters H_i² + φ²I and must "
                                 "be a finite float; the paper's is 1e-6")
    assert math.isfinite(PHI_MAX ** 2) and DINGOConfig(phi=PHI_MAX).phi == PHI_MAX  # the bound itself is taken
    with pytest.raises(ConfigError):
        DINGOConfig(phi=math.nextafter(PHI_MAX, math.inf))


def test_newton_3pc_trigger_past_the_largest_float_is_quiet():
    """LAG's trigger ‖X − H_i‖² > ζ‖X − Y_i‖² at ζ = 1e308 overflows to inf, which no finite left side exceeds: the
    records are those of ζ = 1e100 (neither fires after round 0), with no RuntimeWarning (there was one on stderr)."""
    def records(zeta):
        spec = RunSpec(problem=LOGREG, algorithm=Newton3PCConfig(zeta=zeta), comm=Communication(workers=2),
                       control=RunControl(stop=StopRule(rounds=3), quiet=True, progress="none"))
        collected: dict = {}
        execute(spec, None, collect=collected)
        return [(r["objective"], r["clients_uplink_bits"]) for r in collected["records"]]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert records(1e308) == records(1e100)


def test_feddane_hands_back_the_papers_eta_from_any_eta_above_it():
    """FedDANE's first divergence hint is the paper's η = 1 for any η above it (the matrix's 1e308, and 10 alike),
    none at or below it."""
    hint = ["algorithm.eta=1 (the paper's)"]
    assert FedDANEConfig(eta=10.0).recovery() == FedDANEConfig(eta=1e308).recovery() == hint
    assert FedDANEConfig(eta=1.0).recovery() == FedDANEConfig(eta=0.5).recovery() == []
