"""Errors that the entry points turn into one line on stderr and a non-zero exit.

Raise these for anything a user can fix (a config value, a missing file, a worker
count); let genuine bugs raise ordinary exceptions with a traceback.
"""


class UserError(Exception):
    """A problem with what the user asked for.  The message names the problem and the fix."""


class ConfigError(UserError, ValueError):
    """An invalid configuration value: ``algorithm.mu must be >= 0, got -1``."""


class NotPositiveDefinite(ConfigError):
    """A shard's local Hessian plus its shift has no Cholesky factor (a singular local model): the problem names its
    own remedy, and the run's loop appends the method's (`dane.algorithm.Algorithm.singular_remedy`), which the
    problem cannot know."""


class SharedRefusal(ConfigError):
    """A refusal rank 0 found and sent to every rank of a launched job before any of them started (an occupied run
    directory, which only rank 0 reads): every rank stops, rank 0 says it."""


class MissingMethod(UserError, NotImplementedError):
    """A class of one's own (a problem, an algorithm's config) lacks a method a run calls: the message names it and
    where it is described (docs/extending.md)."""


class DataError(UserError, FileNotFoundError):
    """Missing or malformed data files; the message lists the files expected."""


class OutputError(UserError, OSError):
    """The run directory failed a write mid-run (a full or read-only file system); what was written
    before stays, and the message says what that is and how to continue."""


class DivergenceError(UserError, ArithmeticError):
    """A run whose objective became non-finite; results written so far are kept."""


class WorkerLost(UserError, RuntimeError):
    """A launched worker lost a peer mid-run (it crashed, was killed or its machine went away); the
    message says where the records are and how to continue.  Not raised under Horovod elastic,
    which handles a lost worker itself."""


def plural(count, noun: str, spec: str = "") -> str:
    """``count`` (formatted by ``spec``) and ``noun``, ``noun + "s"`` unless ``count`` is 1, for a message whose count
    can be 1: "1 round", "2 rounds" (not "1 rounds")."""
    return f"{count:{spec}} {noun if count == 1 else noun + 's'}"


def brief(err: BaseException, limit: int = 120) -> str:
    """``err``'s text on one line (its whitespace collapsed) for a message that quotes it: whole where it has at most
    ``limit`` characters, else its words that fit, cut at the end of a word (not mid-word), and " ...".  A last word
    that is a path (it holds a "/": an OSError's file, a URI) is kept after the " ... ": the words before it cut to
    leave it room, down to half the limit, then the path cut from its front, so that its file's name survives."""
    text = " ".join(str(err).split())
    if len(text) <= limit:
        return text
    rest, _, last = text.rpartition(" ")
    if "/" not in last:
        return f"{_words(text, limit)} ..."
    head = _words(rest, max(limit - len(last) - 1, limit // 2))
    tail = last[-(limit - len(head) - 1):]
    return f"{head} ... {tail}" if head else f"... {tail}"


def _words(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters: whole, or cut at the end of a word (mid-word only where its first word is
    longer)."""
    if len(text) <= limit:
        return text
    return text[:limit + 1].rsplit(" ", 1)[0] if " " in text[:limit + 1] else text[:limit]


def say(line: str) -> None:
    """One line on stderr in a single write: with ``PYTHONUNBUFFERED=1`` a ``print`` writes the text and its
    newline apart, and two processes' lines on one pipe (the survivors of a lost peer) can merge."""
    import sys

    sys.stderr.write(f"{line}\n")
    sys.stderr.flush()
