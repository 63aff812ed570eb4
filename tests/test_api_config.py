"""A run folder written by `dane.fit` records which settings ran in its ``config.yaml``, at a command-line run's key
paths (`dane.api.recorded_config`), so that the figures and tables that read one tell API runs apart as they tell
command-line runs apart; an in-memory problem's arrays by their shape and content fingerprint, never their entries."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import scipy.sparse
import yaml
from hydra.utils import get_class

import dane
from dane.errors import ConfigError
from dane.layout import CONF_DIR
from dane.paper_figs import fednl_bits, local_work
from dane.paper_figs.plot_runs import flatten, labels_for
from dane.paper_figs.summary import read_config


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 4))
    return dane.problems.LogReg(X, (X[:, 0] + 0.3 * rng.standard_normal(40) > 0).astype(float), lam=0.1)


def test_two_fednl_runs_differ_in_their_compressor_alone_and_the_figures_label_them_by_it(problem, tmp_path):
    """Two API runs of FedNL with TopK and RandK: their config.yaml differ in ``algorithm.compressor`` and nothing
    else, and plot_runs, local_work and fednl_bits label each by its compressor (they went by the folders' names,
    which the folders had no config to say more than)."""
    runs = [tmp_path / "a", tmp_path / "b"]
    for run, compressor in zip(runs, ("topk:4", "randk:4")):
        dane.fit(problem, "fednl", compressor=compressor, workers=2, rounds=2, seed=1, out_dir=run)
    first, second = (flatten(read_config(run)) for run in runs)
    assert first.keys() == second.keys()
    assert {key: (first[key], second[key]) for key in first if first[key] != second[key]} == \
        {"algorithm.compressor": ("topk:4", "randk:4")}
    assert labels_for(runs, [read_config(run) for run in runs]) == ["algorithm.compressor=topk:4",
                                                                     "algorithm.compressor=randk:4"]
    assert local_work.labels(runs) == ["FedNL (algorithm.compressor=topk:4)", "FedNL (algorithm.compressor=randk:4)"]
    assert [fednl_bits.label(run) for run in runs] == ["FedNL (topk:4)", "FedNL (randk:4)"]


@pytest.mark.parametrize("name, keys", [("fednl", {"compressor": "randk:3", "option": 2, "alpha": 0.25}),
                                        ("newton_3pc", {"mechanism": "cbag", "p": 0.25, "compressor": "topk:3"}),
                                        ("dane", {"mu": 0.1})])
def test_the_recorded_algorithm_rebuilds_the_config_the_run_used(problem, tmp_path, name, keys):
    """The file's ``algorithm`` keys are the config's fields: read back, they rebuild an equal config both through
    `dane.algorithm_config` (by the method's name) and through the class ``_target_`` names; the run's ``seed`` is
    the algorithm's, the run's top-level keys are at the command line's paths."""
    dane.fit(problem, name, workers=2, rounds=1, seed=3, out_dir=tmp_path, **keys)
    recorded = read_config(tmp_path)
    used = dane.algorithm_config(name, seed=3, **keys)
    fields = {key: value for key, value in recorded["algorithm"].items() if key != "_target_"}
    assert dane.algorithm_config(fields.pop("name"), **fields) == used
    assert get_class(recorded["algorithm"]["_target_"])(**{k: v for k, v in recorded["algorithm"].items()
                                                           if k != "_target_"}) == used
    assert {key: recorded[key] for key in ("workers", "rounds", "tol", "seed", "dtype")} == \
        {"workers": 2, "rounds": 1, "tol": None, "seed": 3, "dtype": "float64"}
    assert recorded["comm"]["compress"] is None and recorded["problem"]["lam"] == 0.1


def test_an_array_problem_is_recorded_by_its_shape_and_fingerprint_not_its_entries(tmp_path):
    """X of 400 x 20 (64,000 bytes of float64) and a sparse X: the file names their shapes, whether sparse, and the
    data's fingerprint (`dane.problems.ArraySource`), and stays a few kilobytes; ``comm.compress`` is recorded."""
    rng = np.random.default_rng(1)
    X = rng.standard_normal((400, 20))
    y = X @ rng.standard_normal(20)
    dense = dane.problems.Ridge(X, y, lam=0.1)
    dane.fit(dense, "gd", workers=2, rounds=1, compress="topk:5", out_dir=tmp_path / "dense")
    text = (tmp_path / "dense" / "config.yaml").read_text()
    data = yaml.safe_load(text)["problem"]["data"]
    assert len(text) < 4000
    assert data == {"_target_": "dane.problems.arrays.ArraySource", "name": "arrays",
                    "X": {"shape": [400, 20], "dtype": "float64", "sparse": False},
                    "y": {"shape": [400], "dtype": "float64", "sparse": False}, "fingerprint": dense.data.fingerprint}
    assert yaml.safe_load(text)["comm"]["compress"] == "topk:5"
    sparse = dane.problems.Ridge(scipy.sparse.random(400, 20, density=0.1, random_state=2, format="csr"), y, lam=0.1)
    dane.fit(sparse, "gd", workers=2, rounds=1, out_dir=tmp_path / "sparse")
    assert read_config(tmp_path / "sparse")["problem"]["data"]["X"] == {"shape": [400, 20], "dtype": "float64",
                                                                         "sparse": True}


def test_a_refused_run_keeps_the_config_and_overwrite_replaces_it(problem, tmp_path):
    """A run into a folder holding one is refused before it writes (the first run's config.yaml stays byte for byte);
    ``overwrite`` replaces it with the new run's."""
    dane.fit(problem, "fednl", compressor="topk:4", workers=2, rounds=2, out_dir=tmp_path)
    before = (tmp_path / "config.yaml").read_bytes()
    with pytest.raises(ConfigError, match=r"already holds a run"):
        dane.fit(problem, "fednl", compressor="randk:4", workers=2, rounds=1, out_dir=tmp_path)
    assert (tmp_path / "config.yaml").read_bytes() == before
    dane.fit(problem, "fednl", compressor="randk:4", workers=2, rounds=1, out_dir=tmp_path, overwrite=True)
    replaced = read_config(tmp_path)
    assert (replaced["algorithm"]["compressor"], replaced["rounds"], replaced["overwrite"]) == ("randk:4", 1, True)


#: conf/algorithm/ files that are another method's preset of a config class (their ``name`` is not the class's): the
#: keys each sets apart from the class's defaults on purpose (FedAvg is FedProx at μ = 0)
PRESETS = {"fedavg": {"mu": 0.0}}


@pytest.mark.parametrize("path", sorted((CONF_DIR / "algorithm").glob("*.yaml")), ids=lambda p: p.stem)
def test_an_algorithm_config_built_bare_has_its_yaml_s_defaults(path):
    """Every key of conf/algorithm/<name>.yaml that its config class also has holds the same default in both (but
    ``_target_``, ``name`` and the ``${seed}`` interpolation), so that ``SyncSGDConfig()`` in Python runs what
    ``algorithm=sync_sgd`` runs: SyncSGDConfig's steps_per_round was 10 where the yaml's null is the rule
    `sgd_steps_per_round`, and its momentum 0.0 where the yaml's is 0.9."""
    node = yaml.safe_load(path.read_text())
    cls = get_class(node["_target_"])
    fields = {f.name: f for f in dataclasses.fields(cls)}
    preset = PRESETS.get(path.stem, {})
    assert (fields["name"].default == node["name"]) == (path.stem not in PRESETS), "a preset is listed in PRESETS"
    for key, value in node.items():
        if key in ("_target_", "name"):
            continue
        assert key in fields, f"{path.name}: {key} is not a field of {cls.__name__}"
        if isinstance(value, str) and value.startswith("${"):
            assert (key, value) == ("seed", "${seed}"), f"{path.name}: {key}: {value}"
            continue
        f = fields[key]
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        if key in preset:
            assert value == preset[key] != default, f"{path.name}: {key}"
            continue
        if isinstance(default, tuple) and isinstance(value, list):
            value = tuple(value)
        assert default == value and (type(default) is type(value) or {type(default), type(value)} <= {int, float}), \
            f"{path.name}: {key}: {cls.__name__} has {default!r}, the yaml {value!r}"


#: fields of an algorithm's config class that its conf/algorithm/ file leaves out on purpose: what the run fills in,
#: not a key a user sets (SplitConfig.notes: the run's choices for the user, which its summary lists)
RUN_FILLED = {"split": {"notes"}}


@pytest.mark.parametrize("path", sorted((CONF_DIR / "algorithm").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_field_an_api_run_records_of_an_algorithm_is_a_key_of_its_yaml(path, problem, tmp_path):
    """An API run's config.yaml holds every field of its algorithm's config class (`dane.api.config_value`), so each
    must be a key of conf/algorithm/<name>.yaml, where a command-line run records it and says what it does:
    ScaffnewConfig took ``local_steps`` with the federated local-solve keys, which Scaffnew (its steps a geometric
    draw) never read and its yaml lacked, so an API run's config.yaml recorded a setting that did not run; FedNL-BC's
    yaml lacked the ``cubic`` it takes from FedNL (null only: FedNL-CR's weight), so the command line refused the key
    an API run recorded."""
    node = yaml.safe_load(path.read_text())
    cls = get_class(node["_target_"])
    fields = {f.name for f in dataclasses.fields(cls)}
    assert fields - set(node) == RUN_FILLED.get(path.stem, set())
    if path.stem == "scaffnew":  # the run folder's file itself
        dane.fit(problem, "scaffnew", workers=2, rounds=1, out_dir=tmp_path)
        assert set(read_config(tmp_path)["algorithm"]) == set(node)


def test_sync_sgd_built_bare_resolves_the_default_the_yaml_resolves(problem):
    """SyncSGDConfig() ran 10 steps a round and recorded no default, where algorithm=sync_sgd's null is one pass over
    the mean shard by `sgd_steps_per_round`, recorded in the summary's defaults: both now record the same."""
    from dane.baselines.sync_sgd import SyncSGDConfig

    bare = dane.fit(problem, SyncSGDConfig(batch_size=10), rounds=1).summary["defaults"]
    named = dane.fit(problem, "sync_sgd", batch_size=10, rounds=1).summary["defaults"]
    assert bare == named and [(e["key"], e["value"], e["rule"]) for e in bare] == \
        [("algorithm.steps_per_round", 4, "sgd_steps_per_round")]   # 40 rows on one worker, batches of 10


def test_the_recorded_stop_rule_and_cost_model_are_at_their_own_keys(problem):
    """`dane.api.recorded_config` of a spec, directly: ``tol`` and ``tol_abs`` each at its key, ``sim.alpha`` the
    given latency and ``sim.beta`` null where the bandwidth is the package's (as a command line that set only
    sim.alpha records)."""
    from dane.api import recorded_config
    from dane.comm import AlphaBeta
    from dane.loop.spec import Communication, RunControl, RunSpec
    from dane.loop.stopping import StopRule

    default = AlphaBeta()
    spec = RunSpec(problem=problem, algorithm=dane.algorithm_config("gd"),
                   comm=Communication(workers=2, cost=AlphaBeta(alpha=2 * default.alpha, beta=default.beta)),
                   control=RunControl(stop=StopRule(rounds=5, tol=1e-6, tol_abs=1e-9), seed=4))
    recorded = recorded_config(spec)
    assert {key: recorded[key] for key in ("workers", "rounds", "tol", "tol_abs", "seed")} == \
        {"workers": 2, "rounds": 5, "tol": 1e-6, "tol_abs": 1e-9, "seed": 4}
    assert (recorded["sim"]["alpha"], recorded["sim"]["beta"]) == (2 * default.alpha, None)


def test_a_config_value_is_the_plain_value_a_yaml_holds():
    """`dane.api.config_value`: NumPy scalars (np.int64 is no int, np.float32 no float) as their numbers, not as an
    array's shape; a torch dtype by its name; a path as text; a tuple as a list; a function by its dotted name."""
    from pathlib import Path

    import torch

    from dane.api import config_value

    got = [config_value(v) for v in (np.int64(3), np.float32(0.5), torch.float32, Path("a/b"), (1, 2), dane.fit)]
    assert got == [3, 0.5, "float32", "a/b", [1, 2], "dane.api.fit"]
    assert type(got[0]) is int and type(got[1]) is float
