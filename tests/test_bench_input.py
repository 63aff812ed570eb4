"""Bad input to the benchmarks, the calibration and the figures: one line naming the problem and the fix, exit 2,
before any work, and ``--out`` as it was (docs/benchmarks.md, section Benchmarks).  In process, a toy section where
the runner is under test; nothing is measured or launched."""
from __future__ import annotations

import errno
import json
import os
import sys
import tempfile

import pytest

from dane.errors import ConfigError
from dane.experiments import cli
from dane.synthetic import bench_file  # noqa: F401  torch, which the runner imports, at collection, not in a test
from scripts import bench as runner
from scripts import bench_convex  # noqa: F401  as the runner imports it, at collection
from scripts import harness

#: `cli.main` runs scripts.bench and the figures as ``__main__`` (runpy), after this file imported them
pytestmark = pytest.mark.filterwarnings("ignore:.* found in sys.modules after import of package:RuntimeWarning")


@pytest.fixture(autouse=True)
def _dane_command(monkeypatch):
    """The dane command records its line (provenance) and runpy rewrites argv: both restored after each test."""
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr("dane.records.provenance._entry_command", None)
    monkeypatch.setattr("dane.records.provenance._entry_prog", None)


def toy(calls: list, fail: Exception | None = None) -> dict[str, harness.Bench]:
    """One `harness.grid` section of rows ``a`` and ``b``; ``fail`` raised by row ``b``, after ``a`` is saved."""
    def measure(run, name):
        calls.append(name)
        if fail is not None and name == "b":
            raise fail
        return {"value": len(calls)}

    return {"toy": harness.Bench("toy", harness.grid(lambda run: {"a": "a", "b": "b"}, measure), "a toy",
                                 only=("a", "b"), resumable=True, threads=None)}


def refused(capsys, call) -> str:
    """``call()`` ends with exit 2 and one line on stderr: that line."""
    with pytest.raises(SystemExit) as done:
        call()
    err = capsys.readouterr().err.splitlines()
    assert done.value.code == 2 and len(err) == 1, err
    return err[0]


def snapshot(path):
    return path.read_bytes() if path.is_file() else ("folder" if path.is_dir() else None)


QUICK_SECTION = {"toy": {"quick": True, "rows": {"a": {"value": 1}}}}
FULL_SECTION = {"toy": {"quick": False, "rows": {"a": {"value": 1}}}}

#: (what --out is, its content, the command's flags, the line expected; {out} and {tmp} filled in)
OUT_CASES = {
    "a folder": ("folder", None, [],
                 "error: --out {out} is a folder, not a file; name a file, such as {out}/bench.json"),
    "under a file": ("under a file", None, [],
                     "error: --out {out} cannot be made: {tmp}/afile is a file, not a folder; choose another --out"),
    "broken JSON": ("file", "{broken", [], "error: --out {out} is not JSON (Expecting property name enclosed in double "
                    "quotes at line 1 column 2); repair or remove it, or choose another --out"),
    "not UTF-8": ("file", b"\xff\xfe{", [], "error: --out {out} is not JSON (not UTF-8 text); repair or remove it, or "
                  "choose another --out"),
    "a JSON array": ("file", "[1, 2]", [], "error: --out {out} holds a JSON list, not an object of benchmark sections; "
                     "choose another --out"),
    "a section not an object": ("file", '{"toy": [1]}', [], "error: --out {out} holds toy as a JSON list, not a "
                                "section; remove that key, or choose another --out"),
    "a pipe": ("fifo", None, [], "error: --out {out} is not a regular file; choose another --out"),
    "--only, taken with --quick": ("file", json.dumps(QUICK_SECTION), ["--only", "b"],
                                   "error: --out {out} holds section toy taken with --quick, and --only would keep its "
                                   "rows beside this run's; rerun with --quick, or choose another --out"),
    "--resume, taken without --quick": ("file", json.dumps(FULL_SECTION), ["--resume", "--quick"],
                                        "error: --out {out} holds section toy taken without --quick, and --resume "
                                        "would keep its rows beside this run's; rerun without --quick, or choose "
                                        "another --out"),
}


@pytest.mark.parametrize("case", OUT_CASES)
def test_a_bad_out_is_refused_before_the_work_and_left_as_it_was(case, tmp_path, capsys):
    kind, content, flags, expected = OUT_CASES[case]
    out = tmp_path / "afile" / "x.json" if kind == "under a file" else tmp_path / "out.json"
    if kind == "folder":
        out.mkdir()
    elif kind == "under a file":
        out.parent.write_text("x")
    elif kind == "fifo":
        os.mkfifo(out)
    else:
        (out.write_bytes if isinstance(content, bytes) else out.write_text)(content)
    before, calls = snapshot(out), []
    line = refused(capsys, lambda: harness.main(["toy", "--out", str(out), *flags], toy(calls)))
    assert line == expected.format(out=out, tmp=tmp_path)
    assert calls == [] and snapshot(out) == before


def test_an_out_in_a_folder_that_takes_no_file_is_refused(tmp_path, capsys, monkeypatch):
    """Tried, not read off the permissions (root passes those, a read-only file system does not)."""
    def no(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", no)
    calls = []
    line = refused(capsys, lambda: harness.main(["toy", "--out", str(tmp_path / "new" / "b.json")], toy(calls)))
    assert line == (f"error: --out {tmp_path}/new/b.json cannot be written: {tmp_path} takes no new file "
                    "(permission denied); choose another --out")
    assert calls == [] and not (tmp_path / "new").exists()


def test_only_at_the_same_quick_keeps_the_other_rows(tmp_path):
    out = tmp_path / "b.json"
    out.write_text(json.dumps({**QUICK_SECTION, "other": {"x": 1}}))
    calls = []
    harness.main(["toy", "--quick", "--only", "b", "--out", str(out)], toy(calls))
    whole = json.loads(out.read_text())
    assert calls == ["b"] and whole["toy"]["rows"]["a"] == {"value": 1} and whole["other"] == {"x": 1}


def test_a_user_error_in_the_section_is_one_line_and_its_saved_rows_stay(tmp_path, capsys):
    """The package's refusal of a value (`dane.errors.UserError`) mid-section: its line, exit 2, row ``a`` kept."""
    out, calls = tmp_path / "b.json", []
    line = refused(capsys, lambda: harness.main(["toy", "--out", str(out)], toy(
        calls, ConfigError("workers must be a positive integer, got 0"))))
    assert line == "error: workers must be a positive integer, got 0"
    assert calls == ["a", "b"] and list(json.loads(out.read_text())["toy"]["rows"]) == ["a"]


def test_sampled_lambda_without_its_tables_is_skipped_in_one_line(tmp_path, monkeypatch):
    """Without the LIBSVM tables every run was refused and the section died on a TypeError (a λ of None times a grid
    factor): it now says which tables are missing, exit 2 (0 with --skip-without-data), the JSON holding why."""
    from scripts import bench_sampled_lambda

    monkeypatch.setattr(bench_sampled_lambda, "DATA_DIR", tmp_path)
    benches = {"sampled_lambda": bench_sampled_lambda.BENCH}
    with pytest.raises(SystemExit) as stop:
        harness.main(["sampled_lambda", "--quick", "--out", str(tmp_path / "b.json")], benches)
    assert stop.value.code == 2
    section = harness.main(["sampled_lambda", "--quick", "--skip-without-data", "--out", str(tmp_path / "c.json")],
                           benches)
    assert section["skipped"] == (f"no LIBSVM table phishing, a9a in {tmp_path / 'libsvm'} (set DANE_DATA_DIR to "
                                  "the folder holding libsvm/)")


@pytest.mark.parametrize("argv, expected", [
    (["compress", "--quick", "--repeats", "0"], "argument --repeats: must be a positive integer, got '0'"),
    (["convex", "--quick", "--svm-rows", "-5"], "argument --svm-rows: must be a positive integer, got '-5'"),
    (["similarity", "--quick", "--workers", "0"], "argument --workers: must be a positive integer, got '0'"),
    (["federated", "--quick", "--clients", "4", "0"], "argument --clients: must be a positive integer, got '0'"),
    (["load", "--timeout", "0"], "argument --timeout: must be a number > 0, got '0'"),
])
def test_a_count_below_one_is_the_usage_error(argv, expected, tmp_path, capsys):
    out = tmp_path / "b.json"
    with pytest.raises(SystemExit) as done:
        cli.main(["bench", *argv, "--out", str(out)])
    assert done.value.code == 2 and not out.exists()
    assert capsys.readouterr().err.splitlines()[-1] == f"dane bench {argv[0]}: error: {expected}"


def test_every_int_option_of_a_section_is_a_count():
    """A section's integer option is `harness.count` (>= 1), but for seeds, choices and a repeat count whose 0 skips."""
    benches = {name: runner.importlib.import_module(module).BENCH for name, module in runner.MODULES.items()}
    loose = [(name, flags[0]) for name, bench in benches.items() for flags, kwargs in bench.options
             if kwargs.get("type") is int and "choices" not in kwargs
             and flags[0] not in ("--seed", "--seeds", "--reference-repeats")]
    assert loose == []


def test_the_dane_bench_command_names_the_out_it_refuses(tmp_path, capsys):
    (tmp_path / "adir").mkdir()
    line = refused(capsys, lambda: cli.main(["bench", "compress", "--quick", "--out", str(tmp_path / "adir")]))
    assert line == (f"error: --out {tmp_path}/adir is a folder, not a file; name a file, such as "
                    f"{tmp_path}/adir/bench.json")


@pytest.mark.parametrize("argv, expected", [
    (["--out", "{tmp}/adir"], "error: --out {tmp}/adir is a folder, not a file; name a file, such as "
                              "{tmp}/adir/calibration.json"),
    (["--topology", "ps", "--out", "{tmp}/afile/c.json"], "error: --out {tmp}/afile/c.json cannot be made: "
                                                          "{tmp}/afile is a file, not a folder; choose another --out"),
])
def test_calibrate_refuses_its_out_before_measuring(argv, expected, tmp_path, capsys, monkeypatch):
    from dane.synthetic import calibrate

    def launched(*args, **kwargs):
        raise AssertionError("measured before --out was checked")

    monkeypatch.setattr(calibrate, "calibrate", launched)
    monkeypatch.setattr(calibrate, "calibrate_ps", launched)
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("x")
    line = refused(capsys, lambda: calibrate.main([a.format(tmp=tmp_path) for a in argv]))
    assert line == expected.format(tmp=tmp_path)


@pytest.mark.parametrize("argv, expected", [
    (["plot_runs", "{tmp}/runs", "--out", "{tmp}/afile/x.png"],
     "error: --out {tmp}/afile/x.png cannot be made: {tmp}/afile is a file, not a folder; choose another --out"),
    (["plot_runs", "{tmp}/runs", "--out", "{tmp}/runs"],
     "error: --out {tmp}/runs is a folder, not a file; name a file, such as {tmp}/runs/plot_runs.png"),
    (["convergence", "--results", "{tmp}/runs", "--out", "{tmp}/afile"],
     "error: --out {tmp}/afile is a file, not a folder; choose another --out"),
    (["compressed", "--json", "{tmp}/none.json", "--out", "{tmp}/afile"],
     "error: --out {tmp}/afile is a file, not a folder; choose another --out"),
    (["make_all", "--no-run", "--results", "{tmp}/runs", "--out", "{tmp}/afile/figs"],
     "error: --out {tmp}/afile/figs cannot be made: {tmp}/afile is a file, not a folder; choose another --out"),
])
def test_a_figure_refuses_its_out_before_reading_runs(argv, expected, tmp_path, capsys):
    (tmp_path / "runs").mkdir()
    (tmp_path / "afile").write_text("x")
    line = refused(capsys, lambda: cli.main(["figures", *(a.format(tmp=tmp_path) for a in argv)]))
    assert line == expected.format(tmp=tmp_path)
    assert (tmp_path / "afile").read_text() == "x" and list((tmp_path / "runs").iterdir()) == []


def test_batched_device_refuses_thread_workers_that_do_not_deal_equal_shards(tmp_path, capsys):
    """The batched path stacks equal shards: 64 threads over the section's 100,000 rows (its old default) failed on the
    GPU after the section had started; now one line before any work, and the default deals 10,000 and 100,000."""
    from scripts import bench_batched

    out = tmp_path / "bench.json"
    line = refused(capsys, lambda: runner.main(["batched", "--only", "device", "--device", "cpu", "--quick",
                                               "--thread-workers", "64", "--out", str(out)]))
    assert line == ("error: --thread-workers 64 does not deal the 10,000 rows into equal shards; give a divisor of "
                    "10000, such as 50")
    assert not out.exists()
    default = next(kw["default"] for flags, kw in bench_batched.BENCH.options if flags == ("--thread-workers",))
    assert 10_000 % default == 0 and 100_000 % default == 0


@pytest.mark.parametrize("main,refused", [("scripts/bench_cuda.py", "cuda"),
                                          ("scripts/time_vs_workers.py", "time_vs_workers"), ("scripts/bench.py", None)])
def test_a_section_run_as_a_file_is_refused_in_one_line(main, refused, monkeypatch, capsys):
    """`python scripts/bench_cuda.py --only baseline` (docs/neural_networks.md names the file) defined its section
    and exited 0 having run nothing; the runner itself, `python scripts/bench.py cuda`, is not refused."""
    module = type(sys)("__main__")
    module.__file__, module.__spec__ = str(harness.FOLDER.parent / main), None
    monkeypatch.setitem(sys.modules, "__main__", module)
    if refused is None:
        assert harness.Bench("cuda", lambda run: {}, "doc").key == "cuda"
        return
    with pytest.raises(SystemExit) as exit_:
        harness.Bench("cuda", lambda run: {}, "doc")
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (f"error: {module.__file__} is a section of the benchmarks' runner, which does "
                                       f"not run as a file; run python -m scripts.bench {refused} [--help]\n")
