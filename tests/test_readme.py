"""The README is a front page, not a manual: short, its example runs, its commands and links exist, its methods
table is the registry's (conf/algorithm/*.yaml), and it quotes no measured number (the rest is in docs/)."""
from __future__ import annotations

import importlib.util
import re

import pytest

from doc_blocks import DOCS, REPO, blocks, check_command, commands, quoted_measurements
from dane.experiments.config import CONF_DIR

README = REPO / "README.md"
MAX_LINES = 250


def test_the_readme_is_a_front_page():
    text = README.read_text()
    assert len(text.splitlines()) <= MAX_LINES
    two = text.split("## The two commands", 1)[1]
    first = next(b for b in blocks(README) if b.lang == "bash" and b.code in two)
    assert [c.split("#")[0].split() for c in commands(first.code)] == [["make", "run"], ["make", "test"]]


def test_python_api_example_runs(capsys):
    code = next(b.code for b in blocks(README) if b.lang == "python")
    scope: dict = {}
    exec(compile(code, str(README), "exec"), scope)  # noqa: S102 - the README's own example
    status, comm_rounds, subopt = capsys.readouterr().out.split()
    # GIANT reaches the example's tol=1e-10 within its 100 rounds, three allreduces a round
    assert status == "converged" and float(subopt) <= 1e-10
    assert int(comm_rounds) == scope["result"].records[-1]["comm_rounds"] > 0
    assert scope["result"].w.shape == (31,)


@pytest.mark.parametrize("command", [c for b in blocks(README) if b.lang == "bash" for c in commands(b.code)])
def test_shell_commands_name_what_exists(command):
    check_command(command, CONF_DIR)


def test_links_reach_files():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text())
    assert links and sorted(link for link in links if not (REPO / link).is_file()) == []
    assert sorted({f"docs/{page.name}" for page in DOCS.glob("*.md")} - set(links)) == []  # every page is linked


def test_the_methods_table_is_the_registrys():
    """One row per conf/algorithm/<name>.yaml, sorted by name, saying what its opening comment says (the docs'
    table is generated from the same lines at build time, with each method's capabilities)."""
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    rows = re.findall(r"^\| `(\w+)` \| (.*) \|$", README.read_text().split("## Methods", 1)[1].split("\n## ", 1)[0],
                      re.M)
    wanted = [(path.stem, hooks.summary(path)) for path in sorted((CONF_DIR / "algorithm").glob("*.yaml"))]
    missing = "\n".join(f"| `{name}` | {text} |" for name, text in wanted if (name, text) not in rows)
    assert rows == wanted, f"the README's methods table is not conf/algorithm/'s; its rows, sorted by name:\n{missing}"


def test_the_readme_quotes_no_measured_results():
    """Measured numbers live in generated files (results/figures/*.json, results/bench.json, the docs' defaults
    table); a hand-copied accuracy, ratio or duration goes stale the day the code changes."""
    assert quoted_measurements(README.read_text()) == []
