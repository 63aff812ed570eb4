"""The federated benchmark (issue 33, item 5): the S-DANE paper's setting on a LIBSVM table, each setting of
`SETTINGS` into its own section (docs/benchmarks.md, section `federated`)."""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from dane.data.files import LibSVMSource, NPZSource, save_npz
from dane.numerics.similarity import measure
from dane.problems import ControlledQuadratic
from dane.problems.linear_models import LinearModelConfig
from dane.records.provenance import code_version
from dane.synthetic.bench_file import read_bench
from scripts.bench_defaults import SCAFFOLD_GRID
from scripts.harness import (Bench, Run, count, data_dir, default_and_grid, first_at, load,
                             local_work_to, now, optimum_of, option, relative)

KEY = "federated"
#: the quadratic's prox weights, multiples of δ_A: the theory's λ = δ_A down to S-DANE's full-participation default
#: floor δ_A/512; DANE's μ runs on the same multiples (and at 0), so that the three compare at equal prox weight
QUADRATIC_PROX = (1.0, 1 / 8, 1 / 32, 1 / 512)
QUADRATIC_GRIDS = {"dane": [{"safeguard": False, "mu": 0.0},
                            *({"safeguard": False, "mu_per_delta": c} for c in QUADRATIC_PROX)],
                   "sdane": [{"lam_per_delta": c} for c in QUADRATIC_PROX],
                   "acc_sdane": [{"lam_per_delta": c} for c in QUADRATIC_PROX]}
#: the settings: ``hard`` is the S-DANE paper's (m = 100 under Dirichlet 0.5, where few methods reach 1e-8 within
#: the caps); ``mild`` has fewer clients and a larger α, where more of them do (the table names each axis's leader);
#: ``quadratic`` (any run on it) runs DANE, S-DANE and Acc-S-DANE, on its own grids
SETTINGS = {"hard": {"dataset": "phishing", "workers": 100, "clients": [100, 10], "alpha": 0.5, "key": KEY,
                     "lam": 1e-3},
            "mild": {"dataset": "phishing", "workers": 20, "clients": [20, 10], "alpha": 1.0, "key": f"{KEY}_mild",
                     "lam": 1e-3},
            "quadratic": {"dataset": "quadratic", "workers": 5, "clients": [5], "alpha": None, "iid": True,
                          "key": f"{KEY}_quadratic", "caps": [200, 200], "lam": 1e-6, "delta": 0.1,
                          "grids_of": QUADRATIC_GRIDS}}
TARGETS = (1e-4, 1e-8)
SECOND_ORDER_CAP, FIRST_ORDER_CAP = 60, 200  # the caps of a setting that gives none (hard, mild)
PROX_PER_DELTA = (1.0, 1 / 8, 1 / 32)  # the DANE line's prox weights, as multiples of δ_A
#: method -> (algorithm, samples clients, round cap, grid: `scripts.harness.resolve`'s settings, ``X_per_delta``
#: multiples of δ_A; SCAFFOLD's and FedAvg's at their defaults' local work per round, K = 10, as bench_defaults's)
METHODS: dict[str, tuple[str, bool, int, list[dict]]] = {
    "sdane": ("sdane", True, SECOND_ORDER_CAP, [{"lam_per_delta": c} for c in PROX_PER_DELTA]),
    "acc_sdane": ("acc_sdane", True, SECOND_ORDER_CAP, [{"lam_per_delta": c} for c in PROX_PER_DELTA]),
    "feddane": ("feddane", True, SECOND_ORDER_CAP, [{"mu_per_delta": c} for c in PROX_PER_DELTA]),
    "fedred": ("fedred", True, FIRST_ORDER_CAP, [{"lam_per_delta": c} for c in PROX_PER_DELTA]),
    "fedprox": ("fedprox", True, FIRST_ORDER_CAP, [{"mu": mu} for mu in (1e-3, 0.1, 1.0)]),  # the paper's grid
    "scaffold": ("scaffold", True, FIRST_ORDER_CAP, SCAFFOLD_GRID),
    "fedavg": ("fedavg", True, FIRST_ORDER_CAP, [{"lr_times_L": c} for c in (0.25, 1.0)]),
    "scaffnew": ("scaffnew", False, FIRST_ORDER_CAP, [{"p": p} for p in (0.03, 0.1, 0.3)]),
    "gd": ("gd", False, FIRST_ORDER_CAP, [{"lr_factor": c} for c in (1.0, 1.5)]),
    "dane": ("dane", False, SECOND_ORDER_CAP, [{"safeguard": False, "mu": mu} for mu in (0.0, 1e-2, 0.1)]),
}
QUICK_METHODS = ("sdane", "scaffold")


def quick_table(folder: Path, n: int = 600, d: int = 6, seed: int = 0) -> Path:
    """Two classes with shifted means and spreads (label skew is then covariate skew): an .npz for `NPZSource`."""
    rng = np.random.default_rng(seed)
    y = rng.permutation(np.arange(n) % 2).astype(np.float64)
    X = np.where(y[:, None] > 0, 0.5, -0.5) + rng.standard_normal((n, d)) * np.where(y[:, None] > 0, 1.5, 0.7)
    return save_npz(folder / f"quick_{n}x{d}.npz", X, y)


def problem_config(args, folder: Path) -> LinearModelConfig | ControlledQuadratic:
    if args.dataset == "quadratic":
        return ControlledQuadratic(dim=50 if args.quick else 1000, delta=args.delta, mu=args.lam, seed=args.seed)
    sharding = {"sharding": "iid"} if args.alpha is None else {"sharding": "dirichlet", "alpha": args.alpha}
    if args.quick:
        source = NPZSource(path=str(quick_table(folder)), **sharding)
    else:
        path = data_dir() / "libsvm" / args.dataset
        if not path.is_file():
            raise SystemExit(f"error: {path} not found; set DANE_DATA_DIR to the folder holding libsvm/{args.dataset}")
        source = LibSVMSource(path=str(path), **sharding)
    return LinearModelConfig(data=source, loss="logistic", lam=args.lam, fit_intercept=True, optimum="auto",
                             name="logreg", seed=args.seed)


def at_targets(records: list[dict]) -> dict:
    """Per target, the first record at or below it: its rounds, allreduces, simulated time, communicator bytes and
    the work spent to reach it (uplink and downlink bytes, `local_work_to`); the best relative suboptimality."""
    star = optimum_of(records)
    if star is None:
        return {"targets": {}, "best_rel_suboptimality": None}
    rel = relative(records, star)

    def reached(hit: int) -> dict:
        r = records[hit]
        return {"rounds": r["round"], "comm_rounds": r["comm_rounds"], "time_s": float(r["time_s"]),
                "uplink_bytes": r.get("uplink_bytes"), "downlink_bytes": r.get("downlink_bytes"),
                "bytes_sent": r["bytes_sent"], **local_work_to(records, hit)}

    hits = {f"{target:g}": first_at(rel, target) for target in TARGETS}
    return {"targets": {t: None if hit is None else reached(hit) for t, hit in hits.items()},
            "best_rel_suboptimality": min(rel)}


def prox_weight(records: list[dict]) -> float | None:
    """The proximal weight the run started with (round 0's λ of S-DANE, μ of DANE and FedDANE): a null default's
    resolved value; None for a method that records none."""
    first = records[0] if records else {}
    value = first.get("lam", first.get("mu"))
    return None if value is None else float(value)


def run_method(config, method: str, s: int, args, similarity: dict, grid: list[dict]) -> tuple[dict, list[dict]]:
    """The method's default run at s clients per round and a run per ``grid`` setting (`scripts.harness`)."""
    algorithm, samples, cap, _ = METHODS[method]
    cap = args.caps[0] if cap == SECOND_ORDER_CAP else args.caps[1]

    def measure_run(result, settings: dict, keys: dict) -> dict:
        chosen = result.records[0].get("lr") if result.records else None  # η_l a null default chose (SCAFFOLD)
        return {"keys": keys, "status": result.status, "round_cap": cap, "prox_weight": prox_weight(result.records),
                **({"lr": chosen} if chosen is not None else {}), **at_targets(result.records)}

    given = {"delta_a": similarity["delta_mean_square"], "L": similarity["hessian_norm"] + args.lam}
    return default_and_grid(config, algorithm, {}, grid, measure_run, {"targets": {}, "best_rel_suboptimality": None},
                            given=given, extra={"clients_per_round": s} if samples and s < args.workers else {},
                            digits=2, workers=args.workers, rounds=cap, tol=TARGETS[-1], seed=args.seed)[:2]


def rounds_to(run: dict, target: float = TARGETS[-1]) -> int | None:
    hit = run["targets"].get(f"{target:g}")
    return None if hit is None else hit["rounds"]


def judge(default: dict, grid: list[dict]) -> dict:
    """``best``: the fewest rounds to the last target over the grid and the default (the first such run); ``ratio`` =
    default / best; ``best_per_target``: per target, the fewest rounds of any of them and that setting."""
    def fewest(target: float) -> dict | None:
        reached = [run for run in (default, *grid) if rounds_to(run, target) is not None]
        return min(reached, key=lambda run: rounds_to(run, target)) if reached else None

    tops = {target: fewest(target) for target in TARGETS}
    best = tops[TARGETS[-1]]
    ratio = None if best is None or rounds_to(default) is None else rounds_to(default) / max(rounds_to(best), 1)
    return {"best": best and {"settings": best["settings"], "rounds": rounds_to(best), "targets": best["targets"]},
            "best_per_target": {f"{t:g}": top and {"settings": top["settings"], "rounds": rounds_to(top, t)}
                                for t, top in tops.items()},
            "no_divergence": default["status"] not in ("diverged", "error"), "ratio": ratio}


def time_spread(runs: list[dict]) -> dict | None:
    """Simulated time to the last target over the repeats of a default (rounds and bytes are deterministic)."""
    hits = [run["targets"].get(f"{TARGETS[-1]:g}") for run in runs]
    if any(hit is None for hit in hits):
        return None
    values = [hit["time_s"] for hit in hits]
    return {"repeats": len(values), "min": min(values), "median": statistics.median(values), "max": max(values)}


def dissimilarity(config, m: int) -> dict:
    """δ, δ_A, δ_F and ‖H‖ of the m shards at w_0 = 0 (`dane.numerics.similarity.measure`), and the shard sizes."""
    problems = [config.build(rank, m) for rank in range(m)]
    found = measure(problems, torch.zeros(problems[0].dim, dtype=torch.float64))
    sizes = [p.n_local for p in problems if p.n_local is not None]  # none for a quadratic given by its Hessians
    rows = {"rows": sum(sizes), "shard_rows_min": min(sizes), "shard_rows_max": max(sizes)} if sizes else {}
    return {**{k: found[k] for k in ("delta", "delta_mean_square", "delta_frobenius", "hessian_norm", "method")},
            "dim": problems[0].dim, **rows}


def with_earlier(report: dict, earlier: dict, args) -> dict:
    """With ``--only``, this run's rows over the section's earlier ones (a row of both: this run's), in the order
    of s, then of `METHODS`; each row keeps the ``code`` it was measured with, and ``runs`` names each run's start,
    load and code (federated_table's header).  Else the report itself."""
    if not (earlier and args.only):
        return report
    clients = list(dict.fromkeys([*earlier.get("clients", []), *report["clients"]]))
    rows = {**earlier.get("rows", {}), **report["rows"]}

    def order(key: str) -> tuple:
        s, method = key.removeprefix("s=").split("/", 1)
        return (clients.index(int(s)) if int(s) in clients else len(clients), list(METHODS).index(method))

    def stamp(run: dict) -> dict:
        return {"started_at": run.get("started_at", "?"), "load_avg": run.get("machine", {}).get("load_avg"),
                "code": run.get("code")}

    return {**report, "clients": clients, "rows": {k: rows[k] for k in sorted(rows, key=order)},
            "methods": {**earlier.get("methods", {}), **report.get("methods", {})},
            "runs": [*earlier.get("runs", [stamp(earlier)]), stamp(report)]}


def grid_of(args, method: str) -> list[dict]:
    """The method's grid in this setting: the setting's own (``grids_of``, the quadratic's) or `METHODS`'."""
    return (getattr(args, "grids_of", None) or {}).get(method, METHODS[method][3])


def run_setting_rows(args, bench: Run) -> dict:
    """One setting's rows, merged into ``--out`` under ``args.key`` after each row (an interrupted run keeps them)."""
    if args.iid:
        args.alpha = None
    quadratic = args.dataset == "quadratic"
    if args.quick and not quadratic:
        args.workers, args.clients, args.dataset = 8, [8, 4], "quick"
    methods = args.only or list(QUADRATIC_GRIDS if quadratic else QUICK_METHODS if args.quick else METHODS)
    os.environ.setdefault("DANE_CACHE_DIR", str(Path(__file__).resolve().parents[1] / "results" / "cache"))  # O* once
    bench.start = time.perf_counter()  # wall_s: this setting's
    report = {"started_at": now(), "machine": bench.machine, "quick": args.quick, "setting": args.setting,
              "code": code_version(), "dataset": args.dataset, "workers": args.workers, "clients": args.clients,
              "sharding": "iid" if args.alpha is None else f"dirichlet alpha={args.alpha:g}", "lam": args.lam,
              **({"delta": args.delta, "problem": ControlledQuadratic.__doc__.splitlines()[0]} if quadratic else {}),
              "seed": args.seed, "targets": [f"{t:g}" for t in TARGETS],
              "target": "relative suboptimality (O(w) - O*) / |O*|, O* from optimum=auto",
              "round_caps": {"newton_type": args.caps[0], "first_order": args.caps[1]}, "grids": not args.defaults_only,
              "methods": {m: {"algorithm": a, "samples_clients": sc, "round_cap": c, "grid": grid_of(args, m)}
                          for m, (a, sc, c, _) in METHODS.items() if m in methods}, "rows": {}}
    earlier = read_bench(bench.path).get(args.key, {})
    with tempfile.TemporaryDirectory() as tmp:
        config = problem_config(args, Path(tmp))
        similarity = report["similarity"] = dissimilarity(config, args.workers)
        bench.log(f"{args.dataset}, m={args.workers}, {report['sharding']}: "
                  f"delta_A {similarity['delta_mean_square']:.3g}")
        for s in args.clients:
            for method in methods:
                key = f"s={s}/{method}"
                if not METHODS[method][1] and s < args.workers:
                    report["rows"][key] = {"skipped": f"{METHODS[method][0]} has no client sampling; run at s=m only"}
                    continue
                default, runs = run_method(config, method, s, args, similarity,
                                           [] if args.defaults_only else grid_of(args, method))
                row = report["rows"][key] = {"clients": s, "method": method, "default": default, "grid": runs,
                                             **judge(default, runs), "code": report["code"]}
                if args.repeats > 1:
                    again = [run_method(config, method, s, args, similarity, [])[0] for _ in range(args.repeats - 1)]
                    row["time_s_at_defaults"] = time_spread([default, *again])
                bench.log(f"  {key}: default {rounds_to(default)} rounds ({default['status']}), best {row['best']}")
                report["load_avg_now"] = load()
                bench.save(with_earlier(report, earlier, args), args.key)
        config.release()
    return bench.finish(with_earlier(report, earlier, args), args.key)


def run(bench: Run) -> dict:
    """Each setting of ``--setting`` into its own section; flags given override every setting."""
    args = bench.args
    given = {k: getattr(args, k) for k in ("dataset", "workers", "clients", "alpha", "caps", "lam", "delta")}
    report = {}
    for name in args.setting[:1] if args.quick else args.setting:
        report = run_setting_rows(argparse.Namespace(**{
            **vars(args), "caps": [SECOND_ORDER_CAP, FIRST_ORDER_CAP], **SETTINGS[name], "setting": name,
            **{k: v for k, v in given.items() if v is not None}}), bench)
    return report


BENCH = Bench(KEY, run, "the federated methods on a LIBSVM table under label skew (issue 33, item 5)", options=(
    option("--setting", nargs="+", choices=list(SETTINGS), default=list(SETTINGS),
           help="the settings to run, each into its own section (hard: federated, mild: federated_mild); "
                "--dataset, --workers, --clients, --alpha override every one given"),
    option("--dataset", default=None, help="a two-class file of $DANE_DATA_DIR/libsvm/"),
    option("--workers", type=count, default=None, help="m clients"),
    option("--clients", type=count, nargs="+", default=None, help="s sampled per round, each a row"),
    option("--alpha", type=float, default=None, help="Dirichlet label skew (omit with --iid)"),
    option("--iid", action="store_true", help="iid shards instead of Dirichlet"),
    option("--lam", type=float, default=None,
           help="the l2 weight (logistic, default 1e-3) or the quadratic's strong convexity (default 1e-6)"),
    option("--delta", type=float, default=None,
           help="quadratic: the Hessian dissimilarity max_i ||H_i - H|| (default 0.1; L = 1)"),
    option("--seed", type=int, default=0),
    option("--repeats", type=count, default=1, help="runs of each default, for the simulated time's spread"),
    option("--caps", type=count, nargs=2, default=None, metavar=("NEWTON_TYPE", "FIRST_ORDER"),
           help="round caps of the methods with local solves and of those with local gradient steps"),
    option("--defaults-only", action="store_true",
           help="run each method at its defaults only, without its grid (a shorter run)")), only=tuple(METHODS),
    sections=lambda args: [SETTINGS[name]["key"] for name in (args.setting[:1] if args.quick else args.setting)])
