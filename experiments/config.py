"""Hydra config -> validated `RunSpec`, before any process group starts: `dane.run_config`'s names, for the
entry points, and rank 0 of a launch."""
from __future__ import annotations

from dane.comm import launcher_rank
from dane.run_config import (  # noqa: F401 - re-exported: the entry points, scripts and tests import them from here
    CONF_DIR, build, cost_model, run_spec, stop_rule, workers_for,
)


def rank_zero() -> bool:
    """Rank 0 of horovodrun, torchrun or an srun step (`dane.comm.launcher_rank`), or a plain run."""
    return launcher_rank() == 0
