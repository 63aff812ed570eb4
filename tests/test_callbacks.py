"""The one run loop (`dane.loop.driver.drive`) and the callbacks around a round (`dane.loop.callbacks`): the fixed points
in their order, what each callback adds, and a round object that nothing sets attributes on."""
from __future__ import annotations

import json
import time
import math

import pytest
import torch

from dane.baselines import GDConfig
from dane.loop.callbacks import (NOTE_CHARS, SHOWN_NOTES, Callback, Checkpoints, ClosingLine, Collect, Display, Records,
                                 problem_ran, shown_notes)
from dane.comm import LocalCommunicator
from dane.loop.driver import Loop, drive
from dane.problems import RidgeSyntheticConfig
from dane.loop.reference import attach_one
from dane.loop.runner import run
from dane.loop.stopping import StopRule
from dane.loop.spec import Communication, RunControl, RunSpec

ROUNDS = 4


def spec(**control) -> RunSpec:
    return RunSpec(problem=RidgeSyntheticConfig(n_samples=200, dim=5), algorithm=GDConfig(),
                   comm=Communication(workers=1), control=RunControl(**{"stop": StopRule(rounds=ROUNDS), **control}))


def loop_for(run_spec: RunSpec, out_dir=None, checkpoint_every: int = 0) -> Loop:
    comm = LocalCommunicator()
    run_spec.problem.prepare()
    problem = run_spec.problem.build(0, 1, torch.float64)
    attach_one(run_spec.problem, problem, comm)
    return Loop(run_spec, run_spec.algorithm.build(problem, comm), comm, out_dir, problem,
                checkpoint_every=checkpoint_every)


class Events(Callback):
    """Writes down every call the loop makes, with the round of records and checkpoints."""

    def __init__(self, fail_at: int | None = None):
        self.events: list[str] = []
        self.fail_at = fail_at

    def on_open(self, loop):
        self.events.append("open")

    def on_start(self, loop):
        self.events.append("start")

    def on_round(self, loop, record):
        self.events.append(f"round {record['round']}")
        if record["round"] == self.fail_at:
            raise RuntimeError("lost")

    def on_checkpoint(self, loop, state):
        self.events.append(f"checkpoint {state['round']}")

    def on_rounds_end(self, loop):
        self.events.append("rounds end")

    def on_end(self, loop, summary):
        self.events.append("end")
        summary["seen_by_events"] = len(loop.seen)

    def on_close(self, loop):
        self.events.append("close")


def test_the_loop_calls_every_callback_at_its_fixed_points_in_order():
    events = Events()
    summary = drive(loop_for(spec(), checkpoint_every=2), [events])
    # a checkpoint follows rounds 1 and 3 (the state to continue at rounds 2 and 4), none after the cap
    assert events.events == ["open", "start", "round 0", "round 1", "checkpoint 2", "round 2", "round 3",
                             "checkpoint 4", "round 4", "rounds end", "end", "close"]
    assert summary["seen_by_events"] == ROUNDS + 1 and summary["rounds"] == ROUNDS


def test_a_failing_round_still_ends_the_rounds_and_closes_every_callback():
    events = Events(fail_at=2)
    with pytest.raises(RuntimeError, match="lost"):
        drive(loop_for(spec()), [events])
    assert events.events == ["open", "start", "round 0", "round 1", "round 2", "rounds end", "close"]


def test_the_summary_is_the_last_record_and_the_result_of_the_run():
    loop = loop_for(spec())
    summary = drive(loop, [])
    last = loop.records[-1]
    assert summary["rounds"] == last["round"] == ROUNDS and summary["status"] == loop.status == "max_rounds"
    assert summary["final_objective"] == last["objective"] and summary["final_suboptimality"] == last["suboptimality"]
    optimum = last["objective"] - last["suboptimality"]
    assert summary["final_relative_suboptimality"] == pytest.approx(last["suboptimality"] / abs(optimum), rel=1e-15)
    assert summary["total_bytes"] == last["bytes_sent"] == 0 and summary["comm_rounds"] == last["comm_rounds"]
    assert summary["stopped_by"] == loop.result.stopped_by and summary["stopped_by"].startswith(f"rounds = {ROUNDS}")
    assert summary["backend"] == "local" and summary["workers"] == 1


def test_run_returns_the_iterate_and_the_reason_and_sets_nothing_on_the_algorithm():
    loop = loop_for(spec(stop=StopRule(rounds=50, tol=1e-3)))
    before = set(vars(loop.algo))
    result = run(loop.algo, loop.spec.control.stop)
    records, status = result  # unpacks as before
    assert status == result.status == "converged" and records is result.records
    assert set(vars(loop.algo)) == before  # no reported_iterate, no stopped_by
    # the run stopped on round t's metrics, after step t moved on: the result holds w_t, the record's iterate
    assert not torch.equal(result.iterate, loop.algo.iterate)
    assert result.stopped_by == "suboptimality <= 0.001 x |O*|"


def test_records_and_collect_write_what_the_run_returns(tmp_path, capsys):
    run_spec = spec(quiet=False, config_text="a: 1\n")
    loop, collect = loop_for(run_spec, str(tmp_path)), {}
    summary = drive(loop, [Collect(collect), Records(run_spec.control), Display(run_spec.control),
                           ClosingLine()])
    lines = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    assert lines == collect["records"] == loop.records and len(lines) == ROUNDS + 1
    written = json.loads((tmp_path / "summary.json").read_text())
    assert {k: v for k, v in written.items() if k != "provenance"} == summary == collect["summary"]
    assert (tmp_path / "config.yaml").read_text() == "a: 1\n" and not (tmp_path / ".lock").exists()
    assert torch.equal(collect["w"], loop.result.iterate)
    out, err = capsys.readouterr()
    assert err.count("stop: ") == 1 and out.splitlines()[-1].startswith(f"gd on ridge_synthetic, 1 worker(s), local: "
                                                                        f"max_rounds (rounds = {ROUNDS}")


@pytest.mark.parametrize("control, lines", [({"progress": "none"}, 1), ({"quiet": True}, 0),
                                            ({"progress": "none", "quiet": True}, 0)])
def test_progress_none_keeps_the_closing_line_and_quiet_says_nothing(capsys, control, lines):
    """``dane simulate``'s defaults (progress=none) print how each run ended and where it wrote; quiet nothing."""
    from dane.loop.callbacks import worker_callbacks

    run_spec = spec(**control)
    loop = loop_for(run_spec)
    drive(loop, worker_callbacks(run_spec, loop))
    out, err = capsys.readouterr()
    assert err == "" and len(out.splitlines()) == lines
    assert all(line.startswith("gd on ridge_synthetic, 1 worker(s)") for line in out.splitlines())


def test_the_configs_notes_follow_the_problems_on_stderr_and_in_the_summary(capsys):
    """`RunControl.notes` (a launch's ignored ``sim.*`` keys: `dane.run_config.ignored_sim_notes`) come after the
    problem's notes: rank 0 prints each as a ``note:`` line before round 0, the summary's ``notes`` keeps them;
    quiet=true prints none and keeps them."""
    from dane.loop.callbacks import worker_callbacks

    said = "sim.slowdown is the simulator's (dane simulate); a launched run ignores it"
    for quiet in (False, True):
        run_spec = spec(notes=(said,), quiet=quiet)
        loop = loop_for(run_spec)
        loop.problem.notes = ["the problem's note"]  # as a data set's or a solver's choice is
        summary = drive(loop, worker_callbacks(run_spec, loop))
        err = capsys.readouterr().err
        assert summary["notes"] == ["the problem's note", said]
        assert [line for line in err.splitlines() if line.startswith("note: ")] == \
            ([] if quiet else [f"note: {note}" for note in summary["notes"]])


def test_checkpoints_resume_the_run_at_its_committed_round_as_if_never_stopped(tmp_path):
    whole = loop_for(spec())
    drive(whole, [])
    first = spec(checkpoint_every=2)
    loop = loop_for(first, str(tmp_path), checkpoint_every=2)
    drive(loop, [Checkpoints(first), Records(first.control)])
    resumed_spec = spec(checkpoint_every=2, resume=str(tmp_path))
    resumed = loop_for(resumed_spec, str(tmp_path), checkpoint_every=2)
    summary = drive(resumed, [Checkpoints(resumed_spec), Records(resumed_spec.control)])
    assert resumed.resumed_from == summary["resumed_from_round"] == ROUNDS  # the last committed round
    keys = ("round", "objective", "suboptimality", "grad_norm", "comm_rounds")
    # the run's records in hand: those it kept from before the resume, then its own (the final evaluation)
    assert [{k: r[k] for k in keys} for r in resumed.records] == [{k: r[k] for k in keys} for r in whole.records]
    assert [{k: r[k] for k in keys} for r in json.loads("[" + ",".join(
        (tmp_path / "rounds.jsonl").read_text().splitlines()) + "]")] == [{k: r[k] for k in keys} for r in whole.records]


def test_restore_clock_goes_on_from_the_given_time():
    comm = LocalCommunicator()
    comm.restore_clock(5.0)
    elapsed = comm.elapsed()
    assert 5.0 <= elapsed < 6.0 and math.isfinite(elapsed)


def test_the_kind_of_a_run_follows_start_top_to_bottom(monkeypatch):
    from dataclasses import replace

    from dane.loop import kinds
    from dane.split.config import SplitConfig

    names = ("own_driver", "asynchronous_simulator", "batched_simulator", "simulator", "elastic", "launched")
    for name in names:  # each kind answers its own name (and what it was handed) instead of running
        monkeypatch.setattr(kinds, name, lambda *args, name=name: (name, args[3:]))
    base = spec()
    assert kinds.start(base, None, None) == ("launched", ())  # one local worker, not simulated: one plain process
    assert kinds.start(replace(base, comm=Communication(workers=2, batched="false")), None, None) == \
        ("simulator", (None,))
    assert kinds.start(replace(base, comm=Communication(workers=2, batched="true")), None, None)[0] == \
        "batched_simulator"
    assert kinds.start(replace(base, comm=Communication(workers=2, staleness=2)), None, None)[0] == \
        "asynchronous_simulator"
    assert kinds.start(replace(base, algorithm=SplitConfig(), comm=Communication(workers=2)), None, None)[0] == \
        "own_driver"
    assert kinds.start(replace(base, comm=Communication(backend="torch")), None, None)[0] == "launched"
    assert kinds.start(replace(base, comm=Communication(backend="horovod", elastic=True)), None, None)[0] == "elastic"

def test_the_display_shows_a_dozen_notes_and_counts_the_rest():
    """At many clients a note per worker would flood the terminal: the display prints `SHOWN_NOTES` notes, each cut
    at `NOTE_CHARS` characters, and one line counting the rest (the summary keeps them whole); fewer print as they are."""
    few = ["a", "b"]
    assert shown_notes(few) == ["note: a", "note: b"]
    many = [f"worker {w}: 20 rows" for w in range(100_000)]
    lines = shown_notes(many)
    assert len(lines) == SHOWN_NOTES + 1
    assert lines[:2] == ["note: worker 0: 20 rows", "note: worker 1: 20 rows"]
    assert lines[-1] == f"note: ... and {100_000 - SHOWN_NOTES} more notes, every one whole in the run summary's notes"
    long = "rows " + ", ".join(["20"] * 1000)
    (cut,) = shown_notes([long])
    assert cut == "note: " + long[:NOTE_CHARS] + " ..."


def test_the_run_directorys_writes_are_off_a_simulated_workers_clock():
    """Records' work (a tracker's start-up, each record's writes) is bookkeeping: 50 ms of CPU inside `off_clock`
    leave a simulated worker's clock where it was, and the same work outside it is charged."""
    from dane.comm import ThreadGroup
    from dane.loop.callbacks import off_clock

    def burn(seconds: float = 0.05) -> None:
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    def worker(comm):
        before = comm.elapsed()
        with off_clock(comm):
            burn()
        off = comm.elapsed() - before
        burn()
        return off, comm.elapsed() - before - off

    from dane.comm.batched import BatchedGroup, run_batched

    ((off, on),) = ThreadGroup(1).run(worker)
    assert off < 0.005 and on >= 0.05
    off, on = run_batched(BatchedGroup(2), worker)  # the stacked workers' clock: their share, on for 50 ms / 2
    assert off < 0.005 and on >= 0.025


def test_a_slow_writer_leaves_the_simulated_time_as_it_was(tmp_path, monkeypatch):
    """Records' writes are off rank 0's clock: 30 ms of CPU per record written (a tracker's) add nothing to the
    simulated time of a run, where they added 30 ms a round before."""
    import dane
    from dane.records.results import RunWriter

    def run(name: str) -> float:
        result = dane.fit(RidgeSyntheticConfig(n_samples=200, dim=5), "gd", workers=2, rounds=4,
                          out_dir=str(tmp_path / name))
        return result.records[-1]["time_s"]

    quick = run("quick")
    write_round = RunWriter.write_round

    def slow(self, record):
        end = time.thread_time() + 0.03
        while time.thread_time() < end:
            pass
        return write_round(self, record)

    monkeypatch.setattr(RunWriter, "write_round", slow)
    assert run("slow") < quick + 0.02  # 5 records x 30 ms were charged before


def test_the_shown_table_leaves_the_simulated_time_as_it_was(monkeypatch):
    """The progress table is off rank 0's clock as the records are: 30 ms of CPU per line shown add nothing to the
    simulated time (they added 30 ms a round, so time_s depended on quiet)."""
    import dane
    from dane.loop import progress

    def run() -> float:
        result = dane.fit(RidgeSyntheticConfig(n_samples=200, dim=5), "gd", workers=2, rounds=4, quiet=False)
        return result.records[-1]["time_s"]

    quick = run()
    show = progress.RoundTable.__call__

    def slow(self, record):
        end = time.thread_time() + 0.03
        while time.thread_time() < end:
            pass
        return show(self, record)

    monkeypatch.setattr(progress.RoundTable, "__call__", slow)
    assert run() < quick + 0.02  # 5 lines x 30 ms were charged before


@pytest.mark.parametrize("safeguard, solver, lines", [
    (True, "cholesky", ["default: none (every number given)",
                        "adapting: safeguard (each firing is its round's adapted event)"]),
    (False, "cholesky", ["default: none (every number given)"]),
    (False, "auto", ["default: none of algorithm.*; problem.local_solver where the rounds' local solves use them"]),
    (False, "cg", ["default: none of algorithm.*; problem.local_max_iter where the rounds' local solves use them"]),
])
def test_rank_0_shows_the_defaults_and_the_adaptations_attached_before_round_0(safeguard, solver, lines, capfd):
    """The problem's solver nulls are noted where a local solve uses them (the summary's ``defaults``): the first
    lines name them, not "every number given"."""
    from types import SimpleNamespace

    from dane.dane import DANE
    from dane.loop.callbacks import Policy

    problem = RidgeSyntheticConfig(n_samples=40, dim=3, local_solver=solver, factorization="cholesky").build(0, 1)
    algo = DANE(problem, LocalCommunicator(), safeguard=safeguard)
    Policy(show=True).on_start(SimpleNamespace(algo=algo, comm=LocalCommunicator(), problem=problem))
    assert capfd.readouterr().err.splitlines() == lines


@pytest.mark.parametrize("algorithm, keys, pending", [
    ("gd", {}, {"algorithm.lr": "gd_step"}),
    ("gd", {"lr": 0.1}, None),                                  # given: nothing pending, nothing resolved
    ("aide", {}, {"algorithm.tau": "spread_tau", "algorithm.lr": "svrg_step", "algorithm.passes": "svrg_passes"}),
    ("sync_sgd", {"steps_per_round": None, "batch_size": 20}, {"algorithm.steps_per_round": "sgd_steps_per_round"}),
])
def test_a_run_of_no_rounds_names_the_round_0_rules_it_never_ran(algorithm, keys, pending):
    """rounds=0 evaluates w_0 only: a rule whose statistics ride in round 0's allreduce never ran, and the summary
    says which (``defaults_unresolved``) beside empty ``defaults``; one round resolves them."""
    import numpy as np

    import dane

    rng = np.random.default_rng(0)
    X = rng.standard_normal((120, 4))
    problem = dane.problems.LogReg(X, np.where(rng.standard_normal(120) > 0, 1.0, -1.0), lam=1e-2)
    none = dane.fit(problem, algorithm, workers=2, rounds=0, **keys).summary
    assert none["defaults"] == [] and none["package_rules_applied"] is False
    assert {e["key"]: e["rule"] for e in none.get("defaults_unresolved", [])} == (pending or {})
    one = dane.fit(problem, algorithm, workers=2, rounds=1, **keys).summary
    assert "defaults_unresolved" not in one
    assert {e["key"]: e["rule"] for e in one["defaults"]} == (pending or {})


@pytest.mark.parametrize("resumed_from", [None, 4])
def test_a_parameter_servers_counters_say_from_which_round_they_count(resumed_from):
    """comm=ps: the servers' and links' counters are the last process's (its servers start with it), so the summary's
    ``parameter_server`` says from which round they count: the round a resumed run went on from, else 0."""
    from dane.loop.callbacks import CommEntries

    class Servers(LocalCommunicator):
        def summary_entries(self) -> dict:
            return {"parameter_server": {"workers": 1, "links": []}}

    loop = loop_for(spec())
    loop.comm, loop.resumed_from = Servers(), resumed_from
    summary = {}
    CommEntries().on_end(loop, summary)
    assert summary == {"parameter_server": {"since_round": resumed_from or 0, "workers": 1, "links": []}}
    loop.comm = LocalCommunicator()  # any other backend's entries as they are
    CommEntries().on_end(loop, summary := {})
    assert summary == {}


@pytest.mark.parametrize("overrides, said", [
    (("problem=mnist_lenet5", "model@problem.model=mlp", "data@problem.data=digits"), "mnist_lenet5 (model=mlp, data=digits)"),
    (("problem=mnist_lenet5", "model@problem.model=lenet3"), "mnist_lenet5 (model=lenet3)"),
    (("problem=logreg_breast_cancer", "data@problem.data=iris"), "logreg_breast_cancer (data=iris)"),
    (("problem=digits_mlp", "problem.data.sharding=classes"), "digits_mlp"),  # the preset's data, sharded otherwise
])
def test_the_closing_line_names_the_model_and_data_that_replaced_the_presets(overrides, said):
    """problem=mnist_lenet5 model@problem.model=mlp data@problem.data=digits ran an MLP on digits, and the closing line
    said "dane on mnist_lenet5"; it names what was swapped (the summary's ``problem`` stays the preset's)."""
    from dane.api import build
    from helpers import composed

    assert problem_ran(build(composed(*overrides, name="config"), "problem")) == said


def test_an_unswapped_preset_is_named_as_before():
    from dane.api import build
    from dane.layout import CONF_DIR
    from helpers import composed

    for preset in sorted(p.stem for p in (CONF_DIR / "problem").glob("*.yaml")):
        assert problem_ran(build(composed(f"problem={preset}", name="config"), "problem")) == preset
