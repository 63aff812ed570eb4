"""scripts/bench_federated.py and its generated table (paper_figs/federated_table.py, docs/benchmarks.md): the
per-target arithmetic on hand-made records, the grid's verdict, the δ_A-relative knobs, the table rendered from a
hand-made report, and the page's block being the generator's (the --quick run's JSON: tests/test_bench.py)."""
from __future__ import annotations

import argparse
import json
import re

import pytest

from tests.helpers import REPO


def load_script():
    from scripts import bench_federated

    return bench_federated


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


def test_scaffold_and_fedavg_grids_hold_the_local_work_and_follow_the_defaults_benchmark():
    """SCAFFOLD's and FedAvg's grids keep the default's K (no local_steps key) and are scripts/bench_defaults.py's:
    η_l as multiples of the step the default chose, η_g; FedAvg's step as multiples of 1/L, L = ‖H‖ + λ."""
    bench = load_script()
    from scripts import bench_defaults as defaults

    assert bench.METHODS["scaffold"][3] == defaults.SCAFFOLD_GRID == defaults.METHODS["scaffold"][2]
    assert bench.METHODS["fedavg"][3] == defaults.METHODS["fedavg"][2]
    assert all("local_steps" not in g for m in ("scaffold", "fedavg") for g in bench.METHODS[m][3])
    assert bench.keys_of({"lr_times_default": 0.5}, 0.8, default_lr=3.0) == {"lr": 1.5}
    assert bench.keys_of({"lr_times_L": 0.25}, 0.8, L=2.0) == {"lr": 0.125}
    assert bench.keys_of({"server_lr": 2.0}, 0.8, default_lr=3.0) == {"server_lr": 2.0}
    with pytest.raises(ValueError, match="logged no lr"):
        bench.keys_of({"lr_times_default": 0.5}, 0.8)


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
    assert "| SCAFFOLD | 5 (4) | 20 (11) | 2.50 | — | 9.0e-09 | converged | {\"local_steps\": 5} |" in text
    assert "| GD | 9 (8) | — (—) | — | — | 3.0e-06 | max_rounds | {\"lr_factor\": 1.0} (to 0.0001) |" in text
    assert "To 1e-08 at defaults: fewest rounds: SCAFFOLD (20); fewest uplink bits: SCAFFOLD (20000000); fewest " \
           "local passes: —." in text  # GD reached 1e-4 only; no record of these counts local passes
    assert "delta = 1.50e+00, delta_A = 5.00e-01, ||H|| = 2.50e-01" in text
    assert "**s = 2 of 4" not in text and "At s < m: GD not run (no client sampling)." in text
    assert "Not in this JSON" not in text  # no methods listed: nothing to miss
    assert "in parentheses; —" in text  # every row has a grid
    flipped = render(report(dict(reversed(rows.items()))))  # runs split by --only join in any order
    assert flipped.index("| SCAFFOLD |") < flipped.index("| GD |")  # the rows in LABELS' order (the benchmark's)
    rows["s=4/gd"]["grid"], rows["s=2/scaffold"] = [], {**rows["s=4/scaffold"], "grid": []}
    assert "in parentheses; no grid run for GD at s = 4; SCAFFOLD at s = 2: the default alone; —" in render(report(rows))
    del rows["s=2/scaffold"]
    methods = {"scaffold": {"samples_clients": True}, "gd": {"samples_clients": False}}
    text = render(report(rows, methods=methods, setting="mild"))
    assert "Not in this JSON at s = 2: SCAFFOLD (python -m scripts.bench federated --setting mild --clients 2 --only " \
           "scaffold adds them)." in text and "Not in this JSON at s = 4" not in text
    del rows["s=2/gd"]  # a method without client sampling is named as such at s < m from the run's methods alone
    assert "At s < m: GD not run (no client sampling)." in render(report(rows, methods=methods))


@pytest.mark.parametrize("section", ["federated", "federated_mild", "federated_quadratic"])
def test_the_page_holds_the_generated_table(section):
    """Each section's block is the generator's, and names the JSON it came from; where that JSON is here (results/ is
    untracked), rendering it again gives the block to the character."""
    from dane.paper_figs.federated_table import SECTIONS, combine, render

    begin, end = SECTIONS[section]
    text = (REPO / "docs" / "benchmarks.md").read_text()
    assert text.count(begin) == 1 and text.count(end) == 1
    block = text.split(begin, 1)[1].split(end, 1)[0].strip("\n")
    found = re.match(r"Generated by `dane figures federated_table` from scripts/bench_federated\.py's JSON "
                     r"(\S+\.json(?:, \S+\.json)*) \((\S+), load average \[[\d., ]+\]", block)
    assert found, block[:200]
    sources = found.group(1).split(", ")
    if all((REPO / path).is_file() for path in sources):
        reports = [json.loads((REPO / path).read_text())[section] for path in sources]
        assert render(combine(reports), sources) == block


def quadratic_report(sdane_rounds, acc_rounds, dane_rounds):
    """A made-up quadratic section: per method, {multiple of δ_A: rounds to 1e-8 (None: not reached)}; the defaults
    are the key None, DANE's μ = 0 the key 0."""
    def run(settings, rounds, prox=None):
        return {"settings": settings, "status": "converged" if rounds else "max_rounds", "prox_weight": prox,
                "targets": {"0.0001": {"rounds": 1, "uplink_bytes": 8, "bytes_sent": 8},
                            "1e-08": rounds and {"rounds": rounds, "uplink_bytes": 8, "bytes_sent": 8}},
                "best_rel_suboptimality": 1e-9 if rounds else 1e-6}

    def row(method, found, knob):
        grid = [run({"safeguard": False, "mu": 0.0} if c == 0 else {knob: c}, r) for c, r in found.items()
                if c is not None]
        return {"method": method, "clients": 5, "default": run({}, found[None], 2e-4), "grid": grid}

    rows = {"s=5/dane": row("dane", dane_rounds, "mu_per_delta"), "s=5/sdane": row("sdane", sdane_rounds, "lam_per_delta"),
            "s=5/acc_sdane": row("acc_sdane", acc_rounds, "lam_per_delta")}
    return report(rows, dataset="quadratic", workers=5, clients=[5], setting="quadratic", lam=1e-6, delta=0.1,
                  grids=True)


def test_the_quadratic_table_states_the_papers_comparisons_from_the_data():
    """The prox-weight table puts each method's run at each multiple of δ_A side by side, and each sentence follows
    the rounds: Acc-S-DANE fewer than S-DANE at every λ, S-DANE as many as DANE at equal weight, DANE's default
    fewer, so the paper's "no more rounds than DANE" holds at equal weight only; a reversal is said, not hidden."""
    from dane.paper_figs.federated_table import render

    sdane = {None: None, 1.0: None, 0.125: 40}
    text = render(quadratic_report(sdane, {None: 30, 1.0: 50, 0.125: 20}, {None: 4, 0: 4, 1.0: None, 0.125: 40}))
    assert "| prox weight | DANE | S-DANE | Acc-S-DANE |" in text
    assert "| defaults | 1 / 4 at 2.00e-04 | 1 / — (best 1.0e-06) at 2.00e-04 | 1 / 30 at 2.00e-04 |" in text
    assert "| 0 | 1 / 4 |  |  |" in text  # δ_A = 0.5 in report(): δ_A/8 = 6.25e-2
    assert "| delta_A/8 = 6.25e-02 | 1 / 40 | 1 / 40 | 1 / 20 |" in text
    assert "Acc-S-DANE needs fewer rounds than S-DANE at every lambda of the grid (delta_A, delta_A/8)." in text
    assert "At equal prox weight (lambda = mu = delta_A, delta_A/8) S-DANE takes as many rounds as DANE" in text
    assert "DANE (mu = 0, safeguarded: exact Newton-type local solves) needs fewer rounds than S-DANE " \
           "(lambda = 2.00e-04), so the paper's \"S-DANE in no more rounds than DANE\" holds at equal prox weight only." \
           in text
    text = render(quadratic_report(sdane, {None: 30, 1.0: 50, 0.125: 41}, {None: 4, 0: 4, 1.0: None, 0.125: 39}))
    assert "Acc-S-DANE against S-DANE: fewer rounds at delta_A; more rounds at delta_A/8." in text
    assert "S-DANE against DANE at equal prox weight: as many rounds at delta_A; more rounds at delta_A/8." in text
    assert "needs fewer rounds than S-DANE (lambda = 2.00e-04)." in text and "equal prox weight only" not in text
    assert "**Rounds to" not in render({**quadratic_report(sdane, sdane, sdane), "grids": False})


def test_runs_with_the_same_rounds_compare_by_their_best_up_to_round_off():
    from dane.paper_figs.federated_table import compare

    targets = ["0.0001", "1e-08"]
    run = lambda r4, r8, best: {"targets": {"0.0001": r4 and {"rounds": r4}, "1e-08": r8 and {"rounds": r8}},  # noqa: E731
                                "best_rel_suboptimality": best}
    assert compare(run(2, None, 1.0568841373503738e-08), run(2, None, 1.056884137543459e-08), targets) == "as many"
    assert compare(run(2, None, 1.0e-08), run(2, None, 1.01e-08), targets) == "fewer"
    assert compare(run(9, 40, 1e-9), run(2, 41, 1e-9), targets) == "fewer"  # the last target decides first
    assert compare(run(3, None, 1e-9), run(2, None, 1e-6), targets) == "more"  # then the earlier ones
    assert compare(run(None, None, 1e-5), run(None, None, None), targets) == "fewer"


def test_the_quadratic_grids_compare_at_equal_prox_weight():
    """DANE's μ runs on S-DANE's and Acc-S-DANE's multiples of δ_A (and at 0), and each run records the weight it
    started with: a null default's resolved λ or μ."""
    bench = load_script()
    grids = bench.SETTINGS["quadratic"]["grids_of"]
    multiples = lambda grid, key: [g[key] for g in grid if key in g]  # noqa: E731
    assert multiples(grids["dane"], "mu_per_delta") == multiples(grids["sdane"], "lam_per_delta") \
        == multiples(grids["acc_sdane"], "lam_per_delta") and 1.0 in multiples(grids["sdane"], "lam_per_delta")
    assert {"safeguard": False, "mu": 0.0} in grids["dane"] and all(g.get("safeguard") is False for g in grids["dane"])
    hard = argparse.Namespace(**bench.SETTINGS["hard"])
    assert bench.grid_of(hard, "dane") == bench.METHODS["dane"][3]
    assert bench.prox_weight([{"lam": 0.25}, {"lam": 0.5}]) == 0.25 and bench.prox_weight([{"mu": 0}]) == 0.0
    assert bench.prox_weight([{"round": 0}]) is None and bench.prox_weight([]) is None


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
    source = [str(data)]  # the caption names the JSON as given
    assert page.read_text() == f"{hb}\n{render(hard, source)}\n{he}\n{mb}\nold\n{me}\n"
    assert f"from scripts/bench_federated.py's JSON {data} (2026-01-01T00:00:00+0000, load average" in render(hard, source)
    data.write_text(json.dumps({"federated": hard, "federated_mild": mild}))
    main(["--json", str(data), "--page", str(page)])
    assert page.read_text() == f"{hb}\n{render(hard, source)}\n{he}\n{mb}\n{render(mild, source)}\n{me}\n"
    assert "Setting mild: " in render(mild) and "defaults only, no grid" in render(mild)
    data.write_text(json.dumps({"federated": hard}))
    with pytest.raises(SystemExit, match="holds no federated_mild section; run python -m scripts.bench federated --setting mild"):
        main(["--json", str(data), "--page", str(page), "--section", "federated_mild"])


def test_the_settings_fill_what_the_command_line_leaves_out(tmp_path, monkeypatch):
    """``--setting mild`` runs the mild setting into its own section; a flag given overrides it."""
    from scripts import bench as runner

    bench = load_script()
    seen = []
    monkeypatch.setattr(bench, "run_setting_rows", lambda args, run: seen.append(args) or {})
    runner.main(["federated", "--out", str(tmp_path / "b.json"), "--setting", "mild", "hard", "--clients", "5"])
    mild, hard = seen
    assert (mild.key, mild.workers, mild.alpha, mild.clients, mild.caps) == ("federated_mild", 20, 1.0, [5], [60, 200])
    assert (hard.key, hard.workers, hard.alpha, hard.caps) == ("federated", 100, 0.5, [60, 200])


def test_a_rerun_of_some_rows_keeps_the_others_in_order():
    """``--only`` with ``--clients 10`` over a section of s = 100 and 10: the earlier rows stay, a row of both runs is
    the new one, s keeps both values and rows the order of s then of METHODS, and both runs' starts are named."""
    bench = load_script()
    earlier = {"started_at": "A", "machine": {"load_avg": [1]}, "clients": [100, 10],
               "rows": {"s=100/gd": 1, "s=10/sdane": 2, "s=10/fedavg": 3}}
    new = {"started_at": "B", "machine": {"load_avg": [2]}, "clients": [10], "rows": {"s=10/fedavg": 4, "s=10/fedprox": 5}}
    args = argparse.Namespace(only=["fedavg", "fedprox"])
    merged = bench.with_earlier(new, earlier, args)
    assert merged["clients"] == [100, 10]
    assert list(merged["rows"].items()) == [("s=100/gd", 1), ("s=10/sdane", 2), ("s=10/fedprox", 5), ("s=10/fedavg", 4)]
    assert merged["runs"] == [{"started_at": "A", "load_avg": [1]}, {"started_at": "B", "load_avg": [2]}]
    earlier["methods"], new["methods"] = {"gd": 1, "fedavg": 2}, {"fedavg": 3, "fedprox": 4}
    assert bench.with_earlier(new, earlier, args)["methods"] == {"gd": 1, "fedavg": 3, "fedprox": 4}
    assert bench.with_earlier(new, earlier, argparse.Namespace(only=None)) is new


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
