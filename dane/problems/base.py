"""What an algorithm and a driver may know about worker i's local objective O_i, and about the config that builds it.

The global objective is O(w) = (1/m) * sum_i O_i(w), so a plain ``allreduce_mean`` of
local values, gradients or metric contributions gives the global ones.

`Problem` is the base class of every shard (ridge, the linear models, the networks): it
declares each member an algorithm or a driver reads, with its default, so that a new
problem subclasses it and overrides what it offers; nobody asks a problem for a member
by name.  `ProblemConfig` does the same for the config that builds the shards
(``conf/problem/<name>.yaml``).
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable, ClassVar, ContextManager, Sequence

import torch

from ..errors import MissingMethod
from ..work import uncounted

if TYPE_CHECKING:
    from ..comm import Communicator
    from ..numerics.local_solvers import LocalSolver


class Problem:
    """Worker i's shard of a distributed objective.

    Required (every algorithm uses them): ``dim``, ``dtype``, ``metric_names``,
    `initial_point`, `evaluate` and `prox_solve`.  The rest is optional and declared here
    with its default.  An optional *method* whose default is None is one the problem
    does not offer: a caller tests ``problem.hessian_vector is None`` and refuses with
    one line naming the algorithm to use instead; a subclass offers it by defining it.
    """

    dim: int
    dtype: torch.dtype
    #: names of the entries of the metric vector returned by `evaluate`; "objective" first.  A problem whose optimum
    #: O* is known adds "suboptimality", its entry a local contribution whose mean over the workers is O(w) − O*
    #: (such as O_i(w) − O*; `dane.problems.glm.LinearModelShard` has one once given its reference): the records
    #: carry it, and ``tol`` tests it against |O*| (`dane.loop.stopping.StopRule`)
    metric_names: tuple[str, ...]

    # -------------------------------------------------------------- optional facts, with their defaults
    #: whether O is convex in w; DANE's safeguard relaxes its rule when it is not
    convex: bool = True
    #: whether O is quadratic in w (constant Hessian): DANE's safeguard keeps its memory, DiSCO takes no damping
    #: margin, ADMM never refreshes an estimated ρ
    quadratic: bool = False
    #: σ > 0 with O_i σ-strongly convex (the ℓ2 weight of a linear-model shard); None: not such a shard, and the
    #: SVRG and CG local solvers of InexactDANE and AIDE do not apply
    strong_convexity: float | None = None
    #: the number of rows this worker holds; None: the problem has no rows (shard-weighted means and minibatches
    #: need them)
    n_local: int | None = None
    #: nonzeros of the shard's rows times its classes (a linear model's X_i), for the flops estimate of its local
    #: work (`dane.work.unit_costs`); None: no rows (a quadratic given by its Hessian) or a network
    row_nonzeros: int | None = None
    #: the local solver the problem resolved for its exact `prox_solve` (``.method``: cholesky, cg, ...); None: its own
    solver: LocalSolver | None = None
    #: the same rows as a linear-model shard (a ridge shard keeps one for its row-based solvers); None: the problem
    #: itself, or no rows
    rows: Problem | None = None
    #: where its tensors live; the simulator meters a GPU worker by wall time instead of thread time
    device: str | torch.device = "cpu"
    #: one-line remarks rank 0 prints before the first round and writes into the summary
    notes: Sequence[str] = ()
    #: (ȳ, s) when the target was standardized (y = ȳ + s y'): records are reported in y's own units
    target_units: tuple[float, float] | None = None
    #: what the data set is (its name, sizes, split), written into the summary; None: nothing to say
    data_info: dict | None = None
    #: the push of a store's data set this worker read (its collection, store and push id: ``data=mongo``), which
    #: every worker of a run must share (`dane.loop.worker.check_one_push`); None: data no push replaces
    data_push: str | None = None
    #: m when this object holds all m workers' shards stacked (`ProblemConfig.build_stacked`): its methods take
    #: a point of shape (d,) or (m, d) and return per-worker results with a leading axis of m
    #: (`dane.comm.batched`); None: one worker's shard
    stacked_workers: int | None = None

    # -------------------------------------------------------------- optional methods: None where not offered
    #: O_i(w) alone (GIANT's line search)
    objective: Callable[[torch.Tensor], torch.Tensor] | None = None
    #: ``hessian_vector(v, *, at=None, with_reg=True)``: ∇²O_i(at) v (GIANT, DiSCO, ADMM's refreshed ρ).  Without
    #: ``at``: M_i v for one fixed symmetric M_i ⪰ ∇²O_i(w) at every w (the Hessian itself on a quadratic; a linear
    #: model's majorant (m/N) c_f X_iᵀX_i + λI), whose extreme eigenvalues set the step sizes and penalties
    #: estimated before the first round (`baselines.spectral`: GD's ``algorithm.lr=null``, ADMM's
    #: ``algorithm.rho=null``), so a step built from them is safe everywhere.  ``with_reg=False``: without the
    #: regularizer the workers share
    hessian_vector: Callable[..., torch.Tensor] | None = None
    #: ``solve_hessian(r, *, at, shift, with_reg, ...)``: (∇²O_i(at) + shift I)⁻¹ r (DiSCO's preconditioner)
    solve_hessian: Callable[..., torch.Tensor] | None = None
    #: ``prox_regularizer(v, rho)``: the prox of the shared regularizer (ADMM's z-step)
    prox_regularizer: Callable[[torch.Tensor, float], torch.Tensor] | None = None
    #: ``batch_grad(w, idx)``: an unbiased gradient of O_i from the rows ``idx`` (SGD-type methods)
    batch_grad: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    #: ``svrg_rows()``: the shard's rows in the compiled SVRG kernels' layout (`dane.problems.glm.SVRGRows`)
    svrg_rows: Callable[[], Any] | None = None
    #: ``participants(idx)``, on a stacked problem: the stacked problem of the workers ``idx`` alone (sorted), row k
    #: worker idx[k]'s, for the local work of a round that samples its clients (`baselines.federated`)
    participants: Callable[[torch.Tensor], Problem] | None = None
    #: ``confusion_matrix(w)``: test-set counts (classes x classes), allreduced once after the last round
    confusion_matrix: Callable[[torch.Tensor], torch.Tensor] | None = None

    # -------------------------------------------------------------- required
    def initial_point(self) -> torch.Tensor:
        raise MissingMethod(f"{type(self).__name__} must define initial_point() (docs/extending.md)")

    def evaluate(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(∇O_i(w), local metric contributions); their allreduced means are the global ones."""
        raise MissingMethod(f"{type(self).__name__} must define evaluate(w) (docs/extending.md)")

    def prox_solve(self, anchor: torch.Tensor, linear: torch.Tensor, mu: float, *, with_reg: bool = True,
                   anchor_grad: torch.Tensor | None = None) -> torch.Tensor:
        r"""argmin_w O_i(w) - <linear, w> + (mu/2) ||w - anchor||^2.

        With ``with_reg=False`` the shared regulariser is left out of O_i (ADMM puts it
        into its z-step instead).  ``anchor_grad``, if given, is ∇O_i(anchor), which the
        caller may already have (DANE does); a solver that needs it need not recompute it.
        """
        raise MissingMethod(f"{type(self).__name__} must define prox_solve(anchor, linear, mu) (docs/extending.md)")

    # -------------------------------------------------------------- optional methods with a default
    def local_metrics(self, w: torch.Tensor) -> torch.Tensor:
        """The local metric contributions of `evaluate` alone; a problem overrides it where that is cheaper
        (a network's forward passes without a gradient).  A measurement: not counted as local work (`dane.work`)."""
        with uncounted():
            return self.evaluate(w)[1]

    def validation_objective(self, w: torch.Tensor) -> torch.Tensor:
        r"""The score local SGD's best election compares across the workers (lower is better): worker i's mean loss
        per row on its own shard plus the regularizer, i.e. O_i(w) with its shard weight s_i = m n_i / Σ_j n_j
        divided out of the data term, (O_i(w) − R(w)) / s_i + R(w).  O_i itself carries s_i (so that the mean of the
        O_i is the loss over all rows), which on shards of unequal size would favour the smallest shard whatever its
        model.  A scalar; (m,) on a stacked problem, row i worker i's (at w shared or one row each).

        By default O_i(w) from `evaluate`: right where every shard weighs alike (s_i = 1, equal shards) or the problem
        has no rows.  A problem whose shards may differ in size overrides it (`dane.problems.glm.LinearModelShard`,
        the networks, `dane.problems.stacked_rows.StackedRows`, `dane.problems.ridge.RidgeShard`), equal to O_i(w)
        bit for bit where s_i = 1, and where it can by a forward pass alone (no gradient), counted as one pass:
        the election's work (`dane.work`)."""
        return self.evaluate(w)[1][..., 0]  # (m,) on a stacked problem

    def state_dict(self) -> dict:
        """The problem's own state a resumed run needs (its minibatch generators); empty: none."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned."""


class SharedL2:
    """A shard whose workers share the regularizer (l2/2)‖w‖² of weight ``l2`` (a linear model's λ, a network's
    ``problem.l2``; on a stacked problem the same for every worker): that regularizer's prox.  Listed before
    `Problem` among the bases, whose ``prox_regularizer`` is None (not offered)."""

    l2: float

    def prox_regularizer(self, v: torch.Tensor, rho: float) -> torch.Tensor:
        r"""argmin_z (l2/2)‖z‖² + (ρ/2)‖z − v‖² = ρ v / (ρ + l2): ADMM's z-step."""
        return (rho / (rho + self.l2)) * v


class ProblemConfig:
    """What builds the shards (``conf/problem/<name>.yaml``, a frozen dataclass subclassing this).

    Required: ``name`` and `build`.  The rest is optional, declared here with its default.
    """

    name: str
    #: none | auto | a saved w*: whether the workers compute a reference optimum (records then carry
    #: suboptimality, `dane.problems.optimum`)
    optimum: Any = "none"
    #: rounds take seconds of compute, so Horovod's background loop may wake less often (`HorovodOptions`)
    compute_bound: ClassVar[bool] = False
    #: ``attach_reference(problem, comm)``: the workers agree on the reference optimum before the run's clock and
    #: counters start (`dane.loop.reference.attach_one`); None: this problem has none
    attach_reference: Callable[[Problem, Communicator], None] | None = None
    #: the workers read a store's data set by id (``data=mongo``), which a push may replace while they read it: the
    #: built shards carry ``data_push``, which a launched run's workers compare (`dane.loop.worker.check_one_push`)
    by_id: ClassVar[bool] = False

    def build(self, rank: int, size: int, dtype: torch.dtype) -> Problem:
        """Worker ``rank``'s shard of ``size``."""
        raise MissingMethod(f"{type(self).__name__} must define build(rank, size, dtype) (docs/extending.md)")

    def stacked_form(self, size: int) -> str | None:
        """None when `build_stacked` gives the ``size`` workers' shards as one stacked problem; else why not, as a
        clause of the refusal of ``sim.batched=true`` (unequal shard sizes, a local solver without a batched form)."""
        return f"problem={self.name} has no stacked form"

    def batched_by_default(self, size: int) -> bool:
        """Whether ``sim.batched=auto`` takes `build_stacked` at ``size`` workers where it can; by default yes.  A
        problem whose stacked form does not pay off on its device says no (``sim.batched=true`` still runs it)."""
        return True

    def build_stacked(self, size: int, dtype: torch.dtype) -> Problem:
        """All ``size`` workers' shards as one `Problem` with ``stacked_workers = size``, where `stacked_form` is
        None (the batched simulator, `dane.comm.batched`).  Contract: ``evaluate(w)`` takes w of shape (d,)
        or (m, d) and returns the (m, d) local gradients and (m, k) local metrics, row i worker i's, equal to
        ``build(i, size, dtype).evaluate`` to round-off; ``prox_solve``, ``hessian_vector`` and
        ``solve_hessian`` likewise take shared (d,) or stacked (m, d) vectors and return stacked ones."""
        raise NotImplementedError(f"problem={self.name} has no stacked form")

    def check_workers(self, workers: int) -> None:
        """Refuse, in one line, a number of workers the data cannot be dealt to; by default any number."""

    def prepare(self) -> None:
        """Make what every worker shares (the data set, the reference optimum) once, before the timed build."""

    def release(self) -> None:
        """A launched process holds one worker: drop what `prepare` made for the others."""

    def numerics(self) -> ContextManager:
        """A context fixing torch's threads and algorithms for the whole run (a network's reproducible numerics);
        by default nothing changes."""
        return contextlib.nullcontext()
