"""The real points of the parameter-server figure (paper_figs/ps_scaling.py), on this machine at m=2."""
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
OVERRIDES = [o for o in BASE if not o.startswith("sim.")]  # the figure's job; a launched run has no simulator


def run(bench: Run) -> None:
    for folder, (launcher, processes, extra) in LAUNCHES.items():
        out = Path(bench.args.results) / folder
        if (out / "summary.json").exists():
            print(f"{out}: kept (finished earlier)")
            continue
        launcher("dane.experiments.train", [*OVERRIDES, *extra, "quiet=true", f"out_dir={out}", "overwrite=true"],
                 np=processes)
        print(f"{out}: done")


BENCH = Bench("ps_scaling_real", run, "the parameter-server figure's real points at m=2 (results/ps_scaling/real/)",
              threads=None, out="", json=False, options=(option("--results", default="results"),))
