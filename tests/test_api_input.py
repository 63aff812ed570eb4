"""The last bad inputs of the Python API and the simulator's edges (issue 45, item 5): one line naming the value and
the fix, or the value taken as the number it is; a Ctrl-C before round 0 as one line; each worker's records kept once.

Ctrl-C is raised from a hook (the round or the set-up it interrupts), not sent to a process: the simulator turns a
Ctrl-C in the main thread into `ThreadGroup.stop`, which is what the hooks call.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import signal
import time

import numpy as np
import pytest
import scipy.sparse
import torch
from sklearn.datasets import load_breast_cancer

import dane
from dane.loop import worker
from dane.api import algorithm_config
from dane.baselines.fednl import FedNLConfig, hessian_step
from dane.comm import AlphaBeta
from dane.compress import make
from dane.dane import DANE
from dane.errors import ConfigError
from dane.loop.faults import RunInterrupted
from dane.records.results import read_rounds


@pytest.fixture(scope="module")
def problem():
    X, y = load_breast_cancer(return_X_y=True)
    return dane.problems.LogReg((X - X.mean(0)) / X.std(0), y, lam=1e-3)


def one_line(error: pytest.ExceptionInfo) -> str:
    text = str(error.value)
    assert "\n" not in text
    return text


# ------------------------------------------------------------------ values
def test_negative_rounds_is_one_line(problem):
    with pytest.raises(ConfigError) as error:
        dane.fit(problem, "dane", workers=2, rounds=-1)
    assert one_line(error) == "rounds must be an integer >= 0 (0: only evaluate w_0), got -1"


def test_a_relabelled_method_is_one_line(problem):
    with pytest.raises(ConfigError) as error:  # it was a TypeError (name given twice)
        dane.fit(problem, "dane", workers=2, rounds=1, name="foo")
    assert one_line(error) == "name='foo' would label a run of dane as another method's; the method is fit's second " \
                              "argument"


def test_a_problem_given_by_name_is_one_line():
    with pytest.raises(ConfigError) as error:
        dane.fit("ridge_synthetic", "dane", workers=2, rounds=1)
    assert one_line(error).startswith("problem must be a problem object, such as dane.problems.LogReg(X, y, lam=1e-3)")
    assert one_line(error).endswith("got 'ridge_synthetic'")
    with pytest.raises(ConfigError) as error:  # arrays are named by their type, not printed whole
        dane.fit((np.zeros((500, 3)), np.zeros(500)), "dane", workers=2, rounds=1)
    assert one_line(error).endswith("(dane.problems lists them), got a tuple")


def test_arrays_are_the_problems_own_copy_and_default_to_no_intercept():
    """A problem holds the arrays it was given: a later change of the caller's X reached a run only once the cached
    table was evicted; arrays wrapped as data=ArraySource(X, y) take no intercept, as X, y do; text labels are one
    line."""
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((60, 4)), rng.standard_normal(60)
    problem = dane.problems.Ridge(X, y, lam=1e-2)
    before = dane.fit(problem, "gd", workers=2, rounds=3).records
    X *= 3.0
    assert dane.fit(problem, "gd", workers=2, rounds=3).records[-1]["objective"] == before[-1]["objective"]
    assert not np.shares_memory(problem.data.X, X)
    assert dane.problems.Ridge(data=dane.ArraySource(X, y)).fit_intercept is False
    with pytest.raises(ConfigError, match=r"^X and y must hold numbers \(could not convert string to float"):
        dane.problems.LogReg(X, np.where(y > 0, "yes", "no"))



ARRAYS = np.random.default_rng(0).standard_normal((40, 3)), np.arange(40.0)


@pytest.mark.parametrize("make, line", [
    (lambda X, y: dane.problems.Ridge(X + 1j, y),
     "X must hold real numbers, got complex ones; pass X.real or abs(X) as the model needs"),
    (lambda X, y: dane.problems.Ridge(scipy.sparse.csr_matrix(X) * 1j, y),
     "X must hold real numbers, got complex ones; pass X.real or abs(X) as the model needs"),
    (lambda X, y: dane.problems.Ridge(X, y * 1j),
     "y must hold real numbers, got complex ones; pass y.real or abs(y) as the model needs"),
    (lambda X, y: dane.problems.Ridge(X[:0], y[:0]), "X has no rows (shape (0, 3)); give at least one row"),
    (lambda X, y: dane.problems.Ridge(X[:, :0], y), "X has no columns (shape (40, 0)); give at least one feature"),
    (lambda X, y: dane.problems.Ridge(X, y, lamda=0.1),
     "dane.problems.Ridge has no keyword lamda; its keywords: X, y, data, classes, device, dtype, fit_intercept, lam, "
     "local_max_iter, local_solver, local_tol, newton_steps, optimum, seed, standardize_target, svrg_batch_size, "
     "svrg_lr, svrg_passes, svrg_variant"),
    (lambda X, y: dane.problems.LogReg(X, y > 20, loss="softmax"),
     "dane.problems.LogReg takes no loss=: it is problem=logreg, the logistic loss; for another use "
     "dane.problems.Ridge, LogReg or Softmax"),
    (lambda X, y: dane.problems.Softmax(X, y % 3, name="mine"),
     "dane.problems.Softmax takes no name=: it is problem=softmax, the softmax loss; for another use "
     "dane.problems.Ridge, LogReg or Softmax"),
    (lambda X, y: dane.problems.LogReg(X, y > 20, classes=3),  # fitted two classes: problem.classes was not read
     "problem.classes=3 is the class count of problem=softmax; problem=logreg does not read it: drop it, or use "
     "problem=softmax"),
], ids=["complex_X", "complex_sparse_X", "complex_y", "no_rows", "no_columns", "unknown_keyword", "loss", "name",
        "classes_of_logreg"])
def test_arrays_or_keywords_a_problem_cannot_take_are_one_line(make, line):
    """Complex X or y ran on their real parts (NumPy's ComplexWarning); X of no rows was refused by fit as "workers=1
    exceeds the 0 rows of arrays; use fewer workers", of no columns ran a model of no weights; a misspelt keyword, or
    loss= or name=, was a TypeError from LinearModelConfig."""
    with pytest.raises(ConfigError, match=f"^{re.escape(line)}$"):
        make(*ARRAYS)


def test_zero_rounds_evaluate_w0_alone_in_the_api_and_on_the_command_line(problem):
    from dane.experiments.config import run_spec
    from dane.synthetic.sweep import compose_job

    result = dane.fit(problem, "dane", workers=2, rounds=0)
    assert [r["round"] for r in result.records] == [0] and result.records[0]["comm_rounds"] == 0
    w0 = torch.zeros_like(result.w)
    assert torch.equal(result.w, w0)  # no step taken
    assert run_spec(compose_job(("rounds=0",))).control.stop.rounds == 0


@pytest.mark.parametrize("keys, expected", [({"tol": "1e-8"}, "tol must be a number, got '1e-8'"),
                                            ({"tol": float("nan")}, "tol must be a finite number, got nan"),
                                            ({"tol": -1.0}, "tol must be > 0, got -1.0"),
                                            ({"tol_abs": "x"}, "tol_abs must be a number, got 'x'"),
                                            ({"tol_abs": 0.0}, "tol_abs must be > 0, got 0.0")])
def test_the_stop_rule_is_checked_as_on_the_command_line(problem, keys, expected):
    with pytest.raises(ConfigError, match=f"^{re.escape(expected)}$"):
        dane.fit(problem, "gd", workers=2, rounds=2, **keys)


def test_a_used_out_dir_is_refused_and_overwrite_replaces_it(problem, tmp_path):
    dane.fit(problem, "gd", workers=2, rounds=2, out_dir=str(tmp_path))
    with pytest.raises(ConfigError, match=r"already holds a run .* \(dane.fit: overwrite=True\)$"):
        dane.fit(problem, "gd", workers=2, rounds=1, out_dir=str(tmp_path))
    dane.fit(problem, "gd", workers=2, rounds=1, out_dir=str(tmp_path), overwrite=True)
    assert [r["round"] for r in read_rounds(tmp_path)] == [0, 1]


@pytest.mark.parametrize("overwrite", ["no", 0, None])
def test_an_overwrite_that_is_no_boolean_leaves_the_finished_run(problem, tmp_path, overwrite):
    """overwrite="no" read as bool("no") == True and replaced the run: it is refused as the command line refuses
    overwrite=no, and the finished run's files stay byte for byte."""
    dane.fit(problem, "gd", workers=2, rounds=2, out_dir=str(tmp_path))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(ConfigError) as error:
        dane.fit(problem, "dane", workers=2, rounds=1, out_dir=str(tmp_path), overwrite=overwrite)
    assert one_line(error) == f"overwrite must be true or false, got {overwrite!r}"
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert [r["round"] for r in read_rounds(tmp_path)] == [0, 1, 2]


@pytest.mark.parametrize("call, expected", [
    (lambda p: dane.fit(p, 42, workers=2, rounds=2),
     "algorithm must be a method's name, such as 'dane' (conf/algorithm/ lists them), or its config, such as "
     "dane.algorithm_config('dane', mu=0.1), got 42"),
    (lambda p: dane.fit(p, dane.DANEConfig, workers=2, rounds=2),  # the class, not a config
     "algorithm must be a method's name, such as 'dane' (conf/algorithm/ lists them), or its config, such as "
     "dane.algorithm_config('dane', mu=0.1), got a type"),
    (lambda p: dane.fit(p, "gd", workers=2, rounds=2, out_dir=5),
     "out_dir must be a folder's path (a str or a pathlib.Path), or None to write no folder, got 5"),
    (lambda p: dane.fit(p, "gd", workers=2, rounds=2, seed=-1), "seed must be an integer in [0, 2**32 - 1], got -1"),
    # a config built in Python, whose own class leaves its seed to the run's checks
    (lambda p: dane.fit(p, dataclasses.replace(algorithm_config("sync_sgd"), seed=1.5), workers=2, rounds=2),
     "algorithm.seed must be an integer in [0, 2**32 - 1], got 1.5"),
    # "" wrote no folder, silently, though one was asked for
    (lambda p: dane.fit(p, "gd", workers=2, rounds=2, out_dir=""),
     "out_dir must be a folder's path (a str or a pathlib.Path), or None to write no folder, got ''"),
    # OmegaConf's UnsupportedValueType, a traceback of several lines
    (lambda p: dane.fit(p, "dane", workers=2, rounds=2, mu=torch.tensor(0.1)),
     "algorithm.mu must be a number, a string, true or false, got a Tensor; pass the Python value (tensor.item() for "
     "a tensor)"),
], ids=["algorithm_int", "algorithm_class", "out_dir_int", "seed", "config_seed", "out_dir_empty", "tensor_key"])
def test_a_wrong_argument_of_fit_is_one_line(problem, call, expected):
    """Each was a traceback from deep inside the run (an AttributeError in the loop, a TypeError in the checkpoint
    code); now one line naming the argument, as the command line's."""
    with pytest.raises(ConfigError) as error:
        call(problem)
    assert one_line(error) == expected


@pytest.mark.parametrize("make_problem, seed", [
    (lambda seed: dane.problems.Ridge(np.eye(40, 3), np.ones(40), lam=1e-3, seed=seed), -1),
    (lambda seed: dane.problems.RidgeSyntheticConfig(n_samples=200, dim=10, seed=seed), 1.5),
    (lambda seed: dane.problems.RidgeSyntheticConfig(n_samples=200, dim=10, seed=seed), 2**32),
], ids=["arrays_negative", "synthetic_fraction", "synthetic_too_large"])
def test_a_problems_seed_is_checked_as_on_the_command_line(make_problem, seed):
    """A problem's seed numpy cannot take was its ValueError or TypeError mid-run."""
    with pytest.raises(ConfigError) as error:
        dane.fit(make_problem(seed), "gd", workers=2, rounds=2)
    assert one_line(error) == f"problem.seed must be an integer in [0, 2**32 - 1], got {seed!r}"


@pytest.mark.parametrize("workers", [1, 2])  # one worker is the launched kind's path, which told rank 0's folder as JSON
def test_a_path_is_an_out_dir(problem, tmp_path, workers):
    result = dane.fit(problem, "gd", workers=workers, rounds=1, out_dir=tmp_path / "run")
    assert [r["round"] for r in read_rounds(tmp_path / "run")] == [0, 1] == [r["round"] for r in result.records]


def test_numpy_scalars_are_the_numbers_they_hold(problem):
    plain = dane.fit(problem, "local_sgd", workers=2, rounds=3, lr=0.1)
    numpy = dane.fit(problem, "local_sgd", workers=np.int64(2), rounds=np.int64(3), lr=np.float64(0.1))
    zero_d = dane.fit(problem, "local_sgd", workers=2, rounds=3, lr=np.array(0.1))
    for run in (numpy, zero_d):
        assert [r["objective"] for r in run.records] == [r["objective"] for r in plain.records]
        assert torch.equal(run.w, plain.w)


def test_a_numpy_array_for_a_number_is_one_line(problem):
    with pytest.raises(ConfigError) as error:
        dane.fit(problem, "dane", workers=2, rounds=2, mu=np.array([0.1, 0.2]))
    assert one_line(error) == "algorithm.mu must be a number, got an array of shape (2,)"


def test_alpha_is_fednls_and_the_simulators_latency_is_sim_alpha(problem):
    """``alpha=`` is FedNL's Hessian learning rate (the simulator's cost model keeps its default latency); the
    latency is ``sim_alpha=``; an algorithm without an alpha refuses it, naming sim_alpha=."""
    keys = {"compressor": "topk:40", "variant": "ls"}  # a compressor under which α changes the learned Hessians
    half = dane.fit(problem, "fednl", workers=2, rounds=4, alpha=0.5, **keys)
    built = dane.fit(problem, algorithm_config("fednl", alpha=0.5, **keys), workers=2, rounds=4)
    whole = dane.fit(problem, "fednl", workers=2, rounds=4, alpha=1.0, **keys)
    assert [r["objective"] for r in half.records] == [r["objective"] for r in built.records]
    assert [r["objective"] for r in half.records] != [r["objective"] for r in whole.records]
    assert half.summary["alpha"] == AlphaBeta().alpha == 5.5e-4
    assert dane.fit(problem, "dane", workers=2, rounds=1, sim_alpha=0.01).summary["alpha"] == 0.01
    with pytest.raises(ConfigError) as error:
        dane.fit(problem, "dane", workers=2, rounds=2, alpha=1e-3)
    assert one_line(error).endswith("its keys: eta, mu, safeguard; the simulator's allreduce cost is fit's sim_alpha=")
    with pytest.raises(ConfigError) as error:
        dane.fit(problem, "dane", workers=2, rounds=2, sim_alpha=-1)
    assert one_line(error) == "sim_alpha must be >= 0, got -1"


def test_fednl_alpha_beyond_the_papers_bound_is_refused(problem):
    """α ≤ 1 for every compressor, α ≤ 1/(ω + 1) for an unbiased one (Safaryan et al. 2022): RandK with k = 5 of the
    packed triangle of d = 31 (496 entries) has ω = 496/5 − 1, so the bound is 5/496."""
    with pytest.raises(ConfigError) as error:
        FedNLConfig(alpha=3)
    assert one_line(error).startswith("algorithm.alpha must be in (0, 1], got 3: FedNL's theory")
    d = 31
    assert hessian_step(make("randk:5"), d, None) == pytest.approx(5 / 496, rel=1e-15)
    assert hessian_step(make("randk:5"), d, 5 / 496) == 5 / 496
    with pytest.raises(ConfigError) as error:
        hessian_step(make("randk:5"), d, 0.5)
    assert one_line(error).startswith("algorithm.alpha must be <= 1/(omega + 1) = 0.01008 for the unbiased compressor "
                                      "randk:5 on d = 31")
    assert hessian_step(make("topk:5"), d, None) == 1.0 and hessian_step(make("topk:5"), d, 0.3) == 0.3


# ------------------------------------------------------------------ the summary's clock
def test_the_summary_names_its_clock(problem):
    assert dane.fit(problem, "dane", workers=2, rounds=1).summary["time_s_clock"] == "simulated"
    assert dane.fit(problem, "dane", workers=1, rounds=1).summary["time_s_clock"] == "wall"


# ------------------------------------------------------------------ Ctrl-C
def interrupted_line(run, code: int = 130) -> tuple[str, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(RunInterrupted) as stopped:
        run()
    assert stopped.value.code == code
    return str(stopped.value), err.getvalue()


def test_ctrl_c_before_round_0_names_no_removed_folder(problem, monkeypatch, tmp_path):
    """Stopped at round 0's first collective, the run wrote no record and removed the folder it made: the line says
    only "interrupted"."""
    step = DANE.step
    monkeypatch.setattr(DANE, "step", lambda self: (self.comm.group.stop(), step(self))[1])
    out = tmp_path / "run"
    line, err = interrupted_line(lambda: dane.fit(problem, "dane", workers=2, rounds=3, out_dir=str(out)))
    assert line == "interrupted" and err == "interrupted\n" and not out.exists()


def test_ctrl_c_after_a_record_names_the_records(problem, monkeypatch, tmp_path):
    step, calls = DANE.step, []

    def stop_in_round_2(self):
        if self.comm.rank == 0:
            calls.append(1)
            if len(calls) == 3:
                self.comm.group.stop()
        return step(self)

    monkeypatch.setattr(DANE, "step", stop_in_round_2)
    out = tmp_path / "run"
    line, _ = interrupted_line(lambda: dane.fit(problem, "dane", workers=2, rounds=5, out_dir=str(out)))
    assert line == f"interrupted after round 1; records so far are in {out}"
    assert len((out / "rounds.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize("at", [1, 3])
def test_ctrl_c_in_one_process_is_one_line_and_keeps_the_records(problem, monkeypatch, tmp_path, at):
    """One process (workers=1, no simulator): a KeyboardInterrupt in round 2's step (at=3) ends the rounds as the
    simulator's Ctrl-C does, records kept and the summary saying interrupted; in round 0's (at=1), before any
    record, one line and nothing left."""
    step, calls = DANE.step, []

    def interrupt(self):
        calls.append(1)
        if len(calls) == at:
            raise KeyboardInterrupt
        return step(self)

    monkeypatch.setattr(DANE, "step", interrupt)
    out = tmp_path / "run"
    line, err = interrupted_line(lambda: dane.fit(problem, "dane", workers=1, rounds=5, out_dir=str(out)))
    if at == 1:
        assert line == "interrupted before round 0; nothing was written" and not out.exists()
        return
    assert line == f"interrupted after round 1; records so far are in {out}" and err == line + "\n"
    assert len((out / "rounds.jsonl").read_text().splitlines()) == 2  # rounds 0 and 1, as the simulator's above
    assert json.loads((out / "summary.json").read_text())["status"] == "interrupted"


@pytest.mark.parametrize("workers", [2, 1])
def test_sigterm_stops_a_run_as_ctrl_c_does_and_names_the_signal(problem, monkeypatch, tmp_path, workers):
    """A scheduler's time limit or a kill (SIGTERM) in round 2, in the simulator (the signal reaches the main thread
    while the worker threads run) or in one process: the records kept, the summary interrupted and naming the
    signal, one line and exit status 143 (Python's default ended the process silently, with no summary)."""
    def not_taken(signum, frame):
        raise AssertionError("the run did not take SIGTERM")

    monkeypatch.setattr(signal, "signal", signal.signal)  # put back whatever the test leaves
    previous = signal.signal(signal.SIGTERM, not_taken)  # not Python's default: that would end pytest
    step, calls = DANE.step, []

    def sigterm_in_round_2(self):
        if self.comm.rank == 0:
            calls.append(1)
            if len(calls) == 3:
                os.kill(os.getpid(), signal.SIGTERM)
                # the handler runs in the main thread: in one process here, in the simulator while it waits for the
                # worker threads, which stop at their next collective once it has run
                group, deadline = getattr(self.comm, "group", None), time.monotonic() + 10
                while time.monotonic() < deadline and not (group is not None and group.interrupted):
                    time.sleep(0.01)
        return step(self)

    monkeypatch.setattr(DANE, "step", sigterm_in_round_2)
    out = tmp_path / "run"
    try:
        line, err = interrupted_line(lambda: dane.fit(problem, "dane", workers=workers, rounds=5, out_dir=str(out)),
                                     code=143)
        assert signal.getsignal(signal.SIGTERM) is not_taken  # put back after the run
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert line == f"interrupted by SIGTERM after round 1; records so far are in {out}" and err == line + "\n"
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["status"], summary["stopped_by"], summary["rounds"]) == ("interrupted", "SIGTERM", 1)
    assert [r["round"] for r in read_rounds(out)] == [0, 1]
    assert not (out / ".lock").exists()


@pytest.mark.parametrize("where", ["stacked problem", "algorithm"])
def test_ctrl_c_in_fednls_batched_set_up_is_one_line(problem, monkeypatch, tmp_path, where):
    """40 workers: FedNL's batched path (``sim.batched=auto``).  A Ctrl-C while its stacked clients are built, or
    while the algorithm is (inside the run, before round 0's record), ends in one line and status 130."""
    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(FedNLConfig, "build_stacked" if where == "stacked problem" else "build", ctrl_c)
    out = tmp_path / "run"
    line, err = interrupted_line(lambda: dane.fit(problem, "fednl", workers=40, rounds=3, out_dir=str(out)))
    expected = "interrupted during set-up, before round 0; nothing was written" if where == "stacked problem" \
        else "interrupted"
    assert line == expected and err == f"{expected}\n" and not out.exists()


# ------------------------------------------------------------------ memory
def test_simulated_workers_keep_the_records_once(problem, monkeypatch):
    """Rank 0 keeps every record (the run's); the other simulated workers keep only their last."""
    loops, drive = [], worker.drive
    monkeypatch.setattr(worker, "drive", lambda loop, callbacks: (loops.append(loop), drive(loop, callbacks))[1])
    result = dane.fit(problem, "dane", workers=3, rounds=5)
    by_rank = {loop.comm.rank: loop for loop in loops}   # the threads reach drive in any order
    kept = {rank: (len(loop.result.records), len(loop.seen)) for rank, loop in by_rank.items()}
    assert kept == {0: (6, 6), 1: (1, 1), 2: (1, 1)}
    assert [r["round"] for r in result.records] == [0, 1, 2, 3, 4, 5]
    assert by_rank[1].result.records[0]["objective"] == result.records[-1]["objective"]


def test_a_yaml_of_ones_own_without_a_target_is_one_line():
    """A config group node that names no ``_target_`` (a user's algorithm yaml missing it) is refused in one line
    naming the fix; it was a Hydra traceback ("Missing key run_job")."""
    from omegaconf import OmegaConf

    from dane.api import build
    from dane.errors import ConfigError

    cfg = OmegaConf.create({"algorithm": {"name": "mine", "lr": 0.1}})
    with pytest.raises(ConfigError, match=r"^algorithm=mine names no _target_: its yaml needs _target_: "
                                          r"<module>\.<its config class> \(docs/extending\.md\)$"):
        build(cfg, "algorithm")


@dataclasses.dataclass(frozen=True)
class OwnStepConfig(dane.algorithm.AlgorithmConfig):
    """A config of one's own as docs/extending.md's first version wrote it: a ValueError, a comparison that text or
    a bool would reach."""

    name: str = "own_step"
    lr: float = 0.1
    steps: int = 1
    nesterov: bool = False
    label: str | None = None

    def __post_init__(self):
        if not self.lr > 0:
            raise ValueError(f"algorithm.lr must be > 0, got {self.lr}")
        if self.steps > 9:
            raise ValueError(f"at most 9 steps, got {self.steps}")


@pytest.mark.parametrize("given, line", [
    ({"lr": "abc"}, "algorithm.lr must be a number, got 'abc'"),  # was TypeError("'>' not supported ...")
    ({"lr": True}, "algorithm.lr must be a number, got True"),    # was taken as lr=1
    ({"lr": None}, "algorithm.lr must be a number, got None"),
    ({"steps": 1.5}, "algorithm.steps must be an integer, got 1.5"),
    ({"steps": True}, "algorithm.steps must be an integer, got True"),
    ({"nesterov": "yes"}, "algorithm.nesterov must be true or false, got 'yes'"),
    ({"label": 3}, "algorithm.label must be a string, got 3"),
    ({"lr": -1}, "algorithm.lr must be > 0, got -1"),             # was algorithm: ValueError('algorithm.lr ...')
    ({"steps": 10}, "algorithm=own_step: at most 9 steps, got 10"),  # a message without the key: the group names it
])
def test_a_config_of_ones_own_refuses_a_value_of_the_wrong_kind_in_one_line(given, line):
    """Each value given for a field annotated float, int, bool or str is of that kind before the dataclass is built
    (as the package's configs check theirs, `dane.checks`), and a ValueError of its own checks is its message."""
    from omegaconf import OmegaConf

    from dane.api import build

    cfg = OmegaConf.create({"algorithm": {"_target_": f"{__name__}.OwnStepConfig", "name": "own_step", **given}})
    with pytest.raises(ConfigError) as error:
        build(cfg, "algorithm")
    assert one_line(error) == line


def test_a_config_of_ones_own_takes_the_values_its_annotations_allow():
    """An int for a float, null for an Optional, and the values the annotations name, built as given."""
    from omegaconf import OmegaConf

    from dane.api import build

    given = {"lr": 2, "steps": 3, "nesterov": True, "label": None}
    cfg = OmegaConf.create({"algorithm": {"_target_": f"{__name__}.OwnStepConfig", "name": "own_step", **given}})
    assert build(cfg, "algorithm") == OwnStepConfig(lr=2, steps=3, nesterov=True, label=None)


@dataclasses.dataclass(frozen=True)
class OwnProblemConfig(dane.ProblemConfig):
    """A problem config of one's own, as docs/extending.md writes one: its bases' annotations name types that only a
    type checker imports, which `typing.get_type_hints` could not resolve."""

    name: str = "own_problem"
    kappa: float = 10.0
    dim: int = 3


@pytest.mark.parametrize("given, line", [
    ({"kappa": "abc"}, "problem.kappa must be a number, got 'abc'"),  # was a TypeError from inside build(), exit 1
    ({"dim": 2.5}, "problem.dim must be an integer, got 2.5"),
])
def test_a_problem_config_of_ones_own_refuses_a_value_of_the_wrong_kind_in_one_line(given, line):
    """The check of `test_a_config_of_ones_own_refuses_a_value_of_the_wrong_kind_in_one_line` skipped every
    `dane.ProblemConfig` subclass: the hints of its package base did not resolve, and the check gave up."""
    from omegaconf import OmegaConf

    from dane.api import build

    cfg = OmegaConf.create({"problem": {"_target_": f"{__name__}.OwnProblemConfig", "name": "own_problem", **given}})
    with pytest.raises(ConfigError) as error:
        build(cfg, "problem")
    assert one_line(error) == line
    assert build(OmegaConf.create({"problem": {"_target_": f"{__name__}.OwnProblemConfig", "kappa": 2}}),
                 "problem") == OwnProblemConfig(kappa=2)


def test_a_data_yaml_of_ones_own_whose_module_is_not_on_the_path_is_one_line_naming_the_fix():
    """``data=mine`` of a --config-dir reaches the problem as ``data: ${data}``: its ``_target_`` was not looked at
    before Hydra's, whose line ("Error locating target ..., set env var HYDRA_FULL_ERROR=1") named no fix."""
    from omegaconf import OmegaConf

    from dane.api import build

    cfg = OmegaConf.create({"data": {"_target_": "dane_nowhere_rows.rows", "n_rows": 3, "name": "rows"},
                            "problem": {"_target_": "dane.problems.linear_models.LinearModelConfig", "name": "ridge",
                                        "data": "${data}"}})
    with pytest.raises(ConfigError) as error:
        build(cfg, "problem")
    assert one_line(error) == ("data=rows: data._target_=dane_nowhere_rows.rows names module dane_nowhere_rows, which "
                               "is not on the Python path; put the folder holding dane_nowhere_rows on PYTHONPATH, "
                               "e.g. PYTHONPATH=. dane train ... from that folder")


def noisy_rows(n_rows: int = 4, noise: float = 0.1, name: str = "noisy_rows", clip: float | None = None):
    """A data set of one's own as docs/extending.md writes one: a function whose parameters are annotated."""
    return dane.ArraySource(np.eye(n_rows, 2), np.arange(float(n_rows)) * noise, name=name)


@pytest.mark.parametrize("given, line", [
    ({"n_rows": "abc"}, "data.n_rows must be an integer, got 'abc'"),  # was "problem: UFuncTypeError(<ufunc ...)"
    ({"noise": "x"}, "data.noise must be a number, got 'x'"),
    ({"name": 3}, "data.name must be a string, got 3"),
    ({"clip": "x"}, "data.clip must be a number, got 'x'"),
])
def test_a_data_function_of_ones_own_refuses_a_value_of_the_wrong_kind_in_one_line(given, line):
    """The annotations of a function a ``data`` yaml of one's own names are checked as a config dataclass's are."""
    from omegaconf import OmegaConf

    from dane.api import build

    def composed(**data):
        return OmegaConf.create({"data": {"_target_": f"{__name__}.noisy_rows", **data},
                                 "problem": {"_target_": "dane.problems.linear_models.LinearModelConfig",
                                             "name": "ridge", "data": "${data}"}})

    with pytest.raises(ConfigError) as error:
        build(composed(**given), "problem")
    assert one_line(error) == line
    assert build(composed(n_rows=3, noise=1, clip=None), "problem").data.X.shape == (3, 2)


def test_every_public_name_is_there():
    """Each name `dane.__all__` lists resolves (two pointed at a module that had moved, and raised)."""
    for name in dane.__all__:
        assert getattr(dane, name) is not None, name
    assert dane.LocalSolver.__module__ == "dane.numerics.local_solvers" and "svrg" in dane.LOCAL_SOLVERS


def test_dir_lists_each_public_name_once_and_no_internals():
    """dir(dane) listed Algorithm and Problem twice once read (globals() and __all__), and the module's own imports
    (CHECKOUT, importlib, lazy_names)."""
    dane.Algorithm, dane.Problem, dane.fit  # noqa: B018 (read: each is now in the module's globals too)
    listed = dir(dane)
    assert len(listed) == len(set(listed))
    assert [name for name in listed if not name.startswith("__")] == sorted(dane.__all__)
    assert not {"CHECKOUT", "importlib", "lazy_names", "layout", "annotations", "_PUBLIC", "_public"} & set(listed)


def test_a_problem_of_ones_own_deals_its_rows_by_the_public_names():
    """Only dane.shards (iid) was public; docs/own_data.md sent other sources to dane.data.sharding.column_shards.
    dane.ShardingKeys deals by any data.sharding scheme, dane.column_shards by a client column, as the sources do."""
    from dane.data import sharding

    assert dane.ShardingKeys is sharding.ShardingKeys and dane.column_shards is sharding.column_shards
    y = np.array([0, 1, 0, 1, 1, 0, 1, 0, 1, 1], dtype=float)
    site = np.array(["b", "a", "b", "c", "a", "c", "b", "a", "c", "b"])
    keys = dane.ShardingKeys(sharding="column", client_column="site")
    keys.check_sharding(columns="a column of my data")
    rows, notes = keys.deal(y, 3, seed=0, clients=site)
    assert [r.tolist() for r in rows] == [[1, 4, 7], [0, 2, 6, 9], [3, 5, 8]]
    assert notes[1:] == ["worker 0 (site=a): 3 rows; 0: 1, 1: 2", "worker 1 (site=b): 4 rows; 0: 2, 1: 2",
                         "worker 2 (site=c): 3 rows; 0: 1, 1: 2"]
    shards, values = dane.column_shards(site, 3, name="site")
    assert [r.tolist() for r in shards] == [r.tolist() for r in rows] and values == ["a", "b", "c"]
    rows, notes = dane.ShardingKeys(sharding="dirichlet", alpha=0.3).deal(y, 2, seed=0)
    assert [r.tolist() for r in rows] == [[1, 4, 6, 9], [0, 2, 3, 5, 7, 8]]
    assert notes == ["sharding: dirichlet (alpha=0.3) on labels, seed 0: 2 workers, rows 4, 6", "worker 0: 4 rows; 1: 4",
                     "worker 1: 6 rows; 0: 4, 1: 2"]


@pytest.mark.parametrize("name", ["../config", "../problem/ridge"])
def test_an_algorithm_name_is_no_path_into_the_configs(problem, name):
    """'../config' read conf/config.yaml as an algorithm and was refused as a yaml that "names no _target_"."""
    with pytest.raises(ConfigError, match=f"^algorithm {re.escape(repr(name))} is unknown; choose one of: acc_sdane, "):
        dane.fit(problem, name, workers=2, rounds=1)


@pytest.mark.parametrize("call, line", [
    (lambda: dane.shards(10, 0), "workers must be a positive integer, got 0"),  # numpy's ValueError
    (lambda: dane.shards(10, "2"), "workers must be a positive integer, got '2'"),  # a TypeError
    (lambda: dane.shards(10, 2.0), "workers must be a positive integer, got 2.0"),  # dealt, as fit refuses
    (lambda: dane.shards(3, 5), "workers=5 exceeds the 3 training samples; use fewer workers or more data"),  # empty
    (lambda: dane.shards("10", 2), "n_rows must be a positive integer, got '10'"),  # numpy's AxisError
    (lambda: dane.shards(np.arange(10), 2), "n_rows must be a number, got an array of shape (10,)"),  # unhashable
    (lambda: dane.shards(10, 2, -1), "seed must be an integer in [0, 2**32 - 1], got -1"),  # numpy's ValueError
    (lambda: dane.shards(10, 2, 1.5), "seed must be an integer in [0, 2**32 - 1], got 1.5"),  # numpy's TypeError
    (lambda: dane.ShardingKeys(sharding="dirichlet").deal(np.zeros(10), 2.0, seed=0),
     "workers must be a positive integer, got 2.0"),  # a TypeError from the Dirichlet draw
    (lambda: dane.ShardingKeys().deal(np.zeros(10), 2, seed=-1), "seed must be an integer in [0, 2**32 - 1], got -1"),
    (lambda: dane.ShardingKeys(sharding="dirichlet", alpha="x").deal(np.zeros(10), 2, seed=0),
     "data.alpha must be a number, got 'x'"),  # a TypeError comparing it
    (lambda: dane.ShardingKeys(sharding="column", client_column="site").deal(np.zeros(10), 2, seed=0),
     "data.sharding=column deals by each row's client: pass deal(..., clients=) the values of "
     "data.client_column=site, one per row"),  # an AssertionError
    (lambda: dane.column_shards(["a", "b", "a"], "2"),
     "workers must be a positive integer, got '2'"),  # "has 2 distinct values ... but workers=2; set workers=2"
], ids=["shards_zero", "shards_text", "shards_float", "shards_too_many", "shards_rows_text", "shards_rows_array",
        "shards_seed_negative", "shards_seed_fraction", "deal_float", "deal_seed", "deal_alpha", "deal_no_clients",
        "column_shards_text"])
def test_a_wrong_argument_of_the_public_dealers_is_one_line(call, line):
    """Each was a traceback from NumPy or the dealer (or, for 2.0 workers and 5 workers of 3 rows, shards dealt)."""
    with pytest.raises(ConfigError, match=f"^{re.escape(line)}$"):
        call()


@pytest.mark.parametrize("n, workers, seed", [(10, 3, 0), (12, 4, 5), (101, 7, 3), (5, 5, 1), (9, 1, 2)])
def test_deal_iid_gives_the_rows_a_run_gives_each_worker(n, workers, seed):
    """ShardingKeys().deal's iid dealt rows by a permutation of its own (shard_indices'), other rows than
    dane.shards, the rows a run of a linear model gives each worker for the same seed."""
    rows, notes = dane.ShardingKeys().deal(np.zeros(n), workers, seed=seed)
    assert [r.tolist() for r in rows] == [r.tolist() for r in dane.shards(n, workers, seed)] and notes == []
    with pytest.raises(ConfigError, match=r"^workers=6 exceeds the 5 training samples"):
        dane.ShardingKeys().deal(np.zeros(5), 6, seed=seed)


@pytest.mark.parametrize("config", ["DANEConfig", "InexactDANEConfig"])
def test_a_safeguard_that_is_no_boolean_is_refused_by_the_config_object(config):
    """The config object checks ``safeguard`` as the command line does: a string 'off' ran with it on."""
    from dane.baselines.inexact_dane import InexactDANEConfig

    make_config = dane.DANEConfig if config == "DANEConfig" else InexactDANEConfig
    with pytest.raises(ConfigError, match=r"^algorithm.safeguard must be true or false, got 'off'$"):
        make_config(safeguard="off")


def test_a_singular_local_model_names_only_the_running_methods_keys():
    """The problem names its own remedy and the run appends the method's: OSA has no μ (no keys at all), so its line
    names problem.lam only; DANE's adds algorithm.mu.  A key OSA lacks: "it takes none", not an empty list."""
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((6, 4)), rng.standard_normal(6)   # 3 shards of 2 rows in d = 4: singular
    fact = "the local Hessian plus 0.0 I is not positive definite on this shard; use problem.lam > 0"
    for algorithm, remedy in (("osa", ""), ("dane", " or algorithm.mu > 0")):
        with pytest.raises(ConfigError) as error:
            dane.fit(dane.problems.Ridge(X, y, lam=0.0), algorithm, workers=3, rounds=2)
        assert one_line(error) == fact + remedy
    with pytest.raises(ConfigError) as error:
        dane.fit(dane.problems.Ridge(X, y, lam=0.0), "osa", workers=3, rounds=2, mu=0.1)
    assert one_line(error) == "algorithm osa has no key(s) mu; it takes none"


SINGULAR = "the local Hessian plus {} I is not positive definite on this shard; use problem.lam > 0"


@pytest.mark.parametrize("algorithm, keys, lam, line", [
    ("fedprox", {"mu": 0.0, "local_solver": "cholesky"}, 0.0, SINGULAR.format(0.0) + " or algorithm.mu > 0"),
    ("fedavg", {"local_solver": "cholesky"}, 0.0, SINGULAR.format(0.0) + " or algorithm.mu > 0"),
    ("feddane", {"mu": 0.0}, 0.0, SINGULAR.format(0.0) + " or algorithm.mu > 0"),
    ("disco", {"mu": 0.0}, 0.0, SINGULAR.format(0.0) + " or algorithm.mu > 0"),
    # λ > 0 is checked (S-DANE) or refused at 0 with an exact solve (FedRed): a λ below round-off is what fails
    ("sdane", {"lam": 1e-300, "local_solver": "cholesky"}, 0.0, SINGULAR.format(1e-300) + " or a larger algorithm.lam"),
    ("acc_sdane", {"lam": 1e-300, "local_solver": "cholesky"}, 0.0,
     SINGULAR.format(1e-300) + " or a larger algorithm.lam"),
    ("fedred", {"lam": 1e-300, "local_solver": "cholesky"}, 0.0, SINGULAR.format(1e-300) + " or a larger algorithm.lam"),
    # the x-update leaves the regulariser to the z-update: problem.lam = 1 does not shift it, ρ does
    ("admm", {"rho": 1e-300}, 1.0, "the local Hessian without the regulariser (ADMM's z-update holds it) plus 1e-300 I "
                                   "is not positive definite on this shard; use a larger algorithm.rho"),
    # no key of DINGO's shifts H_i (φ regularizes its third vector only); it raised LinAlgError, a traceback
    ("dingo", {}, 0.0, "the local Hessian is not positive definite on this shard (DINGO's H_i^-1 g is a Cholesky "
                       "solve); use problem.lam > 0"),
])
def test_a_singular_local_model_names_the_key_of_each_method_that_shifts_it(algorithm, keys, lam, line):
    """Each method whose local system is a factorization names the key of its own that shifts that Hessian (its
    ``singular_remedy``), after the problem's (GIANT's CG, InexactDANE's SVRG or CG and the first-order methods' steps
    factor nothing).  The lines named problem.lam alone, ADMM's though its x-update leaves the regulariser out, and
    DINGO's Cholesky solve raised a LinAlgError traceback."""
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((6, 4)), rng.standard_normal(6)   # 3 shards of 2 rows in d = 4: singular
    with pytest.raises(ConfigError) as error:
        dane.fit(dane.problems.Ridge(X, y, lam=lam), algorithm, workers=3, rounds=2, **keys)
    assert one_line(error) == line
