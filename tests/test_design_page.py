"""The evidence is in the repository: docs/design.md names every module of dane/ and every key of a run's
summary.json, its account of the code (the run kinds' branches, the callbacks, the federated bases, the adaptations,
what baselines/ shares) is the code's, nothing cites the design brief that is not in the repository, every JSON cited as evidence is
tracked, and the generated tables of docs/benchmarks.md are what their tracked JSON renders to.  Reads files only:
the tracked names are listed once a session by the shared fresh interpreter (tests/runs.py), which runs the one
``git ls-files``, and the small run whose summary the page must name is a row of the shared batch."""
from __future__ import annotations

import functools
import json
import re
import subprocess
from pathlib import Path

import pytest

import runs
from helpers import REPO

DESIGN_PAGE = REPO / "docs" / "design.md"
BENCHMARKS_PAGE = REPO / "docs" / "benchmarks.md"
EVIDENCE = "paper_figs/evidence"
#: the name of the design brief kept outside the repository, spelled so that this file does not contain it
OUTSIDE_BRIEF = "DESIGN" + ".md"
#: results/ files that the pages name as a command's output, with the command that writes them: results/ is never
#: tracked, so a results/ path is allowed only as where a documented command writes, never as evidence
OUTPUTS = {"results/bench.json": "make bench", "results/calibration.json": "dane calibrate",
           "results/calibration_ps.json": "dane calibrate --topology ps",
           "results/sampled_lambda.json": "python -m scripts.bench sampled_lambda", "results/gpu.json": "make bench-gpu"}
#: the git-ignored folder the benchmarks' side runs went to, spelled so that this file does not cite it
RUN_FOLDER = "results/" + "bench_runs/"
#: a path after one of these is where a command writes, not a citation
DESTINATION = re.compile(r"(--out[ =]|default=\"?)$")


def git_ls_files(tmp: Path) -> list[str]:
    """In the fresh interpreter: the tracked names (``git ls-files``)."""
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return sorted(name for name in out.decode().split("\0") if name)


TRACKED = runs.job("design_page:tracked", "test_design_page:git_ls_files")
#: a small simulated run through parameter servers, whose summary.json the page must name key by key
PS_RUN = runs.command("design_page:ps_run", "workers=2", "sim.topology=ps", "problem.n_samples=200", "problem.dim=5",
                      "rounds=2", "quiet=true", "out_dir={tmp}/design_page/ps_run")
LISTED: list[frozenset[str]] = []  # the fresh interpreter's answer, once read (`read_tracked`)


@pytest.fixture(scope="module", autouse=True)
def read_tracked(fresh) -> None:
    done = fresh["jobs"][TRACKED]
    assert "ok" in done, done.get("error")
    LISTED.append(frozenset(done["ok"]))


def tracked() -> frozenset[str]:
    return LISTED[-1]


def tracked_text() -> dict[str, str]:
    """Every tracked file that reads as UTF-8 text (binary files and git-annex or LFS pointers aside)."""
    out = {}
    for name in sorted(tracked()):
        path = REPO / name
        if not path.is_file() or path.is_symlink():
            continue
        try:
            out[name] = path.read_text()
        except UnicodeDecodeError:
            continue
    return out


def citations(text: str, pattern: str) -> list[str]:
    """The paths matching ``pattern`` in ``text`` that are not the destination of an ``--out`` or a default."""
    return [m.group(0).rstrip(".,;:)`'\"") for m in re.finditer(pattern, text)
            if not DESTINATION.search(text[max(0, m.start() - 12):m.start()])]


# ------------------------------------------------------------------ the design page


def test_the_design_page_is_in_the_nav():
    assert re.search(r"^  - [^:]+: design\.md$", (REPO / "mkdocs.yml").read_text(), re.M)


def test_every_module_of_dane_is_named_on_the_design_page():
    page = DESIGN_PAGE.read_text()
    modules = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "dane").rglob("*.py"))
    assert modules, "no module found under dane/"
    missing = [m for m in modules if f"`{m}`" not in page]
    assert missing == [], f"docs/design.md's module list lacks {missing}: add a row with its purpose"


def test_the_design_page_names_no_module_that_is_gone():
    named = set(re.findall(r"`(dane/[\w/]+\.py)`", DESIGN_PAGE.read_text()))
    gone = sorted(m for m in named if not (REPO / m).is_file())
    assert gone == [], f"docs/design.md names modules that do not exist: {gone}"


def summary_keys_named() -> set[str]:
    """Every name in backticks in the page's ``summary.json`` list (a backtick may hold several, comma-separated)."""
    text = DESIGN_PAGE.read_text()
    section = text.split("**`summary.json`**", 1)[1].split("\n## ", 1)[0]
    return {name for quoted in re.findall(r"`([^`]+)`", section) for name in re.findall(r"[A-Za-z_]\w*", quoted)}


def test_the_design_page_names_every_key_of_a_runs_summary(commands):
    """The page's summary.json list is the full one: a simulated run's keys are all on it (it once lacked
    `label`, `time_s_clock`, `simulator_path` and the parameter-server cost model's `topology`, `gamma`, `servers`
    and `bytes_sent_per_allreduce`)."""
    from dane.records.results import read_summary

    proc = commands[PS_RUN]
    assert proc["rc"] == 0, proc["stderr"]
    summary = read_summary(commands.tmp / "design_page" / "ps_run")
    assert {"label", "time_s_clock", "simulator_path", "topology", "gamma", "local_work"} <= set(summary)
    assert sorted(set(summary) - summary_keys_named()) == []


# ------------------------------------------------------------------ no citation outside the repository


def test_no_tracked_file_cites_the_outside_brief():
    found = sorted(f"{name}:{text[:m.start()].count(chr(10)) + 1}" for name, text in tracked_text().items()
                   for m in re.finditer(re.escape(OUTSIDE_BRIEF), text))
    assert found == [], f"these cite {OUTSIDE_BRIEF}, which is not in the repository: point at docs/design.md: {found}"


def test_every_evidence_path_cited_is_tracked():
    files = tracked()
    cited = sorted({(name, path) for name, text in tracked_text().items()
                    for path in citations(text, re.escape(EVIDENCE) + r"/[\w./-]+\.jsonl?")})
    untracked = [f"{name}: {path}" for name, path in cited if path not in files]
    assert untracked == [], f"evidence cited but not tracked (git add it, or cite a tracked file): {untracked}"


def test_no_untracked_run_directory_is_cited():
    """The benchmarks' run folder under results/ is git-ignored: a citation of it points outside every clone."""
    found = sorted(f"{name}: {path}" for name, text in tracked_text().items()
                   for path in citations(text, re.escape(RUN_FOLDER) + r"[\w./-]*"))
    assert found == [], f"cite the tracked copy in {EVIDENCE}/ or the make bench section instead: {found}"


def test_the_pages_and_docstrings_name_results_json_only_as_a_commands_output():
    """docs/ and the Python sources may say where a command writes (results/bench.json for make bench), never cite
    another results/ JSON as evidence: results/ is not in the repository."""
    sources = {name: text for name, text in tracked_text().items()
               if name.startswith("docs/") or name.endswith(".py") or name == "README.md"}
    found = sorted(f"{name}: {path}" for name, text in sources.items()
                   for path in citations(text, r"results/[\w-]+\.json")
                   if path not in OUTPUTS)
    assert found == [], f"results/ JSON cited that no documented command writes: {found}"


def test_the_evidence_folder_holds_only_what_is_cited():
    """Every tracked JSON in paper_figs/evidence/ is named by a page or a docstring (no orphaned evidence)."""
    texts = tracked_text()
    held = sorted(name for name in tracked() if name.startswith(f"{EVIDENCE}/") and name.endswith(".json"))
    assert held, f"{EVIDENCE}/ holds no tracked JSON"
    cited = {path for name, text in texts.items() if not name.startswith(f"{EVIDENCE}/")
             for path in citations(text, re.escape(EVIDENCE) + r"/[\w./-]+\.json")}
    assert sorted(set(held) - cited) == []


# ------------------------------------------------------------------ the generated tables are their tracked JSON's


def block(text: str, begin: str, end: str) -> str:
    assert text.count(begin) == 1 and text.count(end) == 1, begin
    return text.split(begin, 1)[1].split(end, 1)[0].strip("\n")


def load(path: str) -> dict:
    assert path in tracked(), f"{path} is cited by docs/benchmarks.md but not tracked"
    return json.loads((REPO / path).read_text())


def federated_sections() -> list[str]:
    from dane.paper_figs.federated_table import SECTIONS

    return list(SECTIONS)


@pytest.mark.parametrize("section", federated_sections())
def test_a_federated_table_is_what_its_tracked_json_renders_to(section):
    from dane.paper_figs.federated_table import SECTIONS, combine, render

    shown = block(BENCHMARKS_PAGE.read_text(), *SECTIONS[section])
    caption = re.match(r"Generated by `dane figures federated_table` from scripts/bench_federated\.py's JSON "
                       r"(\S+(?:, \S+)*) \(", shown)
    assert caption, f"the {section} table's caption names no JSON: {shown.splitlines()[0][:200]}"
    sources = caption.group(1).split(", ")
    assert all(path.startswith(f"{EVIDENCE}/") for path in sources), sources
    reports = [load(path)[section] for path in sources]
    assert render(combine(reports), sources) == shown, \
        f"the {section} table is not its JSON's: rerun dane figures federated_table --json {' '.join(sources)}"


def test_the_defaults_tables_are_what_their_tracked_json_renders_to():
    from dane.paper_figs.defaults_table import (BEGIN, END, FEDERATED, FEDERATED_BEGIN, FEDERATED_END, combine,
                                                methods_of, render)

    text = BENCHMARKS_PAGE.read_text()
    commands = re.findall(r"`dane figures defaults_table --json ((?:\S+\.json ?)+)`", text)
    assert commands, "docs/benchmarks.md names no `dane figures defaults_table --json ...` command for its tables"
    rendered = {}
    for command in commands:  # each writes the block of every group its JSON holds, as `main` does
        sources = command.split()
        assert all(path.startswith(f"{EVIDENCE}/") for path in sources), sources
        reports = [load(path)["defaults"] for path in sources]
        report = combine(reports)
        for group, begin, end in ((None, BEGIN, END), (FEDERATED, FEDERATED_BEGIN, FEDERATED_END)):
            if methods_of(report, group):
                named = [path for path, one in zip(sources, reports) if methods_of(one, group)]
                rendered[begin] = (render(report, group, named), end)
    assert set(rendered) == {BEGIN, FEDERATED_BEGIN}, "a defaults block has no command that renders it"
    for begin, (table, end) in rendered.items():
        assert table == block(text, begin, end), f"the {begin} block is not its JSON's: rerun {commands}"


@pytest.mark.parametrize("name", ["table", "long"])
def test_the_fedprox_synthetic_table_is_what_its_tracked_json_renders_to(name):
    from dane.paper_figs.fedprox_synthetic import BLOCKS, KEY, render

    shown = block(BENCHMARKS_PAGE.read_text(), *BLOCKS[name])
    source = re.match(r"Generated by `dane figures fedprox_synthetic` from scripts/bench_fedprox_synthetic\.py's "
                      r"JSON (\S+) \(", shown)
    assert source and source.group(1).startswith(f"{EVIDENCE}/"), shown.splitlines()[:1]
    assert render(load(source.group(1))[KEY], source.group(1)) == shown, \
        f"the table is not its JSON's: rerun dane figures fedprox_synthetic --json {source.group(1)} --block {name}"


def test_the_compressed_table_is_what_its_tracked_json_renders_to():
    from dane.paper_figs.compressed import BEGIN, END, KEY, render

    shown = block(BENCHMARKS_PAGE.read_text(), BEGIN, END)
    source = re.match(r"Generated by `dane figures compressed` from scripts/bench_compressed\.py's JSON (\S+) \(",
                      shown)
    assert source and source.group(1).startswith(f"{EVIDENCE}/"), shown.splitlines()[:1]
    assert render(load(source.group(1))[KEY], source.group(1)) == shown, \
        f"the table is not its JSON's: rerun dane figures compressed --json {source.group(1)}"


@functools.cache
def registry() -> dict[str, type]:
    """Each conf/algorithm/ file's name and the class it builds."""
    from dane.api import algorithm_config
    from dane.experiments.config import CONF_DIR

    return {p.stem: algorithm_config(p.stem).algorithm for p in sorted((CONF_DIR / "algorithm").glob("*.yaml"))}


def between(text: str, start: str, end: str) -> str:
    """The part of ``text`` from ``start`` to the first ``end`` after it."""
    head = text.index(start)
    return text[head:text.index(end, head + len(start))]


def test_the_design_pages_run_kind_is_a_branch_of_the_function_it_names():
    """A new kind is a branch of `kind` and one of the function that calls each kind's function: `started`, which
    `start` calls (the page once said `start`, which calls `kind` and `started` only)."""
    import ast
    import inspect

    from dane.loop import kinds

    returned = {node.value for ret in ast.walk(ast.parse(inspect.getsource(kinds.kind))) if isinstance(ret, ast.Return)
                for node in ast.walk(ret.value) if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    assert {"own driver", "simulator", "batched simulator", "elastic", "launched"} <= returned
    named = re.findall(r"a branch of `kind`(?: \(which decides\))? and one of `(\w+)`", DESIGN_PAGE.read_text())
    assert len(named) == 2
    for name in named:
        source = inspect.getsource(getattr(kinds, name))
        assert [k for k in sorted(returned) if not re.search(rf"\b{k.replace(' ', '_')}\(", source)] == [], name


def test_the_design_page_names_every_callback_and_hook():
    """Step 4 of a run names each `Callback` of dane/loop/callbacks.py (it once left out `Policy`, the defaults
    policy's entries, and `ClosingLine`) and each of its hooks."""
    from dane.loop import callbacks

    text = between(DESIGN_PAGE.read_text(), "4. **Callbacks.**", "5. **")
    named = set(re.findall(r"`(\w+)`", text))
    defined = {name for name, obj in vars(callbacks).items() if isinstance(obj, type)
               and issubclass(obj, callbacks.Callback) and obj is not callbacks.Callback
               and obj.__module__ == callbacks.__name__}
    assert len(defined) > 10 and sorted(defined - named) == []
    hooks = {name for name in vars(callbacks.Callback) if name.startswith("on_")}
    assert hooks == {name for name in named if name.startswith("on_")}


def test_the_design_pages_federated_bases_are_the_classes():
    """The algorithm extension point's federated bases: the methods listed as `LocalSolving` are the registry's
    `LocalSolving` classes' modules (FedProx, FedDANE, FedRed, S-DANE and Acc-S-DANE, SCAFFOLD), each other
    `Federated` is Scaffnew's (its keys `LocalKeys`) or counts its clients' bits (`ClientBits`), and each module of
    the defaults policy's list writes its paper's `round` (the page once named no base)."""
    from dane.baselines.federated import ClientBits, Federated, LocalKeys, LocalSolveKeys, LocalSolving

    page = DESIGN_PAGE.read_text()
    text = between(page, "- **an algorithm**", "- **a problem**")
    listed = re.search(r"`LocalSolving`, a `Federated`[^{]*`baselines/\{([\w,\s]+)\}\.py`", text)
    assert listed, "the page's algorithm extension point names no LocalSolving methods"
    classes = registry().values()
    module = lambda cls: cls.__module__.rsplit(".", 1)[-1]  # noqa: E731
    assert set(re.split(r",\s*", listed[1])) == {module(c) for c in classes if issubclass(c, LocalSolving)}
    others = [c for c in classes if issubclass(c, Federated) and not issubclass(c, LocalSolving)]
    assert sorted(c.__name__ for c in others if not issubclass(c, ClientBits)) == ["Scaffnew"]
    assert not issubclass(LocalKeys, LocalSolveKeys) and issubclass(LocalSolveKeys, LocalKeys)
    rounds = re.search(r"`round\(\)` in each of `baselines/\{([\w,\s]+)\}\.py`", page)
    for name in re.split(r",\s*", rounds[1]):
        own = [c for c in classes if module(c) == name]
        assert own and all(issubclass(c, Federated) and any("round" in vars(k) for k in c.__mro__
                                                            if k.__module__ == c.__module__) for c in own), name


def test_the_design_page_names_what_the_baselines_share():
    """Every module of baselines/ that builds no method (the shared bases, the defaults policy, the wrappers, ...)
    is named in the layers' list (it once named none)."""
    text = between(DESIGN_PAGE.read_text(), "4. the algorithms:", "5. the run:")
    methods = {cls.__module__.rsplit(".", 1)[-1] for cls in registry().values()}
    shared = sorted(p.stem for p in (REPO / "baselines").glob("*.py") if p.stem not in methods | {"__init__"})
    assert "federated" in shared and [s for s in shared if f"`baselines/{s}.py`" not in text] == []


def test_the_design_page_names_each_adaptation():
    """What adapts during a run: the page's names are `algorithm.adapt`'s, each an `Adaptation` of
    baselines/adaptive.py (the page once named them in prose only)."""
    from dane.baselines import adaptive

    text = between(DESIGN_PAGE.read_text(), "What adapts during a run (", "`baselines/adaptive.py`")
    wrappers = {obj.name for obj in vars(adaptive).values() if isinstance(obj, type)
                and issubclass(obj, adaptive.Adaptation) and obj is not adaptive.Adaptation}
    assert set(re.findall(r"`(\w+)`", text)) == set(adaptive.ADAPTATIONS) == wrappers


def test_the_design_pages_local_work_counts_are_dane_works():
    """The record table's local-work row is `dane.work`'s counts and flops, and its two counts in words are theirs."""
    from dane.work import COUNTS, FLOPS, KEYS

    words = {8: "eight", 9: "nine", 10: "ten", 11: "eleven", 16: "sixteen", 18: "eighteen", 20: "twenty"}
    page = DESIGN_PAGE.read_text()
    row = re.search(r"^\| `(local_passes, [\w, ]+)` \|", page, re.M)
    assert row and row[1].split(", ") == [*COUNTS, FLOPS]
    assert f"| the same {words[len(COUNTS) + 1]} with `_max`" in page
    assert f"the last record's {words[len(KEYS)]} local-work keys" in page


def test_the_design_page_names_every_folder_of_dane():
    """The layers' account of dane/'s folders names each of them (it once left out compress/ and split/)."""
    text = between(DESIGN_PAGE.read_text(), "the rest sits in a folder named for its concern:", "\n\n")
    folders = sorted(p.parent.name for p in (REPO / "dane").glob("*/__init__.py"))
    assert "loop" in folders and [f for f in folders if f"`{f}/`" not in text] == []


def test_the_design_page_names_every_method_with_client_sampling():
    """"The federated DANE line" lists every method whose config takes the sampling keys, by its label (it once left
    out FedNL-BC, NL1, Newton-3PC, Newton-Star, DINGO and MARINA)."""
    from dane.api import algorithm_config
    from dane.sampling import SamplingKeys

    text = between(DESIGN_PAGE.read_text(), "### The federated DANE line", "###")
    sampled = {cls.label or cls.name for stem, cls in registry().items()
               if issubclass(type(algorithm_config(stem)), SamplingKeys)}
    assert {"FedProx", "FedNL"} <= sampled and sorted(s for s in sampled if not re.search(rf"\b{re.escape(s)}\b", text)) == []
