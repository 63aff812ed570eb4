"""Checkpoints that are one consistent unit across ranks, and resuming a run in place.

Every ``checkpoint_every`` rounds each worker writes its part,
``<run dir>/checkpoint/round<k>/rank<r>.pt``: the state `dane.loop.runner.run` hands out (next
round, cost counters, first record, early-stopping state, ``algo.state_dict()``) plus
what the run was (algorithm, problem, workers).  After a barrier (every part is on
disk), rank 0 commits round k with one atomic marker, ``checkpoint/COMMITTED`` (JSON:
the round, the world size and the run's resolved config), then deletes every other
round.  A kill at any moment therefore leaves one committed round whose parts all
exist; the parts of a round that was never committed are ignored.

On the simulator's batched path (`dane.comm.batched`) one process holds every worker's state, stacked: the run
writes one part, ``rank0.pt``, and commits it with a marker that says so (``"batched": true``) and no barrier
(nothing else writes).  A checkpoint continues on the path that wrote it: `check_resume` expects one part of a
batched commit and m of any other, and refuses in one line a batched checkpoint on the per-worker path (threads,
launched processes) or a per-worker one on the batched path, naming the ``sim.batched`` that resumes it.

Resuming first checks the committed round against this run (`check_resume`: world
size, the path, every part present and whole (its zip entries' CRC-32s), the same config
up to `MAY_CHANGE`), before anything in the run directory changes; then each rank loads its
own part and rank 0, once it holds the directory's lock, cuts ``rounds.jsonl`` back to the
rounds before the checkpoint (dropping a line torn by a crash), so that the finished run
directory reads exactly like one uninterrupted run.  All ranks must see the run directory
(one machine, or a shared file system).

Every file here is written to a temporary name, flushed to disk and renamed over the
old one (``os.replace``), so a crash leaves the old file or the new one, never half of one.
A write into the run directory that fails mid-run (a full or read-only file system) ends
the run with one line (`keeps_what_was_written`, `unwritable`) naming what stays: the whole
records, the last committed checkpoint, and the command that continues from it.
"""
from __future__ import annotations

import errno
import functools
import io
import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import torch
import yaml

from ..errors import ConfigError, OutputError, UserError, brief
from ..records.results import ROUNDS_FILE, TEMPORARY, atomic_write, read_summary

CHECKPOINT_DIR = "checkpoint"
COMMITTED = "COMMITTED"

#: the fix named where a run cannot be resumed (its checkpoint damaged or inconsistent, records it needs damaged):
#: a start keeps an unfinished run's records (`dane.loop.resume`) unless told to replace them
DAMAGED_FIX = "start again (no resume=) with overwrite=true or a new out_dir"

#: config keys a resumed run may change: how long it runs and what it shows or writes, not what it computes.
#: ``save_iterate`` only adds an output file, ``similarity`` a summary entry; ``sim.fail_at`` injects the faults that the resume recovers from.
#: ``sim.batched`` only chooses the simulator's path, and `check_path` compares the path taken with the checkpoint's
#: (a per-worker checkpoint written under auto before the batched path checkpointed resumes with false).
MAY_CHANGE = ("rounds", "resume", "out_dir", "quiet", "print_every", "progress", "checkpoint_every",
              "early_stop", "overwrite", "save_iterate", "similarity", "sim.fail_at", "sim.batched", "logger",
              "mlflow_uri")


def round_dir(run_dir: str | Path, round_: int) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR / f"round{round_}"


def checkpoint_path(run_dir: str | Path, rank: int, round_: int) -> Path:
    return round_dir(run_dir, round_) / f"rank{rank}.pt"


def part_meta(spec, rank: int, size: int) -> dict:
    """What a checkpoint part records about its run (``size`` workers), checked when it is loaded."""
    return {"algorithm": spec.algorithm.name, "problem": spec.problem.name, "workers": size, "rank": rank}


def save_checkpoint(run_dir: str | Path, rank: int, state: dict, meta: dict) -> None:
    """This rank's part of the checkpoint of round ``state["round"]`` (not yet committed: see `commit_checkpoint`)."""
    write_torch(checkpoint_path(run_dir, rank, state["round"]), _plain({**state, "meta": meta}))


def write_torch(path: str | Path, value) -> None:
    """``torch.save(value)`` at ``path``, atomically (`atomic_write`).  Serialized in memory first and written with
    Python's own file I/O: torch.save into a file turns the OSError of a full disk into a RuntimeError ("unexpected
    pos"), which would end the run with a traceback instead of `unwritable`'s one line."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    data = buffer.getbuffer()
    atomic_write(path, lambda f: f.write(data))


def commit_checkpoint(run_dir: str | Path, round_: int, workers: int, config_text: str, *,
                      batched: bool = False) -> None:
    """Rank 0, once every rank's part of ``round_`` is on disk: mark it committed, then delete every other round.
    ``batched``: the batched simulator's one part (rank0.pt) holds all ``workers`` (module docstring)."""
    marker = {"round": round_, "workers": workers, "config": config_text, "batched": batched}
    atomic_write(Path(run_dir) / CHECKPOINT_DIR / COMMITTED, lambda f: f.write(json.dumps(marker).encode()))
    for old in (Path(run_dir) / CHECKPOINT_DIR).glob("round*"):
        if old.is_dir() and old.name != f"round{round_}":
            shutil.rmtree(old, ignore_errors=True)


def committed(run_dir: str | Path) -> dict | None:
    """The commit marker of ``run_dir`` (round, workers, config), or None where no round was ever committed."""
    path = Path(run_dir) / CHECKPOINT_DIR / COMMITTED
    if not path.is_file():
        return None
    try:
        marker = json.loads(path.read_text())
        int(marker["round"]), int(marker["workers"])
    except (OSError, ValueError, KeyError, TypeError):
        raise ConfigError(f"{path} is not a checkpoint commit marker (damaged); {DAMAGED_FIX}") from None
    return marker


def finished(run_dir: str | Path) -> dict | None:
    """The summary of a run that ended in ``run_dir`` (written, readable, not ``interrupted``); None where the run
    can go on from its checkpoint: no summary (a killed run), an interrupted one's, or a damaged one (the checkpoint
    is then what is left).  What ``resume`` refuses (`dane.loop.resume.refuse_finished`) and what an occupied run
    directory's refusal offers (`dane.loop.callbacks.Records`) both read this."""
    try:
        summary = read_summary(run_dir)
    except UserError:
        return None
    return None if summary.get("status") == "interrupted" else summary


def resume_offer(run_dir: str | Path) -> str:
    """The clause an occupied run directory's refusal offers for continuing it with ``resume=auto`` (`finished`):
    where a committed checkpoint can go on, or a run that stopped at its round cap can be extended; else none (a
    damaged commit marker offers none: overwrite=true, which `DAMAGED_FIX` names, replaces it)."""
    try:
        if committed(run_dir) is None:
            return ""
    except ConfigError:
        return ""
    summary = finished(run_dir)
    if summary is None:
        return " continue it from its checkpoint with resume=auto,"
    if summary.get("status") == "max_rounds":
        return f" extend it with resume=auto and rounds above {summary.get('rounds')},"
    return ""


#: what a write into a full, over-quota, too-large or read-only file system fails with, whatever the file
DISK_FULL_OR_READ_ONLY = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)


def keeps_what_was_written(drive):
    """Decorator of the run loop ``drive(loop, ...)`` (`dane.loop.driver`): a write into ``loop.out_dir`` that fails
    (a full or read-only file system; a permission taken away) ends the run with `unwritable`'s one line
    instead of a traceback.  Records and checkpoints are written whole or not at all (line-buffered
    appends, `atomic_write`), so everything written before the failure stays readable and resumable."""
    @functools.wraps(drive)
    def run(loop, *args, **kwargs):
        try:
            return drive(loop, *args, **kwargs)
        except OSError as err:
            out_dir = loop.out_dir
            if not out_dir or isinstance(err, (UserError, ConnectionError)) or not _a_write_into(out_dir, err):
                raise  # a lost peer (ConnectionError), a data file, one of our own lines
            raise unwritable(out_dir, err, loop.spec.control.checkpoint_every) from None

    return run


def _a_write_into(run_dir: str | Path, err: OSError) -> bool:
    if err.errno in DISK_FULL_OR_READ_ONLY:
        return True
    return bool(err.filename) and Path(err.filename).resolve().is_relative_to(Path(run_dir).resolve())


def unwritable(run_dir: str | Path, err: OSError, checkpoint_every: int) -> OutputError:
    """The one line for a run directory that failed a write (``err``): why, what it keeps, read back
    from the disk (whole records, the committed checkpoint), and how to continue from there."""
    run_dir = Path(run_dir)
    name = ""
    if err.filename:
        path = Path(err.filename)
        path = path.relative_to(run_dir) if path.is_relative_to(run_dir) else path
        temporary = TEMPORARY.fullmatch(path.name)  # `atomic_write`'s name for the file it writes
        name = f": {path.with_name(temporary.group(1)) if temporary else path}"
    rounds = whole_records(run_dir / ROUNDS_FILE)
    try:
        marker = committed(run_dir)
    except ConfigError:
        marker = None
    kept = (f"rounds 0-{rounds - 1}" if rounds > 1 else "round 0" if rounds else "no round record") + \
        (f" in {ROUNDS_FILE}" if rounds else "")
    if marker is not None:
        kept += f" and the checkpoint of round {marker['round']}"
        again = f"rerun with resume=auto out_dir={run_dir} to continue from round {marker['round']}"
    else:
        kept += " (no checkpoint" + (" yet)" if checkpoint_every else ": checkpoint_every=0)")
        again = "run again with overwrite=true" + ("" if checkpoint_every else " (with checkpoint_every=K a rerun "
                                                                               "continues instead)")
    return OutputError(f"out_dir={run_dir} cannot be written ({err.strerror or err}{name}); "
                       f"kept: {kept}; free space or make it writable, then {again}")


def whole_records(path: Path) -> int:
    """How many lines of ``path`` are whole round records (a write that failed can leave a torn last one)."""
    try:
        lines = path.read_bytes().decode(errors="replace").splitlines(keepends=True)
    except OSError:
        return 0
    count = 0
    for line in lines:
        try:
            count += line.endswith("\n") and isinstance(json.loads(line), dict)
        except ValueError:
            break
    return count


def parts(marker: dict) -> range:
    """The ranks whose parts a commit ``marker`` holds: rank 0 alone for the batched simulator's, else every rank."""
    return range(1) if marker.get("batched") else range(int(marker["workers"]))


def check_resume(run_dir: str | Path, workers: int, rounds: int, config_text: str = "",
                 batched: bool | None = None) -> int:
    """The committed round of ``run_dir`` if this run (``workers``, ``rounds``, config, path) can continue it.

    Refused, with one line, before anything changes: no committed round, another world
    size, a checkpoint of the other simulator path (``batched``: whether this run takes the batched path; None:
    not known yet, not checked), a missing, empty, truncated or damaged part (`_check_file`), fewer ``rounds``
    than done, or a config that differs in anything but `MAY_CHANGE` (skipped when ``config_text`` is empty).
    """
    marker = committed(run_dir)
    if marker is None:
        raise ConfigError(f"resume={run_dir} has no committed checkpoint ({CHECKPOINT_DIR}/{COMMITTED}); "
                          "was it run with checkpoint_every > 0 and past its first checkpoint?")
    k, size = int(marker["round"]), int(marker["workers"])
    if size != workers:
        raise ConfigError(f"resume={run_dir} was a run with workers={size}, this one has workers={workers}; "
                          "resume with the same workers")
    if batched is not None:
        check_path(run_dir, marker, batched)
    folder = round_dir(run_dir, k)
    names = {p.name for p in folder.glob("rank*.pt")} if folder.is_dir() else set()
    expected = {f"rank{r}.pt" for r in parts(marker)}
    if names != expected:
        missing, extra = sorted(expected - names), sorted(names - expected)
        what = f"lacks {', '.join(missing)}" if missing else f"has parts of other ranks ({', '.join(extra)})"
        whose = " (batched: one part holds every worker)" if marker.get("batched") else ""
        raise ConfigError(f"resume={run_dir}: the committed checkpoint {folder} {what} for workers={size}{whose}; "
                          f"the checkpoint is inconsistent; {DAMAGED_FIX}")
    for r in parts(marker):
        _check_file(checkpoint_path(run_dir, r, k))
    if k > rounds:
        raise ConfigError(f"resume={run_dir} is at round {k} but rounds={rounds}; set rounds >= {k}")
    if (Path(run_dir) / ROUNDS_FILE).is_file():
        kept_rounds(Path(run_dir) / ROUNDS_FILE, k)  # the log holds every round before the checkpoint
    if config_text and marker.get("config"):
        changed = config_differences(marker["config"], config_text)
        if changed:
            raise ConfigError(f"resume={run_dir} was run with another config: {'; '.join(changed)}; resume with "
                              f"its config (only rounds, checkpoint_every, early_stop and display or output "
                              f"settings may change), or use a new out_dir")
    return k


def check_path(run_dir: str | Path, marker: dict, batched: bool) -> None:
    """A checkpoint continues on the simulator path that wrote it (module docstring): one line naming the
    ``sim.batched`` that resumes it otherwise."""
    was = bool(marker.get("batched"))
    if was == batched:
        return
    if was:
        raise ConfigError(f"resume={run_dir} holds a checkpoint of the batched simulator (the {marker['workers']} "
                          "workers' state stacked in one part), and this run keeps one thread or process per worker; "
                          "resume it in the simulator with sim.batched=true")
    raise ConfigError(f"resume={run_dir} holds a checkpoint of one part per worker (threads or launched processes), "
                      "and this run takes the batched simulator; resume it with sim.batched=false")


def _check_file(path: Path) -> None:
    """An empty, truncated or damaged part: torch.save writes a zip archive, whose directory is at its end and
    whose every entry (the pickled state, each tensor's bytes) carries a CRC-32 of its data, read back here once a
    process for each version of the file (`_damage`)."""
    try:
        stat = path.stat()
        empty = stat.st_size == 0
        damage = None if empty else _damage(path, stat.st_size, stat.st_mtime_ns, stat.st_ino)
    except OSError as err:
        raise ConfigError(f"checkpoint file {path} cannot be read ({err.strerror}); {DAMAGED_FIX}") from None
    if empty or damage:
        raise ConfigError(f"checkpoint file {path} is {'empty' if empty else damage}; {DAMAGED_FIX}")


@functools.cache
def _damage(path: Path, size: int, mtime_ns: int, inode: int) -> str | None:
    """What is wrong with the zip archive at ``path``: no zip directory at its end (truncated), a directory that does
    not read, an entry whose data no longer matches its CRC-32; None where every entry reads back whole.

    The verdict is kept for the file's ``size``, ``mtime_ns`` and ``inode`` (its stat): a resume checks when its config
    is resolved and again at launch, and reads each part once; a part rewritten in between is read again."""
    try:
        if not zipfile.is_zipfile(path):
            return "truncated or corrupt"
        with zipfile.ZipFile(path) as archive:
            name = archive.testzip()
            # torch writes no folder: an entry marked one (MS-DOS attribute 0x10, a bit of the directory outside any
            # CRC) is read by torch as empty, its tensor then uninitialized memory
            folder = next((i.filename for i in archive.infolist() if i.external_attr & 0x10 or i.is_dir()), None)
    except Exception as err:  # noqa: BLE001 - a damaged zip directory fails in many ways (BadZipFile, a method, ...)
        if isinstance(err, OSError) and err.errno != errno.EINVAL:  # a file that cannot be read (EINVAL: a seek to
            raise  # where a damaged directory points)
        return f"damaged (its zip directory does not read: {type(err).__name__})"
    if name is not None:
        return f"damaged ({name} fails its CRC-32 check)"
    return None if folder is None else f"damaged ({folder} is marked a folder in its zip directory)"


def config_differences(old_text: str, new_text: str, limit: int = 4,
                       may_change: tuple[str, ...] = MAY_CHANGE) -> list[str]:
    """``key: old -> new`` for every dotted key whose value differs between two YAML configs (outside ``may_change``).
    A key the old config lacks and the new one holds as null is no difference: an option added since the checkpoint
    was written, at its off value (``data.client_column``, say), changes nothing that run did."""
    old, new = _flat(yaml.safe_load(old_text) or {}), _flat(yaml.safe_load(new_text) or {})
    keys = sorted((k for k in old.keys() | new.keys() if old.get(k, "<absent>") != new.get(k, "<absent>")
                   and not (k not in old and new[k] is None)
                   and not any(k == m or k.startswith(m + ".") for m in may_change)),
                  key=lambda k: (not k.endswith(".name"), k.endswith("_target_"), k))  # algorithm.name says most
    shown = [f"{k}: {old.get(k, '<absent>')} -> {new.get(k, '<absent>')}" for k in keys[:limit]]
    return shown + ([f"and {len(keys) - limit} more"] if len(keys) > limit else [])


def _flat(tree, prefix: str = "") -> dict:
    if isinstance(tree, dict) and tree:
        return {k: v for key, value in tree.items() for k, v in _flat(value, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): tree}


def _plain(value):
    """numpy scalars (the simulator's clock, say) as Python numbers, so that ``weights_only`` loading accepts them."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, np.generic):
        return value.item()
    return value


def load_checkpoint(run_dir: str | Path, rank: int, meta: dict) -> dict:
    """``rank``'s part of the committed checkpoint; a `ConfigError` naming the file or the mismatch otherwise."""
    marker = committed(run_dir)
    if marker is None:
        raise ConfigError(f"resume={run_dir} has no committed checkpoint ({CHECKPOINT_DIR}/{COMMITTED})")
    path = checkpoint_path(run_dir, rank, int(marker["round"]))
    try:
        state = torch.load(path, weights_only=True)
    except FileNotFoundError:
        raise ConfigError(f"checkpoint file {path} is missing; was the run made with as many workers "
                          f"({meta['workers']})?") from None
    except Exception as err:  # noqa: BLE001 - torch.load raises many kinds on a damaged file
        raise ConfigError(f"checkpoint file {path} cannot be loaded ({type(err).__name__}: "
                          f"{brief(err, 100)}); {DAMAGED_FIX}") from None
    if not isinstance(state, dict) or state.get("round") != marker["round"] or "meta" not in state:
        raise ConfigError(f"checkpoint file {path} is not round {marker['round']}'s part; "
                          f"the checkpoint is inconsistent; {DAMAGED_FIX}")
    for key, value in meta.items():
        if state["meta"].get(key) != value:
            raise ConfigError(f"resume={run_dir} was a run with {key}={state['meta'].get(key)}, "
                              f"this one has {key}={value}; resume with the same {key}")
    return state


def truncate_rounds(run_dir: str | Path, next_round: int) -> int:
    """Keep only the records of rounds before ``next_round`` in ``rounds.jsonl`` (the checkpoint's past).

    A last line without its newline, or one that is not JSON, is what a crash in the
    middle of a write leaves: it is dropped, as long as the records of rounds 0 ..
    ``next_round - 1`` are all there (`kept_rounds` refuses otherwise).  Returns how many
    whole records were dropped (rounds that the run will do again).
    """
    path = Path(run_dir) / ROUNDS_FILE
    if not path.is_file():
        return 0
    kept, dropped = kept_rounds(path, next_round)
    keep_rounds(path, kept)
    return dropped


def keep_rounds(path: Path, kept: list[str]) -> None:
    """``path`` (a ``rounds.jsonl``) replaced by the lines ``kept`` (`kept_rounds`)."""
    atomic_write(path, lambda f: f.write("".join(kept).encode()))


def kept_rounds(path: Path, next_round: int) -> tuple[list[str], int]:
    """The lines of ``path`` that hold rounds 0 .. ``next_round - 1``, and how many later records there are.

    Refused, in one line naming the line and the fix, where a line before the last is damaged,
    or where those rounds are not all there (a damaged last line, say of the NUL bytes a crash
    of the machine can leave in place of a whole file, or a gap): resuming would drop them
    from the finished log for good.
    """
    lines = path.read_bytes().decode(errors="replace").splitlines(keepends=True)
    kept, dropped, damaged = [], 0, None
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line) if line.endswith("\n") else None
        except ValueError:
            record = None
        if not isinstance(record, dict) or not isinstance(record.get("round"), int):
            damaged = (i + 1, line)
            if i == len(lines) - 1:
                break  # torn by a crash mid-write: dropped if the rounds before the checkpoint are all there
            raise ConfigError(f"{path} line {i + 1} is not a round record ({_describe(line)}); repair or remove "
                              f"the line to resume, or {DAMAGED_FIX}")
        if record["round"] < next_round:
            kept.append(line)
        else:
            dropped += 1
    rounds = [json.loads(line)["round"] for line in kept]
    if rounds != list(range(next_round)):
        missing = sorted(set(range(next_round)) - set(rounds))
        where = (f"line {damaged[0]} is not a round record ({_describe(damaged[1])})" if damaged
                 else f"lacks round{'s' if len(missing) > 1 else ''} {_span(missing)}" if missing
                 else "holds rounds repeated or out of order")
        raise ConfigError(f"{path} {where}, and the checkpoint at round {next_round} needs the records of rounds "
                          f"0-{next_round - 1}; restore the file to resume, or {DAMAGED_FIX}")
    return kept, dropped


def _describe(line: str) -> str:
    text = line.rstrip("\n")
    if text and not text.strip("\x00"):
        return f"{len(text)} NUL bytes"
    return f"{text[:40]!r}" + ("..." if len(text) > 40 else "")


def _span(rounds: list[int]) -> str:
    return str(rounds[0]) if len(rounds) == 1 else f"{rounds[0]}-{rounds[-1]}" + (
        "" if rounds[-1] - rounds[0] + 1 == len(rounds) else f" ({len(rounds)} of them)")
