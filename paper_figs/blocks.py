"""Generated blocks of the docs' pages: a table between two HTML comment markers, replaced in place."""
from __future__ import annotations

from pathlib import Path

from dane.results import atomic_write_text


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
