"""The defaults benchmark's tables, from its JSON (section ``defaults`` of scripts/bench_defaults.py).

    dane figures defaults_table [--json results/bench.json ...] [--page docs/benchmarks.md] [--print]

Writes two markdown tables between docs/benchmarks.md's ``<!-- defaults-table:begin -->`` and
``<!-- defaults-table:end -->`` lines for the Newton-type family and the first-order baselines, and two
between ``<!-- defaults-federated-table:begin -->`` and ``...:end -->`` for the federated DANE line
(`FEDERATED`), each only when the JSON holds its methods (``--print``: to stdout instead): per method, how
many cells converge at its defaults and how far its defaults are from its own best grid
setting, its median bytes to the target where the JSON records them (else the legend says the allreduces' sizes
differ by method), and its median local work to the target (passes, HVPs, Hessians formed, factorizations); per cell, each
method's allreduces to relative 1e-8 at its defaults, with its
best on the grid in parentheses.  No number is typed by hand: rerun the benchmark, then
this.  Several ``--json`` files are runs of the same cells split by ``--only`` (say, the federated line's
second-order and first-order methods run side by side): their methods are put together per cell.
"""
from __future__ import annotations

import statistics
from pathlib import Path

from dane.paper_figs.blocks import NOT_RECORDED, SECOND_ORDER, SECOND_ORDER_NOTE, count, method_label, publish
from dane.paper_figs.common import bench_parser
from dane.paper_figs.provenance import bench_section, commits_text

BEGIN, END = "<!-- defaults-table:begin -->", "<!-- defaults-table:end -->"
PAGE = Path("docs") / "benchmarks.md"  # relative to the checkout's root, where `make bench` runs
FEDERATED_BEGIN, FEDERATED_END = "<!-- defaults-federated-table:begin -->", "<!-- defaults-federated-table:end -->"
#: the federated DANE line's methods (``make bench`` section ``defaults`` runs them on the same cells as the others),
#: whose tables have their own block
FEDERATED = ("sdane", "acc_sdane", "feddane", "fedred", "fedprox", "fedavg", "scaffold", "scaffnew",
             "scaffold_option1", "scaffold_k3", "scaffold_k30")



#: the legend of the bytes column, where the JSON records them
BYTES_NOTE = ("MB sent: the median over the same cells of the communicator's bytes to the target (`bytes_sent`, one "
              "worker's under the ring's count; —: not recorded): an allreduce's size differs by method.")
#: the legend where it does not: what the allreduce columns then leave out
NO_BYTES_NOTE = ("Allreduces are counted, not their bytes, whose sizes differ by method (GIANT's line-search "
                 "allreduce carries its K trial objectives, a gradient's d numbers): this JSON records no bytes to "
                 "the target.")


def methods_of(report: dict, group: tuple[str, ...] | None) -> list[str]:
    """The report's methods in ``group`` (None: those in no group, the older families)."""
    found = dict.fromkeys(m for cell in report["cells"].values() for m in cell["methods"])
    return [m for m in found if (m in group if group is not None else m not in FEDERATED)]


def method_rows(report: dict, group: tuple[str, ...] | None = None) -> list[str]:
    """Per method: converged / diverged at defaults, within its goal factor, median and worst ratio, and the medians
    over cells of the clients' local work to the target at defaults: gradient passes (the records' ``local_passes``)
    and, beside them, `SECOND_ORDER`'s counts, each over the cells that recorded it."""
    methods = methods_of(report, group)
    sent = has_bytes(report, group)
    lines = ["| method | converged at defaults | diverged at defaults | within goal of own best | goal | "
             "median ratio | worst ratio (cell) | " + "median MB sent to target | " * sent +
             "median local passes to target | " + " | ".join(f"median {name}" for name in SECOND_ORDER.values()) + " |",
             "|---|---|---|---|---|---|---|---|" + "---|" * (len(SECOND_ORDER) + sent)]
    for method in methods:
        rows = {key: cell["methods"][method] for key, cell in report["cells"].items() if method in cell["methods"]}
        converged = sum(r["default"]["reached"] for r in rows.values())
        floors = sum(r["default"]["status"] == "client_drift" for r in rows.values())
        diverged = sum(not r["no_divergence"] for r in rows.values())
        judged = {k: r for k, r in rows.items() if r["within_factor"] is not None}
        within = sum(bool(r["within_factor"]) for r in judged.values())
        ratios = {k: r["ratio"] for k, r in rows.items() if r["ratio"] is not None}
        median = f"{statistics.median(ratios.values()):.2f}" if ratios else "—"
        worst = max(ratios, key=ratios.get) if ratios else None
        worst_text = f"{ratios[worst]:.2f} ({worst})" if worst else "—"
        factor = next(iter(rows.values()))["factor"]
        shown = f"{converged}/{len(rows)}" + (f" (+{floors} at its drift floor)" if floors else "")
        passes = [r["default"]["local_passes"] for r in rows.values() if r["default"].get("local_passes") is not None]
        passes_text = f"{statistics.median(passes):g}" if passes else "—"  # — : records of old count none
        sent_text = f"{megabytes(rows.values())} | " if sent else ""
        lines.append(f"| {method_label(method)} | {shown} | {diverged} | {within}/{len(judged)} "
                     f"| {factor:g}x | {median} | {worst_text} | {sent_text}{passes_text} | " +
                     " | ".join(median_of(rows.values(), key) for key in SECOND_ORDER) + " |")
    return lines


def has_bytes(report: dict, group: tuple[str, ...] | None) -> bool:
    """Whether a row of ``group`` recorded its bytes to the target (``bytes_sent``: runs since the benchmark kept it)."""
    methods = methods_of(report, group)
    return any(row["default"].get("bytes_sent") is not None for cell in report["cells"].values()
               for m, row in cell["methods"].items() if m in methods)


def megabytes(rows) -> str:
    """The median over the rows' defaults of the communicator's bytes to the target (``bytes_sent``), in MB, over
    those that recorded it (—: none did)."""
    values = [r["default"]["bytes_sent"] for r in rows if r["default"].get("bytes_sent") is not None]
    return "—" if not values else f"{statistics.median(values) / 1e6:.2g}"


def median_of(rows, key: str) -> str:
    """The median over the rows' defaults of the count ``key`` to the target, over those that recorded it (—: none
    did: not reached, or a run from before the count)."""
    values = [r["default"][key] for r in rows if r["default"].get(key) is not None]
    return count(statistics.median(values) if values else None)


def entry(row: dict) -> str:
    default = row["default"]
    shown = str(default["comm_rounds"]) if default["reached"] else \
        {"diverged": "div", "error": "err", "client_drift": "floor"}.get(default["status"], "—")
    best = row["best"]
    return f"{shown} ({best['comm_rounds'] if best else '—'})"


def cell_rows(report: dict, group: tuple[str, ...] | None = None) -> list[str]:
    """Per cell: each method's allreduces at defaults (best on its grid)."""
    methods = methods_of(report, group)
    lines = ["| cell | " + " | ".join(method_label(m) for m in methods) + " |",
             "|---|" + "---|" * len(methods)]
    for key, cell in report["cells"].items():
        lines.append(f"| {key} | " + " | ".join(entry(cell["methods"][m]) if m in cell["methods"] else " "
                                                for m in methods) + " |")
    return lines


def combine(reports: list[dict]) -> dict:
    """One report from runs split by ``--only``: each cell's methods together (a later run's replace an earlier
    one's), the cells in first-seen order; the header names every run's start and load average."""
    if len(reports) == 1:
        return reports[0]
    cells: dict = {}
    for report in reports:
        if report.get("quick") != reports[0].get("quick"):
            raise SystemExit("error: the defaults reports mix --quick and full runs; render them one at a time")
        for key, cell in report["cells"].items():
            methods = {m: {**row, "code": row_code(report, row)} for m, row in cell["methods"].items()}
            cells[key] = {**cell, "methods": {**cells.get(key, {}).get("methods", {}), **methods}}
    started = "; ".join(f"{r.get('started_at', '?')}, load average {r['machine'].get('load_avg')}" for r in reports)
    return {**reports[0], "cells": cells, "runs": started}


def row_code(report: dict, row: dict) -> dict | None:
    """The code a method's row was measured with: its own ``code`` (scripts/bench_defaults.py writes one per row),
    else the report's where no ``--only`` run kept an earlier run's rows (``rerun_of``), else None."""
    return row.get("code") or (None if "rerun_of" in report else report.get("code"))


def render(report: dict, group: tuple[str, ...] | None = None, sources: list[str] = ()) -> str:
    """The block of ``group``'s methods (None: the methods outside `FEDERATED`), its caption naming ``sources``, the
    JSON files it was rendered from, and the commit(s) of the rows shown (`row_code`)."""
    run = report.get("runs") or f"{report.get('started_at', '?')}, load average {report['machine'].get('load_avg')}"
    run += " (--quick)" if report.get("quick") else ""
    files = f" {', '.join(sources)}" if sources else ""
    methods = methods_of(report, group)
    codes = [row_code(report, row) for cell in report["cells"].values() for m, row in cell["methods"].items()
             if m in methods]
    return "\n".join([
        f"Generated by `dane figures defaults_table` from scripts/bench_defaults.py's JSON{files} ({run}). "
        f"{commits_text(codes)} "
        f"Target: {report['target']}. Ratio: allreduces at defaults / the best grid setting's. Local work: per "
        f"method, the median over the cells that reached the target at defaults of each count to it, summed over the "
        f"clients: local gradient passes (—: not recorded); {SECOND_ORDER_NOTE} (—: no cell reached the target, or "
        f"{NOT_RECORDED}). " + (BYTES_NOTE if has_bytes(report, group) else NO_BYTES_NOTE),
        "", *method_rows(report, group), "",
        "Allreduces to the target at defaults (best grid setting in parentheses); div: diverged, floor: ended early "
        "at its client-drift fixed point, —: not reached within the cap" +
        ("; blank: not run on this cell." if any(m not in cell["methods"] for cell in report["cells"].values()
                                                   for m in methods) else "."), "", *cell_rows(report, group)])


def main(argv: list[str] | None = None) -> None:
    args = bench_parser(__doc__, PAGE, page_aliases=("--readme",),
                        several="one JSON, or several runs of the same cells split by --only (their methods together)"
                        ).parse_args(argv)
    reports = [bench_section(path, "defaults") for path in args.json]
    report = combine(reports)
    for group, begin, end in ((None, BEGIN, END), (FEDERATED, FEDERATED_BEGIN, FEDERATED_END)):
        if methods_of(report, group):  # a JSON of some methods (--only) leaves the other block as it is
            sources = [path for path, one in zip(args.json, reports) if methods_of(one, group)]
            publish(render(report, group, sources), args.page, begin, end, args.print)


if __name__ == "__main__":
    main()
