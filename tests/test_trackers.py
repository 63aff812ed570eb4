"""Trackers and the progress bar as a user meets them: a run's records read back through TensorBoard's
and MLflow's own readers equal rounds.jsonl; a missing extra is one line and exit 2; a failing tracker
loses no JSONL record."""
from __future__ import annotations

import io
import json
import sys
from contextlib import contextmanager

import numpy as np
import pytest

from dane.errors import ConfigError
from dane.experiments.config import run_spec
from dane.loop.launch import execute
from dane.loop.progress import RoundBar
from dane.records.results import RunWriter, read_rounds, read_summary
from helpers import composed
from dane.records.trackers import Trackers, check_loggers, metrics
import runs

SMALL = ["problem.n_samples=600", "problem.dim=20", "rounds=4", "quiet=true", "workers=2"]


def tensorboard_scalars(run_dir) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in ``run_dir/tensorboard`` as (step, value) pairs, through TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={SCALARS: 0})  # 0: keep every event
    events.Reload()
    return {key: [(e.step, e.value) for e in events.Scalars(key)] for key in events.Tags()["scalars"]}


def mlflow_run(run_dir, monkeypatch):
    """The one MLflow run in ``run_dir/mlruns`` and its client, through MLflow's own client."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow >= 3.7 reads file stores only with it
    client = MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("dane").experiment_id])
    return client, run


@pytest.mark.needs_mlflow
@pytest.mark.needs_tensorboard
def test_every_tracked_metric_equals_the_jsonl_record(tmp_path, monkeypatch):
    # composed in this process: no second start-up
    cfg = composed(*SMALL, "logger=[jsonl,tensorboard,mlflow]", f"out_dir={tmp_path}")
    execute(run_spec(cfg), str(tmp_path))
    records, summary = read_rounds(tmp_path), read_summary(tmp_path)
    assert [r["round"] for r in records] == list(range(len(records))) and len(records) >= 3
    keys = set().union(*(metrics(r) for r in records))
    assert {"objective", "bytes_sent", "time_s", "suboptimality"} <= keys

    # TensorBoard stores scalars as float32: each value is the record's value rounded to float32, exactly
    scalars = tensorboard_scalars(tmp_path)
    assert set(scalars) == keys
    for key in keys:
        assert scalars[key] == [(r["round"], float(np.float32(r[key]))) for r in records if key in r], key

    # MLflow's file store keeps the float64 values: exactly the records
    client, run = mlflow_run(tmp_path, monkeypatch)
    assert run.info.status == "FINISHED"
    for key in keys:
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        assert history == [(r["round"], float(r[key])) for r in records if key in r], key
    params = run.data.params
    assert params["rounds"] == "4" and params["workers"] == "2" and params["algorithm.name"] == "dane"
    assert run.data.metrics["summary.final_objective"] == summary["final_objective"]
    assert run.data.metrics["summary.total_bytes"] == summary["total_bytes"]
    logged = json.loads((tmp_path / "mlruns").joinpath(
        run.info.experiment_id, run.info.run_id, "artifacts", "summary.json").read_text())
    assert logged == json.loads((tmp_path / "summary.json").read_text())


@contextmanager
def without_tensorboard(tmp):
    """In the batch process: tensorboard looks uninstalled (sys.modules[name] = None makes
    importlib.util.find_spec(name) None), in the folder ``{tmp}/trackers``."""
    (tmp / "trackers").mkdir()
    saved = {name: module for name, module in sys.modules.items() if name.split(".")[0] == "tensorboard"}
    for name in saved:
        del sys.modules[name]
    sys.modules["tensorboard"] = None
    try:
        yield
    finally:
        del sys.modules["tensorboard"]
        sys.modules.update(saved)


MISSING_EXTRA = runs.command("trackers:missing_extra", *SMALL, "logger=[jsonl,tensorboard]", "out_dir={tmp}/trackers/run",
                             around="test_trackers:without_tensorboard", cwd="{tmp}/trackers")


def test_a_missing_extra_is_one_line_and_exit_2(commands):
    proc, out = commands[MISSING_EXTRA], commands.tmp / "trackers" / "run"
    assert proc["rc"] == 2, proc["stderr"]
    lines = proc["stderr"].strip().splitlines()
    assert len(lines) == 1, proc["stderr"]
    assert lines[0].startswith("error: logger=tensorboard needs the tensorboard package")
    assert "pip install 'dane[tensorboard]'" in lines[0]
    assert not (out / "rounds.jsonl").exists()  # refused before anything ran


@pytest.mark.needs_mlflow  # check_loggers also refuses a tracker whose package is absent
@pytest.mark.needs_tensorboard
def test_logger_names_are_checked():
    assert check_loggers("tensorboard") == ("jsonl", "tensorboard")  # the JSONL log is always written
    assert check_loggers(["mlflow", "jsonl", "mlflow"]) == ("jsonl", "mlflow")
    assert check_loggers([]) == ("jsonl",)
    with pytest.raises(ConfigError, match="logger must be a list of jsonl, tensorboard, mlflow .* got 'wandb'"):
        check_loggers(["jsonl", "wandb"])


class Recorder:
    def __init__(self, name, fail_at=None):
        self.name, self.fail_at, self.rounds, self.summary, self.closed = name, fail_at, [], None, False

    def start(self, config):
        pass

    def log_round(self, record):
        if record["round"] == self.fail_at:
            raise OSError("disk full")
        self.rounds.append(record["round"])

    def finish(self, summary):
        self.summary = summary

    def close(self):
        self.closed = True


def test_a_failing_tracker_loses_no_jsonl_record_and_says_so_once(tmp_path, capfd):
    good, bad = Recorder("tensorboard"), Recorder("mlflow", fail_at=1)
    writer = RunWriter(tmp_path)
    writer.attach(Trackers([bad, good]))
    for t in range(4):
        writer.write_round({"round": t, "objective": 1.0 / (t + 1), "time_s": 0.1 * t, "bytes_sent": 8 * t})
    writer.close()
    writer.write_summary({"status": "max_rounds", "rounds": 3})
    assert [r["round"] for r in read_rounds(tmp_path)] == [0, 1, 2, 3]
    assert good.rounds == [0, 1, 2, 3] and good.summary["status"] == "max_rounds"
    assert bad.rounds == [0] and bad.closed and bad.summary is None
    lines = capfd.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: logger=mlflow log_round failed (OSError: disk full)")


def test_round_bar_counts_rounds_and_shows_the_last_record():
    out = io.StringIO()
    bar = RoundBar(5, stream=out)
    for t in range(6):
        bar({"round": t, "objective": 2.0 ** -t, "time_s": 0.5 * t, "test_accuracy": 0.9})
    bar.close()
    last = out.getvalue().replace("\r", "\n").strip().splitlines()[-1]
    assert "5/5" in last and "objective=3.1250e-02" in last and "test_accuracy=0.9000" in last and "time=2.5s" in last
