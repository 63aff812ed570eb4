"""What happens around a round, as small objects the run loop (`dane.loop.driver.drive`) calls at fixed points.

The loop calls every callback's hooks in list order, as Lightning's fit loop calls its
callbacks:

- ``on_open(loop)``: before anything is written (where the run starts; the run directory);
- ``on_start(loop)``: just before round 0 (or the resumed round);
- ``on_round(loop, record)``: after each round's record (the stop rule has already read it);
- ``on_checkpoint(loop, state)``: every ``checkpoint_every`` rounds, with the state `dane.loop.runner.run`
  continues from;
- ``on_rounds_end(loop)``: once the rounds are over, however they ended;
- ``on_end(loop, summary)``: after the rounds, in order, each adds its keys to ``summary`` or writes
  what it keeps (the summary's writer and the closing line come last);
- ``on_close(loop)``: always, last (the run directory's lock is released here).

``loop`` is the run's `dane.loop.driver.Loop`: spec, communicator, algorithm, the records so far, the
result.  A callback holds what it needs from the spec, and nothing else calls back into the loop.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import sys

import torch
import yaml

from ..algorithm import Algorithm
from ..comm.batched import stacked, worker_ranks
from ..comm.tail import ALPHA_BETA_ONLY
from .checkpoint import (CHECKPOINT_DIR, commit_checkpoint, load_checkpoint, part_meta, resume_offer,
                         save_checkpoint, truncate_rounds, write_torch)
from ..records.confusion import write_confusion
from ..records.lock import lock_refusal
from ..errors import ConfigError, plural, say
from ..layout import CONF_DIR
from .faults import inject_faults
from ..comm.roster import fill_parked
from .progress import RoundBar, RoundTable
from ..records.results import (SUMMARY_FILE, RunWriter, held_run, in_target_units, occupied,
                               read_rounds)
from ..numerics.similarity import hessian_dissimilarity, offered
from ..records.trackers import open_trackers
from . import timeline


class Callback:
    """A hook at every fixed point of the run loop; each does nothing unless overridden."""

    def on_open(self, loop) -> None: ...

    def on_start(self, loop) -> None: ...

    def on_round(self, loop, record: dict) -> None: ...

    def on_checkpoint(self, loop, state: dict) -> None: ...

    def on_rounds_end(self, loop) -> None: ...

    def on_end(self, loop, summary: dict) -> None: ...

    def on_close(self, loop) -> None: ...


def off_clock(comm):
    """A simulated worker's bookkeeping, off its compute clock (`dane.comm.meters.PhaseClock.off_the_clock`); a
    launched worker's clock is the wall's, which it stays on."""
    return comm.off_the_clock() if hasattr(comm, "off_the_clock") else contextlib.nullcontext()


class Faults(Callback):
    """``sim.fail_at`` (and the test-only kill): lose this worker at a planned round (`dane.loop.faults.inject_faults`)."""

    def __init__(self, faults: tuple[tuple[int, int], ...]):
        self.faults = faults

    def on_round(self, loop, record: dict) -> None:  # on the batched path every worker is rank 0's to lose
        inject_faults(self.faults, worker_ranks(loop.comm), record["round"], loop.out_dir,
                      loop.spec.control.checkpoint_every)


class Checkpoints(Callback):
    """Checkpoints on disk (`dane.loop.checkpoint`): resume from ``resume=``'s committed round, write this rank's
    part every ``checkpoint_every`` rounds and (rank 0) commit it once every part is on disk (on the simulator's
    batched path one part, every worker's state stacked, committed as batched).  With
    ``load=False`` (Horovod elastic, which starts from its state in memory) the run does not start from disk."""

    def __init__(self, spec, *, load: bool = True):
        self.spec, self.control, self.load = spec, spec.control, load

    def meta(self, loop, rank: int) -> dict:
        return part_meta(self.spec, rank, loop.comm.size)

    def on_open(self, loop) -> None:
        if self.control.resume is None or not self.load:
            return
        loop.resume = load_checkpoint(self.control.resume, loop.comm.rank, self.meta(loop, loop.comm.rank))
        loop.continuing, loop.resumed_from = True, loop.resume["round"]
        if loop.comm.rank == 0:  # once `Records` holds the directory's lock: a live run's records are not ours to cut
            loop.when_locked.append(lambda: self.cut_records(loop))

    def cut_records(self, loop) -> None:
        """Rank 0, holding the run directory's lock: the records cut back to the checkpoint, and the run goes on
        with them in hand, so that what reads the whole run (the stop line's trend, a method's diagnosis, the
        summary's adaptations) reads the same as in a run that never stopped."""
        truncate_rounds(self.control.resume, loop.resume["round"])
        loop.resume["history"] = [in_target_units(r, loop.units, back=True) for r in read_rounds(self.control.resume)]

    def on_checkpoint(self, loop, state: dict) -> None:
        if loop.out_dir and self.control.checkpoint_every:
            batched = stacked(loop.comm)  # one part, every worker's state stacked (`dane.loop.checkpoint`)
            # the disk's time, and the wait for the other ranks' parts, are none of the simulated clock (`Records`;
            # a barrier off the clock draws no straggler delay: `dane.comm.threads.ThreadCommunicator.barrier`)
            with off_clock(loop.comm):
                save_checkpoint(loop.out_dir, loop.comm.rank, state, self.meta(loop, loop.comm.rank))
                if not batched:  # the batched path's one part is on disk already: no other rank to wait for
                    loop.comm.barrier()  # every rank's part is on disk before the round is committed
                if loop.comm.rank == 0:
                    commit_checkpoint(loop.out_dir, state["round"], loop.comm.size, self.control.config_text,
                                      batched=batched)

    def on_end(self, loop, summary: dict) -> None:
        if loop.resumed_from is not None:
            summary["resumed_from_round"] = loop.resumed_from


def replaces(control, out_dir: str) -> bool:
    """Whether the run replaces a run ``out_dir`` holds: ``overwrite``, or ``resume=auto`` that found no checkpoint
    to continue and no summary (an unfinished run's records, `dane.loop.resume.keep_unfinished`)."""
    return control.overwrite or (control.restart_unfinished and not os.path.exists(os.path.join(out_dir, SUMMARY_FILE)))


def refusal(control, out_dir: str | None) -> str | None:
    """What `Records` will refuse ``out_dir`` with (another run's lock on it, `dane.records.lock.lock_refusal`; a run
    there, neither continued nor replaced), or None: a launched job's rank 0 finds it before any collective and sends
    it to every rank (`dane.loop.kinds.launched`), so that the others stop with it instead of waiting in a collective
    for a rank 0 that has gone."""
    if out_dir is None:
        return None
    locked = lock_refusal(out_dir)  # resume and overwrite too: a directory another run writes is refused to both
    if locked is not None:
        return locked
    if control.resume is not None or replaces(control, out_dir):
        return None
    held = held_run(out_dir)
    return occupied(out_dir, held, resume_offer(out_dir), control.out_dir_key) if held else None


class Records(Callback):
    """Rank 0's run directory (`dane.records.results.RunWriter`): config.yaml, every record, the summary; the
    trackers beside rounds.jsonl get each record once it is on disk.  In the simulator none of it is rank 0's compute
    (`off_clock`): a tracker's start-up (tensorboard, mlflow) and its writes left ``time_s`` depending on the logger."""

    def __init__(self, control):
        self.control = control

    def on_open(self, loop) -> None:
        with off_clock(loop.comm):
            self.open(loop)

    def open(self, loop) -> None:
        control = self.control
        loop.writer = RunWriter(loop.out_dir, resume=loop.continuing, overwrite=replaces(control, loop.out_dir),
                                resume_offer=resume_offer(loop.out_dir), out_dir_key=control.out_dir_key,
                                prepare=lambda: [step() for step in loop.when_locked],  # on_close releases it
                                config_text=control.config_text, config_dirs=control.config_dirs)
        if control.overwrite and not loop.continuing:  # the replaced run's checkpoints: no later resume may find them
            shutil.rmtree(os.path.join(loop.out_dir, CHECKPOINT_DIR), ignore_errors=True)
        if control.config_text:
            loop.writer.write_text("config.yaml", control.config_text)
        if len(control.logger) > 1:
            loop.writer.attach(open_trackers(control.logger, loop.out_dir,
                                             config=yaml.safe_load(control.config_text) or {},
                                             continuing=loop.continuing, mlflow_uri=control.mlflow_uri))

    def on_round(self, loop, record: dict) -> None:
        with off_clock(loop.comm):
            loop.writer.write_round(loop.reported(record))

    def on_rounds_end(self, loop) -> None:
        if loop.writer is not None:
            loop.writer.finish_rounds()

    def on_end(self, loop, summary: dict) -> None:
        loop.writer.write_summary(summary)

    def on_close(self, loop) -> None:
        if loop.writer is not None:
            loop.writer.close()


#: the display's share of the problem's notes: at most this many lines of at most `NOTE_CHARS` characters; the run
#: summary's ``notes`` keeps every note whole (at 100,000 clients a sharding note per worker would be 100,000 lines)
SHOWN_NOTES, NOTE_CHARS = 12, 400


def shown_notes(notes: list[str]) -> list[str]:
    """The ``note:`` lines a run prints: the first `SHOWN_NOTES` notes, each cut at `NOTE_CHARS` characters, and one
    line counting the rest, which the summary's ``notes`` holds."""
    lines = [f"note: {n if len(n) <= NOTE_CHARS else n[:NOTE_CHARS] + ' ...'}" for n in notes[:SHOWN_NOTES]]
    if len(notes) > SHOWN_NOTES:
        lines.append(f"note: ... and {len(notes) - SHOWN_NOTES} more notes, every one whole in the run summary's notes")
    return lines


class Display(Callback):
    """Rank 0's per-round display (`display`: the table of ``algorithm``'s columns or a progress bar); with
    ``preamble``, the problem's notes first and the stop rule above the first record; the config's notes
    (`dane.loop.spec.RunControl.notes`) before the rounds in any case."""

    def __init__(self, control, algorithm: type[Algorithm] = Algorithm, *, preamble: bool = True):
        self.control, self.algorithm, self.preamble = control, algorithm, preamble
        self.stop, self.show = control.stop, None

    def on_open(self, loop) -> None:
        self.show = display(self.control, self.algorithm)
        for line in shown_notes([*(loop.problem.notes if self.preamble else ()), *self.control.notes]):
            say(line)

    def on_round(self, loop, record: dict) -> None:
        with off_clock(loop.comm):  # what is shown is no worker's compute: quiet=true or not, the same time_s
            record = loop.reported(record)
            if self.preamble and len(loop.seen) == 1:  # the records' keys now say which test tol applies to
                unapplied = self.stop.unapplied(record)
                say(f"stop: {' or '.join(filter(None, (self.stop.rule(record), plural(self.stop.rounds, 'round'))))}"
                    + (f"; {unapplied}" if unapplied else ""))
            self.show(record)

    def on_rounds_end(self, loop) -> None:
        if isinstance(self.show, RoundBar):
            self.show.close()


def shows(control) -> bool:
    """Does rank 0 show the rounds (and the closing line)?"""
    return not (control.quiet or control.progress == "none")


def display(control, algorithm=Algorithm):
    """Rank 0's per-round display: the table (with ``algorithm``'s columns), a progress bar, or nothing (None)."""
    if not shows(control):
        return None
    if control.progress == "bar" or (control.progress == "auto" and sys.stderr.isatty()):
        return RoundBar(control.stop.rounds)
    return RoundTable(control.print_every, algorithm=algorithm)


class Timeline(Callback):
    """Where the process's time went (`dane.loop.timeline`) and the worker's own set-up time, in the summary."""

    def on_start(self, loop) -> None:
        timeline.mark("round0")

    def on_rounds_end(self, loop) -> None:
        timeline.mark("end")

    def on_end(self, loop, summary: dict) -> None:
        summary.update(setup_s=loop.setup_s, timeline=timeline.phases())


class ProblemFacts(Callback):
    """The last gradient norm and what the problem says of its data (notes, ``data_info``), in the summary; the
    config's notes (`dane.loop.spec.RunControl.notes`) after the problem's."""

    def on_end(self, loop, summary: dict) -> None:
        summary["final_grad_norm"] = loop.records[-1].get("grad_norm")
        notes = [*loop.problem.notes, *loop.spec.control.notes]
        if notes:
            summary["notes"] = notes
        if loop.problem.data_info is not None:
            summary["data"] = loop.problem.data_info


class Policy(Callback):
    """The package's default rules as a run applied them (a method that tracks them sets ``algo.defaults``:
    `dane.algorithm.Rounds.defaults`): rank 0 shows each resolved default and the adaptations attached before round 0,
    and the summary lists them (``defaults``; after them the ``problem.*`` solver nulls the rounds' local solves used,
    each at its first use: `dane.numerics.local_solvers.SolverNotes`, which rank 0 shows at the end), every mid-run
    adaptation its records carry (``adaptations``: round, key, from, to, trigger) and whether any package rule applied
    (``package_rules_applied``: false for a run given every number), and the adaptations that were watching
    (``adaptations_attached``, `baselines.adaptive`)."""

    def __init__(self, show: bool):
        self.show = show

    def on_start(self, loop) -> None:
        defaults = getattr(loop.algo, "defaults", None)
        if not self.show or loop.comm.rank != 0:
            return
        if defaults is None:
            for key, rule in getattr(loop.algo, "pending_defaults", {}).items():
                say(f"default: {key} in round 0 ({rule})")
            return
        for entry in defaults:
            show_default(entry)
        notes = getattr(loop.problem, "solver_notes", None)
        open_keys = notes.open_keys(getattr(loop.problem, "solver", None)) if notes is not None else {}
        if not defaults:  # the problem's nulls are noted where a local solve uses them, and shown at the end
            say("default: none (every number given)" if not open_keys else
                f"default: none of algorithm.*; {', '.join(open_keys)} where the rounds' local solves use them")
        attached = [a.name for a in getattr(loop.algo, "adaptations", ())]
        if attached:
            say(f"adapting: {', '.join(attached)} (each firing is its round's adapted event)")

    def on_end(self, loop, summary: dict) -> None:
        defaults = getattr(loop.algo, "defaults", None)
        if defaults is None:
            pending = getattr(loop.algo, "pending_defaults", {})
            if pending:  # no round ran (rounds=0): the round-0 rules never did
                summary.update(defaults=[], defaults_unresolved=[{"key": k, "rule": r} for k, r in pending.items()],
                               adaptations=[], package_rules_applied=False, adaptations_attached=[])
            return
        adaptations = [{"round": r["round"], **event} for r in loop.records for event in r.get("adapted", ())]
        used = list(getattr(getattr(loop.problem, "solver_notes", None), "entries", {}).values())
        if self.show and loop.comm.rank == 0:
            for entry in used:
                show_default(entry)
        defaults = [*defaults, *used]
        summary.update(defaults=list(defaults), adaptations=adaptations,
                       package_rules_applied=bool(defaults or adaptations),
                       adaptations_attached=[a.name for a in getattr(loop.algo, "adaptations", ())])


def show_default(entry: dict) -> None:
    """One resolved default's line: key = value (rule: the statistics it read)."""
    stats = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in entry["stats"].items())
    value = f"{entry['value']:.6g}" if isinstance(entry["value"], float) else entry["value"]
    say(f"default: {entry['key']} = {value} ({entry['rule']}" + (f": {stats})" if stats else ")"))


class SimulatedCost(Callback):
    """The simulator's clocks: simulated parallel time, its compute and communication parts, and the cost model."""

    def on_end(self, loop, summary: dict) -> None:
        group = loop.comm.group  # a `dane.comm.ThreadGroup`, or the asynchronous simulator's totals
        summary.update(simulated_time_s=group.clock, simulated_compute_s=group.compute_time,
                       simulated_comm_s=group.comm_time, simulated_compute_clock=group.compute_clock,
                       **{"calibration": ALPHA_BETA_ONLY, **group.cost.describe()})  # a drawn tail: its file
        if loop.spec.comm.cost_file is not None:  # alpha and beta (and a tail) from a file: which one
            summary["calibration_file"] = loop.spec.comm.cost_file
        left_out = getattr(getattr(group, "meter", None), "start_up_left_out", None)
        if left_out is not None:  # numba's compiles and cache loads: start-up, off the clock (`dane.comm.meters`)
            summary["simulated_start_up_s"] = left_out()


class Collect(Callback):
    """The Python API's ``collect``: rank 0's records, the last record's iterate and the summary."""

    def __init__(self, collect: dict):
        self.collect = collect

    def on_end(self, loop, summary: dict) -> None:
        if loop.comm.rank == 0 and loop.status != "interrupted":
            self.collect.update(records=loop.records, w=loop.iterate.detach().clone(), summary=summary)


class FinalState(Callback):
    """The test confusion matrix (a classifier) and, with ``save_iterate``, the final iterate (rank 0 writes both).

    The confusion matrix is one more allreduce after the last record, so no logged cost includes it; every
    rank joins it (a client the thread simulator parked through its part from its shard: `dane.loop.parking`).
    """

    def __init__(self, spec):
        self.spec = spec

    def on_end(self, loop, summary: dict) -> None:
        spec, comm, out_dir = self.spec, loop.comm, loop.out_dir if loop.writer is not None else None
        if loop.problem.confusion_matrix is not None and loop.status not in ("diverged", "interrupted"):
            iterate = loop.iterate
            fill_parked(comm, lambda problem: [problem.confusion_matrix(iterate)])  # a client the simulator parked
            (counts,) = comm.allreduce_mean([loop.problem.confusion_matrix(iterate)])
            if out_dir is not None:
                write_confusion(out_dir, counts.numpy(), f"{spec.algorithm.name} on {problem_ran(spec.problem)}, "
                                                         f"{comm.size} worker(s), round {loop.records[-1]['round']}")
        if out_dir is not None and spec.control.save_iterate and loop.status != "interrupted":
            save_iterate(out_dir, loop.iterate)


def save_iterate(out_dir: str, iterate: torch.Tensor) -> None:
    """``out_dir``/iterate.pt, the last record's iterate, written atomically (an OSError when the disk is full); a CPU
    tensor whatever device the run used, so that it loads on a machine without that device."""
    write_torch(os.path.join(out_dir, "iterate.pt"), iterate.detach().to("cpu", copy=True))


class Similarity(Callback):
    """``similarity=true``: the Hessian dissimilarity δ = max_i ‖∇²O_i − ∇²O‖ (and its mean-square variants,
    `dane.numerics.similarity.hessian_dissimilarity`) at the iterate the rounds start from and at the last record's, in
    the summary as ``similarity: {start, end}``.

    A collective on every rank.  Both are measured after the last round (the start iterate is kept until
    then), so no record, cost counter or simulated clock in the summary includes them; their own cost is in
    each entry (``allreduces``, ``bytes_sent``).  A problem without Hessian-vector products (a network) is
    refused before anything is written.
    """

    def __init__(self, problem_name: str):
        self.problem_name = problem_name
        self.start = None

    def on_open(self, loop) -> None:
        if not offered(loop.problem):
            raise ConfigError(f"similarity=true needs a convex problem with Hessian-vector products; "
                              f"problem={self.problem_name} has none: drop similarity=true")

    def on_start(self, loop) -> None:
        self.start = loop.algo.iterate.detach().clone()

    def on_end(self, loop, summary: dict) -> None:
        if loop.status in ("diverged", "interrupted"):  # the same status on every rank: all skip or none
            return
        summary["similarity"] = {"start": hessian_dissimilarity(loop.problem, loop.comm, self.start),
                                 "end": hessian_dissimilarity(loop.problem, loop.comm, loop.result.iterate)}


class CommEntries(Callback):
    """What the backend adds to the summary (`dane.comm.Communicator.summary_entries`; comm=ps: the servers'
    busy time and per-link traffic, a collective that every worker joins).  Those counters are this process's and
    its servers', which start with it: ``parameter_server``'s ``since_round`` says from which round they count
    (the round a resumed run went on from, 0 for a run from its start), where the records count from round 0."""

    def on_end(self, loop, summary: dict) -> None:
        entries = loop.comm.summary_entries()
        if "parameter_server" in entries:
            entries["parameter_server"] = {"since_round": loop.resumed_from or 0, **entries["parameter_server"]}
        summary.update(entries)


class ClosingLine(Callback):
    """Rank 0's closing line: how the run ended, its final metrics, its traffic and time."""

    def on_end(self, loop, summary: dict) -> None:
        final, relative = summary["final_suboptimality"], summary["final_relative_suboptimality"]
        tail = f"final suboptimality {final:.3e}" if final is not None else \
            f"final objective {summary['final_objective']:.8e}"
        if relative is not None:
            tail += f" ({relative:.1e} x |O*|)"
        if "final_test_accuracy" in summary:
            tail += f", test accuracy {summary['final_test_accuracy']:.4f}"
        print(f"{summary['algorithm']} on {problem_ran(loop.spec.problem)}, {loop.comm.size} worker(s), "
              f"{summary['backend']}: "
              f"{summary['status']}"
              + (f" ({summary['stopped_by']})" if summary["stopped_by"] != summary["status"] else "")
              + f" after {plural(summary['rounds'], 'round')}, {tail}, "
              f"{summary['total_bytes']} bytes sent, {summary['time_s']:.3f} s"
              + (" simulated" if loop.spec.comm.simulated else "")
              + (f" -> {loop.out_dir}" if loop.out_dir else ""), flush=True)


def problem_ran(problem) -> str:
    """``problem``'s name, and the model and data that ran where they are not its preset's (conf/problem/<name>.yaml's
    defaults, swapped by ``model@problem.model=mlp`` or ``data@problem.data=digits``): "mnist_lenet5 (model=mlp,
    data=digits)".  A data config is named by its ``dataset`` (else its ``name``); the summary's ``problem`` stays
    the preset's name, which figures find runs by."""
    preset = CONF_DIR / "problem" / f"{problem.name}.yaml"
    if not preset.is_file():
        return problem.name
    chosen = {}
    for entry in yaml.safe_load(preset.read_text()).get("defaults") or []:
        if isinstance(entry, dict):
            chosen.update({key.lstrip("/").split("@")[0]: value for key, value in entry.items()})
    swaps = []
    if "model" in chosen and getattr(getattr(problem, "model", None), "name", chosen["model"]) != chosen["model"]:
        swaps.append(f"model={problem.model.name}")
    data = getattr(problem, "data", None)
    default = CONF_DIR / "data" / f"{chosen.get('data')}.yaml"
    if data is not None and "data" in chosen and default.is_file():
        ran = getattr(data, "dataset", None) or getattr(data, "name", None)
        preset_data = yaml.safe_load(default.read_text())
        if ran and ran != (preset_data.get("dataset") or preset_data.get("name")):
            swaps.append(f"data={ran}")
    return f"{problem.name} ({', '.join(swaps)})" if swaps else problem.name


def worker_callbacks(spec, loop, collect: dict | None = None, *, start: list[Callback] | None = None,
                     end: tuple[Callback, ...] = ()) -> list[Callback]:
    """What happens around an algorithm worker's rounds, in the order the loop calls it.

    ``start``: where the run starts and how its progress is committed (default: `Checkpoints` on disk,
    resumed from ``resume=``); ``end``: callbacks after the closing line (an asynchronous run's update log).
    """
    control, rank = spec.control, loop.comm.rank
    callbacks: list[Callback] = [Faults(control.faults), *(start if start is not None else [Checkpoints(spec)]),
                                 Timeline(), ProblemFacts(), Policy(shows(control))]
    if spec.comm.simulated:
        callbacks.append(SimulatedCost())
    if collect is not None:
        callbacks.append(Collect(collect))
    callbacks.append(FinalState(spec))
    if control.similarity:  # after the cost callbacks, before the summary is written
        callbacks.append(Similarity(spec.problem.name))
    callbacks.append(CommEntries())
    if rank == 0 and loop.out_dir:
        callbacks.append(Records(control))
    if rank == 0 and shows(control):
        callbacks += [Display(control, spec.algorithm.algorithm), ClosingLine()]  # the table: its declared columns
    elif rank == 0 and not control.quiet:  # progress=none: no rounds, but how the run ended and where it wrote
        callbacks.append(ClosingLine())
    return [*callbacks, *end]
