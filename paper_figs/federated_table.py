"""The federated benchmark's table, from its JSON (section ``federated`` of scripts/bench_federated.py).

    dane figures federated_table [--json results/bench.json ...] [--section federated federated_mild]
        [--page docs/benchmarks.md] [--print]

Per setting of scripts/bench_federated.py (section ``federated``: the hard one, m = 100; ``federated_mild``:
fewer clients, a larger α), writes a markdown table between docs/benchmarks.md's
``<!-- federated-table:begin -->`` and ``<!-- federated-table:end -->`` lines (the mild setting's:
``federated-mild-table``; ``--print``: to stdout instead): per number of sampled clients s
and method, the rounds to each target at its defaults with the fewest of its grid in parentheses, the
participants' uplink bytes to the last target at defaults, the best relative suboptimality the defaults
reached and how the default run ended; a provenance line names the data, the sharding and the measured
Hessian dissimilarity.  No number is typed by hand: rerun the benchmark, then this.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from dane.paper_figs.blocks import publish

BEGIN, END = "<!-- federated-table:begin -->", "<!-- federated-table:end -->"
#: JSON section -> the page's markers of its table
SECTIONS = {"federated": (BEGIN, END),
            "federated_mild": ("<!-- federated-mild-table:begin -->", "<!-- federated-mild-table:end -->")}
PAGE = Path("docs") / "benchmarks.md"  # relative to the checkout's root, where `make bench` runs
LABELS = {"sdane": "S-DANE", "acc_sdane": "Acc-S-DANE", "feddane": "FedDANE", "fedred": "FedRed", "fedprox": "FedProx",
          "scaffold": "SCAFFOLD", "fedavg": "FedAvg", "scaffnew": "Scaffnew", "gd": "GD", "dane": "DANE (safeguarded)"}


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


def mb(nbytes: int) -> str:
    """Megabytes, two decimals (never three digits after a 9: tests/doc_blocks.py reads those as accuracies)."""
    return f"{nbytes / 1e6:.2f}" if nbytes >= 1e4 else f"{nbytes / 1e6:.1e}"


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
    return (f"| {LABELS.get(row['method'], row['method'])} | " + " | ".join(cells) +
            f" | {megabytes(default, targets[-1])} | {rel_text} | {default['status']} | {setting} |")


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
            "rows": {k: v for r in reports for k, v in r["rows"].items()},
            "runs": [run for r in reports for run in r.get("runs") or
                     [{"started_at": r.get("started_at", "?"), "load_avg": r["machine"].get("load_avg")}]]}


def render(report: dict) -> str:
    similarity = report["similarity"]
    targets = report["targets"]
    runs = report.get("runs") or [{"started_at": report.get("started_at", "?"), "load_avg": report["machine"].get("load_avg")}]
    run = "; ".join(f"{r['started_at']}, load average {r['load_avg']}" for r in runs) + \
        (" (--quick)" if report.get("quick") else "")
    setting = f"Setting {report['setting']}: " if report.get("setting") else ""
    grids = "; this run: defaults only, no grid" if report.get("grids") is False else ""
    lines = [f"Generated by `dane figures federated_table` from scripts/bench_federated.py's JSON ({run}). "
             f"{setting}Logistic regression (lam={report['lam']:g}, intercept) on {report['dataset']}, "
             f"{similarity['rows']} rows, d={similarity['dim']}, m={report['workers']} clients, {report['sharding']} "
             f"(shards of {similarity['shard_rows_min']} to {similarity['shard_rows_max']} rows); at w_0: "
             f"delta = {similarity['delta']:.2e}, delta_A = {similarity['delta_mean_square']:.2e}, "
             f"||H|| = {similarity['hessian_norm']:.2e}. Target: {report['target']}. Rounds at defaults "
             f"(the fewest of its grid, the default included, in parentheses{grids}; —: not reached within the round cap); uplink: the sampled "
             f"clients' bytes to the last target at defaults (*: the communicator's bytes, GD and DANE have no "
             f"server)."]
    for s in report["clients"]:
        rows = [row for key, row in report["rows"].items() if key.startswith(f"s={s}/") and "default" in row]
        if not rows:
            continue
        lines += ["", f"**s = {s} of {report['workers']} clients per round**", "",
                  "| method | " + " | ".join(f"rounds to {t}" for t in targets) +
                  f" | uplink MB to {targets[-1]} | best rel. suboptimality | default ended | best setting |",
                  "|---|" + "---|" * (len(targets) + 4)]
        lines += [method_row(row, targets) for row in rows]
    skipped = sorted({key.split("/", 1)[1] for key, row in report["rows"].items() if "skipped" in row})
    if skipped:
        lines += ["", f"At s < m: {', '.join(LABELS.get(m, m) for m in skipped)} not run (no client sampling)."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", nargs="+", default=["results/bench.json"],
                        help="one JSON, or several runs of one setting split by --clients (their rows together)")
    parser.add_argument("--section", nargs="+", choices=list(SECTIONS), default=None,
                        help="the settings to render (default: every one the JSON holds)")
    parser.add_argument("--page", default=str(PAGE), help="the page whose block the table replaces (default: %(default)s)")
    parser.add_argument("--print", action="store_true", help="write the table to stdout, not into the page")
    args = parser.parse_args(argv)
    benches = [(path, json.loads(Path(path).read_text())) for path in args.json]
    sections = args.section or [k for k in SECTIONS if any(k in bench for _, bench in benches)]
    if not sections:
        raise SystemExit(f"error: {', '.join(args.json)} holds no federated section; run scripts/bench_federated.py "
                         f"first")
    for section in sections:
        reports = [bench[section] for _, bench in benches if section in bench]
        if not reports:
            raise SystemExit(f"error: {', '.join(args.json)} holds no {section} section; run "
                             f"scripts/bench_federated.py --setting {section.removeprefix('federated').strip('_') or 'hard'}")
        publish(render(combine(reports)), args.page, *SECTIONS[section], args.print)


if __name__ == "__main__":
    main()
