"""scripts/bench_federated.py and its generated table (paper_figs/federated_table.py, docs/benchmarks.md).

Fast: the per-target arithmetic on hand-made records, the grid's verdict, the δ_A-relative knobs, the
table rendered from a hand-made report, and the page's block being the generator's.  Slow: the --quick
run, whose JSON must hold its own arithmetic and SCAFFOLD's uplink bytes in closed form.
"""
from __future__ import annotations

import importlib.util
import json
import re
import sys

import pytest

from tests.helpers import REPO


def load_script():
    spec = importlib.util.spec_from_file_location("bench_federated", REPO / "scripts" / "bench_federated.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def record(k, sub, objective_star=-2.0, **extra):
    return {"round": k, "comm_rounds": 2 * k + 1, "objective": objective_star + sub, "suboptimality": sub,
            "time_s": 0.5 * k, "bytes_sent": 100 * k, "uplink_bytes": 10 * k, "downlink_bytes": 20 * k, **extra}


def test_targets_are_the_first_records_at_or_below_them():
    bench = load_script()
    subs = [1.0, 1e-3, 2e-4, 1e-5, 1e-9, 3e-9]  # relative to |O*| = 2: 0.5, 5e-4, 1e-4, 5e-6, 5e-10, 1.5e-9
    found = bench.at_targets([record(k, s) for k, s in enumerate(subs)])
    # record t carries round t's traffic, which made w_{t+1}: w_2's is record 1's
    assert found["targets"]["0.0001"] == {"rounds": 2, "comm_rounds": 5, "time_s": 1.0, "uplink_bytes": 10,
                                          "downlink_bytes": 20, "bytes_sent": 200}
    assert found["targets"]["1e-08"]["rounds"] == 4
    assert found["best_rel_suboptimality"] == pytest.approx(5e-10)
    assert bench.at_targets([record(0, 1.0), record(1, float("nan"))])["targets"]["1e-08"] is None


def test_best_is_the_fewest_rounds_over_the_grid_and_the_default():
    bench = load_script()
    run = lambda rounds, settings, status="converged": {  # noqa: E731
        "settings": settings, "status": status, "targets": {"1e-08": None if rounds is None else {"rounds": rounds}}}
    verdict = bench.judge(run(30, {}), [run(12, {"lam_per_delta": 1.0}), run(None, {"lam_per_delta": 0.1}, "diverged")])
    assert verdict["best"]["settings"] == {"lam_per_delta": 1.0} and verdict["ratio"] == 2.5
    assert verdict["best_per_target"]["1e-08"] == {"settings": {"lam_per_delta": 1.0}, "rounds": 12}
    assert verdict["best_per_target"]["0.0001"] is None  # no run of this made-up grid logged that target
    assert verdict["no_divergence"]
    verdict = bench.judge(run(None, {}, "diverged"), [run(7, {"mu": 0.1})])
    assert verdict["ratio"] is None and not verdict["no_divergence"] and verdict["best"]["rounds"] == 7
    assert bench.keys_of({"lam_per_delta": 0.25, "local_steps": 5}, 0.8) == {"lam": 0.2, "local_steps": 5}


def report(rows, **extra):
    return {"started_at": "2026-01-01T00:00:00+0000", "machine": {"load_avg": [1.0, 1.0, 1.0]}, "lam": 1e-3,
            "dataset": "phishing", "workers": 4, "clients": [4, 2], "sharding": "dirichlet alpha=0.5",
            "targets": ["0.0001", "1e-08"], "target": "relative suboptimality",
            "similarity": {"rows": 40, "dim": 3, "shard_rows_min": 2, "shard_rows_max": 20, "delta": 1.5,
                           "delta_mean_square": 0.5, "hessian_norm": 0.25}, "rows": rows, **extra}


def test_the_table_shows_defaults_beside_the_best_setting():
    from dane.paper_figs.federated_table import render

    hit = lambda rounds, up: {"rounds": rounds, "uplink_bytes": up, "bytes_sent": 7_000_000}  # noqa: E731
    run = lambda settings, t4, t8, rel=9e-9, status="converged": {  # noqa: E731
        "settings": settings, "targets": {"0.0001": t4, "1e-08": t8}, "best_rel_suboptimality": rel, "status": status}
    rows = {"s=4/scaffold": {"method": "scaffold", "default": run({}, hit(5, 1), hit(20, 2_500_000)),
                             "grid": [run({"local_steps": 5}, hit(4, 1), hit(11, 1)),
                                      run({"local_steps": 1}, hit(6, 1), None, 1e-5, "max_rounds")]},
            "s=4/gd": {"method": "gd", "default": run({}, hit(9, None), None, 3e-6, "max_rounds"),
                       "grid": [run({"lr_factor": 1.0}, hit(8, None), None, 4e-6, "max_rounds")]},
            "s=2/gd": {"skipped": "gd has no client sampling; run at s=m only"}}
    text = render(report(rows))
    assert "| SCAFFOLD | 5 (4) | 20 (11) | 2.50 | 9.0e-09 | converged | {\"local_steps\": 5} |" in text
    assert "| GD | 9 (8) | — (—) | — | 3.0e-06 | max_rounds | {\"lr_factor\": 1.0} (to 0.0001) |" in text
    assert "delta = 1.50e+00, delta_A = 5.00e-01, ||H|| = 2.50e-01" in text
    assert "**s = 2 of 4" not in text and "At s < m: GD not run (no client sampling)." in text


@pytest.mark.parametrize("section", ["federated", "federated_mild"])
def test_the_page_holds_the_generated_table(section):
    from dane.paper_figs.federated_table import SECTIONS

    begin, end = SECTIONS[section]
    text = (REPO / "docs" / "benchmarks.md").read_text()
    assert text.count(begin) == 1 and text.count(end) == 1
    block = text.split(begin, 1)[1].split(end, 1)[0].strip("\n")
    assert re.match(r"Generated by `dane figures federated_table` from scripts/bench_federated\.py's JSON \(\S+, "
                    r"load average \[[\d., ]+\]", block), block[:200]
    stamps = re.findall(r"(\S+), load average \[", block.split(")", 1)[0])
    folder = REPO / "results" / "bench_runs"
    logged = [json.loads(p.read_text()).get(section) for p in
              [REPO / "results" / "bench.json", *sorted(folder.glob("federated*.json"))] if p.is_file()]
    by_stamp = {r["started_at"]: r for r in logged if r and "started_at" in r}
    if all(stamp in by_stamp for stamp in stamps):  # the JSON it came from is here (results/ is untracked)
        from dane.paper_figs.federated_table import combine, render
        assert render(combine([by_stamp[stamp] for stamp in stamps])) == block


def test_each_setting_renders_into_its_own_block(tmp_path):
    """``federated`` (the hard setting) and ``federated_mild`` go between their own markers; a JSON without the mild
    section leaves its block alone, and asking for a section the JSON lacks is one line naming the command."""
    from dane.paper_figs.federated_table import SECTIONS, main, render

    hard = report({"s=4/gd": {"method": "gd", "default": {"settings": {}, "targets": {}, "status": "max_rounds"},
                              "grid": []}})
    mild = {**hard, "setting": "mild", "grids": False, "workers": 2, "clients": [2]}
    mild["rows"] = {"s=2/gd": {**hard["rows"]["s=4/gd"], "clients": 2}}
    (hb, he), (mb, me) = SECTIONS["federated"], SECTIONS["federated_mild"]
    page, data = tmp_path / "page.md", tmp_path / "bench.json"
    page.write_text(f"{hb}\nold\n{he}\n{mb}\nold\n{me}\n")
    data.write_text(json.dumps({"federated": hard}))
    main(["--json", str(data), "--page", str(page)])
    assert page.read_text() == f"{hb}\n{render(hard)}\n{he}\n{mb}\nold\n{me}\n"
    data.write_text(json.dumps({"federated": hard, "federated_mild": mild}))
    main(["--json", str(data), "--page", str(page)])
    assert page.read_text() == f"{hb}\n{render(hard)}\n{he}\n{mb}\n{render(mild)}\n{me}\n"
    assert "Setting mild: " in render(mild) and "defaults only, no grid" in render(mild)
    data.write_text(json.dumps({"federated": hard}))
    with pytest.raises(SystemExit, match="holds no federated_mild section; run scripts/bench_federated.py --setting mild"):
        main(["--json", str(data), "--page", str(page), "--section", "federated_mild"])


def test_the_settings_fill_what_the_command_line_leaves_out(tmp_path, monkeypatch):
    """``--setting mild`` runs the mild setting into its own section; a flag given overrides it."""
    bench = load_script()
    seen = []
    monkeypatch.setattr(bench, "run", lambda args: seen.append(args) or {})
    bench.main(["--out", str(tmp_path / "b.json"), "--setting", "mild", "hard", "--clients", "5"])
    mild, hard = seen
    assert (mild.key, mild.workers, mild.alpha, mild.clients, mild.caps) == ("federated_mild", 20, 1.0, [5], [60, 200])
    assert (hard.key, hard.workers, hard.alpha, hard.caps) == ("federated", 100, 0.5, [30, 100])


@pytest.mark.slow
def test_the_quick_run_holds_its_arithmetic(tmp_path):
    bench = load_script()
    out = tmp_path / "bench.json"
    out.write_text(json.dumps({"other": {"kept": 1}}))
    bench.main(["--quick", "--out", str(out), "--only", "scaffold"])
    whole = json.loads(out.read_text())
    assert whole["other"] == {"kept": 1}
    got = whole["federated"]
    dim = got["similarity"]["dim"]
    assert got["similarity"]["delta"] >= got["similarity"]["delta_mean_square"] > 0
    for s in (8, 4):
        row = got["rows"][f"s={s}/scaffold"]
        runs = [row["default"], *row["grid"]]
        reached = [r["targets"]["1e-08"]["rounds"] for r in runs if r["targets"].get("1e-08")]
        assert reached and row["best"]["rounds"] == min(reached)
        for r in runs:
            hit = r["targets"].get("1e-08")
            if hit:  # SCAFFOLD's uplink: s clients x (Δy, Δc) x d float64 in each of the rounds that made w_t
                assert hit["uplink_bytes"] == hit["rounds"] * s * 2 * dim * 8


def test_the_controlled_quadratic_has_the_dissimilarity_it_is_given():
    """``--setting quadratic``'s problem: max_i ‖H_i − H‖₂ = δ exactly, mean_i H_i = H = A + μI, every local Hessian
    at least μI (the exact local solves need convex local problems), and w° the optimum of the mean objective."""
    import numpy as np
    import torch

    bench = load_script()
    config = bench.ControlledQuadratic(dim=40, delta=0.05, mu=1e-3, seed=2)
    shards = [config.build(rank, 5) for rank in range(5)]
    eye = torch.eye(40, dtype=torch.float64)
    H_i = [s.A + 2 * s.lam * eye for s in shards]
    H = sum(H_i) / 5
    assert max(float(torch.linalg.eigvalsh(h - H).abs().max()) for h in H_i) == pytest.approx(0.05, rel=1e-12)
    assert min(float(torch.linalg.eigvalsh(h)[0]) for h in H_i) >= 1e-3 * (1 - 1e-9)
    assert float(torch.linalg.eigvalsh(H)[-1]) == pytest.approx(1.0 + 1e-3, rel=1e-9)  # L = 1, plus μ
    w_star = torch.linalg.solve(H, sum(s.b for s in shards) / 5)
    torch.testing.assert_close(w_star, shards[0].w_star, rtol=0, atol=1e-9)
    assert np.linalg.norm(shards[0].b.numpy() - shards[1].b.numpy()) > 0  # the clients' linear terms differ too
