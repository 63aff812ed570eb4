"""The real points of the parameter-server figure (paper_figs/ps_scaling.py), on this machine at m=2.

    PYTHONPATH=. python scripts/ps_scaling_real.py [--results results]      # or: make ps-scaling

Runs the figure's job (safeguarded DANE, synthetic ridge N=18000, d=500, 10 rounds) for
real, each into its own folder under ``<results>/ps_scaling/real/``:

- ``horovod_np2``: ``horovodrun -np 2 --gloo`` (ring allreduce, two workers);
- ``ps_1server_np3``: ``torchrun --standalone --nproc_per_node 3 ... comm=ps`` (two workers
  and one parameter server).

A folder whose run finished is kept (delete it to remake it), so the figure draws from
the same logs every time.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dane.paper_figs.ps_scaling import BASE, REAL  # noqa: E402
from dane.synthetic.launchers import horovodrun, torchrun  # noqa: E402

LAUNCHES = {  # folder under results/ -> (launcher, processes, extra overrides)
    "ps_scaling/real/horovod_np2": (horovodrun, 2, ()),
    "ps_scaling/real/ps_1server_np3": (torchrun, 3, ("comm=ps", "comm.servers=1")),
}
assert set(LAUNCHES) == set(REAL), "the figure's real points and this script's launches must name the same folders"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="results")
    args = parser.parse_args(argv)
    for folder, (launcher, processes, extra) in LAUNCHES.items():
        out = Path(args.results) / folder
        if (out / "summary.json").exists():
            print(f"{out}: kept (finished earlier)")
            continue
        overrides = [o for o in BASE if not o.startswith("sim.")]
        launcher("dane.experiments.train", [*overrides, *extra, "quiet=true", f"out_dir={out}", "overwrite=true"],
                 np=processes)
        print(f"{out}: done")


if __name__ == "__main__":
    main()
