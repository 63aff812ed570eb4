"""The problem's local-solver nulls (``problem.local_solver=auto``, ``local_max_iter``, ``svrg_lr``,
``svrg_passes=auto``) in the summary's ``defaults`` where the run's local solves used them, and an SVRG solve's
nulls re-derived as DANE's safeguard moves μ (the records' ``adapted`` events)."""
from __future__ import annotations

import numpy as np
import pytest

import dane
from dane.numerics.local_solvers import LBFGS_MAX_ITER, LocalSolver, svrg_resolved
from dane.problems import RidgeSyntheticConfig

rng = np.random.default_rng(0)
X = rng.standard_normal((120, 6)) * np.logspace(-1, 1, 6)
LABELS = np.where(rng.standard_normal(120) > 0, 1.0, -1.0)


def logreg(**keys):
    return dane.problems.LogReg(X, LABELS, lam=1e-3, **keys)


def entries(summary: dict) -> dict:
    return {e["key"]: (e["value"], e["rule"], e["stats"]) for e in summary["defaults"]}


def test_a_cg_solves_null_cap_is_the_summarys_cg_products():
    """The reviewer's case, small: problem.local_solver=cg caps each solve at 10 d products; the summary said
    ``defaults: []`` and that no package rule applied."""
    problem = RidgeSyntheticConfig(n_samples=60, dim=7, local_solver="cg", optimum="none")
    summary = dane.fit(problem, "dane", workers=2, rounds=2, safeguard=False).summary
    assert summary["defaults"] == [{"key": "problem.local_max_iter", "value": 70, "rule": "cg_products",
                                    "stats": {"dim": 7}}]
    assert summary["package_rules_applied"] is True
    given = dane.fit(RidgeSyntheticConfig(n_samples=60, dim=7, local_solver="cg", local_max_iter=70, optimum="none"),
                     "dane", workers=2, rounds=2, safeguard=False).summary
    assert given["defaults"] == [] and given["package_rules_applied"] is False


def test_auto_names_the_solver_it_chose_and_lbfgs_its_iteration_cap():
    auto = dane.fit(logreg(), "dane", workers=2, rounds=2, safeguard=False).summary
    assert auto["defaults"] == [{"key": "problem.local_solver", "value": "cholesky", "rule": "auto_local_solver",
                                 "stats": {"dim": 6, "sparse": False}}]
    lbfgs = dane.fit(logreg(local_solver="lbfgs"), "dane", workers=2, rounds=2, safeguard=False).summary
    assert lbfgs["defaults"] == [{"key": "problem.local_max_iter", "value": LBFGS_MAX_ITER, "rule": "LBFGS_MAX_ITER",
                                  "stats": {}}]
    given = dane.fit(logreg(local_solver="cholesky"), "dane", workers=2, rounds=2, safeguard=False).summary
    assert given["defaults"] == [] and given["package_rules_applied"] is False


def test_svrgs_null_step_is_worker_0s_at_the_first_solves_mu():
    """γ = 1/(n_0 L_row + λ + μ) on worker 0's 60 rows at μ = 0.05, the solve's proximal weight (algorithm.mu, no
    safeguard); problem.svrg_passes is a given number (3)."""
    problem = logreg(local_solver="svrg")
    summary = dane.fit(problem, "dane", workers=2, rounds=2, safeguard=False, mu=0.05).summary
    [(key, (value, rule, stats))] = entries(summary).items()
    shard = problem.build(0, 2)
    L_row = float((shard.X * shard.X).sum(1).max()) * shard.weight * 0.25  # the logistic loss' curvature ≤ 1/4
    assert (key, rule, stats["worker"], stats["mu"], stats["rows"]) == ("problem.svrg_lr", "svrg_step", 0, 0.05, 60)
    assert value == pytest.approx(1 / (60 * L_row + 1e-3 + 0.05), rel=1e-12)


def test_only_the_nulls_a_local_solve_used_are_noted():
    """GD solves nothing locally (its reference optimum's solve is before the rounds); InexactDANE solves by its
    own algorithm.* solver: neither notes the problem's local_solver=auto."""
    gd = dane.fit(logreg(optimum="auto"), "gd", workers=2, rounds=2, lr=0.1).summary
    assert gd["defaults"] == [] and gd["package_rules_applied"] is False
    inexact = dane.fit(logreg(), "inexact_dane", workers=2, rounds=1, safeguard=False, passes=3, lr=0.01).summary
    assert inexact["defaults"] == []


def test_a_resumed_shard_keeps_the_nulls_its_solves_used():
    """The notes ride in the shard's state (a checkpoint): a resumed run lists what the uninterrupted one does."""
    from dane import work

    shard = logreg(local_solver="svrg", svrg_passes="auto").build(0, 2)
    shard.solver_notes.worker = 0
    anchor = shard.initial_point()
    with work.opened(work.Ledger((0,), work.unit_costs(shard))):
        shard.prox_solve(anchor, anchor * 0, 0.5)
        shard.prox_solve(anchor, anchor * 0, 2.0)  # a later μ: the first use's stands
    assert {k: e["stats"]["mu"] for k, e in shard.solver_notes.entries.items()} == \
        {"problem.svrg_lr": 0.5, "problem.svrg_passes": 0.5}
    fresh = logreg(local_solver="svrg", svrg_passes="auto").build(0, 2)
    fresh.load_state_dict(shard.state_dict())
    assert fresh.solver_notes.entries == shard.solver_notes.entries
    assert "solver_notes" not in logreg().build(0, 2).state_dict()  # nothing used: the state is as it was


@pytest.mark.parametrize("key, name", [("algorithm.passes", "passes"), ("algorithm.lr", "lr")])
def test_each_move_of_mu_rederives_inexact_danes_svrg_nulls_as_an_adapted_event(key, name):
    """InexactDANE's null step and passes=auto hold at the starting μ (the defaults' ``mu``); each move of μ by the
    safeguard re-derives them, and the round that moved μ carries each change: from the value at the old μ to the
    value at the new, worker 0's (the summary said passes = 338, its μ = 0 value, as μ rose and passes fell)."""
    from sklearn.datasets import load_breast_cancer

    features, labels = load_breast_cancer(return_X_y=True)
    problem = dane.problems.LogReg((features - features.mean(0)) / features.std(0), np.where(labels > 0, 1.0, -1.0),
                                   lam=1e-3, fit_intercept=True, local_solver="cholesky")
    summary = dane.fit(problem, "inexact_dane", workers=2, rounds=4).summary
    start = entries(summary)[key]
    assert start[2]["mu"] == 0.0 and start[2]["worker"] == 0
    moves = [e for e in summary["adaptations"] if e["key"] == "algorithm.mu"]
    changes = {e["round"]: e for e in summary["adaptations"] if e["key"] == key}
    shard, solver = problem.build(0, 2), LocalSolver("svrg", passes="auto")
    at = {mu: svrg_resolved(shard, solver, mu)[name]["value"] for m in moves for mu in (m["from"], m["to"])}
    assert start[0] == svrg_resolved(shard, solver, 0.0)[name]["value"]
    assert len(moves) >= 2 and {t: (e["from"], e["to"]) for t, e in changes.items()} == \
        {m["round"]: (at[m["from"]], at[m["to"]]) for m in moves if at[m["from"]] != at[m["to"]]}
    assert all(e["trigger"] == f"mu moved ({'svrg_passes' if name == 'passes' else 'svrg_step'})"
               and e["workers"] == [[0, e["from"], e["to"]]] for e in changes.values())
    if name == "passes":
        assert [changes[t]["to"] for t in sorted(changes)] == [200, 33]  # from 338 at mu = 0


def test_a_move_of_mu_rederives_the_problems_null_svrg_step():
    """DANE solving by the problem's SVRG (problem.svrg_lr null, 3 passes given): a move of μ from 0 to 0.5 changes
    the step 1/(n_0 L_row + λ + μ), under the problem's key; the given passes and another solver give none."""
    from dane.comm import LocalCommunicator
    from dane.dane import DANE

    shard = logreg(local_solver="svrg").build(0, 2)
    nL = 60 * shard.row_smoothness()
    assert DANE(shard, LocalCommunicator()).rederived(0.0, 0.5) == [
        {"key": "problem.svrg_lr", "from": 1 / (nL + 1e-3), "to": 1 / (nL + 1e-3 + 0.5),
         "trigger": "mu moved (svrg_step)", "workers": [[0, 1 / (nL + 1e-3), 1 / (nL + 1e-3 + 0.5)]]}]
    assert DANE(logreg().build(0, 2), LocalCommunicator()).rederived(0.0, 0.5) == []


def test_every_rule_a_problem_null_names_is_one_of_the_defaults_module():
    """Every rule a ``note``/``noted`` call names, and every rule of a {"problem.<key>": rule} table (what the first
    lines name), in every module of the package."""
    import ast
    from pathlib import Path

    import dane.baselines.defaults as d
    from dane.numerics.svrg import SVRG_NULLS

    rules = {rule for _, rule in SVRG_NULLS.values()}
    for path in Path(dane.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            name = getattr(node.func, "attr", getattr(node.func, "id", None)) if isinstance(node, ast.Call) else None
            if name in ("note", "noted"):
                args = [a for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                rules.update(a.value for a in args if not a.value.startswith(("problem.", "algorithm.")))
            if isinstance(node, ast.Dict):
                rules.update(v.value for k, v in zip(node.keys, node.values)
                             if isinstance(k, ast.Constant) and str(k.value).startswith("problem.")
                             and isinstance(v, ast.Constant) and isinstance(v.value, str))
    assert rules >= {"auto_local_solver", "cg_products", "LBFGS_MAX_ITER", "svrg_step", "svrg_passes",
                     "auto_factorization", "one_pass_steps", "whole_shard"}
    assert {rule for rule in rules if not hasattr(d, rule)} == set()


# ------------------------------------------------------------------ the batched path, factorization, networks
def summary_of(problem, algorithm: str, workers: int, batched: str, rounds: int = 2, **keys) -> dict:
    """A local run's summary, with ``sim.batched`` as given (true: the stacked problem; false: one shard a worker)."""
    from helpers import on_path

    collected = on_path(problem, algorithm, workers, batched, rounds, **keys)
    assert collected["summary"]["simulator_path"] == ("batched" if batched == "true" else "threads")
    return collected["summary"]


AUTO = {"key": "problem.local_solver", "value": "cholesky", "rule": "auto_local_solver"}


@pytest.mark.parametrize("problem,noted", [
    # 12 rows a worker < d = 20: Woodbury; 120 ≥ d: the d x d Cholesky, an eigendecomposition from the 17th shift
    (RidgeSyntheticConfig(n_samples=48, dim=20, optimum="none"),
     [{**AUTO, "stats": {"dim": 20, "sparse": False}},
      {"key": "problem.factorization", "value": "woodbury", "rule": "auto_factorization",
       "stats": {"worker": 0, "rows": 12, "dim": 20}}]),
    (RidgeSyntheticConfig(n_samples=480, dim=20, optimum="none"),
     [{**AUTO, "stats": {"dim": 20, "sparse": False}},
      {"key": "problem.factorization", "value": "cholesky", "rule": "auto_factorization",
       "stats": {"worker": 0, "rows": 120, "dim": 20, "eigh_after": 16}}]),
    (RidgeSyntheticConfig(n_samples=48, dim=20, optimum="none", local_solver="cholesky", factorization="woodbury"),
     []),
    (dane.problems.LogReg(X, LABELS, lam=1e-3), [{**AUTO, "stats": {"dim": 6, "sparse": False}}]),
])
def test_the_batched_path_notes_what_the_thread_path_notes(problem, noted):
    """sim.batched=true noted none of these: its stacked problems solved by a fixed Cholesky, so a 4-worker run's
    summary said ``defaults: []`` where the same run on threads listed problem.local_solver=auto's choice."""
    batched = summary_of(problem, "dane", 4, "true", safeguard=False, mu=0.1)
    threads = summary_of(problem, "dane", 4, "false", safeguard=False, mu=0.1)
    assert batched["defaults"] == threads["defaults"] == noted
    assert batched["package_rules_applied"] is threads["package_rules_applied"] is bool(noted)


def test_factorization_auto_is_noted_where_the_exact_solve_uses_it():
    """ridge_synthetic's factorization=auto chose Woodbury's n_i x n_i factors (n_i < d) unnoted: a run given
    local_solver=cholesky said no package rule applied.  A CG solve never factors: nothing to note."""
    asked = RidgeSyntheticConfig(n_samples=60, dim=7, local_solver="cholesky", optimum="none")
    summary = dane.fit(asked, "dane", workers=2, rounds=2, safeguard=False).summary
    assert summary["defaults"] == [{"key": "problem.factorization", "value": "cholesky", "rule": "auto_factorization",
                                    "stats": {"worker": 0, "rows": 30, "dim": 7, "eigh_after": 16}}]
    assert summary["package_rules_applied"] is True
    given = RidgeSyntheticConfig(n_samples=60, dim=7, local_solver="cholesky", factorization="eigh", optimum="none")
    assert dane.fit(given, "dane", workers=2, rounds=2, safeguard=False).summary["package_rules_applied"] is False
    by_cg = RidgeSyntheticConfig(n_samples=60, dim=7, local_solver="cg", local_max_iter=70, optimum="none")
    assert dane.fit(by_cg, "dane", workers=2, rounds=2, safeguard=False).summary["defaults"] == []


def flat_digits(**keys):
    """A network on 24 random 5-feature rows of 3 classes (8 a worker at m = 3), an MLP of 4 hidden units."""
    import torch

    from dane.data import Dataset
    from dane.problems.neural import ModelConfig, NeuralProblemConfig

    class Flat(NeuralProblemConfig):
        def dataset(self) -> Dataset:
            g = torch.Generator().manual_seed(0)
            return Dataset(torch.randn(24, 5, generator=g), torch.randint(0, 3, (24,), generator=g),
                           torch.randn(6, 5, generator=g), torch.randint(0, 3, (6,), generator=g), 3, "flat")

    return Flat(model=ModelConfig(name="mlp", hidden=(4,)), dtype="float64", device="cpu", eval_batch_size=8, **keys)


def test_a_networks_inner_nulls_are_noted_where_its_solves_read_them_on_either_path():
    """inner_steps=null (one pass: 8 rows // 4 = 2 steps) and inner_batch_size=null (the whole shard, 8 rows) were
    resolved unnoted: such a run said ``defaults: []`` and that no package rule applied."""
    steps = {"key": "problem.inner_steps", "value": 2, "rule": "one_pass_steps",
             "stats": {"worker": 0, "rows": 8, "batch_size": 4}}
    for batched in ("true", "false"):
        summary = summary_of(flat_digits(inner_steps=None, inner_batch_size=4), "dane", 3, batched,
                             safeguard=False, mu=0.1)
        assert summary["defaults"] == [steps] and summary["package_rules_applied"] is True
    whole = summary_of(flat_digits(inner_steps=None, inner_batch_size=None), "dane", 3, "false",
                       safeguard=False, mu=0.1)
    assert whole["defaults"] == [{"key": "problem.inner_batch_size", "value": 8, "rule": "whole_shard",
                                  "stats": {"worker": 0, "rows": 8}},
                                 {**steps, "value": 1, "stats": {"worker": 0, "rows": 8, "batch_size": 8}}]
    given = summary_of(flat_digits(inner_steps=2, inner_batch_size=4), "dane", 3, "true", safeguard=False, mu=0.1)
    assert given["defaults"] == [] and given["package_rules_applied"] is False


def test_a_stacked_or_network_problem_keeps_its_notes_in_its_checkpoint_state():
    from dane import work

    shard = flat_digits(inner_steps=None, inner_batch_size=4).build(0, 3)
    assert "solver_notes" not in shard.state_dict()
    w = shard.initial_point()
    with work.opened(work.Ledger((0,), work.unit_costs(shard))):
        shard.prox_solve(w, w * 0, 0.1)
    fresh = flat_digits(inner_steps=None, inner_batch_size=4).build(0, 3)
    fresh.load_state_dict(shard.state_dict())
    assert list(fresh.solver_notes.entries) == ["problem.inner_steps"]
    stacked, again = (RidgeSyntheticConfig(n_samples=48, dim=20, optimum="none").build_stacked(4) for _ in range(2))
    assert stacked.state_dict() == {}  # nothing used yet: no state, as before
    stacked.solver_notes.restore(shard.state_dict())
    again.load_state_dict(stacked.state_dict())
    assert again.solver_notes.entries == shard.solver_notes.entries


def test_svrg_moved_reads_a_ridge_shard_s_rows_and_lists_only_the_nulls_that_changed():
    """`svrg_moved` on a synthetic ridge shard, whose SVRG solves run on the rows it keeps beside itself
    (`row_shard`): the null step 1/(n_i L_row + λ_rows + μ) at both weights, and passes=auto where it changed; a move
    too small to change passes lists the step alone, no move lists none; the keys are ``algorithm.*`` for a method's
    own solver; another solver gives none."""
    from dane.numerics.local_solvers import svrg_moved
    from dane.numerics.svrg import row_shard

    config = RidgeSyntheticConfig(n_samples=120, dim=6, lam=0.05, local_solver="svrg", svrg_passes="auto")
    config.prepare()
    shard = config.build(0, 2)
    rows = row_shard(shard)
    assert rows is not shard and rows.n_local == 60

    def step(mu):  # `svrg_step`: 1/(n_i L_row + shrink), shrink = λ_rows + μ
        return 1 / (rows.n_local * rows.row_smoothness() + (rows.l2 + mu))

    def passes(mu):
        return svrg_resolved(rows, shard.solver, mu)["passes"]["value"]

    assert passes(0.0) != passes(0.5)
    assert svrg_moved(shard, shard.solver, 0.0, 0.5) == [
        ("lr", "problem.svrg_lr", "svrg_step", step(0.0), step(0.5)),
        ("passes", "problem.svrg_passes", "svrg_passes", passes(0.0), passes(0.5))]
    assert passes(0.0) == passes(1e-9)
    assert svrg_moved(shard, shard.solver, 0.0, 1e-9) == [("lr", "problem.svrg_lr", "svrg_step", step(0.0), step(1e-9))]
    assert svrg_moved(shard, shard.solver, 0.5, 0.5) == []
    own = LocalSolver("svrg", passes="auto", keys="algorithm")
    assert [(name, key) for name, key, *_ in svrg_moved(shard, own, 0.0, 0.5)] == [("lr", "algorithm.lr"),
                                                                                  ("passes", "algorithm.passes")]
    assert svrg_moved(shard, LocalSolver("cg"), 0.0, 0.5) == svrg_moved(shard, None, 0.0, 0.5) == []
