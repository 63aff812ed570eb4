"""paper_figs/fednl_bits.py: FedNL beside GD against rounds and uplink bits per client, from logged runs."""
from __future__ import annotations

import json

import numpy as np
import pytest

import dane
from dane.baselines.fednl import uplink_bits
from dane.compress import make
from dane.paper_figs.fednl_bits import NoBits, curve, main
from dane.records.results import read_rounds


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two real runs on one small logistic regression, 4 workers: FedNL with TopK, GD with comm.compress=none."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(400, 6))
    y = (X @ rng.normal(size=6) + rng.normal(size=400) > 0).astype(float)
    problem = dane.problems.LogReg(X, y, lam=1e-2, optimum="auto")
    root = tmp_path_factory.mktemp("fednl_bits")
    dane.fit(problem, "fednl", workers=4, rounds=6, out_dir=str(root / "fednl_topk"), compressor="topk:5", option=2)
    dane.fit(problem, "gd", workers=4, rounds=6, out_dir=str(root / "gd"), compress="none")
    dane.fit(problem, "gd", workers=4, rounds=2, out_dir=str(tmp_path_factory.mktemp("plain") / "gd"))
    return root


def test_bits_per_client_and_relative_suboptimality_are_the_records(runs):
    fednl, gd = read_rounds(runs / "fednl_topk"), read_rounds(runs / "gd")
    optimum = fednl[0]["objective"] - fednl[0]["suboptimality"]
    got = curve(runs / "fednl_topk")
    assert got["label"] == "FedNL (topk:5)" and got["rounds"] == [r["round"] for r in fednl]
    assert got["bits"] == [r["clients_uplink_bits"] / 4 for r in fednl]  # FedNL's count sums the 4 clients
    assert got["relative"] == pytest.approx([r["suboptimality"] / abs(optimum) for r in fednl], rel=1e-15)
    # d = 6: round 0's record holds H_i^0 whole (21 packed values at 64 bits), what reaching x_0 cost; record 1 adds
    # round 0's message
    per_round = uplink_bits(make("topk:5"), 6, variant="plain", option=2)
    assert got["bits"][0] == 64 * 21 and got["bits"][1] - got["bits"][0] == per_round
    assert curve(runs / "gd")["bits"] == [r["uplink_bits"] for r in gd]  # comm.compress's per-worker count
    summary = json.loads((runs / "fednl_topk" / "summary.json").read_text())  # the summary repeats the last counts
    assert summary["clients_uplink_bits"] == fednl[-1]["clients_uplink_bits"] == 4 * got["bits"][-1]
    assert (summary["uplink_bytes"], summary["downlink_bytes"]) == (fednl[-1]["uplink_bytes"], fednl[-1]["downlink_bytes"])


@pytest.fixture(scope="module")
def drawn(runs, tmp_path_factory):
    """`main` over the two runs, once for the tests that read its files or its figure: (the folder it wrote, the
    paths it returned, the figures it handed to `save`)."""
    from dane.paper_figs import fednl_bits

    out, figures, real = tmp_path_factory.mktemp("figures"), [], fednl_bits.save
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fednl_bits, "save", lambda fig, *a, **k: figures.append(fig) or real(fig, *a, **k))
        paths = main(runs, out)
    return out, paths, figures


def test_the_figure_and_its_table_are_written(runs, drawn):
    tmp_path, paths, _ = drawn
    assert {p.name for p in paths} == {"fednl_bits.png", "fednl_bits.pdf", "fednl_bits.md", "fednl_bits.json"}
    table = (tmp_path / "fednl_bits.md").read_text()
    assert "| FedNL (topk:5) | 6 |" in table and "| GD | 6 |" in table  # by the config.yaml dane.fit wrote
    # rounds, bits up and down and the local work side by side (no method ranked on one of them alone)
    header = next(line for line in table.splitlines() if line.startswith("| run |"))
    assert header.split(" | ")[1:-1] == ["rounds", "uplink bits per client", "downlink bits per client",
                                         "local passes per client", "HVPs per client", "Hessians per client",
                                         "factorizations per client"]
    last = read_rounds(runs / "fednl_topk")[-1]
    row = next(line for line in table.splitlines() if line.startswith("| FedNL (topk:5) |")).split(" | ")
    assert row[3] == f"{8 * last['downlink_bytes'] / 4:.4g}" and row[4] == f"{last['local_passes'] / 4:.4g}"
    assert row[6] == f"{last['local_hessians'] / 4:.4g}" and float(row[6]) > 0  # FedNL forms a Hessian a round
    assert len(json.loads((tmp_path / "fednl_bits.json").read_text())["runs"]) == 2


def test_the_title_names_what_the_runs_record(drawn):
    """The suptitle and the caption are the runs' own setting: runs made by dane.fit record the problem, its
    arrays, m and λ (their config.yaml), and no tol (each runs to its round cap), and the title says so rather than
    the module's a9a/breast_cancer."""
    from dane.paper_figs import fednl_bits

    tmp_path, _, figures = drawn
    setting = "logreg on arrays, m = 4, λ = 0.01, runs stop at the round cap"
    assert len(figures) == 1 and " ".join(figures[0].get_suptitle().split()) == f"{fednl_bits.WHAT} {setting}"
    caption = json.loads((tmp_path / "fednl_bits.json").read_text())["caption"]
    assert caption.startswith(f"{fednl_bits.WHAT}; {setting}; 2 runs;")
    assert (tmp_path / "fednl_bits.md").read_text().splitlines()[0] == caption


def test_the_title_reads_a_simulated_runs_config_and_summary(tmp_path):
    """A run of `jobs` on a9a: its data set from config.yaml's data.path, rows x features from the data source's
    note in summary.json, λ from the config, the stop rule from the summary; runs that differ show each value."""
    from dane.paper_figs.fednl_bits import WHAT, title

    for name, workers in (("a", 8), ("b", 16)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.yaml").write_text("problem:\n  name: logreg\n  lam: 0.001\n  data:\n    path: libsvm/a9a\n"
                                            "    name: libsvm\n")
        (folder / "summary.json").write_text(json.dumps({
            "problem": "logreg", "workers": workers, "stop_rule": "suboptimality <= 1e-12 x |O*|",
            "notes": ["read 32561 rows x 123 features (451592 non-zeros, sparse) from data/libsvm/a9a"]}))
    assert title([tmp_path / "a", tmp_path / "b"]) == (f"{WHAT}\nlogreg on a9a (32,561 rows x 123 features), "
                                                       "m = 8 / 16, λ = 0.001, runs stop at suboptimality <= 1e-12 x "
                                                       "|O*|")


def test_a_run_without_bit_counts_is_named_with_its_fix(runs, tmp_path_factory):
    plain = next(tmp_path_factory.getbasetemp().glob("plain*/gd"))
    with pytest.raises(NoBits, match="run it with comm.compress=none"):
        curve(plain)


def test_make_figures_jobs_compose_into_runs_of_the_figure(monkeypatch):
    """`make figures` makes the figure's runs (dane.paper_figs.make_all): each job composes into a run spec (a data=
    job through the sweeps' resolved config), FedNL at k = 8d per compressor beside the five others."""
    from dane.experiments.config import run_spec
    from dane.paper_figs import fednl_bits, make_all
    from dane.synthetic.sweep import compose_job

    assert "dane.paper_figs.fednl_bits" in make_all.FIGURES and fednl_bits.TIMED is False
    monkeypatch.setattr(fednl_bits, "data_overrides", lambda: (("data=breast_cancer",), 31))
    jobs = fednl_bits.jobs()
    specs = [run_spec(compose_job(job)) for job in jobs]
    assert [s.algorithm.name for s in specs] == ["fednl"] * 3 + list(fednl_bits.OTHERS)
    assert [s.algorithm.compressor for s in specs[:3]] == ["none", "topk:248", "randk:248"]
    assert all(s.problem.optimum == "auto" and s.comm.workers == fednl_bits.WORKERS for s in specs)
    # to 1e-12 relative, as the docs' commands: not the simulator's absolute floor of 1e-10 (conf/experiment)
    assert all((s.control.stop.tol, s.control.stop.tol_abs) == (1e-12, None) for s in specs)


def test_the_table_gives_each_count_per_client_from_the_last_record_in_its_column(tmp_path):
    """`table` of two canned runs of 4 workers (their `run_curve`s), each count a different number so that a column
    swapped or a record other than the last shows: FedNL's exact clients_*_bits over m, the local work summed over
    the workers over m; a run whose records count no downlink and predate the second-order counts gets — there.  A
    run whose records count no local work has no passes, and is refused in one line where they are asked for."""
    from dane.paper_figs.common import MissingCount, run_curve
    from dane.paper_figs.fednl_bits import table

    last = {"round": 2, "objective": 1.5, "suboptimality": 0.5, "clients_uplink_bits": 4000,
            "clients_downlink_bits": 2000, "local_passes": 12, "local_hvps": 40, "local_hessians": 8,
            "local_factorizations": 4}
    first = {**{key: 0 for key in last}, "round": 0, "objective": 2.0, "suboptimality": 1.0}
    old = {"round": 2, "objective": 1.25, "suboptimality": 0.25, "uplink_bits": 640, "local_passes": 6}
    curves = []
    for name, records in (("FedNL (topk:5)", [first, last]),
                          ("GD", [{**old, "round": 0, "objective": 2.0, "suboptimality": 1.0, "uplink_bits": 0},
                                  old])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        (tmp_path / name / "summary.json").write_text(json.dumps({"workers": 4}))
        curves.append(run_curve(tmp_path / name, name))
    rows = [line for line in table(curves).splitlines() if line.startswith(("| FedNL", "| GD"))]
    assert rows == ["| FedNL (topk:5) | 2 | 1000 | 500 | 3 | 10 | 2 | 1 | 0.5 |",
                    "| GD | 2 | 640 | — | 1.5 | — | — | — | 0.25 |"]
    unworked = tmp_path / "before dane.work"  # records that count no local work: none, or refused where asked for
    unworked.mkdir()
    start = {**old, "round": 0, "uplink_bits": 0}
    records = [{k: v for k, v in r.items() if k != "local_passes"} for r in (start, old)]
    (unworked / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (unworked / "summary.json").write_text(json.dumps({"workers": 4}))
    assert run_curve(unworked, "GD")["passes"] is None
    with pytest.raises(MissingCount) as err:
        run_curve(unworked, "GD", passes=True)
    assert str(err.value) == f"{unworked}: its records count no local work (written before dane.work); run it again"
