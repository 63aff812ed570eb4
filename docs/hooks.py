"""MkDocs hook: the methods tables, generated at build time from the registry ``conf/algorithm/*.yaml``.

A page line ``<!-- methods-table -->`` becomes a table of every method: its config name,
the one line its yaml opens with, and what its class declares it supports
(`dane.algorithm.Algorithm`'s capabilities).  ``<!-- methods-table: NAME -->`` keeps the
methods whose class declares the capability NAME, or whose yaml has the key NAME, and then
shows that key's own comment in the yaml.  A method added as one yaml and one
file appears here without anyone editing a page; tests/test_docs.py checks the README's
methods table against the same rows.
"""
from __future__ import annotations

import re
from pathlib import Path

from dane.algorithm import algorithm_built_by

CONF = Path(__file__).resolve().parents[1] / "conf" / "algorithm"
MARKER = re.compile(r"^<!-- methods-table(?::\s*(\w+))? -->$", re.M)
#: capability (a class attribute of `dane.algorithm.Algorithm`) -> column heading
CAPABILITIES = {"compressed_messages": "compressed", "elastic": "Horovod elastic", "asynchronous": "asynchronous",
                "batchable": "batched simulator"}
#: declarations a table can be filtered by without a column in every table: the tuple the class declares is shown
#: (``compressible``: the kinds of message ``comm.compress`` may compress, `dane.comm.compression`)
LISTS = {"compressible": "messages comm.compress compresses"}



def summary(path: Path) -> str:
    """The first sentence of the comment a yaml opens with (an indented ``#   example`` line ends the comment)."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#") or line.startswith("#  ") or line.startswith("# @package"):
            break
        lines.append(line[1:].strip())
    text = " ".join(lines)
    first = re.match(r"(.+?\.)(?=\s+[A-Z]|\s*$)", text)
    return (first.group(1) if first else text).replace("|", "\\|")


def keys(path: Path) -> dict[str, str]:
    """The yaml's top-level keys (a line ``key:`` at the left margin), each with its comment on that line."""
    return {key: comment.strip() for key, comment in re.findall(r"^(\w+):[^#\n]*(?:#(.*))?$", path.read_text(), re.M)}


def target(path: Path) -> str:
    found = re.search(r"^_target_:\s*(\S+)", path.read_text(), re.M)
    if found is None:
        raise ValueError(f"{path} has no _target_ line; every conf/algorithm/*.yaml names its config class")
    return found.group(1)


def registry(conf: Path = CONF) -> list[dict]:
    """One entry per ``conf/algorithm/<name>.yaml``, sorted by name: name, summary, target, its keys (with their
    comments) and the `CAPABILITIES` its class declares."""
    rows = []
    for path in sorted(conf.glob("*.yaml")):
        cls = algorithm_built_by(target(path))
        rows.append({"name": path.stem, "summary": summary(path), "target": target(path),
                     "keys": keys(path),
                     **{cap: bool(getattr(cls, cap, False)) for cap in CAPABILITIES},
                     **{name: tuple(getattr(cls, name, ())) for name in LISTS}})
    return rows


def methods_table(only: str | None = None, conf: Path = CONF) -> str:
    every = registry(conf)
    if only in LISTS:  # the methods that declare some, with what they declare
        lines = [f"| `algorithm=` | one round | {LISTS[only]} |", "|---|---|---|"]
        return "\n".join(lines + [f"| `{r['name']}` | {r['summary']} | {', '.join(r[only])} |" for r in every if r[only]])
    if only is not None and only not in CAPABILITIES and not any(only in r["keys"] for r in every):
        raise ValueError(f"methods-table: {only} is neither a capability ({', '.join(CAPABILITIES)}) nor a key of "
                         "any conf/algorithm/*.yaml")
    if only is not None and only not in CAPABILITIES:  # a key: the methods that take it, with what their yaml says
        lines = [f"| `algorithm=` | one round | `{only}` |", "|---|---|---|"]
        return "\n".join(lines + [f"| `{r['name']}` | {r['summary']} | {r['keys'][only].replace('|', chr(92) + '|')} |"
                                  for r in every if only in r["keys"]])
    rows = [r for r in every if only is None or r[only]]
    if not rows:
        return f"None of the {len(every)} methods of `conf/algorithm/` declares `{only}` yet."
    lines = ["| `algorithm=` | one round | " + " | ".join(CAPABILITIES.values()) + " |",
             "|---|---|" + "---|" * len(CAPABILITIES)]
    lines += [f"| `{r['name']}` | {r['summary']} | " + " | ".join("yes" if r[c] else "" for c in CAPABILITIES) + " |"
              for r in rows]
    return "\n".join(lines)


def on_page_markdown(markdown: str, **_) -> str:
    return MARKER.sub(lambda m: methods_table(m.group(1)), markdown)
