"""The neural-network experiment files compose and validate, and the accuracy and target tables
report exactly what the runs in results/ say (the paper's numbers beside ours).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dane.comm import AlphaBeta
from dane.errors import DataError
from dane.records.results import read_rounds, read_summary
from dane.experiments.config import CONF_DIR, build, run_spec
from dane.paper_figs import accuracy_table, common, target_table
from dane.synthetic.sweep import RunIndex, ensure
from helpers import composed

EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("t*_*.yaml")
                     if p.stem.startswith(("table_", "target_")))
DIGITS = next(r for r in accuracy_table.ROWS if r.problem == "digits_mlp")



@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_table_experiment_composes_and_validates(name):
    cfg = composed(f"experiment={name}", "workers=8", name="simulate")
    assert cfg.problem.name == name.split("_", 1)[1] and cfg.tol is None
    # no reference optimum on a network: the simulator's absolute tol_abs would only say it tested nothing
    assert cfg.tol_abs is None
    assert (cfg.sim.alpha, cfg.sim.beta) == (5.5e-4, 4.0e8)  # pinned: the runs outlive a re-calibration
    try:
        spec = run_spec(cfg)
    except DataError as err:  # CIFAR-10 is not on these machines; MNIST only where ../shared/data is
        assert "cifar" in name or "does not exist" in str(err), err
        return
    assert spec.comm.workers == 8 and spec.comm.simulated


@pytest.fixture(scope="module")
def digits_results(tmp_path_factory) -> Path:
    """A results folder holding the digits-MLP row's run at 4 workers, seed 0: the accuracy table's and the retimed
    one (each test's `ensure` finds it there and runs only what is missing)."""
    root = tmp_path_factory.mktemp("results")
    ensure([accuracy_table.job(DIGITS, 4)], root=root, log=None)
    return root


def test_accuracy_table_reports_mean_and_spread_over_seeds_beside_the_paper(digits_results, tmp_path):
    found = ensure([accuracy_table.job(DIGITS, 4, seed) for seed in (0, 1)], root=digits_results, log=None)
    accs = [read_summary(run)["final_test_accuracy"] for run in found.values()]
    data = accuracy_table.collect(RunIndex(digits_results))
    cell = data["digits-MLP"]["cells"][1]  # 4 workers
    assert cell["values"] == accs and len(set(accs)) == 2  # seeds give different runs
    assert cell["mean"] == pytest.approx(sum(accs) / 2, rel=1e-15)
    assert cell["spread"] == pytest.approx(abs(accs[0] - accs[1]) / 2, rel=1e-15)
    assert data["digits-MLP"]["ours"] == [None, cell["mean"], None, None]
    summary = read_summary(next(iter(found.values())))
    assert summary["rounds"] == 20 and data["digits-MLP"]["rounds"] == 20
    # the data the numbers come from, as the runs recorded it (scikit-learn digits: 1,797 rows, 20% held out)
    assert summary["data"] == {"name": "digits", "train_size": 1437, "test_size": 360,
                               "split": "360 of 1797 rows held out (stratified, by the run's seed)"}
    assert data["MNIST-LeNet5"]["paper"] == (0.9914, 0.9897, 0.9891, 0.9887)
    text = accuracy_table.markdown(data)
    assert (f"| digits-MLP | ours, 20 rounds, batch 32, 1,437/360 train/test | — | {accuracy_table.fmt_cell(cell)} "
            "| — | — |" in text)
    assert accuracy_table.fmt_cell(cell) == f"{accuracy_table.fmt(cell['mean'])} ± {cell['spread']:.4f}"[:-6] + \
        f"{cell['spread']:.4f}".replace("0.", ".", 1) + " (n=2)"
    assert "|  | paper | .9831 | .9816 | .9813 | .9810 |" in text
    assert "digits-MLP: 1,437 train / 360 test (360 of 1797 rows held out" in accuracy_table.what(data)
    assert "mean ± half-range over seeds 0,1 (seed 2 not run); ours" in accuracy_table.what(data)
    assert r"MNIST-LeNet5 & ours (20 rounds) & -- & -- & -- & -- \\" in accuracy_table.latex(data)
    written = accuracy_table.main(digits_results, tmp_path / "figures")
    sidecar = json.loads((tmp_path / "figures" / "accuracy_table.json").read_text())
    assert sorted(sidecar["seeds"]) == [0, 1] and len(sidecar["runs"]) == 2
    assert (tmp_path / "figures" / "accuracy_table.md").read_text().startswith(sidecar["caption"] + "\n")
    assert {p.name for p in written} == {"accuracy_table.md", "accuracy_table.json", "accuracy_table.tex"}


def test_the_accuracy_table_caption_names_the_seeds_it_read():
    """Canned cells: the caption said "over seeds 0,1,2" after seed 0 alone had run (its cells "(n=1)"); it names
    the seeds that have a run, and reads as before where all three have."""
    def data(*cells):
        return {"digits-MLP": {"cells": [{"values": [0.9] * len(seeds), "seeds": list(seeds), "runs": [],
                                          "mean": 0.9, "spread": 0.0} for seeds in cells],
                               "rounds": 20, "data": [], "notes": [], "paper": None}}

    def seeds_said(caption):
        return caption.split("batch per row), ")[1].split("; ours on")[0]

    assert seeds_said(accuracy_table.what(data((0,)))) == "seed 0 alone, no spread (seeds 1,2 not run)"
    assert seeds_said(accuracy_table.what(data((0, 1), (0,)))) == "mean ± half-range over seeds 0,1 (seed 2 not run)"
    assert seeds_said(accuracy_table.what(data((0, 1, 2), (1,)))) == "mean ± half-range over seeds 0,1,2"
    assert seeds_said(accuracy_table.what(data((2, 0, 1)))) == "mean ± half-range over seeds 0,1,2"


def test_target_table_reads_the_first_record_at_the_target(tmp_path):
    target = next(t for t in target_table.TARGETS if t.problem == "digits_mlp")
    (run_dir,) = ensure([target_table.job(target, "dane")], root=tmp_path, log=None).values()
    records = read_rounds(run_dir)
    first = next(r for r in records if r["test_accuracy"] >= target.accuracy)
    cell = target_table.collect(RunIndex(tmp_path), [target])[target]
    assert cell["dane"]["hit"] == first and cell["sync_sgd"] is None
    assert cell["dane"]["final"] == records[-1]["test_accuracy"] and cell["dane"]["budget"] == 30
    text = target_table.markdown({target: cell})
    assert f"| dane | {first['round']} | {first['comm_rounds']} |" in text
    assert "| sync_sgd | no run in results/ |" in text


def test_retiming_swaps_the_allreduce_model_exactly(digits_results):
    (run_dir,) = ensure([accuracy_table.job(DIGITS, 4)], root=digits_results, log=None).values()
    summary, records = read_summary(run_dir), read_rounds(run_dir)
    # The model retime relies on: the clock's allreduce part is bytes/β + allreduces·2(m-1)α.  The
    # summary's comm time also holds the last record's own evaluation, one allreduce of the
    # float32 gradient and the 3 metrics, made after that record's counters were read.
    dim = build(composed(*accuracy_table.job(DIGITS, 4), name="simulate"), "problem").build(0, 4).dim
    bytes_total = records[-1]["bytes_sent"] + 2 * 3 * 4 * (dim + 3) // 4
    calls = records[-1]["comm_rounds"] + 1
    # the model the run was timed with, as its summary records it: the package's defaults, or the α-β of a
    # results/calibration.json that `dane calibrate` wrote into the checkout (a run reads it where it exists)
    alpha, beta = summary["alpha"], summary["beta"]
    assert summary["simulated_comm_s"] == pytest.approx(bytes_total / beta + calls * 6 * alpha, rel=1e-9)
    assert common.retime(records, summary, AlphaBeta(alpha, beta)) == records
    slow = common.retime(records, summary, AlphaBeta(1e-2, 1e6))
    back = common.retime(slow, {**summary, "alpha": 1e-2, "beta": 1e6}, AlphaBeta(alpha, beta))
    assert [r["time_s"] for r in back] == pytest.approx([r["time_s"] for r in records], rel=1e-12)
    for r, s in zip(records, slow):
        extra = r["bytes_sent"] * (1 / 1e6 - 1 / beta) + r["comm_rounds"] * 6 * (1e-2 - alpha)
        assert s["time_s"] == pytest.approx(r["time_s"] + extra, rel=1e-12)


def test_mnist_table_on_the_four_standard_files_says_standard_split(tmp_path):
    """With train-* and t10k-* present the runs use the files' own split, and the table says so: no split
    caption; the sizes are the files' (small generated IDX files here, 60,000/10,000 on real MNIST)."""
    from tests.test_data import write_mnist_pair

    data_dir = tmp_path / "data"
    write_mnist_pair(data_dir, "train", 200, seed=1)  # 100 rows a worker: one inner batch of mnist_lenet5
    write_mnist_pair(data_dir, "t10k", 20, seed=2)
    row = next(r for r in accuracy_table.ROWS if r.problem == "mnist_lenet5")
    job = (*accuracy_table.job(row, 2), f"data_dir={data_dir}")
    (run_dir,) = ensure([job], root=tmp_path / "results", log=None).values()
    assert read_summary(run_dir)["data"] == {"name": "mnist", "train_size": 200, "test_size": 20, "split": "standard"}
    data = accuracy_table.collect(RunIndex(tmp_path / "results"), [row])
    assert data["MNIST-LeNet5"]["cells"][0]["values"] == [read_summary(run_dir)["final_test_accuracy"]]
    assert "MNIST-LeNet5: 200 train / 20 test;" in accuracy_table.what(data) + ";"
    assert "split" not in accuracy_table.data_caption(data)
