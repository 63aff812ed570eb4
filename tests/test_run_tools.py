"""`paper_figs.summary` and `paper_figs.plot_runs` on small real runs: the numbers they report are
the logs' own, broken runs are named and skipped, and a Hydra sweep ends with the summary command."""
from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys

import pytest

from dane.errors import DataError, DivergenceError
from dane.loop.launch import execute
from dane.records.results import read_rounds, read_summary
from dane.experiments.config import run_spec
from dane.paper_figs import plot_runs, summary
from dane.synthetic.launchers import REPO, launch_env
from dane.synthetic.sweep import compose_job
import runs

TINY = ("problem.n_samples=600", "problem.dim=20", "workers=2")
TOL = 1e-6


def real_run(out_dir, *overrides: str):
    try:
        execute(run_spec(compose_job((*TINY, *overrides))), str(out_dir))
    except DivergenceError:
        pass
    return out_dir


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A folder of jobs as a sweep leaves them: two finished runs, one killed mid-line, two failed."""
    root = tmp_path_factory.mktemp("sweep")
    dane_run = real_run(root / "0_dane", "algorithm=dane", "rounds=30")
    real_run(root / "1_admm", "algorithm=admm", "rounds=6")
    killed = root / "2_killed"
    killed.mkdir()
    shutil.copy(dane_run / "config.yaml", killed)
    lines = (dane_run / "rounds.jsonl").read_text().splitlines(keepends=True)
    (killed / "rounds.jsonl").write_text("".join(lines[:3]) + lines[3][: len(lines[3]) // 2])  # torn last line
    (root / "3_no_records" / ".hydra").mkdir(parents=True)  # Hydra made the job directory, the job never logged
    (root / "10_error").mkdir()
    (root / "10_error" / "error.txt").write_text(  # a crash's traceback: its last line says why
        'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\nValueError: boom\n')
    return root


def first_below(records: list[dict], tol: float) -> int | None:
    return next((k for k, r in enumerate(records) if r["suboptimality"] <= tol), None)


def test_summary_rows_are_the_logs_numbers(sweep):
    rows = {row["job"]: row for row in summary.summarize(sweep, tol=TOL)}
    assert list(rows) == ["0_dane", "1_admm", "2_killed", "3_no_records", "10_error"]  # job order, not string order
    for name in ("0_dane", "1_admm"):
        records, saved = read_rounds(sweep / name), read_summary(sweep / name)
        row = rows[name]
        k = first_below(records, TOL)
        assert row["rounds_to_tol"] == (None if k is None else records[k]["round"])
        assert row["comm_rounds_to_tol"] == (None if k is None else records[k]["comm_rounds"])
        assert (row["status"], row["algorithm"], row["workers"], row["rounds"]) == \
               (saved["status"], saved["algorithm"], 2, records[-1]["round"])
        assert (row["final_objective"], row["final_suboptimality"], row["time_s"]) == \
               (saved["final_objective"], saved["final_suboptimality"], saved["time_s"])
        assert row["final_test_accuracy"] is None
    dane_records = read_rounds(sweep / "0_dane")
    dane_row, admm_row = rows["0_dane"], rows["1_admm"]
    assert dane_row["status"] == "converged" and 0 < dane_row["rounds_to_tol"] == first_below(dane_records, TOL)
    assert dane_row["comm_rounds_to_tol"] == 2 * dane_row["rounds_to_tol"]  # two allreduces a DANE round
    assert admm_row["status"] == "max_rounds" and admm_row["rounds_to_tol"] is None  # 6 ADMM rounds: not there
    # killed mid-line: the complete records count, and the config says what it was
    killed = rows["2_killed"]
    assert (killed["status"], killed["algorithm"], killed["rounds"]) == ("running or crashed", "dane", 2)
    assert killed["final_suboptimality"] == dane_records[2]["suboptimality"]
    assert rows["3_no_records"]["status"] == rows["10_error"]["status"] == "failed"
    assert (rows["3_no_records"]["reason"], rows["10_error"]["reason"]) == (None, "ValueError: boom")


def test_a_damaged_summary_is_a_row_that_says_so(sweep, tmp_path):
    """A summary.json cut short: the job's row comes from its records and config, its status says what is wrong, and
    read_summary names the file in one line."""
    damaged = tmp_path / "0_damaged"
    shutil.copytree(sweep / "0_dane", damaged)
    (damaged / "summary.json").write_text("garbage")
    (row,) = summary.summarize(tmp_path, tol=TOL)
    assert (row["status"], row["algorithm"], row["rounds"]) == ("damaged summary.json", "dane",
                                                                read_rounds(damaged)[-1]["round"])
    with pytest.raises(DataError, match="0_damaged/summary.json is damaged .*; rerun the job, or remove its folder"):
        read_summary(damaged)


def test_summary_cli_markdown_and_json(sweep, capsys):
    assert summary.main([str(sweep), "--tol", str(TOL)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert len(table) == 2 + 5 and "rounds/comm to suboptimality <= 1e-06 (absolute)" in table[0]
    k = first_below(read_rounds(sweep / "0_dane"), TOL)
    assert table[2].startswith(f"| 0_dane | DANE | converged | dane | 2 | ") and f"| {k}/{2 * k} |" in table[2]
    assert f"| 1_admm | {read_summary(sweep / '1_admm')['label']} | max_rounds | admm | 2 | 6 | - | - | - |" in table[3]
    assert summary.main([str(sweep), "--tol", str(TOL), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == summary.summarize(sweep, tol=TOL)


def test_plot_lines_are_the_records(sweep, capsys):
    curves = plot_runs.curves(plot_runs.find([sweep]), "comm_rounds", "suboptimality", log=sys.stderr)
    skipped = capsys.readouterr().err.splitlines()
    assert skipped == [f"skipped {sweep / '2_killed'}: rounds.jsonl has a torn last line (line 4 of 4)",
                       f"skipped {sweep / '3_no_records'}: no rounds.jsonl",
                       f"skipped {sweep / '10_error'}: no rounds.jsonl; failed: ValueError: boom"]
    assert [c.label for c in curves] == ["algorithm=dane, rounds=30", "algorithm=admm, rounds=6"]  # what differs
    named = plot_runs.curves(plot_runs.find([sweep]), "round", "objective", labels="ABCDE")
    assert [(c.label, c.run.name) for c in named] == [("A", "0_dane"), ("B", "1_admm")]  # a label stays with its run
    fig = plot_runs.draw(curves, "comm_rounds", "suboptimality")
    ax = fig.axes[0]
    assert ax.get_yscale() == "log" and ax.get_xlabel() and ax.get_ylabel() and ax.get_title()
    for line, name in zip(ax.lines, ("0_dane", "1_admm")):
        records = read_rounds(sweep / name)
        assert list(line.get_xdata()) == [r["comm_rounds"] for r in records]
        assert list(line.get_ydata()) == [r["suboptimality"] for r in records]
    assert len(ax.lines) == 2


def test_labels_fall_back_to_directory_names(sweep):
    runs = [sweep / "0_dane", sweep / "1_admm"]
    assert plot_runs.labels_for(runs, [{}, {}]) == ["0_dane", "1_admm"]
    same = summary.read_config(runs[0])
    assert plot_runs.labels_for(runs, [same, same]) == ["0_dane", "1_admm"]  # nothing differs
    # a rerun with overwrite=true changes no result: not a label (as conf/config.yaml's exclude_keys leave it out)
    assert plot_runs.labels_for(runs, [{**same, "overwrite": False}, {**same, "overwrite": True}]) == ["0_dane", "1_admm"]


def test_plot_cli_writes_png_and_pdf_under_results(sweep, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert plot_runs.main([str(sweep / "0_dane"), str(sweep / "1_admm"), "--y", "objective", "--x", "time_s",
                           "--labels", "DANE", "ADMM"]) == 0
    written = capsys.readouterr().out.split()
    assert written == ["results/figures/plot_runs.png", "results/figures/plot_runs.pdf"]
    png = (tmp_path / written[0]).read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000 and (tmp_path / written[1]).stat().st_size > 1000


def empty_folder(tmp) -> None:
    (tmp / "run_tools" / "empty").mkdir(parents=True)


runs.prepare(empty_folder)
NO_RUNS = runs.command("run_tools:no_runs", "{tmp}/run_tools/empty", module="paper_figs.plot_runs", cwd="{tmp}/run_tools")


def test_no_runs_is_one_line_and_status_2(commands):
    proc, tmp_path = commands[NO_RUNS], commands.tmp / "run_tools"
    assert proc["rc"] == 2 and proc["stdout"] == "" and len(proc["stderr"].splitlines()) == 1
    assert proc["stderr"].startswith("error: no runs in ") and not (tmp_path / "results").exists()


def test_summary_of_no_runs_is_status_2(tmp_path, capsys):
    assert summary.main([str(tmp_path)]) == 2
    assert len(capsys.readouterr().err.splitlines()) == 1


@pytest.mark.slow  # a Hydra multirun through the dane command (11 s); test_sweep's multirun stays fast
def test_sweep_prints_the_summary_command(tmp_path, dane_command):
    cmd = [sys.executable, "-m", "experiments.simulate", "-m", "workers=1,2", "problem.n_samples=600",
           "problem.dim=20", "rounds=3", f"hydra.sweep.dir={tmp_path}"]
    proc = subprocess.run(cmd, cwd=REPO, env=launch_env(None), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = proc.stdout.splitlines()[-1]
    assert line == f"sweep: 2 jobs in {tmp_path}; summary: dane figures summary {tmp_path}"
    command = shlex.split(line.split("summary: ", 1)[1])
    assert command[0] == dane_command.name
    proc = subprocess.run([str(dane_command), *command[1:], "--json"], cwd=REPO, env=launch_env(None), capture_output=True,
                          text=True, timeout=120)
    rows = json.loads(proc.stdout)
    assert [(r["workers"], r["status"]) for r in rows] == [(1, "converged"), (2, "max_rounds")]


@pytest.fixture(scope="module")
def costed(tmp_path_factory):
    """Two finished runs that count their traffic: DANE with comm.compress=none (one worker's uplink_bits and
    downlink_bits, a Hessian and factorizations) and SCAFFOLD (its participants' uplink_bytes and downlink_bytes)."""
    import dane

    root = tmp_path_factory.mktemp("costed")
    problem = dane.problems.RidgeSyntheticConfig(n_samples=600, dim=20)
    dane.fit(problem, "dane", workers=2, rounds=10, compress="none", out_dir=str(root / "0_dane"))
    dane.fit(problem, "scaffold", workers=2, rounds=10, out_dir=str(root / "1_scaffold"))
    return root


def test_summary_rows_carry_bits_and_local_work_at_tol_and_at_the_end(costed):
    """Each row's traffic and local work "to tol" are the first record's within tol, the final ones summary.json's
    (its local_work), every key of both: none is ranked on rounds alone; a key a run does not count is None."""
    from dane.work import COUNTS

    rows = {row["job"]: row for row in summary.summarize(costed, tol=TOL)}
    for name in ("0_dane", "1_scaffold"):
        records, saved = read_rounds(costed / name), read_summary(costed / name)
        row, hit = rows[name], records[first_below(records, TOL)]
        assert row["rounds_to_tol"] == hit["round"] > 0
        for key in (*summary.TRAFFIC, *COUNTS):
            assert row[f"{key}_to_tol"] == hit.get(key)
            assert row[f"final_{key}"] == saved.get(key, saved["local_work"].get(key))
    dane_row, scaffold_row = rows["0_dane"], rows["1_scaffold"]
    records = read_rounds(costed / "0_dane")
    hit = records[first_below(records, TOL)]
    assert (dane_row["uplink_bits_to_tol"], dane_row["downlink_bits_to_tol"]) == \
           (hit["uplink_bits"], hit["downlink_bits"]) != (None, None)
    assert dane_row["final_uplink_bits"] == read_summary(costed / "0_dane")["uplink_bits"] > hit["uplink_bits"]
    assert dane_row["local_hessians_to_tol"] == 2 and dane_row["local_passes_to_tol"] == hit["local_passes"] > 0
    assert dane_row["uplink_bytes_to_tol"] is None and scaffold_row["uplink_bits_to_tol"] is None  # not counted
    assert scaffold_row["final_uplink_bytes"] == read_summary(costed / "1_scaffold")["uplink_bytes"] > 0


def test_summary_table_shows_the_method_bits_and_work(costed, capsys):
    """The markdown row: the method's label beside the job, then bits up/down and passes/HVPs/Hessians/factorizations
    to tol and at the end, the records' and the summary's own numbers; a participants' byte count as bits, marked Σ;
    --json holds the same rows."""
    assert summary.main([str(costed), "--tol", str(TOL)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert len(table) == 2 + 2 and "| bits up/down (Σ: summed over the participants) to tol |" in table[0]
    assert "| passes/HVPs/Hessians/factorizations to tol |" in table[0]
    for line, name, label in ((table[2], "0_dane", "DANE"), (table[3], "1_scaffold", "SCAFFOLD")):
        records, saved = read_rounds(costed / name), read_summary(costed / name)
        k = first_below(records, TOL)
        hit, work = records[k], saved["local_work"]
        assert line.startswith(f"| {name} | {label} | max_rounds | {name[2:]} | 2 | 10 | {k}/")
        ups = ((hit["uplink_bits"], hit["downlink_bits"], saved["uplink_bits"], saved["downlink_bits"])
               if name == "0_dane" else
               (f"{8 * hit['uplink_bytes']} Σ", f"{8 * hit['downlink_bytes']} Σ", f"{8 * saved['uplink_bytes']} Σ",
                f"{8 * saved['downlink_bytes']} Σ"))
        assert f"| {ups[0]}/{ups[1]} | {'/'.join(str(int(hit[key])) for key in summary.SHOWN_WORK)} |" in line
        assert f"| {ups[2]}/{ups[3]} | {'/'.join(str(int(work[key])) for key in summary.SHOWN_WORK)} |" in line
    assert summary.main([str(costed), "--tol", str(TOL), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == summary.summarize(costed, tol=TOL)


def test_summary_rows_name_the_method(sweep, capsys):
    """A row's label is the one its summary.json records, else its config's algorithm class's (a job killed before
    its summary); a job that never logged has none (-)."""
    from dane.algorithm import label_of

    rows = {row["job"]: row for row in summary.summarize(sweep, tol=TOL)}
    assert rows["0_dane"]["label"] == read_summary(sweep / "0_dane")["label"] == "DANE"
    assert rows["1_admm"]["label"] == read_summary(sweep / "1_admm")["label"] == label_of("admm") != "admm"
    assert rows["2_killed"]["label"] == "DANE"  # no summary: its config.yaml's algorithm
    assert rows["3_no_records"]["label"] is rows["10_error"]["label"] is None
    assert summary.main([str(sweep), "--tol", str(TOL)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[4].startswith("| 2_killed | DANE | running or crashed | dane | 2 | 2 | - | - | - |")
    assert table[5].startswith("| 3_no_records | - | failed | - | - | - | - | - | - |")


def test_a_bits_cell_prefers_one_workers_bits_then_the_participants_exact_bits():
    """bits up/down: uplink_bits where the record counts it, else clients_uplink_bits (FedNL's exact bits), else the
    participants' bytes x 8, both marked Σ; - where it counts none."""
    keys = {f"final_{key}": None for key in summary.TRAFFIC}
    assert summary.bits_cell({**keys, "final_uplink_bits": 96, "final_uplink_bytes": 40}, "final_") == "96/-"
    assert summary.bits_cell({**keys, "final_clients_uplink_bits": 15360, "final_uplink_bytes": 1920,
                              "final_downlink_bytes": 400}, "final_") == "15360 Σ/3200 Σ"
    assert summary.bits_cell({**keys, "rounds_to_tol": None}, "_to_tol", "?") == "?"
