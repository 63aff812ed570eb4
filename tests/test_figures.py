"""Figure scripts draw non-empty PNG + PDF from a small fake results tree whose numbers are known,
and the numbers they extract (time to 1e-8, rounds to 1e-10, the best μ) are the right ones; the figures of the
benchmarks are drawn from the tracked JSON in paper_figs/evidence/, their sidecars naming it."""
from __future__ import annotations

import json
import math

import pytest
import yaml
from omegaconf import OmegaConf

from dane.records.results import RunWriter
from dane.experiments.config import cost_model
from dane.paper_figs import (convergence, federated_scale, fednl_bits, local_work, make_all, ps_scaling, rounds_table,
                             run_convergence, speedup, staleness)
from dane.records.provenance import code_version
from dane.problems import ridge
from dane.paper_figs.common import EVIDENCE_DIR, FIGURE_COST, M_GRID, N_GRID, MissingRuns, cost_caption, save
from dane.paper_figs.provenance import caption_line, figure_provenance
from dane.synthetic.sweep import RunIndex, composed_job, job_name
from helpers import REPO


#: safe_dump's dumper in C where PyYAML has libyaml (as `read_config`'s loader): the same text, 5x faster
SAFE_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def fake_run(root, job, subopts, *, times=None, status=None, setup_s=0.0, extra=None):
    """A run directory as `experiments.simulate` would write it for ``job``, with the given curve (and ``extra``
    keys in every record)."""
    cfg = composed_job(tuple(job))
    out = root / job_name(job)
    writer = RunWriter(out)
    writer.write_text("config.yaml", yaml.dump(cfg, Dumper=SAFE_DUMPER))
    times = times or [0.01 * k for k in range(len(subopts))]
    for k, (s, t) in enumerate(zip(subopts, times)):
        writer.write_round({"round": k, "time_s": t, "bytes_sent": 0, "comm_rounds": 2 * k, "objective": 1 + s,
                            "suboptimality": s, **(extra or {})})
    status = status or ("converged" if subopts[-1] <= cfg["tol_abs"] else "max_rounds")  # the figures' absolute tol
    summary = {"algorithm": cfg["algorithm"]["name"], "workers": cfg["workers"], "status": status,
               "rounds": len(subopts) - 1, "final_suboptimality": subopts[-1], "final_objective": 1 + subopts[-1],
               "setup_s": setup_s,
               "backend": "simulator" if cfg["workers"] > 1 else "local"}
    if cfg["workers"] > 1:
        cost = cost_model(OmegaConf.create(cfg["sim"]))
        summary.update(cost.describe(), simulated_comm_s=0.001 * (len(subopts) - 1))
    writer.write_summary(summary)
    writer.close()
    return out


def reaching_at(rounds: int) -> list[float]:
    """Suboptimality above 1e-10 until round ``rounds``, 1e-11 there."""
    return [1.0 / (k + 1) for k in range(rounds)] + [1e-11]


def plain_rounds(mu: float) -> int:
    return 5 + round(10 * abs(math.log10(mu) + 1))  # best at μ=0.1: 5 rounds


# The fake results tree, made in stages, each a module fixture that adds to the one before (one folder): a test
# asks for the first stage that holds every run it reads, so that no one test pays for composing the whole tree.
# The full tree (`results`) is the same, run for run, as one pass in the order speedup, rounds, ps, convergence,
# ... makes: the stages' jobs are distinct folders, and convergence only fills what the earlier stages lack.


@pytest.fixture(scope="module")
def speedup_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    for regime in speedup.REGIMES:
        for n in regime.ns:
            for m in regime.ms:
                # time_s k n/(1e6 m); first <= 1e-8 at round 3; setup 0.5/m
                fake_run(root, speedup.job(n, m, regime.dim), [1, 1e-3, 1e-6, 1e-9, 1e-12],
                         times=[k * n / (1e6 * m) for k in range(5)], setup_s=0.5 / m)
    return root


@pytest.fixture(scope="module")
def ps_runs(speedup_runs):
    for k, topology in enumerate(ps_scaling.TOPOLOGIES):
        for m in ps_scaling.WORKERS:  # round time (k+1) m ms
            fake_run(speedup_runs, ps_scaling.job(topology, m), [1.0] * 11,
                     times=[t * (k + 1) * m * 1e-3 for t in range(11)], status="max_rounds")
    return speedup_runs


@pytest.fixture(scope="module")
def rounds_runs(ps_runs):
    for n in N_GRID:
        for m in M_GRID:
            if m >= 16:
                fake_run(ps_runs, rounds_table.plain_job(n, m, 0.0), [1, 10, 1e3, math.inf], status="diverged")
            else:
                fake_run(ps_runs, rounds_table.plain_job(n, m, 0.0), reaching_at(3))
            for mu in rounds_table.MUS:
                curve = [1e-3] * 101 if m == 64 else reaching_at(plain_rounds(mu))
                fake_run(ps_runs, rounds_table.plain_job(n, m, mu), curve)
    return ps_runs


@pytest.fixture(scope="module")
def convergence_runs(rounds_runs):
    for job in convergence.jobs():
        if not (rounds_runs / job_name(job)).exists():  # safeguarded DANE, iso, is the speedup grid's (18000, 8)
            fake_run(rounds_runs, job, [10.0 ** -k for k in range(12)])
    return rounds_runs


@pytest.fixture(scope="module")
def results(convergence_runs):
    root = convergence_runs
    for job in staleness.jobs():  # its numbers are checked in test_staleness_figure.py
        fake_run(root, job, [1.0] * (composed_job(job)["rounds"] + 1), status="max_rounds")
    for job in fednl_bits.jobs():  # its numbers are checked in test_fednl_figure.py
        fake_run(root, job, [1.0, 1e-3, 0.0], status="converged", extra={"uplink_bits": 6400})
    for job in local_work.jobs():  # its numbers are checked in test_local_work_figure.py
        fake_run(root, job, [1.0, 1e-3, 0.0], status="converged", extra={"uplink_bits": 6400, "local_passes": 8.0})
    return root


def test_speedup_extracts_time_to_1e8_and_splits_it(speedup_runs, tmp_path):
    times = speedup.table(RunIndex(speedup_runs))
    latency, compute = times.values()
    for n in N_GRID:
        for m, p in zip(M_GRID, latency[n]):
            assert p.total == pytest.approx(0.5 / m + 3 * n / (1e6 * m), rel=1e-12)
            # the fake records send no bytes: communication is 2(m-1)α per allreduce, 2 allreduces a round
            assert p.comm == pytest.approx(6 * 2 * (m - 1) * FIGURE_COST.alpha, rel=1e-12)
            assert p.compute + p.comm == pytest.approx(p.total, rel=1e-12)
    assert [p.total for p in compute[64000]] == pytest.approx([0.5 / m + 3 * 0.064 / m for m in (1, 2, 4, 8, 16, 32)])
    assert "| 18000 | 0.554 = 0.554 + 0.000 |" in speedup.markdown(times)
    # the setting from the runs' configs: N, d and m per regime, λ over all
    assert "| compute-dominated, d = 2000: N \\ m | 1 | 2 |" in speedup.markdown(times)
    drawn = speedup.draw(times)
    assert [" ".join(ax.get_title().split()) for ax in drawn.axes[:2]] == [
        "latency-dominated (the paper's grid): N = 6,000 / 10,000 / 14,000 / 18,000, d = 500",
        "compute-dominated: N = 64,000, d = 2000"]
    assert " ".join(drawn.get_suptitle().split()).startswith(
        "Safeguarded DANE, ridge_synthetic on generated data (iso covariance), N = 6,000 / 10,000 / 14,000 / 18,000 / "
        "64,000, d = 500 / 2000, m = 1 / 2 / 4 / 8 / 16 / 32 / 64, λ = 0.005, stop rule not recorded: simulated time "
        "under α=550 µs")
    paths = save(drawn, tmp_path, "speedup")
    assert all(p.stat().st_size > 1000 for p in paths) and {p.suffix for p in paths} == {".png", ".pdf"}


@pytest.mark.slow
def test_figures_are_the_same_bytes_when_drawn_twice_and_carry_provenance(results, tmp_path):
    first = {p.name: p.read_bytes() for p in speedup.main(results, tmp_path / "a")}
    second = {p.name: p.read_bytes() for p in speedup.main(results, tmp_path / "b")}
    assert first == second and set(first) == {"speedup.png", "speedup.pdf", "speedup.md", "speedup.json"}
    sidecar = json.loads(first["speedup.json"])
    assert len(sidecar["runs"]) == len(speedup.jobs()) and sidecar["seeds"] == [0]
    code = code_version()  # the fake runs' writer recorded it, marked where this checkout has changes
    assert sidecar["commits"] == [code["git_commit"] + " (modified tree)" * bool(code["git_dirty"])]
    assert sidecar["cost"] == cost_caption() and "α=550 µs" in sidecar["caption"]
    assert first["speedup.md"].decode().splitlines()[0] == sidecar["caption"]


def test_ps_scaling_reads_time_per_round_and_the_communication_part(ps_runs, tmp_path):
    per_round, comm, real, runs = ps_scaling.table(ps_runs)
    assert real == {} and len(runs) == len(ps_scaling.jobs())
    for k, topology in enumerate(ps_scaling.TOPOLOGIES):
        assert per_round[topology] == pytest.approx([(k + 1) * m * 1e-3 for m in ps_scaling.WORKERS], rel=1e-9)
        assert comm[topology] == pytest.approx([1e-3] * len(ps_scaling.WORKERS), rel=1e-9)
    assert "| 1 parameter server | 4.00 (1.00) | 8.00 (1.00) |" in ps_scaling.markdown(per_round, comm, real)
    # the model panel: one server's 4 MB allreduce grows exactly as m, four servers' is a quarter of its bandwidth part
    one, four = ps_scaling.MODELS["1 parameter server"], ps_scaling.MODELS["4 parameter servers"]
    n = ps_scaling.MESSAGES["4 MB"]
    assert one.allreduce_time(n, 64) == pytest.approx(32 * one.allreduce_time(n, 2), rel=1e-12)
    assert four.allreduce_time(n, 8) - 16 * four.alpha == pytest.approx((one.allreduce_time(n, 8) - 16 * one.alpha) / 4)
    paths = ps_scaling.main(ps_runs, tmp_path)
    assert {p.name for p in paths} == {f"ps_scaling.{ext}" for ext in ("png", "pdf", "md", "json")}


def test_rounds_table_marks_divergence_and_best_mu(rounds_runs, tmp_path):
    data = rounds_table.table(RunIndex(rounds_runs))
    assert data["μ=0"][6000, 8] == ("reached", 3.0, 0.0)
    assert data["μ=0"][6000, 16][0] == "diverged"
    assert data["best fixed μ"][18000, 4] == ("reached", 5.0, 0.1)
    assert data["best fixed μ"][18000, 64][0] == "not reached"
    assert data["safeguarded"][10000, 64] == ("reached", 4.0, None)
    text = rounds_table.markdown(data)
    assert "| 6000 | 3 | 3 | 3 | 3 | div | div |" in text
    assert "5 (μ=0.1)" in text and "—" in text
    written = rounds_table.main(rounds_runs, tmp_path / "out")  # title and caption: the runs' setting
    assert all(p.stat().st_size > 1000 for p in written if p.suffix in (".png", ".pdf"))
    setting = ("ridge_synthetic on generated data (iso covariance), N = 6,000 / 10,000 / 14,000 / 18,000, d = 500, "
               "m = 1 / 2 / 4 / 8 / 16 / 64, λ = 0.005, stop rule not recorded")
    caption = json.loads((tmp_path / "out" / "rounds_table.json").read_text())["caption"]
    assert caption.startswith(f"Rounds of DANE to suboptimality 1e-10, μ=0, the best fixed μ, safeguarded: {setting}; ")
    assert (tmp_path / "out" / "rounds_table.md").read_text().startswith(caption + "\n\nRounds of DANE to ")
    assert " ".join(rounds_table.draw(data, setting=setting).get_suptitle().split()) == \
        f"Rounds of DANE to suboptimality 1e-10: {setting}"
    assert len(written) == 4


def test_convergence_reads_all_panels(convergence_runs, tmp_path):
    import matplotlib.pyplot as plt

    assert convergence.COVARIANCES == ridge.COVARIANCES  # a row for every problem.covariance (restated there)
    data = convergence.curves(RunIndex(convergence_runs))
    assert len(data) == 10
    assert data["iso", "DANE (safeguarded)"]["suboptimality"] == [1, 1e-3, 1e-6, 1e-9, 1e-12]
    assert data["decay", "GD (default step)"]["suboptimality"][3] == pytest.approx(1e-3)
    assert data["iso", "ADMM (default ρ)"]["comm_rounds"][:3] == [0, 2, 4]
    fig = convergence.draw(data)
    # the α-β every time is put on (FIGURE_COST, the package default: 550 µs, 0.4 GB/s) is on the image
    assert all(ax.get_xlabel().startswith("simulated time (s) at α=550 µs, β=0.4 GB/s") for ax in fig.axes[1::2])
    # the setting as the runs' config.yaml records it (the fake summaries carry no stop rule)
    setting = ("ridge_synthetic on generated data (iso covariance) / generated data (decay covariance), N = 18,000, "
               "d = 500, m = 8, λ = 0.005, stop rule not recorded")
    assert " ".join(fig.get_suptitle().split()) == (f"{setting} Simulated times re-timed to one ring-allreduce α-β, not "
                                                    "calibrated: α=550 µs, β=0.4 GB/s (package default α-β (Horovod, "
                                                    "loopback, 2 cores))")
    plt.close(fig)
    # its figure and table, under the caption: 10^-k reaches 1e-8 at round 8 (16 allreduces, 0.08 s); the safeguarded
    # iso run (the speedup grid's) at round 3, 6 allreduces, 3 x 18000 / (1e6 x 8) s
    written = convergence.main(convergence_runs, tmp_path / "out")
    assert sorted(p.name for p in written) == [f"convergence.{ext}" for ext in ("json", "md", "pdf", "png")]
    assert all(p.stat().st_size > 1000 for p in written if p.suffix in (".png", ".pdf"))
    caption, _, intro, _, head, rule, *rows = (tmp_path / "out" / "convergence.md").read_text().splitlines()
    assert caption == json.loads((tmp_path / "out" / "convergence.json").read_text())["caption"]
    assert caption.startswith(f"Suboptimality against allreduces and simulated time: {setting}; 10 runs;")
    assert head == "| covariance | method | rounds | allreduces | simulated time (s) |" and len(rows) == 10
    assert rows[0] == "| iso | DANE (μ=0, fixed) | 8 | 16 | 0.08 |"
    assert rows[1] == "| iso | DANE (safeguarded) | 3 | 6 | 0.00675 |"


@pytest.mark.slow
def test_make_all_draws_every_figure_without_running(results, tmp_path):
    written = make_all.make_all(results, tmp_path, run_missing=False)
    figures = {f"{name}.{ext}" for name in ("speedup", "convergence", "rounds_table", "ps_scaling", "staleness",
                                            "fednl_bits", "local_work", *(e[2] for e in make_all.EVIDENCE_FIGURES))
               for ext in ("png", "pdf")}
    assert figures <= {p.name for p in written}  # the NN tables are drawn too when their runs exist
    assert all(p.stat().st_size > 1000 for p in written if p.name in figures)


def docs_bytes() -> dict:
    return {p: p.read_bytes() for p in sorted((REPO / "docs").rglob("*")) if p.is_file()}


@pytest.mark.parametrize("entry", make_all.EVIDENCE_FIGURES, ids=lambda entry: entry[2])
def test_make_all_draws_the_benchmarks_figures_from_the_tracked_evidence(entry, tmp_path):
    """`make figures` draws these with no run, from paper_figs/evidence/, each with a sidecar naming the files it
    read (and a caption heading its table); the pages' blocks are not rewritten."""
    module, files, name = entry
    docs = docs_bytes()
    written = make_all.evidence_figures(tmp_path, table=(entry,))
    assert sorted(p.name for p in written) == sorted(f"{name}.{ext}" for ext in ("png", "pdf", "md", "json"))
    assert all(p.stat().st_size > 1000 for p in written if p.suffix in (".png", ".pdf"))
    sidecar = json.loads((tmp_path / f"{name}.json").read_text())
    named = [f"paper_figs/evidence/{file}" for file in files]
    assert sidecar["figure"] == name and sidecar["json"] == named == [b["json"] for b in sidecar["benchmarks"]]
    # each file dated and loaded: by its one run, or (written in parts) by the range of its parts
    assert all((b["started_at"] and b["machine"]["load_avg"]) if "parts" not in b else
               (b["dates"][0] < b["dates"][1] and b["load_avg_1min"]) for b in sidecar["benchmarks"])
    # the commands that made them, every one from the file itself or the Evidence table
    assert sidecar["commands"] and not any("not recorded" in c for c in sidecar["commands"])
    assert all(path in sidecar["caption"] for path in named) and "results/bench.json" not in json.dumps(sidecar)
    assert (tmp_path / f"{name}.md").read_text().splitlines()[0] == sidecar["caption"]
    assert docs_bytes() == docs


def test_an_evidence_figure_without_its_files_is_one_line(tmp_path, capfd):
    assert make_all.evidence_figures(tmp_path / "out", evidence=tmp_path) == []
    err = capfd.readouterr().err.splitlines()
    assert len(err) == len(make_all.EVIDENCE_FIGURES) and err[0].startswith("make_all: no compressed: ")
    assert not (tmp_path / "out").exists()


def test_federated_scale_names_the_evidence_json_it_read(tmp_path, capsys):
    """--json of a tracked file: the sidecar and the table name that file, not results/bench.json."""
    path = EVIDENCE_DIR / "federated_scale_phishing.json"
    written = federated_scale.main(["--json", str(path), "--out", str(tmp_path)])
    assert [str(p) for p in written] == capsys.readouterr().out.split()
    sidecar = json.loads((tmp_path / "federated_scale.json").read_text())
    assert sidecar["json"] == ["paper_figs/evidence/federated_scale_phishing.json"] and sidecar["rounds"] == "5 rounds"
    assert sidecar["benchmarks"][0]["started_at"] == json.loads(path.read_text())["federated_scale"]["started_at"]
    assert "(paper_figs/evidence/federated_scale_phishing.json `federated_scale`)" in \
        (tmp_path / "federated_scale.md").read_text().splitlines()[2]


def test_missing_runs_are_named(tmp_path):
    with pytest.raises(MissingRuns, match=f"{len(speedup.jobs())} run"):
        speedup.table(RunIndex(tmp_path))


def test_run_convergence_draws_into_the_run_dir(speedup_runs):
    run = speedup_runs / job_name(speedup.job(6000, 2))
    paths = run_convergence.main([str(run)])
    assert [p.name for p in paths] == ["convergence.png", "convergence.pdf"]
    assert all(p.stat().st_size > 1000 for p in paths)


def test_run_convergence_states_the_clock_and_the_cost_model_on_the_figure(tmp_path):
    """`make run`'s figure: a simulated run's time axis gives its α and β and the title whether they were calibrated
    (the summary's calibration_file, or sim.alpha set by hand in config.yaml, or the package's defaults); a launched
    run's is its wall clock, with no cost model."""
    import matplotlib.pyplot as plt

    def run(name, **summary):
        folder = tmp_path / name
        writer = RunWriter(folder)
        for k in range(3):
            writer.write_round({"round": k, "time_s": 0.01 * k, "suboptimality": 10.0 ** -k, "objective": 1.0})
        writer.write_summary({"algorithm": "dane", "problem": "ridge_synthetic", "workers": 2, "status": "converged",
                              **summary})
        writer.close()
        return folder

    simulated = {"backend": "simulator", "time_s_clock": "simulated"}
    default = run("default", **simulated, alpha=5.5e-4, beta=4e8, calibration="alpha-beta only")
    calibrated = run("calibrated", **simulated, alpha=2e-4, beta=1.2e9, calibration="alpha-beta only",
                     calibration_file={"path": "results/calibration.json", "sha256": "0" * 64, "host": "vm",
                                       "measured_at": "2026-11-30T10:00:00+0000"})
    by_hand = run("by_hand", **simulated, alpha=1e-3, beta=4e8, calibration="alpha-beta only")
    (by_hand / "config.yaml").write_text("sim:\n  alpha: 0.001\n  beta: null\n")
    launched = run("launched", backend="horovod", time_s_clock="wall")
    expected = {
        default: ("simulated time (s) at α=550 µs, β=0.4 GB/s",
                  "simulated time: α=550 µs, β=0.4 GB/s (not calibrated: the package's default α-β)"),
        calibrated: ("simulated time (s) at α=200 µs, β=1.2 GB/s", "simulated time: α=200 µs, β=1.2 GB/s "
                     "(calibrated: results/calibration.json on vm, 2026-11-30)"),
        by_hand: ("simulated time (s) at α=1 ms, β=0.4 GB/s",
                  "simulated time: α=1 ms, β=0.4 GB/s (not calibrated, sim.alpha set by hand)"),
    }
    for folder, (axis, line) in expected.items():
        fig = run_convergence.draw(folder)
        assert fig.axes[1].get_xlabel() == axis
        assert fig.get_suptitle().split("\n") == ["dane ridge_synthetic, 2 worker(s), simulator: converged", line]
        plt.close(fig)
    fig = run_convergence.draw(launched)
    assert fig.axes[1].get_xlabel() == "time (s), wall clock (horovod)" and "α" not in fig.get_suptitle()
    plt.close(fig)


def test_dane_vs_admm_picks_the_best_admm_start_and_draws_the_central_reference(tmp_path, monkeypatch):
    from dane.records.results import read_rounds
    from dane.paper_figs import dane_vs_admm

    monkeypatch.setattr(dane_vs_admm, "has_data", lambda row: True)
    losses = {0.1: [2.3, 0.9, 0.5], 0.3: [2.3, 0.6, 0.2], 1.0: [2.3, 1.5, float("nan")], 3.0: [2.3, 2.2, 2.1],
              10.0: [2.3, 2.3, 2.25]}
    for job in dane_vs_admm.jobs():
        out = tmp_path / job_name(job)
        cfg = composed_job(tuple(job))
        rho = cfg["algorithm"].get("rho") if cfg["algorithm"]["name"] == "admm" else None
        curve = losses[rho] if rho is not None else ([2.3, 0.4, 0.1] if cfg["workers"] == 4 else [2.3, 0.2, 0.05])
        writer = RunWriter(out)
        writer.write_text("config.yaml", yaml.safe_dump({**cfg, "rounds": 2}))
        for k, loss in enumerate(curve):
            writer.write_round({"round": k, "time_s": k, "bytes_sent": 0, "comm_rounds": k, "objective": loss,
                                "test_loss": loss, "test_accuracy": 1 - loss / 3})
        writer.write_summary({"algorithm": cfg["algorithm"]["name"], "workers": cfg["workers"], "rounds": 30,
                              "status": "max_rounds", "data": {"name": "mnist", "train_size": 8000, "test_size": 2000,
                                                               "split": "t10k split"}})
        writer.close()
    data = dane_vs_admm.collect(RunIndex(tmp_path))
    assert data["best_rho"] == 0.3  # lowest final test loss; the nan run is never chosen
    assert data["central"]["test_loss"][-1] == 0.05 and data["dane"]["test_loss"] == [2.3, 0.4, 0.1]
    fig = dane_vs_admm.draw(data)
    loss_ax = fig.axes[0]
    reference = [line for line in loss_ax.lines if line.get_linestyle() == ":"]
    assert [list(line.get_ydata()) for line in reference] == [[0.05, 0.05]]
    paths = dane_vs_admm.main(tmp_path, tmp_path / "figures")
    sidecar = json.loads((tmp_path / "figures" / "dane_vs_admm.json").read_text())
    assert sidecar["best_admm_rho"] == 0.3 and len(sidecar["runs"]) == 2 + len(dane_vs_admm.ADMM_RHOS)
    assert "8,000 train / 2,000 test (t10k split)" in sidecar["caption"] and "paper: 60,000/10,000" in sidecar["caption"]
    assert {p.suffix for p in paths} == {".png", ".pdf", ".md", ".json"}
    assert read_rounds(tmp_path / job_name(dane_vs_admm.admm_job(0.3)))[-1]["test_loss"] == 0.2


def logged_run(root, name, rounds=5):
    """A finished run directory whose suboptimality 10^-k reaches 1e-3 at round 3 (job 0 of a sweep, say)."""
    writer = RunWriter(root / name)
    for k in range(rounds + 1):
        writer.write_round({"round": k, "time_s": 0.01 * k, "bytes_sent": 0, "comm_rounds": k,
                            "objective": 1 + 10.0 ** -k, "suboptimality": 10.0 ** -k})
    writer.write_summary({"algorithm": "gd", "workers": 1, "status": "converged", "rounds": rounds,
                          "final_objective": 1 + 10.0 ** -rounds, "final_suboptimality": 10.0 ** -rounds,
                          "time_s": 0.01 * rounds})
    writer.close()
    return root / name


def damage(run, how):
    """rounds.jsonl of ``run`` moved away, with line 3 garbage, invalid UTF-8 appended, a directory, or a record
    without its round; the problem the summary's status names."""
    log = run / "rounds.jsonl"
    if how == "missing":
        log.rename(run.parent / "moved.jsonl")
        return "no rounds.jsonl"
    if how == "directory":
        log.unlink()
        log.mkdir()
        return "rounds.jsonl unreadable (is a directory)"
    lines = log.read_bytes().splitlines(keepends=True)
    if how == "line3":
        lines[2] = b"garbage\n"
    elif how == "utf8":
        lines.append(b"\xff\xfe\x00garbage\n")
    elif how == "no_round":
        lines[2] = lines[2].replace(b'"round": 2, ', b"")
    log.write_bytes(b"".join(lines))
    return f"rounds.jsonl damaged (line {7 if how == 'utf8' else 3})"


DAMAGES = ("missing", "line3", "utf8", "directory", "no_round")


@pytest.mark.parametrize("how", DAMAGES)
def test_the_summary_table_names_a_missing_or_damaged_log_in_its_row_and_one_line(tmp_path, capsys, how):
    """A job whose rounds.jsonl is gone or damaged: its row says so (not "-", as if the target was never reached,
    nor round 1 beside the summary's round-5 numbers), one line names the file and the fix, and the status is 2."""
    from dane.paper_figs import summary

    bad, good = logged_run(tmp_path, "0_job"), logged_run(tmp_path, "1_job")
    problem = damage(bad, how)
    assert summary.main([str(tmp_path), "--tol", "1e-3"]) == 2
    out, err = capsys.readouterr()
    rows = {line.split(" | ")[0][2:]: line for line in out.splitlines()[2:]}
    to_tol = "?" if how in ("missing", "directory", "line3", "no_round") else "3/3"  # the records before the damage
    counts = "?" if to_tol == "?" else "-"  # bits and work to tol: ? as the rounds; reached, none counted (-)
    assert rows["0_job"].startswith(f"| 0_job | GD | converged; {problem} | gd | 1 | 5 | {to_tol} | {counts} | "
                                    f"{counts} | ")
    assert rows["1_job"].startswith("| 1_job | GD | converged | gd | 1 | 5 | 3/3 | - | - | ")
    (line,) = err.splitlines()
    assert line.startswith(f"error: {bad / 'rounds.jsonl'}") and "Traceback" not in err
    assert line.endswith(f"rerun the run (out_dir={bad} overwrite=true replaces it)")
    assert [r["status"] for r in summary.summarize(tmp_path, tol=1e-3)] == [f"converged; {problem}", "converged"]


def test_the_summary_compares_grad_norm_for_a_run_without_a_reference_optimum(tmp_path, capsys):
    """Without --key, a run whose records carry no suboptimality (its problem has no reference optimum) is compared
    by its grad_norm, absolute, and the column's header names it; beside a run with suboptimality the header names
    both and marks the other's cells; --key suboptimality asks for that key alone (every cell of such a run: -).
    The run: grad_norm 4^-t, first <= 1e-2 at round 4 (8 allreduces); the other's suboptimality 10^-t at round 2."""
    from dane.paper_figs import summary

    writer = RunWriter(tmp_path / "own" / "0_own")
    for t in range(6):
        writer.write_round({"round": t, "comm_rounds": 2 * t, "objective": 1.0 + 4.0 ** -t, "grad_norm": 4.0 ** -t})
    writer.write_summary({"algorithm": "dane", "workers": 2, "status": "max_rounds", "rounds": 5,
                          "final_objective": 1.0 + 4.0 ** -5, "time_s": 0.5})
    writer.close()
    work = "passes/HVPs/Hessians/factorizations"
    head = (f"| job | method | status | algorithm | workers | rounds | {{}} | bits up/down to tol | {work} to tol | "
            f"final objective | final suboptimality | bits up/down | {work} | time_s |")
    own = "| 0_own | DANE | max_rounds | dane | 2 | 5 | {} | - | - | 1.000976562 | - | - | - | 0.5 |"
    assert summary.main([str(tmp_path / "own"), "--tol", "1e-2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [lines[0], lines[2]] == [head.format("rounds/comm to grad_norm <= 0.01 (absolute)"), own.format("4/8")]
    assert summary.main([str(tmp_path / "own"), "--tol", "1e-2", "--key", "suboptimality"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [lines[0], lines[2]] == [head.format("rounds/comm to suboptimality <= 0.01 (absolute)"), own.format("-")]
    logged_run(tmp_path / "own", "1_job")
    assert summary.main([str(tmp_path / "own"), "--tol", "1e-2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == head.format("rounds/comm to suboptimality <= 0.01 (absolute; * grad_norm <= 0.01: a run "
                                   "without suboptimality)")
    assert [line.split(" | ")[6] for line in lines[2:]] == ["4/8 *", "2/2"]
    assert [r["key"] for r in summary.summarize(tmp_path / "own", tol=1e-2)] == ["grad_norm", "suboptimality"]


def test_a_running_job_and_a_failed_one_are_no_damage(tmp_path, capsys):
    """A job still writing (a torn last line, no summary) or one that never logged is what a sweep leaves: its
    row as before, no line, status 0."""
    from dane.paper_figs import summary

    running = logged_run(tmp_path, "0_running")
    (running / "summary.json").unlink()
    with open(running / "rounds.jsonl", "a") as f:
        f.write('{"round": 6, "obj')
    (tmp_path / "1_failed" / ".hydra").mkdir(parents=True)
    assert summary.main([str(tmp_path), "--tol", "1e-3"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "| 0_running | - | running or crashed | - | - | 5 | 3/3 | - | - |" in out
    assert "| 1_failed | - | failed |" in out


@pytest.fixture(scope="module")
def unreadable_logs(tmp_path_factory):
    """One folder of runs for `test_run_convergence_and_plot_runs_name_an_unreadable_log_in_one_line`: a finished run
    and, beside it, one run damaged in each way of `DAMAGES` (``0_<how>``), and what ``dane figures plot_runs`` said
    over the folder (its stdout and stderr, and the figure it wrote): one drawing read by every case, not one a case."""
    import contextlib
    import io

    from dane.paper_figs import plot_runs

    root = tmp_path_factory.mktemp("unreadable")
    bad = {how: logged_run(root / "runs", f"0_{how}") for how in DAMAGES}
    logged_run(root / "runs", "1_job")
    for how, run in bad.items():
        damage(run, how)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = plot_runs.main([str(root / "runs"), "--out", str(root / "fig" / "overlay.png")])
    return {"root": root, "bad": bad, "status": status, "out": out.getvalue(), "err": err.getvalue()}


@pytest.mark.filterwarnings("ignore:'dane.paper_figs.run_convergence' found in sys.modules:RuntimeWarning")
@pytest.mark.parametrize("how", DAMAGES)
def test_run_convergence_and_plot_runs_name_an_unreadable_log_in_one_line(unreadable_logs, capsys, monkeypatch, how):
    """`dane figures run_convergence RUN` on a log that cannot be read: one line naming the file and the fix, status
    2, no traceback; `dane figures plot_runs` skips that run with the same line and draws the others (one plot_runs
    over a folder holding a run damaged in each way and a finished one: one line a damaged run, each its own)."""
    from dane.experiments.cli import main as dane

    for name in ("_entry_command", "_entry_prog"):  # the dane command records its line: not for the tests after
        monkeypatch.setattr(f"dane.records.provenance.{name}", None)

    root, bad = unreadable_logs["root"], unreadable_logs["bad"][how]
    with pytest.raises(SystemExit) as exit_:
        dane(["figures", "run_convergence", str(bad)])
    (line,) = capsys.readouterr().err.splitlines()
    assert exit_.value.code == 2 and line.startswith(f"error: {bad / 'rounds.jsonl'}")
    assert line.endswith(f"rerun the run (out_dir={bad} overwrite=true replaces it)")
    assert unreadable_logs["status"] == 0
    skipped = unreadable_logs["err"].splitlines()  # one line a damaged run, in the runs' order, none for the good one
    named = [next((how for how, run in unreadable_logs["bad"].items() if f"{run}:" in said or f"{run}/" in said), None)
             for said in skipped]
    assert sorted(named) == sorted(DAMAGES)
    mine = [said for said, which in zip(skipped, named) if which == how]
    if how == "missing":  # as a job that never logged
        assert mine == [f"skipped {bad}: no rounds.jsonl"]
    else:
        assert mine == [f"skipped: {line.removeprefix('error: ')}"]
    assert unreadable_logs["out"].split() == [str(root / "fig" / "overlay.png"), str(root / "fig" / "overlay.pdf")]


def test_run_convergence_names_a_record_without_its_time(tmp_path, capsys):
    run = logged_run(tmp_path, "run")
    log = run / "rounds.jsonl"
    log.write_text(log.read_text().replace('"time_s": 0.02, ', ""))
    with pytest.raises(SystemExit) as exit_:
        run_convergence.main([str(run)])
    assert exit_.value.code == 2 and capsys.readouterr().err == (
        f"error: {log}: the record of round 2 has no time_s; the file was damaged or not written by a run: restore "
        "it, or rerun the run\n")


def test_plot_runs_and_run_convergence_say_a_run_ended_without_a_summary_or_interrupted(tmp_path, capsys,
                                                                                       monkeypatch):
    """A folder holding a run killed mid-way (records, no summary.json), a finished one and an interrupted one:
    `dane figures plot_runs` draws the three, the killed one's legend entry saying "no summary: running or crashed"
    (`dane figures summary`'s words) and one line on stderr naming it, the interrupted one's "stopped at round 5
    (interrupted)" (local_work's); `dane figures run_convergence` on the killed run says it in its title and one
    line, on the interrupted one in its title."""
    import matplotlib.pyplot as plt

    from dane.paper_figs import plot_runs

    crashed = logged_run(tmp_path / "mixed", "run_a")
    (crashed / "summary.json").unlink()  # SIGKILLed: its records, no summary
    logged_run(tmp_path / "mixed", "run_b")
    interrupted = logged_run(tmp_path / "mixed", "run_c")
    summary = json.loads((interrupted / "summary.json").read_text())
    (interrupted / "summary.json").write_text(json.dumps({**summary, "status": "interrupted"}))
    legends, save = [], plot_runs.save
    monkeypatch.setattr(plot_runs, "save", lambda fig, *a: legends.append(
        [t.get_text() for t in fig.axes[0].get_legend().get_texts()]) or save(fig, *a))
    assert plot_runs.main([str(tmp_path / "mixed"), "--out", str(tmp_path / "x.png")]) == 0
    out, err = capsys.readouterr()
    assert legends == [["run_a — no summary: running or crashed", "run_b",
                        "run_c — stopped at round 5 (interrupted)"]]
    line = f"{crashed}: no summary: running or crashed; drawn up to its last record, round 5"
    assert err.splitlines() == [f"{line}, marked in the legend"] and len(out.split()) == 2
    assert [p.name for p in run_convergence.main([str(crashed)])] == ["convergence.png", "convergence.pdf"]
    assert capsys.readouterr().err.splitlines() == [f"{line}, marked in the title"]
    for run, title in ((crashed, f"{crashed}: no summary: running or crashed"),
                       (interrupted, "gd, 1 worker(s), : stopped at round 5 (interrupted)")):
        fig = run_convergence.draw(run)
        assert " ".join(fig.get_suptitle().split("\n")) == title
        plt.close(fig)


def _fake_run(folder, commit: str, dirty: bool | None, seed: int = 0):
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(f"seed: {seed}\n")
    (folder / "summary.json").write_text(json.dumps({"workers": 2, "status": "converged", "provenance": {
        "git_commit": commit, "git_dirty": dirty, "started_at": "2026-01-02T03:04:05"}}))
    return folder


def test_a_commit_whose_runs_came_from_a_modified_tree_is_marked_in_caption_heading_and_sidecar(tmp_path):
    """git_dirty: true in a run's summary marks its commit "(modified tree)" in the sidecar's commits, the caption and
    the .md's first line; a commit with only clean runs (or git_dirty unknown) is named by its hash alone."""
    dirty, clean = "cc2e6d29ca" + "1" * 30, "ab12" + "0" * 36
    runs = [_fake_run(tmp_path / "a", dirty, True), _fake_run(tmp_path / "b", dirty, False, seed=1),
            _fake_run(tmp_path / "c", clean, False), _fake_run(tmp_path / "d", clean, None)]
    provenance = figure_provenance(runs, tmp_path)
    assert provenance["commits"] == [f"{clean}", f"{dirty} (modified tree)"]
    caption = caption_line("Suboptimality", provenance)
    assert caption == "Suboptimality; 4 runs; code ab12000000, cc2e6d29ca (modified tree); seeds 0,1; run 2026-01-02."
    md, sidecar = save(None, tmp_path / "out", "fig", "| x |", caption=caption, provenance=provenance)
    assert md.read_text().splitlines()[0] == caption
    assert json.loads(sidecar.read_text())["commits"] == [clean, f"{dirty} (modified tree)"]
    clean_only = figure_provenance(runs[2:], tmp_path)
    assert clean_only["commits"] == [clean] and "code ab12000000; " in caption_line("x", clean_only)
