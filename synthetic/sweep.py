"""In-process sweeps of `experiments.simulate`: run the jobs whose results are missing, then find them.

A job is a tuple of Hydra overrides of conf/simulate.yaml, for example
``("algorithm=dane", "workers=8", "problem.n_samples=18000")``.  A finished run answers
a job when its saved config (``config.yaml`` in the run directory) agrees with the
job's composed config on everything that changes the iterates (algorithm, problem,
workers, seed, dtype, straggler model) and it ran far enough: it converged to the job's
``tol``, ran the job's ``rounds``, or diverged.  So results from any earlier sweep,
made by hand with ``python -m experiments.simulate -m ...`` or by `ensure`, are reused,
whatever their directory names.

`ensure` runs the missing jobs one after another in this process with the in-process
simulator, each into ``<root>/<sweep>/<job name>``; figure scripts then look the runs up
with `RunIndex`.  What imports torch (the run, the cost model) is imported where it is used, so that a
figure's ``--help`` imports no torch.
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Sequence

from tqdm import tqdm
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from dane.errors import DivergenceError, plural
from dane.records.provenance import command_of_run
from dane.records.results import find_runs, read_config, read_summary
from dane.loop.stopping import StopRule
from dane.comm.tail import ALPHA_BETA_ONLY
from dane.layout import CONF_DIR

Job = tuple[str, ...]

#: config keys that change what a run computes; a stored run must agree on all of them
IDENTITY_KEYS = ("algorithm", "problem", "workers", "seed", "dtype", "sim.slowdown", "sim.delay_mean", "sim.seed",
                 "comm.staleness", "sim.step_time")


def job_name(job: Job) -> str:
    """Hydra's ``override_dirname`` of the job: its overrides sorted and joined with commas."""
    return ",".join(sorted(job)).replace("/", "_")


def compose_job(job: Job) -> DictConfig:
    """The config `python -m experiments.simulate <job>` would run."""
    return OmegaConf.create(composed_job(tuple(job)))


@lru_cache(maxsize=4096)
def composed_job(job: Job) -> dict:
    """Compose ``job`` as Hydra would, resolved; fast for plain ``key=value`` overrides.

    Hydra's compose takes a good fraction of a second, too slow for a few hundred jobs,
    so only the config-group choices (``algorithm=admm``, ``experiment=speedup``) go
    through it, once per distinct choice, and plain ``key=value`` overrides of existing
    keys are applied afterwards, in order, as Hydra applies command-line overrides.
    Anything else (``+key``, ``~key``, a new key) takes Hydra's own path.
    """
    is_group = lambda o: (CONF_DIR / o.split("=", 1)[0]).is_dir()  # noqa: E731
    groups = tuple(o for o in job if is_group(o))
    cfg = _compose_groups(groups).copy()
    for override in [_override(o) for o in job if not is_group(o)]:
        key = override.key_or_group
        if override.is_add() or override.is_delete() or override.is_sweep_override() or \
                OmegaConf.select(cfg, key, default=_MISSING) is _MISSING:
            return _compose_hydra(job)
        OmegaConf.update(cfg, key, override.value(), merge=False)
    return OmegaConf.to_container(cfg, resolve=True)


_MISSING = object()


@lru_cache(maxsize=1)
def _parser():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


@lru_cache(maxsize=4096)
def _override(text: str):
    """One plain override as Hydra's grammar parses it, once a process: a grid's jobs repeat theirs."""
    (override,) = _parser().parse_overrides([text])
    return override


@lru_cache(maxsize=64)
def _compose_groups(groups: Job) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="simulate", overrides=list(groups))


def _compose_hydra(job: Job) -> dict:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return OmegaConf.to_container(compose(config_name="simulate", overrides=list(job)), resolve=True)


def _get(tree: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return None
        tree = tree[part]
    return tree


def identity(cfg: dict) -> dict:
    """The part of a resolved config that decides the iterates (workers=None means 1)."""
    out = {key: _get(cfg, key) for key in IDENTITY_KEYS}
    out["workers"] = out["workers"] or 1
    out["sim.slowdown"] = [float(s) for s in out["sim.slowdown"] or [1.0]]
    out["comm.staleness"] = out["comm.staleness"] or 0  # absent from runs made before it: synchronous
    if not out["comm.staleness"]:
        del out["sim.step_time"]  # it orders only the asynchronous simulator's updates
    data = out["problem"].get("data") if isinstance(out["problem"], dict) else None
    if isinstance(data, dict) and "data_dir" in data:  # where the files are is not what they hold
        out["problem"] = {**out["problem"], "data": {k: v for k, v in data.items() if k != "data_dir"}}
    data = out["problem"].get("data") if isinstance(out["problem"], dict) else None
    if isinstance(data, dict) and not data.get("overlap"):  # no overlap (the runs made before the keys): its factors unused
        unused = ("overlap", "load_factor", "absolute_factor")
        out["problem"] = {**out["problem"], "data": {k: v for k, v in data.items() if k not in unused}}
    if isinstance(out["problem"], dict) and "augment" in out["problem"] and not out["problem"]["augment"]:
        out["problem"] = {k: v for k, v in out["problem"].items() if k != "augment"}  # off: as runs made before it
    return out


def answers(summary: dict, cfg: dict, timed: bool = True) -> bool:
    """Did a run with this summary go as far as a job with config ``cfg`` asks?

    With ``timed`` (the job's times matter, not only its iterates) the run must also have
    been simulated with today's cost model.
    """
    if timed and cfg["comm"]["backend"] == "local" and summary.get("backend") not in ("local", "simulator"):
        return False  # a launched run has the same iterates but wall-clock, not simulated, times
    if timed and "alpha" in summary:  # a simulated run: its times hold only for the cost model it was run with
        from dane.run_config import cost_model  # torch: imported at use (see the module's docstring)

        wanted = {"topology": "allreduce", "calibration": ALPHA_BETA_ONLY,
                  **cost_model(OmegaConf.create(cfg["sim"]), cfg.get("seed", 0)).describe()}
        recorded = {"topology": "allreduce", "calibration": ALPHA_BETA_ONLY, **summary}  # before tails: none
        if any(not _same(recorded.get(key), value) for key, value in wanted.items()):
            return False
    tol, tol_abs, rounds = cfg.get("tol"), cfg.get("tol_abs"), cfg.get("rounds")
    final = summary.get("final_suboptimality")
    threshold = None if final is None else StopRule(tol=tol, tol_abs=tol_abs).threshold(
        {"objective": summary["final_objective"], "suboptimality": final})
    return (summary.get("status") in ("diverged", "one_shot")  # one_shot: a larger budget ends at the same round
            or (threshold is not None and final <= threshold)
            or (rounds is not None and summary.get("rounds", 0) >= rounds))


def _same(a, b) -> bool:
    numbers = (int, float)
    return math.isclose(a, b) if isinstance(a, numbers) and isinstance(b, numbers) else a == b


@dataclass
class StoredRun:
    path: Path
    identity: dict
    summary: dict
    mtime: float


class RunIndex:
    """Every finished run under ``root`` with a saved config, searchable by config."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.runs: list[StoredRun] = []
        if self.root.exists():
            for path in find_runs(self.root):
                self.add(path)

    def add(self, path: Path) -> None:
        config_file = Path(path) / "config.yaml"
        if not config_file.exists():
            return
        cfg = read_config(path)
        summary = read_summary(path)
        cfg["workers"] = summary.get("workers", cfg.get("workers"))  # under a launcher the config says null
        mtime = (Path(path) / "summary.json").stat().st_mtime
        self.runs.append(StoredRun(Path(path), identity(cfg), summary, mtime))

    def find(self, job: Job, timed: bool = True) -> Path | None:
        """The newest stored run that answers ``job`` (see `answers`), or None."""
        cfg = composed_job(tuple(job))
        wanted = identity(cfg)
        hits = [r for r in self.runs if r.identity == wanted and answers(r.summary, cfg, timed)]
        return max(hits, key=lambda r: r.mtime).path if hits else None

    def find_all(self, jobs, timed: bool = True) -> list[Path] | None:
        """The stored runs that answer every one of ``jobs``, in order; None at the first that none answers (the jobs
        after it are not composed: composing is most of the cost of a figure that finds none)."""
        found = []
        for job in jobs:
            path = self.find(job, timed) if self.runs else None
            if path is None:
                return None
            found.append(path)
        return found


def job_command(job: Job, out_dir: str | Path) -> list[str]:
    """The command line that makes the run `run_job` makes: the job's overrides of conf/simulate.yaml (`compose_job`)
    with its run folder, under ``dane simulate``."""
    return ["dane", "simulate", *job, f"out_dir={out_dir}", "quiet=true"]


def run_job(job: Job, out_dir: Path) -> dict:
    """Run one job in this process; a diverged run is a result, not an error.  The run's provenance names
    `job_command`, the command that makes it, not this process's own (``dane figures``, a script)."""
    from dane.loop.launch import execute  # torch: imported at use (see the module's docstring)
    from dane.run_config import run_spec

    cfg = compose_job(job)
    cfg.out_dir, cfg.quiet = str(out_dir), True
    spec = run_spec(cfg)
    with command_of_run(job_command(job, out_dir)):
        try:
            return execute(spec, str(out_dir))
        except DivergenceError:
            return read_summary(out_dir)


def ensure(jobs: Iterable[Job], root: str | Path = "results", sweep: str = "sweeps/figures",
           log=sys.stdout, timed: bool = True) -> dict[Job, Path]:
    """Run every job that no stored run under ``root`` answers; return each job's run directory.

    ``timed=False`` when only the iterates matter (rounds, suboptimality): runs simulated
    with another cost model then still count.
    """
    import torch  # imported at use (see the module's docstring)

    torch.set_num_threads(1)  # one core per simulated worker, also at workers=1 (see experiments/simulate.py)
    index = RunIndex(root)
    jobs = list(dict.fromkeys(tuple(j) for j in jobs))
    found = {job: index.find(job, timed) for job in jobs}
    missing = [job for job in jobs if found[job] is None]
    if missing and log is not None:
        print(f"running {len(missing)} of {plural(len(jobs), 'job')} into {Path(root) / sweep}", file=log, flush=True)
    start = time.perf_counter()
    # a bar on a terminal (tqdm's disable=None), the per-job lines below in any case
    bar = tqdm(total=len(missing), file=log, unit="job", disable=True if log is None else None)
    for k, job in enumerate(missing, 1):
        out_dir = Path(root) / sweep / job_name(job)
        if out_dir.exists():  # a stale or partial run of an older config: start it afresh
            for name in ("rounds.jsonl", "summary.json"):
                (out_dir / name).unlink(missing_ok=True)
        summary = run_job(job, out_dir)
        found[job] = out_dir
        bar.update()
        if log is not None:
            bar.write(f"[{k}/{len(missing)} {time.perf_counter() - start:6.1f}s] {job_name(job)}: {summary['status']} "
                      f"after {plural(summary['rounds'], 'round')}", file=log)
            log.flush()
    bar.close()
    return found  # type: ignore[return-value]


def grid(base: Sequence[str], **axes: Sequence) -> list[Job]:
    """The cross product of ``key=values`` axes on top of ``base``: grid(["algorithm=gd"], workers=[1, 2])."""
    jobs: list[Job] = [tuple(base)]
    for key, values in axes.items():
        key = key.replace("__", ".")
        jobs = [(*job, f"{key}={value}") for job in jobs for value in values]
    return jobs
