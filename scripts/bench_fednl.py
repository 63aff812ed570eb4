"""FedNL's seconds per round at u-FedNL's workloads (issue 34): section ``fednl`` of results/bench.json.

``--quick``: a9a alone, 3 rounds, one repeat, no memory points."""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before NumPy and SciPy load OpenBLAS (docs/benchmarks.md)

import resource  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from dane.baselines.fednl import batched, theoretical_alpha  # noqa: E402
from dane.compress import make  # noqa: E402
from dane.data.files import LibSVMSource  # noqa: E402
from dane.problems.linear_models import LinearModelConfig  # noqa: E402
from dane.problems.stacked_hessians import CompactHessians  # noqa: E402
from dane.problems.stacked_rows import StackedRows  # noqa: E402
from dane.synthetic.bench_file import external_reference  # noqa: E402
from scripts.harness import (Bench, Run, count, data_dir, folder, in_fresh_process, in_process, load,  # noqa: E402
                             option, peak_rss_kb)

LAM = 1e-3
OPTION = 2  # FedNL's H + l I, the globally safe one from x⁰ = 0 (option 1 rests on FedNL's local theory)
#: u-FedNL's seconds per round (FedNL-PP: on the w8a-sized synthetic table), 1000 rounds, both cores of a 2-core AMD
#: EPYC VM: the C++ build's figures this section is held to (paper_figs/evidence/external_references.json, ``ufednl``)
UFEDNL_S_PER_ROUND = {(r["table"], r["compressor"]): r["s"] for r in external_reference("ufednl")["s_per_round"]}
TABLES = {"a9a": ("a9a", 80, None), "w8a": ("w8a", 142, None), "w8a_pp": ("w8a", 142, 12)}  # (file, m, PP's s)
MEMORY_LIMIT_GIB = 24  # these machines' memory (docs/design.md, "The machines")
MEMORY_ROUNDS = 2
MEMORY_DIMS = (1000, 2000, 4000, 6000)   # at MEMORY_BASE_CLIENTS clients
MEMORY_CLIENTS = (142, 284, 568)  # at d = MEMORY_BASE_DIM
MEMORY_BASE_CLIENTS, MEMORY_BASE_DIM = 142, 300
ROWS_PER_CLIENT = 350  # w8a's 49,749 rows over 142 clients
NNZ_PER_ROW = 12


def stacked(config, clients: int) -> StackedRows:
    """The ``clients`` shards of ``config`` (a `dane.problems` config), stacked into one problem."""
    return StackedRows([config.build(rank, clients) for rank in range(clients)])


def stacked_run(clients: StackedRows, spec: str, rounds: int, pp: int | None, seed: int, alpha: float | None) -> dict:
    """``rounds`` rounds of FedNL with the clients stacked (`dane.baselines.fednl.batched`: on a batched
    communicator, torch's intra-op threads the clients'), stepped in a plain loop: seconds (wall and CPU, per phase),
    uplink bits a round, and ‖∇O‖ at the last iterate (gradients only, outside the timing)."""
    run = batched(clients, threads=torch.get_num_threads(), compressor=spec, seed=seed, option=OPTION, alpha=alpha,
                  **(dict(variant="pp", clients_per_round=pp) if pp else {}))
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(rounds):
        run.step()
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    m = run.comm.size
    return {"s_per_round": seconds / rounds, "cpu_s_per_round": cpu / rounds,
            "grad_norm": float(np.linalg.norm(clients.mean_gradient(run.iterate.numpy()))), "alpha": run.alpha,
            "phase_s_per_round": {phase: s / rounds for phase, s in run.client.seconds.items()},
            "uplink_bits_per_client_round": (run.uplink_bits - m * 64 * (run.T + (run.d if pp else 0)))
            / (rounds * (pp or m))}


def user_overrides(path: Path, clients: int, spec: str, rounds: int, pp: int | None, seed: int,
                   alpha: float | None) -> list[str]:
    """The command line of the user's run (``dane train <these>``) that `stacked_run` times stacked."""
    overrides = ["algorithm=fednl", "problem=logreg", "data=libsvm", f"data.path={path}", f"problem.lam={LAM}",
                 "problem.fit_intercept=true", f"workers={clients}", f"rounds={rounds}", f"seed={seed}",
                 f"algorithm.option={OPTION}", f"algorithm.compressor={spec}", "quiet=true"]
    if pp:
        overrides += ["algorithm.variant=pp", f"algorithm.clients_per_round={pp}"]
    return overrides + ([f"algorithm.alpha={alpha!r}"] if alpha is not None else [])


def user_run(overrides: list[str]) -> dict:
    """The simulator's run of ``dane train <overrides>`` (`scripts.harness.in_process`; docs/benchmarks.md)."""
    summary, records, wall, _ = in_process(overrides, write=True)
    # the simulator's compute clock is thread CPU time, each phase's reading shared over the m workers
    cpu = summary["simulated_compute_s"] * summary["workers"] / summary["rounds"]
    return {"s_per_round": summary["wall_time_s"] / summary["rounds"], "cpu_s_per_round": cpu, "wall_s": wall,
            "simulator_path": summary.get("simulator_path"), "grad_norm": records[-1].get("grad_norm")}


def timings(runs: list[dict], reference: float) -> dict:
    """Seconds and CPU seconds per round over the repeats against u-FedNL's ``reference`` (the CPU ratio: what a
    quiet machine's ratio nears), and the final gradient norms."""
    per_round = [r["s_per_round"] for r in runs]
    median = statistics.median(per_round)
    return {"s_per_round": per_round, "median_s_per_round": median, "spread_s": max(per_round) - min(per_round),
            "cpu_s_per_round": [r["cpu_s_per_round"] for r in runs], "ratio_to_ufednl": median / reference,
            "cpu_ratio_to_ufednl": statistics.median(r["cpu_s_per_round"] for r in runs) / reference,
            "final_grad_norm": [r["grad_norm"] for r in runs]}


def bench_table(name: str, data_dir: Path, rounds: int, repeats: int, log) -> dict:
    """One table of `TABLES`: its clients stacked once, then per compressor the stacked runs and the user's."""
    file, m, pp = TABLES[name]
    path = data_dir / file
    if not path.exists():
        return {"skipped": f"{path} not found"}
    config = LinearModelConfig(data=LibSVMSource(path=str(path)), loss="logistic", lam=LAM, fit_intercept=True,
                               name="logreg")
    config.prepare()
    start = time.perf_counter()
    clients = stacked(config, m)
    CompactHessians.kept(clients)  # the Hessians' supports, shared by every run on the table
    k, setup_s = 8 * clients.dim, time.perf_counter() - start
    out = {"file": str(path), "clients": m, "clients_per_round": pp, "d": clients.dim, "rows": int(clients.X.shape[0]),
           "nnz_per_row": clients.X.nnz / clients.X.shape[0], "hessian_products": int(clients.hessians.P.nnz),
           "support_per_client": int(clients.hessians.S), "packed_entries": clients.hessians.T,
           "setup_s": setup_s, "rounds": rounds, "repeats": repeats, "compressors": {}}
    # FedNL-PP with TopK also at the paper's other α, 1 − sqrt(1 − δ) (baselines/fednl.py: the default is 1)
    for compressor in (("topk", "randk", "topk_theory") if pp else ("topk", "randk", "none")):
        kind = compressor.split("_")[0]
        spec = kind if kind == "none" else f"{kind}:{k}"
        alpha = theoretical_alpha(make(spec), clients.dim) if compressor == "topk_theory" else None
        runs = [stacked_run(clients, spec, rounds, pp, seed, alpha) for seed in range(repeats)]
        users = [user_run(user_overrides(path, m, spec, rounds, pp, seed, alpha)) for seed in range(repeats)]
        reference = UFEDNL_S_PER_ROUND[(name, kind)]
        key = spec if alpha is None else f"{spec} alpha={alpha:.4g}"
        stacked_timings, user = timings(runs, reference), timings(users, reference)
        user["ratio_to_stacked"] = user["median_s_per_round"] / stacked_timings["median_s_per_round"]
        out["compressors"][key] = {
            **stacked_timings, "ufednl_s_per_round": reference, "alpha": runs[0]["alpha"],
            "phase_s_per_round": [r["phase_s_per_round"] for r in runs],
            "uplink_bits_per_client_round": runs[0]["uplink_bits_per_client_round"],
            "user_path": {"command": "dane train " + " ".join(user_overrides(path, m, spec, rounds, pp, 0, alpha)),
                          **user, "wall_s": [u["wall_s"] for u in users], "simulator_path": users[0]["simulator_path"]}}
        log(f"{name} {key}: x{stacked_timings['ratio_to_ufednl']:.2f} of u-FedNL, "
            f"dane train x{user['ratio_to_ufednl']:.2f}")
    return out


def synthetic_clients(clients: int, d: int, seed: int = 0) -> StackedRows:
    """``clients`` x `ROWS_PER_CLIENT` rows of d binary features, `NNZ_PER_ROW` a row at uniform columns (fewer
    where a column is drawn twice), ±1 labels from a planted model, through ``problem=logreg`` on arrays."""
    import scipy.sparse

    from dane.problems.arrays import LogReg

    n = clients * ROWS_PER_CLIENT
    gen = np.random.default_rng(seed)
    cols = gen.integers(0, d, (n, NNZ_PER_ROW))
    X = scipy.sparse.csr_matrix((np.ones(cols.size), cols.ravel(), np.arange(0, cols.size + 1, NNZ_PER_ROW)),
                                shape=(n, d))
    X.sum_duplicates()
    X.data[:] = 1.0
    y = np.where(X @ gen.standard_normal(d) + 0.5 * gen.standard_normal(n) > 0, 1.0, -1.0)
    return stacked(LogReg(X, y, lam=LAM, fit_intercept=True), clients)


def memory_point(clients: int, d: int) -> dict:
    """In a fresh process (`bench_memory`): stack the clients, run `MEMORY_ROUNDS` rounds, read the peak memory."""
    np.seterr(over="ignore")  # exp overflow in a far-off line-search trial is harmless (the trial is refused)
    torch.set_num_threads(1)
    start = time.perf_counter()
    table = synthetic_clients(clients, d)
    setup_s = time.perf_counter() - start
    run = batched(table, compressor=f"topk:{8 * table.dim}", option=OPTION)
    start = time.perf_counter()
    for _ in range(MEMORY_ROUNDS):
        run.step()
    return {"clients": clients, "d": table.dim, "rows": int(table.X.shape[0]),
            "support_per_client": int(run.client.clients.S), "packed_entries": run.client.clients.T, "setup_s": setup_s,
            "s_per_round": (time.perf_counter() - start) / MEMORY_ROUNDS,
            "peak_rss_mib": peak_rss_kb() / 1024}  # VmHWM: not the harness's size, which ru_maxrss would count


def bench_memory(log) -> dict:
    """The ``memory`` key (docs/benchmarks.md): each point in a fresh process, then the fits' limits."""
    def probe(clients: int, d: int) -> dict:
        point = in_fresh_process("scripts.bench_fednl:memory_point", clients, d)
        if "failed" in point:
            raise RuntimeError(f"memory point m={clients} d={d}: {point['failed']}")
        log(f"memory: m={clients} d={point['d']}: peak {point['peak_rss_mib']:.0f} MiB")
        return point

    limit = MEMORY_LIMIT_GIB * 1024
    by_d = [probe(MEMORY_BASE_CLIENTS, d - 1) for d in MEMORY_DIMS]  # d - 1 features + the intercept
    by_m = [probe(m, MEMORY_BASE_DIM) for m in MEMORY_CLIENTS]
    quad = np.polyfit([p["d"] for p in by_d], [p["peak_rss_mib"] for p in by_d], 2)
    d_max = max(np.roots(quad - np.array([0, 0, limit])).real)
    line = np.polyfit([p["clients"] for p in by_m], [p["peak_rss_mib"] for p in by_m], 1)
    return {"limit_gib": MEMORY_LIMIT_GIB, "rounds": MEMORY_ROUNDS, "rows_per_client": ROWS_PER_CLIENT,
            "nnz_per_row": NNZ_PER_ROW, "compressor": "topk:8d", "by_d": by_d, "by_clients": by_m,
            "d_limit_at_clients": {"clients": MEMORY_BASE_CLIENTS, "d": int(d_max),
                                   "fit_mib_per_d2_d_1": quad.tolist()},
            "clients_limit_at_d": {"d": by_m[0]["d"], "clients": int((limit - line[1]) / line[0]),
                                   "fit_mib_per_client_1": line.tolist()},
            "note": "limits extrapolated from the fits over the measured points (peak RSS of one process)"}


def run(bench: Run) -> dict:
    """The tables and the memory key ``--only`` names (default: all), the others kept from ``--out``."""
    args = bench.args
    np.seterr(over="ignore")  # as in `memory_point`
    if args.quick:
        args.only, args.rounds, args.repeats = args.only or ["a9a"], 3, 1
    torch.set_num_threads(args.threads)
    report = {"machine": bench.machine, "goal": "median s/round <= u-FedNL's (ratio_to_ufednl <= 1); the final gradient "
              "norms are the package's: u-FedNL's TopK rows reach others (its TopK selection is defective: "
              "external_references.json, ufednl, known_defect)", "ufednl_machine": "2-core AMD EPYC VM, u-FedNL's multithreaded build on both cores "
              "(docs/design.md, Public reference implementations)", "option": OPTION,
              "tables": bench.earlier.get("tables", {})}
    only = args.only or [*TABLES, "memory"]
    if "memory" in only:
        report["memory"] = {**bench_memory(bench.log), "load_after": load()}
    elif "memory" in bench.earlier:
        report["memory"] = bench.earlier["memory"]
    for name in (name for name in only if name in TABLES):
        report["tables"][name] = {**bench_table(name, args.data_dir, args.rounds, args.repeats, bench.log),
                                  "torch_threads": args.threads, "load_before": bench.machine["load_avg"],
                                  "load_after": load(),
                                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                                  "rounds_note": "fewer than u-FedNL's 1000" if args.rounds < 1000 else ""}
    return bench.finish(report)


BENCH = Bench("fednl", run, "FedNL with its clients stacked, at u-FedNL's workloads", threads=None,
              only=(*TABLES, "memory"),
              options=(option("--rounds", type=count, default=1000), option("--repeats", type=count, default=2),
                       option("--data-dir", type=folder, default=data_dir() / "libsvm"),
                       option("--threads", type=count, default=1,
                              help="torch's intra-op threads; 1 measured faster than 2 on the shared 2-core machine")))
