"""Trackers: rank 0's round records also sent to TensorBoard or MLflow (``logger=[jsonl,tensorboard,mlflow]``).

``rounds.jsonl`` and ``summary.json`` (`dane.records.results.RunWriter`) are the run's source of
truth and are always written; ``jsonl`` in the list only names them.  The writer hands
each tracker a record after the record is on disk, so a tracker that fails loses nothing
there: it is reported in one line and gets no more records (`Trackers`).

A tracker is three calls (`Tracker`): ``start(config)`` once with the run's config as a
nested dict, ``log_round(record)`` per record with ``step = record["round"]``, and
``finish(summary)`` with summary.json's entries; ``close()`` ends it without a summary
(an interrupted run).  Each sends the record's numbers (ints and floats, not bools), all
keys but ``round``, under their record names.

- ``tensorboard``: `torch.utils.tensorboard.SummaryWriter` into ``<run dir>/tensorboard/``
  (scalars are stored as float32).  A resumed run purges the steps after the checkpoint.
- ``mlflow``: one MLflow run in experiment ``dane``, in a file store ``<run dir>/mlruns``
  unless ``mlflow_uri`` names another tracking URI; the config's leaves are its params
  (dotted keys), records its metrics, summary.json an artifact and its numbers metrics
  ``summary.<key>``.  A resumed run continues the MLflow run of the same run directory
  (tag ``dane.run_dir``); MLflow cannot delete metric points, so rounds from the checkpoint
  on that the first attempt had logged appear twice (the later ones are rounds.jsonl's).  MLflow >= 3.7 keeps file stores in maintenance mode and
  refuses them unless ``MLFLOW_ALLOW_FILE_STORE=true``: set for the writer's own store
  here, and needed to read it (``MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri <run dir>/mlruns``).

Both are optional extras (``pip install 'dane[tensorboard]'``, ``'dane[mlflow]'``), imported
when a run asks for them; `check_loggers` refuses a missing one before any process group starts.
"""
from __future__ import annotations

import atexit
import importlib.util
import json
import os
import time
from pathlib import Path
from typing import Protocol

from ..errors import ConfigError, say
from .results import ROUNDS_FILE, read_rounds

TRACKERS = ("jsonl", "tensorboard", "mlflow")
#: tracker -> (the module it imports, the extra that installs it)
EXTRAS = {"tensorboard": ("tensorboard", "tensorboard"), "mlflow": ("mlflow", "mlflow")}
EXPERIMENT = "dane"
_OPEN: dict[Path, "Trackers"] = {}  # run directory -> its open trackers in this process (`open_trackers`)


def check_loggers(value) -> tuple[str, ...]:
    """``logger``'s value (a name or a list of names) as a tuple that starts with ``jsonl``; a name that is
    not a tracker, or a tracker whose package is not installed, is a `ConfigError` naming the fix."""
    if not isinstance(value, (str, list, tuple)) and value is not None:
        raise ConfigError(f"logger must be a list of {', '.join(TRACKERS)} (e.g. logger=[jsonl,tensorboard]), "
                          f"got {value!r}")
    names = [value] if isinstance(value, str) else list(value or ())
    for name in names:
        if name not in TRACKERS:
            raise ConfigError(f"logger must be a list of {', '.join(TRACKERS)} (e.g. logger=[jsonl,tensorboard]), "
                              f"got {name!r}")
    for name in names:
        module, extra = EXTRAS.get(name, (None, None))
        if module is not None and importlib.util.find_spec(module) is None:
            raise ConfigError(f"logger={name} needs the {module} package, which is not installed: "
                              f"pip install 'dane[{extra}]' (or drop {name} from logger)")
    return tuple(dict.fromkeys(["jsonl", *names]))


def metrics(record: dict) -> dict[str, float]:
    """The numbers a tracker gets from a record: every int or float (bools aside) except ``round``."""
    return {k: float(v) for k, v in record.items()
            if k != "round" and isinstance(v, (int, float)) and not isinstance(v, bool)}


def flatten(config: dict, prefix: str = "") -> dict[str, str]:
    """A nested config as dotted keys -> strings (MLflow's params): ``{"algorithm": {"mu": 0}}`` -> ``{"algorithm.mu": "0"}``."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
    return out


class Tracker(Protocol):
    name: str

    def start(self, config: dict) -> None: ...

    def log_round(self, record: dict) -> None: ...

    def finish(self, summary: dict) -> None: ...

    def close(self) -> None: ...


class TensorBoardTracker:
    """Scalars per round into ``<run dir>/tensorboard/``; the config and the summary as text."""

    name = "tensorboard"

    def __init__(self, run_dir: Path, purge_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=purge_step)

    def start(self, config: dict) -> None:
        if config:
            self.writer.add_text("config", "```\n" + json.dumps(config, indent=2) + "\n```")

    def log_round(self, record: dict) -> None:
        for key, value in metrics(record).items():
            self.writer.add_scalar(key, value, global_step=record["round"])
        self.writer.flush()  # a crash loses at most the round being written, as for rounds.jsonl

    def finish(self, summary: dict) -> None:
        self.writer.add_text("summary", "```\n" + json.dumps(summary, indent=2, default=str) + "\n```")
        self.close()

    def close(self) -> None:
        self.writer.close()


class MLflowTracker:
    """One MLflow run per run directory: params from the config, metrics per round (step = round), the summary."""

    name = "mlflow"

    def __init__(self, run_dir: Path, uri: str | None = None, continuing: bool = False):
        from mlflow.tracking import MlflowClient

        if uri is None:
            uri = (run_dir / "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # our own per-run store (module docstring)
        self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(EXPERIMENT)
        experiment = found.experiment_id if found is not None else self.client.create_experiment(EXPERIMENT)
        tag = str(run_dir.resolve())
        previous = self.client.search_runs([experiment], filter_string=f"tags.`dane.run_dir` = '{tag}'",
                                           order_by=["attributes.start_time DESC"], max_results=1) if continuing else []
        if previous:
            self.run_id, self.fresh = previous[0].info.run_id, False
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            run = self.client.create_run(experiment, run_name=run_dir.name, tags={"dane.run_dir": tag})
            self.run_id, self.fresh = run.info.run_id, True
        self.ended = False

    def start(self, config: dict) -> None:
        if not self.fresh:
            return  # a resumed run keeps the params it was started with (the same config)
        from mlflow.entities import Param

        params = [Param(k, v[:6000]) for k, v in flatten(config).items()]  # 6000: MLflow's longest param value
        for i in range(0, len(params), 100):  # at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def log_round(self, record: dict) -> None:
        self._log(metrics(record), record["round"])

    def finish(self, summary: dict) -> None:
        self.client.log_dict(self.run_id, summary, "summary.json")
        self._log({f"summary.{k}": v for k, v in metrics(summary).items()}, summary.get("rounds", 0))
        self.client.set_tag(self.run_id, "status", str(summary.get("status")))
        self.client.set_terminated(self.run_id, "FAILED" if summary.get("status") == "diverged" else "FINISHED")
        self.ended = True

    def close(self) -> None:
        if not self.ended:
            self.client.set_terminated(self.run_id, "KILLED")
            self.ended = True

    def _log(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, v, now, step) for k, v in values.items()]
        for i in range(0, len(batch), 1000):  # at most 1000 metrics per batch
            self.client.log_batch(self.run_id, metrics=batch[i:i + 1000])


class Trackers:
    """The run's trackers behind one call each.  A tracker that raises is reported in one line and dropped:
    the records it would have had are in rounds.jsonl, which the writer wrote first."""

    def __init__(self, trackers: list[Tracker]):
        self.active = list(trackers)
        atexit.register(self.close)  # a run that ends without a summary (an exception): MLflow marks it KILLED

    def start(self, config: dict) -> None:
        self._each("start", config)

    def log_round(self, record: dict) -> None:
        self._each("log_round", record)

    def finish(self, summary: dict) -> None:
        self._each("finish", summary)
        self.active = []
        atexit.unregister(self.close)

    def close(self) -> None:
        self._each("close")
        self.active = []
        atexit.unregister(self.close)

    def _each(self, method: str, *args) -> None:
        for tracker in list(self.active):
            try:
                getattr(tracker, method)(*args)
            except Exception as e:  # noqa: BLE001: any tracker failure; the JSONL log has the records
                self.active.remove(tracker)
                _drop(tracker, f"{method} failed ({type(e).__name__}: {e})")


def _drop(tracker, why: str) -> None:
    say(f"warning: logger={tracker.name} {why}; it gets no more records (rounds.jsonl and summary.json have them all)")
    try:
        tracker.close()
    except Exception:  # noqa: BLE001: already reported
        pass


def open_trackers(names: tuple[str, ...], run_dir: str | Path, *, config: dict, continuing: bool = False,
                  mlflow_uri: str | None = None) -> Trackers:
    """The trackers ``names`` asks for beside the JSONL log, started with ``config``.

    ``continuing``: the run resumes in ``run_dir``, whose rounds.jsonl was cut back to the checkpoint
    (TensorBoard purges the steps after its last round; MLflow continues the run directory's MLflow
    run).  A tracker that cannot open is reported and left out, as one that fails later is.
    """
    run_dir = Path(run_dir)
    kept = read_rounds(run_dir) if continuing and (run_dir / ROUNDS_FILE).exists() else []
    last_round = kept[-1]["round"] if kept else None
    stale = _OPEN.pop(run_dir.resolve(), None)
    if stale is not None:  # the last attempt in this run directory ended without a summary (Horovod elastic's reset)
        stale.close()
    opened: list[Tracker] = []
    for name in names:
        try:
            if name == "tensorboard":
                opened.append(TensorBoardTracker(run_dir, None if last_round is None else last_round + 1))
            elif name == "mlflow":
                opened.append(MLflowTracker(run_dir, mlflow_uri, continuing))
        except Exception as e:  # noqa: BLE001: an unreachable tracking server must not stop the run
            say(f"warning: logger={name} could not start ({type(e).__name__}: {e}); the run continues with "
                "rounds.jsonl and summary.json")
    trackers = _OPEN[run_dir.resolve()] = Trackers(opened)
    trackers.start(config)
    return trackers

