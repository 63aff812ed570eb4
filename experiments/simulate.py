"""The synthetic-ridge simulator: `experiments.train` with m simulated workers in one process.

    python -m experiments.simulate workers=8 problem.n_samples=18000
    python -m experiments.simulate -m workers=1,2,4,8,16,64 problem.n_samples=6000,10000,14000,18000 \
        algorithm=dane,admm,gd,osa
    python -m experiments.simulate -m experiment=speedup      # a sweep defined in conf/experiment/

The config is conf/simulate.yaml: conf/config.yaml with comm=local and the simulator
defaults of conf/experiment/simulator.yaml (tol=1e-10, rounds=200, quiet).  A multirun
writes one run directory per job under one sweep directory (conf/config.yaml, hydra.sweep).
A diverged job ends a single run with status 3 but not a sweep.  Each simulated worker
gets one core: torch runs single-threaded, also at workers=1, so that times are
comparable across m.
"""
from __future__ import annotations

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from experiments import train

DIVERGED = 3  # experiments.train's exit status for a diverged run


@hydra.main(config_path="../conf", config_name="simulate", version_base="1.3")
def main(cfg: DictConfig) -> None:
    torch.set_num_threads(1)
    try:
        train.main.__wrapped__(cfg)  # the training entry point's body, without a second @hydra.main
    except SystemExit as exc:
        # In a sweep a diverged job (exit 3, its results written) is a result: go on to the next job.
        if exc.code != DIVERGED or HydraConfig.get().mode != RunMode.MULTIRUN:
            raise


if __name__ == "__main__":
    train.cli(main)
