"""From validated configs to a finished run, on any backend or in the simulator.

`RunSpec` is everything a run needs, checked before any process group starts.
`execute` starts the kind of run (`dane.loop.kinds.start`: the simulator's threads, launched
processes, Horovod elastic, split learning, asynchronous runs), which starts the workers;
each runs the one run loop (`dane.loop.driver`), and rank 0 writes the results.

A run with ``checkpoint_every`` survives a lost process: every rank writes its part of a
checkpoint, rank 0 commits the round once all parts are on disk (`dane.loop.checkpoint`), and
``resume=auto`` (or ``resume=<run dir>``) continues from the newest committed round, so
a job restarted by its launcher (``torchrun --max-restarts``) finishes as if never
stopped.  Under Horovod elastic (``comm.elastic=true``, `dane.loop.elastic`) the job is not
restarted: the surviving workers reset to the new world size and continue from the
last round committed in memory, in the same run loop and run directory.  In the simulator ``sim.fail_at`` loses a worker on purpose (`SimulatedFault`),
and a Ctrl-C stops every worker at its next collective, writes the summary with
``status: interrupted`` and exits with status 130 (`RunInterrupted`).
"""
from __future__ import annotations

import dataclasses
import math

import torch

from .checkpoint import check_resume
from ..errors import ConfigError, DivergenceError
from .kinds import runs_batched, start
from . import timeline
from .spec import RunSpec

__all__ = ["execute"]


def execute(spec: RunSpec, out_dir: str | None, *, collect: dict | None = None) -> dict:
    """Run ``spec``; rank 0 writes ``out_dir``.  Returns the summary (on every rank).

    ``collect``, when given, receives rank 0's ``records`` and final iterate ``w`` (the Python API).
    A problem config with ``numerics()`` (a network: `dane.problems.neural.reproducible_numerics`)
    fixes torch's thread count and algorithms for the whole run, on every rank and in the simulator.
    The kind of run (`dane.loop.kinds.start`) starts the workers; each runs the one run loop (`dane.loop.driver`).
    """
    if spec.comm.backend == "horovod":
        spec.comm.horovod.apply()  # before hvd.init(), and before numerics() so that its thread count wins
    with spec.problem.numerics():
        control = spec.control
        torch.manual_seed(control.seed)
        if control.resume is not None:
            out_dir = control.resume  # a resumed run continues in its own directory
            check_resume(control.resume, spec.comm.workers, control.stop.rounds, control.config_text,  # before anything
                         batched=runs_batched(spec))  # there changes; on the path that wrote the checkpoint
        if control.checkpoint_every and not out_dir and spec.comm.simulated:
            raise ConfigError(f"checkpoint_every={control.checkpoint_every} needs a run directory; set out_dir")
        timeline.begin_run()  # marks made since the last run (but the entry point's config) are not this run's
        try:
            summary = start(spec, out_dir, collect)
        finally:
            timeline.end_run()  # the next run of this process marks its own phases
    own_driver = spec.algorithm.run_job is not None  # split learning says so in its own summary, and returns
    if not own_driver and summary.get("status") == "diverged":
        counted = summary["stopped_by"] == spec.control.stop.counted_divergence()
        # out_dir is None where this process writes nothing: a launched rank other than 0, a run without a folder
        kept = f"; results so far are in {out_dir}" if out_dir else ""
        # the method's own remedy where it ended the run itself and named one (`dane.algorithm.Finished`), which
        # knows the run's solver and problem; else the config's guesses
        raise DivergenceError(
            f"{summary['algorithm']} diverged at round {summary['rounds']} (objective {summary['final_objective']:.3g})"
            f"{kept}; {summary['remedy'] or 'try ' + ' or '.join(recovery_overrides(spec.algorithm))}"
            + ("; where its objective overshot and is falling back, diverge_after=null lets it go on" if counted
               else "")
        )
    return summary


#: the keys of a method's step sizes that the divergence hint shrinks, or hands back to the package's rule
STEP_KEYS = ("lr", "gamma")


def recovery_overrides(algorithm) -> list[str]:
    """Overrides that make a diverging ``algorithm`` safer, each a key its config has (`DivergenceError`'s hint): a
    given step (`STEP_KEYS`) back to null where that is the config's default (a rule of the package picks it: GD's
    lr, ADIANA's γ), else a tenth of it (synchronous SGD's lr)."""
    fields = dataclasses.fields(algorithm) if dataclasses.is_dataclass(algorithm) else ()
    keys = {f.name: getattr(algorithm, f.name) for f in fields}
    defaults = {f.name: f.default for f in fields}  # dataclasses.MISSING where a key has none
    out = list(algorithm.recovery()) if hasattr(algorithm, "recovery") else []
    if keys.get("safeguard") is False:
        out.append("algorithm.safeguard=true")
    role, mu = getattr(algorithm, "mu_role", None), keys.get("mu")
    if isinstance(mu, (int, float)) and not isinstance(mu, bool):
        if role == "damping" and math.isfinite(10 * float(mu)):  # a hint is a value one can set: never inf
            out.append(f"algorithm.mu={max(1e-3, 10 * float(mu)):g}")
        elif role == "strong_convexity":  # a larger μ overstates it: the step then overshoots
            out.append("algorithm.mu=null (the default, from the problem: a μ above the objective's strong "
                       "convexity overstates it)")
    if keys.get("adaptive_rho") is False:
        out.append("algorithm.adaptive_rho=true")
    for key in STEP_KEYS:
        step = keys.get(key)
        if not isinstance(step, (int, float)) or isinstance(step, bool):
            continue
        # a given step where the config's default is null: back to the package's rule (a tenth of 1e308 diverges
        # too); else a smaller step, where a step <= 0 is none to shrink and an infinite one (1e400) has no tenth
        if defaults.get(key, 0) is None:
            out.append(f"algorithm.{key}=null (the default, which the package's rule picks)")
        elif 0 < float(step) / 10 < math.inf:
            out.append(f"algorithm.{key}={float(step) / 10:g}")
    if getattr(algorithm, "name", None) != "dane":
        out.append("algorithm=dane (safeguarded)")
    return out
