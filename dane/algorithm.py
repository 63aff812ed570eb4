"""The worker-side interface every distributed method implements, DANE and the baselines alike.

An `Algorithm` holds one worker's state and runs one round per `step`.  The same object
runs under horovodrun, torchrun, or as one thread of the in-process simulator; only the
`Communicator` differs.  Every round evaluates the iterate it starts from inside its
first grouped allreduce (the local metrics ride along with the gradient or iterate), so
logging costs no extra communication round.  Those metrics are the run's measurement (kind
`dane.comm.compression.METRICS`): the bit counts leave them out, unless the method's round reads the objective
among them (`metrics_message`).

What a method supports (elastic resets, asynchronous updates, client sampling,
compressed messages, a batched simulation) and the metrics it adds to the records are declared on its class,
with the defaults below; the drivers ask the class (through its config's ``algorithm``
before anything is built) and never keep lists of names.  A new method is one file with
an `Algorithm` and its `AlgorithmConfig`, and one yaml whose ``_target_`` names the
config, in the package or beside it (``--config-dir``).
"""
from __future__ import annotations

import functools

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import torch

from .comm import Communicator
from .comm.compression import METRICS
from .errors import ConfigError, MissingMethod
from .problems import Problem

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .problems import ProblemConfig


def evaluation(problem: Problem, w: torch.Tensor) -> list[torch.Tensor]:
    """A worker's message in `Algorithm.evaluate`: [∇O_i(w), its local metrics of w]."""
    return list(problem.evaluate(w))


def metrics_message(local_metrics: torch.Tensor, *, reads_objective: bool,
                    beside: torch.Tensor | None = None) -> tuple[list[torch.Tensor], tuple[str | None, ...]]:
    """(the tensors, their kinds) that carry a round's local metrics in its allreduce.  A round that only logs them
    sends them whole as the run's measurement (`METRICS`: left out of the bit counts).  A round that reads the
    objective, the first metric (a safeguard's test, a line search's start), sends [O_i(w), then ``beside``] as its
    own message (kind None, counted) and the other metrics as `METRICS`, where there are any (no empty tensor goes
    to a backend); `metrics_received` puts them together again.  A mean is taken entry by entry, so the split
    changes no value."""
    if not reads_objective:
        return [local_metrics], (METRICS,)
    objective, measured = local_metrics[..., :1], local_metrics[..., 1:]
    read = objective if beside is None else torch.cat([objective, beside], -1)  # over the last axis: also stacked
    return ([read, measured], (None, METRICS)) if measured.shape[-1] else ([read], (None,))


def metrics_received(means: Sequence[torch.Tensor], *, reads_objective: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(the global metrics, the mean of ``beside``) from the means of `metrics_message`'s tensors, in its order."""
    if not reads_objective:
        return means[0], means[0][:0]
    read, *measured = means
    return torch.cat([read[:1], *measured]), read[1:]


class Column(NamedTuple):
    """A record key rank 0's per-round table shows (`dane.loop.progress.RoundTable`), and how."""

    key: str
    #: a format spec such as ``"{:>8.3g}"``; its width sets the column's
    fmt: str
    #: show the column from the first round whenever this other key is there, though its own values come later
    #: (ADMM's residuals of round t ride in round t+1's allreduce)
    shown_with: str | None = None


class Finished(NamedTuple):
    """How a method ends its run itself (`Rounds.finished`): the run's ``status`` and ``why``, and where the method
    knows what to change, its ``remedy`` ("set <key> ...": DANE's safeguard giving up on trials that are not finite,
    `dane.dane.DANE.remedy`).  ``stopped_by`` reads "<why>: <remedy>"; the summary's ``remedy`` holds it alone, and
    the divergence line names it in place of the config's guesses (`dane.loop.launch.execute`)."""

    status: str
    why: str
    remedy: str | None = None


class Rounds:
    """What `dane.loop.runner.run` drives: an `Algorithm`, or a split-learning or asynchronous run behind the
    same interface (``iterate``, ``step``, ``state_dict``), which declares no final answer and no diagnosis."""

    #: None until the method's answer is final before the round cap (one-shot averaging) or the method ends the run
    #: itself (DANE's safeguard giving up), then (status, why) or a `Finished` with its remedy: the run ends on the
    #: record that describes that answer (`dane.loop.runner.run`)
    finished: tuple[str, str] | Finished | None = None
    #: whether the method raises its own damping when its objective rises (a default proximal weight:
    #: `baselines.adaptive.WeightDoubling`); the divergence watch then waits for the objective to stay above round 0
    #: and rise (`dane.loop.stopping.DivergenceWatch`), as under client sampling
    damps_itself: bool = False
    #: the package's default rules this run's nulls were resolved by, each {"key", "value", "rule", "stats"}
    #: (`baselines.defaults.Resolution`), for the first lines and the summary (`dane.loop.callbacks.Policy`); () for a
    #: method given every number (a method of one's own, unless it resolves some); None: resolved in round 0 (below)
    defaults: tuple[dict, ...] | None = ()
    #: while ``defaults`` is None, the keys whose null a rule resolves in round 0 (its statistics ride in that round's
    #: allreduce: GD's lr, AIDE's τ, synchronous SGD's steps), key -> rule: shown before round 0, and in the summary
    #: as ``defaults_unresolved`` where no round ran (rounds=0)
    pending_defaults: dict[str, str] = {}

    def described_iterate(self, start: torch.Tensor | None) -> torch.Tensor:
        """The iterate the last `step`'s or final evaluation's record describes (what `dane.loop.runner.run` returns).

        ``start``: the iterate that round started from (None after the final evaluation: the current one).
        By default that one; a method that can reject a round's start reports the point it kept instead
        (DANE's safeguard: the last accepted iterate, `dane.dane.DANE.described_iterate`)."""
        return self.iterate if start is None else start

    def spent(self) -> dict[str, int]:
        """The method's own cumulative counters (record keys: a federated method's participants' bytes, FedNL's
        exact bits) as they stand now, before the round that moves on from the current iterate.  The round loop
        reads them before each round and writes them into that round's record, so that a record's counters, like
        the communicator's and the local work's, hold what reaching its iterate cost (`dane.loop.runner.run`);
        none by default."""
        return {}

    def read_work(self, t: int, work: dict[str, float]) -> list[dict]:
        """Events read from record ``t``'s local work over the workers (``work``: `dane.work`'s keys, cumulative to
        w_t, on the rank that writes the records; the round loop puts them first in the record's ``adapted``):
        bookkeeping that rides with the local work's table, which no counter of the run's traffic counts.  None by
        default."""
        return []

    def diagnosis(self, records: list[dict]) -> str | None:
        """At the round cap, what this method's own state says about why it is slow, naming the override
        to try (appended to ``stopped_by``); None: nothing to add.  ``records``: the run's, last one last."""
        return None


class Algorithm(Rounds, ABC):
    """One worker's state and round.  The class declares what the method supports; every default is "no"."""

    name: ClassVar[str]
    #: the method's display name, the paper's spelling ("": the name): a run records it in its summary.json
    #: (``label``, `recorded_label`), where ``dane figures local_work`` and ``fednl_bits`` take it (`label_of_run`),
    #: and the package's other figures and benchmark reports name the package's algorithms by it (`label_of`)
    label: ClassVar[str] = ""
    #: what the method's own keys can do where a shard's local Hessian is singular (`dane.errors.NotPositiveDefinite`),
    #: appended to the problem's remedy: " or algorithm.mu > 0" where μ shifts that Hessian (DANE, FedProx, DiSCO),
    #: " or a larger algorithm.lam" where the shift must be positive already (S-DANE, FedRed); "": the problem's only
    singular_remedy: ClassVar[str] = ""

    # -------------------------------------------------------------- capabilities, asked of the class
    #: the committed state carries over a change of world size: Horovod elastic (``comm.elastic=true``,
    #: `dane.loop.elastic`) restores rank 0's state on every worker through `load_elastic_state`
    elastic: ClassVar[bool] = False
    #: an asynchronous or stale-synchronous form (``comm.staleness > 0``, `dane.loop.asynchronous`): the worker's half
    #: is `worker_update`, the server's is its config's `AlgorithmConfig.async_server`
    asynchronous: ClassVar[bool] = False
    #: why the method needs every worker at the same iterate: the refusal of ``comm.staleness > 0`` says it
    #: ("": "<name> has no asynchronous form")
    synchronous_because: ClassVar[str] = ""
    #: compresses its own messages with its own compressor and has the communicator count them at their compressed
    #: size (`dane.comm.compression`, ``precompressed``: DIANA, MARINA, EF21); ``comm.compress`` is then refused,
    #: as it would compress them twice (`dane.loop.spec.refuse_compression`)
    compressed_messages: ClassVar[bool] = False
    #: the kinds of message (``allreduce_mean(..., kinds=...)``) that ``comm.compress`` may compress: those
    #: whose compressed form the method tolerates (a gradient that is averaged into a step, say); empty: the
    #: method refuses ``comm.compress`` other than none (`dane.comm.compression`)
    compressible: ClassVar[tuple[str, ...]] = ()
    #: its ``step`` runs unchanged on stacked tensors (`dane.comm.batched`: per-worker values carry a leading
    #: axis of the m workers, shared ones do not), so the simulator may run its m workers as one stacked
    #: computation on a problem that has a stacked form (``sim.batched``, `ProblemConfig.build_stacked`)
    batchable: ClassVar[bool] = False
    #: what its ``step`` asks of a stacked problem: "solves" (local solves and Hessian products: the problem's own
    #: stacked form, `ProblemConfig.build_stacked`), "oracles" (values, gradients and Hessians at a shared point,
    #: no local solve: a linear model with one output then stacks on its rows, sparse or dense, in shards of any
    #: sizes, `dane.problems.stacked_rows.StackedRows`) or "gradients" (gradients at each worker's own point, of all
    #: m workers or of a round's participants, ``participants``: the problem's own stacked form where it has one,
    #: else its rows stacked)
    stacked_needs: ClassVar[str] = "solves"
    #: builds its clients' Hessians or coefficients from their rows: it takes a linear model with one output on rows
    #: (problem=logreg or ridge) and `dane.loop.spec.refuse_rowless` refuses any other problem before its data is read
    needs_rows: bool = False
    #: the keys of this method's records that rank 0's table shows after the common ones, in order; its records may
    #: carry more (DANE's ``accepted``, GD's ``lr``), which the table leaves out
    columns: ClassVar[tuple[Column, ...]] = ()
    #: the last record's counts that summary.json repeats, where the record has them: traffic by direction
    #: (``comm.compress``'s bits per worker, `dane.comm.compression`; a method adds its own)
    summary_keys: ClassVar[tuple[str, ...]] = ("uplink_bits", "downlink_bits")

    # -------------------------------------------------------------- optional state the drivers read
    #: (``finished``, `diagnosis`: `Rounds`)
    #: worker steps per logged round of an asynchronous run (`worker_update` calls)
    updates_per_round: int = 1

    def __init__(self, problem: Problem, comm: Communicator, w0: torch.Tensor | None = None):
        self.problem = problem
        self.comm = comm
        self.w = problem.initial_point() if w0 is None else w0.clone()

    @abstractmethod
    def step(self) -> dict[str, float]:
        """One round: returns the global metrics of the iterate the round started from, then moves on."""

    def evaluate(self) -> dict[str, float]:
        """Global metrics of the current iterate, in one grouped allreduce."""
        # the record's measurement alone, the gradient sent for its logged norm (`METRICS`: no bits)
        global_grad, metrics = self.comm.allreduce_mean(evaluation(self.problem, self.w), kinds=(METRICS, METRICS))
        return self.metrics(global_grad, metrics)

    def metrics(self, global_grad: torch.Tensor | None, metrics: torch.Tensor) -> dict[str, float]:
        out = dict(zip(self.problem.metric_names, metrics.tolist()))
        if global_grad is not None:
            out["grad_norm"] = float(torch.linalg.vector_norm(global_grad))
        return out

    @property
    def iterate(self) -> torch.Tensor:
        return self.w

    def worker_update(self, w: torch.Tensor) -> list[torch.Tensor]:
        """Asynchronous runs (``asynchronous = True``): one worker step at the parameters ``w`` it pulled, as
        the tensors it pushes to the server (its config's `AlgorithmConfig.async_server` applies them)."""
        raise ConfigError(f"algorithm={self.name} has no asynchronous form; set comm.staleness=0")

    def state_dict(self) -> dict:
        """What a resumed run needs to continue exactly as if never stopped.

        The base keeps the iterate and the problem's own state (its minibatch
        generators); subclasses with more state (a safeguard, dual variables, an
        optimizer) extend both methods.
        """
        state = {"w": self.w.detach().clone()}
        problem_state = self.problem.state_dict()
        if problem_state:  # a problem without state of its own writes none (`Problem.state_dict`)
            state["problem"] = problem_state
        if isinstance(self.comm, Communicator) and self.comm.compression is not None:
            state["compression"] = self.comm.compression.state_dict()  # its generator and EF21 estimates
        return state

    def load_state_dict(self, state: dict) -> None:
        with torch.no_grad():
            self.w.copy_(state["w"])  # in place: an optimizer may hold self.w as its parameter
        if "problem" in state:
            self.problem.load_state_dict(state["problem"])
        if "compression" in state and isinstance(self.comm, Communicator) and self.comm.compression is not None:
            self.comm.compression.load_state_dict(state["compression"])

    def load_elastic_state(self, state: dict) -> None:
        """Continue from rank 0's committed state after a Horovod elastic reset (`dane.loop.elastic`).

        Only rank 0's state survives a reset (it is broadcast to every worker), and the
        shards are dealt anew for the new world size, so this worker may hold other rows
        than the worker that wrote ``state``.  The default keeps everything but the
        problem's own state (minibatch generators of the old shard: this worker's start
        as in a fresh run of the new size); a subclass with state that depends on the
        shard derives it again from its new shard (`dane.dane.DANE`).
        """
        self.load_state_dict({key: value for key, value in state.items() if key != "problem"})


class AlgorithmConfig:
    """A method's hyperparameters (``conf/algorithm/<name>.yaml``, a frozen dataclass subclassing this).

    ``algorithm`` is the `Algorithm` class `build` returns, so that the config answers
    capability questions (``config.algorithm.elastic``) before anything is built; a config
    subclass sets it to its own class.  Required: ``name`` and `build`.
    """

    name: str
    #: the class `build` returns; the base's capabilities (all "no") until a subclass names its own
    algorithm: ClassVar[type[Algorithm]] = Algorithm
    #: what the config's ``mu`` is, for the divergence hint (`dane.loop.launch.recovery_overrides`): "damping" where a
    #: larger μ makes the step shorter (a proximal weight, a floor or shift of the Hessian), and the hint is a ten-fold
    #: μ; "strong_convexity" where μ is the objective's strong convexity that the step trusts (S-DANE's, ADIANA's),
    #: which an overestimate breaks, and the hint is the method's own estimate (null); None: no hint on μ
    mu_role: ClassVar[str | None] = None

    def build(self, problem: Problem, comm: Communicator) -> Algorithm:
        """This worker's algorithm on ``problem``."""
        raise MissingMethod(f"{type(self).__name__} must define build(problem, comm) (docs/extending.md)")

    def async_server(self, w0: torch.Tensor, sizes: Sequence[float]) -> Any:
        """The server's half of an asynchronous run (``algorithm.asynchronous``), from w_0 and the workers' shard
        sizes: an object with the parameters ``w`` and ``apply(update, rank)``."""
        raise ConfigError(f"algorithm={self.name} has no asynchronous form; set comm.staleness=0")

    def stacked_form(self, problem: ProblemConfig, size: int) -> str | None:
        """None when the batched simulator (``sim.batched``, `dane.loop.batching`) can run this method's ``size`` workers
        on one stacked problem (`build_stacked`); else why not, a clause of ``sim.batched=true``'s refusal.  The
        stacked form is the one the class's ``stacked_needs`` asks for: the problem's own
        (`dane.problems.ProblemConfig.stacked_form`), or with "oracles" its rows stacked
        (`dane.problems.stacked_rows.rows_form`), or with "gradients" either (the problem's own first; where neither
        serves, the problem's own refusal).  A config may add conditions of its own (and call this)."""
        from .problems.stacked_rows import rows_form

        needs = self.algorithm.stacked_needs
        if needs == "oracles":
            return rows_form(problem, size)
        why = problem.stacked_form(size)
        if why is not None and needs == "gradients" and rows_form(problem, size) is None:
            return None
        return why

    def build_stacked(self, problem: ProblemConfig, size: int, dtype: torch.dtype) -> Problem:
        """The ``size`` workers' problem as one stacked `Problem` where `stacked_form` is None:
        `dane.problems.ProblemConfig.build_stacked`, whose contract the returned problem keeps for what `build`'s
        algorithm calls, or with ``stacked_needs = "oracles"`` (and "gradients" where the problem has no stacked form
        of its own) `dane.problems.stacked_rows.build_rows`."""
        from .problems.stacked_rows import build_rows

        needs = self.algorithm.stacked_needs
        if needs == "oracles" or (needs == "gradients" and problem.stacked_form(size) is not None):
            return build_rows(problem, size, dtype)
        return problem.build_stacked(size, dtype)

    def check_run(self, problem: ProblemConfig, dtype: torch.dtype) -> None:
        """The method's keys against the run's ``problem`` and its top-level ``dtype``, with the run's spec, before any
        worker starts (`dane.loop.spec.RunSpec`): one line naming the key (split learning's steps in the model's dtype,
        `dane.split.config.SplitConfig.check_run`).  Nothing by default."""

    def recovery(self) -> list[str]:
        """Overrides of this method's own that make a diverging run of it safer, each with its reason in brackets
        (`dane.loop.launch.recovery_overrides` puts them before the generic ones: a safeguard, a larger μ, a smaller
        step).  None by default."""
        return []

    #: a method with a driver of its own (split learning, `dane.split`): ``run_job(spec, out_dir, collect)`` runs
    #: the whole job and returns its summary; None: the round loop drives `build`'s algorithm
    run_job: Any = None


def known_algorithms() -> dict[str, type[Algorithm]]:
    """The package's algorithms by the name ``algorithm=<name>`` selects: ``conf/algorithm/<name>.yaml`` and the
    `Algorithm` class its config (``_target_``) builds.  It imports every one of them: for the one-line
    refusals that list which algorithms would do, not for a run."""
    from .layout import CONF_DIR

    found = {path.stem: algorithm_of(path) for path in sorted((CONF_DIR / "algorithm").glob("*.yaml"))}
    return {name: cls for name, cls in found.items() if cls is not None}


def algorithm_of(path) -> type[Algorithm] | None:
    """The `Algorithm` class the config file ``path`` builds (its ``_target_``), None where it builds no
    `AlgorithmConfig`."""
    from omegaconf import OmegaConf

    return algorithm_built_by(OmegaConf.load(path)["_target_"])


def algorithm_built_by(target: str) -> type[Algorithm] | None:
    """The `Algorithm` class the config class ``target`` (a dotted name, an ``algorithm`` group's ``_target_``)
    builds, its ``algorithm``; None where ``target`` is not an `AlgorithmConfig` subclass."""
    from hydra.utils import get_class

    config = get_class(target)
    return config.algorithm if isinstance(config, type) and issubclass(config, AlgorithmConfig) else None


#: the package's configs that run another method's class under a name of their own: name -> display name
#: (conf/algorithm/fedavg.yaml runs FedProx's class at mu = 0, which is FedAvg)
NAMED_FORMS = {"fedavg": "FedAvg"}


@functools.cache
def label_of(name: str) -> str:
    """The display name of the package's ``algorithm=<name>``: its class's `Algorithm.label` (``name`` itself where
    the class declares none, or where the package has no algorithm of that name: one of one's own, from
    ``--config-dir`` or `dane.fit`, is known by its run's summary, `label_of_run`).  Reads that one config file of
    the package's conf/, once a process."""
    from .layout import CONF_DIR

    path = CONF_DIR / "algorithm" / f"{name}.yaml"
    cls = algorithm_of(path) if path.is_file() else None
    return NAMED_FORMS.get(name) if cls is not None and name in NAMED_FORMS else \
        (cls.label if cls is not None else "") or name


def recorded_label(config: AlgorithmConfig, algo) -> str:
    """What a run's summary.json records as its ``label``: the `Algorithm.label` of the class that ran (the round
    object built, else the config's ``algorithm`` where the round object is a split or asynchronous run's), else
    the config's ``name``; a package config of `NAMED_FORMS` (its config class the package's) records its own name
    (FedAvg, not the FedProx class it runs)."""
    cls = type(algo) if isinstance(algo, Algorithm) else getattr(config, "algorithm", Algorithm)
    if config.name in NAMED_FORMS and type(config).__module__.startswith("dane."):
        return NAMED_FORMS[config.name]
    return getattr(cls, "label", "") or config.name


def label_of_run(summary: dict, name: str) -> str:
    """The display name of ``algorithm=<name>`` as a run of it ran: the ``label`` its summary.json records
    (`recorded_label`: its class's, a class of one's own included), else (a summary written before runs recorded
    one) `label_of` ``name``."""
    return summary.get("label") or label_of(name)
