"""The runs of the one launch per launcher (tests/test_launchers.py): short runs, one after another in the same
launched processes, each also run by the simulator, so that a test compares them record by record while the suite
pays one launch per launcher.

    horovodrun -np 2 --gloo python tests/launched_runs.py <folder>     # every run, rank 0 writing <folder>/<name>
    python -m launched_runs <folder> --simulate                         # the same with workers=2, in the simulator

`CLI` runs through the program itself (``python -m experiments.train``, in-process as `runs.run_row` runs a row, from
the repository root): the launch's check of the command line under a launcher, its Hydra set-up on every rank
included.  Each run of `RUNS` is `LOGREG`'s config, composed once, with the run's overrides (`configured`), made a
spec as the command line makes it (`dane.experiments.config.run_spec`) and run by `dane.loop.launch.execute`.  Under torchrun every run starts and ends its
process group, each in a key space of its own (`dane.comm.torch_dist.init_process_group`); under horovodrun Horovod
is started once, before the runs, and each run uses it (`dane.comm.horovod.HorovodCommunicator`: its static
rendezvous serves one start a process).  Each rank writes ``<folder>/rank<r>.json`` (the simulator
``<folder>/simulated.json``): per run {rc, stderr}, a refusal being exit status 2 and its one line.  Newton-Star's
reference optimum is solved by each side's own workers into a cache of its own (``DANE_CACHE_DIR``: the caller sets
it), never read from the other side's.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

#: name -> the program's arguments: DANE on a ridge problem with a decaying spectrum (mu adapts: round-off amplified);
#: a straggler model, which the simulator's run reads (its clock alone) and the launch ignores, saying so in its notes
CLI: dict[str, tuple[str, ...]] = {
    "dane": ("algorithm=dane", "problem=ridge_synthetic", "problem.n_samples=4000", "problem.dim=100",
             "problem.covariance=decay", "rounds=6", "quiet=true", "save_iterate=true", "sim.slowdown=[1,3]"),
}

#: the configuration every run of `RUNS` starts from: a small convex GLM, breast cancer's logistic regression (569
#: rows, 30 features and an intercept, lam = 1e-3), 2 shards, 3 rounds
LOGREG = ("problem=logreg", "rounds=3", "quiet=true", "save_iterate=true")
RANDK = "randk:5"  # 5 of 31 coordinates, so that a run draws and its bits are a hand count away from dense

#: name -> overrides of `LOGREG`: the compressed first-order methods, the FedNL line, the compressed downlink and
#: S-DANE's re-solves
RUNS: dict[str, tuple[str, ...]] = {
    "diana": ("algorithm=diana", f"algorithm.compressor={RANDK}"),
    "adiana": ("algorithm=adiana", f"algorithm.compressor={RANDK}"),
    "marina": ("algorithm=marina", f"algorithm.compressor={RANDK}", "algorithm.p=0.5"),  # both coin sides
    "pp_marina": ("algorithm=marina", f"algorithm.compressor={RANDK}", "algorithm.clients_per_round=1"),
    "dasha": ("algorithm=dasha", f"algorithm.compressor={RANDK}"),
    "ef21": ("algorithm=ef21", "algorithm.compressor=topk:5"),
    "ef21p": ("algorithm=ef21p", f"algorithm.compressor={RANDK}", "algorithm.compressor_down=topk:5"),
    "fednl_bc": ("algorithm=fednl_bc", "algorithm.compressor=topk:20"),
    "fednl_cr": ("algorithm=fednl", "algorithm.variant=cr", "algorithm.compressor=randk:20"),
    "newton_star": ("algorithm=newton_star", "problem.optimum=auto"),
    "nl1": ("algorithm=nl1", "algorithm.k=2"),
    "dingo": ("algorithm=dingo",),
    "newton_3pc": ("algorithm=newton_3pc", "algorithm.mechanism=cbag", "algorithm.compressor=randk:20"),
    "gd_down": ("algorithm=gd", f"comm.compress={RANDK}", "comm.compress_down=topk:5"),
    "dane_down": ("algorithm=dane", "comm.compress=none", f"comm.compress_down={RANDK}"),
    "inexact_dane_down": ("algorithm=inexact_dane", "comm.compress=topk:5", "comm.error_feedback=true",
                          "comm.compress_down=natural"),
    # S-DANE's re-solves after a failed accuracy test (local_retry): counted as local work, which reaches rank 0
    # outside the method's bytes, and read back into the next record's event
    "sdane_retry": ("algorithm=sdane", "algorithm.local_solver=svrg", "problem.svrg_passes=1"),
}


def run_all(folder: Path, simulate: bool) -> dict[str, dict]:
    """`CLI`, then `RUNS`, each into ``folder/<name>`` (rank 0's, or the simulator's): {name: {rc, stderr}}, and for
    `CLI`'s runs ``uncounted``, how many uncounted allreduces this rank made (`counting_uncounted`)."""
    import runs
    from dane.errors import UserError
    from dane.experiments.config import CONF_DIR, rank_zero, run_spec
    from dane.loop.launch import execute
    from helpers import composed

    workers = ["workers=2"] if simulate else []
    uncounted, done = counting_uncounted(), {}
    for name, args in CLI.items():
        before = uncounted[0]
        row = {"module": "experiments.train", "args": [*args, *workers, f"out_dir={folder / name}"], "env": {},
               "cwd": str(runs.REPO)}
        done[name] = {**runs.run_row(row, folder), "uncounted": uncounted[0] - before}
    base = composed(*LOGREG, *workers)
    for name, overrides in RUNS.items():
        out = folder / name
        try:
            spec = run_spec(configured(base, [*overrides, f"out_dir={out}"], CONF_DIR))
            execute(spec, str(out) if simulate or rank_zero() else None)  # as experiments.train passes it
            done[name] = {"rc": 0, "stderr": ""}
        except UserError as exc:  # a refusal is the same line on every rank, before any collective: go on
            done[name] = {"rc": 2, "stderr": f"error: {exc}\n"}
    return done


def counting_uncounted() -> list[int]:
    """From now on, count this process's uncounted allreduces (`dane.comm.Communicator.uncounted_allreduce_mean`, the
    real one, called through): [count].  A launched run's local-work table rides its rounds' allreduces
    (`dane.work.post`), so a run without checkpoints makes none of its own."""
    from dane.comm.base import Communicator

    calls, inner = [0], Communicator.uncounted_allreduce_mean

    def counted(self, tensors):
        calls[0] += 1
        return inner(self, tensors)

    Communicator.uncounted_allreduce_mean = counted
    return calls


def configured(base, overrides: list[str], conf_dir: Path):
    """A copy of the composed ``base`` with ``overrides``: ``algorithm=<name>`` puts conf/algorithm/<name>.yaml in
    place of the algorithm, as the group choice does (no algorithm file has a defaults list), the others set keys
    that must exist.  A Hydra composition a run costs about 0.2 s of CPU, on every rank and launcher: this, 0.03 s."""
    import copy

    from omegaconf import OmegaConf

    cfg = copy.deepcopy(base)
    for override in overrides:
        key, value = override.split("=", 1)
        if key == "algorithm":
            cfg.algorithm = OmegaConf.load(conf_dir / "algorithm" / f"{value}.yaml")
        else:
            cfg.merge_with(OmegaConf.from_dotlist([override]))
    return cfg


def main(argv: list[str]) -> None:
    from dane.comm import detect_launcher, launcher_rank
    from dane.comm.horovod import HorovodOptions

    folder, simulate = Path(argv[0]), "--simulate" in argv[1:]
    folder.mkdir(parents=True, exist_ok=True)
    if detect_launcher()[0] == "horovod":
        import horovod.torch as hvd

        HorovodOptions().apply()  # the settings a run applies before its hvd.init (convex problems: every run's)
        hvd.init()
    done = run_all(folder, simulate)
    (folder / ("simulated.json" if simulate else f"rank{launcher_rank()}.json")).write_text(json.dumps(done))


if __name__ == "__main__":
    main(sys.argv[1:])
