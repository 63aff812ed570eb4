"""The run directory's lock and its clean-up (`dane.records.lock.take_lock`, `RunWriter`): a lock never outlives a
run that did not start, never holds no owner, and a stale one is taken over or named with its fix."""
from __future__ import annotations

import errno
import os
import re
import socket
import time
from pathlib import Path

import pytest

from dane.records import results
from dane.errors import ConfigError
from dane.records.lock import LOCK_FILE, OWNERLESS_STALE_S, take_lock
from dane.records.results import RunWriter
from helpers import flock_waits


def full_disk(monkeypatch, after: int = 0):
    """Every ``Path.write_text`` after the first ``after`` fails as on a full file system (ENOSPC)."""
    write_text, calls = Path.write_text, []

    def write(self, *args, **kwargs):
        calls.append(self)
        if len(calls) > after:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return write_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write)


def test_a_full_disk_at_the_start_leaves_no_lock_and_no_folder(tmp_path, monkeypatch):
    run = tmp_path / "new" / "run"
    full_disk(monkeypatch)
    with pytest.raises(ConfigError) as err:
        RunWriter(run)
    assert str(err.value) == (f"out_dir={run} is not writable (no space left on device); free space there or "
                              "choose another out_dir")
    assert list(tmp_path.iterdir()) == []  # no .lock, no empty folder: the folder is as it was
    monkeypatch.undo()  # space freed: the same command runs, no overwrite=true needed
    RunWriter(run).close()


def test_a_full_disk_in_an_existing_folder_leaves_it_byte_for_byte(tmp_path, monkeypatch):
    (tmp_path / "notes.txt").write_text("mine\n")
    full_disk(monkeypatch)
    with pytest.raises(ConfigError, match="is not writable"):
        take_lock(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_the_lock_holds_its_owner_from_the_moment_it_exists(tmp_path, monkeypatch):
    """Written to a temporary file and linked: whoever sees .lock reads host and pid, never an empty file."""
    seen = []
    link = os.link

    def spy(src, dst):
        link(src, dst)
        seen.append(Path(dst).read_text())

    monkeypatch.setattr(os, "link", spy)
    path = take_lock(tmp_path)
    assert seen == [f"{socket.gethostname()} {os.getpid()}"] == [path.read_text()]
    assert [p.name for p in tmp_path.iterdir()] == [LOCK_FILE]  # the temporary file is gone


def test_without_hard_links_a_failed_owner_write_removes_the_lock(tmp_path, monkeypatch):
    def no_links(src, dst):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    take_lock(tmp_path).unlink()  # the exclusive create and write
    real_fdopen = os.fdopen

    class Full:
        def __init__(self, fd):
            self.file = real_fdopen(fd, "w")

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

        def write(self, text):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fdopen", lambda fd, mode: Full(fd))
    with pytest.raises(ConfigError, match=f"out_dir={tmp_path} is not writable \\(no space left on device\\)"):
        take_lock(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_an_ownerless_lock_is_named_with_its_fix_while_young_and_taken_over_when_old(tmp_path):
    lock = tmp_path / LOCK_FILE
    lock.write_text("")  # as the version before this one left it on a full disk
    with pytest.raises(ConfigError) as err:
        take_lock(tmp_path)
    assert str(err.value) == (f"out_dir={tmp_path} is locked by {lock}, which names no run; remove {lock} if no "
                              "run uses the directory")
    old = time.time() - OWNERLESS_STALE_S - 1
    os.utime(lock, (old, old))
    assert take_lock(tmp_path).read_text() == f"{socket.gethostname()} {os.getpid()}"


def test_flocked_holds_readers_together_and_a_writer_alone_after_saying_it_waits(tmp_path):
    """`dane.records.lock.flocked` in one thread: a shared hold runs beside another shared one, without ``busy``; an
    exclusive one beside a reader calls ``busy`` first (here it ends that read), then waits and holds the folder
    alone; after a block nothing is held.  (A timer ends the read after 2 s where ``busy`` is not called: no hang.)"""
    import fcntl
    import threading

    from dane.records.lock import flocked

    def refuse():
        raise AssertionError("busy, where nothing holds the folder the other way")

    with flocked(tmp_path, exclusive=False, busy=refuse):
        assert flock_waits(tmp_path, fcntl.LOCK_EX) and not flock_waits(tmp_path, fcntl.LOCK_SH)
    assert not flock_waits(tmp_path, fcntl.LOCK_EX)
    reader, said = os.open(tmp_path, os.O_RDONLY), []
    ends = threading.Timer(2.0, fcntl.flock, (reader, fcntl.LOCK_UN))
    try:
        fcntl.flock(reader, fcntl.LOCK_SH)
        with flocked(tmp_path, exclusive=False, busy=refuse):
            pass

        def busy():
            said.append("busy")
            fcntl.flock(reader, fcntl.LOCK_UN)  # the other read ends: the writer's wait ends with it

        ends.start()
        with flocked(tmp_path, exclusive=True, busy=busy):
            assert said == ["busy"] and flock_waits(tmp_path, fcntl.LOCK_SH)
        assert not flock_waits(tmp_path, fcntl.LOCK_SH)
    finally:
        ends.cancel()
        ends.join()
        os.close(reader)


def test_a_lock_of_another_host_is_refused_with_the_fix(tmp_path):
    lock = tmp_path / LOCK_FILE
    lock.write_text("elsewhere 12345")
    with pytest.raises(ConfigError) as err:
        take_lock(tmp_path)
    assert str(err.value) == (f"out_dir={tmp_path} is in use by another run (elsewhere pid 12345); choose another "
                              f"out_dir, or wait for that run to end (remove {lock} if no run uses the directory)")
    assert lock.read_text() == "elsewhere 12345"


def test_a_launched_jobs_rank_0_finds_another_runs_lock_before_the_first_collective(tmp_path):
    """`refusal`, which a launched job's rank 0 sends every rank before their first collective: a folder whose lock
    a live run holds is refused there, under resume=auto and overwrite=true too, so that every rank stops and rank
    0 alone says why.  It was found only when rank 0 took the lock, after the others had entered a collective, and
    they said a peer was lost (docs/faults.md: the other ranks say nothing).  A dead run's lock is no refusal."""
    from types import SimpleNamespace

    from dane.loop.callbacks import refusal
    from helpers import unused_pid

    lock = tmp_path / LOCK_FILE
    lock.write_text(f"{socket.gethostname()} {os.getpid()}")
    line = (f"out_dir={tmp_path} is in use by another run ({socket.gethostname()} pid {os.getpid()}); choose another "
            f"out_dir, or wait for that run to end (remove {lock} if no run uses the directory)")
    for resume, overwrite in ((None, False), ("auto", False), (None, True)):
        control = SimpleNamespace(resume=resume, overwrite=overwrite, restart_unfinished=False, out_dir_key="out_dir")
        assert refusal(control, str(tmp_path)) == line
        with pytest.raises(ConfigError) as err:
            take_lock(tmp_path)
        assert str(err.value) == line  # the same line as the lock's own refusal
    lock.write_text(f"{socket.gethostname()} {unused_pid()}")
    assert refusal(control, str(tmp_path)) is None


def test_a_run_without_records_leaves_the_folder_as_it_was(tmp_path):
    """config.yaml and an empty rounds.jsonl made by a run that ends before its first record are removed."""
    run = tmp_path / "a" / "b"
    writer = RunWriter(run)
    writer.write_text("config.yaml", "x: 1\n")
    writer.close()
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "config.yaml").write_text("mine\n")
    writer = RunWriter(tmp_path / "kept")
    writer.write_text("config.yaml", "x: 1\n")  # there before: rewritten, not removed
    writer.close()
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["config.yaml"]
    writer = RunWriter(run)
    writer.write_round({"round": 0, "objective": 1.0})
    writer.close()
    assert sorted(p.name for p in run.iterdir()) == [results.ROUNDS_FILE]
    writer = RunWriter(tmp_path / "summary_only")
    writer.write_summary({"status": "max_rounds"})  # a result: kept with the rounds file
    writer.close()
    assert sorted(p.name for p in (tmp_path / "summary_only").iterdir()) == [results.ROUNDS_FILE, results.SUMMARY_FILE]


def test_read_rounds_leaves_out_a_torn_last_line_and_names_a_damaged_one(tmp_path):
    """A crash or a full disk mid-write leaves a last line without its newline: the records before it are read (as a
    resume keeps them); a line that is no record elsewhere is one DataError naming the file and the line."""
    from dane.errors import DataError
    from dane.records.results import read_rounds

    log = tmp_path / "rounds.jsonl"
    log.write_text('{"round": 0, "objective": 1.5}\n{"round": 1, "objective": 1.25}\n{"round": 2, "obje')
    assert read_rounds(tmp_path) == [{"round": 0, "objective": 1.5}, {"round": 1, "objective": 1.25}]
    log.write_text('{"round": 0, "objective": 1.5}\n{"round": 1, "obje\n{"round": 2, "objective": 1.0}\n')
    with pytest.raises(DataError, match=rf"^{re.escape(str(log))}, line 2, is not a record \("):
        read_rounds(tmp_path)


ROUNDS = '{"round": 0, "objective": 1.5}\n{"round": 1, "objective": 1.25}\n'


@pytest.mark.parametrize("damage, where", [
    ("utf8", r", line 3, is not a record \('utf-8' codec can't decode"),
    ("no_round", r", line 2, is not a record \(no 'round'\)"),
    ("a_list", r", line 2, is not a record \(a JSON list, not an object\)"),
    ("directory", r" cannot be read \(is a directory\)"),
    ("missing", r" is missing; not a run directory, or its log was moved"),
])
def test_read_rounds_names_an_unreadable_log_and_the_fix_in_one_data_error(tmp_path, damage, where):
    """Bytes that are no UTF-8 (a line a disk fault left), a record without its round, a directory or no file where
    rounds.jsonl belongs: one DataError naming the file (and line) and the fix, not a UnicodeDecodeError,
    KeyError or IsADirectoryError from whatever reads the records."""
    from dane.errors import DataError
    from dane.records.results import read_rounds

    log = tmp_path / "rounds.jsonl"
    if damage == "utf8":
        log.write_bytes(ROUNDS.encode() + b"\xff\xfe\x00garbage\n")
    elif damage == "no_round":
        log.write_text(ROUNDS.replace('"round": 1, ', "") + '{"round": 2, "objective": 1.0}\n')
    elif damage == "a_list":
        log.write_text(ROUNDS.replace('{"round": 1, "objective": 1.25}', "[1, 1.25]") + '{"round": 2}\n')
    elif damage == "directory":
        log.mkdir()
    with pytest.raises(DataError) as err:
        read_rounds(tmp_path)
    message = str(err.value)
    assert re.match(re.escape(str(log)) + where, message) and "\n" not in message
    assert message.endswith(f"; restore it, or rerun the run (out_dir={tmp_path} overwrite=true replaces it)")
    if damage == "utf8":  # a torn last line of such bytes is a write cut short, left out like any torn line
        log.write_bytes(ROUNDS.encode() + b"\xff\xfe")
        assert [r["round"] for r in read_rounds(tmp_path)] == [0, 1]



@pytest.mark.parametrize("read", [results.read_rounds, results.read_summary])
@pytest.mark.parametrize("run_dir", [None, 3])
def test_a_run_dir_that_is_no_path_is_one_line(read, run_dir):
    """read_rounds(None) and read_summary(3) were pathlib's TypeError ("expected str, bytes or os.PathLike")."""
    with pytest.raises(ConfigError, match=re.escape(f"run_dir must be a run folder's path (a str or a pathlib.Path: "
                                                    f"its out_dir), got {run_dir!r}") + "$"):
        read(run_dir)


def test_read_config_is_yaml_safe_load_of_a_runs_config(tmp_path):
    """`results.read_config` (the C loader where PyYAML has libyaml) reads what yaml.safe_load reads: a config as
    a run writes it, with YAML 1.1's floats, nulls, infinities, booleans and strings that only look like numbers."""
    import math

    import yaml

    text = ("algorithm:\n  _target_: dane.dane.DANEConfig\n  mu: 0.001\n  eta: 1.0\n  lr: null\n  tol: 1e-3\n"
            "  cap: .inf\n  safeguard: true\n  tag: '007'\n  grid: [1, 2.5, -3]\nworkers: 4\nseed: 0\n")
    (tmp_path / "config.yaml").write_text(text)
    read = results.read_config(tmp_path)
    assert read == yaml.safe_load(text) and read["algorithm"]["tol"] == "1e-3"  # YAML 1.1: no dot, a string
    assert math.isinf(read["algorithm"]["cap"]) and read["algorithm"]["safeguard"] is True and read["algorithm"]["tag"] == "007"
    assert results.read_config(tmp_path / "no_run") == {}
    (tmp_path / "config.yaml").write_text("")  # empty: none, as no file (yaml.safe_load gives None)
    assert results.read_config(tmp_path) == {}
    (tmp_path / "config.yaml").write_text("x: !!python/tuple [1, 2]\n")  # safe: no Python object built from a tag
    with pytest.raises(yaml.YAMLError):
        yaml.safe_load((tmp_path / "config.yaml").read_text())
    with pytest.raises(yaml.YAMLError):
        results.read_config(tmp_path)


def test_a_run_directory_names_resume_only_where_a_checkpoint_can_continue_it(tmp_path):
    """A run without a committed checkpoint cannot be continued with resume= (it says "no checkpoint/ folder"), nor
    can a finished one (refused as finished), unless it stopped at its cap and more rounds extend it: the refusal's
    offer (`dane.loop.checkpoint.resume_offer`) follows `finished`, as resume's own refusal does; a damaged summary
    leaves the checkpoint to continue."""
    from dane.loop.checkpoint import finished, resume_offer

    for name, status in (("plain", "max_rounds"), ("capped", "max_rounds"), ("converged", "converged"),
                         ("interrupted", "interrupted"), ("damaged", "max_rounds")):
        writer = RunWriter(tmp_path / name)
        writer.write_round({"round": 0})
        writer.write_summary({"status": status, "rounds": 6})
        writer.close()
        if name != "plain":
            (tmp_path / name / "checkpoint").mkdir()
            (tmp_path / name / "checkpoint" / "COMMITTED").write_text('{"round": 4, "workers": 1}')
    (tmp_path / "damaged" / "summary.json").write_text("{bad")
    assert [finished(tmp_path / n) is None for n in ("capped", "converged", "interrupted", "damaged")] == \
        [False, False, True, True]
    assert [resume_offer(tmp_path / n) for n in ("plain", "capped", "converged", "interrupted", "damaged")] == \
        ["", " extend it with resume=auto and rounds above 6,", "", *[" continue it from its checkpoint with "
                                                                      "resume=auto,"] * 2]
    with pytest.raises(ConfigError) as plain:
        RunWriter(tmp_path / "plain", resume_offer=resume_offer(tmp_path / "plain"))
    assert str(plain.value) == (f"out_dir={tmp_path / 'plain'} already holds a run (rounds.jsonl, summary.json); "
                                "choose a new out_dir, or replace it with overwrite=true (dane.fit: overwrite=True)")
    with pytest.raises(ConfigError, match=r"; choose a new out_dir, continue it from its checkpoint with resume=auto, "
                                          r"or replace it with overwrite=true \(dane.fit: overwrite=True\)$"):
        RunWriter(tmp_path / "interrupted", resume_offer=resume_offer(tmp_path / "interrupted"))


def test_overwrite_removes_the_replaced_runs_own_files_and_keeps_the_users(tmp_path):
    """overwrite=true replaces a run: its config.yaml, iterate.pt, confusion matrix and plot, update log and
    TensorBoard events go with its records (a run that writes no config.yaml left the command line's beside its
    summary, naming another method); a file the user put there stays."""
    for name in ("rounds.jsonl", "summary.json", "config.yaml", "iterate.pt", "confusion.json", "confusion.png",
                 "updates.jsonl", "notes.txt"):
        (tmp_path / name).write_text("old")
    (tmp_path / "tensorboard").mkdir()
    (tmp_path / "tensorboard" / "events.out.tfevents.1").write_text("old")
    writer = RunWriter(tmp_path, overwrite=True)
    writer.write_round({"round": 0})
    writer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "rounds.jsonl"]
    assert (tmp_path / "rounds.jsonl").read_text() == '{"round": 0}\n'


def test_a_record_line_is_the_checked_encoding_whether_or_not_it_holds_an_inf():
    """`results.line` writes the plain encoding where a record has no inf or nan, the `json_safe` one where it does:
    the same text either way as the checked encoding (tuples as lists, numpy floats as floats)."""
    import json

    import numpy as np

    def checked(record):
        return json.dumps({k: results.json_safe(v) for k, v in record.items()})

    finite = {"round": 3, "objective": np.float64(0.1) + 0.2, "pair": (1, 2.5), "events": [{"mu": 1e-300}]}
    odd = {**finite, "lr": float("inf"), "stats": {"kappa": float("nan")}, "path": [float("-inf")]}
    assert results.line(finite) == checked(finite) == json.dumps(finite)
    assert results.line(odd) == checked(odd) and json.loads(results.line(odd))["stats"] == {"kappa": "nan"}


def test_non_finite_numbers_are_strings_at_any_depth_so_the_files_are_strict_json(tmp_path):
    """A default's statistics (κ = inf where λ + μ = 0) or an adaptation's value sit inside lists and dicts: written
    as strings there too, so a strict JSON reader (no Infinity, no NaN) reads both files."""
    import json
    import math

    def strict(text: str):
        return json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in the JSON"))

    writer = RunWriter(tmp_path / "run")
    writer.write_round({"round": 0, "objective": math.inf,
                        "adapted": [{"key": "algorithm.mu", "from": 0.0, "to": math.nan}]})
    writer.write_summary({"status": "diverged", "defaults": [{"stats": {"kappa": math.inf, "rows": 3}}]})
    writer.close()
    record = strict((tmp_path / "run" / results.ROUNDS_FILE).read_text())
    summary = strict((tmp_path / "run" / results.SUMMARY_FILE).read_text())
    assert record == {"round": 0, "objective": "inf", "adapted": [{"key": "algorithm.mu", "from": 0.0, "to": "nan"}]}
    assert summary["defaults"] == [{"stats": {"kappa": "inf", "rows": 3}}]


def test_a_records_and_a_summarys_inf_minus_inf_and_nan_read_back_as_floats(tmp_path):
    """Written as "inf", "-inf" and "nan" (`json_safe`), a record's and a summary's top-level values read back as the
    floats they were (`read_rounds`, `read_summary`); a string that only looks alike stays a string."""
    import math

    writer = RunWriter(tmp_path / "run")
    for t, value in enumerate((math.inf, -math.inf, math.nan)):
        writer.write_round({"round": t, "objective": value, "note": "Infinity"})
    writer.write_summary({"status": "diverged", "best": -math.inf, "worst": math.inf, "rate": math.nan})
    writer.close()
    objectives = [record["objective"] for record in results.read_rounds(tmp_path / "run")]
    assert all(isinstance(v, float) for v in objectives)
    assert objectives[:2] == [math.inf, -math.inf] and math.isnan(objectives[2])
    assert {record["note"] for record in results.read_rounds(tmp_path / "run")} == {"Infinity"}
    summary = results.read_summary(tmp_path / "run")
    assert (summary["best"], summary["worst"]) == (-math.inf, math.inf) and math.isnan(summary["rate"])


def test_nested_inf_and_nan_read_back_as_floats_too(tmp_path):
    """An ``adapted`` event's numbers and a default's statistics sit inside lists and dicts: they read back as floats
    as a top-level value does (`results.read_safe`, `json_safe`'s inverse), and a look-alike string stays a string."""
    import math

    event = results.adaptation("algorithm.mu", 1.0, math.inf, "trial not finite")
    writer = RunWriter(tmp_path / "run")
    writer.write_round({"round": 0, "objective": 1.0, "adapted": [event]})
    writer.write_summary({"status": "diverged", "defaults": [{"key": "algorithm.mu", "stats": {"kappa": -math.inf,
                                                                                                "spread": math.nan}}],
                          "notes": ["Infinity", "nan-free"]})
    writer.close()
    [record] = results.read_rounds(tmp_path / "run")
    assert record["adapted"][0]["to"] == math.inf and record["adapted"][0]["from"] == 1.0
    summary = results.read_summary(tmp_path / "run")
    stats = summary["defaults"][0]["stats"]
    assert stats["kappa"] == -math.inf and math.isnan(stats["spread"]) and summary["notes"] == ["Infinity", "nan-free"]


def test_every_adapted_event_has_one_form_keyed_by_where_its_number_lives():
    """`results.adaptation`, the one constructor of an ``adapted`` event: key, from, to, trigger, then the round
    (first: as the summary puts it), the workers' own moves and the re-solves where given; a key outside
    ``algorithm.*``, ``problem.*`` and ``status`` (the safeguard's and GIANT's bare ``mu`` once) is refused."""
    event = results.adaptation
    assert event("algorithm.mu", 0.0, 1.5, "objective rose (round redone)") == \
        {"key": "algorithm.mu", "from": 0.0, "to": 1.5, "trigger": "objective rose (round redone)"}
    assert event("algorithm.mu", 0.0, 1.0, "flatter than objective", workers=[[0, 0.0, 1.0], [2, 0.0, 0.5]]) == \
        {"key": "algorithm.mu", "from": 0.0, "to": 1.0, "trigger": "flatter than objective",
         "workers": [[0, 0.0, 1.0], [2, 0.0, 0.5]]}
    retry = event("problem.svrg_passes", 1, 2, "accuracy test", round=3, resolves=4)
    assert retry == {"round": 3, "key": "problem.svrg_passes", "from": 1, "to": 2, "trigger": "accuracy test",
                     "resolves": 4} and list(retry)[0] == "round"
    assert event("status", "running", "client_drift", "moves cancel") == \
        {"key": "status", "from": "running", "to": "client_drift", "trigger": "moves cancel"}
    for bare in ("mu", "zeta", "A", "algorithm", "statuses"):
        with pytest.raises(ValueError, match=f"^adapted event key '{bare}' says not whose number moved; "
                                             f"name it algorithm.{bare}, problem.{bare} or status$"):
            event(bare, 0.0, 1.0, "rule")


def test_a_run_folder_is_read_back_through_public_names(tmp_path):
    """``dane.read_rounds`` and ``dane.read_summary`` read what ``dane.fit(out_dir=...)`` wrote: the records it
    returned, the summary it returned (a notebook needs no internal import)."""
    import numpy as np

    import dane

    X = np.random.default_rng(0).standard_normal((40, 3))
    result = dane.fit(dane.problems.Ridge(X, X @ np.ones(3), lam=1e-2), "gd", workers=2, rounds=3,
                      out_dir=str(tmp_path / "run"), quiet=True)
    read = dane.read_rounds(tmp_path / "run")
    assert [r["objective"] for r in read] == [r["objective"] for r in result.records] and len(read) == 4
    assert dane.read_summary(tmp_path / "run")["final_objective"] == result.summary["final_objective"]


def test_json_safe_writes_inf_and_nan_as_strings_at_any_depth_for_records_and_benchmarks():
    """`json_safe`: one function for a run's records and summary and for a benchmark's JSON
    (`synthetic.bench_file.merge_section`)."""
    from dane.synthetic import bench_file

    value = {"a": [float("inf"), (float("nan"), 1.5)], "b": {"c": -float("inf")}, "d": 2, "e": "x"}
    assert results.json_safe(value) == {"a": ["inf", ["nan", 1.5]], "b": {"c": "-inf"}, "d": 2, "e": "x"}
    assert bench_file.json_safe is results.json_safe


def test_a_cache_write_that_fails_leaves_the_old_file_and_no_temporary_one(tmp_path, monkeypatch):
    """The reference optimum's cache (`dane.problems.optimum.save`) and the synthetic ridge's
    (`dane.problems.ridge.reference_optimum`) are written by `atomic_write`: a failed write leaves the folder as it
    was."""
    import torch

    from dane.problems import optimum, ridge

    def half_then_fail(obj, f):
        (open(f, "wb") if isinstance(f, (str, Path)) else f).write(b"half")
        raise RuntimeError("the disk went away")

    monkeypatch.setenv("DANE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(ridge, "DISK_CACHE_MIN_WORK", 0)
    monkeypatch.setattr(torch, "save", half_then_fail)
    (tmp_path / "optimum").mkdir()
    (tmp_path / "optimum" / "kept.pt").write_bytes(b"old")
    with pytest.raises(RuntimeError, match="the disk went away"):
        optimum.save(tmp_path / "optimum" / "kept.pt", optimum.Reference(torch.zeros(3), 1.0, 0.0, "test"), "key")
    ridge.reference_optimum.cache_clear()
    with pytest.raises(RuntimeError, match="the disk went away"):
        ridge.reference_optimum(40, 3, "iso", 1.0, 0, 0.1)
    ridge.reference_optimum.cache_clear()
    assert sorted((p.relative_to(tmp_path).as_posix(), p.read_bytes()) for p in tmp_path.rglob("*") if p.is_file()) \
        == [("optimum/kept.pt", b"old")]


def test_two_threads_writing_one_file_at_once_each_replace_it_with_their_own_whole_file(tmp_path, monkeypatch):
    """`atomic_write` from two threads of one process (the simulator's workers, progress, trackers): each writes
    its own temporary file, so both writes succeed, each replaces ``path`` with its own whole content, and no
    temporary file is left.  ``os.replace`` waits on a barrier, so both temporary files are written before either
    is renamed: with one temporary name per process the second write truncated the first's file and the second
    rename found no file (FileNotFoundError)."""
    import threading

    path, contents = tmp_path / "summary.json", {"a": b"A" * 100_000, "b": b"B" * 70_000}
    barrier, replace, renamed, failed = threading.Barrier(2), os.replace, {}, {}

    def together(src, dst):
        barrier.wait(timeout=10)
        renamed[threading.current_thread().name] = (Path(src).name, Path(src).read_bytes())
        replace(src, dst)

    def write(name):
        try:
            results.atomic_write(path, lambda f: f.write(contents[name]))
        except Exception as err:  # noqa: BLE001 (the test counts them)
            failed[name] = repr(err)

    monkeypatch.setattr(os, "replace", together)
    threads = [threading.Thread(target=write, args=(name,), name=name) for name in contents]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert failed == {}
    assert {name: data for name, (_, data) in renamed.items()} == contents
    assert len({tmp for tmp, _ in renamed.values()}) == 2
    assert path.read_bytes() in contents.values()
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # made by open, as any new file: not mkstemp's 0o600


def test_a_failed_rename_names_the_target_not_the_temporary_file(tmp_path, monkeypatch):
    """`dane.loop.checkpoint.unwritable` reads `atomic_write`'s temporary name (`results.TEMPORARY`) back to the
    file the run was writing."""
    from dane.loop.checkpoint import unwritable

    def full(src, dst):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), src)

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OSError) as err:
        results.atomic_write(tmp_path / "checkpoint" / "COMMITTED", lambda f: f.write(b"{}"))
    monkeypatch.undo()
    assert results.TEMPORARY.fullmatch(Path(err.value.filename).name).group(1) == "COMMITTED"
    assert str(unwritable(tmp_path, err.value, 0)).startswith(
        f"out_dir={tmp_path} cannot be written (No space left on device: checkpoint/COMMITTED); kept: no round record")
    assert list((tmp_path / "checkpoint").iterdir()) == []


def test_a_wait_for_the_folders_flock_that_the_file_system_fails_is_one_line(tmp_path, monkeypatch):
    """`flocked` where another descriptor holds the folder's flock and the blocking wait fails with ENOLCK (a file
    system that lends no lock to wait on, as some NFS mounts): a traceback; now the line with the fix.  A file system
    that has no flock at all (ENOLCK at once) still runs the block unheld."""
    import fcntl

    from dane.records.lock import flocked

    real = fcntl.flock

    def no_wait(fd, op):  # the try (LOCK_NB) is the kernel's; the wait fails
        if op & fcntl.LOCK_NB:
            return real(fd, op)
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    holder = os.open(tmp_path, os.O_RDONLY)
    real(holder, fcntl.LOCK_EX)  # another descriptor holds it exclusively: a push writing the store
    monkeypatch.setattr(fcntl, "flock", no_wait)
    busy, ran = [], []
    with pytest.raises(ConfigError) as err:
        with flocked(tmp_path, exclusive=False, busy=lambda: busy.append(True)):
            ran.append(True)
    os.close(holder)
    assert str(err.value) == (f"{tmp_path} is locked by another process, and its file system cannot wait for the lock "
                              "(no locks available, as on some NFS mounts); put the folder on a local disk")
    assert busy == [True] and ran == []

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with flocked(tmp_path, exclusive=True, busy=lambda: busy.append(True)):
        ran.append(True)
    assert busy == [True] and ran == [True]
