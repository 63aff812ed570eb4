"""A run's Hydra config -> validated `RunSpec`, before any process group starts.

The entry points (``experiments/``, through `experiments.config`, which re-exports these names)
and ``synthetic/``'s sweeps and round timing both build their runs here: ``experiments/``
imports ``synthetic/``'s launch commands, so ``synthetic/`` must not import ``experiments/``
(`tests/test_import_graph.py` checks the edges between folders as well as between modules).
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import replace
from pathlib import Path

import torch
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationKeyError, InterpolationResolutionError

from . import checks
from .algorithm import Algorithm, algorithm_built_by, known_algorithms
from .api import build, check_target
from .loop.batching import batched_path
from .comm import AlphaBeta, ParameterServerCost, Stragglers, detect_launcher, resolve_backend
from .loop.elastic import check_elastic
from .loop.resume import resume_dir
from .errors import ConfigError
from .comm.horovod import HorovodOptions
from .comm.tail import TailedCost, load_tail
from .loop.spec import PROGRESS, Communication, RunControl, RunSpec
from .numerics.local_solvers import AUTO_MAX_DIM
from .problems import RidgeSyntheticConfig
from .problems.stacked import FACTORS_KEPT
from .loop.stopping import ROUNDS_ZERO, StopRule

from .layout import CONF_DIR  # noqa: E402 - conf/ beside dane/ in a checkout, inside it in a wheel
DTYPES = {"float64": torch.float64, "float32": torch.float32}
TORCH_BACKENDS = ("gloo",)


def workers_for(backend: str, workers, servers: int = 1) -> int:
    launched, size = detect_launcher()
    if backend == "ps":
        return ps_workers(launched, size, workers, servers)
    if backend in ("horovod", "torch"):
        if launched == "local":
            size = 1
        if workers is not None and workers != size:
            raise ConfigError(
                f"workers={workers} but the launcher started {size} process(es); "
                f"drop workers= under horovodrun/torchrun or launch {workers} processes"
            )
        return size
    if launched != "local":
        raise ConfigError(f"comm=local inside a {launched} launch; drop comm=local (dane simulate sets it: launch "
                          f"dane train) or run with plain python")
    return 1 if workers is None else checks.positive_int("workers", workers)


def algorithm_class(node: DictConfig) -> type[Algorithm]:
    """The `Algorithm` class the ``algorithm`` group's config (its ``_target_``) builds
    (`dane.algorithm.algorithm_built_by`), so that its capabilities are asked before anything is built; one line
    where it names no `dane.algorithm.AlgorithmConfig`."""
    target = node.get("_target_")
    if isinstance(target, str):
        check_target(node, "algorithm")
    built = algorithm_built_by(target) if isinstance(target, str) else None
    if built is None:
        raise ConfigError(f"algorithm._target_={target} is not a dane.algorithm.AlgorithmConfig; subclass it and set "
                          "its algorithm = <your Algorithm class>")
    return built


def staleness(cfg: DictConfig, backend: str) -> float:
    """``comm.staleness``: 0 (synchronous), a bound s > 0 (SSP) or inf (asynchronous), which only the algorithms
    whose class says ``asynchronous`` take (sync_sgd, local_sgd), in the simulator or under torchrun with comm=ps
    and one server (`dane.loop.asynchronous`)."""
    value = cfg.comm.get("staleness", 0)
    if isinstance(value, bool) or not (isinstance(value, int) or value == math.inf) or value < 0:
        raise ConfigError(f"comm.staleness must be an integer >= 0 or inf (fully asynchronous), got {value!r}")
    if value == 0:
        return 0
    shown = "inf" if value == math.inf else value
    algorithm, kind = cfg.algorithm.get("name"), algorithm_class(cfg.algorithm)
    if not kind.asynchronous:
        why = kind.synchronous_because or f"{algorithm} has no asynchronous form"
        able = [name for name, known in known_algorithms().items() if known.asynchronous]
        raise ConfigError(f"comm.staleness={shown} with algorithm={algorithm}: {why}; set comm.staleness=0 "
                          f"(only {' and '.join(able)} run asynchronously)")
    if cfg.algorithm.get("aggregate") == "best":  # local SGD's best election
        raise ConfigError(f"comm.staleness={shown} with algorithm.aggregate=best: the election needs all m models of "
                          "one round; use algorithm.aggregate=mean or weighted")
    if backend not in ("local", "ps"):
        raise ConfigError(f"comm.staleness={shown} runs through a parameter server, not under comm={backend}: under "
                          "torchrun with comm=ps, or in the simulator (plain python, workers=<m> sim.topology=ps)")
    if backend == "ps" and cfg.comm.get("servers", 1) != 1:
        raise ConfigError(f"comm.staleness={shown} under comm=ps runs with one server for now, got "
                          f"comm.servers={cfg.comm.get('servers')}; set comm.servers=1")
    if backend == "local" and cfg.sim.get("topology") != "ps":
        raise ConfigError(f"comm.staleness={shown} simulates workers pushing to a parameter server; add sim.topology=ps")
    resumes = cfg.get("checkpoint_every", 0) or cfg.get("resume") not in (None, False)
    if backend == "local" and (resumes or cfg.sim.get("fail_at")):
        raise ConfigError(f"comm.staleness={shown}: the asynchronous simulator does not checkpoint, resume or lose "
                          "workers yet; drop checkpoint_every, resume and sim.fail_at")
    if resumes:  # comm=ps; sim.fail_at, a simulated worker's loss, is refused under a launcher by `fail_at`
        raise ConfigError(f"comm.staleness={shown}: an asynchronous run under comm=ps does not checkpoint or resume "
                          "yet; drop checkpoint_every and resume")
    return value


def worker_slowdown(cfg: DictConfig, stale: float) -> tuple[float, ...]:
    """``comm.slowdown`` (comm=ps): real worker i sleeps so each asynchronous step (compute, push, reply) takes
    slowdown[i] (recycled over the workers) times as long, a deliberate straggler; the simulator's counterpart
    is ``sim.slowdown`` (which scales the modelled step)."""
    value = cfg.comm.get("slowdown")
    if value is None:  # a comm group without the key (comm=torch, which split learning runs as comm=ps)
        return (1.0,)
    if not OmegaConf.is_list(value) or len(value) == 0:
        raise ConfigError(f"comm.slowdown must be a list of per-worker factors like [1,3], got {value!r}")
    factors = tuple(float(checks.positive("comm.slowdown", f)) for f in value)
    if any(f < 1 for f in factors):
        raise ConfigError(f"comm.slowdown factors must be >= 1 (a worker can be slowed, not sped up), got {list(value)}")
    if any(f != 1 for f in factors) and not stale:
        raise ConfigError("comm.slowdown slows the workers of a real asynchronous run (comm.staleness > 0); "
                          "for a synchronous run simulate stragglers with workers=<m> sim.slowdown=[...]")
    return factors


def ps_servers(comm: DictConfig) -> int:
    """comm=ps: the number of server ranks."""
    servers = comm.get("servers", 1)
    if isinstance(servers, bool) or not isinstance(servers, int) or servers < 1:
        raise ConfigError(f"comm.servers must be an integer >= 1 (the parameter-server ranks), got {servers!r}")
    if comm.get("torch_backend") not in (None, "gloo"):
        raise ConfigError(f"comm=ps runs on gloo point-to-point messages, got comm.torch_backend={comm.torch_backend}; "
                          "drop comm.torch_backend")
    return servers


def ps_workers(launched: str, size: int, workers, servers: int) -> int:
    """comm=ps under torchrun: the processes that are not servers are the workers."""
    if launched != "torch":
        where = "without a launcher; use workers=<m> for the in-process simulator" if launched == "local" else \
            f"under {launched}"
        raise ConfigError(f"comm=ps needs torchrun (its servers are processes of their own: torchrun --nproc_per_node "
                          f"<workers + comm.servers> -m experiments.train comm=ps ...), not {where}")
    if servers >= size:
        raise ConfigError(f"comm.servers={servers} but torchrun started {size} process(es); at least one must be a "
                          f"worker: launch {servers + 1} or more, or lower comm.servers")
    if workers is not None and workers != size - servers:
        raise ConfigError(f"workers={workers} but torchrun started {size} process(es), {servers} of them server(s) "
                          f"(comm.servers={servers}): {size - servers} worker(s); drop workers= or launch "
                          f"{workers + servers} processes")
    return size - servers


TOPOLOGIES = ("allreduce", "ps")


def cost_model(sim: DictConfig, seed: int = 0) -> AlphaBeta | ParameterServerCost | TailedCost:
    """The simulator's cost of one allreduce: a ring (``sim.topology=allreduce``) or ``sim.servers`` parameter
    servers (``ps``), from its calibration file when that exists, each of ``sim.alpha/beta/gamma`` overriding it.
    A ring's calibration file with a ``tail`` (``dane calibrate --tail``) makes it a `TailedCost`, its draws
    seeded with the run's ``seed`` and ``sim.seed``."""
    ps = checks.one_of("sim.topology", sim.get("topology", "allreduce"), TOPOLOGIES) == "ps"
    model = ParameterServerCost if ps else AlphaBeta
    key, path = calibration_path(sim)
    base = model()
    if path is not None:
        try:
            base = model.load(path)
        except ConfigError as exc:
            raise ConfigError(f"sim.{key}: {exc}, or set sim.{key}=null for the defaults") from None
    alpha = checks.nonnegative("sim.alpha", base.alpha if sim.alpha is None else sim.alpha)
    beta = checks.positive("sim.beta", base.beta if sim.beta is None else sim.beta)
    if not ps:
        ring = AlphaBeta(alpha=alpha, beta=beta)
        if path is None:
            return ring
        try:
            seeds = (checks.seed("seed", seed), checks.seed("sim.seed", sim.get("seed", 0)))
            tailed = load_tail(path, ring, seeds)
        except ConfigError as exc:
            raise ConfigError(f"sim.{key}: {exc}") from None
        return ring if tailed is None else tailed
    gamma = checks.positive("sim.gamma", base.gamma if sim.get("gamma") is None else sim.gamma)
    return ParameterServerCost(alpha=alpha, beta=beta, gamma=gamma,
                               servers=checks.positive_int("sim.servers", sim.get("servers", 1)))


#: conf/config.yaml's calibration files, which a run reads where they exist (else the package's defaults), and the
#: commands that make them
DEFAULT_CALIBRATION = {"calibration": ("results/calibration.json", "dane calibrate"),
                       "ps_calibration": ("results/calibration_ps.json", "dane calibrate --topology ps")}


def calibration_path(sim: DictConfig) -> tuple[str, Path | None]:
    """The key of the calibration file the topology reads (``sim.calibration``, or ``sim.ps_calibration`` under
    ``sim.topology=ps``) and the file, None where it names none or it is the config's default
    (`DEFAULT_CALIBRATION`) and does not exist (the package's defaults).  Any other file that does not exist is a
    one-line `ConfigError` naming it."""
    key = "ps_calibration" if sim.get("topology", "allreduce") == "ps" else "calibration"
    if not sim.get(key):
        return key, None
    path, (default, make) = Path(sim[key]), DEFAULT_CALIBRATION[key]
    if path.exists():
        return key, path
    if str(sim[key]) == default:
        return key, None
    raise ConfigError(f"sim.{key}={sim[key]}: no such file; make it with `{make} --out {sim[key]}`, or set "
                      f"sim.{key}=null for the package's defaults")


def calibration_file(sim: DictConfig) -> dict | None:
    """The calibration file `cost_model` reads (`calibration_path`) as a simulated run's summary names it
    (``calibration_file``): its path, sha256, and the machine and time it was measured on, as far as it records
    them (a ``machine`` it has must be an object with a ``host``); None where no file is read (the defaults)."""
    key, path = calibration_path(sim)
    if path is None:
        return None
    raw = path.read_bytes()
    data = json.loads(raw)  # `cost_model` has read it already: a file that is not JSON was refused there
    machine = data.get("machine", {"host": None})  # a file without one (written by hand) names no host
    if "machine" in data and not (isinstance(machine, dict) and isinstance(machine.get("host"), str)):
        raise ConfigError(f"sim.{key}: {path} is not a calibration file (its machine is {machine!r}, not an object "
                          f"with a host); re-run `{DEFAULT_CALIBRATION[key][1]}` to remake it, or set sim.{key}=null "
                          "for the defaults")
    return {"path": str(path), "sha256": hashlib.sha256(raw).hexdigest(),
            "host": machine.get("host"), "measured_at": data.get("measured_at")}


def split_backend(cfg: DictConfig, backend: str) -> tuple[str, str | None]:
    """Split learning's backend and a note where it was chosen for the user: a launched split run needs a
    server rank of its own, which only ``comm=ps`` has, so under torchrun ``comm=torch`` (or ``auto``) becomes
    ``comm=ps`` with one server; any other launched backend is refused here, before a process group starts
    (and by rank 0 alone).  Every other algorithm keeps ``backend``."""
    from .split.config import SplitConfig

    target = cfg.algorithm.get("_target_")
    if isinstance(target, str):
        check_target(cfg.algorithm, "algorithm")  # a module not on the path: its line, not Hydra's logged lines
    try:
        config = get_class(target) if isinstance(target, str) else None
    except Exception:  # noqa: BLE001 - not a class: algorithm_class says so when it is asked
        return backend, None
    if not (isinstance(config, type) and issubclass(config, SplitConfig)) or backend == "local":
        return backend, None
    servers = cfg.comm.get("servers", 1) if backend == "ps" else 1
    if backend == "torch" and detect_launcher()[0] == "torch":
        return "ps", ("comm=ps, chosen for algorithm=split under torchrun: the last rank is the split server, the "
                      "others are agents")
    if backend != "ps" or servers != 1:
        raise ConfigError(f"algorithm=split runs in the simulator (workers=<m>, plain python) or under torchrun with "
                          f"comm=ps and one server (torchrun --nproc_per_node <m+1> ... comm=ps), not comm={backend}"
                          + (f" with comm.servers={servers}" if backend == "ps" else ""))
    return backend, None


def run_spec(cfg: DictConfig, out_dir_key: str = "out_dir") -> RunSpec:
    """The run ``cfg`` composes, every value checked before a process group starts (a bad one: one line naming it
    and the fix, `dane.errors.ConfigError`); ``out_dir_key``: the setting a refusal of an occupied out_dir names
    (`dane.loop.spec.RunControl.out_dir_key`)."""
    check_interpolations(cfg)
    backend, backend_note = split_backend(cfg, resolve_backend(cfg.comm.backend))
    stale = staleness(cfg, backend)
    servers = ps_servers(cfg.comm) if backend == "ps" else 1
    workers = workers_for(backend, cfg.workers, servers)
    check_data_used(cfg)
    seed = checks.seed("seed", cfg.seed)  # before the groups, whose seeds are ${seed}
    algorithm = build(cfg, "algorithm")
    if backend_note is not None:
        algorithm = replace(algorithm, notes=(*algorithm.notes, backend_note))
    checks.integer_fields(algorithm, "algorithm")
    problem = build(cfg, "problem")
    checks.integer_fields(problem, "problem")
    problem.check_workers(workers)
    checks.one_of("dtype", cfg.dtype, tuple(DTYPES))
    tol = None if cfg.tol is None else checks.positive("tol", cfg.tol)
    spec = RunSpec(problem=problem, algorithm=algorithm,
                   comm=communication(cfg, backend, workers, servers, stale, problem, algorithm, seed),
                   control=run_control(cfg, backend, workers, seed, tol, out_dir_key))
    check_memory(problem, workers, simulated=backend == "local",
                 batched=backend == "local" and isinstance(problem, RidgeSyntheticConfig) and batched_path(spec)[0],
                 dtype=DTYPES[cfg.dtype])
    return spec


def check_interpolations(cfg: DictConfig) -> None:
    """Every ``${...}`` of ``cfg`` resolves (the run resolves the whole config for its config.yaml), else one line naming
    the key, what failed and the fix: an unset ``${oc.env:NAME}``, a ``${key}`` the config has not, a resolver it
    does not know were OmegaConf's traceback from wherever the value was first read."""
    try:
        OmegaConf.to_container(cfg, resolve=True)
    except InterpolationResolutionError as exc:
        key = exc.full_key or "?"
        message = (exc.msg or str(exc)).splitlines()[0]
        raised = re.fullmatch(r"\w+ raised while resolving interpolation: (.*)", message)
        message = raised.group(1).strip('"') if raised else message  # KeyError's text is quoted
        written = raw_value(cfg, key)
        where = f" (in {written})" if isinstance(written, str) else ""
        variable = re.search(r"Environment variable '([^']+)' not found", message)
        if variable:
            fix = f"set {variable.group(1)} in the environment, or give {key} its value"
        elif isinstance(exc, InterpolationKeyError):
            fix = "a ${key} names a key of the config (--cfg job prints every key)"
        else:
            fix = f"correct the ${{...}} in {key}, or give {key} its value"
        raise ConfigError(f"{key}: {message}{where}; {fix}") from None


def raw_value(cfg: DictConfig, key: str):
    """The value at the dotted ``key`` as written, its interpolations unresolved; None where there is none."""
    node = OmegaConf.to_container(cfg, resolve=False)
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def communication(cfg: DictConfig, backend: str, workers: int, servers: int, stale: float, problem,
                  algorithm, seed: int) -> Communication:
    """`run_spec`'s ``comm``: how the workers talk, in the simulator or launched, from ``cfg.comm`` and ``cfg.sim``."""
    return Communication(
        backend=backend,
        workers=workers,
        cost=cost_model(cfg.sim, seed),
        cost_file=calibration_file(cfg.sim),
        stragglers=stragglers(cfg.sim),
        simulate_single=checks.boolean("sim.single_worker", cfg.sim.get("single_worker", False)),
        horovod=HorovodOptions(cycle_time_ms=cycle_time(cfg.comm, problem),
                               pin_cores=checks.boolean("comm.pin_cores", cfg.comm.get("pin_cores", True))),
        torch_backend=torch_backend(cfg.comm.torch_backend),
        servers=servers,
        elastic=check_elastic(checks.boolean("comm.elastic", cfg.comm.get("elastic", False)), backend, algorithm),
        staleness=stale,
        step_time=checks.positive("sim.step_time", cfg.sim.get("step_time", 1e-3)),
        worker_slowdown=worker_slowdown(cfg, stale) if backend == "ps" else (1.0,),
        compress=None if cfg.comm.get("compress") is None else str(cfg.comm.compress),
        error_feedback=cfg.comm.get("error_feedback", False),
        compress_down=None if cfg.comm.get("compress_down") is None else str(cfg.comm.compress_down),
        batched=batched_mode(cfg.sim.get("batched", "auto")),
    )


def run_control(cfg: DictConfig, backend: str, workers: int, seed: int, tol: float | None,
                out_dir_key: str = "out_dir") -> RunControl:
    """`run_spec`'s ``control``: when the run stops, what it logs and keeps, and how it resumes."""
    return RunControl(
        stop=stop_rule(cfg, tol),
        seed=seed,
        dtype=DTYPES[cfg.dtype],
        print_every=checks.positive_int("print_every", cfg.print_every),
        quiet=checks.boolean("quiet", cfg.quiet),
        progress=checks.one_of("progress", cfg.get("progress", "table"), PROGRESS),
        checkpoint_every=checkpoint_every(cfg),
        resume=resume_dir(cfg, workers),
        restart_unfinished=cfg.get("resume") == "auto",
        overwrite=checks.boolean("overwrite", cfg.get("overwrite", False)),
        out_dir_key=out_dir_key,
        faults=fail_at(cfg.sim, workers, simulated=backend == "local"),
        save_iterate=checks.boolean("save_iterate", cfg.get("save_iterate", False)),
        similarity=checks.boolean("similarity", cfg.get("similarity", False)),
        config_text=OmegaConf.to_yaml(cfg, resolve=True),
        config_dirs=own_config_dirs(),
        logger=tuple(cfg.logger) if OmegaConf.is_list(cfg.get("logger")) else cfg.get("logger", "jsonl"),
        mlflow_uri=cfg.get("mlflow_uri"),
        notes=ignored_sim_notes(cfg, backend, workers),
    )


def own_config_dirs() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(folder, the yamls of it the config was composed from) of each folder of one's own on Hydra's search path
    (``--config-dir``, ``hydra.searchpath``: every folder but the package's `CONF_DIR`), for the run's provenance.
    A yaml is the primary config or a group's chosen option (``hydra.runtime.choices``, ``data@problem.data`` as
    ``data/``) that the folder holds and no folder before it does: Hydra composes the first it finds.  () outside a
    Hydra run."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return ()
    hydra = HydraConfig.get()
    folders = [Path(str(source.path)) for source in hydra.runtime.config_sources if source.schema == "file"]
    wanted = [f"{hydra.job.config_name}.yaml"] + [
        f"{group.split('@')[0]}/{option}.yaml" for group, option in hydra.runtime.choices.items()
        if isinstance(option, str) and not group.startswith("hydra/")]
    composed = {folder: [] for folder in folders}
    for name in wanted:
        first = next((folder for folder in folders if (folder / name).is_file()), None)
        if first is not None:
            composed[first].append(name)
    return tuple((str(folder), tuple(names)) for folder, names in composed.items()
                 if folder.resolve() != CONF_DIR.resolve())


#: the config whose ``sim:`` block holds the simulator's defaults (`simulator_keys_set`)
CONFIG_FILE = CONF_DIR / "config.yaml"


def simulator_keys_set(sim: DictConfig) -> list[str]:
    """The ``sim.*`` keys whose value in ``sim`` (a composed config's) differs from `CONFIG_FILE`'s ``sim:``, in
    ``sim``'s order: what the command line, an experiment file or a config of one's own set, whichever set it; a
    key set to its default value is none of them."""
    default = OmegaConf.to_container(OmegaConf.load(CONFIG_FILE).sim, resolve=True)
    given = OmegaConf.to_container(sim, resolve=True)
    return [f"sim.{key}" for key, value in given.items() if key not in default or value != default[key]]


def ignored_sim_notes(cfg: DictConfig, backend: str, workers: int) -> tuple[str, ...]:
    """`RunControl.notes` of a run on ``backend`` with ``workers``: one note naming the simulator's keys its config
    set (`simulator_keys_set`) where nothing reads them: launched (horovod, torch or ps: horovodrun, torchrun, Slurm),
    or one process (``workers=1`` without ``sim.single_worker``, timed by the wall clock); none in the simulator,
    nor where no such key is set.  A note, not a refusal: one sweep config may serve simulated and launched runs,
    and every m, alike."""
    alone = backend == "local" and workers == 1 and not checks.boolean("sim.single_worker",
                                                                       cfg.sim.get("single_worker", False))
    keys = simulator_keys_set(cfg.sim) if backend != "local" or alone else []
    if not keys:
        return ()
    verb, them = ("is", "it") if len(keys) == 1 else ("are", "them")
    if alone:
        return (f"{', '.join(keys)} {verb} the simulator's; a one-process run (workers=1) ignores {them}: "
                "sim.single_worker=true runs it in the simulator",)
    return (f"{', '.join(keys)} {verb} the simulator's (dane simulate); a launched run ignores {them}",)


def cycle_time(comm: DictConfig, problem) -> float:
    """``comm.horovod_cycle_time_ms``: a number of milliseconds, or ``auto`` (the default): by the problem
    (`dane.comm.horovod.HorovodOptions.cycle_time_for`)."""
    value = comm.get("horovod_cycle_time_ms", "auto")
    if value == "auto":
        return HorovodOptions.cycle_time_for(problem)
    if isinstance(value, str):
        raise ConfigError(f"comm.horovod_cycle_time_ms must be a number of milliseconds > 0 or auto, got {value!r}")
    return checks.positive("comm.horovod_cycle_time_ms", value)


def batched_mode(value) -> str:
    """``sim.batched`` as auto, true or false (YAML reads true and false as booleans)."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def stragglers(sim: DictConfig) -> Stragglers:
    if not OmegaConf.is_list(sim.slowdown) or len(sim.slowdown) == 0:
        raise ConfigError(f"sim.slowdown must be a list of per-worker compute factors like [1,1,3] "
                          f"(recycled over the workers), got {sim.slowdown!r}")
    return Stragglers(slowdown=tuple(checks.positive("sim.slowdown", s) for s in sim.slowdown),
                      delay_mean=checks.nonnegative("sim.delay_mean", sim.delay_mean),
                      seed=checks.seed("sim.seed", sim.seed))


def torch_backend(value) -> str | None:
    if value == "nccl":
        raise ConfigError("comm.torch_backend=nccl cannot reduce the vectors DANE communicates: they live in host "
                          "memory, also for a network on CUDA; drop comm.torch_backend (gloo)")
    if value is not None and value not in TORCH_BACKENDS:
        raise ConfigError(f"comm.torch_backend must be {' or '.join(TORCH_BACKENDS)}, or null (gloo), got {value!r}")
    return value


def check_memory(problem, workers: int, simulated: bool, batched: bool = False,
                 dtype: torch.dtype = torch.float64) -> None:
    """Refuse, with the numbers, a synthetic ridge problem whose arrays cannot fit in this machine's memory.

    Counted: the rows this process holds (all N in the simulator, N/m under a launcher) in the run's
    ``dtype`` and, where that is not float64, the float64 rows of the shard being built (drawn in float64,
    then converted, a shard at a time: `dane.problems.ridge.RidgeSyntheticConfig.build`); at 8 bytes a value
    whatever the run's dtype, each of its workers' d x d Hessian and one factor when the local solve is
    Cholesky on the d x d path (a shard with n_i < d rows has none: Woodbury's), and the
    reference optimum's transient (the whole N x d data set, or the d x d Gram matrix),
    whichever peak is larger.  The batched simulator (``batched``, `dane.problems.stacked.StackedRidge`)
    holds the rows twice in float64 (the data and its stacked copy), plus that copy in ``dtype`` where it is
    not float64, and, on the d x d path, the m Hessians with
    up to `FACTORS_KEPT` factors each, or on Woodbury's the m row Gram matrices and their eigenvectors.
    """
    if not isinstance(problem, RidgeSyntheticConfig):
        return
    n, d = problem.n_samples, problem.dim
    here = workers if simulated else 1
    rows = n if simulated else -(-n // workers)
    converted = dtype != torch.float64  # the rows are drawn in float64: a float32 run holds both while converting
    if batched:  # the data set and its stacked copy, in float64, and that copy in the run's dtype
        data = 8 * 2 * n * d + (dtype.itemsize * n * d if converted else 0)
    else:  # every shard of this process in the run's dtype, and the largest one's float64 rows it was drawn in
        data = dtype.itemsize * rows * d + (8 * -(-n // workers) * d if converted else 0)
    cholesky = problem.solver.resolve(d, sparse=False).method == "cholesky" and not problem.low_rank(workers)
    factors = 1 + FACTORS_KEPT if batched else 2
    hessians = 8 * factors * d * d * here if cholesky else 8 * 2 * n * (n // workers) if batched else 0
    optimum = 0 if problem.optimum == "none" else 8 * n * d if d > AUTO_MAX_DIM else 8 * 2 * d * d
    name = str(dtype).removeprefix("torch.")
    if batched:
        held = f" (held twice in float64: stacked for sim.batched, then in {name})" if converted else \
            " (held twice: stacked for sim.batched)"
    else:
        held = f" (in {name}, with a shard's float64 rows while it is converted)" if converted else ""
    parts = f"the {rows} x {d} data {checks.gigabytes(data)}{held}"
    if cholesky:
        kept = f"up to {FACTORS_KEPT} factors" if batched else "a factor"
        parts += f", {here} local {d} x {d} Hessian(s) with {kept} each {checks.gigabytes(hessians)}"
    elif hessians:
        parts += f", {here} row Gram matrices with their eigenvectors {checks.gigabytes(hessians)}"
    if optimum > data + hessians:
        parts = f"the reference optimum's {f'{n} x {d} data' if d > AUTO_MAX_DIM else f'{d} x {d} Gram matrix'} " \
                f"{checks.gigabytes(optimum)}"
    fix = ("use problem.local_solver=cg (no d x d matrix), " if cholesky and not batched else "") + \
        ("use sim.batched=false (one thread a worker, one copy of the rows), " if batched else "") + \
        "lower problem.dim or problem.n_samples" + (", or fewer workers" if cholesky and here > 1 else "")
    checks.fits_in_memory(f"problem.dim={d} with problem.n_samples={n}" + (f" and {here} workers" if here > 1 else ""),
                          max(data + hessians, optimum), parts, fix)


#: record keys that fall as a run improves: watched under early_stop.mode=max they stop it at once, or never
FALLING = ("loss", "objective", "suboptimality", "grad_norm")


def stop_rule(cfg: DictConfig, tol: float | None) -> StopRule:
    early = cfg.get("early_stop") or {}
    patience, target = early.get("patience"), early.get("target")
    monitor, mode = str(early.get("monitor", "test_accuracy")), early.get("mode", "max")
    target = None if target is None else float(checks.nonnegative("early_stop.target", target))
    if (patience is not None or target is not None) and mode == "max" and monitor.endswith(FALLING):
        raise ConfigError(f"early_stop.monitor={monitor} falls as the run improves, but early_stop.mode=max "
                          f"(higher is better); add early_stop.mode=min")
    if target is not None and monitor.endswith("accuracy") and target > 1:
        raise ConfigError(f"early_stop.target={target} for {monitor}: an accuracy lies in [0, 1]; "
                          f"e.g. early_stop.target=0.97")
    return StopRule(
        rounds=checks.count("rounds", cfg.rounds, ROUNDS_ZERO),
        tol=tol,
        tol_abs=None if cfg.get("tol_abs") is None else checks.positive("tol_abs", cfg.tol_abs),
        diverge_after=None if cfg.get("diverge_after", 5) is None else
        checks.positive_int("diverge_after", cfg.get("diverge_after", 5)),
        patience=None if patience is None else checks.positive_int("early_stop.patience", patience),
        monitor=monitor,
        min_delta=checks.nonnegative("early_stop.min_delta", early.get("min_delta", 0.0)),
        target=target,
        mode=checks.one_of("early_stop.mode", mode, ("max", "min")),
    )


def checkpoint_every(cfg: DictConfig) -> int:
    return checks.count("checkpoint_every", cfg.get("checkpoint_every", 0), "never")


def fail_at(sim: DictConfig, workers: int, simulated: bool) -> tuple[tuple[int, int], ...]:
    """``sim.fail_at=[[round, worker], ...]``: simulated workers to lose on purpose (`dane.loop.faults.SimulatedFault`)."""
    faults = sim.get("fail_at")
    if faults is None:
        return ()
    if not OmegaConf.is_list(faults) or not all(
            OmegaConf.is_list(f) and len(f) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in f)
            for f in faults):
        raise ConfigError(f"sim.fail_at must be a list of [round, worker] pairs of integers like [[3,1]], got {faults!r}")
    if faults and not (simulated and workers > 1):
        raise ConfigError("sim.fail_at loses a simulated worker; it needs workers > 1 under plain python "
                          "(under a launcher, kill a process instead)")
    for r, w in faults:
        if r < 0 or not 0 <= w < workers:
            raise ConfigError(f"sim.fail_at entry [{r},{w}] needs round >= 0 and 0 <= worker < {workers}")
    return tuple((int(r), int(w)) for r, w in faults)


def check_data_used(cfg: DictConfig) -> None:
    """``data=...`` feeds the convex problems (their ``data: ${data}``, or its copy in a resolved config: the figures'
    sweeps, `synthetic.sweep.composed_job`); elsewhere it would be silently ignored."""
    data = cfg.get("data")
    fed = "data" in cfg.problem and (OmegaConf.is_interpolation(cfg.problem, "data") or cfg.problem.data == data)
    if data is not None and not fed:
        raise ConfigError(f"data= is not used by problem={cfg.problem.get('name')}; add problem=ridge|logreg|softmax "
                          "(the convex problems, which read data=csv|libsvm|npz|<built-in>), or for a network "
                          "problem data@problem.data=<set>")
