"""The reference optimum in a run (`dane.problems.optimum` makes it, with the workers): made before the run's clock
and counters start, its collectives on none of the run's counters (a backend's own included: comm=ps's links and
servers), and its end marked ``reference`` on the process's timeline (`dane.loop.timeline`)."""
from __future__ import annotations

from . import timeline
from ..problems.optimum import asks_reference, attach_shards


def attach_one(config, problem, comm) -> None:
    """The reference a problem config asks for (its ``attach_reference``), made by the workers before the
    run's clock and counters start: its collectives are not the run's (`dane.comm.Communicator.uncounted`)."""
    if config.attach_reference is not None:
        with comm.uncounted():  # on no counter: this worker's, nor a backend's own (comm=ps: links and servers)
            config.attach_reference(problem, comm)
        if config.optimum != "none":
            timeline.mark("reference")


def attach_all(config, problems) -> None:
    """`attach_one` for m simulated workers (`dane.problems.optimum.attach_shards`: a thread group of its own, whose
    clock is not the run's)."""
    attach_shards(config, problems)
    if asks_reference(config):
        timeline.mark("reference")
