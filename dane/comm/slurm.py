"""A process's place in a Slurm job step, read from the variables ``srun`` sets.

Under ``srun`` each task is one worker: ``SLURM_PROCID`` is its rank,
``SLURM_STEP_NUM_TASKS`` the world size and ``SLURM_LOCALID`` its rank on the node.
The first host of the step's node list is the master, and the port comes from the job id
(`MASTER_PORT` overrides both), so every task of a step finds the same address without
talking first, and two jobs on one node use different ports.  A batch script itself
(``sbatch``'s step, no ``SLURM_STEP_ID``) and a single-task step are plain runs.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import ConfigError

PORT_BASE, PORT_SPAN = 20000, 10000  # below Linux's ephemeral ports (32768-60999)


@dataclass(frozen=True)
class SlurmTask:
    rank: int
    size: int
    local_rank: int
    master_addr: str
    master_port: int


def slurm_task(env: Mapping[str, str] | None = None) -> SlurmTask | None:
    """This process's task in an ``srun`` step of more than one task, or None (not under srun, or one task)."""
    env = os.environ if env is None else env
    if "SLURM_STEP_ID" not in env or "SLURM_PROCID" not in env:
        return None
    size = _integer(env, "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS")
    if size <= 1:
        return None
    nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    addr = env.get("MASTER_ADDR") or (first_host(nodes) if nodes else None)
    if not addr:
        raise ConfigError("srun set no SLURM_STEP_NODELIST or SLURM_JOB_NODELIST; set MASTER_ADDR to the first task's host")
    port = _integer(env, "MASTER_PORT") if "MASTER_PORT" in env else PORT_BASE + _integer(env, "SLURM_JOB_ID") % PORT_SPAN
    return SlurmTask(rank=_integer(env, "SLURM_PROCID"), size=size, local_rank=int(env.get("SLURM_LOCALID", 0)),
                     master_addr=addr, master_port=port)


def first_host(nodelist: str) -> str:
    """The first host of a Slurm host list: ``node[07-09,12],gpu1`` -> ``node07``, ``a[1-2]-b[3-4]`` -> ``a1-b3``."""
    depth, end = 0, len(nodelist)
    for i, char in enumerate(nodelist):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            end = i
            break
    return re.sub(r"\[([^\],\-]+)[^\]]*\]", r"\1", nodelist[:end].strip())


def _integer(env: Mapping[str, str], key: str) -> int:
    if key not in env:
        raise ConfigError(f"srun set no {key}; is this an srun task?")
    try:
        return int(env[key])
    except ValueError:
        raise ConfigError(f"{key}={env[key]!r} is not an integer") from None
