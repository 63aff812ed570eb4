"""paper_figs/local_work.py: suboptimality against rounds, uplink bits and local passes, from canned run records."""
from __future__ import annotations

import json

import pytest

from dane.paper_figs import fednl_bits, local_work, make_all
from dane.paper_figs.local_work import MissingCount, curve, main, to_target


#: what a simulated run's config.yaml and summary.json say of its setting (no algorithm: the legend is the folder)
CONFIG = {"problem": {"name": "logreg", "lam": 0.001, "data": {"dataset": "breast_cancer"}}}
SETTING = {"problem": "logreg", "stop_rule": "suboptimality <= 1e-10 x |O*|",
           "notes": ["scikit-learn's bundled breast_cancer data: 569 rows x 30 features"]}


def write_run(folder, records: list[dict], workers: int = 4, setting: bool = False, status: str = "converged") -> None:
    folder.mkdir(parents=True)
    (folder / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "summary.json").write_text(json.dumps({"workers": workers, "status": status,
                                                     **(SETTING if setting else {})}))
    if setting:
        (folder / "config.yaml").write_text(json.dumps(CONFIG))  # JSON is YAML


def record(t: int, suboptimality: float, passes: float, **traffic) -> dict:
    return {"round": t, "objective": 2.0 + suboptimality, "suboptimality": suboptimality, "local_passes": passes,
            **traffic}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two canned runs of 4 clients, O* = 2: a federated one counting its participants' bytes (2 passes and 1 HVP a
    client a round, half the bytes down as up) and one counting comm.compress's per-worker uplink bits alone (1 pass
    a client a round, no second-order counts).  Read only (a module's tests share them)."""
    tmp_path = tmp_path_factory.mktemp("runs")
    write_run(tmp_path / "fed", [record(t, 10.0 ** (-4 * t), 8.0 * t, uplink_bytes=400 * t, downlink_bytes=200 * t,
                                        local_hvps=4.0 * t, local_hessians=0.0, local_factorizations=0.0)
                                 for t in range(4)], setting=True)
    write_run(tmp_path / "gd", [record(t, 10.0 ** (-2 * t), 4.0 * t, uplink_bits=64 * t) for t in range(6)],
              setting=True)
    return tmp_path


def test_curves_are_the_records_per_client(runs):
    fed, gd = curve(runs / "fed"), curve(runs / "gd")
    assert fed["label"] == "fed" and fed["rounds"] == [0, 1, 2, 3]
    assert fed["bits"] == [0.0, 800.0, 1600.0, 2400.0]  # 8 x 400 bytes over 4 clients
    assert fed["passes"] == [0.0, 2.0, 4.0, 6.0]
    assert fed["relative"] == pytest.approx([0.5 * 10.0 ** (-4 * t) for t in range(4)], rel=1e-12)
    assert gd["bits"] == [64.0 * t for t in range(6)] and gd["passes"] == [float(t) for t in range(6)]
    # first record within 1e-8 of |O*| = 2: the federated run's round 2 (0.5e-8), the other's round 4 (0.5e-8)
    assert to_target(fed) == (2, 1600.0, 4.0)
    assert to_target(gd) == (4, 256.0, 4.0)
    assert to_target(gd, 1e-20) is None


@pytest.fixture(scope="module")
def drawn(runs, tmp_path_factory):
    """`main` over the two canned runs, once for the tests that read its files or its figure: (the folder it wrote,
    the paths it returned, the figures it handed to `save`)."""
    out, figures, real = tmp_path_factory.mktemp("figures"), [], local_work.save
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(local_work, "save", lambda fig, *a, **k: figures.append(fig) or real(fig, *a, **k))
        paths = main(runs, out)
    return out, paths, figures


def test_the_figure_and_its_table_are_written(drawn):
    out, paths, _ = drawn
    assert {p.name for p in paths} == {"local_work.png", "local_work.pdf", "local_work.md", "local_work.json"}
    table = (out / "local_work.md").read_text()
    # fed at round 2: 8 x 800 / 4 bits up, 8 x 400 / 4 down, 16 / 4 passes, 8 / 4 HVPs; gd counts no downlink and no
    # second-order work: —
    assert "| fed | 2 | 1600 | 800 | 4 | 2 | 0 | 0 | 5e-13 |  |" in table
    assert "| gd | 4 | 256 | — | 4 | — | — | — | 5e-11 |  |" in table
    assert ("| run | rounds to 1e-08 relative | uplink bits to 1e-08 relative | downlink bits to 1e-08 relative | "
            "local passes to 1e-08 relative | HVPs to 1e-08 relative | Hessians to 1e-08 relative | factorizations to "
            "1e-08 relative | last relative suboptimality | — because |") in \
        table
    assert len(json.loads((out / "local_work.json").read_text())["runs"]) == 2


def test_a_run_that_never_reached_the_target_says_why_its_cells_are_dashes(tmp_path):
    """A run that ran to its round cap names the cap (its last round), one that stopped otherwise its summary's
    status and round; the downlink curve is the federated bytes' (8 x 200 t / 4 bits a client)."""
    write_run(tmp_path / "capped", [record(t, 1.0, 8.0 * t, uplink_bytes=400 * t, downlink_bytes=200 * t)
                                    for t in range(3)], status="max_rounds")
    write_run(tmp_path / "blown", [record(t, 1.0 + t, 4.0 * t, uplink_bits=64 * t) for t in range(2)],
              status="diverged")
    capped = curve(tmp_path / "capped")
    assert capped["downlink"] == [0.0, 400.0, 800.0] and capped["status"] == "max_rounds"
    assert capped["local_hvps"] is None and curve(tmp_path / "blown")["downlink"] is None
    table = local_work.table([capped, curve(tmp_path / "blown")])
    dashes = " | ".join(["—"] * 7)
    assert f"| capped | {dashes} | 0.5 | not within 1e-08 relative by its round cap, 2 |" in table
    assert f"| blown | {dashes} | 1 | not within 1e-08 relative: stopped at round 1 (diverged) |" in table


def test_a_run_without_tol_stops_at_its_round_cap_in_the_caption(tmp_path):
    """A summary's ``stop_rule`` null is a run without ``tol`` (it ran to its round cap), which the captions said was
    "stop rule not recorded"; a summary without the key records none."""
    from dane.paper_figs.common import setting_text

    for name, summary in (("cap", {"workers": 4, "stop_rule": None}), ("tol", {"workers": 4, "stop_rule": "x <= 1"}),
                          ("old", {"workers": 4})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(summary))
    assert setting_text([tmp_path / "cap"]) == "?, m = 4, runs stop at the round cap, data set, λ not recorded"
    assert setting_text([tmp_path / "tol", tmp_path / "cap"]).endswith(", runs stop at x <= 1 / the round cap, "
                                                                       "data set, λ not recorded")
    assert setting_text([tmp_path / "old"]) == "?, m = 4, data set, λ, stop rule not recorded"


def test_the_title_and_caption_name_the_runs_data_and_settings(runs, drawn, tmp_path_factory):
    """The problem, data set, rows x features, m, λ and stop rule are the runs' config.yaml and summary.json (not
    the module's constants), on the image (the suptitle) and in the caption; the table's target beside them."""
    out, _, figures = drawn
    assert len(figures) == 1
    setting = ("logreg on breast_cancer (569 rows x 30 features), m = 4, λ = 0.001, runs stop at suboptimality "
               "<= 1e-10 x |O*|; the table: cost to 1e-08 relative")
    assert local_work.title([runs / "fed", runs / "gd"]) == f"{local_work.WHAT}\n{setting}"
    assert " ".join(figures[0].get_suptitle().split()) == f"{local_work.WHAT} {setting}"
    assert (out / "local_work.md").read_text().startswith(f"{local_work.WHAT}; {setting}; 2 runs;")
    assert json.loads((out / "local_work.json").read_text())["caption"].startswith(f"{local_work.WHAT}; {setting};")
    # runs that differ say each value; what no run records is named
    write_run(tmp_path_factory.mktemp("bare") / "x", [record(0, 0.5, 0.0, uplink_bits=0)], workers=8)
    bare = next(tmp_path_factory.getbasetemp().glob("bare*/x"))
    assert local_work.title([bare]).endswith("\n?, m = 8, data set, λ, stop rule not recorded; the table: cost to "
                                             "1e-08 relative")
    assert ", m = 4 / 8, " in local_work.title([runs / "fed", bare])


def test_a_run_without_a_count_is_named_with_its_fix(tmp_path):
    write_run(tmp_path / "old", [{"round": 0, "objective": 1.0, "suboptimality": 0.5}])
    with pytest.raises(MissingCount, match="count no local work"):
        curve(tmp_path / "old")
    write_run(tmp_path / "quiet", [record(0, 0.5, 0.0)])
    with pytest.raises(MissingCount, match="comm.compress=none"):
        curve(tmp_path / "quiet")


@pytest.mark.filterwarnings("ignore:'dane.paper_figs.local_work' found in sys.modules:RuntimeWarning")
def test_dane_figures_local_work_on_a_run_without_the_count_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    """`dane figures local_work` on an ordinary run, whose records count no uplink traffic: `MissingCount`'s line
    (the run and its fix), status 2, no traceback, nothing drawn."""
    from dane.experiments.cli import main as dane

    for name in ("_entry_command", "_entry_prog"):  # the dane command records its line: not for the tests after
        monkeypatch.setattr(f"dane.records.provenance.{name}", None)
    write_run(tmp_path / "runs" / "gd", [record(0, 0.5, 0.0), record(1, 0.25, 1.0)])
    with pytest.raises(SystemExit) as exit_:
        dane(["figures", "local_work", "--results", str(tmp_path / "runs"), "--out", str(tmp_path / "figs")])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: dane figures local_work: {tmp_path / 'runs' / 'gd'}: its records count no uplink traffic; run it "
        "with comm.compress=none"]
    assert not any((tmp_path / "figs").glob("local_work*"))


def test_make_figures_registers_the_figure_and_its_jobs_compose():
    from dane.experiments.config import run_spec
    from dane.synthetic.sweep import compose_job

    assert "dane.paper_figs.local_work" in make_all.FIGURES and local_work.TIMED is False
    specs = [run_spec(compose_job(job)) for job in local_work.jobs()]
    assert [s.algorithm.name for s in specs] == [name for name, _ in local_work.METHODS]
    assert all(s.problem.optimum == "auto" and s.comm.workers == local_work.WORKERS for s in specs)


def test_a_class_of_ones_own_is_named_by_its_label_in_its_summary_and_the_figure(tmp_path, monkeypatch):
    """`Algorithm.label` is the display name of a class of one's own too: the run's summary.json records it (the
    package's `label_of` reads the package's conf/ only, and the figures named a command-line run of a
    ``--config-dir`` algorithm by its name), and local_work and fednl_bits name a run whose config.yaml names the
    algorithm by it; a class without one is named by its config's name, and a package algorithm by its class's
    label, as `label_of` gives it.  The runs are `dane.fit`'s, whose config.yaml names the algorithm as a
    command-line run's does (``algorithm.name``): the summary is written by the same code."""
    from dataclasses import dataclass

    import numpy as np

    import dane
    from dane.algorithm import Algorithm, AlgorithmConfig, label_of

    class Plain(Algorithm):
        name = "plain_gd"

        def __init__(self, problem, comm, lr):
            super().__init__(problem, comm)
            self.lr = lr

        def step(self):
            local_grad, local_metrics = self.problem.evaluate(self.w)
            g, metrics = self.comm.allreduce_mean([local_grad, local_metrics])
            self.w = self.w - self.lr * g
            return self.metrics(g, metrics)

    class Labelled(Plain):
        name, label = "my_gd", "My GD (fixed step)"

    @dataclass(frozen=True)
    class PlainConfig(AlgorithmConfig):
        name: str = "plain_gd"
        lr: float = 0.5
        algorithm = Plain

        def build(self, problem, comm):
            return self.algorithm(problem, comm, self.lr)

    @dataclass(frozen=True)
    class LabelledConfig(PlainConfig):
        name: str = "my_gd"
        algorithm = Labelled

    monkeypatch.setenv("DANE_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 3))
    problem = dane.problems.Ridge(X, X @ [1.0, 2.0, 3.0] + rng.standard_normal(40), lam=0.1, optimum="auto")
    runs = tmp_path / "runs"
    for folder, algorithm in (("mine", LabelledConfig()), ("plain", PlainConfig()), ("package", "gd")):
        dane.fit(problem, algorithm, workers=2, rounds=3, compress="none", out_dir=str(runs / folder))
    labels = {folder: dane.read_summary(runs / folder)["label"] for folder in ("mine", "plain", "package")}
    assert labels == {"mine": "My GD (fixed step)", "plain": "plain_gd", "package": label_of("gd")}
    assert label_of("gd") != "gd"  # the package's gd declares a label: the case above is not the name's fallback
    assert [local_work.label(runs / folder) for folder in ("mine", "plain")] == ["My GD (fixed step)", "plain_gd"]
    assert fednl_bits.label(runs / "mine") == "My GD (fixed step)"  # the other figure that names runs by method
    table = (main(runs, tmp_path / "figures")[0].parent / "local_work.md").read_text()
    assert all(f"\n| {label} | " in table for label in labels.values())


def test_bits_per_client_divides_a_count_summed_over_the_clients_only():
    """FedNL's line records ``clients_<way>_bits`` summed over the clients (÷ m per client), a federated method its
    participants' ``<way>_bytes`` (× 8 ÷ m), ``comm.compress`` a worker's own ``<way>_bits`` (as it is); none: None."""
    from dane.paper_figs.common import bits_per_client

    assert bits_per_client([{"clients_uplink_bits": 800}, {"clients_uplink_bits": 1600}], 4) == [200.0, 400.0]
    assert bits_per_client([{"clients_downlink_bits": 800}], 4, "downlink") == [200.0]
    assert bits_per_client([{"uplink_bytes": 100}], 4) == [200.0]
    assert bits_per_client([{"downlink_bits": 96}], 4, "downlink") == [96.0]
    assert bits_per_client([{"uplink_bits": 96}], 4, "downlink") is None


def test_a_record_at_the_target_is_within_it():
    """`first_within` takes the first record at or below the target (≤, as `dane.fit`'s tol), not strictly below."""
    from dane.paper_figs.local_work import first_within

    assert first_within({"relative": [1.0, 1e-8, 1e-9]}, 1e-8) == 1
    assert first_within({"relative": [1.0, 2e-8]}, 1e-8) is None


def test_runs_of_one_method_are_told_apart_by_what_differs_between_their_configs(tmp_path, monkeypatch):
    """A sweep of one method (GD at two step sizes and two m): the table's rows and the legend add, to the method's
    label, the config keys that differ between its runs, as `dane figures plot_runs` names runs; a method with one
    run keeps its label alone.  Each GD run: suboptimality 10^-t (O* = 2) at 1 pass and 64 bits a round."""
    for folder, algorithm, workers in (("a", {"name": "gd", "lr": 0.5}, 2), ("b", {"name": "gd", "lr": 0.5}, 4),
                                       ("c", {"name": "gd", "lr": 1.0}, 2), ("d", {"name": "dane", "mu": 0.0}, 2)):
        write_run(tmp_path / "runs" / folder, [record(t, 10.0 ** -t, 1.0 * workers * t, uplink_bits=64 * t)
                                               for t in range(3)], workers=workers)
        (tmp_path / "runs" / folder / "config.yaml").write_text(json.dumps({**CONFIG, "algorithm": algorithm,
                                                                             "workers": workers}))
    drawn = []
    real = local_work.save
    monkeypatch.setattr(local_work, "save", lambda fig, *a, **k: drawn.append(fig) or real(fig, *a, **k))
    main(tmp_path / "runs", tmp_path / "figures")
    rows = (tmp_path / "figures" / "local_work.md").read_text().splitlines()[-4:]
    assert [row.split(" | ")[0] for row in rows] == ["| GD (algorithm.lr=0.5, workers=2)",
                                                     "| GD (algorithm.lr=0.5, workers=4)",
                                                     "| GD (algorithm.lr=1.0, workers=2)", "| DANE"]
    assert rows[0] == (f"| GD (algorithm.lr=0.5, workers=2) | {' | '.join(['—'] * 7)} | 0.005 | not within 1e-08 "
                       "relative: stopped at round 2 (converged) |")
    assert [text.get_text() for text in drawn[0].axes[-1].get_legend().get_texts()] == \
        [row.split(" | ")[0][2:] for row in rows]


def test_a_folder_of_runs_is_drawn_in_job_order(tmp_path, monkeypatch):
    """Sweep jobs 2_ and 10_: the table's rows and the legend in job order, 2_ before 10_, the order of `dane figures
    summary` (`paper_figs.common.natural_key`), not the strings' (10_ first)."""
    from dane.paper_figs import summary

    for name in ("10_gd", "2_gd"):
        write_run(tmp_path / "runs" / name, [record(t, 10.0 ** -t, 1.0 * t, uplink_bits=64 * t) for t in range(3)])
    drawn = []
    real = local_work.save
    monkeypatch.setattr(local_work, "save", lambda fig, *a, **k: drawn.append(fig) or real(fig, *a, **k))
    main(tmp_path / "runs", tmp_path / "figures")
    rows = (tmp_path / "figures" / "local_work.md").read_text().splitlines()[-2:]
    assert [row.split(" | ")[0] for row in rows] == ["| 2_gd", "| 10_gd"]
    assert [text.get_text() for text in drawn[0].axes[-1].get_legend().get_texts()] == ["2_gd", "10_gd"]
    assert [row["job"] for row in summary.summarize(tmp_path / "runs")] == ["2_gd", "10_gd"]


def test_a_run_without_suboptimality_is_told_a_fix_its_problem_has(tmp_path):
    """`problem.optimum=auto` only where the run's config.yaml has that key (a package problem); a problem of one's
    own without it (docs/extending.md's kind) is told to report its optimum, or to draw the gradient norm; a run
    without a config.yaml both."""
    no_sub = [{"round": t, "objective": 1.0, "grad_norm": 0.5 ** t, "local_passes": t, "uplink_bits": 64 * t}
              for t in range(2)]
    own = ('a problem whose optimum is known reports it as a "suboptimality" metric (docs/extending.md); dane figures '
           "plot_runs --y grad_norm draws runs without one")
    for folder, problem in (("logreg", {"name": "logreg", "optimum": "none"}), ("centers", {"name": "centers"}),
                            ("fit", None)):
        write_run(tmp_path / folder, no_sub)
        if problem is not None:
            (tmp_path / folder / "config.yaml").write_text(json.dumps({"problem": problem}))
    fixes = {}
    for folder in ("logreg", "centers", "fit"):
        with pytest.raises(MissingCount) as caught:
            curve(tmp_path / folder)
        fixes[folder] = str(caught.value).removeprefix(f"{tmp_path / folder}: its records have no suboptimality; ")
    assert fixes == {"logreg": "run it with problem.optimum=auto",
                     "centers": f"problem=centers has no problem.optimum key to compute one: {own}",
                     "fit": f"run it with problem.optimum=auto where its problem has that key; else {own}"}
