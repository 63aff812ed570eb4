"""The code blocks of README.md and docs/*.md, and the checks that keep them true (tests/test_docs.py, test_readme.py).

A Python block runs.  A block whose first line is ``# <path>.py`` or ``# <path>.yaml`` is a
file the page asks the reader to write: it is written there (under a scratch folder) before
the page's other blocks run.  A shell block launches programs (horovodrun, a cluster) that a
test cannot, so each of its commands is checked instead: ``dane train|simulate`` overrides
are composed as the ``dane`` command composes them (`experiments.overrides`, then Hydra's
own loader), ``dane figures|bench|calibrate`` must name what exists, ``make`` targets must be
the Makefile's, ``scripts/...`` must exist, and any other program must be one of `SHELL_TOOLS`.
"""
from __future__ import annotations

import functools
import re
import shlex
import textwrap
from dataclasses import dataclass
from pathlib import Path

from helpers import REPO

DOCS = REPO / "docs"
FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", re.M | re.S)
FILE_LINE = re.compile(r"# (\S+\.(?:py|yaml))")
#: programs a shell block may run besides dane, make, the launchers and scripts/: they only write a file or set a variable
SHELL_TOOLS = ("export", "eval", "printf", "split", "cd")
LAUNCHERS = ("horovodrun", "torchrun")


@dataclass(frozen=True)
class Block:
    page: str
    lang: str
    code: str

    @property
    def file(self) -> str | None:
        """The path this block is a file of (its first line ``# path.py``), else None."""
        found = FILE_LINE.fullmatch(self.code.splitlines()[0]) if self.code else None
        return found.group(1) if found else None


def blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file, in order, indented ones (inside a list item) dedented."""
    return [Block(path.name, lang, textwrap.dedent(code)) for _, lang, code in FENCE.findall(path.read_text())]


def pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def commands(code: str) -> list[str]:
    """The commands of a shell block: continuation lines joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", code)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            out.extend(part.strip() for part in re.split(r"\s&&\s", line))
    return out


def makefile_targets() -> set[str]:
    return set(re.findall(r"^([a-z][\w-]*):", (REPO / "Makefile").read_text(), re.M))


def words(command: str) -> list[str]:
    """The command's words, a trailing comment dropped, leading VAR=value assignments skipped."""
    argv = shlex.split(command, comments=True)
    while argv and re.fullmatch(r"[A-Z_]+=\S*", argv[0]):
        argv = argv[1:]
    return argv


def program(word: str) -> str:
    return word.rsplit("/", 1)[-1]


def dane_args(argv: list[str]) -> tuple[str, list[str]] | None:
    """(subcommand, its arguments) of the ``dane`` (or ``-m experiments.train|simulate``) call in argv, or None."""
    for i, word in enumerate(argv):
        if program(word) == "dane" and i + 1 < len(argv):
            return argv[i + 1], argv[i + 2:]
        if word == "-m" and i + 1 < len(argv) and argv[i + 1] in ("experiments.train", "experiments.simulate"):
            return argv[i + 1].split(".")[1], argv[i + 2:]
    return None


@functools.lru_cache(maxsize=8)
def config_loader(conf_dir: Path, config_dir: Path | None = None):
    """Hydra's loader over the package's configs and a ``--config-dir`` (kept: it caches what it read)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_search_path import SearchPathQuery

    search_path = create_config_search_path(str(conf_dir))
    if config_dir is not None:  # where Hydra puts it: before the schema source, which must stay last
        search_path.prepend("command-line", f"file://{config_dir}", anchor=SearchPathQuery(provider="schema"))
    return ConfigLoaderImpl(config_search_path=search_path)


def compose(args: list[str], config_name: str, conf_dir: Path) -> None:
    """Compose ``dane train|simulate ARGS`` as the command does; raise where it would stop.

    The command's own check of group choices (`experiments.overrides.check_group_choices`),
    then Hydra's loader, which fails on an unknown key or group, and no required value (``???``)
    left unset: once with every sweep at its first value, then once per further choice of each
    swept group (``algorithm=dane,admm``), whose keys differ; the values of a swept key
    (``workers=1,2,4``) only have to parse.
    """
    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode
    from omegaconf import OmegaConf, open_dict

    from dane.experiments.overrides import check_group_choices

    check_group_choices(args, conf_dir)
    parsed_args, unknown = get_args_parser().parse_known_args(args)
    assert unknown == [], f"dane {config_name}: arguments Hydra does not take: {unknown}"
    dirs = [conf_dir] + ([Path(parsed_args.config_dir).resolve()] if parsed_args.config_dir is not None else [])
    loader = config_loader(*dirs)
    overrides = OverridesParser.create().parse_overrides(parsed_args.overrides)
    swept = {i: [f"{o.get_key_element()}={value}" for value in o.sweep_string_iterator()]
             for i, o in enumerate(overrides) if o.is_sweep_override()}
    first = [swept[i][0] if i in swept else o.input_line for i, o in enumerate(overrides)]
    groups = [i for i in swept if any((d / overrides[i].key_or_group).is_dir() for d in dirs)]
    variants = [first] + [first[:i] + [choice] + first[i + 1:] for i in groups for choice in swept[i][1:]]
    mode = RunMode.MULTIRUN if parsed_args.multirun else RunMode.RUN
    for variant in variants:
        cfg = loader.load_configuration(parsed_args.config_name or config_name, variant, run_mode=mode)
        with open_dict(cfg):
            cfg.pop("hydra", None)
        assert sorted(OmegaConf.missing_keys(cfg)) == [], f"dane {config_name} {' '.join(variant)}: values left unset"


def check_command(command: str, conf_dir: Path) -> None:
    """Raise AssertionError (or the command's own ConfigError) where ``command`` would not start as the page says."""
    argv = words(command)
    assert argv, f"an empty command: {command!r}"
    first = program(argv[0])
    if first == "make":
        missing = sorted(set(argv[1:]) - makefile_targets())
        assert missing == [], f"{command!r}: the Makefile has no target {missing}"
        return
    called = dane_args(argv)
    if called is not None:
        sub, args = called
        if sub in ("train", "simulate"):
            compose(args, "config" if sub == "train" else "simulate", conf_dir)
        elif sub == "figures":
            from dane.experiments.cli import figure_names

            assert not args or args[0].startswith("-") or args[0] in figure_names(), f"{command!r}: no figure {args[0]}"
        elif sub == "bench":
            from dane.experiments.cli import bench_scripts

            assert args and args[0] in bench_scripts(), f"{command!r}: no benchmark {args[:1]}"
        else:
            from dane.experiments.cli import MODULES

            assert sub in MODULES, f"{command!r}: dane has no command {sub}"
        return
    assert first not in LAUNCHERS, f"{command!r}: a launch of something other than dane"
    if argv[0].startswith("scripts/") or first == "bash" and argv[1:2] and argv[1].startswith("scripts/"):
        script = argv[0] if argv[0].startswith("scripts/") else argv[1]
        assert (REPO / script).is_file(), f"{command!r}: {script} does not exist"
        return
    assert first in SHELL_TOOLS, f"{command!r}: {first} is neither dane, make, a launcher, scripts/ nor {SHELL_TOOLS}"


def quoted_measurements(text: str) -> list[str]:
    """Accuracies (.9840, 0.9831, 97.9%), durations (3m12s, 2.5 ms a call) and speed-ups (4.2x faster, a speedup of 3,
    half as fast) typed into a page.  "One 3× slower" is a setting (a straggler), so slower is not read as a speed-up."""
    accuracies = re.findall(r"(?<![\w.])0?\.9\d{2,}\b|\b9\d\.\d%", text)
    durations = re.findall(r"\b\d+m\d+s\b|\b\d+(?:\.\d+)? ?(?:ms|µs|s) (?:a|per) (?:round|call)\b", text)
    speedups = re.findall(r"\b\d+(?:\.\d+)? ?(?:x|×|times) faster\b|\bspeed-?ups? of (?:about |~)?\d"
                          r"|\b(?:half|twice|\d+(?:\.\d+)? ?(?:x|×|times)) as fast\b", text, re.I)
    return accuracies + durations + speedups
