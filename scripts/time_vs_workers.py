"""The runs of the time-against-workers figure, MNIST LeNet-3 and LeNet-5 (the source paper's Figures 3-4), one
folder a run: docs/benchmarks.md, section `time_vs_workers`."""
from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from dane import checks
from dane.errors import DivergenceError, UserError, say
from dane.experiments.config import run_spec
from dane.loop.launch import execute
from dane.records.results import atomic_write_text, output_folder, read_config, read_rounds, read_summary
from dane.synthetic.calibrate import calibrate
from dane.synthetic.launchers import REPO
from dane.synthetic.sweep import compose_job, identity
from scripts.harness import Bench, Run, count, load, need_horovod, option, trained

PROBLEMS, WORKERS, REAL, SEEDS = ("mnist_lenet5", "mnist_lenet3"), (1, 2, 4, 6, 8), (1, 2), (0, 1, 2)
#: one pass a round: plain DANE at m workers makes m times fewer sequential inner steps a round, so m=8 gains
#: accuracy per round far more slowly than m=1; the target is one m=8 reaches within the budget on both networks
#: (a 20-round probe of each, seed 1, before choosing: 0.97 was out of reach for m >= 4 there)
ROUNDS, TARGET = 30, 0.95
ALGORITHM = ("algorithm=dane", "algorithm.safeguard=false", "algorithm.mu=0.0", "algorithm.eta=1.0")
REAL_TIMEOUT = 3600  # a real run's limit (s): a slow round on a loaded machine is a result, a hung launch is not


@dataclass(frozen=True)
class Job:
    problem: str
    backend: str  # simulator | horovod
    workers: int
    seed: int
    rounds: int
    target: float

    @property
    def name(self) -> str:
        return f"{self.backend}_m{self.workers}_seed{self.seed}"

    def overrides(self) -> tuple[str, ...]:
        """The run's Hydra overrides (the simulator adds ``workers=m``; horovodrun gives the size)."""
        return (*ALGORITHM, f"problem={self.problem}", f"seed={self.seed}", f"rounds={self.rounds}", "tol=null",
                f"early_stop.target={self.target}", "problem.inner_steps=null")

    def config(self) -> DictConfig:
        """The simulator's config of the run (the keys `finished` compares are the same under experiments.train)."""
        return compose_job((*self.overrides(), f"workers={self.workers}"))


def jobs(problems, seeds, workers, real, rounds: int, target: float) -> list[Job]:
    return [Job(p, backend, m, s, rounds, target) for p in problems for s in seeds
            for backend, ms in (("simulator", workers), ("horovod", real)) for m in ms]


def finished(job: Job, run_dir: Path) -> bool:
    """Does ``run_dir`` hold a finished run of ``job`` (its α-β aside)?"""
    if not ((run_dir / "summary.json").exists() and (run_dir / "config.yaml").exists()):
        return False
    summary = read_summary(run_dir)
    cfg = read_config(run_dir)
    cfg["workers"] = summary.get("workers")  # under horovodrun the saved config says null
    expected = OmegaConf.to_container(job.config(), resolve=True)
    return (summary.get("backend") == job.backend and summary.get("workers") == job.workers
            and identity(cfg) == identity(expected) and cfg.get("rounds") == job.rounds
            and (cfg.get("early_stop") or {}).get("target") == job.target)


def run_simulated(job: Job, out_dir: Path, cost: dict) -> dict:
    cfg = job.config()
    cfg.sim.alpha, cfg.sim.beta = cost["alpha"], cost["beta"]
    cfg.out_dir, cfg.quiet = str(out_dir), True
    cfg.sim.single_worker = True  # m=1 on the simulator's clock too
    try:
        return execute(run_spec(cfg), str(out_dir))
    except DivergenceError:  # plain DANE may diverge: a result, written with status diverged
        return read_summary(out_dir)


def run_horovod(job: Job, out_dir: Path) -> dict:
    """``horovodrun -np N`` of the job, one thread a rank, its output in ``launch.log``: a run that diverged is a
    result; a failure raises naming the first worker error."""
    out, log = out_dir.resolve(), out_dir / "launch.log"
    t = trained(out, [*job.overrides(), "quiet=true", f"hydra.run.dir={out}"], np=job.workers,
                env={"OMP_NUM_THREADS": "1"}, timeout=REAL_TIMEOUT, log=log)
    if t["timed_out"]:
        raise RuntimeError(f"horovodrun -np {job.workers} ran past {REAL_TIMEOUT} s (output: {log})")
    if t["exit_status"] != 0 and (t["summary"] or {}).get("status") != "diverged":
        cause = next((line.strip() for line in log.read_text(errors="replace").splitlines()
                      if re.search(r"(\w+Error|error): ", line) and "Horovod detected" not in line), "see the log")
        raise RuntimeError(f"horovodrun -np {job.workers} exited with {t['exit_status']}: {cause} (full output: "
                           f"{log})")
    return t["summary"]


def describe(summary: dict, run_dir: Path, target: float) -> str:
    hit = next((r for r in read_rounds(run_dir) if r.get("test_accuracy", 0.0) >= target), None)
    reached = f"{target:g} at round {hit['round']}, {hit['time_s']:.2f} s" if hit else f"{target:g} not reached"
    return f"{summary['status']} after {summary['rounds']} rounds ({reached})"


def check_data(problems) -> None:
    """A `UserError` naming the files where a problem's data set cannot be read here."""
    from hydra.utils import instantiate

    for problem in problems:
        if not (REPO / "conf" / "problem" / f"{problem}.yaml").exists():
            raise UserError(f"--problems: no conf/problem/{problem}.yaml; choose from {', '.join(PROBLEMS)}")
        instantiate(Job(problem, "simulator", 1, 0, 1, TARGET).config().problem).dataset()


def calibration(out: Path, keep: bool, reps: int) -> dict:
    """α-β of ``horovodrun -np 2`` (`calibrate`), into ``out/calibration.json``; ``keep``: the one there."""
    path = out / "calibration.json"
    if keep and path.exists():
        print(f"calibration: kept {path}", flush=True)
        return json.loads(path.read_text())
    print(f"calibration: horovodrun -np 2 --gloo allreduce timing ({reps} reps per size), load {load()}", flush=True)
    result = {**calibrate(2, reps=reps),
              "source": "synthetic.calibrate.calibrate, at the start of scripts/time_vs_workers.py"}
    atomic_write_text(path, json.dumps(result, indent=2) + "\n")
    print(f"calibration: alpha = {result['alpha'] * 1e6:.1f} us, beta = {result['beta'] / 1e6:.1f} MB/s -> {path}",
          flush=True)
    return result


def settle(args):
    """``--quick``'s reductions, and the output folder."""
    if args.quick:
        args.seeds, args.rounds = args.seeds[:1], min(args.rounds, 2)
        args.workers, args.real = [m for m in args.workers if m <= 2], [n for n in args.real if n <= 2]
        args.calibration_reps = min(args.calibration_reps, 50)
    args.out = Path(args.out or Path("results") / ("time_vs_workers_quick" if args.quick else "time_vs_workers"))
    return args


def run(bench: Run) -> None:
    args = settle(bench.args)
    checks.fraction("--target", args.target)  # the counts are argparse's (`harness.count`)
    output_folder(args.out, "--out")  # before the calibration's launches
    check_data(args.problems)
    need_horovod()  # to calibrate α-β, and for --real
    torch.set_num_threads(1)  # one core per simulated worker
    cost = calibration(args.out, args.keep_calibration, args.calibration_reps)
    todo = jobs(args.problems, args.seeds, args.workers, args.real, args.rounds, args.target)
    start, failed = time.perf_counter(), []
    for k, job in enumerate(todo, 1):
        run_dir = args.out / job.problem / job.name
        head = f"[{k}/{len(todo)} {time.perf_counter() - start:7.1f}s] {job.problem} {job.name}"
        if finished(job, run_dir):
            print(f"{head}: kept ({describe(read_summary(run_dir), run_dir, job.target)})", flush=True)
            continue
        shutil.rmtree(run_dir, ignore_errors=True)  # a partial or stale run: start afresh (results append)
        run_dir.mkdir(parents=True)
        before, t0 = load(), time.perf_counter()
        try:
            summary = run_simulated(job, run_dir, cost) if job.backend == "simulator" else run_horovod(job, run_dir)
        except (RuntimeError, UserError, OSError) as exc:
            failed.append(job.name)
            print(f"{head}: FAILED: {exc}", flush=True)
            continue
        print(f"{head}: {describe(summary, run_dir, job.target)}; {time.perf_counter() - t0:.1f} s wall, "
              f"load {before} -> {load()}", flush=True)
    print(f"done: {len(todo) - len(failed)} of {len(todo)} runs in {args.out}; "
          "figure: python -m paper_figs.time_vs_workers", flush=True)
    if failed:
        say(f"error: {len(failed)} run(s) failed: {', '.join(failed)}")
        raise SystemExit(1)


BENCH = Bench("time_vs_workers", run, "the runs of the time-against-workers figure (MNIST LeNet-3/5)", threads=None,
              out="", json=False, options=(
                  option("--problems", nargs="+", default=list(PROBLEMS)),
                  option("--seeds", nargs="+", type=int, default=list(SEEDS)),
                  option("--workers", nargs="*", type=count, default=list(WORKERS),
                         help="simulated worker counts (none: horovodrun only)"),
                  option("--real", nargs="*", type=count, default=list(REAL),
                         help="horovodrun -np values (none: simulator only)"),
                  option("--rounds", type=count, default=ROUNDS, help="round budget of every run"),
                  option("--target", type=float, default=TARGET, help="test accuracy at which a run stops"),
                  option("--keep-calibration", action="store_true",
                         help="reuse the output folder's calibration.json instead of measuring"),
                  option("--calibration-reps", type=count, default=200)))
