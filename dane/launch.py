"""From validated configs to a finished run, on any backend or in the simulator.

`RunSpec` is everything a run needs, checked before any process group starts.
`execute` starts the backend (or m simulated worker threads), runs the same worker
function on each, and lets rank 0 write the results.

A run with ``checkpoint_every`` survives a lost process: every rank writes its part of a
checkpoint, rank 0 commits the round once all parts are on disk (`dane.checkpoint`), and
``resume=auto`` (or ``resume=<run dir>``) continues from the newest committed round, so
a job restarted by its launcher (``torchrun --max-restarts``) finishes as if never
stopped.  Under Horovod elastic (``comm.elastic=true``, `dane.elastic`) the job is not
restarted: the surviving workers reset to the new world size and continue from the
last round committed in memory, in the same run loop and run directory.  In the simulator ``sim.fail_at`` loses a worker on purpose (`SimulatedFault`),
and a Ctrl-C stops every worker at its next collective, writes the summary with
``status: interrupted`` and exits with status 130 (`RunInterrupted`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import time

import torch

from .checkpoint import check_resume
from .comm import Communicator, ThreadGroup, make_communicator
from .comm.launcher_signals import LauncherTerminated
from .comm.threads import meter_for
from .errors import ConfigError, DivergenceError, say
from .faults import RunInterrupted, worker_lost
from .reference import attach_all, attach_one
from .spec import RunSpec
from .worker import build_problem, run_worker

__all__ = ["execute"]


def execute(spec: RunSpec, out_dir: str | None, *, collect: dict | None = None) -> dict:
    """Run ``spec``; rank 0 writes ``out_dir``.  Returns the summary (on every rank).

    ``collect``, when given, receives rank 0's ``records`` and final iterate ``w`` (the Python API).
    A problem config with ``numerics()`` (a network: `dane.problems.neural.reproducible_numerics`)
    fixes torch's thread count and algorithms for the whole run, on every rank and in the simulator.
    """
    if spec.comm.backend == "horovod":
        spec.comm.horovod.apply()  # before hvd.init(), and before numerics() so that its thread count wins
    numerics = getattr(spec.problem, "numerics", None)
    with numerics() if numerics is not None else contextlib.nullcontext():
        return _execute(spec, out_dir, collect)


def _execute(spec: RunSpec, out_dir: str | None, collect: dict | None) -> dict:
    control, m = spec.control, spec.comm.workers
    torch.manual_seed(control.seed)
    if control.resume is not None:
        out_dir = control.resume  # a resumed run continues in its own directory
        check_resume(control.resume, m, control.stop.rounds, control.config_text)  # before anything there changes
    if control.checkpoint_every and not out_dir and spec.comm.simulated:
        raise ConfigError(f"checkpoint_every={control.checkpoint_every} needs a run directory; set out_dir")
    if spec.algorithm.name == "split":  # one network cut between agents and a server (dane.split)
        from .split.run import run_split

        return run_split(spec, out_dir, collect)
    if spec.comm.asynchronous and spec.comm.backend == "local":  # asynchronous or stale-synchronous: event by event
        from .asynchronous.simulator import run_async

        summary = run_async(spec, out_dir, collect)
    elif spec.comm.simulated:
        torch.set_num_threads(1)  # a simulated worker has one core, in its setup as in its rounds
        problems, setups = zip(*(build_problem(spec, rank, m, time.thread_time) for rank in range(m)))
        attach_all(spec.problem, problems)
        group = ThreadGroup(m, spec.comm.cost, spec.comm.stragglers,
                            meter_for(getattr(problem, "device", "cpu") for problem in problems))
        start = time.perf_counter()
        summaries = group.run(lambda comm: run_worker(spec, comm, problems[comm.rank], out_dir, start, max(setups),
                                                   collect))
        summary = summaries[0]
        if group.interrupted:
            where = f"; records so far are in {out_dir}" if out_dir else ""
            at = f" after round {summary['rounds']}" if summary is not None else ""
            interrupted = RunInterrupted(f"interrupted{at}{where}")
            say(interrupted)
            raise interrupted
    elif spec.comm.elastic:
        from .elastic import run_elastic

        summary = run_elastic(spec, out_dir, collect)
    else:
        comm = make_communicator(spec.comm.backend, torch_backend=spec.comm.torch_backend, servers=spec.comm.servers)
        server, lost = getattr(comm, "is_server", False), None
        try:
            if not server:
                out_dir = comm.broadcast_object(out_dir or "", root=0) or None  # every rank agrees on rank 0's
            summary = _serve(spec, comm) if server else _launched(spec, comm, out_dir, collect)
        except (RuntimeError, LauncherTerminated) as exc:  # the latter a BaseException: no except Exception takes it
            lost = worker_lost(exc, "a parameter server" if server else f"worker {comm.rank}", out_dir,
                               spec.control.checkpoint_every)
            if lost is None:
                raise
        finally:
            with contextlib.suppress(RuntimeError) if lost is not None else contextlib.nullcontext():
                comm.shutdown()  # after a lost peer, a shutdown that talks to it fails too
        if lost is not None:
            raise lost from None
        if server:
            return summary  # a parameter server's counters: it has no records of its own
    if summary["status"] == "diverged":
        raise DivergenceError(
            f"{summary['algorithm']} diverged at round {summary['rounds']} (objective {summary['final_objective']:.3g}); "
            f"results so far are in {out_dir}; try {' or '.join(recovery_overrides(spec.algorithm))}"
        )
    return summary


def recovery_overrides(algorithm) -> list[str]:
    """Overrides that make a diverging ``algorithm`` safer, each a key its config has (`DivergenceError`'s hint)."""
    keys = {f.name: getattr(algorithm, f.name) for f in dataclasses.fields(algorithm)} \
        if dataclasses.is_dataclass(algorithm) else {}
    out = []
    if keys.get("safeguard") is False:
        out.append("algorithm.safeguard=true")
    if isinstance(keys.get("mu"), (int, float)):
        out.append(f"algorithm.mu={max(1e-3, 10 * float(keys['mu'])):g}")
    if keys.get("adaptive_rho") is False:
        out.append("algorithm.adaptive_rho=true")
    if isinstance(keys.get("lr"), (int, float)):
        out.append(f"algorithm.lr={float(keys['lr']) / 10:g}")
    if getattr(algorithm, "name", None) != "dane":
        out.append("algorithm=dane (safeguarded)")
    return out


def _serve(spec: RunSpec, comm: Communicator) -> dict:
    """A parameter server's part (comm=ps): it answers the workers until they shut it down; its counters."""
    if spec.comm.asynchronous:  # asynchronous: set-up, the workers' pushes, then their evaluations
        from .asynchronous.protocol import AsyncServer

        comm.serve()
        AsyncServer(comm, spec).serve()
    return comm.serve()


def _launched(spec: RunSpec, comm: Communicator, out_dir: str | None, collect: dict | None) -> dict:
    """One launched worker's run: its summary."""
    problem, setup_s = build_problem(spec, comm.rank, comm.size, time.perf_counter)
    release = getattr(spec.problem, "release", None)
    if release is not None:
        release()  # one process, one worker: keep only this worker's shard in memory
    attach_one(spec.problem, problem, comm)
    comm.barrier()
    comm.reset_clock()
    if spec.comm.asynchronous:
        from .asynchronous.replay import run_async_ps

        return run_async_ps(spec, comm, problem, out_dir, time.perf_counter(), setup_s, collect)
    return run_worker(spec, comm, problem, out_dir, time.perf_counter(), setup_s, collect)
