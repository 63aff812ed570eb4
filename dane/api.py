"""The Python API: problems from arrays and ``fit``, for notebooks and scripts.

    import dane
    problem = dane.problems.LogReg(X, y, lam=1e-3, optimum="auto")  # X: numpy or scipy sparse; auto: O* too
    result = dane.fit(problem, "giant", workers=4, rounds=30, tol=1e-10)
    result.records[-1]["suboptimality"], result.w, result.table["objective"]

``fit`` builds the same objects as the command line: the algorithm from its
``conf/algorithm/<name>.yaml`` with the keyword arguments as overrides (so the same
defaults and the same one-line validation), the problem as a `LinearModelConfig` whose
data source holds the arrays, and it runs through `dane.loop.launch.execute`: m simulated
workers in this process, on the same shards a ``horovodrun -np m`` run would use.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import os
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse
import torch
import yaml
from hydra.errors import InstantiationException
from hydra.utils import get_class, instantiate
from omegaconf import OmegaConf
from omegaconf.errors import UnsupportedValueType

from . import checks
from .algorithm import AlgorithmConfig
from .comm import AlphaBeta
from .errors import ConfigError, DivergenceError, UserError
from .loop.launch import execute
from .loop.spec import Communication, RunControl, RunSpec
from .loop.stopping import ROUNDS_ZERO, StopRule
from .problems.base import ProblemConfig
from .records.trackers import check_loggers

from .layout import CONF_DIR  # noqa: E402 - conf/ beside dane/ in a checkout, inside it in a wheel


def shards(n_rows: int, workers: int, seed: int = 0) -> list[np.ndarray]:
    """The rows each worker holds (sorted indices into X), as every backend deals them for ``seed``.

    For running another implementation side by side on the same shards: worker r of a
    ``workers``-worker run of ridge, logreg or softmax (single file or arrays) holds
    ``X[shards(N, workers, seed)[r]]``.
    """
    from .data.sharding import check_workers, iid_shards

    n_rows, workers, seed = plain("n_rows", n_rows), plain("workers", workers), plain("seed", seed)
    checks.positive_int("n_rows", n_rows)
    checks.positive_int("workers", workers)
    checks.seed("seed", seed)
    check_workers(n_rows, workers)
    return [rows.numpy() for rows in iid_shards(n_rows, workers, seed)]


def algorithm_config(name: str, *, seed: int = 0, **overrides):
    """The algorithm of ``conf/algorithm/<name>.yaml`` with ``overrides``, built and validated."""
    known = sorted(p.stem for p in (CONF_DIR / "algorithm").glob("*.yaml"))
    if name not in known:  # not a path either: '../config' would read conf/config.yaml as an algorithm
        raise ConfigError(f"algorithm {name!r} is unknown; choose one of: {', '.join(known)}")
    node = OmegaConf.load(CONF_DIR / "algorithm" / f"{name}.yaml")
    unknown = sorted(set(overrides) - set(node.keys()))
    if unknown:
        simulator = ", ".join(f"sim_{key}=" for key in unknown if key in SIMULATOR_KEYS)
        hint = f"; the simulator's allreduce cost is fit's {simulator}" if simulator else ""
        keys = [k for k in node.keys() if k not in ('_target_', 'name')]
        takes = f"its keys: {', '.join(keys)}" if keys else "it takes none"
        raise ConfigError(f"algorithm {name} has no key(s) {', '.join(unknown)}; {takes}{hint}")
    root = OmegaConf.create({"seed": seed, "algorithm": node})
    values = {key: plain(f"algorithm.{key}", value) for key, value in overrides.items()}
    for key, value in values.items():
        try:
            OmegaConf.create({key: value})
        except UnsupportedValueType:  # a torch tensor, an object: OmegaConf's traceback of several lines
            raise ConfigError(f"algorithm.{key} must be a number, a string, true or false, got {kind(value)}; pass "
                              "the Python value (tensor.item() for a tensor)") from None
    root.algorithm = OmegaConf.merge(root.algorithm, values)
    return build(root, "algorithm")


#: the allreduce cost model's keys, ``sim.alpha`` and ``sim.beta`` on the command line: ``fit(sim_alpha=...)``,
#: never ``alpha=``, which is an algorithm's key (FedNL's Hessian learning rate)
SIMULATOR_KEYS = ("alpha", "beta")


def plain(key: str, value):
    """``value`` as the config takes it: a NumPy scalar (``np.float64(0.1)``, ``np.int64(5)``, a 0-d array) as the
    Python number it holds; anything else unchanged, for the config's own check.  A NumPy array is refused in one
    line naming ``key``, since OmegaConf would fail on it with a long traceback."""
    if isinstance(value, np.ndarray):
        if value.ndim != 0:
            raise ConfigError(f"{key} must be a number, got an array of shape {value.shape}")
        value = value[()]
    return value.item() if isinstance(value, np.generic) else value


def build(cfg, group_name: str):
    """Instantiate a config group's dataclass; its __post_init__ validates the values.

    A `UserError` raised inside is re-raised as itself (one line), not as Hydra's wrapper; a node without a
    ``_target_`` (a yaml of one's own that names no config class) is one line too.
    """
    check_target(cfg[group_name], group_name)
    check_annotations(cfg[group_name], group_name)
    try:
        built = instantiate(cfg[group_name])
    except InstantiationException as exc:
        cause = exc.__cause__
        while cause is not None and not isinstance(cause, UserError):
            cause = cause.__cause__ or cause.__context__
        if cause is not None:
            raise as_typed(cause, cfg, group_name) from None
        refused = exc.__cause__
        if isinstance(refused, ValueError):  # a config of one's own refusing a value: its message is the line
            text = str(refused)
            owner = f"{group_name}={cfg[group_name].get('name', '?')}: "
            raise ConfigError(text if text.startswith(f"{group_name}.") else owner + text) from None
        unexpected = re.search(r"unexpected keyword argument '(\w+)'", str(exc))
        if unexpected:
            raise as_typed(unknown_key(cfg, group_name, unexpected.group(1), str(exc)), cfg, group_name) from None
        lines = [line for line in str(exc).splitlines() if line and not line.startswith("full_key")]
        raise ConfigError(f"{group_name}: {lines[-1] if lines else exc}") from None
    check_booleans(built, group_name)
    return built


def check_target(node, group_name: str) -> None:
    """The group's ``_target_`` (and any nested one) names a module Python can import, else one line naming the
    module, the group choice, the yaml it came from and the fix.  Checked before Hydra is asked for the class, as
    Hydra's lookup logs three lines of its own and then raises a line without the fix."""
    target = node.get("_target_")
    choice = group_choice(group_name) or node.get("name", "?")
    if not isinstance(target, str):
        raise ConfigError(f"{group_name}={choice} names no _target_: its yaml needs "
                          f"_target_: <module>.<its config class> (docs/extending.md)")
    for key, named, inner in targets(node, group_name):
        module = named.split(".")[0]
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            group = key.split(".")[0]  # another group's where its config is interpolated in (``data: ${data}``)
            chosen = choice if group == group_name else group_choice(group) or inner.get("name", "?")
            yaml = group_yaml(group, chosen)
            raise ConfigError(f"{group}={chosen}{f' ({yaml})' if yaml else ''}: {key}={named} names module "
                              f"{module}, which is not on the Python path; put the folder holding {module} on "
                              f"PYTHONPATH, e.g. PYTHONPATH=. dane train ... from that folder")


def check_annotations(node, group_name: str) -> None:
    """A config dataclass of one's own (not the package's, which check their own values), and a function of one's
    own that a nested ``_target_`` names (a data set's, ``data: ${data}``): each value given for a field or parameter
    annotated float, int, bool or str (``Optional[...]``: null too) is of that kind, else one line naming the key, as
    the package's configs say it (`dane.checks`).  Hydra passes ``lr=abc`` on as text and ``lr=true`` as a bool,
    which a comparison in the config's checks would fail on with a TypeError, or take as 1."""
    for key, target, inner in targets(node, group_name):
        check_values(inner, key.removesuffix("._target_"), own_hints(located(target)))


def own_hints(target) -> dict:
    """The annotations of what a ``_target_`` of one's own names: a dataclass's fields, a function's parameters; {}
    for the package's own and anything else."""
    if target is None or getattr(target, "__module__", "dane").split(".")[0] == "dane":
        return {}
    if dataclasses.is_dataclass(target):
        hints = own_annotations(target)
        return {f.name: hints[f.name] for f in dataclasses.fields(target) if f.name in hints}
    if inspect.isfunction(target):
        try:
            hints = inspect.get_annotations(target, eval_str=True)
        except Exception:  # noqa: BLE001 - an annotation Python cannot resolve: the function's own checks decide
            return {}
        return {name: hint for name, hint in hints.items() if name != "return"}
    return {}


def check_values(node, path: str, hints: dict) -> None:
    raw = OmegaConf.to_container(node, resolve=False)  # a nested config is a dict here, unresolved
    for name, hint in hints.items():
        if name not in raw or isinstance(raw[name], (dict, list)):
            continue
        kind, optional = annotated_kind(hint)
        value = node[name]
        if kind is None or (value is None and optional):
            continue
        key = f"{path}.{name}"
        if kind is str:
            if not isinstance(value, str):
                raise ConfigError(f"{key} must be a string, got {value!r}")
        else:
            {float: checks.number, int: checks.integer, bool: checks.boolean}[kind](key, value)


def own_annotations(config: type) -> dict:
    """The field annotations of a config class of one's own and its bases outside the package, each class's resolved
    on its own: a class whose annotations Python cannot resolve is left to the config's own checks.  The package's
    bases are not read, as their annotations name types only a type checker imports (``typing.get_type_hints`` of a
    `dane.ProblemConfig` subclass raised on them, and no field of one's own problem was checked)."""
    hints = {}
    for cls in reversed(config.__mro__):
        if cls.__module__.split(".")[0] in ("dane", "builtins"):
            continue
        try:
            hints.update(inspect.get_annotations(cls, eval_str=True))
        except Exception:  # noqa: BLE001 - an annotation Python cannot resolve
            continue
    return hints


def annotated_kind(hint) -> tuple[type | None, bool]:
    """(float, int, bool or str, whether None is allowed) of an annotation; (None, _) for any other."""
    optional = False
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        optional = type(None) in args
        rest = [a for a in args if a is not type(None)]
        hint = rest[0] if len(rest) == 1 else None
    return (hint if hint in (float, int, bool, str) else None), optional


def located(target: str):
    """The object ``module.name`` names, None where it cannot be imported (instantiating it then says why); unlike
    Hydra's lookup, without logging."""
    module, _, name = target.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except Exception:  # noqa: BLE001 - an import error of the user's module: Hydra's instantiate reports it
        return None


def targets(node, path: str):
    """(key, value, node) of every string ``_target_`` in ``node`` and the configs it holds, the node's own first.  A
    config interpolated in (``data: ${data}``, a data yaml of one's own) is named by the key the user sets it by
    (``data``), as well as one written in."""
    if not OmegaConf.is_dict(node):
        return
    if isinstance(node.get("_target_"), str):
        yield f"{path}._target_", node._target_, node
    raw = OmegaConf.to_container(node, resolve=False)
    for key in node:
        if key == "_target_":
            continue
        try:
            child = node[key]
        except Exception:  # noqa: BLE001 - an interpolation that does not resolve: `check_interpolations` names it
            continue
        interpolated = re.fullmatch(r"\$\{([\w.]+)\}", raw[key]) if isinstance(raw[key], str) else None
        if OmegaConf.is_dict(child):
            yield from targets(child, interpolated.group(1) if interpolated else f"{path}.{key}")


def group_choice(group_name: str) -> str | None:
    """The yaml Hydra chose for ``group_name`` (``algorithm=heavy_ball``: heavy_ball), None outside a Hydra run."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    return OmegaConf.select(HydraConfig.get(), f"runtime.choices.{group_name}", default=None)


def group_yaml(group_name: str, choice: str) -> str | None:
    """The file Hydra composed ``group_name=choice`` from: the first folder of its search path holding it (as Hydra
    looks it up), None outside a Hydra run or where none is a folder on disk."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    for source in OmegaConf.select(HydraConfig.get(), "runtime.config_sources", default=None) or []:
        path = Path(str(source.path)) / group_name / f"{choice}.yaml"
        if source.schema == "file" and path.is_file():
            return str(path)
    return None


def unknown_key(cfg, group_name: str, key: str, message: str) -> ConfigError:
    """``key`` refused by the dataclass of the node Hydra's ``message`` names (``full_key: problem.model``: a nested
    one), with that dataclass's keys."""
    found = re.search(r"full_key: (\S+)", message)
    path = found.group(1) if found else group_name
    node = OmegaConf.select(cfg, path)
    known = [f.name for f in dataclasses.fields(get_class(node._target_))]
    owner = f"{group_name}={cfg[group_name].get('name', '?')}"
    where = owner if path == group_name else f"{path} of {owner}"
    return ConfigError(f"{path}.{key} is not a key of {where}; its keys: {', '.join(known)}")


def as_typed(error: UserError, cfg, group_name: str) -> UserError:
    """``error`` naming a data key as the user typed it: ``data.X`` for the top-level ``data=`` group that a convex
    problem reads (``problem.data: ${data}``), ``problem.data.X`` for a network's ``data@problem.data=``.  The data
    configs cannot tell which of the two they were given as, so each names its own guess."""
    text = str(error)
    data = cfg.get("data") if group_name == "problem" else None
    node = cfg[group_name]
    if type(error) is not ConfigError or data is None or "data" not in node:
        return error
    top = OmegaConf.is_interpolation(node, "data") or node.data == data
    typed, other = ("data.", "problem.data.") if top else ("problem.data.", "data.")
    if not text.startswith(other) or text.startswith(typed):
        return error
    return ConfigError(typed + text[len(other):])


def check_booleans(config, prefix: str) -> None:
    """Every field declared ``bool`` of a config dataclass (and of the dataclasses it holds) is a bool.

    Hydra passes ``safeguard=off`` or ``safeguard='false'`` on as a string, which Python
    would read as true; this turns that into one line naming the key.
    """
    if not dataclasses.is_dataclass(config):
        return
    for f in dataclasses.fields(config):
        value = getattr(config, f.name, None)
        if f.type in ("bool", bool) and not isinstance(value, bool):
            raise ConfigError(f"{prefix}.{f.name} must be true or false, got {value!r}")
        check_booleans(value, f"{prefix}.{f.name}")


def kind(value) -> str:
    """``value`` as a refusal names it: a string or number as itself, anything else by its type (an array is not
    printed whole)."""
    return repr(value) if isinstance(value, (str, int, float)) else f"a {type(value).__name__}"


def recorded_config(spec: RunSpec) -> dict:
    """What ``fit``'s run directory records of ``spec`` in its ``config.yaml``, under the key paths of a command-line
    run's (conf/config.yaml), so that the figures and tables that read one (`paper_figs.plot_runs`, ``local_work``,
    ``summary``) label and tell apart API runs as they do command-line runs: ``algorithm`` and ``problem`` as their
    config dataclasses' fields (`config_value`: an in-memory problem's arrays by their shape and its data's
    ``fingerprint``, never their entries), ``comm``'s keys the spec holds, the stop rule's ``rounds``, ``tol``,
    ``tol_abs``, ``diverge_after`` and ``early_stop``, the control's top-level keys, and ``sim``'s: ``sim.alpha`` and
    ``sim.beta`` where the cost model's are not the package's (`AlphaBeta`), else null as on the command line.  Only
    what the spec holds: the command line's file is Hydra's whole composed config (``data_dir``, the ``data`` group
    beside ``problem.data``, ``out_dir``); this one leaves out the folder it lies in, so that one config run into two
    folders records the same file."""
    control, stop, comm = spec.control, spec.control.stop, spec.comm
    default = AlphaBeta()
    alpha, beta = comm.cost.alpha, comm.cost.beta
    return {
        "algorithm": config_value(spec.algorithm),
        "problem": config_value(spec.problem),
        "comm": {"backend": comm.backend, "torch_backend": comm.torch_backend, "elastic": comm.elastic,
                 "staleness": comm.staleness, "compress": comm.compress,
                 "error_feedback": comm.error_feedback, "compress_down": comm.compress_down},
        "workers": comm.workers, "rounds": stop.rounds, "tol": stop.tol, "tol_abs": stop.tol_abs,
        "diverge_after": stop.diverge_after, "dtype": config_value(control.dtype), "seed": control.seed,
        "overwrite": control.overwrite, "print_every": control.print_every,
        "quiet": control.quiet, "progress": control.progress, "logger": list(control.logger),
        "mlflow_uri": control.mlflow_uri, "checkpoint_every": control.checkpoint_every, "resume": control.resume,
        "early_stop": {"monitor": stop.monitor, "mode": stop.mode, "patience": stop.patience,
                       "min_delta": stop.min_delta, "target": stop.target},
        "save_iterate": control.save_iterate, "similarity": control.similarity,
        "sim": {"alpha": None if alpha == default.alpha else alpha, "beta": None if beta == default.beta else beta,
                "slowdown": list(comm.stragglers.slowdown), "delay_mean": comm.stragglers.delay_mean,
                "step_time": comm.step_time, "seed": comm.stragglers.seed, "batched": comm.batched,
                "single_worker": comm.simulate_single, "fail_at": [list(fault) for fault in control.faults]},
    }


def config_value(value):
    """``value`` as a run's ``config.yaml`` holds it, in YAML's plain kinds: a config dataclass as ``_target_`` (its
    class, as a command-line run's yaml names it) and its fields, each converted so; a tuple as a list; a NumPy scalar
    as its number; a torch dtype by its name (``float64``); a path as text; an array (anything with a ``shape`` and a
    ``dtype``: NumPy, SciPy sparse, torch) as its ``shape``, ``dtype`` and whether it is sparse, never its entries
    (`dane.problems.ArraySource` records its content as its ``fingerprint``); a class or function by its dotted
    name; anything else by its type's dotted name in angle brackets."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, type) or (callable(value) and hasattr(value, "__qualname__")):
        return dotted_name(value)
    if dataclasses.is_dataclass(value):
        return {"_target_": dotted_name(type(value)),
                **{f.name: config_value(getattr(value, f.name)) for f in dataclasses.fields(value)}}
    if isinstance(value, dict):
        return {str(key): config_value(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [config_value(item) for item in value]
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return {"shape": [int(n) for n in value.shape], "dtype": str(value.dtype).removeprefix("torch."),
                "sparse": bool(scipy.sparse.issparse(value) or getattr(value, "is_sparse", False))}
    return f"<{dotted_name(type(value))}>"


def dotted_name(obj) -> str:
    """``module.qualname`` of a class or function (``dane.baselines.fednl.FedNLConfig``)."""
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"


@dataclass
class Result:
    """What ``fit`` returns: one record per round (the rounds.jsonl schema), the summary and the final iterate."""

    records: list[dict]
    summary: dict
    w: torch.Tensor

    @property
    def table(self) -> dict[str, list]:
        """The records as columns (``result.table["suboptimality"]``); a key missing in a round is None."""
        keys = list(dict.fromkeys(k for r in self.records for k in r))
        return {k: [r.get(k) for r in self.records] for k in keys}

    @property
    def status(self) -> str:
        return self.summary["status"]


def fit(problem, algorithm="dane", *, workers: int = 1, rounds: int = 30, tol: float | None = None,
        tol_abs: float | None = None, seed: int = 0, dtype: torch.dtype = torch.float64, out_dir: str | None = None,
        sim_alpha: float | None = None, sim_beta: float | None = None, quiet: bool = True, logger=("jsonl",),
        compress: str | None = None, error_feedback: bool = False, compress_down: str | None = None,
        overwrite: bool = False, **algorithm_keys) -> Result:
    """Run ``algorithm`` (a name from conf/algorithm/, or a built config) on ``problem`` with m simulated workers.

    ``tol`` and ``tol_abs`` are the stop rule's (`dane.loop.stopping.StopRule`): with a reference
    optimum, stop once O(w) − O* ≤ max(tol·|O*|, tol_abs); without, once the gradient norm
    is at most ``tol`` times its value at round 0.  ``algorithm_keys`` override the
    algorithm's yaml (``fit(p, "dane", mu=0.1)``).  ``seed`` seeds the run and the algorithm (its minibatches,
    client draws, compressors); the data's draws and shards are the problem's ``seed`` (``Ridge(X, y, seed=s)``,
    ``RidgeSyntheticConfig(seed=s)``), which the command line's ``seed=`` sets too: a sweep over seeds for error
    bars sets both.  ``out_dir``
    also writes the usual rounds.jsonl, summary.json and iterate.pt there, and config.yaml, the settings that ran at
    a command-line run's key paths (`recorded_config`), for the figures that label runs by it (a folder that holds a
    run's: refused, unless ``overwrite``, which replaces it), and ``logger``
    (``["tensorboard", "mlflow"]``, `dane.records.trackers`) sends the records to those trackers too.  ``sim_alpha``
    (seconds) and ``sim_beta`` (bytes/s) set the simulator's allreduce cost model, ``sim.alpha`` and ``sim.beta``
    on the command line (default: the package's); ``alpha=`` is an algorithm's key (FedNL's α), refused for an
    algorithm without one.  ``compress``, ``error_feedback`` and ``compress_down`` are ``comm.compress``,
    ``comm.error_feedback`` and ``comm.compress_down`` (`dane.comm.compression`).  NumPy scalars are taken as the numbers they hold (`plain`).
    """
    if not isinstance(problem, ProblemConfig):
        raise ConfigError(f"problem must be a problem object, such as dane.problems.LogReg(X, y, lam=1e-3) or "
                          f"dane.problems.RidgeSyntheticConfig() (dane.problems lists them), got "
                          f"{repr(problem) if isinstance(problem, str) else 'a ' + type(problem).__name__}")
    workers, rounds, seed = plain("workers", workers), plain("rounds", rounds), plain("seed", seed)
    tol, tol_abs = plain("tol", tol), plain("tol_abs", tol_abs)
    sim_alpha, sim_beta = plain("sim_alpha", sim_alpha), plain("sim_beta", sim_beta)
    checks.seed("seed", seed)  # before the algorithm's yaml, whose seed is ${seed} (as `dane.run_config.run_spec`)
    if not isinstance(algorithm, (str, AlgorithmConfig)):
        raise ConfigError(f"algorithm must be a method's name, such as 'dane' (conf/algorithm/ lists them), or its "
                          f"config, such as dane.algorithm_config('dane', mu=0.1), got {kind(algorithm)}")
    if out_dir is not None and (not isinstance(out_dir, (str, os.PathLike)) or out_dir == ""):  # "": no folder
        raise ConfigError(f"out_dir must be a folder's path (a str or a pathlib.Path), or None to write no "
                          f"folder, got {kind(out_dir)}")
    out_dir = None if out_dir is None else os.fspath(out_dir)  # every run kind takes the str
    if isinstance(algorithm, str):
        if "name" in algorithm_keys:  # as algorithm.name= on the command line (`experiments.overrides.LABELS`)
            raise ConfigError(f"name={algorithm_keys['name']!r} would label a run of {algorithm} as another method's; "
                              "the method is fit's second argument")
        algorithm = algorithm_config(algorithm, seed=seed, **algorithm_keys)
    elif algorithm_keys:
        raise ConfigError("keyword overrides apply to an algorithm given by name; set them on the config instead")
    checks.positive_int("workers", workers)
    checks.count("rounds", rounds, ROUNDS_ZERO)
    for key, value in (("tol", tol), ("tol_abs", tol_abs)):  # as the command line checks them
        if value is not None:
            checks.positive(key, value)
    checks.integer_fields(algorithm, "algorithm")  # as the command line checks them (`dane.run_config.run_spec`)
    checks.integer_fields(problem, "problem")      # e.g. Ridge(X, y, seed=-1): a seed numpy would refuse mid-run
    problem.check_workers(workers)
    if out_dir is None and check_loggers(logger) != ("jsonl",):
        raise ConfigError(f"logger={list(check_loggers(logger))} writes into the run directory; give out_dir")
    base = AlphaBeta()
    if sim_alpha is not None:
        checks.nonnegative("sim_alpha", sim_alpha)
    if sim_beta is not None:
        checks.positive("sim_beta", sim_beta)
    cost = AlphaBeta(alpha=base.alpha if sim_alpha is None else sim_alpha,
                     beta=base.beta if sim_beta is None else sim_beta)
    comm = Communication(backend="local", workers=workers, cost=cost, compress=compress, error_feedback=error_feedback,
                         compress_down=compress_down)
    spec = RunSpec(problem=problem, algorithm=algorithm, comm=comm,
                   control=RunControl(stop=StopRule(rounds=rounds, tol=tol, tol_abs=tol_abs), dtype=dtype, seed=seed, quiet=quiet,
                                      save_iterate=out_dir is not None, logger=logger,
                                      overwrite=checks.boolean("overwrite", overwrite)))
    if out_dir is not None:  # the folder's config.yaml (written by `dane.loop.callbacks.Records`, as a command's)
        text = yaml.safe_dump(recorded_config(spec), sort_keys=False, allow_unicode=True)
        spec = dataclasses.replace(spec, control=dataclasses.replace(spec.control, config_text=text))
    collected: dict = {}
    try:
        summary = execute(spec, out_dir, collect=collected)
    except DivergenceError:  # the records say so; a notebook wants them, not a traceback
        summary = collected["summary"]
    return Result(collected.get("records", []), summary, collected.get("w"))
