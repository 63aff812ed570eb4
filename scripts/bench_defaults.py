"""The defaults benchmark (issue 23, item 7): each method at its defaults beside its own best setting; section
``defaults``, one entry per cell and method (docs/benchmarks.md, section `defaults`)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from dane.problems import LogReg, Ridge
from dane.records.provenance import code_version
from dane.synthetic.defaults_data import FAMILIES, make
from scripts.harness import Bench, Run, default_and_grid, first_at, kept, local_work_to, optimum_of, option, relative

REL_TOL = 1e-8
MU_GRID = (0.0, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 0.3, 1.0, 3.0)
LAMS = (1e-3, 1e-5)
PROX_MULTIPLES = (0.25, 0.5, 2.0, 8.0, 32.0)  # grid of the DANE line's proximal weight, in units of its default
WORKERS = (4, 8)
#: SCAFFOLD's tuned knobs at a fixed local work per round (its K): η_l as multiples of the default's, and η_g
SCAFFOLD_GRID = [{"lr_times_default": c} for c in (0.25, 0.5, 2.0)] + [{"server_lr": g} for g in (1.0, 2.0)]
#: method -> (algorithm, its default overrides (none: the yaml), its grid of settings, the grid's goal factor)
METHODS: dict[str, tuple[str, dict, list[dict], float]] = {
    "dane": ("dane", {}, [{"safeguard": False, "mu": mu} for mu in MU_GRID], 1.5),
    "dane_mu0": ("dane", {"safeguard": False, "mu": 0.0},
                 [{"safeguard": False, "mu": 0.0, "eta": eta} for eta in (0.25, 0.5, 1.0)], 2.0),
    "inexact_dane": ("inexact_dane", {}, [{"safeguard": False, "mu": mu} for mu in (0.0, 1e-3, 0.1, 1.0)], 2.0),
    "aide": ("aide", {}, [{"tau": tau} for tau in (0.0, 1e-3, 1e-2, 0.1)], 2.0),
    "giant": ("giant", {}, [{"backtrack": b} for b in (0.25, 0.5, 0.8)], 2.0),
    "disco": ("disco", {}, [{"mu": mu} for mu in (0.0, 1e-4, 1e-3, 1e-2)], 2.0),
    "admm": ("admm", {}, [{"adaptive_rho": False, "rho": rho} for rho in (1e-3, 1e-2, 0.1, 1.0, 10.0)], 2.0),
    "gd": ("gd", {}, [{"lr_times_L": c} for c in (1.0, 1.5, 1.9)], 2.0),  # lr = c / L, L from numpy
    # The federated DANE line (issue 33), full participation.  X_times_default: c is c times the value of X
    # that the default run used (its records' X column: the measured-dissimilarity λ or μ, Scaffnew's p).
    "sdane": ("sdane", {}, [{"lam_times_default": c} for c in PROX_MULTIPLES], 2.0),
    "acc_sdane": ("acc_sdane", {}, [{"lam_times_default": c} for c in PROX_MULTIPLES], 2.0),
    "feddane": ("feddane", {}, [{"mu_times_default": c} for c in PROX_MULTIPLES], 2.0),
    "fedred": ("fedred", {}, [{"lam_times_default": c} for c in PROX_MULTIPLES], 2.0),
    "fedprox": ("fedprox", {}, [{"mu": mu} for mu in (1e-3, 0.1, 1.0)], 2.0),  # the paper's grid (default 0.01)
    "fedavg": ("fedavg", {}, [{"lr_times_L": c} for c in (0.25, 1.0)], 2.0),  # at its default's K = 10
    "scaffold": ("scaffold", {}, SCAFFOLD_GRID, 2.0),
    # SCAFFOLD's other variants, each judged against the same knobs at its own local work: option I, and K = 3, 30
    "scaffold_option1": ("scaffold", {"option": 1}, [{"option": 1, **g} for g in SCAFFOLD_GRID], 2.0),
    "scaffold_k3": ("scaffold", {"local_steps": 3}, [{"local_steps": 3, **g} for g in SCAFFOLD_GRID], 2.0),
    "scaffold_k30": ("scaffold", {"local_steps": 30}, [{"local_steps": 30, **g} for g in SCAFFOLD_GRID], 2.0),
    "scaffnew": ("scaffnew", {}, [{"p_times_default": c} for c in (0.5, 4.0)] +
                 [{"lr_times_default": 0.5, "p_times_default": 1.0}], 2.0),  # p = null needs lr = null: both given
}
#: round caps: at least twice the best grid setting's allreduces in every cell, so that "within 2x" is measurable
CAPS = {"admm": 1300, "gd": 6400, "sdane": 150, "acc_sdane": 150, "feddane": 150}  # (the last three: 2 a round)
#: methods whose fixed point is not the optimum on differing shards (FedProx's client drift): they reach a
#: floor, not the target, and end there with their diagnosis; judged on that, not on "within 2x"
FLOORED = ("fedprox", "fedavg")
CAP, QUICK_CAP = 300, 200


def smoothness(X: np.ndarray, loss: str, lam: float, fit_intercept: bool) -> float:
    """L of O(w) = (1/N) Σ loss + (λ/2)‖w‖²: c_f λ_max(XᵀX/N) + λ, c_f = 1 (squared), 1/4 (logistic)."""
    Z = np.hstack([X, np.ones((X.shape[0], 1))]) if fit_intercept else X
    return (1.0 if loss == "squared" else 0.25) * float(np.linalg.eigvalsh(Z.T @ Z / Z.shape[0])[-1]) + lam


def to_target(records: list[dict]) -> dict:
    """Rounds, allreduces and bytes (``bytes_sent``, and ``uplink_bytes``, ``downlink_bytes`` where the method counts
    them: an allreduce's size differs by method) to the first record at relative suboptimality REL_TOL, the best
    reached, and for a run that got there ``peak_rise`` and the clients' local work to it (`local_work_to`)."""
    star = optimum_of(records)
    rel = [] if star is None else relative(records, star)
    hit = first_at(rel, REL_TOL)
    row = {"reached": hit is not None, "rounds": None, "comm_rounds": None,
           "best_rel_suboptimality": min(rel, default=None)}
    if hit is not None:
        row.update(rounds=records[hit]["round"], comm_rounds=records[hit]["comm_rounds"], **{  # bytes: sizes differ
            k: records[hit][k] for k in ("bytes_sent", "uplink_bytes", "downlink_bytes") if k in records[hit]})
        if rel[0] > 0:
            row["peak_rise"] = max(rel[: hit + 1]) / rel[0]
        row.update(local_work_to(records, hit))
    return row


def run_method(problem, method: str, workers: int, L: float, cap: int) -> tuple[dict, list[dict]]:
    """The method's default run (``first_record``: what it chose, which its grid's ``X_times_default`` multiplies)
    and a run per setting of its grid (`scripts.harness.default_and_grid`)."""
    algorithm, default_keys, grid, _ = METHODS[method]

    def measure(result, settings: dict, keys: dict) -> dict:  # stopped_by: why a run ended short (its diagnosis)
        return {"status": result.status, "stopped_by": result.summary.get("stopped_by"), **to_target(result.records),
                **({"keys": keys} if keys != settings else {})}

    default, runs, chosen = default_and_grid(problem, algorithm, default_keys, grid, measure, {"reached": False},
                                             given={"L": L}, extra={}, digits=3, workers=workers, rounds=cap,
                                             tol=REL_TOL)
    if chosen is not None:
        default["first_record"] = chosen
    return default, runs


def judge(method: str, default: dict, grid: list[dict]) -> dict:
    """``best`` (fewest allreduces on the grid), ``ratio`` = default / best, and the goals' verdicts."""
    factor = METHODS[method][3]
    reached = [g for g in grid if g["reached"]]
    best = min(reached, key=lambda g: (g["comm_rounds"], g["rounds"])) if reached else None
    out = {"best": best and {k: best[k] for k in ("settings", "rounds", "comm_rounds")}, "factor": factor,
           "ratio": None, "rounds_ratio": None, "no_divergence": default["status"] not in ("diverged", "error")}
    if method in FLOORED:  # its default either reaches the target or ends early at its floor, saying why
        out["diagnosed"] = default["reached"] or default["status"] == "client_drift"
    if best is not None and default["reached"]:
        out.update(ratio=default["comm_rounds"] / best["comm_rounds"],
                   rounds_ratio=default["rounds"] / max(best["rounds"], 1))
    # None: no setting of the grid reached the target, nothing to be within
    out["within_factor"] = None if best is None else default["reached"] and out["ratio"] <= factor
    return out


def cells(args) -> list[tuple[str, str, float, int]]:
    """(family, loss, λ, m) per cell: ``--quick``'s well-conditioned one (every method reaches the target), else the
    flags' product (large_targets: ridge only)."""
    if args.quick:
        return [("large_targets", "squared", 1e-3, 4)]
    return [(family, loss, lam, m) for family in args.families for loss in ("squared", "logistic")
            if loss in args.losses and (loss == "squared" or family != "large_targets")
            for lam in args.lams for m in args.workers]


def misses(report: dict) -> list[str]:
    """Every (cell, method) that misses a goal, in words."""
    out = []
    for key, cell in report["cells"].items():
        for method, row in cell["methods"].items():
            if not row["no_divergence"]:
                out.append(f"{key} {method}: default {row['default']['status']}")
            elif row.get("diagnosed") is False:
                out.append(f"{key} {method}: default ran to the cap without reaching the target or its floor "
                           f"({row['default']['status']})")
            elif row["within_factor"] is False:
                have = f"{row['ratio']:.2f}x" if row["ratio"] is not None else "not reached"
                out.append(f"{key} {method}: default {have} of best {row['best']['comm_rounds']} allreduces "
                           f"{row['best']['settings']} (goal {row['factor']}x)")
    return out


def run(bench: Run) -> dict:
    """Each cell saved as it ends; with ``--only``, the other methods' rows of ``--out`` (same ``--quick``) kept."""
    args = bench.args
    os.environ.setdefault("DANE_CACHE_DIR", str(Path(__file__).resolve().parents[1] / "results" / "cache"))  # O* once
    methods, earlier = args.only or list(METHODS), kept(bench) if args.only else {}
    code = code_version()  # per method row too: --only reruns one method on newer code
    report = {**bench.header(), "quick": args.quick, "code": code,
              "target": f"relative suboptimality (O(w) - O*) / |O*| <= {REL_TOL:g} (dane.fit tol)",
              "goals": "no default diverges; each default within 2x of its best grid setting in allreduces "
                       "(safeguarded DANE: 1.5x of the best fixed mu)",
              "methods": {m: {"algorithm": a, "default": d, "grid": g, "goal_factor": f}
                          for m, (a, d, g, f) in METHODS.items()},
              "cells": dict(earlier.get("cells", {})), **({"rerun_of": methods} if earlier else {})}
    for family, loss, lam, m in cells(args):
        key = f"{family}/{'ridge' if loss == 'squared' else 'logistic'}/lam={lam:g}/m={m}"
        bench.log(key)
        X, y, fit_intercept = make(family, loss, **({"n": 400} if args.quick else {}))
        problem = (Ridge if loss == "squared" else LogReg)(X, y, lam=lam, fit_intercept=fit_intercept, optimum="auto")
        L = smoothness(X, loss, lam, fit_intercept)
        cell = report["cells"][key] = {
            "family": family, "loss": loss, "lam": lam, "workers": m, "rows": int(X.shape[0]),
            "dim": int(X.shape[1]) + int(fit_intercept), "L": L,
            "methods": dict(report["cells"].get(key, {}).get("methods", {}))}  # an earlier run's others kept
        for method in methods:
            cap = QUICK_CAP if args.quick else CAPS.get(METHODS[method][0], CAP)
            default, runs = run_method(problem, method, m, L, cap)
            cell["methods"][method] = {"round_cap": cap, "default": default, "grid": runs,
                                       **judge(method, default, runs), "code": code}
            bench.log(f"  {method}: default {default['comm_rounds']} allreduces ({default['status']})")
        report["misses"] = misses(report)
        bench.save(report)  # after each cell, so an interrupted run keeps what it measured
    return bench.finish(report)


BENCH = Bench("defaults", run, "each method at its defaults beside its own best setting (issue 23)", options=(
    option("--families", nargs="+", choices=list(FAMILIES), default=list(FAMILIES)),
    option("--workers", nargs="+", type=int, choices=WORKERS, default=list(WORKERS),
           help="the cells' m (a subset reruns fewer cells; the others keep their numbers)"),
    option("--lams", nargs="+", type=float, choices=LAMS, default=list(LAMS), help="the cells' λ"),
    option("--losses", nargs="+", choices=("squared", "logistic"), default=["squared", "logistic"],
           help="the cells' losses")), only=tuple(METHODS))
