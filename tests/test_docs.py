"""The documentation (docs/, built by `make docs`) cannot rot: every Python block runs, every shell command names
configs, figures, targets and scripts that exist, the generated tables are their generators', and no page quotes a
measured number by hand."""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import json
import pkgutil
import re
import statistics
import sys

import pytest

from doc_blocks import DOCS, REPO, blocks, check_command, commands, pages, quoted_measurements
from helpers import composed
from dane.api import algorithm_config
from dane.errors import ConfigError
from dane.experiments.config import CONF_DIR, run_spec
from dane.experiments.overrides import check_group_choices, check_keys

SHELL = ("bash", "sh")
#: pages whose Python blocks read a file of data_dir (../shared/data): skipped where it is absent
NEEDS_DATA = {"python_api.md": "admissions.csv"}


def hooks():
    """docs/hooks.py, the MkDocs hook that generates the methods tables (a file of docs/, not a package)."""
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A working folder holding every file the pages ask the reader to write, importable; its modules are dropped
    from sys.modules afterwards."""
    written = []
    for path in pages():
        for block in blocks(path):
            if block.file:
                target = tmp_path / block.file
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(block.code)
                written.append(target)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for target in written:
        sys.modules.pop(target.stem, None)


def test_every_page_is_in_the_nav_the_files_the_pages_write_do_not_collide_and_blocks_are_not_indented():
    nav = re.findall(r"^  - [^:]+: (\S+\.md)$", (REPO / "mkdocs.yml").read_text(), re.M)
    assert sorted(nav) == sorted(p.name for p in pages())
    files = [b.file for p in pages() for b in blocks(p) if b.file]
    assert len(files) == len(set(files)), files
    # Python-Markdown renders a fenced block inside a list item as inline code: blocks start at the margin
    assert [(p.name, n) for p in pages() for n, line in enumerate(p.read_text().splitlines(), 1)
            if re.match(r" +```", line)] == []


PYTHON_PAGES = [p.name for p in pages() if any(b.lang == "python" and not b.file for b in blocks(p))]


@pytest.mark.parametrize("name", PYTHON_PAGES)
def test_python_blocks_run(name, scratch):
    data = NEEDS_DATA.get(name)
    if data and not (REPO.parent / "shared" / "data" / data).exists():
        pytest.skip(f"{name} reads ../shared/data/{data}, which is absent here")
    scope: dict = {}
    code = [b.code for b in blocks(DOCS / name) if b.lang == "python" and not b.file]
    for k, block in enumerate(code):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(block, str(DOCS / name), "exec"), scope)  # noqa: S102 - the page's own example
        if (name, k) == ("python_api.md", 0):
            lines = dict(line.split(" ", 1) for line in out.getvalue().splitlines())
            assert set(lines) == {"dane", "giant", "disco"}
            for method in lines:  # they reach the example's tol=1e-10 within its 100 rounds
                status, _, _, subopt = lines[method].split()
                assert status == "converged" and float(subopt) <= 1e-10
            assert scope["w"].shape == (31,) and len(scope["columns"]["round"]) == len(scope["result"].records)


SHELL_COMMANDS = [(p.name, command) for p in pages() for b in blocks(p) if b.lang in SHELL
                  for command in commands(b.code)]


@pytest.mark.parametrize("page, command", SHELL_COMMANDS, ids=[f"{p}:{c[:60]}" for p, c in SHELL_COMMANDS])
def test_shell_commands_name_what_exists(page, command, scratch):
    check_command(command, CONF_DIR)


def test_the_extending_pages_commands_run(scratch):
    """The page's own folder (--config-dir my_conf) composes, validates and runs: a problem, an algorithm and a
    dataset added without touching the package."""
    runs = [c for b in blocks(DOCS / "extending.md") if b.lang in SHELL for c in commands(b.code)]
    assert len(runs) == 2
    summaries = []
    for k, command in enumerate(runs):
        args = command.split(" dane train ", 1)[1].split()
        folder = args[args.index("--config-dir") + 1]
        overrides = [a for a in args if "=" in a] + [f"hydra.searchpath=[file://{scratch / folder}]",
                                                     "quiet=true", f"out_dir={scratch / f'run{k}'}"]
        from dane.loop.launch import execute

        summaries.append(execute(run_spec(composed(*overrides)), str(scratch / f"run{k}")))
    assert summaries[0]["rounds"] == 10 and summaries[0]["algorithm"] == "fixed_step_gd"
    assert summaries[1]["status"] == "converged" and summaries[1]["problem"] == "ridge"


def test_own_datas_pooled_synthetic_command_is_the_per_client_one_but_for_its_sharding():
    """own_data.md: the pooled Synthetic(alpha, beta) rows dealt by their client column give "the same records" as the
    30 clients (tests/test_synthetic_source.py runs both forms), so the two commands compose the same config but for
    data.sharding and data.client_column; the pooled one left out algorithm.clients_per_round=10."""
    from omegaconf import OmegaConf

    runs = [c for b in blocks(DOCS / "own_data.md") if b.lang in SHELL for c in commands(b.code)
            if "data=synthetic" in c and "workers=30" in c]
    assert len(runs) == 2
    configs = []
    for command in runs:
        args = command.split("dane train ", 1)[1].split()
        configs.append(OmegaConf.to_container(composed(*args)))
    per_client, pooled = configs
    assert (pooled["data"].pop("sharding"), pooled["data"].pop("client_column")) == ("column", "client")
    assert (per_client["data"].pop("sharding"), per_client["data"].pop("client_column")) == (None, None)
    assert pooled == per_client


def test_the_console_examples_print_the_commands_own_lines(scratch):
    """``$ dane train ...`` followed by ``error: ...``: the line the command prints (its ConfigError), word for word."""
    shown = [b for p in pages() for b in blocks(p) if b.lang == "" and b.code.startswith("$ ")]
    pairs = [(c.split("\n")[0], c.split("\n")[1]) for b in shown for c in b.code.strip().split("\n$ ")]
    assert pairs
    for call, expected in pairs:
        args = call.removeprefix("$ ").split()[2:]
        with pytest.raises(ConfigError) as caught:  # what experiments/train.py checks, in its order
            check_group_choices(args)
            check_keys(args, "config")
            run_spec(composed(*args))
        assert f"error: {caught.value}" == expected


def test_the_api_page_has_an_entry_for_every_name_dane_exports():
    """docs/api.md had none for ShardingKeys, column_shards, save_npz and others exported from dane: each name of
    dane.__all__ is the object of one of the page's ``::: dotted.path`` blocks."""
    import dane

    targets = re.findall(r"^::: (\S+)$", (DOCS / "api.md").read_text(), re.M)
    documented = [pkgutil.resolve_name(target) for target in targets]
    assert [name for name in dane.__all__ if not any(getattr(dane, name) is entry for entry in documented)] == []


def test_the_methods_tables_are_the_registrys():
    module = hooks()
    rows = module.registry()
    assert [r["name"] for r in rows] == sorted(p.stem for p in (CONF_DIR / "algorithm").glob("*.yaml"))
    table = module.methods_table()
    assert all(f"| `{r['name']}` | {r['summary']} |" in table for r in rows)
    dane_row = next(r for r in rows if r["name"] == "dane")
    assert dane_row["summary"] == "DANE (Shamir, Srebro & Zhang 2014): two allreduces per round."
    assert module.on_page_markdown("a\n<!-- methods-table -->\nb") == f"a\n{table}\nb"
    sampled = module.methods_table("clients_per_round")
    takers = sorted(p.stem for p in (CONF_DIR / "algorithm").glob("*.yaml")
                    if re.search(r"^clients_per_round:", p.read_text(), re.M))
    assert re.findall(r"^\| `(\w+)` \|", sampled, re.M) == takers and takers
    batched = module.methods_table("batchable")  # docs/simulator.md's list of the methods sim.batched runs stacked
    batchable = [r["name"] for r in rows if algorithm_config(r["name"]).algorithm.batchable]
    assert re.findall(r"^\| `(\w+)` \|", batched, re.M) == batchable and {"diana", "fednl", "nl1"} <= set(batchable)
    assert "batched simulator" in table.splitlines()[0] and "ef21" not in batchable
    with pytest.raises(ValueError, match="neither a capability"):
        module.methods_table("fast")


@functools.cache
def algorithm_classes() -> dict[str, type]:
    """Each conf/algorithm/ file's name and the class it builds."""
    return {p.stem: algorithm_config(p.stem).algorithm for p in sorted((CONF_DIR / "algorithm").glob("*.yaml"))}


def test_the_results_page_names_every_traffic_key_and_the_work_tables_width():
    """docs/results.md's record keys include every traffic key a round can log (the methods' `summary_keys`, a
    sampled round's `dane.sampling.Traffic`; it once named none of `uplink_bits`, `downlink_bits`, `downlink_bytes`,
    `clients`), and the local-work table a launched rank sends is `dane.work`'s: each of its counts and `local_flops`
    in two halves (it once said m × 8)."""
    from dane.sampling import Traffic
    from dane.work import COUNTS, KEYS

    text = (DOCS / "results.md").read_text()
    named = set(re.findall(r"`(\w+)`", text))
    traffic = set(Traffic().record(0)).union(*(cls.summary_keys for cls in algorithm_classes().values()))
    assert {"uplink_bits", "clients_uplink_bits", "clients"} <= traffic
    assert sorted(traffic - named) == []
    assert f"m × {2 * (len(COUNTS) + 1)} table" in text and len(KEYS) == 2 * (len(COUNTS) + 1)


def test_the_results_page_says_what_every_methods_round_costs_a_client():
    """docs/results.md's list of what each method's round costs names every method that counts local work, by its
    label (it once lacked the compressed methods, the FedNL line beside FedNL, Acc-S-DANE and sync SGD); split
    learning counts none."""
    text = (DOCS / "results.md").read_text()
    listed = text.split("round costs a client, as counted:", 1)[1].split("\nBackends.", 1)[0].lower()
    labels = {name: cls.label for name, cls in algorithm_classes().items()}
    assert [name for name, label in labels.items() if not label] == ["split"]
    assert [name for name, label in labels.items()
            if label and not re.search(rf"(?<![\w-]){re.escape(label.lower())}(?![\w-])", listed)] == []


# ------------------------------------------------------------------ the generated defaults table (docs/benchmarks.md)

def defaults_block() -> str:
    from dane.paper_figs.defaults_table import BEGIN, END

    text = (DOCS / "benchmarks.md").read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def table_rows(block: str, header: str) -> list[list[str]]:
    """The cells of the markdown table whose header line starts with ``header``, below its separator line."""
    lines = block.split(header, 1)[1].splitlines()[2:]
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def test_the_defaults_table_is_generated_and_agrees_with_itself():
    """The block is `dane figures defaults_table`'s: its provenance line, and a summary that is what its cells say."""
    block = defaults_block()
    assert re.match(r"Generated by `dane figures defaults_table` from scripts/bench_defaults\.py's JSON "
                    r"paper_figs/evidence/defaults\.json \(\S+, load average \[[\d., ]+\]\)\. (Measured at commits? "
                    r"[0-9a-f]{10}|Commit not recorded)[^.]*\. Target: ", block), \
        block.splitlines()[0]
    summary = table_rows(block, "| method | converged at defaults |")
    cells = table_rows(block, "| cell |")
    methods = [c.strip() for c in block.split("| cell |", 1)[1].splitlines()[0].strip("|").split("|")]
    assert [row[0] for row in summary] == methods
    for k, row in enumerate(summary):
        entries = [cell[k + 1] for cell in cells]
        shown = [e.split(" (")[0] for e in entries]
        ratios = {cell[0]: int(s) / int(e.split("(")[1].rstrip(")")) for cell, s, e in zip(cells, shown, entries)
                  if s.isdigit() and e.split("(")[1].rstrip(")").isdigit()}
        assert row[1] == f"{sum(s.isdigit() for s in shown)}/{len(cells)}", row
        assert row[2] == str(shown.count("div")), row
        assert row[5] == f"{statistics.median(ratios.values()):.2f}", row
        worst = max(ratios, key=ratios.get)
        assert row[6] == f"{ratios[worst]:.2f} ({worst})", row


def test_the_defaults_table_is_the_logged_runs_where_they_are_here():
    """Where the benchmark's JSON is in results/ (untracked), the page's block is exactly what it renders to."""
    from dane.paper_figs.defaults_table import render

    source, stamp = re.search(r"JSON (\S+) \((\S+),", defaults_block()).groups()
    logged = [json.loads(p.read_text()).get("defaults") for p in
              (REPO / "results" / "bench.json", REPO / "paper_figs" / "evidence" / "defaults.json") if p.is_file()]
    matching = [report for report in logged if report and report.get("started_at") == stamp]
    if not matching:
        pytest.skip(f"the defaults benchmark's JSON of {stamp} is not in results/ here")
    assert render(matching[0], sources=[source]) == defaults_block()


# ------------------------------------------------------------------ measured numbers live in generated files

@pytest.mark.parametrize("path", pages(), ids=lambda p: p.name)
def test_no_page_quotes_measured_results(path):
    """Measured numbers live in generated files (results/figures/*.json, results/bench.json, the defaults block);
    a hand-copied accuracy, ratio or duration goes stale the day the code changes."""
    from dane.paper_figs.defaults_table import BEGIN, END

    text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), "", path.read_text(), flags=re.S)
    assert quoted_measurements(text) == []


def test_the_measurement_check_reads_typed_speed_ups_not_settings():
    assert quoted_measurements("np 2 is 1.8x faster here, a speedup of 3") == ["1.8x faster", "speedup of 3"]
    assert quoted_measurements("grouped ones were about half as fast, 2x as fast") == ["half as fast", "2x as fast"]
    assert quoted_measurements("3 workers with one 3× slower; μ ×4; within 1.5× the rounds of the best") == []


def test_the_benchmark_table_points_at_the_json():
    text = (DOCS / "benchmarks.md").read_text().split("## Benchmarks", 1)[1]
    rows = re.findall(r"^\| `(\w[\w.-]*)` \|[^|]*\| ([^|]*) \|", text, re.M)
    assert rows and all(measured.strip() in ("see the JSON", "") for _, measured in rows)


def test_the_fedprox_synthetic_counts_of_local_updates_are_the_seeded_clients():
    """docs/benchmarks.md counts the FedProx paper's local updates from the clients' training rows as the benchmark
    draws them (`SyntheticSource`, seed 0): its 20 epochs of batch 10 are 2 n_k updates, at least 2 min_k n_k a round,
    and the long run's K is 2 n̄ rounded (n̄ the mean training rows), which the pages' command and the run's JSON take.
    The prose holds them typed; this keeps them the data's."""
    import numpy as np

    from dane.data.synthetic_source import PAPER_SETS, SyntheticSource

    epochs, batch = 20, 10
    rows = {name: [len(y) for _, y in SyntheticSource(alpha, beta, iid, seed=0).parts()]
            for name, (alpha, beta, iid) in PAPER_SETS.items()}
    fewest = min(epochs * min(r) // batch for r in rows.values())
    k = round(epochs * np.mean(rows["synthetic_1_1"]) / batch)
    text = " ".join((DOCS / "benchmarks.md").read_text().split())
    assert f"the paper's 20 epochs of batch 10 are 2 n_k updates of step 0.01, at least {fewest} a round" in text
    assert f"instead of its count of passes: {k} full-gradient steps a round at lr 0.01 (2 n̄ rounded" in text
    for page in ("benchmarks.md", "design.md"):
        assert f"--only fedavg fedprox --local-steps {k} --rounds 100" in " ".join((DOCS / page).read_text().split())
    long = json.loads((REPO / "paper_figs" / "evidence" / f"fedprox_synthetic_k{k}.json").read_text())
    assert long["fedprox_synthetic"]["local"]["local_steps"] == k


def test_the_extending_page_names_every_capability_an_algorithm_declares():
    """docs/extending.md's algorithm section names each yes/no capability `dane.Algorithm` declares on its class (it
    once left out `batchable`, the batched simulator's)."""
    from dane.algorithm import Algorithm

    flags = sorted(name for name, kind in Algorithm.__annotations__.items() if kind == "ClassVar[bool]")
    text = (DOCS / "extending.md").read_text()
    section = text[text.index("## An algorithm"):text.index("## A dataset")]
    assert "batchable" in flags and [f for f in flags if f"`{f}`" not in section] == []
