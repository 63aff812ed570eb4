"""Checkpoint and resume: a resumed run continues exactly as the uninterrupted one (same seed,
deterministic data order), record for record, and bad resumes are one-line config errors.

On the simulator's batched path (``sim.batched``) a checkpoint is one part holding the m workers' stacked state
(SCAFFOLD's c_i, FedRed's h, the sampler, the local-work rows), committed as batched; a resumed sampled run is the
uninterrupted one, record for record and in its clock's split, and a checkpoint resumes only on the path that wrote it.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import struct
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from dane.loop import kinds
from dane.loop.faults import SimulatedFault
from dane.loop.checkpoint import (DAMAGED_FIX, checkpoint_path, committed, config_differences, kept_rounds,
                                  load_checkpoint, truncate_rounds)
from dane.comm import AlphaBeta
from dane.comm.meters import StartUpLeftOut
from dane.errors import ConfigError, OutputError
from dane.loop.launch import execute
from dane.records.lock import take_lock
from dane.records import confusion, results
from dane.records.results import read_rounds, read_summary
from dane.experiments.config import run_spec
from helpers import composed

SMALL_MLP = ("problem=digits_mlp", "problem.model.hidden=[16]", "problem.inner_steps=5", "workers=2", "quiet=true")
SMALL_RIDGE = ("problem=ridge_synthetic", "problem.n_samples=400", "problem.dim=20", "workers=4", "quiet=true")



def execute_with(out_dir, *overrides: str) -> dict:
    return execute(run_spec(composed(*overrides)), str(out_dir))


def without_time(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "time_s"} for r in records]


class Ran:
    """This module's runs, each made once a session by its overrides (`execute_with`) in a folder of its own, and
    handed to a test as a copy (``ran(to, *overrides)``: the run directory at ``to``), which the test may resume,
    damage or cut without another test seeing it."""

    def __init__(self, root):
        self.root, self.folders = root, {}

    def __call__(self, to, *overrides: str):
        if overrides not in self.folders:
            folder = self.root / str(len(self.folders))
            execute_with(folder, *overrides)
            self.folders[overrides] = folder
        shutil.copytree(self.folders[overrides], to, dirs_exist_ok=True)
        return to


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> Ran:
    return Ran(tmp_path_factory.mktemp("ran"))


@pytest.fixture(scope="module", autouse=True)
def no_confusion_png():
    """A classifier's run ends by drawing its confusion matrix (`dane.records.confusion.plot_confusion`, most of a
    small MLP run's time); no test here reads the figure (tests/test_neural.py does), so it is not drawn."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(confusion, "plot_confusion", lambda *args, **kwargs: None)
        yield


@pytest.mark.parametrize("overrides", [
    pytest.param(SMALL_MLP, id="dane-mlp"),
    pytest.param((*SMALL_MLP, "algorithm=sync_sgd", "algorithm.optimizer=adam", "algorithm.lr=0.01",
                  "algorithm.batch_size=32", "algorithm.steps_per_round=4"), id="sync_sgd-adam"),
    pytest.param((*SMALL_MLP, "problem.inner_optimizer=adam", "problem.inner_lr=0.01", "problem.grad_batches=2"),
                 id="dane-adam-stochastic-gradient"),
    pytest.param(SMALL_RIDGE, id="dane-ridge"),
    # ρ estimated before round 0 (one allreduce, in round 0's comm_rounds), halved by residual balancing before the
    # checkpoint: the resumed run's build estimates it again, and the checkpoint's ρ and counters replace it
    pytest.param((*SMALL_RIDGE, "algorithm=admm", "algorithm.adaptive_rho=true"), id="admm-ridge-balanced-rho"),
])
def test_resumed_run_equals_the_uninterrupted_run(tmp_path, overrides, ran):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    ran(whole, *overrides, "rounds=6", "checkpoint_every=3")
    # "Crash" after round 4 (one round past the checkpoint at round 3), then resume to 6.
    ran(cut, *overrides, "rounds=4", "checkpoint_every=3")
    assert [r["round"] for r in read_rounds(cut)] == [0, 1, 2, 3, 4]
    summary = execute_with(cut, *overrides, "rounds=6", "checkpoint_every=3", f"resume={cut}")
    expected, got = read_rounds(whole), read_rounds(cut)
    assert [r["round"] for r in got] == list(range(7))
    assert without_time(got) == without_time(expected)  # exact: floats compare equal, not approximately
    assert all(b["time_s"] >= a["time_s"] for a, b in zip(got, got[1:]))  # the clock continues
    assert summary["resumed_from_round"] == 3
    assert read_summary(cut)["final_objective"] == read_summary(whole)["final_objective"]
    assert checkpoint_path(cut, 1, 6).is_file()
    assert sorted(p.name for p in (cut / "checkpoint").iterdir()) == ["COMMITTED", "round6"]  # older rounds deleted


def test_resume_refuses_another_algorithm(tmp_path, ran):
    ran(tmp_path, *SMALL_RIDGE, "rounds=2", "checkpoint_every=2")
    with pytest.raises(ConfigError, match="was run with another config: algorithm.name: dane -> gd; "):
        execute_with(tmp_path, *SMALL_RIDGE, "algorithm=gd", "algorithm.lr=0.1", "rounds=4", f"resume={tmp_path}")


def test_resume_refuses_another_worker_count(tmp_path, ran):
    ran(tmp_path, *SMALL_RIDGE, "rounds=2", "checkpoint_every=2")
    with pytest.raises(ConfigError, match="was a run with workers=4, this one has workers=5"):
        execute_with(tmp_path, *SMALL_RIDGE, "workers=5", "rounds=4", f"resume={tmp_path}")


def test_resume_needs_enough_rounds_and_a_checkpoint(tmp_path):
    execute_with(tmp_path, *SMALL_RIDGE, "rounds=4", "checkpoint_every=4")
    with pytest.raises(ConfigError, match="holds a finished run .max_rounds after 4 rounds."):
        execute_with(tmp_path, *SMALL_RIDGE, "rounds=3", f"resume={tmp_path}")
    (tmp_path / "summary.json").unlink()  # as a run killed after its checkpoint at round 4 leaves it
    with pytest.raises(ConfigError, match="is at round 4 but rounds=3; set rounds >= 4"):
        execute_with(tmp_path, *SMALL_RIDGE, "rounds=3", f"resume={tmp_path}")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="has no checkpoint/ folder"):
        run_spec(composed(*SMALL_RIDGE, f"resume={empty}"))
    with pytest.raises(ConfigError) as missing:  # a mistyped path: no folder at all, not one without checkpoints
        run_spec(composed(*SMALL_RIDGE, f"resume={tmp_path / 'mistyped'}"))
    assert str(missing.value) == (f"resume={tmp_path / 'mistyped'}: no such run directory; point it at the directory "
                                  "of a run made with checkpoint_every > 0")
    with pytest.raises(ConfigError, match="checkpoint_every must be an integer >= 0"):
        run_spec(composed(*SMALL_RIDGE, "checkpoint_every=-1"))


# --- a checkpoint is one consistent unit across ranks ---------------------------------------------------------

def cut_run(ran: Ran, tmp_path):
    """A run "crashed" after round 4, its last committed checkpoint at round 3 (a copy of the module's one run)."""
    return ran(tmp_path, *SMALL_RIDGE, "rounds=4", "checkpoint_every=3")


def snapshot(folder) -> dict:
    """Every file under ``folder``: its bytes and its inode (a file replaced by an equal one is not as it was)."""
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_ino) for p in sorted(folder.rglob("*"))
            if p.is_file()}


def test_a_round_is_committed_once_every_part_is_written(tmp_path, ran):
    run_dir = cut_run(ran, tmp_path)
    marker = committed(run_dir)
    assert (marker["round"], marker["workers"]) == (3, 4)
    assert "dim: 20" in marker["config"]  # the run's resolved config, for the resume check
    assert sorted(p.name for p in (run_dir / "checkpoint" / "round3").iterdir()) == [f"rank{r}.pt" for r in range(4)]


def test_the_parts_of_an_uncommitted_round_are_ignored(tmp_path, ran):
    whole = ran(tmp_path / "whole", *SMALL_RIDGE, "rounds=6", "checkpoint_every=3")
    run_dir = cut_run(ran, tmp_path / "cut")
    # a crash while round 6 was being written: two of four parts, one of them half written, no commit
    (run_dir / "checkpoint" / "round6").mkdir()
    shutil.copy(checkpoint_path(run_dir, 0, 3), checkpoint_path(run_dir, 0, 6))
    checkpoint_path(run_dir, 1, 6).write_bytes(b"PK\x03\x04 half")
    summary = execute_with(run_dir, *SMALL_RIDGE, "rounds=6", "checkpoint_every=3", f"resume={run_dir}")
    assert summary["resumed_from_round"] == 3
    assert without_time(read_rounds(run_dir)) == without_time(read_rounds(whole))


@pytest.mark.parametrize("damage, message", [
    ("missing", r"checkpoint/round3 lacks rank2.pt for workers=4"),
    ("extra", r"has parts of other ranks \(rank4.pt\)"),
    ("empty", r"checkpoint file \S+/round3/rank2.pt is empty"),
    ("truncated", r"checkpoint file \S+/round3/rank2.pt is truncated or corrupt"),
    ("dangling", r"checkpoint file \S+/round3/rank2.pt cannot be read \(No such file or directory\)"),
])
def test_an_inconsistent_or_damaged_checkpoint_is_one_line_before_anything_changes(tmp_path, damage, message, ran):
    run_dir = cut_run(ran, tmp_path)
    part = checkpoint_path(run_dir, 2, 3)
    if damage == "missing":
        part.unlink()
    elif damage == "extra":
        shutil.copy(part, checkpoint_path(run_dir, 4, 3))
    elif damage == "empty":
        part.write_bytes(b"")
    elif damage == "dangling":  # a link to a part that is gone
        part.unlink()
        part.symlink_to(part.with_name("gone.pt"))
    else:
        part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
    rounds_before = (run_dir / "rounds.jsonl").read_bytes()
    with pytest.raises(ConfigError, match=message) as err:
        run_spec(composed(*SMALL_RIDGE, "rounds=6", f"resume={run_dir}"))
    assert str(err.value).endswith(f"; {DAMAGED_FIX}")  # the fix that runs (removing checkpoint/ left the records)
    with pytest.raises(ConfigError, match=message):  # the Python API path checks too
        spec = run_spec(composed(*SMALL_RIDGE, "rounds=6"))
        execute(replace(spec, control=replace(spec.control, resume=str(run_dir))), None)
    assert (run_dir / "rounds.jsonl").read_bytes() == rounds_before


@pytest.mark.parametrize("damage, what", [("value", "fails its CRC-32 check"),
                                          ("folder", "is marked a folder in its zip directory")])
def test_a_part_damaged_inside_is_one_line_before_anything_changes(tmp_path, damage, what, ran):
    """One bit flipped: of a tensor's value, or of its entry's attributes in the zip directory (MS-DOS's folder bit,
    outside any CRC, makes torch read that tensor from uninitialized memory).  The part is a whole zip that torch
    loads, and the run would go on with other numbers; the check refuses it."""
    run_dir = cut_run(ran, tmp_path)
    part = checkpoint_path(run_dir, 1, 3)
    with zipfile.ZipFile(part) as archive:
        entry = max((i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
        directory = archive.start_dir
    data = bytearray(part.read_bytes())
    if damage == "value":
        name, extra = struct.unpack("<HH", data[entry.header_offset + 26:entry.header_offset + 30])  # local header
        data[entry.header_offset + 30 + name + extra + entry.file_size // 2] ^= 0x10
    else:
        at = data.find(b"PK\x01\x02", directory)  # the central directory's entries: the name at 46, attributes at 38
        while data[at + 46:at + 46 + len(entry.filename)] != entry.filename.encode():
            at = data.find(b"PK\x01\x02", at + 1)
        data[at + 38] ^= 0x10
    part.write_bytes(bytes(data))
    torch.load(part, weights_only=True)  # nothing torch sees
    before = snapshot(run_dir)
    with pytest.raises(ConfigError) as err:
        run_spec(composed(*SMALL_RIDGE, "rounds=6", f"out_dir={run_dir}", "resume=auto"))
    assert str(err.value) == f"checkpoint file {part} is damaged ({entry.filename} {what}); {DAMAGED_FIX}"
    assert snapshot(run_dir) == before


def test_a_resume_reads_each_part_whole_once(tmp_path, ran, monkeypatch):
    """The config's resolution and the launch both check the checkpoint; each part's CRC-32s are read once."""
    run_dir = cut_run(ran, tmp_path)
    checked = []
    testzip = zipfile.ZipFile.testzip
    monkeypatch.setattr(zipfile.ZipFile, "testzip", lambda archive: checked.append(archive.filename) or testzip(archive))
    execute_with(run_dir, *SMALL_RIDGE, "rounds=6", "checkpoint_every=3", f"resume={run_dir}")
    assert sorted(checked) == [str(checkpoint_path(run_dir, r, 3)) for r in range(4)]


def test_a_part_damaged_after_its_check_is_checked_again(tmp_path, ran):
    run_dir = cut_run(ran, tmp_path)
    run_spec(composed(*SMALL_RIDGE, "rounds=6", f"resume={run_dir}"))
    part = checkpoint_path(run_dir, 1, 3)
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0x10  # in place: the same size and inode
    part.write_bytes(bytes(data))
    with pytest.raises(ConfigError, match=r"rank1.pt is damaged"):
        run_spec(composed(*SMALL_RIDGE, "rounds=6", f"resume={run_dir}"))


def test_an_unloadable_part_or_a_part_of_another_round_names_the_file(tmp_path, ran):
    run_dir = cut_run(ran, tmp_path)
    part = checkpoint_path(run_dir, 1, 3)
    meta = {"algorithm": "dane", "problem": "ridge_synthetic", "workers": 4, "rank": 1}
    with zipfile.ZipFile(part, "w") as f:  # a zip archive, but not one torch wrote
        f.writestr("junk.txt", "not a checkpoint")
    with pytest.raises(ConfigError, match=r"checkpoint file \S+/round3/rank1.pt cannot be loaded") as err:
        load_checkpoint(run_dir, 1, meta)
    assert str(err.value).endswith(f"; {DAMAGED_FIX}")
    state = torch.load(checkpoint_path(run_dir, 0, 3), weights_only=True)
    torch.save({**state, "round": 2}, part)
    with pytest.raises(ConfigError) as err:
        load_checkpoint(run_dir, 1, meta)
    assert str(err.value) == f"checkpoint file {part} is not round 3's part; the checkpoint is inconsistent; {DAMAGED_FIX}"
    (run_dir / "checkpoint" / "COMMITTED").write_text("{\"round\": 3")
    with pytest.raises(ConfigError) as err:
        run_spec(composed(*SMALL_RIDGE, "rounds=6", f"resume={run_dir}"))
    assert str(err.value) == (f"{run_dir / 'checkpoint' / 'COMMITTED'} is not a checkpoint commit marker (damaged); "
                              f"{DAMAGED_FIX}")
    # the fix it names runs: overwrite=true replaces the run, its damaged marker too (before, the occupied folder's
    # refusal read the marker and said this line again); without it the folder is refused as occupied, untouched
    before = snapshot(run_dir)
    with pytest.raises(ConfigError, match=r"already holds a run \(rounds.jsonl, summary.json\); choose a new out_dir, or "
                                             r"replace it with overwrite=true"):
        execute_with(run_dir, *SMALL_RIDGE, "rounds=6", "checkpoint_every=3")
    assert snapshot(run_dir) == before
    execute_with(run_dir, *SMALL_RIDGE, "rounds=6", "checkpoint_every=3", "overwrite=true")
    whole = ran(tmp_path / "whole", *SMALL_RIDGE, "rounds=6", "checkpoint_every=3")
    assert without_time(read_rounds(run_dir)) == without_time(read_rounds(whole))
    assert committed(run_dir)["round"] == 6


def test_a_torn_last_record_is_dropped_and_a_damaged_one_refused(tmp_path, ran):
    whole = ran(tmp_path / "whole", *SMALL_RIDGE, "rounds=6", "checkpoint_every=3")
    run_dir = cut_run(ran, tmp_path / "cut")
    with open(run_dir / "rounds.jsonl", "a") as f:
        f.write('{"round": 5, "time_s": 0.1, "obj')  # a crash in the middle of a write
    execute_with(run_dir, *SMALL_RIDGE, "rounds=6", "checkpoint_every=3", f"resume={run_dir}")
    assert without_time(read_rounds(run_dir)) == without_time(read_rounds(whole))
    lines = (run_dir / "rounds.jsonl").read_text().splitlines(keepends=True)
    (run_dir / "rounds.jsonl").write_text("".join(lines[:2] + ["garbage\n"] + lines[2:]))
    with pytest.raises(ConfigError, match=r"rounds.jsonl line 3 is not a round record"):
        truncate_rounds(run_dir, 3)


def test_a_log_that_lacks_rounds_the_checkpoint_needs_is_refused_with_the_fixes(tmp_path):
    """`kept_rounds`: a log whose rounds before the checkpoint are not all there is refused, naming what it lacks or
    where it is out of order, and the two ways on (resuming would drop those rounds from the log for good)."""
    path = tmp_path / "rounds.jsonl"
    fixes = f"the checkpoint at round 4 needs the records of rounds 0-3; restore the file to resume, or {DAMAGED_FIX}"
    for rounds, where in (([0, 3, 4], "lacks rounds 1-2"), ([0, 1, 3], "lacks round 2"),
                          ([0, 2, 1, 3], "holds rounds repeated or out of order")):
        path.write_text("".join(f'{{"round": {r}}}\n' for r in rounds))
        with pytest.raises(ConfigError) as err:
            kept_rounds(path, 4)
        assert str(err.value) == f"{path} {where}, and {fixes}"


class FullDisk:
    """A file on a file system with ``room`` bytes free: the write that does not fit fails (ENOSPC), as every later
    one (torch.save's own writes then end in its RuntimeError, "unexpected pos", as on a full tmpfs)."""

    def __init__(self, file, room: int = 1000):
        self.file, self.room = file, room

    def write(self, data):
        size = memoryview(data).nbytes
        if size > self.room:
            self.room = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= size
        return self.file.write(data)

    def __getattr__(self, name):
        return getattr(self.file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()


def test_a_full_disk_while_a_part_is_written_is_one_line_keeping_the_records_and_the_last_checkpoint(
        tmp_path, monkeypatch, ran):
    """torch.save into the file turned the OSError into a RuntimeError ("unexpected pos"): a traceback, exit 1.  The
    part is serialized in memory and written by Python, so the run ends with `unwritable`'s line (exit 2)."""
    whole = ran(tmp_path / "whole", *SMALL_RIDGE, "rounds=6", "checkpoint_every=2")
    run_dir = tmp_path / "run"

    def full_at_round_4(path, *args, **kwargs):
        file = open(path, *args, **kwargs)
        return FullDisk(file) if Path(path).parent.name == "round4" and ".rank0.pt." in Path(path).name else file

    monkeypatch.setattr(results, "open", full_at_round_4, raising=False)  # `atomic_write`'s open
    again = (*SMALL_RIDGE, "rounds=6", "checkpoint_every=2", f"out_dir={run_dir}", "resume=auto")
    with pytest.raises(OutputError) as err:
        execute_with(run_dir, *again)
    monkeypatch.undo()
    assert str(err.value) == (f"out_dir={run_dir} cannot be written (No space left on device: "
                              "checkpoint/round4/rank0.pt); kept: rounds 0-3 in rounds.jsonl and the checkpoint of "
                              f"round 2; free space or make it writable, then rerun with resume=auto out_dir={run_dir} "
                              "to continue from round 2")
    assert committed(run_dir)["round"] == 2
    # no part of rank 0 and no temporary file in the round never committed (the other ranks' parts are ignored)
    assert {p.name for p in (run_dir / "checkpoint" / "round4").iterdir()} <= {"rank1.pt", "rank2.pt", "rank3.pt"}
    assert execute_with(run_dir, *again)["resumed_from_round"] == 2
    assert without_time(read_rounds(run_dir)) == without_time(read_rounds(whole))


@pytest.mark.parametrize("resume", ["dir", "auto"])
def test_a_resume_into_a_directory_a_live_run_holds_leaves_it_byte_for_byte(tmp_path, resume, ran):
    """The lock is taken before the records are cut: a live run keeps appending to its own rounds.jsonl."""
    run_dir = cut_run(ran, tmp_path)
    lock = take_lock(run_dir)  # as the live run holds it: this process, alive
    before = snapshot(run_dir)
    again = (f"resume={run_dir}",) if resume == "dir" else (f"out_dir={run_dir}", "resume=auto")
    with pytest.raises(ConfigError) as err:
        execute_with(run_dir, *SMALL_RIDGE, "rounds=6", "checkpoint_every=3", *again)
    assert str(err.value) == (f"out_dir={run_dir} is in use by another run ({socket.gethostname()} pid "
                              f"{os.getpid()}); choose another out_dir, or wait for that run to end (remove {lock} if "
                              "no run uses the directory)")
    assert snapshot(run_dir) == before
    assert [r["round"] for r in read_rounds(run_dir)] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("change, key", [("problem.dim=21", "problem.dim: 20 -> 21"), ("seed=1", "problem.seed: 0 -> 1; seed: 0 -> 1"),
                                         ("dtype=float32", "dtype: float64 -> float32")])
def test_resume_with_another_config_is_refused_before_records_are_cut(tmp_path, change, key, ran):
    run_dir = cut_run(ran, tmp_path)
    before = {name: (run_dir / name).read_bytes() for name in ("rounds.jsonl", "config.yaml", "summary.json")}
    with pytest.raises(ConfigError, match=f"was run with another config: {key}"):
        run_spec(composed(*SMALL_RIDGE, change, "rounds=6", f"resume={run_dir}"))
    assert {name: (run_dir / name).read_bytes() for name in before} == before
    # what may change: rounds, checkpoint_every, display and output settings
    run_spec(composed(*SMALL_RIDGE, "rounds=9", "checkpoint_every=1", "print_every=2", "progress=none",
                    "save_iterate=true", "quiet=false", f"resume={run_dir}"))


# --- the batched simulator: one part for the m workers ---------------------------------------------------------

BATCHED = ("problem=ridge_synthetic", "problem.n_samples=240", "problem.dim=10", "workers=6", "sim.batched=true",
           "quiet=true", "save_iterate=true")
SAMPLED = ("algorithm.clients_per_round=3", "algorithm.local_steps=3")


def batched_cut_and_resumed(tmp_path, *overrides: str) -> tuple:
    """The uninterrupted batched run (7 rounds, no checkpoint) and one stopped after round 5 (committed at 4), then
    resumed (resume=auto, as a restart repeats its command): their run directories and the resume's summary."""
    whole, run_dir = tmp_path / "whole", tmp_path / "run"
    execute_with(whole, *BATCHED, *overrides, "rounds=7")
    again = (*BATCHED, *overrides, "checkpoint_every=2", f"out_dir={run_dir}", "resume=auto")
    first = execute_with(run_dir, *again, "rounds=5")
    assert first["simulator_path"] == "batched" and "resumed_from_round" not in first
    marker = committed(run_dir)
    assert (marker["round"], marker["workers"], marker["batched"]) == (4, 6, True)
    # one part holds every worker's state: no rank<r>.pt for r > 0, and older rounds are gone
    assert sorted(p.name for p in (run_dir / "checkpoint").iterdir()) == ["COMMITTED", "round4"]
    assert [p.name for p in (run_dir / "checkpoint" / "round4").iterdir()] == ["rank0.pt"]
    return whole, run_dir, execute_with(run_dir, *again, "rounds=7")


@pytest.mark.parametrize("overrides", [
    pytest.param(("algorithm=scaffold", *SAMPLED), id="scaffold-sampled"),
    pytest.param(("algorithm=fedred", "algorithm.lam=0.1", "algorithm.control_variate=2", *SAMPLED),
                 id="fedred-type2-sampled"),
    pytest.param(("algorithm=dane",), id="dane-ridge"),
])
def test_a_batched_run_resumes_from_its_one_part_as_the_uninterrupted_run(tmp_path, overrides):
    whole, run_dir, summary = batched_cut_and_resumed(tmp_path, *overrides)
    assert summary["resumed_from_round"] == 4 and summary["simulator_path"] == "batched"
    expected, got = read_rounds(whole), read_rounds(run_dir)
    assert [r["round"] for r in got] == list(range(8))
    assert without_time(got) == without_time(expected)  # exact: the stacked client state came back whole
    assert torch.equal(torch.load(run_dir / "iterate.pt"), torch.load(whole / "iterate.pt"))
    straight = read_summary(whole)
    assert summary["simulated_comm_s"] == straight["simulated_comm_s"]  # the same messages, priced alike
    assert summary["simulated_compute_s"] + summary["simulated_comm_s"] == \
        pytest.approx(summary["simulated_time_s"], rel=1e-12)  # the split covers the whole clock, not the rounds after
    assert all(b["time_s"] >= a["time_s"] for a, b in zip(got, got[1:]))  # the clock continues


def test_a_checkpoint_resumes_only_on_the_path_that_wrote_it(tmp_path):
    """A batched checkpoint (one part) on the per-worker path, or a per-worker one (m parts) on the batched path:
    one line naming the sim.batched that resumes it, before anything in the run directory changes."""
    batched, threads = tmp_path / "batched", tmp_path / "threads"
    args = ("algorithm=scaffold", *SAMPLED, "checkpoint_every=2")
    execute_with(batched, *BATCHED, *args, "rounds=2")
    execute_with(threads, *BATCHED, *args, "rounds=2", "sim.batched=false")
    assert committed(threads)["batched"] is False and len(list((threads / "checkpoint" / "round2").iterdir())) == 6
    before = {run_dir: (run_dir / "rounds.jsonl").read_bytes() for run_dir in (batched, threads)}
    # sim.batched may change (it only chooses the path): the path the run takes is what is checked, whichever
    # decided it (sim.batched, or under auto the workers and the device), on the command line and the Python API
    for run_dir, mode, fix in ((batched, "false", "resume it in the simulator with sim.batched=true"),
                               (threads, "true", "resume it with sim.batched=false")):
        message = f"^resume={run_dir} holds a checkpoint of .*; {fix}$"
        with pytest.raises(ConfigError, match=message) as err:
            execute_with(run_dir, *BATCHED, *args, "rounds=4", f"sim.batched={mode}", f"resume={run_dir}")
        assert "\n" not in str(err.value)
        spec = run_spec(composed(*BATCHED, *args, "rounds=4", f"sim.batched={mode}"))
        with pytest.raises(ConfigError, match=message):
            execute(replace(spec, control=replace(spec.control, resume=str(run_dir))), None)
    assert {run_dir: (run_dir / "rounds.jsonl").read_bytes() for run_dir in (batched, threads)} == before
    # and the fix it names resumes
    assert execute_with(threads, *BATCHED, *args, "rounds=4", "sim.batched=false",
                        f"resume={threads}")["resumed_from_round"] == 2


def test_a_batched_checkpoint_lacking_its_part_is_one_line(tmp_path):
    execute_with(tmp_path, *BATCHED, "rounds=2", "checkpoint_every=2")
    checkpoint_path(tmp_path, 0, 2).unlink()
    with pytest.raises(ConfigError, match=r"round2 lacks rank0.pt for workers=6 \(batched: one part holds every "
                                          r"worker\); the checkpoint is inconsistent"):
        run_spec(composed(*BATCHED, "rounds=4", f"resume={tmp_path}"))


# --- the simulated clock across checkpoints and resumes -----------------------------------------------------------

class NoCompute(StartUpLeftOut):
    """Every compute phase reads 0 s: the simulated clock is then the seeded straggler delays and the cost model's
    prices alone, the same in every run of a config, so that two runs' ``time_s`` compare exactly."""

    name = "none"

    def start(self) -> float:
        return 0.0

    def read(self, mark: float) -> float:
        return 0.0

    def stop(self) -> None:
        pass


@pytest.fixture
def no_compute(monkeypatch):
    monkeypatch.setattr(kinds, "meter_for", lambda devices: NoCompute())


DELAYED = ("problem=ridge_synthetic", "problem.n_samples=240", "problem.dim=10", "workers=6", "quiet=true",
           "tol=null", "sim.delay_mean=1.0")


def test_a_checkpoint_leaves_the_clock_alone(tmp_path, no_compute):
    """The per-worker path's checkpoint waits at a barrier for every rank's part; off the clock it draws no straggler
    delays (a phase of its own would charge the largest of 6 draws, H_6 = 2.45 s on average at mean 1 s, at every checkpoint)."""
    without = execute_with(tmp_path / "without", *DELAYED, "sim.batched=false", "rounds=4")
    checkpointed = execute_with(tmp_path / "with", *DELAYED, "sim.batched=false", "rounds=4", "checkpoint_every=1")
    assert committed(tmp_path / "with")["round"] == 4
    got, expected = read_rounds(tmp_path / "with"), read_rounds(tmp_path / "without")
    assert got == expected  # time_s too: exact
    assert expected[-1]["time_s"] > expected[-1]["comm_rounds"] * 1.0  # the delays are in it: slowest of 6 > mean
    assert [checkpointed[k] for k in ("simulated_time_s", "simulated_compute_s", "simulated_comm_s")] == \
        [without[k] for k in ("simulated_time_s", "simulated_compute_s", "simulated_comm_s")]


def tail_file(path) -> str:
    """A hand-written tail calibration (docs/simulator.md's format): excess uniform on [0, 10 ms]."""
    path.write_text(json.dumps({"alpha": 1e-4, "beta": 1e8, "tail": {
        "probs": [0.0, 1.0], "excess_s": [0.0, 0.01], "samples": 2, "machine": {"host": "here"}, "launcher": "horovodrun",
        "np": 2, "measured_at": "2025-01-01T00:00:00"}}))
    return str(path)


@pytest.mark.parametrize("batched", ["false", "true"])
@pytest.mark.parametrize("draws", ["delays", "tail"])
def test_a_resumed_run_draws_what_the_uninterrupted_run_draws(tmp_path, no_compute, batched, draws):
    """The straggler delays and a tail's excesses come from seeded generators; a checkpoint keeps where they stand,
    so a run lost after round 3 (committed at 2) and resumed has the uninterrupted run's clock at every record (drawn
    again from the seeds, the rounds after the resume repeated the first rounds' draws)."""
    extra = ("sim.delay_mean=1.0",) if draws == "delays" else (f"sim.calibration={tail_file(tmp_path / 'tail.json')}",)
    args = (*DELAYED[:-1], *extra, f"sim.batched={batched}", "rounds=6")
    straight = execute_with(tmp_path / "straight", *args)
    again = (*args, "checkpoint_every=2", f"out_dir={tmp_path / 'cut'}", "resume=auto")
    with pytest.raises(SimulatedFault, match="simulated worker 1 was lost at round 3"):
        execute_with(tmp_path / "cut", *again, "sim.fail_at=[[3,1]]")  # worker 1 lost after round 3
    assert committed(tmp_path / "cut")["round"] == 2
    resumed = execute_with(tmp_path / "cut", *again)
    assert resumed["resumed_from_round"] == 2
    got, expected = read_rounds(tmp_path / "cut"), read_rounds(tmp_path / "straight")
    assert [r["time_s"] for r in got] == [r["time_s"] for r in expected]  # exact
    assert got == expected
    for key in ("simulated_time_s", "simulated_comm_s"):
        assert resumed[key] == straight[key]
    assert resumed["simulated_compute_s"] == pytest.approx(straight["simulated_compute_s"], rel=1e-12)
    if draws == "tail":  # drawn: the summary names the tail's file
        assert resumed["calibration"]["path"] == straight["calibration"]["path"] == str(tmp_path / "tail.json")


def test_calibration_is_written_atomically(tmp_path):
    path = tmp_path / "calibration.json"
    AlphaBeta(alpha=1e-4, beta=1e9).save(path, note="measured")
    AlphaBeta(alpha=2e-4, beta=1e9).save(path)
    assert AlphaBeta.load(path) == AlphaBeta(alpha=2e-4, beta=1e9)
    assert [p.name for p in tmp_path.iterdir()] == ["calibration.json"]  # no temporary file left


def test_an_option_added_since_the_checkpoint_at_null_is_no_difference():
    """A config written before ``data.client_column`` existed resumes under one that holds it as null; any other
    value, or a key that went away, is a difference."""
    old = "data:\n  path: a.csv\nseed: 0\n"
    assert config_differences(old, "data:\n  path: a.csv\n  client_column: null\nseed: 0\n") == []
    assert config_differences(old, "data:\n  path: a.csv\n  client_column: country\nseed: 0\n") == [
        "data.client_column: <absent> -> country"]
    assert config_differences("data:\n  path: a.csv\n  client_column: null\nseed: 0\n", old) == [
        "data.client_column: None -> <absent>"]
