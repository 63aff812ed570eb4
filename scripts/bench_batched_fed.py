"""FedAvg with client sampling, batched against one thread a client (issue 48 item 2): JSON section
``batched_federated``.

FedAvg (K = 10 local gradient steps, λ = 1e-3 logistic regression) on LIBSVM's a9a (32,561 sparse rows, 123 binary
features) dealt iid to m clients, s of them a round: the seconds a round of ``sim.batched=true`` (the participants'
rows stacked, `dane.problems.stacked_rows`) and of ``sim.batched=false`` (m threads): the summary's wall time (the
rounds, the final evaluation and the threads' start; the algorithm's set-up measures nothing at the given lr) over
the rounds, with the load average beside each; ``ratio`` is threads over batched.  The two paths' objectives
agree to round-off (``objective_rel_diff``).  Skipped where the shared data is absent.
"""
from __future__ import annotations

import os
from pathlib import Path

from scripts.harness import Bench, Run, load, option, timed_run

KEY = "batched_federated"
LR = 0.2  # given, so that the algorithm's set-up measures nothing (lr null: a Lanczos estimate per client)
DATA_DIR = os.environ.get("DANE_DATA_DIR", str(Path(__file__).resolve().parents[2] / "shared" / "data"))


def job(m: int, s: int, rounds: int, batched: str) -> tuple[str, ...]:
    """The overrides of one simulated FedAvg run on a9a (`scripts.harness.timed_run` times it)."""
    return ("algorithm=fedavg", f"algorithm.clients_per_round={s}", f"algorithm.lr={LR}", "problem=logreg",
            "problem.lam=1e-3", "data=libsvm", "data.path=libsvm/a9a", f"data_dir={DATA_DIR}", f"workers={m}",
            f"rounds={rounds}", "tol=null", "tol_abs=null", "quiet=true", f"sim.batched={batched}")


def run(bench: Run) -> dict:
    args, log = bench.args, bench.log
    m, s = (100, 10) if args.quick else (args.workers, args.clients)
    if not (Path(DATA_DIR) / "libsvm" / "a9a").is_file():
        return bench.record({"skipped": f"no {DATA_DIR}/libsvm/a9a"})
    paths = {}
    for mode in ("true", "false"):
        before = load()
        timed = timed_run(*job(m, s, args.rounds, mode))
        paths[timed["path"]] = {**timed, "round_s": timed["rounds_s"] / args.rounds, "load_avg_before": before}
        log(f"m={m}, s={s}, {timed['path']}: {paths[timed['path']]['round_s']:.3f} s a round "
            f"(load {timed['load_avg']})")
    batched, threads = paths["batched"], paths["threads"]
    diff = max(abs(a - b) / abs(b) for a, b in zip(batched["objectives"], threads["objectives"]))
    return bench.record({"workers": m, "clients_per_round": s, "rounds": args.rounds, "data": "a9a",
                         "algorithm": "fedavg", "batched_round_s": batched["round_s"],
                         "threads_round_s": threads["round_s"], "ratio": threads["round_s"] / batched["round_s"],
                         "objective_rel_diff": diff, "batched": batched, "threads": threads})


BENCH = Bench(KEY, run, "FedAvg with client sampling: the batched simulator against one thread a client",
              threads=None, options=(option("--workers", type=int, default=1000),
                                     option("--clients", type=int, default=100),
                                     option("--rounds", type=int, default=5)))
