"""The CPU that Horovod's background loop takes from a computing rank, at one cycle time; run it under horovodrun.

    HOROVOD_CYCLE_TIME=0.1 horovodrun -np 2 --gloo python -m synthetic.background_cpu --out t.json

Each rank starts Horovod with the package's settings (`dane.comm.horovod.HorovodOptions`:
its process and the background thread pinned to its core), then computes for
``--seconds`` on its main thread with no collective in flight, as a network's worker does
for most of a round.  The process's CPU time minus the main thread's is what the other
threads, chiefly the background loop waking once per cycle, took meanwhile; per second of
wall time, it is the share of the core the rank's compute did not get.  Rank 0 writes the
mean over the ranks.  CPU clocks, unlike wall time, do not move with the machine's other load.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path

import torch

from dane.comm import make_communicator
from dane.comm.horovod import HorovodOptions
from dane.records.provenance import command_name


def process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=command_name(), description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    HorovodOptions().apply()
    comm = make_communicator("horovod")
    try:
        torch.set_num_threads(1)
        a = torch.randn(256, 256, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        comm.barrier()
        wall0, process0, main0 = time.perf_counter(), process_cpu(), time.thread_time()
        while time.perf_counter() - wall0 < args.seconds:
            a @ a
        wall = time.perf_counter() - wall0
        others = (process_cpu() - process0) - (time.thread_time() - main0)
        (share,) = comm.allreduce_mean([torch.tensor([others / wall], dtype=torch.float64)])
        if comm.rank == 0:
            Path(args.out).write_text(json.dumps({
                "horovod_cycle_time_ms": float(os.environ["HOROVOD_CYCLE_TIME"]), "ranks": comm.size,
                "seconds": wall, "other_threads_cpu_per_s": float(share)}) + "\n")
    finally:
        comm.shutdown()


if __name__ == "__main__":
    main()
