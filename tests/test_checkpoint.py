"""Checkpoint and resume: a resumed run continues exactly as the uninterrupted one (same seed,
deterministic data order), record for record, and bad resumes are one-line config errors.
"""
from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from dane.checkpoint import checkpoint_path
from dane.errors import ConfigError
from dane.launch import execute
from dane.results import read_rounds, read_summary
from experiments.config import CONF_DIR, run_spec

SMALL_MLP = ("problem=digits_mlp", "problem.model.hidden=[16]", "problem.inner_steps=5", "workers=2", "quiet=true")
SMALL_RIDGE = ("problem=ridge_synthetic", "problem.n_samples=400", "problem.dim=20", "workers=4", "quiet=true")


def config(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def execute_with(out_dir, *overrides: str) -> dict:
    return execute(run_spec(config(*overrides)), str(out_dir))


def without_time(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "time_s"} for r in records]


@pytest.mark.parametrize("overrides", [
    pytest.param(SMALL_MLP, id="dane-mlp"),
    pytest.param((*SMALL_MLP, "algorithm=sync_sgd", "algorithm.optimizer=adam", "algorithm.lr=0.01",
                  "algorithm.batch_size=32", "algorithm.steps_per_round=4"), id="sync_sgd-adam"),
    pytest.param((*SMALL_MLP, "problem.inner_optimizer=adam", "problem.inner_lr=0.01", "problem.grad_batches=2"),
                 id="dane-adam-stochastic-gradient"),
    pytest.param(SMALL_RIDGE, id="dane-ridge"),
])
def test_resumed_run_equals_the_uninterrupted_run(tmp_path, overrides):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    execute_with(whole, *overrides, "rounds=6", "checkpoint_every=3")
    # "Crash" after round 4 (one round past the checkpoint at round 3), then resume to 6.
    execute_with(cut, *overrides, "rounds=4", "checkpoint_every=3")
    assert [r["round"] for r in read_rounds(cut)] == [0, 1, 2, 3, 4]
    summary = execute_with(cut, *overrides, "rounds=6", "checkpoint_every=3", f"resume={cut}")
    expected, got = read_rounds(whole), read_rounds(cut)
    assert [r["round"] for r in got] == list(range(7))
    assert without_time(got) == without_time(expected)  # exact: floats compare equal, not approximately
    assert all(b["time_s"] >= a["time_s"] for a, b in zip(got, got[1:]))  # the clock continues
    assert summary["resumed_from_round"] == 3
    assert read_summary(cut)["final_objective"] == read_summary(whole)["final_objective"]
    assert checkpoint_path(cut, 1, 6).is_file()
    assert sorted(p.name for p in (cut / "checkpoint").iterdir()) == ["COMMITTED", "round6"]  # older rounds deleted


def test_resume_refuses_another_algorithm(tmp_path):
    execute_with(tmp_path, *SMALL_RIDGE, "rounds=2", "checkpoint_every=2")
    with pytest.raises(ConfigError, match="was run with another config: algorithm.name: dane -> gd; "):
        execute_with(tmp_path, *SMALL_RIDGE, "algorithm=gd", "algorithm.lr=0.1", "rounds=4", f"resume={tmp_path}")


def test_resume_refuses_another_worker_count(tmp_path):
    execute_with(tmp_path, *SMALL_RIDGE, "rounds=2", "checkpoint_every=2")
    with pytest.raises(ConfigError, match="was a run with workers=4, this one has workers=5"):
        execute_with(tmp_path, *SMALL_RIDGE, "workers=5", "rounds=4", f"resume={tmp_path}")


def test_resume_needs_enough_rounds_and_a_checkpoint(tmp_path):
    execute_with(tmp_path, *SMALL_RIDGE, "rounds=4", "checkpoint_every=4")
    with pytest.raises(ConfigError, match="is at round 4 but rounds=3; set rounds >= 4"):
        execute_with(tmp_path, *SMALL_RIDGE, "rounds=3", f"resume={tmp_path}")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="has no checkpoint/ folder"):
        run_spec(config(*SMALL_RIDGE, f"resume={empty}"))
    with pytest.raises(ConfigError, match="checkpoint_every must be an integer >= 0"):
        run_spec(config(*SMALL_RIDGE, "checkpoint_every=-1"))
