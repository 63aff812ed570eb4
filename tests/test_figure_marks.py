"""What a figure or table says of the runs it draws, from tiny canned runs: every curve its own look however many
runs a sweep has, the tolerance each table compares named absolute or relative, a failed job's reason, and a value
below a log axis's floor said on the figure."""
from __future__ import annotations

import json

import matplotlib.pyplot as plt
import pytest

from dane.paper_figs import fednl_bits, local_work, plot_runs, run_convergence, staleness, summary
from dane.paper_figs import common
from dane.paper_figs.common import positive
from dane.records.results import RunWriter


def curve_style(k: int) -> dict:
    return common.curve_style(k)


def looks(ax) -> list[tuple]:
    """Each line's colour, marker and line style, in drawing order."""
    return [(line.get_color(), line.get_marker(), line.get_linestyle()) for line in ax.lines]


def write_run(folder, subopts, *, optimum=1.0, status="converged", config=None, summary_too=True):
    """A run directory: objective O* + s, suboptimality s, uplink bits and local passes (what local_work reads)."""
    writer = RunWriter(folder)
    if config is not None:
        writer.write_text("config.yaml", json.dumps(config))  # JSON is YAML
    for t, s in enumerate(subopts):
        writer.write_round({"round": t, "time_s": 0.01 * t, "bytes_sent": 0, "comm_rounds": 2 * t,
                            "objective": optimum + s, "suboptimality": s, "uplink_bits": 64 * t,
                            "local_passes": 2.0 * t})
    if summary_too:
        writer.write_summary({"algorithm": "gd", "workers": 2, "status": status, "rounds": len(subopts) - 1,
                              "final_objective": optimum + subopts[-1], "final_suboptimality": subopts[-1],
                              "time_s": 0.01 * (len(subopts) - 1)})
    writer.close()
    return folder


def test_curve_style_is_distinct_for_the_first_400_curves_and_starts_as_matplotlib_does():
    styles = [tuple(sorted(curve_style(k).items())) for k in range(400)]
    assert len(set(styles)) == 400
    assert [curve_style(k)["color"] for k in range(10)] == [plt.matplotlib.colors.to_hex(f"C{k}") for k in range(10)]
    assert {curve_style(k)["marker"] for k in range(10)} == {"o"}
    assert {curve_style(k)["linestyle"] for k in range(100)} == {"-"}


@pytest.mark.parametrize("n", [12, 120])
def test_plot_runs_draws_every_curve_of_a_sweep_with_its_own_look(n):
    """A sweep of 12 runs (or the docs' 96 jobs and more): no two lines, nor legend entries, share colour, marker
    and line style (one "o-" style for all gave runs 1 and 11 the same look)."""
    curves = [plot_runs.Curve(f"run {k}", [0, 1, 2], [1.0, 0.1 / (k + 1), 0.01 / (k + 1)]) for k in range(n)]
    fig = plot_runs.draw(curves)
    ax = fig.axes[0]
    assert len(ax.lines) == n and len(set(looks(ax))) == n
    handles = ax.get_legend().legend_handles
    assert len({(h.get_color(), h.get_marker(), h.get_linestyle()) for h in handles}) == n
    plt.close(fig)


def test_the_other_figures_of_one_curve_a_run_take_their_looks_from_curve_style():
    """local_work, fednl_bits and staleness: the k-th run's colour and marker are `curve_style(k)`'s, the same in
    every panel, so that 12 runs are 12 looks (fednl_bits keeps its line style: FedNL solid, the others dashed)."""
    n = 12
    curves = [{"label": f"run {k}", "rounds": [0, 1, 2], "bits": [0, 64, 128], "downlink": None,
               "passes": [0, 2, 4], "relative": [1.0, 1e-3, 1e-6]} for k in range(n)]
    fig = local_work.draw(curves)
    for ax in fig.axes[:2]:
        assert looks(ax) == [(s["color"], s["marker"], s["linestyle"]) for s in map(curve_style, range(n))]
    plt.close(fig)
    fig = fednl_bits.draw([{**c, "label": ("FedNL " if k % 2 else "GD ") + c["label"]} for k, c in enumerate(curves)])
    for ax in fig.axes:
        assert [(color, marker) for color, marker, _ in looks(ax)] == \
            [(curve_style(k)["color"], curve_style(k)["marker"]) for k in range(n)]
        assert [style for *_, style in looks(ax)] == ["--", "-"] * (n // 2)
    plt.close(fig)
    variants = {f"v{k}": staleness.Curve(f"v{k}", [0, 1], [0, 10], [0.0, 1.0], [0.5, 0.6], {}, "") for k in range(n)}
    fig = staleness.draw(variants, "t")
    assert len(set(looks(fig.axes[0]))) == n
    plt.close(fig)


def test_summary_says_its_tol_is_absolute_and_local_work_that_its_target_is_relative(tmp_path, capsys):
    """One run, O* = -0.06 (|O*| as a logistic regression's): suboptimality 10^-t is 1e-8 absolute at round 8 and
    1e-8 relative (6e-10 absolute) at round 10, and each table's header says which it compared."""
    run = write_run(tmp_path / "runs" / "0_run", [10.0 ** -t for t in range(13)], optimum=-0.06)
    assert summary.main([str(tmp_path / "runs")]) == 0
    head, _, row = capsys.readouterr().out.splitlines()
    assert "| rounds/comm to suboptimality <= 1e-08 (absolute) |" in head and "| 8/16 |" in row
    # bits up/down and passes/HVPs/Hessians/factorizations at round 8 (64 and 2 a round), then at the last record, 12:
    # no downlink or second-order counts in these records (-)
    assert "| 8/16 | 512/- | 16/-/-/- | -0.06 | 1.000e-12 | 768/- | 24/-/-/- | 0.12 |" in row
    table = local_work.table([local_work.curve(run, "run")])
    assert "| run | rounds to 1e-08 relative | uplink bits to 1e-08 relative |" in table
    assert "| run | 10 | 640 |" in table


REASON = "algorithm.lr must be > 0, got -1"


def failed_sweep(root):
    """A sweep's folder: job 0 finished, job 1 refused on bad input (its error.txt, its .hydra), job 2 crashed after
    two records (no summary; a traceback), job 3 refused with a '|' in its line."""
    write_run(root / "0", [1.0, 0.1, 0.01], config={"algorithm": {"name": "gd", "lr": 0.1}})
    (root / "1" / ".hydra").mkdir(parents=True)
    (root / "1" / "error.txt").write_text(f"error: {REASON}\n")
    write_run(root / "2", [1.0, 0.5], summary_too=False)
    (root / "2" / "error.txt").write_text("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                                          "MemoryError: out of memory\n")
    (root / "3").mkdir()
    (root / "3" / "error.txt").write_text("error: logger must be jsonl|mlflow\n")
    return root


def test_a_failed_jobs_reason_is_in_the_summary_and_in_plot_runs(tmp_path, capsys):
    """The first line of a failed job's error.txt (its "error: " dropped; a traceback's last line) follows "failed"
    in the summary's row (a "|" escaped in the markdown) and in the JSON's reason, and after plot_runs's "skipped"
    or "no summary" line."""
    root = failed_sweep(tmp_path / "sweep")
    assert summary.main([str(root)]) == 0
    rows = capsys.readouterr().out.splitlines()[2:]
    assert [r.split(" | ")[:3] for r in rows] == [["| 0", "GD", "converged"], ["| 1", "-", f"failed: {REASON}"],
                                                  ["| 2", "-", "failed: MemoryError: out of memory"],
                                                  ["| 3", "-", "failed: logger must be jsonl\\|mlflow"]]
    assert summary.main([str(root), "--json"]) == 0
    assert [(r["status"], r["reason"]) for r in json.loads(capsys.readouterr().out)] == [
        ("converged", None), ("failed", REASON), ("failed", "MemoryError: out of memory"),
        ("failed", "logger must be jsonl|mlflow")]
    assert plot_runs.main([str(root), "--out", str(tmp_path / "fig.png")]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [f"skipped {root / '1'}: no rounds.jsonl; failed: {REASON}",
                   f"{root / '2'}: no summary: failed (MemoryError: out of memory); drawn up to its last record, "
                   "round 1, marked in the legend",
                   f"skipped {root / '3'}: no rounds.jsonl; failed: logger must be jsonl|mlflow"]


def floor_notes(ax) -> list[str]:
    return [t.get_text() for t in ax.texts if t.get_gid() == "floored"]


def test_a_value_below_the_floor_is_said_on_the_figure_and_only_then(tmp_path):
    """8.9e-30 (or an exact 0) on a log axis is drawn at 1e-16: the axes say so, once; above it they say nothing."""
    tiny = [1.0, 1e-8, 8.9e-30]
    fig, ax = plt.subplots()
    assert positive([1.0, 1e-3], ax=ax) == [1.0, 1e-3] and floor_notes(ax) == []
    assert positive(tiny, ax=ax) == [1.0, 1e-8, 1e-16] and positive([0.0], ax=ax) == [1e-16]
    assert floor_notes(ax) == ["values below 1e-16 drawn at 1e-16"]
    plt.close(fig)
    for data, notes in (([1.0, 1e-3, 1e-6], []), (tiny, ["values below 1e-16 drawn at 1e-16"])):
        fig = plot_runs.draw([plot_runs.Curve("a", [0, 1, 2], [1.0, 0.1, 0.01]), plot_runs.Curve("b", [0, 1, 2], data)])
        assert floor_notes(fig.axes[0]) == notes and len(fig.axes[0].lines) == 2
        plt.close(fig)
        fig = local_work.draw([{"label": "a", "rounds": [0, 1, 2], "bits": [0, 64, 128], "downlink": None,
                                "passes": [0, 2, 4], "relative": data}])
        assert [floor_notes(ax) for ax in fig.axes] == [notes, notes, [], notes]  # no downlink: no line there
        plt.close(fig)
    run = write_run(tmp_path / "run", tiny)
    fig = run_convergence.draw(run)
    assert [floor_notes(ax) for ax in fig.axes] == [["values below 1e-16 drawn at 1e-16"]] * 2
    plt.close(fig)


def objective_run(folder, objectives):
    """A run directory whose records have an objective alone (no optimum known, no gradient norm recorded)."""
    writer = RunWriter(folder)
    for t, value in enumerate(objectives):
        writer.write_round({"round": t, "time_s": 0.01 * t, "bytes_sent": 0, "comm_rounds": 2 * t, "objective": value})
    writer.close()
    return folder


def test_run_convergence_reads_the_objectives_sign_before_the_floor(tmp_path):
    """An objective that goes below 0 was floored at 1e-16 before the check that chooses a log axis only for an
    objective above 0 throughout, so that it was drawn at 1e-16 on a log axis; the check reads the values as recorded:
    a linear axis draws them as they are.  An objective above 0 throughout keeps its log axis (a value below the floor
    said there), and a negative suboptimality is drawn at the floor and said, as a value below the floor is."""
    cases = {"negative objective": (objective_run(tmp_path / "a", [0.5, -0.2, -0.3]), "linear", [0.5, -0.2, -0.3], []),
             "tiny objective": (objective_run(tmp_path / "b", [0.5, 1e-3, 1e-20]), "log", [0.5, 1e-3, 1e-16],
                                ["values below 1e-16 drawn at 1e-16"]),
             "negative suboptimality": (write_run(tmp_path / "c", [1.0, 1e-3, -1e-9]), "log", [1.0, 1e-3, 1e-16],
                                        ["values below 1e-16 drawn at 1e-16"])}
    drawn = {}
    for name, (run, *_) in cases.items():
        fig = run_convergence.draw(run)
        drawn[name] = [(ax.get_yscale(), [float(y) for y in ax.lines[0].get_ydata()], floor_notes(ax)) for ax in fig.axes]
        plt.close(fig)
    assert drawn == {name: [tuple(expected)] * 2 for name, (_, *expected) in cases.items()}
