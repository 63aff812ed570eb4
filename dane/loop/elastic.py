r"""Horovod elastic: a run that goes on when workers are lost or added (``comm.elastic=true``).

Started by ``horovodrun --min-np A --max-np B --host-discovery-script S`` (which sets
``HOROVOD_ELASTIC=1``), `run_elastic` wraps the one run loop (`dane.loop.driver.drive`, with an
`ElasticCommit` among its callbacks) in ``hvd.elastic.run``.  Every ``checkpoint_every`` rounds (every
round when it is 0) each worker commits, in memory, the state from which `dane.loop.runner.run`
continues exactly (next round, cost counters, first record, early-stopping state, the
algorithm's state) with the world size that produced it; the commit also asks Horovod
whether hosts were added or removed.  The commit follows the round's allreduces and
holds only once every worker has reached it (`_committed_state`), so rank 0 has logged
every round before it; round 0's state is committed before the first round.

When a worker is lost (a collective fails: ``HorovodInternalError``) or the host set
changes (``HostsUpdatedInterrupt`` at a commit), Horovod re-initializes the survivors
with the new (rank, size), rank 0's committed state is broadcast to every worker, and
the run loop starts again from it:

- the problem is built anew for the new (rank, size): worker r of m holds exactly the
  rows of worker r in a fresh run with m workers (`ProblemConfig.build` deals the rows by
  rank, size and seed alone);
- the algorithm is built on the new shard and continues from the committed state
  (`dane.algorithm.Algorithm.load_elastic_state`);
- rank 0 cuts ``rounds.jsonl`` back to the committed round
  (`dane.loop.checkpoint.kept_rounds`, read once): the rounds run since the last commit are done
  again and logged once, so round numbers continue with no gap and no repeat.  Every
  record carries ``workers``, the world size of the round that produced it, and the
  summary lists every change, ``world_size_changes: [{round, from, to, records_dropped}]``
  (``round``: the first round run with the new size; ``records_dropped``: records of
  rounds after the commit, dropped from the log and done again);
- if rank 0 is the one lost, the new rank 0 continues the same run directory: every
  worker learnt it from the first rank 0, and the lost writer's ``.lock`` is taken over
  (Horovod keeps rank 0 on the oldest surviving host, which holds the committed state).
  All workers must see the run directory (one machine, or a shared file system).

``time_s`` is wall time since the run's clock started, so it includes the reset and the
rounds done again; ``bytes_sent`` and ``comm_rounds`` count the communication of the
logged rounds, each once, under the world size that ran it.

*What DANE does when m changes.*  The objective :math:`O(w) = \frac1m \sum_i O_i(w)` is
the same function for every m (each row is in exactly one shard, weighted m/N), so the
optimum, the objective and the suboptimality continue across the change.  After it,
allreduce 1 averages the local gradients of the new m shards (still exactly ∇O(w_t)),
the local solve :math:`w_i = \arg\min O_i(w) - \langle\nabla O_i(w_t) - \eta g, w\rangle +
\frac\mu2\|w - w_t\|^2` uses the new shard's Hessian (with fewer workers a larger shard,
closer to the global Hessian, so a round gains more; at m = 1 and μ = 0 it is Newton's
step), and allreduce 2 averages the m new local solutions.  The safeguard keeps its
memory: μ, the measured spread of the local Hessians and its boost, the evidence rule's
last step and move, and the last accepted point with its global gradient and objective
(properties of O, not of the
shards); only this worker's local gradient at that point is recomputed on its new shard
(`dane.safeguard.MuSafeguard.rebase`).  Keeping the spread errs on the safe side: measured
on the old, smaller shards it overstates the new spread when workers are lost (μ is then
larger than needed: slower, never divergent), and when workers are added the next
rounds measure the larger spread and raise μ, while an ascent is still rejected.

Only algorithms whose state is the same on every worker (plus what `load_elastic_state`
derives from the shard) can change their world size: their class says ``elastic = True``.  ADMM's dual
variables, local SGD's and synchronous SGD's per-worker samplers and optimizer state
belong to one worker's rows and would be lost with it.
"""
from __future__ import annotations

import copy
import functools
import json
import os
import socket
import time
from pathlib import Path

from ..algorithm import AlgorithmConfig, known_algorithms
from .callbacks import Callback, Checkpoints, worker_callbacks
from .checkpoint import keep_rounds, kept_rounds
from ..comm import Communicator
from .driver import Loop, drive
from ..errors import ConfigError, say
from .reference import attach_one
from ..records.lock import LOCK_FILE
from ..records.results import ROUNDS_FILE


def elastic_algorithms() -> list[str]:
    """The algorithms whose committed state carries over a change of world size: their class says
    ``elastic = True`` (`dane.algorithm.Algorithm.elastic`; see the module docstring)."""
    return [name for name, algorithm in known_algorithms().items() if algorithm.elastic]


def check_elastic(enabled: bool, backend: str, algorithm: AlgorithmConfig) -> bool:
    """``comm.elastic``, checked before any process group starts: only under horovodrun's elastic mode, and
    only with an algorithm whose class declares ``elastic``."""
    if not enabled:
        return False
    if backend != "horovod" or os.environ.get("HOROVOD_ELASTIC") != "1":
        raise ConfigError("comm.elastic=true needs horovodrun in elastic mode (--min-np/--max-np with "
                          "--host-discovery-script, e.g. scripts/discover_hosts.sh); drop comm.elastic or launch so")
    if not algorithm.algorithm.elastic:
        raise ConfigError(f"comm.elastic=true supports algorithm={'|'.join(elastic_algorithms())}, got "
                          f"{algorithm.name}: its per-worker state cannot follow a change of workers; use one of those")
    return True


def _committed_state(hvd, **attrs):
    """A ``horovod.common.elastic.ObjectState`` whose commit keeps a round only once every worker reached it.

    Horovod's own ``commit`` saves first and then broadcasts (to learn of host changes), so
    a survivor keeps a round that a lost rank 0 never logged.  Here the broadcast comes
    first: it succeeds only when every worker is at the commit, so rank 0 has written
    every record before the committed round.  On ``HostsUpdatedInterrupt`` (every worker
    got there too) the round is saved before the reset.
    """
    from horovod.common.elastic import ObjectState
    from horovod.common.exceptions import HostsUpdatedInterrupt

    class CommittedState(ObjectState):
        def commit(self) -> None:
            try:
                self.check_host_updates()
            except HostsUpdatedInterrupt:
                self.save()
                raise
            self.save()

    return CommittedState(hvd.broadcast_object, hvd.rank, **attrs)


class ElasticSession:
    """What survives a reset: rank 0's committed state, broadcast to every worker after each reset.

    ``state`` is a ``horovod.common.elastic.ObjectState`` with ``progress`` (the committed
    `dane.loop.runner.run` state plus ``workers``; None before round 0 is committed),
    ``out_dir``, ``changes`` (the world-size changes so far), ``started`` (the run's wall
    clock start) and ``writer`` (host and pid of the rank 0 that holds the run directory).
    Every attribute is replaced, never changed in place, since ``ObjectState.save`` keeps
    references.
    """

    def __init__(self, hvd, out_dir: str | None, progress: dict | None = None):
        self.state = _committed_state(hvd, progress=progress, out_dir=out_dir or "", changes=[], started=None,
                                      writer="")
        self.attempts = 0
        self.resumed_from = None if progress is None else progress["round"]  # from a checkpoint on disk (resume=)

    @property
    def out_dir(self) -> str | None:
        return self.state.out_dir or None

    def prepare(self, comm: Communicator, when_locked: list) -> bool:
        """At the start of an attempt, before rank 0 opens the run directory: True if the run continues there.

        Rank 0 takes over the lock of the lost writer, counts the records after the committed round and
        leaves their cut in ``when_locked`` (`dane.loop.driver.Loop.when_locked`: done once it holds the lock); every
        worker learns the new writer and how many records are dropped (one broadcast), and a change of world size
        is recorded.
        """
        self.attempts += 1
        st, progress = self.state, self.state.progress
        me = f"{socket.gethostname()} {os.getpid()}"
        dropped = 0
        if comm.rank == 0 and progress is not None and self.out_dir:
            lock = Path(self.out_dir) / LOCK_FILE
            if st.writer and st.writer != me and lock.is_file() and lock.read_text().strip() == st.writer:
                lock.unlink(missing_ok=True)  # left by the rank 0 this job lost
            rounds_file = Path(self.out_dir) / ROUNDS_FILE
            if rounds_file.is_file():  # read once: the lines kept are written back once rank 0 holds the lock
                kept, dropped = kept_rounds(rounds_file, progress["round"])
                when_locked.append(functools.partial(keep_rounds, rounds_file, kept))
        told = json.loads(comm.broadcast_object(json.dumps([me, dropped]) if comm.rank == 0 else "", root=0))
        st.writer, dropped = told
        if progress is None:
            return False
        if progress["workers"] != comm.size:
            change = {"round": progress["round"], "from": progress["workers"], "to": comm.size,
                      "records_dropped": dropped}
            st.changes = [*st.changes, change]
            self._note(comm, f"elastic: world size {change['from']} -> {change['to']} at round {change['round']}, "
                             f"the last committed round ({dropped} later record(s) dropped, those rounds done again)")
        elif self.attempts > 1:
            self._note(comm, f"elastic: reset with {comm.size} worker(s), continuing at round {progress['round']}, "
                             f"the last committed round ({dropped} later record(s) dropped, those rounds done again)")
        return True

    def resume(self, algo, stop, comm: Communicator) -> dict:
        """The state `dane.loop.runner.run` continues from: the committed one on this worker's new shard.

        On the first attempt round 0 is committed first, so that a reset before the
        first regular commit also continues (and the run directory is never started twice).
        """
        from .runner import start_state

        st = self.state
        if st.started is None:  # the first attempt: the clock goes on from the committed time (a resume=) or 0
            st.started = time.time() - (float(st.progress["cost"]["time_s"]) if st.progress is not None else 0.0)
        if st.progress is None:
            self.commit({**start_state(algo, stop), "workers": comm.size})
        progress = st.progress
        algo.load_elastic_state(progress["algorithm"])
        # run() loads resume["algorithm"] with load_state_dict: hand it the state just derived
        # for this shard.  Its clock goes on from the run's start, counting the lost time.
        cost = {**progress["cost"], "time_s": time.time() - st.started}
        return {**progress, "cost": cost, "algorithm": algo.state_dict()}

    def commit(self, progress: dict) -> None:
        """Commit ``progress`` (this round's state, global on every worker); may raise Horovod's reset signals."""
        self.state.progress = copy.deepcopy(progress)
        self.state.commit()

    def summary(self) -> dict:
        """The summary's elastic part; its wall time runs from the run's start, across resets."""
        out = {"elastic": True, "world_size_changes": list(self.state.changes),
               "wall_time_s": time.time() - self.state.started}
        if self.resumed_from is not None:
            out["resumed_from_round"] = self.resumed_from
        return out

    @staticmethod
    def _note(comm: Communicator, line: str) -> None:
        if comm.rank == 0:
            say(line)


def disk_progress(spec, size: int) -> dict | None:
    """With ``resume=``: rank 0's part of the committed checkpoint on disk, the elastic run's first committed state."""
    from .checkpoint import load_checkpoint, part_meta

    if spec.control.resume is None:
        return None
    return {**load_checkpoint(spec.control.resume, 0, part_meta(spec, 0, size)), "workers": size}


class ElasticCommit(Callback):
    """The loop's part of a Horovod elastic attempt: start from the state committed in memory, tag every record
    with its world size, commit every ``checkpoint_every`` rounds (every round when 0), and the summary's part."""

    def __init__(self, session: ElasticSession):
        self.session = session

    def on_open(self, loop) -> None:
        loop.continuing = self.session.prepare(loop.comm, loop.when_locked)  # the records cut back to the commit

    def on_start(self, loop) -> None:
        loop.resume = self.session.resume(loop.algo, loop.spec.control.stop, loop.comm)  # may commit round 0: reset

    def on_round(self, loop, record: dict) -> None:
        record["workers"] = loop.comm.size

    def on_checkpoint(self, loop, state: dict) -> None:
        self.session.commit({**state, "workers": loop.comm.size})  # in memory; raises Horovod's reset signals

    def on_end(self, loop, summary: dict) -> None:
        summary.update(self.session.summary())


def run_attempt(spec, comm: Communicator, problem, session: ElasticSession, setup_s: float = 0.0,
                collect: dict | None = None) -> dict:
    """One attempt of an elastic run on this worker's ``problem``: the run loop from the committed state."""
    loop = Loop(spec, spec.algorithm.build(problem, comm), comm, session.out_dir, problem, setup_s=setup_s,
                checkpoint_every=spec.control.checkpoint_every or 1)
    start = [Checkpoints(spec, load=False), ElasticCommit(session)]
    return drive(loop, worker_callbacks(spec, loop, collect, start=start))


def run_elastic(spec, out_dir: str | None, collect: dict | None) -> dict:
    """The elastic run kind (``comm.elastic=true``): the run loop inside ``hvd.elastic.run``."""
    import horovod.torch as hvd

    from ..comm.horovod import HorovodCommunicator
    from .worker import build_problem, check_one_push

    hvd.init()
    progress = disk_progress(spec, hvd.size()) if hvd.rank() == 0 else None  # rank 0's is broadcast to all
    session = ElasticSession(hvd, out_dir, progress)

    @hvd.elastic.run
    def attempt(state) -> dict:  # state is session.state, synced from rank 0 by hvd.elastic.run
        comm = HorovodCommunicator(init=False)
        problem, setup_s = build_problem(spec, comm.rank, comm.size, time.perf_counter)
        spec.problem.release()
        check_one_push(spec.problem, problem, comm)
        attach_one(spec.problem, problem, comm)
        comm.reset_clock()
        return run_attempt(spec, comm, problem, session, setup_s, collect)

    try:
        return attempt(session.state)
    finally:
        hvd.shutdown()
