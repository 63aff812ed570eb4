"""Hydra config -> validated `RunSpec`, before any process group starts: `dane.run_config`'s names, for the
entry points, and rank 0 of a launch; and the ``${dane.unique:}`` resolver of the folders they name.

`dane.run_config` imports torch: its names are imported on first use (PEP 562, `_RUN_CONFIG`), so that the
entry points' ``--help`` and the command-line checks (`experiments.overrides`) import no torch."""
from __future__ import annotations

import os
from datetime import datetime

from omegaconf import OmegaConf

from dane.comm import launcher_rank
from dane.layout import CONF_DIR, lazy_names  # noqa: F401 - re-exported: the entry points, scripts and tests import it from here

#: re-exported from `dane.run_config`: the entry points, scripts and tests import them from here
_RUN_CONFIG = ("build", "cost_model", "run_spec", "stop_rule", "workers_for")


__getattr__ = lazy_names(__name__, {name: "dane.run_config" for name in _RUN_CONFIG})

#: the time in a folder's name: sortable, and to the microsecond
STAMP_FORMAT = "%Y-%m-%d_%H-%M-%S-%f"


def unique_name(*parts: str) -> str:
    """``<date>_<time>-<microseconds>[_<part>...]_<pid>``: sorts by start, and differs for folders named in the same
    second, by processes started together (the pid) or one after another (the microseconds).  A single run's
    directory is ``unique_name(algorithm, problem)`` (experiments/train.py, run_dir); a sweep's is
    ``${dane.unique:}`` (conf/config.yaml, hydra.sweep.dir)."""
    return "_".join([datetime.now().strftime(STAMP_FORMAT), *parts, str(os.getpid())])


# cached as Hydra's ${now:...} is: one value per config, which Hydra copies into every job's config of a sweep
# (load_sweep_config), so the launcher and each job read the same sweep directory
OmegaConf.register_new_resolver("dane.unique", unique_name, use_cache=True, replace=True)


def rank_zero() -> bool:
    """Rank 0 of horovodrun, torchrun or an srun step (`dane.comm.launcher_rank`), or a plain run."""
    return launcher_rank() == 0
