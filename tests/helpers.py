"""Shared by the tests: run algorithms in the in-process simulator and launch real multi-process jobs."""
from __future__ import annotations
import contextlib
import functools
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dane.comm import ThreadGroup
from dane.comm.batched import BatchedGroup, run_batched
from dane.problems import RidgeSyntheticConfig
from dane.loop.runner import run
from dane.loop.stopping import StopRule

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def ridge_shards(m: int, config: RidgeSyntheticConfig):
    return [config.build(rank, m) for rank in range(m)]


def simulate(config, problems, rounds: int, tol: float | None = None):
    """Run ``config`` on one thread per problem; returns per worker (algorithm, records, iterates w_0..w_T).

    ``tol`` is an absolute suboptimality when the problems have a reference optimum (the tests
    assert ``suboptimality <= tol`` against closed forms, as the stop rule read before issue 23
    made ``tol`` relative: `StopRule.tol_abs`), else the relative gradient-norm rule.
    """
    reference = "suboptimality" in getattr(problems[0], "metric_names", ())
    stop = StopRule(rounds=rounds, tol_abs=tol) if reference else StopRule(rounds=rounds, tol=tol)

    def worker(comm):
        algo = config.build(problems[comm.rank], comm)
        iterates = [algo.iterate.clone()]  # on_round(record t) sees w_{t+1}: step t has already moved on
        records, _ = run(algo, stop, lambda record: iterates.append(algo.iterate.clone()))
        return algo, records, iterates[: len(records)]

    return ThreadGroup(len(problems)).run(worker)


def simulate_stacked(config, problem, rounds: int, tol: float | None = None):
    """`simulate` on the batched communicator (`dane.comm.batched`): ``problem`` holds the m workers' shards
    stacked (``stacked_workers = m``: `ProblemConfig.build_stacked`), and one computation runs them all, where
    ``config``'s class declares ``batchable``.  Returns [(algorithm, records, iterates w_0..w_T)], rank 0's view,
    as ``simulate(...)[0]``: the iterate is shared by every worker.  For the tests whose point is an identity on
    m workers (a method equal to another, or to a closed form), not the per-worker path itself."""
    assert config.algorithm.batchable, f"{type(config).__name__} has no stacked form"
    reference = "suboptimality" in getattr(problem, "metric_names", ())
    stop = StopRule(rounds=rounds, tol_abs=tol) if reference else StopRule(rounds=rounds, tol=tol)

    def worker(comm):
        algo = config.build(problem, comm)
        iterates = [algo.iterate.clone()]
        records, _ = run(algo, stop, lambda record: iterates.append(algo.iterate.clone()))
        return algo, records, iterates[: len(records)]

    return [run_batched(BatchedGroup(problem.stacked_workers), worker)]


def straight_and_resumed(config, shards, rounds: int = 3) -> list[tuple]:
    """Per worker of a ThreadGroup over ``shards``: (records, records, iterate, iterate) of ``rounds`` rounds
    after ``rounds`` rounds, once straight on and once from a fresh build loaded with the state_dict there.  Where
    ``shards`` is one stacked problem, the same on the batched communicator over it: [rank 0's tuple], as
    `simulate_stacked`."""

    def run(comm):
        problem = shards[comm.rank] if isinstance(shards, list) else shards
        algo = config.build(problem, comm)
        for _ in range(rounds):
            algo.step()
        state = algo.state_dict()
        straight = [algo.step() for _ in range(rounds)]
        w_straight = algo.iterate.clone()
        resumed = config.build(problem, comm)
        resumed.load_state_dict(state)
        again = [resumed.step() for _ in range(rounds)]
        return straight, again, w_straight, resumed.iterate

    if isinstance(shards, list):
        return ThreadGroup(len(shards)).run(run)
    return [run_batched(BatchedGroup(shards.stacked_workers), run)]


def composed(*overrides: str, name: str = "config", hydra: bool = False):
    """conf/<name>.yaml under ``overrides``, composed as the entry point composes it (``hydra``: with its ``hydra``
    node, as a launcher or a sweep's job sees it).

    Hydra's compose takes a good part of a second, and the suite composes hundreds of configs: the config-group
    choices (``problem=logreg``, ``experiment=...``) are composed by Hydra once per distinct choice a session
    (`composed_groups`), and each plain ``key=value`` of an existing key is then applied to a copy as Hydra applies a
    command line's (`OmegaConf.update` with merge, in order).  Anything else (``+key``, ``~key``, ``group@pkg=``, a
    sweep, a key the config lacks, a ``hydra`` key or node) takes Hydra's own path, errors included."""
    import copy

    from omegaconf import OmegaConf

    from dane.layout import CONF_DIR

    plain = [o for o in overrides if not (CONF_DIR / o.split("=", 1)[0]).is_dir()]
    if hydra or any(o.lstrip("+~").startswith("hydra") for o in overrides):  # hydra.searchpath moves the groups
        return hydra_composed(name, overrides, hydra=hydra)
    cfg = copy.deepcopy(composed_groups(name, tuple(o for o in overrides if o not in plain)))
    for override in map(parsed_override, plain):
        key = override.key_or_group
        if override.is_add() or override.is_delete() or override.is_force_add() or override.package is not None \
                or override.is_sweep_override() or OmegaConf.select(cfg, key, default=MISSING_KEY) is MISSING_KEY:
            return hydra_composed(name, overrides)
        OmegaConf.update(cfg, key, override.value(), merge=True)
    return cfg


#: what `OmegaConf.select` gives for a key the config lacks (`composed`)
MISSING_KEY = object()


@functools.cache
def composed_groups(name: str, groups: tuple[str, ...]):
    """conf/<name>.yaml with the config-group choices ``groups``, by Hydra, once a session (`composed` copies it)."""
    return hydra_composed(name, groups)


@functools.cache
def parsed_override(text: str):
    """One command-line override as Hydra's grammar parses it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    (override,) = OverridesParser.create().parse_overrides([text])
    return override


def hydra_composed(name: str, overrides, hydra: bool = False):
    """conf/<name>.yaml under ``overrides`` by Hydra's compose."""
    from hydra import compose, initialize_config_dir

    from dane.layout import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(name, overrides=list(overrides), return_hydra_config=hydra)


def flock_waits(folder: Path, mode: int) -> bool:
    """Whether an ``flock`` of ``folder`` in ``mode`` (fcntl.LOCK_SH or LOCK_EX) would wait now: another descriptor
    holds it the other way (`dane.records.lock.flocked`)."""
    import fcntl

    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@contextlib.contextmanager
def fails_after(seconds: float, what: str):
    """The block, failed (`pytest.fail`, naming ``what``) once it has run ``seconds``: SIGALRM interrupts the main
    thread where it blocks (an ``flock`` a regression never lets go, an event or join), so such a test fails instead
    of hanging.  The main thread only; threads a test starts are daemons, so one left blocked does not hold the
    process at exit."""
    def expired(signum, frame):
        pytest.fail(f"{what}: still waiting after {seconds} s", pytrace=False)

    before = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


def unused_pid() -> int:
    """A pid no process has now (no /proc entry): a process that has exited, as a stale lock's owner is,
    without starting and reaping one.  Counted down from the kernel's pid_max, which pids reach last."""
    top = int(Path("/proc/sys/kernel/pid_max").read_text())
    return next(pid for pid in range(top - 1, 1, -1) if not Path(f"/proc/{pid}").exists())


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def train(*overrides: str, launcher: list[str] | None = None, timeout: float = 300,
          extra_env: dict | None = None) -> subprocess.CompletedProcess:
    """``[launcher] python -m experiments.train overrides...`` from the repository root (``extra_env``: more variables)."""
    cmd = [*(launcher or []), sys.executable, "-m", "experiments.train", *overrides]
    return subprocess.run(cmd, cwd=REPO, env={**env(), **(extra_env or {})}, capture_output=True, text=True,
                          timeout=timeout)


def simulated_run(out: Path, *overrides: str, workers: int = 2) -> Path:
    """The in-process simulator's run of ``overrides`` with ``workers`` into ``out``: the reference a launched
    run's records are compared with."""
    proc = train(*overrides, f"workers={workers}", f"out_dir={out}")
    assert proc.returncode == 0, proc.stderr
    return out


def horovodrun(np: int = 2) -> list[str]:
    pytest.importorskip("horovod.torch", reason="Horovod is not built; run `make setup`")
    exe = BIN / "horovodrun"
    if not exe.exists():
        pytest.skip("horovodrun is not installed next to this python")
    return [str(exe), "-np", str(np), "--gloo"]


def torchrun(np: int = 2) -> list[str]:
    exe = BIN / "torchrun"
    if not exe.exists():
        exe = shutil.which("torchrun")
    if not exe:
        pytest.skip("torchrun is not installed")
    return [str(exe), "--standalone", "--nproc_per_node", str(np), "--no-python"]  # the command names the python


def convex_rule_holds(records: list[dict], *, monotone_mu: bool = True) -> bool:
    """The convex safeguard's invariants: μ is on the grid 2^(k/4) and (on a quadratic, ``monotone_mu``)
    never decreases; accepted objectives never increase (beyond the guard's rtol of 1e-12: round-off once converged)."""
    mus = [r["mu"] for r in records[:-1]]
    on_grid = all(mu == 0 or abs(4 * math.log2(mu) - round(4 * math.log2(mu))) < 1e-9 for mu in mus)
    accepted = [r["objective"] for r in records[:-1] if r["accepted"]] + [records[-1]["objective"]]
    monotone = all(b >= a for a, b in zip(mus, mus[1:])) or not monotone_mu
    return on_grid and monotone and all(b <= a + 1e-12 * abs(a) for a, b in zip(accepted, accepted[1:]))


def on_path(problem, algorithm: str, workers: int, batched: str, rounds: int = 3, **keys) -> dict:
    """What a local run of ``algorithm`` (its config's ``keys``) leaves in ``collect`` (records, summary, iterate),
    with ``sim.batched`` as given: ``true``, the stacked problem; ``false``, one shard a worker."""
    from dane.api import algorithm_config
    from dane.loop.launch import execute
    from dane.loop.spec import Communication, RunControl, RunSpec

    spec = RunSpec(problem=problem, algorithm=algorithm_config(algorithm, **keys),
                   comm=Communication(backend="local", workers=workers, batched=batched),
                   control=RunControl(stop=StopRule(rounds=rounds), quiet=True))
    collected: dict = {}
    execute(spec, None, collect=collected)
    return collected
