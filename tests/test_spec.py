"""`RunSpec`'s four groups: each checks its own fields, and the config code fills each from its Hydra keys."""
from __future__ import annotations

import math
import re

import pytest
import torch

from dane.comm import AlphaBeta
from dane.errors import ConfigError
from dane.experiments.config import run_spec
from dane.loop.spec import Communication, RunControl, RunSpec
from dane.synthetic.sweep import compose_job


@pytest.mark.parametrize("group, values, message", [
    (Communication, {"backend": "mpi"}, "comm.backend must be one of horovod|torch|ps|local, got 'mpi'"),
    (Communication, {"workers": 0}, "workers must be a positive integer, got 0"),
    (Communication, {"servers": 0}, "comm.servers must be a positive integer, got 0"),
    (Communication, {"elastic": "yes"}, "comm.elastic must be true or false, got 'yes'"),
    (Communication, {"staleness": -1}, "comm.staleness must be an integer >= 0 or inf"),
    (Communication, {"staleness": 0.5}, "comm.staleness must be an integer >= 0 or inf"),
    (Communication, {"step_time": 0}, "sim.step_time must be > 0, got 0"),
    (Communication, {"worker_slowdown": (1.0, 0.5)}, "comm.slowdown factors must be >= 1"),
    (RunControl, {"seed": 1.5}, "seed must be an integer in [0, 2**32 - 1], got 1.5"),
    (RunControl, {"dtype": torch.int64}, "dtype must be torch.float64 or torch.float32, got torch.int64"),
    (RunControl, {"print_every": 0}, "print_every must be a positive integer, got 0"),
    (RunControl, {"progress": "dots"}, "progress must be one of table|bar|auto|none, got 'dots'"),
    (RunControl, {"checkpoint_every": -1}, "checkpoint_every must be an integer >= 0 (0: never), got -1"),
    (RunControl, {"overwrite": 1}, "overwrite must be true or false, got 1"),
])
def test_each_group_refuses_a_bad_field_naming_its_hydra_key(group, values, message):
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        group(**values)


def test_simulated_and_asynchronous_follow_backend_workers_and_staleness():
    assert not Communication().simulated  # one local worker: a plain run
    assert Communication(workers=2).simulated
    assert Communication(simulate_single=True).simulated
    assert not Communication(backend="torch", workers=2).simulated  # a launched run
    assert not Communication().asynchronous
    assert Communication(workers=3, staleness=math.inf).asynchronous and Communication(staleness=2).asynchronous


def test_a_fault_needs_a_worker_that_exists():
    control = RunControl(faults=((3, 2),))
    with pytest.raises(ConfigError, match=r"sim\.fail_at entry \[3,2\] needs round >= 0 and 0 <= worker < 2"):
        RunSpec(problem=None, algorithm=None, comm=Communication(workers=2), control=control)
    assert RunSpec(problem=None, algorithm=None, comm=Communication(workers=3), control=control).control.faults


def test_the_config_fills_each_group_from_its_keys():
    spec = run_spec(compose_job(("workers=3", "sim.alpha=0.002", "sim.beta=1e8", "sim.slowdown=[1.0,2.0]", "seed=7",
                                 "rounds=4", "tol=1e-6", "print_every=2", "progress=none", "dtype=float32",
                                 "problem.n_samples=60", "problem.dim=5")))
    assert spec.problem.dim == 5 and spec.algorithm.name == "dane"
    assert spec.comm.backend == "local" and spec.comm.workers == 3 and spec.comm.simulated
    assert spec.comm.cost == AlphaBeta(alpha=0.002, beta=1e8) and spec.comm.stragglers.slowdown == (1.0, 2.0)
    assert spec.control.seed == 7 and spec.control.dtype == torch.float32
    assert (spec.control.stop.rounds, spec.control.stop.tol) == (4, 1e-6)
    assert (spec.control.print_every, spec.control.progress, spec.control.checkpoint_every) == (2, "none", 0)
    assert "seed: 7" in spec.control.config_text  # the resolved config, written beside the records
