"""The FedNL paper's comparison: JSON section ``compressed``, per dataset and row of `METHODS`
the work per node to relative suboptimality `TARGET`, then the paper's `CLAIMS`; docs/benchmarks.md, section
`compressed`."""
from __future__ import annotations

import math
import time

from dane.api import CONF_DIR, fit
from dane.data.files import LibSVMSource
from dane.problems.linear_models import LinearModelConfig
from scripts.harness import (LOCAL_WORK, Bench, Run, count, data_dir, first_at, kept, load, local_work_to, optimum_of,
                             option, relative)

TARGET, LAM = 1e-12, 1e-3
DATASETS = {"a9a": 80, "w8a": 142, "phishing": 100}  # the FedNL paper's clients per table
QUARTER = 0.25  # Newton-3PC's goal: a Hessian in at most this share of its rounds
#: row -> (algorithm, its keys: {d} is d with the intercept, {s} round(sqrt d), the dithering levels; its round cap:
#: docs/benchmarks.md, "The compressed comparison").  FedNL at option 2 (option 1 wanders from x⁰ = 0);
#: ``compress: none`` counts an uncompressed method's bits whole
METHODS = {
    "fednl_topk": ("fednl", {"compressor": "topk:{d}", "option": 2}, 300),
    "fednl_randk": ("fednl", {"compressor": "randk:{d}", "option": 2}, 300),
    "fednl_rank1": ("fednl", {"compressor": "rank:1", "option": 2}, 300),
    "fednl_bc": ("fednl_bc", {"compressor": "topk:{d}", "option": 2}, 300),
    "newton_3pc": ("newton_3pc", {"mechanism": "lag"}, 300),
    "newton_3pc_bag": ("newton_3pc", {"mechanism": "bag", "p": QUARTER}, 300),
    "nl1": ("nl1", {}, 300), "dingo": ("dingo", {}, 300), "newton_star": ("newton_star", {}, 300),
    "diana": ("diana", {"compressor": "dither:{s}"}, 4000),
    "adiana": ("adiana", {"compressor": "dither:{s}"}, 2000),
    "marina": ("marina", {}, 200), "dasha": ("dasha", {}, 200), "ef21": ("ef21", {}, 200), "ef21p": ("ef21p", {}, 200),
    "gd": ("gd", {"compress": "none"}, 200),
    "dane": ("dane", {"safeguard": True, "compress": "none"}, 300),
    "giant": ("giant", {"compress": "none"}, 300),
}
QUICK = ("fednl_topk", "fednl_bc", "diana", "gd")
WORK = ("uplink_bits", "total_bits", "local_passes")  # per node, to the target, and each curve's


def problem(name: str) -> LinearModelConfig:
    """The table ``libsvm/<name>`` of `scripts.harness.data_dir`."""
    path = data_dir() / "libsvm" / name
    if not path.is_file():
        raise SystemExit(f"error: {path} not found; set DANE_DATA_DIR to the folder holding libsvm/{name}")
    return LinearModelConfig(data=LibSVMSource(path=str(path)), loss="logistic", lam=LAM, fit_intercept=True,
                             optimum="auto", name="logreg")


def per_node(records: list[dict], m: int) -> list[dict]:
    """Each record's cumulative work per node to reach its iterate: bits up, up and down (FedNL's participants' bytes
    over m, else the per-worker bits), and each count of `scripts.harness.LOCAL_WORK` over m (None: not counted)."""
    def bits(r: dict, way: str) -> float:
        return 8 * r.get(f"{way}link_bytes", 0) / m if "uplink_bytes" in r else float(r.get(f"{way}link_bits", 0))
    return [{"uplink_bits": bits(r, "up"), "total_bits": bits(r, "up") + bits(r, "down"),
             **{k: None if r.get(k) is None else r[k] / m for k in LOCAL_WORK}}
            for r in records]


def thinned(rel: list[float], work: list[dict], points: int = 60) -> dict:
    """The curves at about ``points`` rounds, spaced evenly in log(round); each point's work is what made it."""
    n = len(rel)
    keep = sorted({0, n - 1, *(min(n - 1, round(math.expm1(i * math.log(n) / points))) for i in range(points))})
    return {"round": keep, "rel": [float(f"{rel[i]:.4g}") for i in keep],
            **{k: [work[i][k] for i in keep] for k in WORK}}


def cell(config: LinearModelConfig, m: int, method: str, cap: int, seed: int) -> dict:
    """One method's run on one dataset: its work per node at the target (or at its best, and by how much it missed)."""
    algorithm, keys, _ = METHODS[method]
    row = {"method": method, "algorithm": algorithm}
    if not (CONF_DIR / "algorithm" / f"{algorithm}.yaml").is_file():
        return {**row, "status": "absent", "error": f"not run: {algorithm} absent"}
    config.prepare()
    d = config.build(0, m).dim
    keys = {k: v.format(d=d, s=round(math.sqrt(d))) if isinstance(v, str) else v for k, v in keys.items()}
    start = time.perf_counter()
    try:
        result = fit(config, algorithm, workers=m, rounds=cap, tol=TARGET, seed=seed, **keys)
    except Exception as exc:  # noqa: BLE001 -- a method that fails is a row
        return {**row, "keys": keys, "status": "error", "error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
    records, wall = result.records, round(time.perf_counter() - start, 1)
    rel, work = relative(records, optimum_of(records)), per_node(records, m)
    hit = first_at(rel, TARGET)
    at = len(records) - 1 if hit is None else hit
    rounds, hessians = records[at]["round"], work[at]["local_hessians"]
    return {**row, "keys": keys, "status": result.status, "round_cap": cap, "reached": hit is not None,
            "rounds": rounds, **{k: work[at][k] for k in WORK}, **local_work_to(work, at), "best_rel": min(rel),
            "hessian_share": None if hessians is None else hessians / max(rounds, 1),
            "missed_by": None if hit is not None else min(rel) / TARGET, "wall_s": wall, "curve": thinned(rel, work)}


def projected(c: dict, key: str) -> float | None:
    """The ``key`` a cell that missed the target would spend to reach it at its curve's log-linear rate over the last
    half of its rounds (an extrapolation, never a measurement); None where the curve did not fall there."""
    rounds, rel, work = c["curve"]["round"], c["curve"]["rel"], c["curve"][key]
    i, j = next(k for k, r in enumerate(rounds) if r >= rounds[-1] / 2), len(rounds) - 1
    if not 0 < rel[j] < rel[i] or work[j] <= work[i]:
        return None
    return work[j] + math.log(rel[j] / TARGET) * (work[j] - work[i]) / math.log(rel[i] / rel[j])


def spent(c: dict, key: str) -> str:
    if c["reached"]:
        return f"{c[key]:.4g}"
    guess = "" if projected(c, key) is None else f"; about {projected(c, key):.3g} at its last-half rate"
    return f"more than {c[key]:.4g} (best {c['best_rel']:.2g} at the cap{guess})"


def fewer(cells: dict, a: str, b: str, key: str) -> tuple[bool | None, str]:
    """Whether row ``a`` reaches the target with less ``key`` than row ``b`` (b missing it counts as more)."""
    x, y = cells[a], cells[b]
    text = f"{a} {key.replace('_', ' ')}/node {spent(x, key)}, {b} {spent(y, key)}"
    if not x["reached"]:
        return (None, f"undecided: neither reached the target; {text}") if not y["reached"] else (False, text)
    if not y["reached"] and y[key] < x[key]:
        return None, f"undecided: {b} missed the target on fewer bits than {a} spent; {text}"
    ok = not y["reached"] or x[key] < y[key]
    return ok, text if ok else f"{text}: {x[key] / y[key]:.3g}x {b}'s"


def lazy(cells: dict, a: str, b: str) -> tuple[bool, str]:
    """Newton-3PC: a node forms a Hessian in at most a quarter of its rounds (on average over the nodes), and it
    reaches the target on no more uplink bits than FedNL; where not, by how much."""
    x, y, share = cells[a], cells[b], cells[a]["hessian_share"]
    misses = [f"{share / QUARTER:.3g}x a quarter of its rounds"] if share > QUARTER else []
    if not x["reached"]:
        misses.append("no target")
    elif y["reached"] and x["uplink_bits"] > y["uplink_bits"]:
        misses.append(f"{x['uplink_bits'] / y['uplink_bits']:.3g}x {b}'s bits")
    text = (f"{a} forms a Hessian in {share:.1%} of its rounds per node; uplink bits/node {spent(x, 'uplink_bits')}, "
            f"{b} {spent(y, 'uplink_bits')}")
    return not misses, text + (f": {', '.join(misses)}" if misses else "")


#: (claim, its rows a and b, the work a must spend less of than b to the target; None: Newton-3PC's, `lazy`)
CLAIMS = (("FedNL (TopK) reaches 1e-12 with fewer uplink bits per node than DIANA", "fednl_topk", "diana",
           "uplink_bits"),
          ("FedNL (TopK) reaches 1e-12 with fewer uplink bits per node than ADIANA", "fednl_topk", "adiana",
           "uplink_bits"),
          ("FedNL-BC reaches 1e-12 with fewer total bits per node than FedNL", "fednl_bc", "fednl_topk", "total_bits"),
          ("Newton-3PC (p = 1/4) computes Hessians in at most 1/4 of its rounds at no more uplink bits than FedNL",
           "newton_3pc_bag", "fednl_topk", None))


def claims(dataset: str, cells: dict) -> list[dict]:
    """Each claim on one dataset's cells: holds (True, False) or undecided (None), and its numbers."""
    out = []
    for claim, a, b, key in CLAIMS:
        gone = [f"{n} {cells.get(n, {}).get('status', 'not in this run')}" for n in (a, b)
                if "reached" not in cells.get(n, {})]  # absent, failed, unfinished or not asked for
        if gone:
            holds, text = None, f"not run: {', '.join(gone)}"
        else:
            holds, text = lazy(cells, a, b) if key is None else fewer(cells, a, b, key)
        out.append({"dataset": dataset, "claim": claim, "holds": holds, "text": text})
    return out


def command(args) -> str:
    """The run's command line, as its ``parts`` record it."""
    flags = {"--datasets": args.datasets != list(DATASETS) and args.datasets, "--only": args.only,
             "--cap": args.cap and [args.cap], "--seed": args.seed and [args.seed]}
    return " ".join(["python -m scripts.bench compressed --out", args.out, *["--quick"] * args.quick,
                     *(f"{flag} {' '.join(map(str, v))}" for flag, v in flags.items() if v)])


def run(bench: Run) -> dict:
    """The cells asked for, each saved as it ends beside those ``--out`` held (a part per run); then the claims."""
    args = bench.args
    datasets, methods = (["phishing"], list(QUICK)) if args.quick else (args.datasets, args.only or list(METHODS))
    cap = 30 if args.quick else args.cap
    section = {**kept(bench), **bench.header(), "quick": args.quick, "target": TARGET, "lam": LAM, "seed": args.seed,
               "clients": DATASETS}
    runs = {(d, m) for d in datasets for m in methods}
    part = {"command": command(args), "datasets": datasets, "methods": methods, "started_at": bench.started_at,
            "load_avg_before": bench.machine["load_avg"], "code": section["code"], "finished": False}
    section["parts"] = [p for p in section.get("parts", []) if not  # a part whose cells this run replaces all of
                        {(d, m) for d in p.get("datasets", ()) for m in p.get("methods", ())} <= runs] + [part]
    cells = section.setdefault("cells", {})
    for name in datasets:
        config = problem(name)
        for method in methods:
            bench.log(f"{name} {method}")
            cap_here = cap or METHODS[method][2]
            cells.setdefault(name, {})[method] = cell(config, DATASETS[name], method, cap_here, args.seed)
            bench.save(section)
    section["cells"] = {d: {m: cells[d][m] for m in METHODS if m in cells[d]} for d in DATASETS if d in cells}
    section["claims"] = [c for name, cells in section["cells"].items() for c in claims(name, cells)]
    section["misses"] = [f"{c['dataset']}: {c['claim']}: no; {c['text']}" for c in section["claims"]
                         if c["holds"] is False]
    for line in section["claims"]:
        print(f"{line['dataset']}: {line['claim']}: {line['holds']}; {line['text']}")
    part.update(finished=True, load_avg_after=load(), wall_s=round(time.perf_counter() - bench.start, 1))
    return bench.finish(section)


BENCH = Bench("compressed", run, "the FedNL paper's comparison: bits, rounds and passes to 1e-12",
              only=tuple(METHODS),
              options=(option("--datasets", nargs="+", choices=list(DATASETS), default=list(DATASETS)),
                       option("--cap", type=count, default=None, help="every row's round cap (default: its own)"),
                       option("--seed", type=int, default=0)))
