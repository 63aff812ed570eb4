"""The command line checked before Hydra composes it: unknown group choices and unknown keys get one line.

``algorithm=foo`` and ``algorithm.etta=1`` would otherwise stop Hydra with a page of
traceback; here each is refused with one line that names the known choices or the
closest key, for runs and sweeps alike, with the user's own ``--config-dir`` searched too.
"""
from __future__ import annotations

import difflib
import itertools
import os
import re
from pathlib import Path

from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.utils import create_config_search_path, get_args_parser
from hydra.core.config_search_path import SearchPathQuery
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ValueType
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict

from dane.errors import ConfigError
from dane.experiments.config import CONF_DIR


def config_dirs(argv: list[str], conf_dir: Path = CONF_DIR) -> list[Path] | None:
    """Every folder Hydra searches for config groups: the package's, ``--config-dir``/``-cd``, and
    ``hydra.searchpath`` entries (``file://``); None when a ``pkg://`` entry makes the set unknowable here."""
    dirs = [conf_dir, *map(Path, given_config_dirs(argv))]
    for arg in argv:
        if arg.startswith("hydra.searchpath="):
            for entry in arg.partition("=")[2].strip("[]").split(","):
                entry = entry.strip().strip("'\"")
                if entry.startswith("pkg://"):
                    return None
                if entry:
                    dirs.append(Path(entry.removeprefix("file://")))
    return [d.expanduser().resolve() for d in dirs]


def given_config_dirs(argv: list[str]) -> list[str]:
    """The folders ``--config-dir``/``-cd`` name on the command line, as written."""
    given = []
    for i, arg in enumerate(argv):
        if arg in ("--config-dir", "-cd") and i + 1 < len(argv):
            given.append(argv[i + 1])
        elif arg.startswith("--config-dir="):
            given.append(arg.partition("=")[2])
    return given


def check_config_dirs(argv: list[str]) -> None:
    """A ``--config-dir`` that is not a folder, in one line.  Hydra searches it silently, so that a yaml meant to be
    there was refused as unknown with the package's folder alone named as searched."""
    for given in given_config_dirs(argv):
        if not Path(given).expanduser().is_dir():
            raise ConfigError(f"--config-dir {given} is not a folder (from {Path.cwd()}); name the folder that holds "
                              f"your algorithm/, problem/ or data/ yamls (docs/extending.md)")


#: the keys that say what a run is: its group's choice sets them (``algorithm=dane``), an override never does
LABELS = ("algorithm.name", "problem.name")


def check_group_choices(argv: list[str], conf_dir: Path = CONF_DIR) -> None:
    """Reject ``algorithm=foo`` with one line before Hydra prints a page about it, and ``algorithm.name=foo``
    (`LABELS`), which would run DANE recorded as foo.

    A choice is known if any config folder Hydra searches (`config_dirs`) has it, so a
    user's own ``--config-dir my_conf`` with ``problem/mine.yaml`` is accepted (a pkg:// search path is
    left to Hydra).
    """
    check_config_dirs(argv)
    dirs = config_dirs(argv, conf_dir)
    for arg in argv:
        key, sep, value = arg.partition("=")
        key = key.lstrip("+~")
        if sep and key in LABELS:
            group = key.split(".")[0]
            raise ConfigError(f"{key}={value} would label another {group}'s run as {value} (its summary, folder and "
                              f"table rows); choose the {group} with {group}=<name>, or give a variant of your own its "
                              f"name in a yaml of a --config-dir")
        if dirs is None or not sep or "." in key or "/" in key or key.startswith("-"):
            continue
        groups = [d / key for d in dirs if (d / key).is_dir()]
        if not groups:
            continue
        known = sorted({p.stem for group in groups for p in group.glob("*.yaml")})
        if value in ("", "null"):
            raise ConfigError(f"{key}={value} leaves the group {key} without a choice; choose one of: "
                              f"{', '.join(known)} (or leave {key}= out for its default)")
        for choice in value.split(","):
            if choice and choice not in known and choice != "null":
                where = " or ".join(str(g) for g in groups)
                raise ConfigError(f"{key}={choice} is unknown; choose one of: {', '.join(known)} "
                                  f"(or add {key}/{choice}.yaml to a --config-dir; searched {where})")


def check_keys(argv: list[str], config_name: str, conf_dir: Path = CONF_DIR) -> None:
    """Reject an override of a key the config lacks (``algorithm.etta=1``) with one line naming the closest key.

    The config is composed as Hydra will compose it: the same search path (``--config-dir``,
    ``hydra.searchpath``), config name (``--config-name``) and overrides, ``+key=``, ``~key``
    and ``hydra.*`` included, each sweep ``a=1,2`` at its first value; once for a run, and
    for a sweep once more per further choice of a swept group (``algorithm=dane,admm``),
    whose keys differ.  Any other composition problem is Hydra's message on one line (`hydra_said`).
    """
    args, dirs = _hydra_args(argv), config_dirs(argv, conf_dir)
    if args is not None:
        check_grammar(args.overrides)
    variants = None if args is None else _sweep_variants(args.overrides, dirs)
    if variants is None or args.config_path is not None:
        return  # not ours to parse (Hydra explains), or a --config-path relative to a module
    loader, name = _loader(args, conf_dir), args.config_name or config_name
    for overrides, choice in variants:
        try:
            cfg = loader.load_configuration(name, overrides, run_mode=RunMode.RUN)
        except Exception as exc:  # noqa: BLE001 - what else fails here is said in Hydra's words, on one line
            twice = re.match(r"Multiple values for ([\w/@.]+)\.", str(exc))
            if twice:
                typed = next((o.lstrip("+") for o in overrides if o.lstrip("+").startswith(twice.group(1) + "=")),
                             twice.group(1) + "=...")
                raise ConfigError(f"+{typed} adds a group that the config's defaults already have; drop the +: "
                                  f"{typed}") from None
            key = _unknown_key(exc)
            if key is None:
                raise ConfigError(hydra_said(exc) + choice) from None
            owners = _owners(loader, name, overrides, key, dirs or [conf_dir])
            raise ConfigError(f"{key} is not a config key{choice}"
                              f"{owners or _closest(loader, name, overrides, key) + ' (--cfg job prints every key)'}"
                              ) from None
        check_added(loader, name, overrides, choice, dirs or [conf_dir])
        check_required(cfg, choice)
    if is_multirun(argv) and len(variants) > 1:
        check_sweep_base(loader, name, args.overrides)


def check_sweep_base(loader: ConfigLoaderImpl, name: str, overrides: list[str]) -> None:
    """Reject ``-m algorithm=sdane,fedprox algorithm.clients_per_round=5``, a key every swept choice has but the
    group's default lacks: Hydra composes the sweep's base config, each sweep dropped and so the swept group at its
    default (``algorithm=dane``), before any job, and stops there with its page; ``++`` sets the key in every job."""
    try:
        loader.load_configuration(name, overrides, run_mode=RunMode.MULTIRUN)
    except Exception as exc:  # noqa: BLE001 - a key the base lacks is ours to say; anything else Hydra says
        key = _unknown_key(exc)
        typed = next((o for o in overrides if o.partition("=")[0] == key), None)
        if typed is None:
            return
        group = key.split(".")[0]
        rest = [o for o in overrides if o != typed]
        try:
            base = loader.load_configuration(name, rest, run_mode=RunMode.MULTIRUN)
            default = f"{group}={OmegaConf.select(base, f'hydra.runtime.choices.{group}')}"
        except Exception:  # noqa: BLE001 - the base fails on more than this key: Hydra will report it
            return
        swept = next((o for o in overrides if o.partition("=")[0] == group), group)
        raise ConfigError(f"{typed} with -m {swept}: Hydra first composes the sweep's base config, {default}, which "
                          f"has no {key}; write ++{typed} to set it in every job") from None


#: the groups whose dataclasses refuse a key they do not take, naming their keys (`dane.api.build`)
TYPED_GROUPS = ("algorithm", "problem", "data", "model")


def check_added(loader: ConfigLoaderImpl, name: str, overrides: list[str], choice: str, dirs: list[Path]) -> None:
    """Reject ``+roundz=3``: a key that ``+`` (or ``++``) adds and nothing reads, which Hydra allows and the run would
    ignore.  A group choice (``+experiment=x``), ``hydra.*`` and the `TYPED_GROUPS`' keys are left to their owners."""
    added = [o.partition("=")[0].lstrip("+") for o in overrides if o.startswith("+")]
    added = [key for key in added if key.split(".")[0] not in TYPED_GROUPS and not key.startswith("hydra")
             and not any((d / key).is_dir() for d in dirs)]
    if not added:
        return
    rest = [o for o in overrides if o.partition("=")[0].lstrip("+") not in added]
    try:
        known = set(_dotted_keys(loader.load_configuration(name, rest, run_mode=RunMode.RUN)))
    except Exception:  # noqa: BLE001 - another problem: Hydra will report it
        return
    for key in added:
        if key not in known:
            raise ConfigError(f"{key} is not a config key{choice}, and nothing reads a key that + adds"
                              f"{_closest(loader, name, overrides, key)} (--cfg job prints every key)")


def is_multirun(argv: list[str]) -> bool:
    """Whether the command line asks Hydra for a sweep (``-m``, ``--multirun``, ``hydra.mode=MULTIRUN``)."""
    return any(arg in ("-m", "--multirun") or arg.startswith("hydra.mode=MULTIRUN") for arg in argv)


def check_sweep_out_dir(argv: list[str], config_name: str = "config", conf_dir: Path = CONF_DIR) -> None:
    """Reject a ``-m`` sweep of several jobs with one fixed ``out_dir``: every job would write the same run directory
    (each refused as "already holds a run", or with ``overwrite=true`` each replacing the last).  An ``out_dir``
    that is swept itself or names the job (``${hydra:job.num}``) is the user's layout.

    The sweep is the command line's and the composed config's ``hydra.sweeper.params`` (an experiment file's,
    ``dane simulate -m experiment=speedup``), merged as Hydra's basic sweeper merges them: the command line's
    value of a key replaces the file's; so is ``out_dir``, which the config may also set."""
    args = _hydra_args(argv) if is_multirun(argv) else None
    if args is None:
        return
    try:
        parsed = OverridesParser.create().parse_overrides(args.overrides)
    except Exception:  # noqa: BLE001 - a malformed override: `check_grammar` says so
        return
    fixed = [o for o in parsed if o.key_or_group == "out_dir" and not o.is_sweep_override()
             and "${" not in o.input_line and o.input_line.partition("=")[2] not in ("", "null")]
    swept = [o.input_line for o in parsed if o.is_sweep_override() and o.key_or_group not in ("out_dir", "resume")]
    if fixed and swept:
        raise _one_directory(fixed[0].input_line, swept)
    resumed = [o.input_line for o in parsed if o.key_or_group == "resume" and not o.is_sweep_override()
               and "${" not in o.input_line  # names the job: a run of its own per job
               and o.input_line.partition("=")[2] not in ("", "null", "auto", "false", "False")]
    if resumed and swept:  # every job would continue the one run in place, each replacing the last's records
        raise ConfigError(f"{resumed[0]} with -m continues one run in every job of the sweep ({', '.join(swept)}), "
                          "each replacing the last; resume one run without -m, or sweep with resume=auto and "
                          "out_dir='DIR/${hydra:job.num}'")
    if any(o.key_or_group == "out_dir" for o in parsed) and not fixed:
        return  # swept, naming the job, or null (a run directory of its own per job): the user's layout
    given = {o.get_key_element() for o in parsed}  # a key on the command line replaces the file's
    for cfg in _composed(argv, args, config_name, conf_dir):
        try:
            sweeper = OmegaConf.to_container(cfg.hydra.sweeper, resolve=False) if "hydra" in cfg else {}
            params = [o for o in OverridesParser.create().parse_overrides(  # unresolved: ${hydra:job.num} as typed
                [f"{k}={v}" for k, v in ((sweeper or {}).get("params") or {}).items()])
                if o.get_key_element() not in given]
        except Exception:  # noqa: BLE001 - a malformed sweep of the file: Hydra's sweeper says so
            continue
        file_swept = [o.input_line for o in params if o.is_sweep_override() and o.key_or_group != "out_dir"]
        sweep = swept + ([f"hydra.sweeper.params: {', '.join(file_swept)}"] if file_swept else [])
        if not sweep:
            continue
        out_dir = next((o for o in params if o.key_or_group == "out_dir"), None)
        if out_dir is not None:
            line = None if out_dir.is_sweep_override() or "${" in out_dir.input_line else out_dir.input_line
        else:
            line = fixed[0].input_line if fixed else _fixed_out_dir(cfg)
        if line is not None and line.partition("=")[2] not in ("", "null"):
            raise _one_directory(line, sweep)


def _one_directory(out_dir: str, swept: list[str]) -> ConfigError:
    return ConfigError(f"{out_dir} with -m puts every job of the sweep ({', '.join(swept)}) in one "
                       "directory; drop out_dir (each job writes under hydra.sweep.dir) or name the job in it: "
                       "out_dir='DIR/${hydra:job.num}'")


def _fixed_out_dir(cfg: DictConfig) -> str | None:
    """``out_dir=DIR`` where the composed config sets one directory for every job; None where it sets none or
    an interpolation (``${hydra:job.num}``, resolved per job)."""
    if "out_dir" not in cfg or OmegaConf.is_interpolation(cfg, "out_dir") or cfg.out_dir is None:
        return None  # an interpolation, also within a string ('DIR/${hydra:job.num}'): the user's layout
    return f"out_dir={cfg.out_dir}"


def _composed(argv: list[str], args, config_name: str, conf_dir: Path):
    """The config as Hydra will compose it for each variant of `_sweep_variants` (hydra node included); nothing
    where the command line is not ours to compose (`check_keys` has said what fails)."""
    variants = _sweep_variants(args.overrides, config_dirs(argv, conf_dir))
    if variants is None or args.config_path is not None:
        return
    loader, name = _loader(args, conf_dir), args.config_name or config_name
    for overrides, _ in variants:
        try:
            yield loader.load_configuration(name, overrides, run_mode=RunMode.RUN)
        except Exception:  # noqa: BLE001 - `check_keys` reports it, or Hydra does
            continue


def _loader(args, conf_dir: Path) -> ConfigLoaderImpl:
    """Hydra's config loader with the search path Hydra builds from the command line's ``--config-dir``."""
    search_path = create_config_search_path(str(conf_dir))
    if args.config_dir is not None:  # where Hydra puts it: before the schema source, which must stay last
        search_path.prepend("command-line", f"file://{os.path.abspath(args.config_dir)}",
                            anchor=SearchPathQuery(provider="schema"))
    return ConfigLoaderImpl(config_search_path=search_path)


def check_required(cfg: DictConfig, choice: str = "") -> None:
    """Reject a config that leaves a required value (``???``, e.g. ``data.path`` of ``data=csv``) unset, naming it."""
    job = cfg.copy()
    with open_dict(job):
        job.pop("hydra", None)  # its interpolations (${now:...}) resolve only inside a Hydra run
    try:
        missing = sorted(OmegaConf.missing_keys(job))
    except Exception:  # noqa: BLE001 - an interpolation only a Hydra run resolves (out_dir='d/${hydra:job.num}')
        return
    if not missing:
        return
    if all(key.startswith("data.") for key in missing):
        from dane.run_config import check_data_used  # imports torch, which the command line's checks do not need

        check_data_used(cfg)  # data=csv with a problem that reads no data: say that, not which data keys to add
    groups = OmegaConf.select(cfg, "hydra.runtime.choices", default={}) or {}
    chosen = sorted({f"{key.split('.')[0]}={groups[key.split('.')[0]]}" for key in missing
                     if groups.get(key.split(".")[0]) is not None})
    raise ConfigError(f"{' and '.join(missing)} {'has' if len(missing) == 1 else 'have'} no default"
                      f"{' with ' + ', '.join(chosen) if chosen else choice}; add "
                      f"{' '.join(f'{key}=...' for key in missing)}")


def _hydra_args(argv: list[str]):
    """Hydra's reading of the command line, or None where Hydra itself would stop on it."""
    if any(arg in ("--version", "--shell-completion", "-sc") for arg in argv):
        return None
    try:
        args, unknown = get_args_parser().parse_known_args(argv)
    except SystemExit:  # argparse's own message: Hydra prints it
        return None
    return None if unknown else args


def _sweep_variants(overrides: list[str], dirs: list[Path] | None) -> list[tuple[list[str], str]] | None:
    """Override lists to compose, each with the group choice it tries (``" with algorithm=admm"``, or "").

    The first has every sweep at its first value; then one per further choice of each
    swept group, the rest as in the first.  None where a sweep cannot be listed here
    (an interval or glob sweep: its values come from the sweeper) or the overrides do not parse.
    """
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:  # noqa: BLE001 - Hydra reports a malformed override itself
        return None
    first, more, swept = [], [], []
    for i, override in enumerate(parsed):
        if not override.is_sweep_override():
            first.append(override.input_line)
            continue
        if not override.is_discrete_sweep() or override.value_type == ValueType.GLOB_CHOICE_SWEEP:
            return None
        try:
            values = list(override.sweep_string_iterator())
        except ValueError as exc:  # range(0,1,0)
            raise ConfigError(f"{override.input_line}: {exc}; give the sweep a non-zero step") from None
        element = override.get_key_element()
        first.append(f"{element}={values[0] if values else ''}")
        if dirs and any((d / override.key_or_group).is_dir() for d in dirs):
            swept.append(first[-1].lstrip("+~"))
            more += [(i, element, value) for value in values[1:]]
    return [(first, f" with {', '.join(swept)}" if swept else "")] + [
        (first[:i] + [f"{element}={value}"] + first[i + 1:], f" with {element.lstrip('+~')}={value}")
        for i, element, value in more]


def check_grammar(overrides: list[str]) -> None:
    """An override Hydra's grammar cannot read (``data.path=part-{rank}.csv``, ``algorithm.mu=[1``, a bare ``rounds``)
    gets one line naming it, with the quoting that passes such a value through."""
    parser = OverridesParser.create()
    for override in overrides:
        try:
            parser.parse_overrides([override])
        except Exception as exc:  # noqa: BLE001 - Hydra's grammar error, whatever its class
            key, sep, value = override.partition("=")
            said = " ".join(line.strip() for line in str(exc).splitlines()
                            if line.strip() and not line.startswith(("See https", "Error parsing")))
            fix = (f"quote a value with special characters: \"{key}='{value}'\"" if sep else
                   f"an override is key=value ({override}=...)")
            raise ConfigError(f"{override} cannot be read as an override ({said}); {fix}") from None


def hydra_said(exc: Exception) -> str:
    """Hydra's message on one line: its sentences up to the first listing (``Config search path:``), and the choices
    where the listing is ``Available options in 'group':``."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    said = []
    for i, line in enumerate(lines):
        if line.endswith(":"):
            if line.startswith("Available options"):
                options = [o for o in itertools.takewhile(lambda o: not o.endswith(":"), lines[i + 1:])]
                said[-1] += f"; choose one of: {', '.join(options)}"
            break
        said.append(line)
    return " ".join(said) or type(exc).__name__


def _unknown_key(exc: Exception) -> str | None:
    """The key of Hydra's "Could not override 'k'" or "Could not delete ... 'k' does not exist"."""
    found = re.match(r"Could not override '([^']+)'|Could not delete from config\. '([^']+)' does not exist", str(exc))
    return None if found is None else found.group(1) or found.group(2)


def _owners(loader: ConfigLoaderImpl, name: str, overrides: list[str], key: str, dirs: list[Path]) -> str:
    """``; it is a key of problem=ridge, not of problem=logreg: ...`` where other choices of the key's group have
    the key (``problem.standardize_target`` with ``problem=logreg``); "" where none has it.  Only the choices
    whose files name the key's last part are composed (the error path composes each)."""
    group, leaf = key.split(".")[0], key.rpartition(".")[2]
    rest = [o for o in overrides if o.lstrip("~+").partition("=")[0] != key]
    files = sorted(p for d in dirs for p in (d / group).glob("*.yaml")) if "." in key else []
    candidates = sorted({p.stem for p in files if f"{leaf}:" in p.read_text(errors="replace")})
    if not candidates:
        return ""
    try:
        current = OmegaConf.select(loader.load_configuration(name, rest, run_mode=RunMode.RUN),
                                   f"hydra.runtime.choices.{group}")
    except Exception:  # noqa: BLE001 - another problem: Hydra will report it
        return ""
    owners = []
    for choice in candidates:
        others = [o for o in rest if o.lstrip("~+").partition("=")[0] != group]
        try:
            other = loader.load_configuration(name, [*others, f"{group}={choice}"], run_mode=RunMode.RUN)
        except Exception:  # noqa: BLE001 - that choice does not compose with the rest: not a suggestion
            continue
        if choice != current and key in _dotted_keys(other):
            owners.append(f"{group}={choice}")
    if not owners:
        return ""
    if len(owners) == 1:
        return f"; it is a key of {owners[0]}, not of {group}={current}: drop it, or choose {owners[0]}"
    shown = ", ".join(owners[:5]) + (", ..." if len(owners) > 5 else "")
    return f"; it is a key of {shown}, not of {group}={current}: drop it, or choose one of those"


def _closest(loader: ConfigLoaderImpl, name: str, overrides: list[str], key: str) -> str:
    """``; did you mean k?``: the nearest key of the config composed without ``key`` (the error path composes twice)."""
    rest = [o for o in overrides if o.lstrip("~+").partition("=")[0] != key]
    try:
        cfg = loader.load_configuration(name, rest, run_mode=RunMode.RUN)
    except Exception:  # noqa: BLE001 - another problem: no suggestion, Hydra will report it
        return ""
    known = [k for k in _dotted_keys(cfg) if key.startswith("hydra") or not k.startswith("hydra")]
    parent = key.rpartition(".")[0]
    siblings = [k for k in known if k.rpartition(".")[0] == parent]
    match = difflib.get_close_matches(key, siblings, n=1) or difflib.get_close_matches(key, known, n=1)
    return f"; did you mean {match[0]}?" if match else ""


def _dotted_keys(node: DictConfig, prefix: str = "") -> list[str]:
    """Every key of ``node`` and of the nodes under it, dotted (``algorithm.eta``); interpolations are not followed."""
    keys = []
    for k in node:
        keys.append(f"{prefix}{k}")
        if not (OmegaConf.is_interpolation(node, k) or OmegaConf.is_missing(node, k)) and isinstance(node[k], DictConfig):
            keys += _dotted_keys(node[k], f"{prefix}{k}.")
    return keys
