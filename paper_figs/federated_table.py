"""The federated benchmark's tables, from its JSON (the ``federated*`` sections of scripts/bench_federated.py).

    dane figures federated_table [--json results/bench.json ...]
        [--section federated federated_mild federated_quadratic] [--page docs/benchmarks.md] [--print]

Per setting of scripts/bench_federated.py (section ``federated``: the hard one, m = 100; ``federated_mild``:
fewer clients, a larger α; ``federated_quadratic``: the S-DANE paper's quadratic), writes a markdown table between
docs/benchmarks.md's ``<!-- federated-table:begin -->`` and ``<!-- federated-table:end -->`` lines (the others':
``federated-mild-table``, ``federated-quadratic-table``; ``--print``: to stdout instead): per number of sampled
clients s and method, the rounds to each target at its defaults with the fewest of its grid in parentheses, the
participants' uplink and downlink bytes and the clients' local work to the last target at defaults (gradient passes,
``local_passes``, and beside them the Hessian-vector products, Hessians formed and factorizations), the best
relative suboptimality the defaults reached and how the default run ended, the round caps, then each axis's leader
to the last target (fewest rounds, uplink bits, downlink bits, local passes, the passes ranked only among rows of one
kind: `fewest`), no method ranked on one axis alone;
a provenance line names the JSON file(s) as given to ``--json`` (give
them relative to the checkout's root), each run's start and load average, the commit(s) of the rows, the data, the sharding and the
measured Hessian dissimilarity.  The quadratic's block adds the rounds of DANE, S-DANE and Acc-S-DANE at each
prox weight of its grid (multiples of δ_A, DANE's μ on the same multiples) and the comparisons the S-DANE paper
states, each worded from the data (`quadratic_claims`).  No number is typed by hand: rerun the benchmark, then
this.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from dane.paper_figs.blocks import (NOT_RECORDED, SECOND_ORDER, SECOND_ORDER_NOTE, count, kind, method_label, publish,
                                    second_order_cells, second_order_text)
from dane.paper_figs.common import bench_parser
from dane.paper_figs.provenance import commits_text

BEGIN, END = "<!-- federated-table:begin -->", "<!-- federated-table:end -->"
#: JSON section -> the page's markers of its table
SECTIONS = {"federated": (BEGIN, END),
            "federated_mild": ("<!-- federated-mild-table:begin -->", "<!-- federated-mild-table:end -->"),
            "federated_quadratic": ("<!-- federated-quadratic-table:begin -->",
                                    "<!-- federated-quadratic-table:end -->")}
PAGE = Path("docs") / "benchmarks.md"  # relative to the checkout's root, where `make bench` runs
#: a table's rows (the benchmark's methods), whatever the order of the runs it joins
ORDER = {method: i for i, method in enumerate(
    ("sdane", "acc_sdane", "feddane", "fedred", "fedprox", "scaffold", "fedavg", "scaffnew", "gd", "dane"))}


def rounds(run: dict | None, target: str) -> str:
    hit = None if run is None else run.get("targets", {}).get(target)
    return "—" if hit is None else str(hit["rounds"])


def megabytes(run: dict, target: str) -> str:
    """Uplink MB (the federated methods' participants), or the communicator's bytes for GD and DANE (marked *)."""
    hit = run.get("targets", {}).get(target)
    if hit is None:
        return "—"
    uplink = hit.get("uplink_bytes")
    return mb(uplink) if uplink is not None else f"{mb(hit['bytes_sent'])}*"


def downlink_megabytes(run: dict, target: str) -> str:
    """Downlink MB (what the server sent the sampled clients, summed over them); * for GD and DANE, whose ring
    bytes are the uplink column's (no server, no downlink of its own); — where it was not reached or not counted."""
    hit = run.get("targets", {}).get(target)
    if hit is None:
        return "—"
    downlink = hit.get("downlink_bytes")
    return mb(downlink) if downlink is not None else "*" if hit.get("uplink_bytes") is None else "—"


def mb(nbytes: int) -> str:
    """Megabytes, two decimals (never three digits after a 9: tests/doc_blocks.py reads those as accuracies)."""
    return f"{nbytes / 1e6:.2f}" if nbytes >= 1e4 else f"{nbytes / 1e6:.1e}"


def passes(run: dict, target: str) -> str:
    """Local gradient passes to ``target`` (the records' cumulative ``local_passes``, summed over clients); —
    where it was not reached or a record of old holds no count."""
    hit = run.get("targets", {}).get(target)
    return count(None if hit is None else hit.get("local_passes"))


def fewest(rows: list[dict], target: str) -> str:
    """Each axis's leader among the defaults that reach ``target``, no method ranked on one axis alone: the fewest
    rounds, clients' uplink bits, downlink bits and local passes, each with its number; ties named together, a count
    no row holds: —.  Uplink and downlink bits rank only the methods with a server (their records' ``uplink_bytes``
    and ``downlink_bytes``, summed over the participants): GD's and DANE's communicator bytes are one worker's
    share of a ring, another unit.  Local passes rank only among rows of one `kind`: the first-order rows, and
    apart from them the rows with second-order work, whose winner's HVPs, Hessians and factorizations are named
    beside its passes; a row that did not record those counts is named, not ranked."""
    measures = {"rounds": lambda hit: hit["rounds"],
                "clients' uplink bits": lambda hit: None if hit.get("uplink_bytes") is None else 8 * hit["uplink_bytes"],
                "downlink bits": lambda hit: None if hit.get("downlink_bytes") is None else 8 * hit["downlink_bytes"]}
    hits = [(row["method"], row["default"].get("targets", {}).get(target)) for row in rows]
    hits = [(method, hit) for method, hit in hits if hit is not None]
    parts = []
    for name, measure in measures.items():
        values = {method: measure(hit) for method, hit in hits if measure(hit) is not None}
        if not values:
            parts.append(f"fewest {name}: —")
            continue
        low = min(values.values())
        winners = " and ".join(method_label(m) for m, v in values.items() if v == low)
        parts.append(f"fewest {name}: {winners} ({count(low)})")
    return f"To {target} at defaults, each axis's leader: " + "; ".join(parts + [fewest_passes(hits)]) + "."


def fewest_passes(hits: list[tuple[str, dict]]) -> str:
    """`fewest`'s local passes: per `kind`, the fewest passes (for the second-order rows with the winners' other
    counts); the rows whose kind was not recorded, named with their passes."""
    counted = [(method, hit) for method, hit in hits if hit.get("local_passes") is not None]
    if not counted:
        return "fewest local passes: —"
    parts = []
    for group, name in (("first-order", "first-order rows"), ("second-order", "rows with second-order work")):
        values = {method: hit for method, hit in counted if kind(hit) == group}
        if values:
            low = min(hit["local_passes"] for hit in values.values())
            winners = [(m, hit) for m, hit in values.items() if hit["local_passes"] == low]
            named = [f"{method_label(m)} ({count(low)} passes; {second_order_text(hit)})" for m, hit in winners] \
                if group == "second-order" else [" and ".join(method_label(m) for m, _ in winners) + f" ({count(low)})"]
            parts.append(f"fewest local passes among {name}: {' and '.join(named)}")
    unknown = [f"{method_label(m)} ({count(hit['local_passes'])})" for m, hit in counted if kind(hit) is None]
    if unknown:
        parts.append(f"local passes not ranked ({', '.join(SECOND_ORDER.values())} not recorded): {', '.join(unknown)}")
    return "; ".join(parts)


def best_per_target(row: dict, targets: list[str]) -> dict:
    """Per target: the fewest rounds of the default and the grid's runs, and that run's settings (None: none)."""
    out = {}
    for t in targets:
        reached = [run for run in [row["default"], *row["grid"]] if run.get("targets", {}).get(t) is not None]
        top = min(reached, key=lambda run: run["targets"][t]["rounds"]) if reached else None
        out[t] = None if top is None else {"settings": top["settings"], "rounds": top["targets"][t]["rounds"]}
    return out


def method_row(row: dict, targets: list[str]) -> str:
    default, per_target = row["default"], best_per_target(row, targets)
    best_rounds = {t: "—" if per_target.get(t) is None else str(per_target[t]["rounds"]) for t in targets}
    cells = [f"{rounds(default, t)} ({best_rounds[t]})" for t in targets]
    rel = default.get("best_rel_suboptimality")
    rel_text = "—" if rel is None or isinstance(rel, str) else f"{rel:.1e}"
    reached = [t for t in targets if per_target.get(t) is not None]
    if reached:  # the setting best at the tightest target any setting reached
        settings = per_target[reached[-1]]["settings"]
        setting = (json.dumps(settings) if settings else "default") + \
            ("" if reached[-1] == targets[-1] else f" (to {reached[-1]})")
    else:
        setting = "—"
    return (f"| {method_label(row['method'])} | " + " | ".join(cells) +
            f" | {megabytes(default, targets[-1])} | {downlink_megabytes(default, targets[-1])} | "
            f"{passes(default, targets[-1])} | "
            + " | ".join(second_order_cells(default.get("targets", {}).get(targets[-1]))) +
            f" | {rel_text} | {default['status']} | {setting} |")


SETTING = ("dataset", "workers", "sharding", "lam", "seed", "quick", "targets", "round_caps")  # what combined runs share


def combine(reports: list[dict]) -> dict:
    """One report from runs of the same setting split by ``--clients`` (say, s = 100 and s = 10 run side by side)
    or by ``--only``: their rows together (a later report's row replaces an earlier one's), s in the order given,
    every run's start and load average kept."""
    first = reports[0]
    for other in reports[1:]:
        # a key one report lacks is not compared: reports from before it was recorded (round_caps) hold no value
        differs = [k for k in SETTING if k in other and k in first and other[k] != first[k]]
        if differs:
            raise SystemExit(f"error: the federated reports differ in {', '.join(differs)}; render them one at a time")
    return {**first, "clients": list(dict.fromkeys(s for r in reports for s in r["clients"])),
            "rows": {k: {**v, "code": row_code(r, v)} for r in reports for k, v in r["rows"].items()},
            "runs": [run for r in reports for run in r.get("runs") or
                     [{"started_at": r.get("started_at", "?"), "load_avg": r["machine"].get("load_avg")}]]}


def row_code(report: dict, row: dict) -> dict | None:
    """The code ``row`` was measured with: its own ``code`` (scripts/bench_federated.py writes one per row), else the
    report's where the report is one run's, else None (a row merged from an ``--only`` run of old: the report's
    ``code`` is the last run's alone)."""
    return row.get("code") or (report.get("code") if len(report.get("runs") or [report]) == 1 else None)


def provenance(report: dict, sources: list[str]) -> str:
    """The caption's first sentences: the JSON file(s), each run's start and load average, and the commit(s) of the
    rows shown (`row_code`, `dane.paper_figs.provenance.commits_text`)."""
    runs = report.get("runs") or [{"started_at": report.get("started_at", "?"), "load_avg": report["machine"].get("load_avg")}]
    run = "; ".join(f"{r['started_at']}, load average {r['load_avg']}" for r in runs) + \
        (" (--quick)" if report.get("quick") else "")
    files = f" {', '.join(sources)}" if sources else ""
    codes = [row_code(report, row) for row in report["rows"].values() if "default" in row]
    return (f"Generated by `dane figures federated_table` from scripts/bench_federated.py's JSON{files} ({run}). "
            f"{commits_text(codes)}")


def problem_text(report: dict) -> str:
    """The problem, the clients and the measured dissimilarity at w_0."""
    similarity = report["similarity"]
    measured = (f"delta = {similarity['delta']:.2e}, delta_A = {similarity['delta_mean_square']:.2e}, "
                f"||H|| = {similarity['hessian_norm']:.2e}")
    if report["dataset"] == "quadratic":
        return (f"The S-DANE paper's quadratic at a controlled dissimilarity (ControlledQuadratic): d={similarity['dim']}, "
                f"m={report['workers']} clients, every client in each round, L = 1, mu = {report['lam']:g}, delta = "
                f"{report['delta']:g} set; at w_0: {measured}.")
    return (f"Logistic regression (lam={report['lam']:g}, intercept) on {report['dataset']}, "
            f"{similarity['rows']} rows, d={similarity['dim']}, m={report['workers']} clients, {report['sharding']} "
            f"(shards of {similarity['shard_rows_min']} to {similarity['shard_rows_max']} rows); at w_0: {measured}.")


def grid_note(report: dict) -> str:
    """What the parentheses hold where a run had no grid: every row (``--defaults-only``), or the rows that a later
    ``--only`` run with grids did not replace (named, with their s)."""
    rows = [(key, row) for key, row in report["rows"].items() if "default" in row]
    bare = [(key, row) for key, row in rows if not row.get("grid")]
    if report.get("grids") is False and len(bare) == len(rows):
        return "; this run: defaults only, no grid"
    if not bare or report.get("grids") is not False and len(bare) == len(rows):
        return ""  # a grid-less report of old, or grids everywhere
    by_s: dict[str, list[str]] = {}
    for key, row in bare:
        by_s.setdefault(key.split("/", 1)[0].removeprefix("s="), []).append(method_label(row["method"]))
    named = "; ".join(f"{', '.join(methods)} at s = {s}" for s, methods in by_s.items())
    return f"; no grid run for {named}: the default alone"


def caps_text(report: dict) -> str:
    """The round caps, each with the methods that ran under it (the rows' ``round_cap``), else the report's
    ``round_caps`` as recorded; "" where it records neither."""
    per: dict[int, list[str]] = {}
    for row in sorted((r for r in report["rows"].values() if "default" in r),
                      key=lambda r: ORDER.get(r["method"], len(ORDER))):
        if row["default"].get("round_cap") is not None:
            per.setdefault(row["default"]["round_cap"], []).append(method_label(row["method"]))
    if per:
        return " Round caps: " + "; ".join(f"{cap} rounds ({', '.join(dict.fromkeys(names))})"
                                           for cap, names in sorted(per.items())) + "."
    caps = report.get("round_caps")
    return " Round caps: " + ", ".join(f"{k} {v}" for k, v in caps.items()) + "." if caps else ""


def render(report: dict, sources: list[str] = ()) -> str:
    """The section's block: the caption, a table per s and, for the quadratic, the prox-weight table."""
    targets = report["targets"]
    setting = f"Setting {report['setting']}: " if report.get("setting") else ""
    grids = grid_note(report)
    lines = [f"{provenance(report, sources)} {setting}{problem_text(report)} Target: {report['target']}. Rounds at defaults "
             f"(the fewest of its grid, the default included, in parentheses{grids}; —: not reached within the round cap).{caps_text(report)} "
             f"Uplink: the sampled clients' bytes to the last target at defaults, summed over them (*: GD and DANE have "
             f"no server: one worker's bytes under the ring's count, not comparable with a sum over the clients, and "
             f"not ranked); downlink: the server's bytes to the sampled clients, summed over them (*: GD and DANE, "
             f"their ring's bytes are in the uplink column); "
             f"local passes: the clients' local gradient passes to it, summed (—: not recorded); "
             f"{SECOND_ORDER_NOTE} (—: not reached, or {NOT_RECORDED}). The fewest local passes are ranked only "
             f"among rows of one kind, the first-order rows (no HVP, Hessian or factorization counted) apart from the "
             f"rows with second-order work, whose winner's counts are named beside its passes; a row whose run did "
             f"not record them is named, not ranked."]
    for s in report["clients"]:
        rows = sorted((row for key, row in report["rows"].items() if key.startswith(f"s={s}/") and "default" in row),
                      key=lambda row: ORDER.get(row["method"], len(ORDER)))
        if not rows:
            continue
        lines += ["", f"**s = {s} of {report['workers']} clients per round**", "",
                  "| method | " + " | ".join(f"rounds to {t}" for t in targets) +
                  f" | uplink MB to {targets[-1]} | downlink MB to {targets[-1]} | local passes to {targets[-1]} | " +
                  " | ".join(SECOND_ORDER.values()) + " | best rel. suboptimality | default ended | best setting |",
                  "|---|" + "---|" * (len(targets) + 6 + len(SECOND_ORDER))]
        lines += [method_row(row, targets) for row in rows]
        lines += ["", fewest(rows, targets[-1])]
    skipped = sorted({key.split("/", 1)[1] for key, row in report["rows"].items() if "skipped" in row} |
                     {m for m, spec in report.get("methods", {}).items() if not spec.get("samples_clients", True)
                      and any(s < report["workers"] for s in report["clients"])})
    if skipped:
        lines += ["", f"At s < m: {', '.join(method_label(m) for m in skipped)} not run (no client sampling)."]
    lines += missing_rows(report)
    if report["dataset"] == "quadratic" and report.get("grids") is not False:
        lines += ["", *prox_table(report)]
    return "\n".join(lines)


def missing_rows(report: dict) -> list[str]:
    """A line per s naming the methods of the run (``methods``) with no row there (a run stopped, or a row that
    failed and was not rerun), and the command that adds them."""
    lines = []
    for s in report["clients"]:
        absent = [m for m, spec in report.get("methods", {}).items() if f"s={s}/{m}" not in report["rows"]
                  and (spec.get("samples_clients", True) or s == report["workers"])]
        if absent:
            lines += ["", f"Not in this JSON at s = {s}: {', '.join(method_label(m) for m in absent)} (python -m "
                          f"scripts.bench federated --setting {report.get('setting') or 'hard'} --clients {s} --only "
                          f"{' '.join(absent)} adds them)."]
    return lines


#: the quadratic's methods, in the prox-weight table's column order
QUADRATIC_COLUMNS = ("dane", "sdane", "acc_sdane")


def prox_multiple(settings: dict) -> float | None:
    """The grid setting's prox weight as a multiple of δ_A (``lam_per_delta``, ``mu_per_delta``; 0 for ``mu: 0``)."""
    for key in ("lam_per_delta", "mu_per_delta"):
        if key in settings:
            return float(settings[key])
    return 0.0 if settings.get("mu") == 0 else None


def multiple_text(c: float, delta_a: float) -> str:
    if c == 0:
        return "0"
    name = "delta_A" if c == 1 else f"delta_A/{round(1 / c)}" if abs(1 / c - round(1 / c)) < 1e-9 else f"{c:g} delta_A"
    return f"{name} = {c * delta_a:.2e}"


def rank_key(run: dict, targets: list[str]) -> tuple:
    """Fewer rounds first: rounds to the last target, then to the ones before (a target not reached counts as
    infinitely many rounds), then the best relative suboptimality."""
    hits = [run.get("targets", {}).get(t) for t in reversed(targets)]
    best = run.get("best_rel_suboptimality")
    return (*(math.inf if h is None else h["rounds"] for h in hits),
            math.inf if best is None or isinstance(best, str) else best)


#: best relative suboptimalities closer than this are equal: each is a difference of two objective values, so runs
#: with the same iterates (S-DANE and DANE at equal prox weight) differ by round-off, about 1e-10 relative at 1e-8
SAME_BEST_RTOL = 1e-6


def compare(a: dict, b: dict, targets: list[str]) -> str:
    """``fewer``, ``as many`` or ``more``: run a against run b by `rank_key`, the best to `SAME_BEST_RTOL`."""
    ka, kb = rank_key(a, targets), rank_key(b, targets)
    if ka[:-1] != kb[:-1]:
        return "fewer" if ka[:-1] < kb[:-1] else "more"
    if ka[-1] == kb[-1] or math.isclose(ka[-1], kb[-1], rel_tol=SAME_BEST_RTOL):
        return "as many"
    return "fewer" if ka[-1] < kb[-1] else "more"


def prox_cell(run: dict | None, targets: list[str]) -> str:
    """``rounds to each target`` joined by /, and the best relative suboptimality where the last was not reached."""
    if run is None:
        return ""
    cell = " / ".join(rounds(run, t) for t in targets)
    best = run.get("best_rel_suboptimality")
    if run.get("targets", {}).get(targets[-1]) is None and isinstance(best, float):
        cell += f" (best {best:.1e})"
    return cell


def by_multiple(report: dict) -> dict[str, dict[float, dict]]:
    """Method -> prox multiple of δ_A -> its grid run, at full participation."""
    s = report["workers"]
    out = {}
    for method in QUADRATIC_COLUMNS:
        row = report["rows"].get(f"s={s}/{method}")
        if row and "grid" in row:
            out[method] = {prox_multiple(run["settings"]): run for run in row["grid"]
                           if prox_multiple(run["settings"]) is not None}
    return out


def prox_table(report: dict) -> list[str]:
    """Rounds to each target of DANE (μ), S-DANE and Acc-S-DANE (λ) at each prox weight, then the claims."""
    targets, delta_a = report["targets"], report["similarity"]["delta_mean_square"]
    runs = by_multiple(report)
    columns = [m for m in QUADRATIC_COLUMNS if m in runs]
    defaults = {m: report["rows"][f"s={report['workers']}/{m}"]["default"] for m in columns}
    lines = [f"**Rounds to {' / '.join(targets)} at each prox weight** (DANE's μ, unsafeguarded, and S-DANE's and "
             f"Acc-S-DANE's λ, as multiples of delta_A; the defaults' own weight in the first row)", "",
             "| prox weight | " + " | ".join(method_label(m).removesuffix(" (safeguarded)") for m in columns) + " |", "|---|" + "---|" * len(columns)]

    def weight(run):
        value = run.get("prox_weight")
        return "" if value is None else f" at {value:.2e}"

    lines.append("| defaults | " + " | ".join(f"{prox_cell(defaults[m], targets)}{weight(defaults[m])}"
                                              for m in columns) + " |")
    multiples = sorted({c for m in columns for c in runs[m]})
    for c in multiples:
        lines.append(f"| {multiple_text(c, delta_a)} | " +
                     " | ".join(prox_cell(runs[m].get(c), targets) for m in columns) + " |")
    claims = quadratic_claims(report)
    return lines + (["", " ".join(claims)] if claims else [])


def quadratic_claims(report: dict) -> list[str]:
    """The S-DANE paper's comparisons, each worded from the runs (`rank_key`: fewer rounds to the last target, then
    the earlier ones, then a lower best): Acc-S-DANE against S-DANE at each shared λ, S-DANE against DANE at
    equal prox weight, DANE's default (μ = 0, exact solves) against S-DANE's."""
    targets, delta_a = report["targets"], report["similarity"]["delta_mean_square"]
    runs = by_multiple(report)
    sentences = [f"Compared by rounds to the last target, then to the earlier ones, then by the best relative "
                 f"suboptimality (equal within a relative {SAME_BEST_RTOL:g})."]

    def verdict(a: dict, b: dict) -> str:
        return compare(a, b, targets)

    def weights(cs):
        return ", ".join(multiple_text(c, delta_a).split(" = ")[0] for c in cs)

    if "sdane" in runs and "acc_sdane" in runs:
        shared = sorted((c for c in runs["sdane"] if c in runs["acc_sdane"] and c > 0), reverse=True)
        found = {c: verdict(runs["acc_sdane"][c], runs["sdane"][c]) for c in shared}
        if shared and all(v == "fewer" for v in found.values()):
            sentences.append(f"Acc-S-DANE needs fewer rounds than S-DANE at every lambda of the grid ({weights(shared)}).")
        elif shared:
            sentences.append("Acc-S-DANE against S-DANE: " + "; ".join(
                f"{v} rounds at {weights([c])}" for c, v in found.items()) + ".")
    if "sdane" in runs and "dane" in runs:
        shared = sorted((c for c in runs["sdane"] if c in runs["dane"] and c > 0), reverse=True)
        found = {c: verdict(runs["sdane"][c], runs["dane"][c]) for c in shared}
        equal_weight_holds = bool(shared) and all(v != "more" for v in found.values())
        if shared and all(v == "as many" for v in found.values()):
            sentences.append(f"At equal prox weight (lambda = mu = {weights(shared)}) S-DANE takes as many rounds as "
                             f"DANE, to each target: with exact solves and every client in each round it is DANE with "
                             f"eta = 1, mu = lambda.")
        elif shared:
            sentences.append("S-DANE against DANE at equal prox weight: " + "; ".join(
                f"{v} rounds at {weights([c])}" for c, v in found.items()) + ".")
        rows = {m: report["rows"].get(f"s={report['workers']}/{m}") for m in ("dane", "sdane")}
        if all(rows.values()):
            dane, sdane = rows["dane"]["default"], rows["sdane"]["default"]
            v = verdict(dane, sdane)
            lam = "its default lambda" if sdane.get("prox_weight") is None else f"lambda = {sdane['prox_weight']:.2e}"
            sentences.append(f"At the defaults DANE (mu = 0, safeguarded: exact Newton-type local solves) needs {v} "
                             f"rounds {'as' if v == 'as many' else 'than'} S-DANE ({lam})" +
                             (", so the paper's \"S-DANE in no more rounds than DANE\" holds at equal prox weight only."
                              if v == "fewer" and equal_weight_holds else "."))
    return sentences


def main(argv: list[str] | None = None) -> None:
    parser = bench_parser(__doc__, PAGE,
                          several="one JSON, or several runs of one setting split by --clients (their rows together)")
    parser.add_argument("--section", nargs="+", choices=list(SECTIONS), default=None,
                        help="the settings to render (default: every one the JSON holds)")
    args = parser.parse_args(argv)
    benches = [(path, json.loads(Path(path).read_text())) for path in args.json]
    sections = args.section or [k for k in SECTIONS if any(k in bench for _, bench in benches)]
    if not sections:
        raise SystemExit(f"error: {', '.join(args.json)} holds no federated section; run python -m scripts.bench "
                         f"federated first")
    for section in sections:
        reports = [bench[section] for _, bench in benches if section in bench]
        if not reports:
            raise SystemExit(f"error: {', '.join(args.json)} holds no {section} section; run "
                             f"python -m scripts.bench federated --setting {section.removeprefix('federated').strip('_') or 'hard'}")
        sources = [path for path, bench in benches if section in bench]
        publish(render(combine(reports), sources), args.page, *SECTIONS[section], args.print)


if __name__ == "__main__":
    main()
