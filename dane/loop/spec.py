"""`RunSpec`: everything a run needs, checked before any process group starts.

A run is four groups, the way a reader thinks of it (as Lightning separates the
`Trainer`'s arguments from the model's hyperparameters):

- ``problem``: the objective and its data (a `dane.problems.ProblemConfig`, ``conf/problem/``);
- ``algorithm``: the method and its hyperparameters (a `dane.algorithm.AlgorithmConfig`, ``conf/algorithm/``);
- ``comm``: `Communication`, who talks to whom and at what modelled cost: the backend,
  the number of workers, the simulator's cost and straggler models, staleness, elasticity
  (Hydra's ``workers``, ``comm.*`` and ``sim.*`` keys);
- ``control``: `RunControl`, how the run is driven and kept: the stop rule, seed, dtype,
  display, checkpoints, resume, injected faults and what rank 0 writes (the top-level keys).

The experiments' config code (`experiments.config.run_spec`) and the Python API
(`dane.api.fit`) build one; `dane.loop.launch.execute` runs it; `dane.loop.worker` reads it in
every worker.  It lives below both so that neither imports the other.  Each group checks
its own fields in ``__post_init__`` (a message names the Hydra key); the config code
checks first what needs the launcher, the files or the whole config.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .. import checks, compress
from ..algorithm import AlgorithmConfig, known_algorithms
from ..comm import AlphaBeta, Stragglers
from ..comm.horovod import HorovodOptions
from .batching import check_batched
from ..errors import ConfigError, MissingMethod
from ..problems import ProblemConfig
from ..problems.stacked_rows import rows_form, rows_refusal
from .stopping import StopRule
from ..records.trackers import check_loggers
from ..sampling import SamplingKeys

__all__ = ["AlgorithmConfig", "Communication", "ProblemConfig", "RunControl", "RunSpec"]

PROGRESS = ("table", "bar", "auto", "none")
BACKENDS = ("horovod", "torch", "ps", "local")
DTYPES = (torch.float64, torch.float32)
BATCHED = ("auto", "true", "false")  # sim.batched (`dane.comm.batched`, `dane.loop.batching`)


@dataclass(frozen=True)
class Communication:
    """Who talks to whom, and the modelled cost of it.

    ``backend`` is horovod, torch, ps or local; local with ``workers`` > 1 (or
    ``simulate_single``) is the in-process simulator, timed with ``cost`` and
    ``stragglers``.  ``staleness`` > 0 (inf: fully asynchronous) runs workers against a
    parameter server (`dane.loop.asynchronous`), simulated with ``step_time`` seconds per step
    or real under comm=ps, where ``worker_slowdown`` slows real workers on purpose.
    """

    backend: str = "local"
    workers: int = 1
    cost: AlphaBeta = field(default_factory=AlphaBeta)  # or a ParameterServerCost (sim.topology=ps)
    stragglers: Stragglers = field(default_factory=Stragglers)
    simulate_single: bool = False    # also one worker in the simulator (timed as m > 1 is: `comm.threads.Meter`)
    horovod: HorovodOptions = field(default_factory=HorovodOptions)
    torch_backend: str | None = None
    servers: int = 1                 # comm=ps: the last `servers` launched ranks are parameter servers
    elastic: bool = False            # Horovod elastic: lost or added workers change the world size (dane.loop.elastic)
    staleness: float = 0             # comm.staleness: 0 synchronous; > 0 (inf: asynchronous) dane.loop.asynchronous
    step_time: float = 1e-3          # sim.step_time: the asynchronous simulator's modelled seconds per worker step
    worker_slowdown: tuple[float, ...] = (1.0,)  # comm.slowdown: real asynchronous workers slowed on purpose
    compress: str | None = None      # comm.compress: a dane.compress spec for the messages the algorithm declares; None: off
    error_feedback: bool = False     # comm.error_feedback: EF21 on the compressed messages
    compress_down: str | None = None  # comm.compress_down: a dane.compress spec for the server's reply; None: dense
    batched: str = "auto"            # sim.batched: auto | true | false, the m workers as one stacked computation
    cost_file: dict | None = None    # the calibration file ``cost`` was read from (`dane.run_config.calibration_file`)

    def __post_init__(self):
        checks.one_of("comm.backend", self.backend, BACKENDS)
        checks.positive_int("workers", self.workers)
        checks.positive_int("comm.servers", self.servers)
        checks.boolean("sim.single_worker", self.simulate_single)
        checks.boolean("comm.elastic", self.elastic)
        checks.one_of("sim.batched", self.batched, BATCHED)
        if isinstance(self.staleness, bool) or not (isinstance(self.staleness, int) or self.staleness == math.inf) \
                or self.staleness < 0:
            raise ConfigError(f"comm.staleness must be an integer >= 0 or inf (fully asynchronous), "
                              f"got {self.staleness!r}")
        checks.positive("sim.step_time", self.step_time)
        if not self.worker_slowdown or any(checks.positive("comm.slowdown", f) < 1 for f in self.worker_slowdown):
            raise ConfigError(f"comm.slowdown factors must be >= 1 (a worker can be slowed, not sped up), "
                              f"got {list(self.worker_slowdown)}")
        check_compression(self)

    @property
    def simulated(self) -> bool:
        """The in-process simulator: m workers in this process, timed by the cost model (an asynchronous run in one
        process is always the event simulator's, one worker too)."""
        return self.backend == "local" and (self.workers > 1 or self.simulate_single or self.asynchronous)

    @property
    def asynchronous(self) -> bool:
        """Workers push to a parameter server without waiting for each other (``staleness`` > 0)."""
        return self.staleness > 0


@dataclass(frozen=True)
class RunControl:
    """How the run is driven and kept: when it stops, its numerics, what rank 0 shows and writes.

    New settings of this kind (a tracker, a logger) are one more field here with its
    default and its check in ``__post_init__``.
    """

    stop: StopRule = field(default_factory=StopRule)
    seed: int = 0
    dtype: torch.dtype = torch.float64
    print_every: int = 1
    quiet: bool = False
    progress: str = "table"          # rank 0's display: table | bar | auto (bar on a terminal) | none
    checkpoint_every: int = 0        # 0: never; else every K rounds, into <run dir>/checkpoint/
    resume: str | None = None        # a run directory to continue in place from its checkpoint
    restart_unfinished: bool = False  # resume=auto found no committed checkpoint: an unfinished run's records are replaced
    overwrite: bool = False          # replace the records of a finished run in out_dir (else refused)
    out_dir_key: str = "out_dir"     # the setting that refusal asks to change (a sweep's job: hydra.sweep.dir)
    faults: tuple[tuple[int, int], ...] = ()  # (round, worker): that simulated worker is lost there (once per run dir)
    save_iterate: bool = False       # rank 0 writes the final iterate to <out_dir>/iterate.pt
    similarity: bool = False         # measure the Hessian dissimilarity at the first and last iterate (summary)
    config_text: str = ""            # the resolved config, written beside the records and checked on resume
    config_dirs: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (folder of one's own, its yamls composed): provenance
    logger: tuple[str, ...] = ("jsonl",)  # rank 0's trackers: jsonl (always written), tensorboard, mlflow (dane.records.trackers)
    mlflow_uri: str | None = None    # logger=mlflow: a tracking URI; None: a file store in <run dir>/mlruns
    notes: tuple[str, ...] = ()      # what the config says of the run, as the problem's notes are: rank 0 prints them
                                     # before round 0 and the summary's ``notes`` keeps them (a launch's sim.* keys)

    def __post_init__(self):
        object.__setattr__(self, "logger", check_loggers(self.logger))  # a missing extra: one line, pip install ...
        checks.seed("seed", self.seed)
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be torch.float64 or torch.float32, got {self.dtype!r}")
        checks.positive_int("print_every", self.print_every)
        checks.one_of("progress", self.progress, PROGRESS)
        checks.count("checkpoint_every", self.checkpoint_every, "never")
        for key in ("quiet", "restart_unfinished", "overwrite", "save_iterate", "similarity"):
            checks.boolean(key, getattr(self, key))


@dataclass(frozen=True)
class RunSpec:
    problem: ProblemConfig
    algorithm: AlgorithmConfig
    comm: Communication = field(default_factory=Communication)
    control: RunControl = field(default_factory=RunControl)

    def __post_init__(self):
        refuse_unfinished(self.algorithm)
        refuse_compression(self.algorithm, self.comm)
        refuse_rowless(self.algorithm, self.problem)
        if hasattr(self.algorithm, "check_run"):  # an `AlgorithmConfig`'s keys against the problem and the dtype
            self.algorithm.check_run(self.problem, self.control.dtype)
        if isinstance(self.algorithm, SamplingKeys):  # sampling=size where the method averages over S_t
            self.algorithm.check_draw(self.comm.workers)
        check_batched(self)
        for r, w in self.control.faults:  # lost workers must exist
            if r < 0 or not 0 <= w < self.comm.workers:
                raise ConfigError(f"sim.fail_at entry [{r},{w}] needs round >= 0 and 0 <= worker < {self.comm.workers}")


def refuse_unfinished(algorithm) -> None:
    """An `Algorithm` of one's own that lacks an abstract method (its round, ``step``): one line naming it, before any
    worker builds it (a worker thread's traceback otherwise).  A method with a driver of its own (``run_job``: split
    learning) builds no `Algorithm` of its config's."""
    if getattr(algorithm, "run_job", None) is not None:
        return
    cls = getattr(algorithm, "algorithm", None)
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        raise MissingMethod(f"{cls.__name__} (algorithm={algorithm.name}) must define {', '.join(missing)} "
                            f"(docs/extending.md)")


def check_compression(comm: Communication) -> None:
    """``comm.compress`` and ``comm.error_feedback``: a compressor of vectors, on a backend whose collectives the
    communicator's base runs (`dane.comm.compression`)."""
    checks.boolean("comm.error_feedback", comm.error_feedback)
    if comm.compress is None:
        if comm.error_feedback:
            raise ConfigError("comm.error_feedback=true needs a compressor; set comm.compress (e.g. topk:0.1)")
        if comm.compress_down is not None:
            raise ConfigError(f"comm.compress_down={comm.compress_down} needs comm.compress set; write "
                              f"comm.compress=none for an uncompressed (but counted) uplink")
        return
    for key, spec in (("comm.compress", comm.compress), ("comm.compress_down", comm.compress_down)):
        if spec is None:
            continue
        compressor = compress.make(spec, key)
        if compressor.matrices:
            raise ConfigError(f"{key}={spec} compresses d×d matrices, and {key} acts on the "
                              f"vectors an algorithm sends; choose topk, randk, natural or dither")
    if comm.backend == "ps" or comm.elastic or comm.staleness > 0:
        which = "comm=ps" if comm.backend == "ps" else "comm.elastic=true" if comm.elastic else "comm.staleness > 0"
        raise ConfigError(f"comm.compress is not available with {which} yet (that run drives its own messages); "
                          f"set comm.compress=null")


def refuse_rowless(algorithm: AlgorithmConfig, problem: ProblemConfig) -> None:
    """A method that builds its clients' Hessians from their rows (`dane.algorithm.Algorithm.needs_rows`: the FedNL
    line) takes a linear model with one output on rows (`dane.problems.stacked_rows.rows_form`); any other problem is
    refused here, in the line its build would say, before the data is read."""
    if not getattr(getattr(algorithm, "algorithm", None), "needs_rows", False) or rows_form(problem, 1) is None:
        return
    got = "a softmax model (problem.loss=softmax)" if getattr(problem, "loss", None) == "softmax" else \
        f"problem={problem.name}, which has no rows of a linear model"
    raise ConfigError(rows_refusal(algorithm.name, got))


def refuse_compression(algorithm: AlgorithmConfig, comm: Communication) -> None:
    """An algorithm that declares no compressible message (`dane.algorithm.Algorithm.compressible`) takes only
    ``comm.compress=none`` (bit counts, nothing compressed); one that compresses its own messages
    (``compressed_messages``: DIANA, ADIANA, MARINA, EF21) takes none at all: it counts its own bits."""
    if comm.compress is not None and algorithm.algorithm.compressed_messages:
        raise ConfigError(f"algorithm={algorithm.name} compresses its own messages (algorithm.compressor) and counts "
                          f"their bits; comm.compress would compress them twice: set comm.compress=null")
    if (comm.backend == "ps" or comm.elastic) and algorithm.algorithm.compressed_messages:
        which = "comm=ps" if comm.backend == "ps" else "comm.elastic=true"
        raise ConfigError(f"algorithm={algorithm.name} counts its compressed messages in the communicator, which "
                          f"{which} does not run yet; use comm=local, torch or horovod")
    if comm.compress is None or algorithm.algorithm.compressible:
        return
    fixes = [f"comm.{key}=none or null" for key in ("compress", "compress_down")
             if getattr(comm, key) is not None and not isinstance(compress.make(getattr(comm, key)), compress.Identity)]
    fixes += ["comm.error_feedback=false"] * bool(comm.error_feedback)  # the keys that compress, named as given
    if not fixes:
        return
    offered = [name for name, cls in known_algorithms().items() if cls.compressible]
    raise ConfigError(f"algorithm={algorithm.name} declares no message safe to compress (its update needs exact "
                      f"averages); set {' and '.join(fixes)}, or use an algorithm that declares some: "
                      f"{', '.join(offered)}")
