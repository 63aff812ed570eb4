"""scripts/bench_local_solve.py on tiny cases: when Cholesky is skipped, and a --quick run's JSON (never timed)."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from tests.helpers import REPO, env

from scripts import bench_local_solve as bench


def test_cholesky_is_skipped_only_where_it_cannot_fit():
    memory = 24 * 2**30
    big = {"d": 50000, "layout": "sparse", "n_rows": 100000, "solver": "cholesky"}
    assert "20 GB" in bench.skip_reason(big, memory) and "densifies X (40 GB)" in bench.skip_reason(big, memory)
    assert bench.skip_reason({**big, "solver": "cg"}, memory) is None
    assert bench.skip_reason({"d": 5000, "layout": "dense", "n_rows": 10000, "solver": "cholesky"}, memory) is None


@pytest.mark.slow
def test_quick_run_measures_each_case_and_keeps_other_keys(tmp_path):
    out = tmp_path / "bench.json"
    out.write_text(json.dumps({"other_bench": {"kept": True}}))
    proc = subprocess.run([sys.executable, "-m", "scripts.bench", "local_solve", "--quick", "--out", str(out)], cwd=REPO, env=env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["other_bench"] == {"kept": True}
    cost = report[bench.KEY]
    assert cost["quick"] and cost["machine"]["cpus"] >= 1
    assert len(cost["load_avg_before"]) == len(cost["load_avg_after"]) == 3
    cases = cost["cases"]
    assert {(c["d"], c["layout"], c["solver"]) for c in cases} == \
        {(c["d"], c["layout"], c["solver"]) for c in bench.cost_cases(quick=True)}
    for case in cases:
        assert "failed" not in case and "skipped" not in case
        assert 0 < case["round_s_min"] <= case["round_s"] <= case["round_s_max"]
        assert case["first_round_s_min"] <= case["first_round_s"] <= case["first_round_s_max"]
        assert case["repeats"] == 3 and case["peak_mb"] >= 0 and case["data_mb"] > 0
        assert case["relative_gradient_after"] < 1e-8 and math.isfinite(case["baseline_mb"])
