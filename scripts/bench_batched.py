"""The batched simulator against the per-worker one (issues 35 item 4, 48 item 2): JSON section ``batched_workers``,
rows ``speedup``, ``m10000``, ``federated`` and ``device`` of `scripts.harness.grid`; docs/benchmarks.md, section
`batched`."""
from __future__ import annotations

import statistics
import time
from functools import partial

import torch

from dane.comm.batched import BatchedGroup, run_batched
from dane.comm.threads import ThreadGroup, meter_for
from dane.dane import DANE
from dane.errors import UserError
from dane.problems import RidgeSyntheticConfig
from scripts.harness import Bench, count, data_dir, grid, load, option, paired, timed_run

LR = 0.2  # FedAvg's step, given so that its set-up measures nothing (lr null: a Lanczos estimate per client)
MU = 1.0
ALGORITHM = ("algorithm=dane", f"algorithm.mu={MU}")


def gpu(device: str) -> dict:
    """The GPU's name under ``gpu`` where ``device`` is CUDA, else nothing."""
    return {"gpu": torch.cuda.get_device_name(0)} if device == "cuda" else {}


def rel_diff(w: torch.Tensor, reference: torch.Tensor) -> float:
    """‖w − reference‖ / ‖reference‖, on the CPU."""
    return float((w.cpu() - reference.cpu()).norm() / reference.cpu().norm())


def job(n: int, d: int, m: int, rounds: int, batched: str) -> tuple[str, ...]:
    """The overrides of one simulated DANE run on ridge_synthetic (`scripts.harness.timed_run` times it)."""
    return (f"workers={m}", f"problem.n_samples={n}", f"problem.dim={d}", f"rounds={rounds}", "tol=null",
            "tol_abs=null", "quiet=true", f"sim.batched={batched}", *ALGORITHM)


def steady(config: RidgeSyntheticConfig, m: int, rounds: int, batched: bool) -> tuple[torch.Tensor, float, float]:
    """DANE's rounds after round 0 (which factors the shards) through the batched communicator or m threads, rank 0
    reading the clock after a barrier (which, on a GPU, drains its queue): the final iterate, the wall seconds a round
    and the process's CPU seconds a round (all threads)."""
    problems = [config.build_stacked(m)] if batched else [config.build(rank, m) for rank in range(m)]
    meter, marks = meter_for([p.device for p in problems]), []

    def rounds_of(comm):
        algo = DANE(problems[comm.rank], comm, mu=MU)
        for steps in (1, rounds - 1):
            for _ in range(steps):
                algo.step()
            comm.barrier()
            if comm.rank == 0:
                marks.append((time.perf_counter(), time.process_time()))
        return algo.iterate

    if batched:
        w = run_batched(BatchedGroup(m, meter=meter), rounds_of)
    else:
        w = ThreadGroup(m, meter=meter).run(rounds_of)[0]
    (t0, cpu0), (t1, cpu1) = marks
    return w, (t1 - t0) / (rounds - 1), (cpu1 - cpu0) / (rounds - 1)


def speedup(n: int, d: int, m: int, rounds: int, repeats: int, log) -> dict:
    pairs = paired((job(n, d, m, rounds, "false"), job(n, d, m, rounds, "true")), repeats, log)
    config, rows = RidgeSyntheticConfig(n_samples=n, dim=d), []
    for _ in range(repeats):  # the rounds after round 0, whose factorizations both paths share
        (_, threads_s, threads_cpu), (_, batched_s, batched_cpu) = (steady(config, m, rounds, batched)
                                                                    for batched in (False, True))
        rows.append({"threads_round_s": threads_s, "batched_round_s": batched_s, "ratio": threads_s / batched_s,
                     "threads_round_cpu_s": threads_cpu, "batched_round_cpu_s": batched_cpu,
                     "cpu_ratio": threads_cpu / batched_cpu, "load_avg": load()})
        log(f"m={m}, a round after round 0: per-worker {threads_s:.3f} s ({threads_cpu:.3f} s CPU), "
            f"batched {batched_s:.3f} s ({batched_cpu:.3f} s CPU)")
    return {"steady_ratio_median": statistics.median(s["ratio"] for s in rows),
            "steady_cpu_ratio_median": statistics.median(s["cpu_ratio"] for s in rows), "steady": rows,
            "n_samples": n, "dim": d, "workers": m, "rounds": rounds, "algorithm": list(ALGORITHM), "goal": ">= 5",
            **pairs}


def large(n: int, d: int, m: int, rounds: int, log) -> dict:
    run = timed_run(*job(n, d, m, rounds, "true"))
    log(f"m={m} batched: {run['total_s']:.1f} s in all, {run['rounds_s']:.1f} s of rounds")
    return {"n_samples": n, "dim": d, "workers": m, "rounds": rounds, "algorithm": list(ALGORITHM),
            "goal": "total_s < 120", **{key: run[key] for key in ("total_s", "rounds_s", "load_avg")}}


def on_device(n: int, d: int, m: int, big: int, small: int, rounds: int, device: str, log) -> dict:
    """DANE's `steady` rounds on ``device``, batched against ``small`` threads there and against ``m`` threads on the
    CPU (each pair with its final iterates' distance), then batched at ``big`` workers."""
    if device == "cuda" and not torch.cuda.is_available():
        return {"skipped": "torch sees no CUDA device"}
    torch.set_num_threads(1)  # one intra-op thread, as each simulated worker runs
    there, cpu = (RidgeSyntheticConfig(n_samples=n, dim=d, device=where) for where in (device, "cpu"))
    there.prepare()
    out: dict = {"device": device, **gpu(device), "n_samples": n, "dim": d, "rounds": rounds,
                 "algorithm": list(ALGORITHM)}
    for name, workers, threads_on in (("small", min(small, m), there), ("cpu", m, cpu)):
        w_batched, batched_s, _ = steady(there, workers, rounds, batched=True)
        w_threads, threads_s, _ = steady(threads_on, workers, rounds, batched=False)
        out[name] = {"workers": workers, "batched_round_s": batched_s, "threads_round_s": threads_s,
                     "ratio": threads_s / batched_s, "iterate_rel_diff": rel_diff(w_batched, w_threads)}
        log(f"{device} batched against threads on {threads_on.device} at m={workers}: ratio {out[name]['ratio']:.1f}")
    start = time.perf_counter()
    _, round_s, _ = steady(there, big, rounds, batched=True)
    out["large"] = {"workers": big, "batched_round_s": round_s, "total_s": time.perf_counter() - start,
                    "load_avg": load()}
    return out


def federated(m: int, s: int, rounds: int, repeats: int, log) -> dict:
    """FedAvg with client sampling on a9a, the two paths' `paired` runs (docs/benchmarks.md, section `batched`)."""
    where = data_dir()
    if not (where / "libsvm" / "a9a").is_file():
        return {"skipped": f"no {where}/libsvm/a9a"}
    fedavg = ("algorithm=fedavg", f"algorithm.clients_per_round={s}", f"algorithm.lr={LR}", "problem=logreg",
              "problem.lam=1e-3", "data=libsvm", "data.path=libsvm/a9a", f"data_dir={where}", f"workers={m}",
              f"rounds={rounds}", "tol=null", "tol_abs=null", "quiet=true")
    jobs = tuple((*fedavg, f"sim.batched={batched}") for batched in ("false", "true"))
    return {"workers": m, "clients_per_round": s, "rounds": rounds, "data": "a9a", **paired(jobs, repeats, log)}


def cells(run) -> dict:
    args, log = run.args, run.log
    n, d, m, big = (10_000, 100, 100, 1_000) if args.quick else (100_000, 500, 1_000, 10_000)
    m_fed, s_fed = (100, 10) if args.quick else (args.clients_total, args.clients)
    if "device" in (args.only or ()) and n % args.thread_workers:
        # the batched path stacks equal shards (`dane.problems.ridge`): 64 of 100,000 rows failed on the GPU
        raise UserError(f"--thread-workers {args.thread_workers} does not deal the {n:,} rows into equal shards; "
                        f"give a divisor of {n}, such as 50")
    return {"speedup": partial(speedup, n, d, m, args.rounds, args.repeats, log),
            "m10000": partial(large, n, d, big, 10, log),
            "federated": partial(federated, m_fed, s_fed, args.fed_rounds, args.repeats, log),
            "device": partial(on_device, n, d, m, big, args.thread_workers, args.rounds, args.device, log)}


BENCH = Bench("batched_workers", grid(cells, optional=("federated", "device")),
              "the simulator's per-worker path against its batched path (sim.batched)", threads=None,
              only=("speedup", "m10000", "federated", "device"), resumable=True, options=(
                  option("--rounds", type=count, default=10), option("--repeats", type=count, default=2),
                  option("--device", default="cuda", help="--only device: the device (default: %(default)s)"),
                  option("--thread-workers", type=count, default=50,
                         help="--only device: m of the batched-against-threads pair on the device"),
                  option("--clients-total", type=count, default=1000, help="--only federated: m"),
                  option("--clients", type=count, default=100, help="--only federated: clients a round"),
                  option("--fed-rounds", type=count, default=5, help="--only federated: rounds")))
