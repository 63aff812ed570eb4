"""The synthetic-ridge simulator: `experiments.train` with m simulated workers in one process.

    dane simulate workers=8 problem.n_samples=18000
    dane simulate -m workers=1,2,4,8,16,64 problem.n_samples=6000,10000,14000,18000 \
        algorithm=dane,admm,gd,osa
    dane simulate -m experiment=speedup      # a sweep defined in conf/experiment/

The config is conf/simulate.yaml: conf/config.yaml with comm=local and the simulator
defaults of conf/experiment/simulator.yaml (tol_abs=1e-10, rounds=200, progress=none: each run's closing line).  A multirun
writes one run directory per job under one sweep directory (conf/config.yaml, hydra.sweep).
A diverged job ends a single run with status 3 but not a sweep (as in experiments.train).  Each simulated worker
gets one core: torch runs single-threaded, also at workers=1, so that times are
comparable across m.
"""
from __future__ import annotations

import hydra
from omegaconf import DictConfig

from dane.experiments import train


@hydra.main(config_path="../conf", config_name="simulate", version_base="1.3")
def main(cfg: DictConfig) -> None:
    import torch  # here, not at the top: --help (Hydra's, which never calls main) needs no torch

    torch.set_num_threads(1)
    train.main.__wrapped__(cfg)  # the training entry point's body, without a second @hydra.main


if __name__ == "__main__":
    train.cli(main, "simulate")
