"""Where a run continues or stops before it starts: ``resume`` (a run directory and its newest committed checkpoint,
checked against this config), a finished run that has nothing to continue, and the finished run a sweep run again
finds in its job's ``out_dir`` (docs/faults.md, Restarts)."""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from .. import checks
from ..errors import ConfigError, plural
from ..records.results import ROUNDS_FILE, SUMMARY_FILE
from .checkpoint import CHECKPOINT_DIR, check_resume, committed, config_differences, finished, whole_records
from .stopping import ROUNDS_ZERO


def resume_dir(cfg: DictConfig, workers: int) -> str | None:
    """The run directory to continue, its committed checkpoint checked against this config (`check_resume`).

    ``resume=auto`` continues ``out_dir`` from its newest committed checkpoint if it has
    one and otherwise starts there, so the same command line serves the first start and
    every restart (torchrun --max-restarts, a rerun after a crash).
    """
    resume = cfg.get("resume")
    if resume is None or resume is False:  # resume=false: start, as with no resume
        return None
    if resume is True:
        raise ConfigError("resume takes auto (continue out_dir from its newest checkpoint, or start there) or a run "
                          "directory, got true; use resume=auto")
    if resume == "auto":
        if not cfg.out_dir:
            raise ConfigError("resume=auto continues the run in out_dir; set out_dir")
        path = Path(str(cfg.out_dir)).expanduser()
        if committed(path) is None:
            keep_unfinished(path, int(cfg.get("checkpoint_every") or 0))
            return None
    else:
        path = Path(str(resume)).expanduser()
        if cfg.get("out_dir") and Path(str(cfg.out_dir)).expanduser().resolve() != path.resolve():
            raise ConfigError(f"resume={resume} continues that run in its own directory, but out_dir={cfg.out_dir} "
                              f"names another; drop out_dir (or start a new run there without resume)")
        if not path.is_dir():
            raise ConfigError(f"resume={resume}: no such run directory; point it at the directory of a run made with "
                              "checkpoint_every > 0")
        if not (path / CHECKPOINT_DIR).is_dir():
            raise ConfigError(f"resume={resume} has no checkpoint/ folder; "
                              "point it at the run directory of a run made with checkpoint_every > 0")
    rounds = checks.count("rounds", cfg.rounds, ROUNDS_ZERO)
    refuse_finished(path, rounds)
    check_resume(path, workers, rounds, OmegaConf.to_yaml(cfg, resolve=True))
    return str(path)


def refuse_finished(path: Path, rounds: int) -> None:
    """A run that finished (its summary written, not ``interrupted``) has nothing to continue, unless it stopped at
    its round cap and ``rounds`` asks for more: the same command again would redo its last rounds from the
    checkpoint and replace its summary.  One line, before anything changes."""
    summary = finished(path)
    if summary is None:
        return
    status, done = summary.get("status"), summary.get("rounds")
    if status == "max_rounds" and isinstance(done, int) and rounds > done:
        return
    extend = f"rounds above {done} extends a run that stopped at its cap, " if status == "max_rounds" else ""
    raise ConfigError(f"resume: {path} holds a finished run ({status} after {plural(done, 'round')}); there is nothing "
                      f"to continue: {extend}drop resume and set overwrite=true to start it again, or use a new out_dir")


#: what may differ between a finished run's config and a sweep job's that finds it done (`finished_run`): how the
#: run is shown, checkpointed and started; nothing that changes its records or results
SAME_RUN = ("resume", "out_dir", "quiet", "print_every", "progress", "checkpoint_every", "overwrite", "sim.fail_at")


def finished_run(cfg: DictConfig) -> str | None:
    """``resume=auto`` where ``out_dir`` holds the finished run (its summary written, not ``interrupted``) of this
    very config (its ``config.yaml``, up to `SAME_RUN`): the line saying so, else None.  A sweep run again with
    ``resume=auto`` (its restart) counts such a job as finished and leaves its run as it is (experiments.train,
    experiments.launchers); a single run there is refused (`refuse_finished`), and another config is refused too."""
    try:
        if cfg.get("resume") != "auto" or not cfg.get("out_dir"):
            return None
        path = Path(str(cfg.out_dir)).expanduser()
        text = OmegaConf.to_yaml(cfg, resolve=True)
        held = (path / "config.yaml").read_text()
    except (OmegaConfBaseException, OSError, UnicodeDecodeError):  # the run refuses a config that does not resolve
        return None
    summary = finished(path)
    if summary is None or config_differences(held, text, may_change=SAME_RUN):
        return None
    return (f"resume=auto: {path} holds the finished run of this config ({summary.get('status')} after "
            f"{plural(summary.get('rounds'), 'round')}); nothing to do, kept as it was")


def keep_unfinished(path: Path, checkpoint_every: int) -> None:
    """``resume=auto`` found no committed checkpoint in ``path``: it starts the run again there, replacing an
    unfinished run's records, only where they are what a restart before the first checkpoint loses (at most
    ``checkpoint_every`` rounds after round 0); other records are refused in one line, before anything changes."""
    if (path / SUMMARY_FILE).exists():
        return  # a finished run, which the run directory itself refuses to replace
    held = whole_records(path / ROUNDS_FILE)  # 0 where there is no log
    if held and (checkpoint_every == 0 or held > checkpoint_every + 1):
        why = "it ran without checkpoint_every" if checkpoint_every == 0 else \
            f"more than the {plural(checkpoint_every, 'round')} (checkpoint_every) a restart before the first " \
            "checkpoint loses"
        raise ConfigError(f"resume=auto: {path} holds {plural(held, 'record')} of an unfinished run and no committed "
                          f"checkpoint to continue from ({why}); they are kept: drop resume and set overwrite=true to "
                          "start again (its records are replaced), or use a new out_dir")
