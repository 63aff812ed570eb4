"""``algorithm=split``: the cut, the schedule, where the labels are, and each side's optimizer (conf/algorithm/split.yaml)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import checks
from ..algorithm import AlgorithmConfig
from ..errors import ConfigError
from ..numerics.inner import STEP_OPTIMIZERS, InnerSolver

SCHEDULES = ("sequential", "splitfed")
LABELS = ("server", "agent")


@dataclass(frozen=True)
class SplitConfig(AlgorithmConfig):
    """Split training of a network problem: m agents hold bottoms, one server the top (docs/split_learning.md).

    ``cut`` names the model's module after which it is cut (null: the smallest valid
    bottom); ``schedule`` sequential (turns and hand-overs) or splitfed (parallel bottoms,
    averaged by rows at each epoch's end); ``labels`` server, or agent (U-shaped: the
    agent keeps the last layer and the loss).  A round is one epoch.
    """

    cut: str | None = None
    schedule: str = "sequential"
    labels: str = "server"
    batch_size: int = 32
    agent_optimizer: str = "sgd"
    agent_lr: float = 0.05
    agent_momentum: float = 0.0
    server_optimizer: str = "sgd"
    server_lr: float = 0.05
    server_momentum: float = 0.0
    seed: int = 0
    name: str = "split"
    notes: tuple[str, ...] = ()  # what the run chose for the user (comm=ps under torchrun), in summary.json

    def __post_init__(self) -> None:
        if self.cut is not None and not isinstance(self.cut, str):
            raise ConfigError(f"algorithm.cut must be a module name like net.2 (or null), got {self.cut!r}")
        checks.one_of("algorithm.schedule", self.schedule, SCHEDULES)
        checks.one_of("algorithm.labels", self.labels, LABELS)
        checks.positive_int("algorithm.batch_size", self.batch_size)
        for side in ("agent", "server"):
            checks.one_of(f"algorithm.{side}_optimizer", getattr(self, f"{side}_optimizer"), STEP_OPTIMIZERS)
            checks.positive(f"algorithm.{side}_lr", getattr(self, f"{side}_lr"))
            momentum = checks.nonnegative(f"algorithm.{side}_momentum", getattr(self, f"{side}_momentum"))
            if momentum >= 1:
                raise ConfigError(f"algorithm.{side}_momentum must be < 1, got {momentum}")

    def check_run(self, problem, dtype) -> None:
        """Each side's step within the model's dtype (``problem.dtype``, null: the run's ``dtype``): torch's SGD and
        Adam convert it to the parameters' dtype, and one above its largest value (1e308 against float32's 3.4e38)
        stopped the first step with a traceback."""
        from ..problems.neural import DTYPES

        named = getattr(problem, "dtype", None)
        dtype, key = (DTYPES[named], "problem.dtype") if named in DTYPES else (dtype, "dtype")
        largest = torch.finfo(dtype).max
        for side in ("agent", "server"):
            lr = getattr(self, f"{side}_lr")
            if lr > largest:
                raise ConfigError(f"algorithm.{side}_lr={lr:g} exceeds the largest {str(dtype).removeprefix('torch.')} "
                                  f"({largest:.4g}), the model's dtype ({key}), in which the optimizer takes "
                                  f"its step; the default is 0.05")

    @property
    def u_shaped(self) -> bool:
        return self.labels == "agent"

    def solver(self, side: str) -> InnerSolver:
        """The side's optimizer as the package's inner optimizer (`dane.numerics.inner.make_optimizer`)."""
        return InnerSolver(optimizer=getattr(self, f"{side}_optimizer"), lr=getattr(self, f"{side}_lr"),
                           momentum=getattr(self, f"{side}_momentum"), steps=1, batch_size=self.batch_size)

    def build(self, problem, comm):
        raise ConfigError("algorithm=split runs through dane.loop.launch (dane train algorithm=split ...), "
                          "not as a per-worker algorithm")

    def run_job(self, spec, out_dir: str | None, collect: dict | None) -> dict:
        """Split learning has a driver of its own (`dane.split.run.run_split`): the whole job; its summary."""
        from .run import run_split

        return run_split(spec, out_dir, collect)
