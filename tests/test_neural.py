"""Neural and logistic problems: exact invariants of the flat-vector Problem, DANE against an
L-BFGS optimum on a convex multinomial logistic regression, accuracy on digits, sync SGD
as gradient descent, confusion matrices, early stopping, the entry point's errors, and
horovodrun against the simulator.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.optimize import minimize
from scipy.special import logsumexp

from dane.baselines.fednl_server import one_blas_thread
from dane.errors import ConfigError
from dane.loop.launch import execute
from dane.problems.neural import DataConfig, ModelConfig, NeuralProblemConfig, as_images
from dane.records.results import read_rounds, read_summary
from dane.loop.stopping import EarlyStopping, MonitorError, StopRule
from dane.experiments.config import CONF_DIR, build, run_spec
import runs
from helpers import composed, convex_rule_holds

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("DANE_DATA_DIR", ROOT.parent / "shared" / "data"))
PYTHON = sys.executable
SMALL_MLP = ("problem=digits_mlp", "problem.model.hidden=[32]", "problem.inner_steps=10", "quiet=true")



def run(tmp_path: Path, *overrides: str) -> tuple[dict, list[dict]]:
    summary = execute(run_spec(composed(*overrides)), str(tmp_path))
    return summary, read_rounds(tmp_path)


def mlp_problem(**kwargs) -> NeuralProblemConfig:
    base = dict(data=DataConfig(dataset="digits"), model=ModelConfig("mlp", (16,)), dtype="float64", inner_steps=5,
                inner_batch_size=32)
    return NeuralProblemConfig(**{**base, **kwargs})


# ---------------------------------------------------------------- the Problem on a flat vector
@pytest.mark.parametrize("sharding", ["iid", "dirichlet"])
def test_worker_means_are_the_global_gradient_and_metrics(sharding):
    cfg = mlp_problem(data=DataConfig(dataset="digits", sharding=sharding, alpha=0.3), l2=0.01)
    whole = cfg.build(0, 1)
    w = whole.initial_point() + 0.1 * torch.randn(whole.dim, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    grad, metrics = whole.evaluate(w)
    parts = [cfg.build(rank, 3) for rank in range(3)]
    if sharding == "dirichlet":
        assert len({p.n_local for p in parts}) == 3  # unequal shards: the m n_i / N weights matter
    local = [p.evaluate(w) for p in parts]
    torch.testing.assert_close(sum(g for g, _ in local) / 3, grad, rtol=0, atol=1e-13)
    torch.testing.assert_close(sum(m for _, m in local) / 3, metrics, rtol=0, atol=1e-13)
    # The metrics are the plain definitions on the whole sets.
    data = cfg.dataset()
    with torch.no_grad():  # on the model's device (CUDA where there is one: device=auto), compared on the CPU
        whole._load(w)
        logits = whole.model(data.test_x.double().to(whole.device)).cpu()
        train_loss = torch.nn.functional.cross_entropy(whole.model(data.train_x.double().to(whole.device)).cpu(),
                                                       data.train_y)
    expected = [train_loss + 0.005 * (w @ w), torch.nn.functional.cross_entropy(logits, data.test_y),
                (logits.argmax(1) == data.test_y).double().mean()]
    torch.testing.assert_close(metrics, torch.stack(expected), rtol=1e-12, atol=1e-12)


def test_batch_grad_over_the_whole_shard_is_the_local_gradient():
    problem = mlp_problem(l2=0.1).build(1, 2)
    w = problem.initial_point()
    torch.testing.assert_close(problem.batch_grad(w, torch.arange(problem.n_local)), problem.evaluate(w)[0],
                               rtol=0, atol=1e-14)


def test_all_workers_start_from_the_same_model_and_draw_different_batches():
    cfg = mlp_problem()
    a, b = cfg.build(0, 2), cfg.build(1, 2)
    assert torch.equal(a.initial_point(), b.initial_point())
    assert not torch.equal(a.sampler.next(), b.sampler.next())
    assert torch.equal(cfg.build(0, 2).sampler.next(), cfg.build(0, 2).sampler.next())


def test_lbfgs_local_solve_is_stationary_and_leaves_its_inputs_alone():
    # Convex logistic regression: the full-batch L-BFGS solve must satisfy the optimality
    # condition ∇O_i(w) - linear + mu (w - anchor) = 0 of the DANE subproblem.
    cfg = NeuralProblemConfig(data=DataConfig(dataset="iris"), model=ModelConfig("logreg"), l2=0.01, dtype="float64",
                              inner_optimizer="lbfgs", inner_lr=1.0, inner_steps=200, inner_batch_size=None)
    problem = cfg.build(0, 2)
    gen = torch.Generator().manual_seed(1)
    anchor, linear = torch.randn(problem.dim, dtype=torch.float64, generator=gen), 0.3 * torch.randn(problem.dim, dtype=torch.float64, generator=gen)
    anchor_copy, linear_copy = anchor.clone(), linear.clone()
    w = problem.prox_solve(anchor, linear, 0.5)
    assert torch.equal(anchor, anchor_copy) and torch.equal(linear, linear_copy)
    start = torch.linalg.vector_norm(problem.evaluate(anchor)[0] - linear)
    residual = torch.linalg.vector_norm(problem.evaluate(w)[0] - linear + 0.5 * (w - anchor))
    assert residual < 1e-8 * start


def test_sgd_local_solve_with_a_huge_mu_stays_at_the_anchor():
    problem = mlp_problem().build(0, 2)
    anchor = problem.initial_point()
    w = problem.prox_solve(anchor, torch.zeros_like(anchor), 1e6)
    assert torch.linalg.vector_norm(w - anchor) < 1e-4 * torch.linalg.vector_norm(anchor)


def test_an_inner_batch_over_the_shard_is_refused_where_it_is_drawn_not_drawn_as_the_whole_shard():
    """problem.inner_batch_size=500 on 479 rows: a local solve (or grad_batches' estimate) refuses it in one line;
    what never draws an inner batch (a method without local solves: batch_grad, the full gradient) is left alone."""
    line = ("problem.inner_batch_size=500 exceeds this worker's 479 samples; use a smaller batch or null for the "
            "full shard")
    problem = mlp_problem(inner_batch_size=500).build(0, 3)
    w = problem.initial_point()
    assert problem.n_local == 479 and problem.batch_grad(w, torch.arange(479)).shape == (problem.dim,)
    problem.evaluate(w)
    with pytest.raises(ConfigError) as err:
        problem.prox_solve(w, torch.zeros_like(w), 0.0)
    assert str(err.value) == line
    with pytest.raises(ConfigError) as err:
        mlp_problem(inner_batch_size=500, grad_batches=2).build(0, 3).evaluate(w)
    assert str(err.value) == line
    assert mlp_problem(inner_batch_size=479).build(0, 3).prox_solve(w, torch.zeros_like(w), 0.0).shape == w.shape


def test_a_table_source_given_to_a_network_is_refused_in_one_line():
    """data@problem.data=noisy_plane (docs/extending.md's function, an `ArraySource`) on problem=digits_mlp: a network
    reads a data set by name, so the table source is refused naming the key (it crashed reading ``.dataset``)."""
    from dane import ArraySource

    source = ArraySource(np.eye(4), np.arange(4.0), name="noisy_plane")
    with pytest.raises(ConfigError) as err:
        NeuralProblemConfig(data=source)
    assert str(err.value) == (
        "problem.data is a table source (ArraySource 'noisy_plane'), which only problem=ridge|logreg|softmax take, "
        "as data=; a network takes problem.data.dataset=mnist|cifar10|admissions|digits|iris|breast_cancer|"
        "synthetic_0_0|synthetic_0.5_0.5|synthetic_1_1|synthetic_iid or data@problem.data=mongo")
    assert NeuralProblemConfig(data=DataConfig(dataset="iris")).data.dataset == "iris"


def test_digits_as_images_repeats_each_pixel_in_a_4x4_block():
    flat = NeuralProblemConfig(data=DataConfig(dataset="digits")).dataset()
    images = as_images(flat, 32)
    assert images.train_x.shape == (len(flat.train_y), 1, 32, 32)
    x = images.train_x[5, 0]
    for i, j, a, b in [(0, 0, 0, 0), (3, 5, 2, 1), (7, 7, 3, 3)]:
        assert x[4 * i + a, 4 * j + b] == flat.train_x[5, 8 * i + j]
    assert any("upsampled" in note for note in images.notes)
    with pytest.raises(ConfigError) as err:
        as_images(flat, 30)
    assert str(err.value) == ("problem.data.image_size=30 needs flat square features whose side divides it; digits "
                              "has shape (64,); set problem.data.image_size=null")


# ---------------------------------------------------------------- DANE on a convex problem
def logreg_optimum(X: np.ndarray, y: np.ndarray, classes: int, l2: float) -> float:
    """min (1/N) Σ CE(W x_j + b, y_j) + (l2/2)(||W||² + ||b||²) by scipy's L-BFGS, float64, in its own code; on one
    BLAS thread (`one_blas_thread`, as FedNL's server solves): a thread per core made its small products and L-BFGS's
    updates 3-15x slower on cores that other work shares, the same numbers."""
    n, d = X.shape

    def f(theta):
        W, b = theta[: classes * d].reshape(classes, d), theta[classes * d:]
        Z = X @ W.T + b
        lse = logsumexp(Z, axis=1)
        P = np.exp(Z - lse[:, None])
        P[np.arange(n), y] -= 1
        grad = np.concatenate([(P.T @ X / n).ravel(), P.mean(0)]) + l2 * theta
        return np.mean(lse - Z[np.arange(n), y]) + 0.5 * l2 * theta @ theta, grad

    with one_blas_thread():
        res = minimize(f, np.zeros(classes * (d + 1)), jac=True, method="L-BFGS-B",
                       options=dict(maxiter=5000, gtol=1e-12, ftol=1e-16, maxcor=30))
    assert np.abs(res.jac).max() < 1e-8
    return float(res.fun)


def test_inexact_dane_reaches_the_lbfgs_optimum_of_multinomial_logistic_regression(tmp_path):
    # 13 rounds: safeguarded DANE converges linearly here, at about 0.2 per round from round 10 (no rejection); the
    # gap measured 1.2e-5 after 11 rounds, 5.7e-7 after 13 (2.4e-11 after 20).
    cfg = composed("problem=logreg_digits", "workers=2", "rounds=13", "algorithm.mu=0.01", "quiet=true")
    summary, rounds = execute(run_spec(cfg), str(tmp_path)), read_rounds(tmp_path)
    data = build(cfg, "problem").dataset()  # the rows the run read, from its config
    best = logreg_optimum(data.train_x.double().numpy(), data.train_y.numpy(), data.num_classes, 0.01)
    gaps = [r["objective"] - best for r in rounds]
    assert min(gaps) > -1e-9  # nobody beats the optimum
    assert gaps[-1] < 1e-5, gaps
    assert gaps[0] > 1.0  # it really had to travel
    assert summary["final_test_accuracy"] > 0.9


# ---------------------------------------------------------------- DANE on a network
def bounded(objectives: list[float], slack: float = 0.25) -> bool:
    """Each accepted objective is at most (1 + slack) times the lowest before it: the non-convex safeguard's guarantee."""
    return all(b <= (1 + slack) * min(objectives[:i]) + 1e-12 for i, b in enumerate(objectives) if i)


def test_dane_mlp_on_digits_reaches_90_percent_with_a_bounded_objective(tmp_path):
    summary, rounds = run(tmp_path, *SMALL_MLP, "workers=2", "rounds=20", "early_stop.target=0.9")
    assert summary["status"] == "target_reached" and summary["rounds"] <= 20
    assert rounds[-1]["test_accuracy"] >= 0.9
    assert bounded([r["objective"] for r in rounds if r.get("accepted", True)])
    assert rounds[-1]["comm_rounds"] == 2 * rounds[-1]["round"]  # two allreduces per DANE round
    confusion = json.loads((tmp_path / "confusion.json").read_text())
    counts = np.array(confusion["matrix"])
    assert counts.sum() == 360 and np.trace(counts) / 360 == pytest.approx(summary["final_test_accuracy"], abs=1e-6)
    assert (tmp_path / "confusion.png").stat().st_size > 1000


def test_problems_say_whether_they_are_convex():
    assert mlp_problem().build(0, 1).convex is False
    assert mlp_problem(model=ModelConfig("logreg")).build(0, 1).convex is True
    lenet = NeuralProblemConfig(data=DataConfig(dataset="digits", image_size=32), model=ModelConfig("lenet5"))
    assert lenet.build(0, 2).convex is False


@pytest.mark.slow
def test_safeguard_on_a_network_keeps_plain_dane_accuracy_and_lets_mu_come_back_down(tmp_path):
    # Benign setting (plain DANE converges): no rejection, and the safeguard costs at most
    # 1.5 points of test accuracy at the same round budget (measured: 94.7% vs 95.3%).
    common = (*SMALL_MLP, "workers=4", "rounds=15")
    _, guarded = run(tmp_path / "guarded", *common)
    _, plain = run(tmp_path / "plain", *common, "algorithm.safeguard=false")
    assert not any(r.get("accepted") is False for r in guarded)
    assert guarded[-1]["test_accuracy"] >= plain[-1]["test_accuracy"] - 0.015
    # eta=3: plain DANE blows up (objective 118 after 15 rounds, 42% accuracy); the guard
    # rejects rounds, raises mu to 2.4 and, since mu is no longer monotone on a non-convex
    # problem, brings it back down to 0.074 (the monotone rule ended at mu=8).
    # diverge_after=null: the whole 15 rounds (by default the run is caught as diverged, 5 rounds above its start)
    _, wild = run(tmp_path / "wild", *common, "algorithm.safeguard=false", "algorithm.eta=3", "diverge_after=null")
    assert wild[-1]["objective"] > 10 * wild[0]["objective"]
    _, tamed = run(tmp_path / "tamed", *common, "algorithm.eta=3")
    mus = [r["mu"] for r in tamed[:-1]]
    peak = mus.index(max(mus))
    assert any(r.get("accepted") is False for r in tamed[:peak + 1])
    assert min(mus[peak:]) <= max(mus) / 8
    assert bounded([r["objective"] for r in tamed if r.get("accepted", True)])
    assert tamed[-1]["objective"] < 0.1 * tamed[0]["objective"] and tamed[-1]["test_accuracy"] >= 0.9


def test_safeguard_on_convex_logistic_regression_keeps_the_convex_rule(tmp_path):
    # Multinomial logistic regression is convex: the safeguard keeps strict acceptance (no slack:
    # accepted objectives never rise), even with an inexact minibatch inner solver that provokes
    # rejections.  It is not quadratic, so μ may come back down after accepted rounds.
    _, rounds = run(tmp_path, "problem=logreg_digits", "workers=4", "rounds=12", "algorithm.mu=0", "quiet=true",
                    "problem.inner_optimizer=sgd", "problem.inner_lr=0.5", "problem.inner_steps=10",
                    "problem.inner_batch_size=32", "problem.inner_momentum=0.9")
    assert not all(r["accepted"] for r in rounds[:-1])  # the rejection path ran
    assert convex_rule_holds(rounds, monotone_mu=False)


def test_sync_sgd_with_whole_shard_batches_is_gradient_descent(tmp_path):
    lr, steps = 0.3, 4
    # 3 workers of 479 of the 1437 training rows: a batch of 479 is each one's whole shard (a larger one is refused)
    summary, rounds = run(tmp_path, *SMALL_MLP, "algorithm=sync_sgd", "workers=3", "rounds=2", "problem.dtype=float64",
                          f"algorithm.lr={lr}", "algorithm.momentum=0", "algorithm.batch_size=479",
                          f"algorithm.steps_per_round={steps}", "save_iterate=true")
    problem = build(composed(*SMALL_MLP, "problem.dtype=float64"), "problem").build(0, 1)
    w = problem.initial_point()
    objectives = []
    for t in range(2 * steps):
        grad, metrics = problem.evaluate(w)
        if t % steps == 0:
            objectives.append(float(metrics[0]))
        w = w - lr * grad
    objectives.append(float(problem.evaluate(w)[1][0]))
    assert [r["objective"] for r in rounds] == pytest.approx(objectives, rel=1e-12)
    assert [r["comm_rounds"] for r in rounds] == [0, steps, 2 * steps]  # one allreduce per minibatch step
    torch.testing.assert_close(torch.load(tmp_path / "iterate.pt"), w, rtol=0, atol=1e-12)


# ---------------------------------------------------------------- stopping rules
def test_early_stopping_patience_and_target():
    watch = EarlyStopping(StopRule(patience=2, min_delta=0.01))
    # 0.705 and 0.71 do not beat 0.7 by more than 0.01: the second of them ends the run.
    verdicts = [watch.update({"round": t, "test_accuracy": a}) for t, a in enumerate([0.5, 0.7, 0.705, 0.71])]
    assert verdicts == [None, None, None, "early_stopped"]
    target = EarlyStopping(StopRule(target=0.8))
    assert [target.update({"round": t, "test_accuracy": a}) for t, a in enumerate([0.5, 0.79, 0.8])] == \
        [None, None, "target_reached"]
    # a monitor the records do not have would never fire: the first record refuses it, naming the keys there are
    with pytest.raises(MonitorError, match="early_stop.monitor=test_accuracy is not a key of this run's records; "
                                           "set it to one of: objective"):
        EarlyStopping(StopRule(patience=1)).update({"round": 0, "objective": 1.0})
    assert EarlyStopping(StopRule(patience=1)).update({"round": 0, "test_accuracy": float("nan")}) is None


def test_early_stopping_on_a_loss_watches_it_fall():
    """``mode=min``: a loss reaches its target from above and improves by falling (``mode=max`` stopped a test_loss
    run at round 0, its first loss being above the target)."""
    from omegaconf import OmegaConf

    from dane.run_config import stop_rule

    rule = StopRule(monitor="test_loss", target=0.3, mode="min")
    watch = EarlyStopping(rule)
    assert [watch.update({"round": t, "test_loss": v}) for t, v in enumerate([2.3, 0.9, 0.31, 0.3])] == \
        [None, None, None, "target_reached"]
    assert rule.stopped_by("target_reached", {}, {}) == "test_loss <= 0.3"
    patient = EarlyStopping(StopRule(monitor="test_loss", patience=2, min_delta=0.01, mode="min"))
    # 0.995 and 0.99 do not fall below 1.0 by more than 0.01: the second of them ends the run
    assert [patient.update({"round": t, "test_loss": v}) for t, v in enumerate([2.0, 1.0, 0.995, 0.99])] == \
        [None, None, None, "early_stopped"]
    with pytest.raises(ConfigError, match=r"^early_stop.mode must be one of max\|min, got 'down'$"):
        stop_rule(OmegaConf.create({"rounds": 3, "early_stop": {"mode": "down"}}), None)
    assert stop_rule(OmegaConf.create({"rounds": 3}), None).mode == "max"  # a config without the key: as before
    # a resume that turns max into min watches afresh: the max-mode best (a loss's highest) would stop it at once
    before = EarlyStopping(StopRule(monitor="test_loss", patience=2))
    [before.update({"round": t, "test_loss": v}) for t, v in enumerate([2.0, 1.0])]
    after = EarlyStopping(StopRule(monitor="test_loss", patience=2, mode="min"))
    after.load_state_dict(before.state_dict())
    assert [after.update({"round": t, "test_loss": v}) for t, v in enumerate([0.9, 0.8, 0.7], start=2)] == [None] * 3
    same = EarlyStopping(StopRule(monitor="test_loss", patience=2))
    same.load_state_dict(before.state_dict())
    assert (same.best, same.best_round) == (2.0, 0)  # the same mode: the best so far carries on


@pytest.mark.parametrize("early,expected,fix", [
    ({"monitor": "test_loss", "target": 0.3}, "early_stop.monitor=test_loss falls as the run improves, but "
     "early_stop.mode=max (higher is better); add early_stop.mode=min", {"mode": "min"}),
    ({"monitor": "objective", "patience": 2}, "early_stop.monitor=objective falls as the run improves",
     {"mode": "min"}),
    ({"target": 1.5}, "early_stop.target=1.5 for test_accuracy: an accuracy lies in [0, 1]", {"target": 0.97}),
])
def test_an_early_stop_that_would_fire_at_once_or_never_is_refused(early, expected, fix):
    """`early_stop.monitor=test_loss early_stop.target=0.3` without mode=min stopped at round 0 (2.3 >= 0.3) with
    target_reached and exit 0; an accuracy target above 1 ran every round. Both are refused before the run."""
    from omegaconf import OmegaConf

    from dane.run_config import stop_rule

    with pytest.raises(ConfigError, match="^" + re.escape(expected)):
        stop_rule(OmegaConf.create({"rounds": 3, "early_stop": early}), None)
    rule = stop_rule(OmegaConf.create({"rounds": 3, "early_stop": {**early, **fix}}), None)
    assert (rule.monitor, rule.mode, rule.target) == (early.get("monitor", "test_accuracy"), fix.get("mode", "max"),
                                                      fix.get("target", early.get("target")))


# ---------------------------------------------------------------- configs and errors
# the network and inner-optimizer problems (the convex problems have their own tests)
PROBLEMS = sorted(p.stem for p in (CONF_DIR / "problem").glob("*.yaml")
                  if "_target_: dane.problems.neural.NeuralProblemConfig" in p.read_text())


@pytest.mark.parametrize("name", PROBLEMS)
def test_every_problem_config_builds_and_validates(name):
    problem = build(composed(f"problem={name}", f"problem.data.data_dir={SHARED_DATA}"), "problem")
    assert isinstance(problem, NeuralProblemConfig) and problem.name == name
    try:
        problem.check_workers(2)
    except Exception as err:  # CIFAR-10 (and MNIST/admissions without the shared data) are not on these machines
        assert type(err).__name__ == "DataError"
        return
    p = problem.build(0, 2)
    assert p.initial_point().shape == (p.dim,)


@pytest.mark.parametrize("override, message", [
    ("problem.inner_optimizer=rmsprop", "problem.inner_optimizer must be one of sgd|adam|lbfgs, got 'rmsprop'"),
    ("problem.inner_steps=0", "problem.inner_steps must be a positive integer, got 0"),
    ("problem.data.sharding=pathological", "problem.data.sharding must be one of iid|dirichlet"),
    ("problem.device=tpu", "problem.device must be one of auto|cpu|cuda"),
    ("problem.model.name=resnet", "problem.model.name must be one of lenet3|lenet5|mlp|logreg"),
])
def test_bad_problem_values_are_one_line_config_errors(override, message):
    with pytest.raises(ConfigError, match=message.replace("|", r"\|")):
        build(composed("problem=digits_mlp", override), "problem")


BAD_DATA_DIR = runs.command("neural:bad_data_dir", "problem=mnist_lenet5", "problem.data.data_dir={tmp}/neural/no_such_dir",
                            "hydra.run.dir={tmp}/neural/run")


def test_bad_data_dir_exits_2_with_one_line(commands):
    missing = commands.tmp / "neural" / "no_such_dir"
    proc = commands[BAD_DATA_DIR]
    assert proc["rc"] == 2
    lines = proc["stderr"].strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc["stderr"]
    assert lines[0].startswith(f"error: data_dir {missing} does not exist; expected train-images-idx3-ubyte.gz")


# ---------------------------------------------------------------- horovodrun
def horovodrun() -> str | None:
    try:
        import horovod.torch  # noqa: F401
    except ImportError:
        return None
    path = Path(sys.executable).parent / "horovodrun"
    return str(path) if path.exists() else shutil.which("horovodrun")


@pytest.mark.slow
def test_horovodrun_two_ranks_match_the_simulator(tmp_path):
    launcher = horovodrun()
    if launcher is None:
        pytest.skip("horovod is not importable")
    overrides = [*SMALL_MLP, "problem.dtype=float64", "rounds=2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([launcher, "-np", "2", "--gloo", sys.executable, "-m", "experiments.train", *overrides,
                           f"out_dir={tmp_path / 'hvd'}", f"hydra.run.dir={tmp_path / 'hydra'}"],
                          cwd=ROOT, capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    execute(run_spec(composed(*overrides, "workers=2")), str(tmp_path / "sim"))
    real, sim = read_rounds(tmp_path / "hvd"), read_rounds(tmp_path / "sim")
    assert read_summary(tmp_path / "hvd")["backend"] == "horovod"
    assert len(real) == len(sim) == 3
    for a, b in zip(real, sim):
        for key in ("objective", "test_loss", "test_accuracy", "grad_norm"):
            assert a[key] == pytest.approx(b[key], rel=1e-12, abs=1e-14), key
        assert a["bytes_sent"] == b["bytes_sent"] and a["comm_rounds"] == b["comm_rounds"]
