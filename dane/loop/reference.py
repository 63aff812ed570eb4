"""The reference optimum in a run (`dane.problems.optimum` makes it, with the workers): made before the run's clock
and counters start, its collectives not the run's, and its end marked ``reference`` on the process's timeline
(`dane.loop.timeline`)."""
from __future__ import annotations

from . import timeline
from ..problems.optimum import asks_reference, attach_shards


def attach_one(config, problem, comm) -> None:
    """The reference a problem config asks for (its ``attach_reference``), made by the workers before the
    run's clock and counters start: its collectives are not the run's."""
    if config.attach_reference is not None:
        config.attach_reference(problem, comm)
        comm.bytes_sent = comm.calls = 0
        if config.optimum != "none":
            timeline.mark("reference")


def attach_all(config, problems) -> None:
    """`attach_one` for m simulated workers (`dane.problems.optimum.attach_shards`: a thread group of its own, whose
    clock is not the run's)."""
    attach_shards(config, problems)
    if asks_reference(config):
        timeline.mark("reference")
