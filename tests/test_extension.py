"""A method from outside the package: tests/outside/my_fedprox.py and its yaml, found through --config-dir and
``_target_``, run in the simulator, under torchrun and through the Python API, against its closed form.

On ridge shards O_i(w) = s ||X_i w - y_i||² + λ||w||², the method's round is
w_{t+1} = (1/m) Σ_i (2s X_iᵀX_i + (2λ + μ) I)⁻¹ (2s X_iᵀy_i + μ w_t), computed here from the rows alone.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import dane
from dane.api import build
from dane.errors import ConfigError
from dane.problems import RidgeSyntheticConfig
from dane.records.results import read_rounds
from dane.run_config import algorithm_class, staleness
import runs
from helpers import REPO, torchrun, train

OUTSIDE = Path(__file__).resolve().parent / "outside"
sys.path.insert(0, str(OUTSIDE))
from my_fedprox import MyFedProx, MyFedProxConfig  # noqa: E402 - the user's own file, from its own folder

N, D, LAM, MU, ROUNDS, M = 600, 8, 0.01, 0.5, 6, 2
COMMAND = ["--config-dir", str(OUTSIDE / "conf"), "algorithm=my_fedprox", f"algorithm.mu={MU}",
           "problem=ridge_synthetic", f"problem.n_samples={N}", f"problem.dim={D}", f"problem.lam={LAM}",
           f"rounds={ROUNDS}", "save_iterate=true"]
OUTSIDE_ON_PATH = {"PYTHONPATH": os.pathsep.join([str(REPO), str(OUTSIDE)])}


def closed_form() -> tuple[list[torch.Tensor], list[float]]:
    """w_0 = 0, ..., w_ROUNDS of the round in the module docstring, and O(w_t) = (1/m) Σ_i O_i(w_t)."""
    shards = [RidgeSyntheticConfig(n_samples=N, dim=D, lam=LAM).build(rank, M) for rank in range(M)]
    eye = torch.eye(D, dtype=torch.float64)
    w, iterates = torch.zeros(D, dtype=torch.float64), []
    for _ in range(ROUNDS + 1):
        iterates.append(w)
        w = sum(torch.linalg.solve(2 * s.scale * s.X.T @ s.X + (2 * LAM + MU) * eye, 2 * s.scale * s.X.T @ s.y + MU * w)
                for s in shards) / M
    objective = [sum(float(s.scale * (s.X @ w - s.y).square().sum() + LAM * w @ w) for s in shards) / M
                 for w in iterates]
    return iterates, objective


def assert_closed_form(records: list[dict], final: torch.Tensor) -> None:
    iterates, objective = closed_form()
    assert [r["round"] for r in records] == list(range(ROUNDS + 1))
    assert [r["objective"] for r in records] == pytest.approx(objective, rel=1e-12)
    assert [r["mu"] for r in records[:-1]] == [MU] * ROUNDS
    assert [r["comm_rounds"] for r in records] == list(range(ROUNDS + 1))  # one allreduce per round
    torch.testing.assert_close(final, iterates[-1], rtol=1e-12, atol=1e-14)


def test_an_outside_algorithm_declares_its_capabilities_and_is_asked_for_them():
    node = OmegaConf.create({"_target_": "my_fedprox.MyFedProxConfig", "name": "my_fedprox", "mu": MU})
    assert algorithm_class(node) is MyFedProx and MyFedProxConfig.algorithm is MyFedProx
    assert not MyFedProx.elastic and not MyFedProx.asynchronous
    # client sampling is a config's keys (`dane.sampling.SamplingKeys`), not a flag: a config without them refuses
    # algorithm.clients_per_round in one line naming the keys it takes
    with pytest.raises(ConfigError, match=r"^algorithm.clients_per_round is not a key of algorithm=my_fedprox; its "
                                          r"keys: mu, name$"):
        build(OmegaConf.create({"algorithm": {**node, "clients_per_round": 2}}), "algorithm")
    cfg = OmegaConf.create({"comm": {"staleness": 1}, "algorithm": node, "sim": {"topology": "ps"}})
    with pytest.raises(ConfigError, match=r"^comm.staleness=1 with algorithm=my_fedprox: my_fedprox averages local "
                                          r"solves that all start from w_t; set comm.staleness=0 \(only local_sgd and "
                                          r"sync_sgd run asynchronously\)$"):
        staleness(cfg, "local")
    with pytest.raises(ConfigError, match=r"^algorithm.mu must be a number > 0, got -1$"):
        MyFedProxConfig(mu=-1)


def test_an_outside_algorithm_through_the_python_api_equals_its_closed_form():
    problem = RidgeSyntheticConfig(n_samples=N, dim=D, lam=LAM, local_solver="cholesky",  # auto: a rule
                                   factorization="cholesky")
    result = dane.fit(problem, MyFedProxConfig(mu=MU), workers=M, rounds=ROUNDS)
    assert_closed_form(result.records, result.w)
    # given every number, it says so as the package's methods do: the defaults policy's four keys, no rule applied
    assert {k: result.summary[k] for k in ("defaults", "adaptations", "adaptations_attached",
                                           "package_rules_applied")} == \
        {"defaults": [], "adaptations": [], "adaptations_attached": [], "package_rules_applied": False}


@contextmanager
def outside_on_path(tmp):
    """In the batch process: the user's folder on sys.path, as OUTSIDE_ON_PATH puts it on a process's."""
    sys.path.insert(0, str(OUTSIDE))
    try:
        yield
    finally:
        sys.path.remove(str(OUTSIDE))


IN_THE_SIMULATOR = runs.command("extension:simulator", *COMMAND, f"workers={M}", "out_dir={tmp}/extension",
                                around="test_extension:outside_on_path")


def test_an_outside_algorithm_from_its_yaml_in_the_simulator_equals_its_closed_form(commands):
    proc, tmp_path = commands[IN_THE_SIMULATOR], commands.tmp / "extension"
    assert proc["rc"] == 0, proc["stdout"] + proc["stderr"]
    assert_closed_form(read_rounds(tmp_path), torch.load(tmp_path / "iterate.pt"))
    header = next(line for line in proc["stdout"].splitlines() if line.split()[:1] == ["round"])
    assert header.split() == ["round", "time_s", "bytes_sent", "objective", "suboptimality", "grad_norm", "mu"]


def test_an_outside_algorithms_run_records_the_hashes_of_its_file_and_yaml(commands):
    """The --config-dir run's summary pins the code git_commit does not: the module its ``_target_`` names and the
    yaml it composed from the folder, each by the SHA-256 of its bytes."""
    assert commands[IN_THE_SIMULATOR]["rc"] == 0
    provenance = json.loads((commands.tmp / "extension" / "summary.json").read_text())["provenance"]
    module, yaml_file = OUTSIDE / "my_fedprox.py", OUTSIDE / "conf" / "algorithm" / "my_fedprox.yaml"
    assert provenance["own_code"] == {"my_fedprox": {"path": str(module),
                                                     "sha256": hashlib.sha256(module.read_bytes()).hexdigest()}}
    assert provenance["config_dirs"] == {
        str(OUTSIDE / "conf"): {"algorithm/my_fedprox.yaml": hashlib.sha256(yaml_file.read_bytes()).hexdigest()}}


TINY_PROBLEM = '''\
from dataclasses import dataclass

from dane.problems import RidgeSyntheticConfig


@dataclass(frozen=True)
class TinyRidge(RidgeSyntheticConfig):
    """The package's ridge problem under a name of one's own."""

    name: str = "tiny_ridge"
'''


def test_a_run_records_its_own_problems_file_hash_and_a_package_run_records_none(tmp_path, monkeypatch):
    """In process, as the entry point runs it (Hydra's runtime config set, then `run_spec`): a problem of one's own
    in tmp_path, found on the search path, is in the summary's provenance by its file's SHA-256 (and its yaml's); a
    run of the package's problem has neither key, its provenance keys are those of a run before they existed."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from dane.loop.launch import execute
    from dane.run_config import run_spec
    from helpers import composed

    (tmp_path / "conf" / "problem").mkdir(parents=True)
    (tmp_path / "tiny_own_problem.py").write_text(TINY_PROBLEM)
    (tmp_path / "conf" / "problem" / "tiny_ridge.yaml").write_text(
        "_target_: tiny_own_problem.TinyRidge\nname: tiny_ridge\nn_samples: 40\ndim: 3\nseed: ${seed}\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def provenance(run: str, *overrides: str) -> dict:
        cfg = composed(*overrides, "workers=2", "rounds=1", "quiet=true", f"out_dir={tmp_path / run}", hydra=True)
        monkeypatch.setattr(HydraConfig.instance(), "cfg", OmegaConf.masked_copy(cfg, "hydra"))
        with open_dict(cfg):
            del cfg["hydra"]  # as the entry point gets it
        execute(run_spec(cfg), str(tmp_path / run))
        return json.loads((tmp_path / run / "summary.json").read_text())["provenance"]

    try:
        own = provenance("own", f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "problem=tiny_ridge")
    finally:
        sys.modules.pop("tiny_own_problem", None)  # tmp_path's module: no later test imports it by this name
    module = tmp_path / "tiny_own_problem.py"
    assert own["own_code"] == {"tiny_own_problem": {"path": str(module.resolve()),
                                                    "sha256": hashlib.sha256(module.read_bytes()).hexdigest()}}
    yaml_file = tmp_path / "conf" / "problem" / "tiny_ridge.yaml"
    assert own["config_dirs"] == {
        str(tmp_path / "conf"): {"problem/tiny_ridge.yaml": hashlib.sha256(yaml_file.read_bytes()).hexdigest()}}
    package = provenance("package", "problem=ridge_synthetic", "problem.n_samples=40", "problem.dim=3")
    assert set(package) == {"git_commit", "git_dirty", "command", "started_at", "host", "load_avg", "torch",
                            "cpu_capability", "machine"} == set(own) - {"own_code", "config_dirs"}


@pytest.mark.slow  # two launched processes (torchrun): kept out of the fast suite's time budget
def test_an_outside_algorithm_under_torchrun_equals_its_closed_form(tmp_path):
    proc = train(*COMMAND, "quiet=true", f"out_dir={tmp_path}", launcher=torchrun(M), extra_env=OUTSIDE_ON_PATH)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_closed_form(read_rounds(tmp_path), torch.load(tmp_path / "iterate.pt"))


def test_a_class_of_ones_own_lacking_a_method_is_one_line():
    """An Algorithm without its round, a config without build, a problem without the local solve DANE calls: each is
    one line naming the class, the method and the page that describes it (tracebacks before)."""
    from dataclasses import dataclass

    from dane.errors import MissingMethod

    class NoRound(dane.Algorithm):
        name = "noround"

    @dataclass(frozen=True)
    class NoRoundConfig(dane.AlgorithmConfig):
        name: str = "noround"
        algorithm = NoRound

        def build(self, problem, comm):
            return NoRound(problem, comm)

    @dataclass(frozen=True)
    class NoBuild(dane.AlgorithmConfig):
        name: str = "nobuild"
        algorithm = NoRound

    ridge = RidgeSyntheticConfig(n_samples=N, dim=D, lam=LAM)
    with pytest.raises(MissingMethod, match=r"^NoRound \(algorithm=noround\) must define step \(docs/extending\.md\)$"):
        dane.fit(ridge, NoRoundConfig(), workers=2, rounds=1)
    with pytest.raises(MissingMethod, match=r"^NoBuild must define build\(problem, comm\) \(docs/extending\.md\)$"):
        NoBuild().build(None, None)
    with pytest.raises(MissingMethod, match=r"must define prox_solve\(anchor, linear, mu\) \(docs/extending\.md\)"):
        dane.Problem.prox_solve(object.__new__(dane.Problem), None, None, 0.0)
