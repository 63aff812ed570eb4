"""Time DANE's round against its bare cost, in one horovodrun process pair.

    horovodrun -np 2 --gloo python -m synthetic.round_timing --out t.json [overrides ...]

Builds the run exactly as ``python -m experiments.train`` does (conf/config.yaml plus the
given Hydra overrides, the package's Horovod settings), then alternates blocks of

- DANE rounds through the package's runner, rank 0 logging each round to a
  rounds.jsonl as a real run does (each round's time from its record's ``time_s``), and
- the bare cost of a round, in the same process: the local compute (the gradient and
  the Cholesky solve with the cached factor) and two raw ``hvd.grouped_allreduce`` calls
  of the same tensors as DANE's two allreduces,

so both see the same load.  Rank 0 writes the per-round times, their medians and their means, and
``phases``: each allreduce phase of the DANE rounds (`PhaseRecorder`), which ``dane calibrate --tail``
fits the simulator's tail to (`dane.comm.tail`).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from dane.comm import make_communicator
from dane.records.results import RunWriter
from dane.loop.runner import run
from dane.loop.stopping import StopRule
from dane.run_config import CONF_DIR, run_spec
from dane.records.provenance import command_name


def bare_round(problem, algo, hvd) -> tuple[float, float, float]:
    """Seconds of (local compute, allreduce of [grad, metrics], allreduce of [w]) at the current iterate.

    In DANE's order: the gradient, the first raw allreduce, the Cholesky solve, the second.
    """
    w = algo.w
    t0 = time.perf_counter()
    local_grad, local_metrics = problem.evaluate(w)
    t1 = time.perf_counter()
    (g, _) = hvd.grouped_allreduce([local_grad, local_metrics], op=hvd.Average, name="bare.1")
    t2 = time.perf_counter()
    w_local = problem.prox_solve(w, local_grad - algo.eta * g, algo.mu, anchor_grad=local_grad)
    t3 = time.perf_counter()
    hvd.grouped_allreduce([w_local], op=hvd.Average, name="bare.2")
    t4 = time.perf_counter()
    return (t1 - t0) + (t3 - t2), t2 - t1, t4 - t3


class PhaseRecorder:
    """The allreduce phases of ``comm``'s run: for each counted allreduce after the first of a `restart`, the
    wall time from the previous one's end to its end, this rank's CPU time before the call (the phase's
    compute, as the simulator's clock reads it), and the message bytes the cost model prices.

    An uncounted allreduce (`dane.work`'s totals in a round that made no allreduce to carry them, a checkpoint's;
    the simulator reads them off a board instead and makes none) does not end a phase: its time is part of the next
    phase's excess."""

    def __init__(self, comm):
        self.comm = comm
        comm.allreduce_timer = self.timed  # `dane.comm.base.Communicator.allreduce_timer`
        self.wall, self.cpu, self.nbytes = [], [], []
        self._mark: tuple[float, float] | None = None

    def restart(self) -> None:
        """The next allreduce opens a phase (what ran since the last one was not the run's: the bare rounds)."""
        self._mark = None

    @contextmanager
    def timed(self, counted: bool):
        """Around one backend allreduce of ``comm``: a counted one ends a phase."""
        if not counted:  # `Communicator.uncounted_allreduce_mean`
            yield
            return
        cpu = time.thread_time()
        yield
        end = time.perf_counter()
        if self._mark is not None:
            self.wall.append(end - self._mark[0])
            self.cpu.append(cpu - self._mark[1])
            self.nbytes.append(self.comm.message_bytes)
        self._mark = (end, time.thread_time())

    def phases(self, hvd) -> dict:
        """The phases with the slowest rank's CPU time (the simulator charges a phase its slowest worker)."""
        cpu = hvd.allgather(torch.tensor([self.cpu], dtype=torch.float64), name="phases.cpu")
        return {"wall_s": self.wall, "cpu_s": cpu.max(0).values.tolist(), "nbytes": self.nbytes}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=command_name(), description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--blocks", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=10, help="DANE rounds (and bare repetitions) per block")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of conf/config.yaml")
    args = parser.parse_args(argv)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["comm=horovod", "quiet=true", *args.overrides])
    spec = run_spec(cfg)
    spec.comm.horovod.apply()
    comm = make_communicator("horovod")
    import horovod.torch as hvd

    try:
        problem = spec.problem.build(comm.rank, comm.size, spec.control.dtype)
        algo = spec.algorithm.build(problem, comm)
        writer = RunWriter(Path(args.out).with_suffix(".run")) if comm.rank == 0 else None  # as a real run logs
        recorder = PhaseRecorder(comm)
        comm.barrier()
        rounds: list[float] = []
        compute, reduce1, reduce2 = [], [], []
        for _ in range(args.blocks):
            recorder.restart()
            records, _ = run(algo, StopRule(rounds=args.rounds), writer.write_round if writer else None)
            times = [r["time_s"] for r in records]
            rounds += [b - a for a, b in zip(times, times[1:])]
            for _ in range(args.rounds):
                c, r1, r2 = bare_round(problem, algo, hvd)
                compute.append(c), reduce1.append(r1), reduce2.append(r2)
        phases = recorder.phases(hvd)
        if comm.rank == 0:
            series = {"round_s": rounds, "compute_s": compute, "allreduce1_s": reduce1, "allreduce2_s": reduce2,
                      # whole bare rounds, like whole DANE rounds (a median of sums, not a sum of medians)
                      "bare_s": [c + r1 + r2 for c, r1, r2 in zip(compute, reduce1, reduce2)]}
            med = {name: statistics.median(v) for name, v in series.items()}
            means = {name: statistics.fmean(v) for name, v in series.items()}
            Path(args.out).write_text(json.dumps({
                "medians": med, "means": means, "round_s": rounds, "compute_s": compute, "allreduce1_s": reduce1,
                "allreduce2_s": reduce2, "phases": phases, "workers": comm.size, "overrides": args.overrides,
                "torch_threads": torch.get_num_threads()}, indent=2) + "\n")
    finally:
        comm.shutdown()


if __name__ == "__main__":
    main()
