"""The sampled DANE line's default λ beside a λ grid: S-DANE and Acc-S-DANE under client sampling (and FedRed's K);
section ``sampled_lambda`` of its own JSON, a grid row ``KIND TABLE SHARDING`` holding its runs (``rows``: `one`'s
keys and a ``role``) and a ``summary`` (`fewest`); docs/benchmarks.md, section `sampled_lambda`."""
from __future__ import annotations

import time
from functools import partial

from dane.experiments.config import run_spec
from dane.loop.launch import execute
from dane.synthetic.sweep import compose_job
from scripts.harness import SKIP_WITHOUT_DATA, Bench, counts, data_dir, first_at, grid, option

TARGETS = (1e-2, 3e-3, 1e-3, 3e-4, 1e-4)
GRID = (0.25, 0.5, 2.0, 4.0)
STEP_GRID = (0.5, 2.0, 4.0)  # fedred: multiples of the default's local step count K
DATA_DIR = data_dir()


def one(method: str, table: str, m: int, shard: str, s: int, rounds: int, lam: float | None = None,
        extra: tuple[str, ...] = (), tol: float = 1e-8) -> dict:
    """One in-process run (`dane.loop.launch.execute`): its λ (or K) and the first round at each of `TARGETS`;
    a run that raises (a diverging λ of the grid) is a row with the error's name as its status."""
    job = [f"algorithm={method}", "problem=logreg", "data=libsvm", f"data.path=libsvm/{table}", f"workers={m}",
           f"data.sharding={shard}", "data.alpha=0.5", f"rounds={rounds}", f"tol={tol!r}", "quiet=true",
           "problem.optimum=auto", f"data_dir={DATA_DIR}"]
    job += [] if s == m else [f"algorithm.clients_per_round={s}"]
    job += [] if lam is None else [f"algorithm.lam={lam!r}"]
    collected, start = {}, time.perf_counter()
    try:  # not harness.in_process: a run that diverges raises after it collected the records this row keeps
        status = execute(run_spec(compose_job(tuple(job + list(extra)))), None, collect=collected)["status"]
    except Exception as error:  # noqa: BLE001 -- a row, not the end of the bench
        status = type(error).__name__
    records = collected.get("records", [])
    rel = [r["suboptimality"] / abs(r["objective"] - r["suboptimality"]) for r in records if "suboptimality" in r]
    return {"method": method, "lam": next((r["lam"] for r in records if "lam" in r), lam), "status": status,
            "local_steps": next((r["local_steps"] for r in records if "local_steps" in r), None), "extra": list(extra),
            "rounds": len(rel) - 1, "best_rel": min(rel) if rel else None, "final_rel": rel[-1] if rel else None,
            "first_round_at": {f"{t:g}": first_at(rel, t) for t in TARGETS},
            "wall_s": round(time.perf_counter() - start, 1)}


def where(table: str, m: int, shard: str, s: int) -> dict:
    return {"table": table, "m": m, "sharding": shard, "alpha": 0.5 if shard == "dirichlet" else None, "s": s}


def fewest(rows: list[dict], target: float) -> dict:
    """The default's (the first row's) rounds to ``target``, the fewest of ``rows`` and their ratio."""
    key = f"{target:g}"
    mine = rows[0]["first_round_at"][key]
    best = min((r["first_round_at"][key] for r in rows if r["first_round_at"][key] is not None), default=None)
    return {"default_rounds_to_target": mine, "grid_best_rounds_to_target": best,
            "ratio": None if mine is None or best is None else mine / best}


def lam_rows(method: str, here: tuple, old: float, factors) -> list[dict]:
    """``method`` in ``here`` at its default λ, at ``old`` (the full-participation default it replaced) and at the
    default times each of ``factors``, each row with its ``role``."""
    default = one(method, *here)
    return [dict(default, role="default"), dict(one(method, *here, old), role="old_default"),
            *(dict(one(method, *here, f * default["lam"]), role=f"default x {f:g}") for f in factors)]


def cell(table: str, m: int, shard: str, s: int, rounds: int, target: float) -> dict:
    """``sdane``: S-DANE at its default, its full-participation default and the default times `GRID`; Acc-S-DANE at
    its two defaults."""
    old = one("sdane", table, m, shard, m, 1)["lam"]  # the full-participation defaults (δ_A rules)
    old_acc = one("acc_sdane", table, m, shard, m, 1)["lam"]
    here = (table, m, shard, s, rounds)
    rows = lam_rows("sdane", here, old, GRID) + lam_rows("acc_sdane", here, old_acc, ())
    return {**where(table, m, shard, s), "old_default_lam": old, "acc_old_default_lam": old_acc,
            "default_lam": rows[0]["lam"], "target": target, "rows": rows,
            "summary": {**fewest([r for r in rows if r["method"] == "sdane"], target),
                        "default_floor": rows[0]["best_rel"], "old_default_floor": rows[1]["best_rel"]}}


def acc_cell(table: str, m: int, shard: str, s: int, rounds: int, target: float) -> dict:
    """``acc``: Acc-S-DANE alone at its default, its full-participation default and the default times 1/2 and 2."""
    old = one("acc_sdane", table, m, shard, m, 1)["lam"]
    rows = lam_rows("acc_sdane", (table, m, shard, s, rounds), old, (0.5, 2.0))
    summary = fewest(rows, target)
    del summary["ratio"]
    return {**where(table, m, shard, s), "old_default_lam": old, "default_lam": rows[0]["lam"], "target": target,
            "rows": rows, "summary": {**summary, "default_floor": rows[0]["best_rel"],
                                      "old_default_floor": rows[1]["best_rel"],
                                      "grid_best_floor": min(r["best_rel"] for r in rows if r["best_rel"] is not None)}}


def fedred_cell(table: str, m: int, shard: str, s: int, rounds: int, target: float) -> dict:
    """``fedred``: FedRed's default beside ten steps, the default's K times `STEP_GRID` and S-DANE's sampled λ, each
    run to ``target``."""
    sdane_lam = one("sdane", table, m, shard, s, 1)["lam"]  # S-DANE's sampled default λ_S (one round)
    run, ten = partial(one, "fedred", table, m, shard, s, rounds, tol=target), ("algorithm.local_steps=10",)
    default = run()
    steps = default["local_steps"]
    rows = [dict(default, role="default"), dict(run(extra=ten), role="old_default"),
            *(dict(run(extra=(f"algorithm.local_steps={max(1, round(f * steps))}",)), role=f"local_steps x {f:g}")
              for f in STEP_GRID),
            dict(run(sdane_lam, ten), role="sdane_sampled_lam")]
    return {**where(table, m, shard, s), "default_local_steps": steps, "default_lam": default["lam"],
            "sdane_sampled_lam": sdane_lam, "target": target, "rows": rows,
            "summary": {**fewest(rows, target),
                        "old_default_rounds_to_target": rows[1]["first_round_at"][f"{target:g}"]}}


def missing_tables(args) -> str | None:
    """Why the section cannot run here (a LIBSVM table of ``--tables`` not in `DATA_DIR`), or None: every run would
    be refused and no λ measured."""
    absent = [t for t in args.tables if not (DATA_DIR / "libsvm" / t).is_file()]
    return (f"no LIBSVM table {', '.join(absent)} in {DATA_DIR / 'libsvm'} (set DANE_DATA_DIR to the folder holding "
            "libsvm/)") if absent else None


def cells(run) -> dict:
    """``KIND TABLE SHARDING`` -> its cell: ``sdane`` (`cell`), ``acc`` (`acc_cell`), ``fedred`` (`fedred_cell`)."""
    args = run.args
    s = max(1, round(args.fraction * args.workers))
    return {f"{kind} {table} {shard}": partial(make, table, args.workers, shard, s, args.rounds, args.target)
            for kind, make in (("sdane", cell), ("acc", acc_cell), ("fedred", fedred_cell))
            for table in args.tables for shard in args.shardings}


BENCH = Bench("sampled_lambda", grid(cells, optional=("acc", "fedred"), skip=missing_tables),
              "S-DANE's measured lambda under client sampling (own JSON, --out)", threads=None,
              out="results/sampled_lambda.json", only=("sdane", "acc", "fedred"), resumable=True,
              options=(option("--tables", nargs="+", default=["phishing", "a9a"]),
                       option("--shardings", nargs="+", default=["iid", "dirichlet"]),
                       *counts(workers=80, rounds=300), SKIP_WITHOUT_DATA,
                       option("--fraction", type=float, default=0.1, help="s = fraction · m clients a round"),
                       option("--target", type=float, default=1e-3,
                              help="relative suboptimality of the rounds-to-target")))
