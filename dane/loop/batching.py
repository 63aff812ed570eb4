"""Which path the simulator takes for m workers (``sim.batched``): one stacked computation, or one thread each.

``sim.batched=auto`` (the default) takes the batched path (`dane.comm.batched`) from
`AUTO_FROM` workers on, where the algorithm declares it (``batchable``), the problem has
a stacked form for m workers (`dane.problems.ProblemConfig.stacked_form`, or the algorithm's own:
`dane.algorithm.AlgorithmConfig.stacked_form`) that pays off on its
device (`ProblemConfig.batched_by_default`: a network stacks on a GPU, not on the CPU), and the run
asks for nothing kept per worker (a compressor's state, each worker's Hessian); checkpoints, resumes and
``sim.fail_at`` run on either path (one checkpoint part holds the m workers' stacked state:
`dane.loop.checkpoint`); ``true`` takes it at any m > 1 and refuses in one line where
it cannot run; ``false`` always runs one thread per worker.

Below `AUTO_FROM` workers ``auto`` keeps the per-worker path: there m threads cost little,
and its records equal a launched run's (horovodrun, torchrun) and a resumed or elastic
run's bit for bit, where the stacked computation's sums, taken in another order, agree
with them to round-off only.
"""
from __future__ import annotations

from ..errors import ConfigError

#: ``sim.batched=auto`` batches from this many simulated workers on
AUTO_FROM = 32


def why_not_batched(spec) -> str | None:
    """None when the m simulated workers of ``spec`` can run as one stacked computation; else why not (a clause)."""
    algorithm = spec.algorithm.algorithm
    if spec.comm.workers == 1:
        return "one worker has nothing to stack"
    if spec.comm.staleness > 0:
        return "an asynchronous run simulates its workers event by event"
    if not algorithm.batchable:
        return f"algorithm={spec.algorithm.name} has no stacked form (its class does not declare batchable)"
    if spec.comm.compress is not None:
        return "comm.compress draws and keeps a compressor's state per worker"
    if spec.control.similarity:
        return "similarity=true measures each worker's own Hessian"
    return spec.algorithm.stacked_form(spec.problem, spec.comm.workers)  # by default the problem's


def check_batched(spec) -> None:
    """``sim.batched=true`` where the batched path cannot run: one line naming why and the fix."""
    if spec.comm.simulated and spec.comm.batched == "true":
        why = why_not_batched(spec)
        if why is not None:
            raise ConfigError(f"sim.batched=true cannot run here: {why}; use sim.batched=auto (one thread per worker "
                              "where the batched path cannot run)")


def batched_path(spec) -> tuple[bool, str | None]:
    """Whether the simulator runs ``spec``'s workers as one stacked computation, and where ``sim.batched=auto``
    from `AUTO_FROM` workers on keeps one thread per worker, the run's note naming why (else None)."""
    mode = spec.comm.batched
    if not spec.comm.simulated or mode == "false" or (mode == "auto" and spec.comm.workers < AUTO_FROM):
        return False, None
    why = why_not_batched(spec)  # under true, not None was refused when the spec was made (`check_batched`)
    if why is None and mode == "auto" and not spec.problem.batched_by_default(spec.comm.workers):
        why = f"problem={spec.problem.name} is not stacked by default on this device (sim.batched=true stacks it)"
    if why is None:
        return True, None
    return False, (f"sim.batched=auto: one thread per worker, since {why}" if mode == "auto" else None)
