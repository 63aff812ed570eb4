"""scripts/bench_scaling.py's arithmetic on hand-made runs, and its side-by-side launches (never timed here)."""
from __future__ import annotations

import json
import os

import pytest

from dane.synthetic.launchers import horovodrun_side_by_side

from scripts import bench_scaling as bench


def test_ceiling_is_twice_the_lone_round_over_the_round_beside_a_twin():
    done = {"status": "max_rounds"}
    runs = [{"np": 1, "repeat": 0, "round_s": 3.0, **done}, {"np": 2, "repeat": 0, "round_s": 1.7, **done},
            {"np": "twin", "repeat": 0, "round_s": 3.2, **done}, {"np": "twin", "repeat": 0, "round_s": 3.4, **done},
            {"np": 1, "repeat": 1, "round_s": 2.8, **done},
            {"np": "twin", "repeat": 1, "status": "launch_failed"},
            {"np": 1, "repeat": 2, "status": "launch_failed"},
            {"np": "twin", "repeat": 2, "round_s": 9.0, **done}, {"np": "twin", "repeat": 2, "round_s": 9.0, **done}]
    out = bench.ceiling(runs)
    # repeat 1 has no twins and repeat 2 no lone run: only repeat 0 pairs up, with the twins' mean 3.3
    assert out["ceiling"] == pytest.approx(2 * 3.0 / 3.3, rel=1e-15)
    assert out["ceiling_per_repeat"]["n"] == 1
    assert out["twin_round_s"]["median"] == pytest.approx(3.3, rel=1e-15)
    assert out["slowdown_beside_twin"] == pytest.approx(3.3 / 3.0, rel=1e-15)
    assert bench.ceiling([{"np": 1, "repeat": 0, "round_s": 3.0, **done}]) == {"ceiling": None}


def test_ridge_ceiling_is_the_lone_time_over_half_the_setup_beside_a_twin_plus_the_lone_rounds():
    done = {"status": "converged"}
    runs = [{"np": 1, "repeat": 0, "setup_s": 2.0, "time_s": 0.1, **done}, {"np": 2, "repeat": 0, "setup_s": 1.2,
                                                                            "time_s": 0.3, **done},
            {"np": "twin", "repeat": 0, "setup_s": 2.4, "time_s": 0.1, **done},
            {"np": "twin", "repeat": 0, "setup_s": 2.6, "time_s": 0.1, **done},
            {"np": 1, "repeat": 1, "setup_s": 2.2, "time_s": 0.1, **done},
            {"np": "twin", "repeat": 1, "status": "launch_failed"}]
    out = bench.ridge_ceiling(runs)
    # only repeat 0 has twins (mean setup 2.5): (2.0 + 0.1) / (2.5 / 2 + 0.1)
    assert out["ceiling"] == pytest.approx(2.1 / 1.35, rel=1e-15)
    assert out["ceiling_per_repeat"]["n"] == 1
    assert out["setup_slowdown_beside_twin"] == pytest.approx(2.5 / 2.0, rel=1e-15)
    assert bench.ridge_ceiling(runs[:2]) == {"ceiling": None}


@pytest.mark.needs_horovod  # horovodrun -np 1, twice
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two usable cores")
@pytest.mark.slow
def test_side_by_side_runs_each_hold_one_core_of_their_own(tmp_path):
    files = [tmp_path / f"probe{k}.jsonl" for k in range(2)]
    horovodrun_side_by_side("tests.comm_probe", [[str(f)] for f in files], timeout=300)
    records = [json.loads(f.read_text()) for f in files]
    assert [r["size"] for r in records] == [1, 1]
    assert [r["cores"] for r in records] == [[c] for c in sorted(os.sched_getaffinity(0))[:2]]
    assert [r["threads"] for r in records] == [1, 1]  # the package gives a rank one thread per core of its block


@pytest.mark.needs_horovod
@pytest.mark.slow
def test_side_by_side_reports_which_run_failed(tmp_path):
    with pytest.raises(RuntimeError, match="exited with"):
        horovodrun_side_by_side("tests.comm_probe", [[str(tmp_path / "ok.jsonl")], ["/no/such/dir/x.jsonl"]],
                                timeout=300)
    assert json.loads((tmp_path / "ok.jsonl").read_text())["allreduce_err"] == 0.0  # the other run still finished
