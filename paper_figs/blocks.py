"""Generated blocks of the docs' pages: a table between two HTML comment markers, replaced in place; the
benchmarks' method names as tables show them (`method_label`)."""
from __future__ import annotations

import functools
import re
from pathlib import Path

from dane.records.results import atomic_write_text


def replace_block(text: str, block: str, begin: str, end: str) -> str:
    """``text`` with the lines between the markers ``begin`` and ``end`` replaced by ``block``."""
    if begin not in text or end not in text:
        raise SystemExit(f"error: the page has no {begin} ... {end} block; add the two lines where the table goes")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{block}\n{end}{tail}"


def publish(block: str, page: str | Path, begin: str, end: str, print_only: bool) -> None:
    """Print ``block`` (``print_only``), or write it into ``page`` between ``begin`` and ``end``, atomically."""
    if print_only:
        print(block)
        return
    page = Path(page)
    atomic_write_text(page, replace_block(page.read_text(), block, begin, end))


#: a benchmark's rows that are not an algorithm's defaults: row name -> (algorithm, its label with {} for the class's)
VARIANTS = {"dane": ("dane", "{} (safeguarded)"), "dane_mu0": ("dane", "{} μ=0"),
            "scaffold_option1": ("scaffold", "{} opt. I"), "scaffold_k3": ("scaffold", "{} K=3"),
            "scaffold_k30": ("scaffold", "{} K=30")}


@functools.cache
def method_label(method: str) -> str:
    """A benchmark row's display name: its algorithm class's `dane.algorithm.Algorithm.label`, with the variant's
    qualifier (`VARIANTS`: ``dane_mu0`` is "DANE μ=0"); a name no algorithm has is shown as it is."""
    from dane.algorithm import label_of

    algorithm, form = VARIANTS.get(method, (method, "{}"))
    return form.format(label_of(algorithm))


#: the second-order local work the benchmarks keep beside the passes at their target (`scripts.harness.LOCAL_WORK`):
#: record key -> its column, the same three in every table; no table ranks methods on passes alone
SECOND_ORDER = {"local_hvps": "HVPs", "local_hessians": "Hessians", "local_factorizations": "factorizations"}
#: what the three columns hold, in every table's caption, then what their — means there
SECOND_ORDER_NOTE = ("HVPs, Hessians, factorizations: the Hessian-vector products, the Hessians formed and the "
                     "Cholesky factorizations or eigendecompositions to it, counted as the passes are by `dane.work`")
#: what a — of theirs means where the target was reached
NOT_RECORDED = ("not recorded: the row's run predates these counts, and its passes alone understate a Newton-type "
                "method's work")


def count(value: float | None, spec: str = "g") -> str:
    """A local-work count: — for None (not recorded), a whole number as one, else ``format(value, spec)``, never as
    0.9 followed by two digits (tests/doc_blocks.py reads those as a typed accuracy)."""
    if value is None:
        return "—"
    if float(value).is_integer():
        return str(int(value))
    text = format(value, spec)
    return f"{value:.2g}" if re.match(r"0?\.9\d\d", text) else text


def second_order_cells(hit: dict | None, spec: str = "g") -> list[str]:
    """The three `SECOND_ORDER` cells of a run's work to its target (None: not reached, all —)."""
    return [count(None if hit is None else hit.get(key), spec) for key in SECOND_ORDER]


def kind(hit: dict) -> str | None:
    """``second-order`` where the run counted an HVP, a Hessian or a factorization to its target, ``first-order``
    where it counted all three and each is 0, None where it did not record them all (a run of old)."""
    counts = [hit.get(key) for key in SECOND_ORDER]
    if any(counts):
        return "second-order"
    return "first-order" if all(c is not None for c in counts) else None


def second_order_text(hit: dict) -> str:
    """The nonzero `SECOND_ORDER` counts in words: ``3000 Hessians, 3000 factorizations``."""
    return ", ".join(f"{count(hit[key])} {name}" for key, name in SECOND_ORDER.items() if hit.get(key))
