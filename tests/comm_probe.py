"""Run under a launcher: checks the Communicator's collectives against their exact results.

Writes one JSON line per rank to the file named by argv[1] (appended), with the largest
error seen, the communicator's byte counter (``bytes_sent``) after the allreduce and after
the broadcast, and the cores and torch threads the rank was given.  Launched by
tests/test_launchers.py and tests/test_bench.py.
"""
from __future__ import annotations

import json
import os
import sys

import torch

from dane.comm import make_communicator


def main(out: str) -> None:
    comm = make_communicator("auto")
    m, r = comm.size, comm.rank
    gen = torch.Generator().manual_seed(1234)
    # every rank draws all ranks' inputs, so it knows the exact mean
    inputs = [[torch.randn(500, generator=gen, dtype=torch.float64),
               torch.randn(3, 4, generator=gen, dtype=torch.float64),
               torch.randn(7, generator=gen, dtype=torch.float32)] for _ in range(m)]
    reduced = comm.allreduce_mean(inputs[r])
    err = max(float((got - sum(x[i] for x in inputs) / m).abs().max()) for i, got in enumerate(reduced))
    shapes_ok = all(got.shape == inputs[r][i].shape and got.dtype == inputs[r][i].dtype for i, got in enumerate(reduced))
    bytes_after_allreduce = comm.bytes_sent  # the communicator's own counter, as the run's records read it
    (bcast,) = comm.broadcast([inputs[r][0]], root=0)
    bcast_err = float((bcast - inputs[0][0]).abs().max())
    text = comm.broadcast_object("run-dir-of-rank-0" if r == 0 else "", root=0)
    comm.barrier()
    record = {"rank": r, "size": m, "backend": type(comm).__name__, "allreduce_err": err, "shapes_ok": shapes_ok,
              "bytes_after_allreduce": bytes_after_allreduce, "bytes_after_broadcast": comm.bytes_sent,
              "broadcast_err": bcast_err, "text": text,
              "cores": sorted(os.sched_getaffinity(0)), "threads": torch.get_num_threads()}
    with open(out, "a") as f:
        f.write(json.dumps(record) + "\n")
    comm.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
