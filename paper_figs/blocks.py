"""Generated blocks of the docs' pages: a table between two HTML comment markers, replaced in place; the
benchmarks' method names as tables show them (`method_label`)."""
from __future__ import annotations

import functools
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
            "scaffold_k30": ("scaffold", "{} K=30"),
            "fedavg": ("fedavg", "FedAvg")}  # FedProx's class at mu = 0 (conf/algorithm/fedavg.yaml)


@functools.cache
def method_label(method: str) -> str:
    """A benchmark row's display name: its algorithm class's `dane.algorithm.Algorithm.label`, with the variant's
    qualifier (`VARIANTS`: ``dane_mu0`` is "DANE μ=0"); a name no algorithm has is shown as it is."""
    from dane.algorithm import label_of

    algorithm, form = VARIANTS.get(method, (method, "{}"))
    return form.format(label_of(algorithm))
