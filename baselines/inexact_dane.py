r"""InexactDANE (Reddi, Konečný, Richtárik, Póczós & Smola 2016): DANE with an inexact local solve.

Round t on worker i of m is DANE's round (`dane.dane.DANE.step`, reused, not copied),
two allreduces:

.. math::
    g_t &= \frac1m \sum_i \nabla O_i(w_t)                                  &&\text{(allreduce 1)} \\
    w_i &\approx \arg\min_w\; O_i(w) - \langle \nabla O_i(w_t) - \eta\, g_t, w\rangle
           + \frac{\mu}{2}\|w - w_t\|^2                                    &&\text{(local solve)} \\
    w_{t+1} &= \frac1m \sum_i w_i                                          &&\text{(allreduce 2)}

The local solve is the paper's: ``passes`` epochs of SVRG on the worker's rows, started
at w_t, step 1/L_max of the row terms unless ``lr`` is given (`dane.numerics.svrg.svrg`,
compiled by numba).  ``passes="auto"`` (the default) takes enough passes that one solve
contracts its error by a fixed factor whatever the conditioning,
ceil(c L_max / ((λ + μ) n_i)) with c = 1, at least the paper's 3 and at most 1000
(`dane.numerics.svrg.svrg_passes`); ``passes=3`` is the paper's setting, which leaves the
solve rough where L_max/λ is far above 3 n_i, so that each round contracts the error less.
Local passes are cheap (compiled); rounds are what the method is there to save.
``local_solver="cg"`` instead runs Newton-CG to the loose relative residual ``cg_tol``,
or a fixed ``cg_max_iter`` Hessian-vector products per Newton system with ``cg_tol=0`` (on a non-quadratic loss
Newton then runs to round-off, at most `LocalSolver`'s ``newton_steps`` systems).

Defaults are the paper's method (η = 1, μ = 0) with the passes above (the paper and its
public MATLAB reference take three) inside DANE's μ safeguard (`MuSafeguard`), a departure from the paper: on a
shard that misjudges the global Hessian (a rare feature it lacks) the paper's method
diverges, and the safeguard never accepts an ascent.  ``safeguard=False`` is the paper's
method exactly.

Departure from the MATLAB reference: its InexactDANE SVRG takes one full-gradient snapshot
per round and then ``passes * n_i`` steps, each pass on a fresh permutation of the rows (its
AIDE SVRG draws the rows with replacement instead); here, by default
(``svrg_variant="epochs"``), the snapshot is refreshed at the start of every pass and each
pass visits the rows in a fresh random order (SVRG's outer loop, Johnson & Zhang 2013).
``svrg_variant="matlab"`` is the reference's AIDE sampling, one snapshot and rows with
replacement (`dane.numerics.svrg.SVRG_VARIANTS`); the InexactDANE solver's one
snapshot with per-pass permutations is neither variant.
"""
from __future__ import annotations

from dataclasses import dataclass

from dane import checks
from dane.comm import Communicator
from dane.algorithm import AlgorithmConfig
from dane.dane import DANE, DANEConfig
from dane.errors import ConfigError
from dane.numerics.local_solvers import LocalSolver, cg_products, svrg_resolved
from dane.numerics.svrg import PASSES_AUTO, SVRG_VARIANTS, check_passes, row_shard
from dane.problems import Problem, ProblemConfig

from .defaults import Resolution

INEXACT_SOLVERS = ("svrg", "cg")


def require_convex_shard(problem: Problem, algorithm: str) -> None:
    """The SVRG and CG local solvers exist on the linear models' strongly convex shards only (ridge, logreg, softmax,
    ridge_synthetic)."""
    if problem.strong_convexity is None:
        raise ConfigError(f"algorithm={algorithm} needs a linear model's strongly convex shard for its SVRG or CG local "
                          f"solve (ridge, logreg, softmax, ridge_synthetic), got {type(problem).__name__}; use "
                          "algorithm=dane for other problems")


def inexact_local_solver(method: str, *, passes: int | str, batch_size: int, lr: float | None, cg_tol: float,
                         cg_max_iter: int | None, svrg_variant: str = "epochs") -> LocalSolver:
    """The `LocalSolver` of an InexactDANE-type round, its keys checked under ``algorithm.*``."""
    checks.one_of("algorithm.local_solver", method, INEXACT_SOLVERS)
    check_passes("algorithm.passes", passes)
    checks.positive_int("algorithm.batch_size", batch_size)
    checks.one_of("algorithm.svrg_variant", svrg_variant, SVRG_VARIANTS)
    if lr is not None:
        checks.positive("algorithm.lr", lr)
    checks.relative_tolerance("algorithm.cg_tol", cg_tol, zero=True)  # 0: a fixed count of products
    if cg_max_iter is not None:
        checks.positive_int("algorithm.cg_max_iter", cg_max_iter)
    if method == "cg" and cg_tol == 0 and cg_max_iter is None:
        raise ConfigError("algorithm.local_solver=cg with algorithm.cg_tol=0 needs algorithm.cg_max_iter "
                          "(a fixed number of Hessian-vector products), got None")
    if method == "svrg":  # its nulls are algorithm.*, noted by the build (`noted_solve`)
        return LocalSolver("svrg", passes=passes, batch_size=batch_size, lr=lr, variant=svrg_variant, keys="algorithm")
    return LocalSolver("cg", tol=cg_tol, max_iter=cg_max_iter, keys="algorithm")


@dataclass(frozen=True)
class InexactSolverKeys:
    """The ``algorithm.*`` keys of an InexactDANE-type local solve (shared with AIDE)."""

    local_solver: str = "svrg"
    passes: int | str = PASSES_AUTO
    batch_size: int = 1
    lr: float | None = None
    svrg_variant: str = "epochs"
    cg_tol: float = 1e-2
    cg_max_iter: int | None = None

    def solver(self) -> LocalSolver:
        return inexact_local_solver(self.local_solver, passes=self.passes, batch_size=self.batch_size, lr=self.lr,
                                    cg_tol=self.cg_tol, cg_max_iter=self.cg_max_iter, svrg_variant=self.svrg_variant)


class InexactDANE(DANE):
    """`DANE` with a given inexact local solver; its records also name that solver."""

    name = "inexact_dane"
    label = "InexactDANE"
    elastic = False  # DANE's is; with an inexact local solve a change of workers is untested

    def __init__(self, problem: Problem, comm: Communicator, **kwargs):
        require_convex_shard(problem, self.name)
        super().__init__(problem, comm, **kwargs)

    def step(self) -> dict[str, float]:
        return {**super().step(), "local_solver": self.local_solver.method}


@dataclass(frozen=True)
class InexactDANEConfig(InexactSolverKeys, DANEConfig):
    """DANE's keys and checks (η, μ, the safeguard) and the local solver's."""

    name: str = "inexact_dane"
    algorithm = InexactDANE

    def __post_init__(self) -> None:
        super().__post_init__()
        self.solver()  # validates the local-solver keys now

    def step_recovery(self) -> list[str]:
        """This method's own SVRG step, where it is given (`DANEConfig.recovery`)."""
        return ["algorithm.lr=null (SVRG's step 1/L_max)"] if self.local_solver == "svrg" and self.lr is not None \
            else []

    def stacked_form(self, problem: ProblemConfig, size: int) -> str | None:
        """Never: the stacked problems' local solve is Newton's with batched Cholesky directions
        (`dane.problems.stacked`), not this method's SVRG or CG."""
        return (f"algorithm.local_solver={self.local_solver} solves each worker's problem on its own (the batched path "
                "solves exactly: algorithm=dane)")

    def build(self, problem: Problem, comm: Communicator) -> "InexactDANE":
        """The local solve's nulls (SVRG's step and ``passes=auto``, CG's cap) noted in the summary's ``defaults``
        (`noted_solve`)."""
        solver = self.solver()
        algo = InexactDANE(problem, comm, eta=self.eta, mu=self.mu, safeguard=self.safeguard, local_solver=solver)
        algo.defaults = noted_solve(problem, solver, self.mu, comm)
        return algo


def solve_nulls(solver: LocalSolver | None) -> dict[str, str]:
    """The keys of the local solve that a package rule resolves (SVRG's null ``lr`` and ``passes=auto``, CG's null
    ``cg_max_iter``), key -> rule."""
    if isinstance(solver, LocalSolver) and solver.method == "cg" and solver.max_iter is None:
        return {"algorithm.cg_max_iter": "cg_products"}
    if not isinstance(solver, LocalSolver) or solver.method != "svrg":
        return {}
    return {**({"algorithm.lr": "svrg_step"} if solver.lr is None else {}),
            **({"algorithm.passes": "svrg_passes"} if solver.passes == PASSES_AUTO else {})}


def noted_solve(problem: Problem, solver: LocalSolver, mu: float, comm: Communicator) -> tuple[dict, ...]:
    """The ``defaults`` entries of the local solve's nulls: CG's ``cg_max_iter`` (`cg_products`) and, at the
    proximal weight ``mu``, an SVRG solve's ``lr`` (`dane.numerics.svrg.svrg_step`) and ``passes=auto``
    (`svrg_passes`), this worker's (each worker's from its own rows) at the starting μ (``mu`` among the statistics),
    with what the rules read; none for given numbers, another local solver, or a problem without rows (no SVRG solve
    runs).  Where the safeguard moves μ the solve re-derives both (a larger μ: a longer step, fewer passes), and
    the round's record carries each change as an ``adapted`` event (`dane.dane.DANE.rederived`)."""
    resolution = Resolution()
    if solver.method == "cg" and solver.max_iter is None:  # the problem's own Newton systems (not its rows)
        resolution.add("cg_max_iter", cg_products(problem), "cg_products", dim=problem.dim)
    rows = row_shard(problem)  # whose SVRG solves run
    if getattr(rows, "row_smoothness", None) is None:
        return tuple(resolution.entries)
    found = svrg_resolved(rows, solver, mu)
    if "lr" in found:
        resolution.add("lr", found["lr"].pop("value"), "svrg_step", worker=comm.rank, mu=mu, **found["lr"])
    if "passes" in found:
        resolution.add("passes", found["passes"].pop("value"), "svrg_passes", worker=comm.rank, mu=mu,
                       **found["passes"])
    return tuple(resolution.entries)
