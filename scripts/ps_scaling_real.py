"""The real points of the parameter-server figure (paper_figs/ps_scaling.py), on this machine at m=2.

    python -m scripts.bench ps_scaling_real [--results results]      # or: make ps-scaling

Runs the figure's job (safeguarded DANE, synthetic ridge N=18000, d=500, 10 rounds) for
real, each into its own folder under ``<results>/ps_scaling/real/``:

- ``horovod_np2``: ``horovodrun -np 2 --gloo`` (ring allreduce, two workers);
- ``ps_1server_np3``: ``torchrun --standalone --nproc_per_node 3 ... comm=ps`` (two workers
  and one parameter server).

A folder whose run finished is kept (delete it to remake it), so the figure draws from
the same logs every time.
"""
from __future__ import annotations

from pathlib import Path

from dane.paper_figs.ps_scaling import BASE, REAL
from dane.synthetic.launchers import horovodrun, torchrun
from scripts.harness import Bench, Run, option

LAUNCHES = {  # folder under results/ -> (launcher, processes, extra overrides)
    "ps_scaling/real/horovod_np2": (horovodrun, 2, ()),
    "ps_scaling/real/ps_1server_np3": (torchrun, 3, ("comm=ps", "comm.servers=1")),
}
assert set(LAUNCHES) == set(REAL), "the figure's real points and this script's launches must name the same folders"


def run(bench: Run) -> None:
    args = bench.args
    for folder, (launcher, processes, extra) in LAUNCHES.items():
        out = Path(args.results) / folder
        if (out / "summary.json").exists():
            print(f"{out}: kept (finished earlier)")
            continue
        overrides = [o for o in BASE if not o.startswith("sim.")]
        launcher("dane.experiments.train", [*overrides, *extra, "quiet=true", f"out_dir={out}", "overwrite=true"],
                 np=processes)
        print(f"{out}: done")



BENCH = Bench("ps_scaling_real", run, "the parameter-server figure's real points at m=2 (results/ps_scaling/real/)",
              threads=None, out="", options=(option("--results", default="results"),))
