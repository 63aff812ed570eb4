"""The federated benchmark (issue 33, item 5): the S-DANE paper's setting on a real LIBSVM table."""
from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dane.api import fit
from dane.data.files import LibSVMSource, NPZSource, save_npz
from dane.problems.base import ProblemConfig
from dane.problems.linear_models import LinearModelConfig
from dane.problems.quadratic import QuadraticProblem
from dane.records.provenance import code_version
from dane.numerics.similarity import measure
from dane.synthetic.bench_file import read_bench
from scripts.harness import Bench, Run, now, option, work_to

ROOT = Path(__file__).resolve().parents[1]

KEY = "federated"
#: the settings: ``hard`` is the S-DANE paper's (m = 100 under Dirichlet 0.5, where few methods reach 1e-8 within
#: the caps); ``mild`` has fewer clients and a larger α, where they do and can be ranked by rounds and uplink bytes
SETTINGS = {"hard": {"dataset": "phishing", "workers": 100, "clients": [100, 10], "alpha": 0.5, "key": KEY,
                     "lam": 1e-3},
            "mild": {"dataset": "phishing", "workers": 20, "clients": [20, 10], "alpha": 1.0, "key": f"{KEY}_mild",
                     "lam": 1e-3},
            "quadratic": {"dataset": "quadratic", "workers": 5, "clients": [5], "alpha": None, "iid": True,
                          "key": f"{KEY}_quadratic", "caps": [200, 200], "lam": 1e-6, "delta": 0.1}}
QUADRATIC_METHODS = ("dane", "sdane", "acc_sdane")
#: the quadratic's prox weights, multiples of δ_A: the theory's λ = δ_A down to S-DANE's full-participation default
#: floor δ_A/512; DANE's μ runs on the same multiples (and at 0), so that the three compare at equal prox weight
QUADRATIC_PROX = (1.0, 1 / 8, 1 / 32, 1 / 512)
QUADRATIC_GRIDS = {"dane": [{"safeguard": False, "mu": 0.0},
                            *({"safeguard": False, "mu_per_delta": c} for c in QUADRATIC_PROX)],
                   "sdane": [{"lam_per_delta": c} for c in QUADRATIC_PROX],
                   "acc_sdane": [{"lam_per_delta": c} for c in QUADRATIC_PROX]}
SETTINGS["quadratic"]["grids_of"] = QUADRATIC_GRIDS
TARGETS = (1e-4, 1e-8)
SECOND_ORDER_CAP, FIRST_ORDER_CAP = 60, 200  # the caps of a setting that gives none (hard, mild)
#: SCAFFOLD's knobs at its default's local work per round (K = 10), as scripts/bench_defaults.py's: η_l as multiples
#: of the step its default chose, and η_g
SCAFFOLD_GRID = [{"lr_times_default": c} for c in (0.25, 0.5, 2.0)] + [{"server_lr": g} for g in (1.0, 2.0)]
#: method -> (algorithm, samples clients, round cap, grid; a key ending in _per_delta is that multiple of δ_A,
#: ``lr_times_L: c`` is lr = c/(‖H‖ + λ) (at w_0), ``lr_times_default: c`` c times the lr the default chose)
METHODS: dict[str, tuple[str, bool, int, list[dict]]] = {
    "sdane": ("sdane", True, SECOND_ORDER_CAP, [{"lam_per_delta": c} for c in (1.0, 1 / 8, 1 / 32)]),
    "acc_sdane": ("acc_sdane", True, SECOND_ORDER_CAP, [{"lam_per_delta": c} for c in (1.0, 1 / 8, 1 / 32)]),
    "feddane": ("feddane", True, SECOND_ORDER_CAP, [{"mu_per_delta": c} for c in (1.0, 1 / 8, 1 / 32)]),
    "fedred": ("fedred", True, FIRST_ORDER_CAP, [{"lam_per_delta": c} for c in (1.0, 1 / 8, 1 / 32)]),
    "fedprox": ("fedprox", True, FIRST_ORDER_CAP, [{"mu": mu} for mu in (1e-3, 0.1, 1.0)]),  # the paper's grid
    "scaffold": ("scaffold", True, FIRST_ORDER_CAP, SCAFFOLD_GRID),
    "fedavg": ("fedavg", True, FIRST_ORDER_CAP, [{"lr_times_L": c} for c in (0.25, 1.0)]),  # at its default's K = 10
    "scaffnew": ("scaffnew", False, FIRST_ORDER_CAP, [{"p": p} for p in (0.03, 0.1, 0.3)]),
    "gd": ("gd", False, FIRST_ORDER_CAP, [{"lr_factor": c} for c in (1.0, 1.5)]),
    "dane": ("dane", False, SECOND_ORDER_CAP, [{"safeguard": False, "mu": mu} for mu in (0.0, 1e-2, 0.1)]),
}
QUICK_METHODS = ("sdane", "scaffold")


def data_dir() -> Path:
    return Path(os.environ.get("DANE_DATA_DIR", ROOT.parent / "shared" / "data"))


def quick_table(folder: Path, n: int = 600, d: int = 6, seed: int = 0) -> Path:
    """Two classes with shifted means and spreads (label skew is then covariate skew): an .npz for `NPZSource`."""
    rng = np.random.default_rng(seed)
    y = rng.permutation(np.arange(n) % 2).astype(np.float64)
    X = np.where(y[:, None] > 0, 0.5, -0.5) + rng.standard_normal((n, d)) * np.where(y[:, None] > 0, 1.5, 0.7)
    return save_npz(folder / f"quick_{n}x{d}.npz", X, y)


@dataclass(frozen=True)
class ControlledQuadratic(ProblemConfig):
    r"""The S-DANE paper's quadratic at a controlled dissimilarity: O_i(w) = ½ wᵀA_i w − b_iᵀw + (μ/2)‖w‖².

    A = Q diag(s) Qᵀ with Q a random rotation and s log-spaced on [1e-6, L]; A_i = A + E_i with E_i = c P(G_i − Ḡ)P,
    G_i symmetric Gaussian, P the projector on the eigenvectors of A with s ≥ δ (so that every A_i ⪰ 0: the
    package's exact local solves need convex local problems, where the paper's may be nonconvex up to λ) and c such
    that max_i ‖E_i‖₂ = δ; mean_i E_i = 0, so H = A + μI.  b_i = H w° + ζ_i − ζ̄ (w° and ζ_i Gaussian, ‖w°‖ ≈ 1), so
    w* = w° and the gradients differ between clients too.  Deterministic in ``seed``."""

    name: str = "quadratic"
    dim: int = 1000
    delta: float = 0.1
    L: float = 1.0
    mu: float = 1e-6
    seed: int = 0

    def parts(self, size: int) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
        key = (self, size)
        if key not in QUADRATIC_CACHE:
            rng = np.random.default_rng(self.seed)
            Q, _ = np.linalg.qr(rng.standard_normal((self.dim, self.dim)))
            s = np.geomspace(1e-6, self.L, self.dim)
            P = Q[:, s >= self.delta]
            G = [(g + g.T) / 2 for g in (rng.standard_normal((P.shape[1],) * 2) for _ in range(size))]
            E = [g - sum(G) / size for g in G]
            c = self.delta / max(float(np.abs(np.linalg.eigvalsh(e)).max()) for e in E)
            A = (Q * s) @ Q.T
            w_star = rng.standard_normal(self.dim) / np.sqrt(self.dim)
            zeta = [rng.standard_normal(self.dim) for _ in range(size)]
            Hw = A @ w_star + self.mu * w_star
            QUADRATIC_CACHE[key] = ([A + c * P @ e @ P.T for e in E], [Hw + z - sum(zeta) / size for z in zeta], w_star)
        return QUADRATIC_CACHE[key]

    def build(self, rank: int, size: int, dtype: torch.dtype = torch.float64) -> QuadraticProblem:
        A, b, w_star = self.parts(size)
        tensor = lambda x: torch.as_tensor(x, dtype=dtype)  # noqa: E731
        return QuadraticProblem(tensor((A[rank] + A[rank].T) / 2), tensor(b[rank]), 0.0, self.mu / 2, tensor(w_star))


QUADRATIC_CACHE: dict = {}


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
    """Per target: rounds, allreduces, uplink (or communicator) bytes and simulated time of the first record at or
    below it; the best relative suboptimality reached."""
    finite = [r for r in records if r.get("suboptimality") is not None and math.isfinite(r["suboptimality"])]
    if not finite:
        return {"targets": {}, "best_rel_suboptimality": None}
    f_star = finite[0]["objective"] - finite[0]["suboptimality"]
    rel = [r["suboptimality"] / abs(f_star) if r in finite else math.inf for r in records]
    out = {}
    for target in TARGETS:
        hit = next((k for k, value in enumerate(rel) if value <= target), None)
        if hit is None:
            out[f"{target:g}"] = None
            continue
        r = records[hit]
        # record t holds w_t's metrics and the traffic of round t too, which made w_{t+1}: w_t's is the one before
        traffic = {k: work_to(records, hit, k) for k in ("uplink_bytes", "downlink_bytes")}
        passes = work_to(records, hit, "local_passes")  # the clients' local gradient passes, where counted
        out[f"{target:g}"] = {"rounds": r["round"], "comm_rounds": r["comm_rounds"], "time_s": float(r["time_s"]),
                              **traffic, "bytes_sent": r["bytes_sent"],
                              **({} if passes is None else {"local_passes": passes})}
    return {"targets": out, "best_rel_suboptimality": min(rel)}


def keys_of(settings: dict, delta_a: float, *, L: float | None = None, default_lr: float | None = None) -> dict:
    """The algorithm keys of a grid setting: ``X_per_delta: c`` becomes ``X: c·δ_A``; ``lr_times_L: c``,
    lr = c/L (L = ‖H‖ + λ at w_0, for the logistic loss its curvature majorant's); ``lr_times_default: c``,
    lr = c times ``default_lr`` (the step the default run chose: its first record's ``lr``)."""
    keys = {}
    for k, v in settings.items():
        if k == "lr_times_L":
            keys["lr"] = v / L
        elif k == "lr_times_default":
            if default_lr is None:
                raise ValueError("lr_times_default: the default run logged no lr")
            keys["lr"] = v * default_lr
        else:
            keys[k.removesuffix("_per_delta")] = v * delta_a if k.endswith("_per_delta") else v
    return keys


def run_setting(config, method: str, settings: dict, s: int, args, delta_a: float, *, L: float | None = None,
                default_lr: float | None = None) -> dict:
    algorithm, samples, cap, _ = METHODS[method]
    cap = args.caps[0] if cap == SECOND_ORDER_CAP else args.caps[1]
    try:
        keys = keys_of(settings, delta_a, L=L, default_lr=default_lr)
    except ValueError as exc:  # a grid relative to a default that chose nothing: a result, the grid goes on
        return {"settings": settings, "status": "error", "error": str(exc), "targets": {},
                "best_rel_suboptimality": None, "wall_s": 0.0}
    if samples and s < args.workers:
        keys["clients_per_round"] = s
    start = time.perf_counter()
    try:
        result = fit(config, algorithm, workers=args.workers, rounds=cap, tol=TARGETS[-1], seed=args.seed, **keys)
    except Exception as exc:  # noqa: BLE001 -- a setting that fails is a result; the grid goes on
        return {"settings": settings, "status": "error", "error": f"{type(exc).__name__}: {exc}".splitlines()[0],
                "targets": {}, "best_rel_suboptimality": None, "wall_s": round(time.perf_counter() - start, 2)}
    chosen = result.records[0].get("lr") if result.records else None  # η_l a null default chose (SCAFFOLD)
    return {"settings": settings, "keys": keys, "status": result.status, "round_cap": cap,
            "prox_weight": prox_weight(result.records), **({"lr": chosen} if chosen is not None else {}),
            **at_targets(result.records),
            "wall_s": round(time.perf_counter() - start, 2)}


def prox_weight(records: list[dict]) -> float | None:
    """The proximal weight the run started with (round 0's λ of S-DANE, μ of DANE and FedDANE): a null default's
    resolved value; None for a method that records none."""
    first = records[0] if records else {}
    value = first.get("lam", first.get("mu"))
    return None if value is None else float(value)


def rounds_to(run: dict, target: float = TARGETS[-1]) -> int | None:
    hit = run["targets"].get(f"{target:g}")
    return None if hit is None else hit["rounds"]


def judge(default: dict, grid: list[dict]) -> dict:
    """``best``: the fewest rounds to the last target over the grid and the default; ``ratio`` = default / best;
    ``best_per_target``: per target, the fewest rounds of any of them and that setting."""
    runs = [default, *grid]
    per_target = {}
    for target in TARGETS:
        reached = [run for run in runs if rounds_to(run, target) is not None]
        top = min(reached, key=lambda run: rounds_to(run, target)) if reached else None
        per_target[f"{target:g}"] = None if top is None else {"settings": top["settings"],
                                                              "rounds": rounds_to(top, target)}
    reached = [run for run in runs if rounds_to(run) is not None]
    best = min(reached, key=rounds_to) if reached else None
    out = {"best": None if best is None else {"settings": best["settings"], "rounds": rounds_to(best),
                                              "targets": best["targets"]},
           "best_per_target": per_target,
           "no_divergence": default["status"] not in ("diverged", "error"), "ratio": None}
    if best is not None and rounds_to(default) is not None:
        out["ratio"] = rounds_to(default) / max(rounds_to(best), 1)
    return out


def spread(config, method: str, s: int, args, delta_a: float, first: dict) -> dict | None:
    """Simulated time to the last target at defaults over ``--repeats`` runs (``first`` is one of them)."""
    times = [first["targets"].get(f"{TARGETS[-1]:g}")]
    times += [run_setting(config, method, {}, s, args, delta_a)["targets"].get(f"{TARGETS[-1]:g}")
              for _ in range(args.repeats - 1)]
    if any(t is None for t in times):
        return None
    values = [t["time_s"] for t in times]
    return {"repeats": len(values), "min": min(values), "median": statistics.median(values), "max": max(values)}


def run_stamp(report: dict) -> dict:
    """When a run started and the load average then (the table's provenance)."""
    return {"started_at": report.get("started_at", "?"), "load_avg": report.get("machine", {}).get("load_avg")}


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
    of s, then of `METHODS`; the header names each run's start (federated_table).  Else the report itself."""
    if not (earlier and args.only):
        return report
    clients = list(dict.fromkeys([*earlier.get("clients", []), *report["clients"]]))
    rows = {**earlier.get("rows", {}), **report["rows"]}

    def order(key: str) -> tuple:
        s, method = key.removeprefix("s=").split("/", 1)
        return (clients.index(int(s)) if int(s) in clients else len(clients), list(METHODS).index(method))

    return {**report, "clients": clients, "rows": {k: rows[k] for k in sorted(rows, key=order)},
            "methods": {**earlier.get("methods", {}), **report.get("methods", {})},
            "runs": [*earlier.get("runs", [run_stamp(earlier)]), run_stamp(report)]}


def grid_of(args, method: str) -> list[dict]:
    """The method's grid in this setting: the setting's own (``grids_of``, the quadratic's) or `METHODS`'."""
    return (getattr(args, "grids_of", None) or {}).get(method, METHODS[method][3])


def run_setting_rows(args, bench: Run) -> dict:
    """One setting's rows, merged into ``args.out`` under ``args.key``."""
    if args.iid:
        args.alpha = None
    quadratic = args.dataset == "quadratic"
    if args.quick and not quadratic:
        args.workers, args.clients, args.dataset = 8, [8, 4], "quick"
    methods = args.only or (list(QUADRATIC_METHODS) if quadratic else list(QUICK_METHODS) if args.quick
                            else list(METHODS))
    os.environ.setdefault("DANE_CACHE_DIR", str(ROOT / "results" / "cache"))  # O* once per problem, then read
    bench.start, log, path = time.perf_counter(), bench.log, bench.path  # wall_s: this setting's
    report = {"started_at": now(), "machine": bench.machine, "quick": args.quick,
              "setting": args.setting, "code": code_version(), "dataset": args.dataset, "workers": args.workers, "clients": args.clients,
              "sharding": "iid" if args.alpha is None else f"dirichlet alpha={args.alpha:g}", "lam": args.lam,
              **({"delta": args.delta, "problem": ControlledQuadratic.__doc__.splitlines()[0]} if quadratic else {}),
              "seed": args.seed, "targets": [f"{t:g}" for t in TARGETS],
              "target": "relative suboptimality (O(w) - O*) / |O*|, O* from optimum=auto",
              "round_caps": {"newton_type": args.caps[0], "first_order": args.caps[1]}, "grids": not args.defaults_only,
              "methods": {m: {"algorithm": a, "samples_clients": sc, "round_cap": c, "grid": grid_of(args, m)}
                          for m, (a, sc, c, _) in METHODS.items() if m in methods},
              "rows": {}}
    earlier = read_bench(path).get(args.key, {})
    with tempfile.TemporaryDirectory() as tmp:
        config = problem_config(args, Path(tmp))
        report["similarity"] = dissimilarity(config, args.workers)
        delta_a = report["similarity"]["delta_mean_square"]
        log(f"{args.dataset}, m={args.workers}, {report['sharding']}: delta_A {delta_a:.3g}, "
            f"delta {report['similarity']['delta']:.3g}, ||H|| {report['similarity']['hessian_norm']:.3g}")
        for s in args.clients:
            for method in methods:
                algorithm, samples, _, _ = METHODS[method]
                grid = grid_of(args, method)
                key = f"s={s}/{method}"
                if not samples and s < args.workers:
                    report["rows"][key] = {"skipped": f"{algorithm} has no client sampling; run at s=m only"}
                    continue
                default = run_setting(config, method, {}, s, args, delta_a)
                runs = [] if args.defaults_only else [
                    run_setting(config, method, g, s, args, delta_a, L=report["similarity"]["hessian_norm"] + args.lam,
                                default_lr=default.get("lr")) for g in grid]
                row = {"clients": s, "method": method, "default": default, "grid": runs, **judge(default, runs)}
                if args.repeats > 1:
                    row["time_s_at_defaults"] = spread(config, method, s, args, delta_a, default)
                report["rows"][key] = row
                best = row["best"]
                log(f"  {key:18s} default {rounds_to(default)} rounds ({default['status']}, best rel "
                    f"{default['best_rel_suboptimality']}); best {best and best['rounds']} {best and best['settings']}"
                    f"; {sum(r['wall_s'] for r in [default, *runs]):.0f} s")
                report["load_avg_now"] = [round(x, 2) for x in os.getloadavg()]
                # after each row: an interrupted run keeps what it measured (and, with --only, the earlier rows)
                bench.save(with_earlier(report, earlier, args), args.key)
        config.release()
    report = bench.finish(with_earlier(report, earlier, args), args.key)
    log(f"done -> {path}")
    return report


def run(bench: Run) -> dict:
    """Each setting of ``--setting`` into its own section; flags given override every setting."""
    args = bench.args
    if args.quick:
        args.setting = args.setting[:1]
    report = {}
    for name in args.setting:
        given = {k: getattr(args, k) for k in ("dataset", "workers", "clients", "alpha", "caps", "lam", "delta")}
        chosen = argparse.Namespace(**{**vars(args), "caps": [SECOND_ORDER_CAP, FIRST_ORDER_CAP], **SETTINGS[name],
                                       **{k: v for k, v in given.items() if v is not None}})
        chosen.setting = name
        report = run_setting_rows(chosen, bench)
    return report


BENCH = Bench(KEY, run, "the federated methods on a LIBSVM table under label skew (issue 33, item 5)", options=(
    option("--setting", nargs="+", choices=list(SETTINGS), default=list(SETTINGS),
           help="the settings to run, each into its own section (hard: federated, mild: federated_mild); "
                "--dataset, --workers, --clients, --alpha override every one given"),
    option("--dataset", default=None, help="a two-class file of $DANE_DATA_DIR/libsvm/"),
    option("--workers", type=int, default=None, help="m clients"),
    option("--clients", type=int, nargs="+", default=None, help="s sampled per round, each a row"),
    option("--alpha", type=float, default=None, help="Dirichlet label skew (omit with --iid)"),
    option("--iid", action="store_true", help="iid shards instead of Dirichlet"),
    option("--lam", type=float, default=None,
           help="the l2 weight (logistic, default 1e-3) or the quadratic's strong convexity (default 1e-6)"),
    option("--delta", type=float, default=None,
           help="quadratic: the Hessian dissimilarity max_i ||H_i - H|| (default 0.1; L = 1)"),
    option("--seed", type=int, default=0),
    option("--repeats", type=int, default=1, help="runs of each default, for the simulated time's spread"),
    option("--caps", type=int, nargs=2, default=None, metavar=("NEWTON_TYPE", "FIRST_ORDER"),
           help="round caps of the methods with local solves and of those with local gradient steps"),
    option("--defaults-only", action="store_true",
           help="run each method at its defaults only, without its grid (a shorter run)")), only=tuple(METHODS))
