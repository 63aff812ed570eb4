"""Run one algorithm on one problem; the same program under horovodrun, torchrun or plain python.

    horovodrun -np 2 python -m experiments.train algorithm=dane problem=ridge_synthetic
    torchrun --nproc_per_node 2 -m experiments.train algorithm=dane problem=ridge_synthetic
    python -m experiments.train algorithm=dane problem=ridge_synthetic workers=2   # simulated

Bad input exits with status 2 and one line on stderr; a diverged run exits with status 3
after writing its results (in a ``-m`` sweep it is reported and the sweep goes on).
"""
from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from dane.errors import DivergenceError, UserError
from dane.launch import execute
from experiments.config import check_group_choices, rank_zero, run_spec


def run_dir(cfg: DictConfig) -> str:
    return cfg.out_dir or HydraConfig.get().runtime.output_dir


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        spec = run_spec(cfg)
        execute(spec, run_dir(cfg) if rank_zero() else None)
    except DivergenceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            return  # in a sweep a diverged job is a result (written, status: diverged): go on to the next
        sys.exit(3)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


def hydra_argv(argv: list[str]) -> list[str]:
    """Non-zero ranks run Hydra too; keep them from making run directories of their own (hydra #2070)."""
    if rank_zero():
        return argv
    return argv + ["hydra.run.dir=.", "hydra.output_subdir=null",
                   "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]


def cli(entry=None) -> None:
    """Check group choices with one-line errors, then hand the command line to Hydra's ``entry``."""
    try:
        check_group_choices(sys.argv[1:])
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    sys.argv = [sys.argv[0], *hydra_argv(sys.argv[1:])]
    (entry or main)()


if __name__ == "__main__":
    cli()
