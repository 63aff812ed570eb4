"""Time the package's allreduce at several message sizes; run it under a launcher.

    HOROVOD_CYCLE_TIME=0.1 horovodrun -np 2 --gloo python -m synthetic.allreduce_timing --out t.json
    torchrun --standalone --nproc_per_node 2 -m synthetic.allreduce_timing --sizes 4096 --out t.json
    torchrun --standalone --nproc_per_node 3 -m synthetic.allreduce_timing --ps-servers 1 --out t.json

Every rank calls ``comm.allreduce_mean([x])`` (one grouped allreduce, as the algorithms
do) on a float64 tensor of each size, ``--warmup`` times untimed and ``--reps`` times
timed one call at a time, the sizes taking turns.  Rank 0 writes {backend, size, sizes: {bytes: {median_s, ...}}}.
The backend comes from the launcher (`dane.comm.make_communicator`), and Horovod gets
the package's launch settings (`dane.comm.horovod.HorovodOptions`) unless the environment
already sets them.  With ``--ps-servers k`` (under torchrun) the last k ranks are
parameter servers (`dane.comm.ps`): the workers' allreduce is a push and a pull, and
rank 0 adds the servers' own counters (their time spent averaging, their pushes).  With
``--synchronize`` (under horovodrun) every size is also timed as Horovod's own
``hvd.synchronize`` waits for it, taking turns with the package's call
(``synchronize_sizes``): the cost of the package's wait over Horovod's.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from dane.comm import make_communicator, resolve_backend
from dane.comm.cost import CALIBRATION_SIZES
from dane.comm.horovod import HorovodOptions, pin_local_rank
from dane.records.provenance import command_name



def time_calls(calls: dict, reps: int, warmup: int) -> dict[object, list[float]]:
    """Seconds of each of ``reps`` calls of every ``calls[key]()``, after ``warmup`` untimed rounds.

    The calls take turns (one of each per repetition), so a change in the machine's load
    during the measurement falls on every key alike.
    """
    for _ in range(warmup):
        for call in calls.values():
            call()
    times: dict[object, list[float]] = {key: [] for key in calls}
    for _ in range(reps):
        for key, call in calls.items():
            t0 = time.perf_counter()
            call()
            times[key].append(time.perf_counter() - t0)
    return times


def stats(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {"median_s": statistics.median(ordered), "min_s": ordered[0], "p90_s": ordered[int(0.9 * (len(ordered) - 1))],
            "mean_s": statistics.fmean(ordered), "reps": len(ordered)}


def measure(comm, sizes, reps: int, warmup: int, hvd=None) -> dict[object, dict[str, float]]:
    """Stats per size of ``comm.allreduce_mean``; with ``hvd``, also per ``("synchronize", size)`` of the same
    grouped allreduce waited for by Horovod's own ``hvd.synchronize``, the two taking turns."""
    tensors = {n: torch.full((max(1, n // 8),), float(comm.rank), dtype=torch.float64) for n in sizes}
    calls = {n: (lambda x=x: comm.allreduce_mean([x])) for n, x in tensors.items()}
    if hvd is not None:
        calls.update({("synchronize", n): (lambda x=x, n=n: hvd.synchronize(hvd.grouped_allreduce_async(
            [x], op=hvd.Average, name=f"timing.synchronize.{n}"))) for n, x in tensors.items()})
    comm.barrier()
    return {n: stats(times) for n, times in time_calls(calls, reps, warmup).items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=command_name(), description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(CALIBRATION_SIZES), help="message sizes in bytes")
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--out", required=True)
    parser.add_argument("--ps-servers", type=int, default=0, help="under torchrun: this many parameter servers")
    parser.add_argument("--pin", action="store_true",
                        help="under torchrun: bind each local rank to its own cores, as the package does under horovodrun")
    parser.add_argument("--synchronize", action="store_true",
                        help="under horovodrun: also time each size waited for by Horovod's own hvd.synchronize")
    args = parser.parse_args(argv)
    backend = resolve_backend("auto")
    if backend == "horovod":
        HorovodOptions().apply()
    elif args.pin:
        pin_local_rank(int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    torch.set_num_threads(1)
    if args.ps_servers:
        from dane.comm.ps_server import connect

        comm = connect(args.ps_servers)
        if getattr(comm, "is_server", False):
            comm.serve()
            comm.shutdown()
            return
    else:
        comm = make_communicator(backend)
    try:
        hvd = None
        if args.synchronize and backend == "horovod":
            import horovod.torch as hvd
        result = measure(comm, args.sizes, args.reps, args.warmup, hvd)
        extra = comm.summary_entries() if args.ps_servers else {}  # a collective: every worker asks
        if comm.rank == 0:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps({
                "backend": backend, "size": comm.size, "horovod_cycle_time": os.environ.get("HOROVOD_CYCLE_TIME"),
                "cores": sorted(os.sched_getaffinity(0)),
                "sizes": {str(k): v for k, v in result.items() if not isinstance(k, tuple)},
                **({"synchronize_sizes": {str(k[1]): v for k, v in result.items() if isinstance(k, tuple)}}
                   if hvd is not None else {}),
                "calls_per_size": args.reps + args.warmup,
                **extra}, indent=2) + "\n")
    finally:
        comm.shutdown()


if __name__ == "__main__":
    main()
