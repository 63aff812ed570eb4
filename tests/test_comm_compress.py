"""comm.compress: the messages an algorithm declares compressible, compressed in the communicator, bits counted exactly."""
from __future__ import annotations

import copy
import math
from dataclasses import replace

import pytest
import torch

from dane.baselines.gd import GDConfig
from dane.comm import AlphaBeta
from dane.comm.compression import MessageCompression
from dane.compress import Dither, TopK, make
from dane.dane import DANEConfig
from dane.errors import ConfigError
from dane.loop.launch import execute
from dane.problems import RidgeSyntheticConfig
from dane.problems.linear_models import LinearModelConfig
from dane.problems.neural import DataConfig
from dane.loop.stopping import StopRule
from dane.loop.spec import Communication, RunControl, RunSpec

M = 4
PROBLEM = RidgeSyntheticConfig(n_samples=800, dim=40, lam=0.05)
D = PROBLEM.dim
METRICS = 2  # objective and suboptimality ride with the gradient (float64 each): in the bytes, not in the bits


def fit(algorithm, rounds: int, compress: str | None = None, error_feedback: bool = False, tol: float | None = None,
        cost: AlphaBeta | None = None, workers: int = M):
    spec = RunSpec(problem=PROBLEM, algorithm=algorithm,
                   comm=Communication(backend="local", workers=workers, compress=compress, error_feedback=error_feedback,
                                      cost=cost or AlphaBeta()),
                   control=RunControl(stop=StopRule(rounds=rounds, tol_abs=tol), quiet=True, progress="none"))
    collected: dict = {}
    summary = execute(spec, None, collect=collected)
    return collected["records"], summary


def without_clock(records, *drop):
    return [{k: v for k, v in r.items() if k != "time_s" and k not in drop} for r in records]


def test_compress_none_is_the_uncompressed_run_with_dense_bit_counts():
    gd = GDConfig(lr=0.2)
    plain, _ = fit(gd, 6)
    counted, summary = fit(gd, 6, compress="none")
    assert without_clock(counted, "uplink_bits", "downlink_bits") == without_clock(plain)
    assert "uplink_bits" not in plain[0]
    per_round = D * 64  # the dense gradient both ways; the metrics that ride along are the run's, not counted
    assert [r["uplink_bits"] for r in counted] == [t * per_round for t in range(7)]
    assert [r["downlink_bits"] for r in counted] == [t * per_round for t in range(7)]
    assert summary["compression"] == {"compress": "none", "error_feedback": False, "compressed_messages": ["gradient"]}
    assert summary["uplink_bits"] == summary["downlink_bits"] == 6 * per_round  # the last record's


def test_gd_topk_with_ef21_converges_and_its_bits_are_rounds_times_the_closed_form():
    k = 8
    records, summary = fit(GDConfig(lr=0.2), 300, compress=f"topk:{k}", error_feedback=True, tol=1e-10)
    assert records[-1]["suboptimality"] <= 1e-10
    up = k * (64 + math.ceil(math.log2(D)))  # k (index, value) pairs; the metrics ride along uncounted
    assert all(r["uplink_bits"] == r["round"] * up for r in records)
    assert all(r["downlink_bits"] == r["round"] * D * 64 for r in records)  # the mean comes back dense
    assert summary["uplink_bits"] == records[-1]["round"] * up
    # bytes_sent and the cost model price the compressed message: ring share of ⌈bits/8⌉ bytes
    assert records[1]["bytes_sent"] == 2 * (M - 1) * (math.ceil(k * (64 + 6) / 8) + METRICS * 8) // M


def test_unbiased_compression_without_error_feedback_converges_where_the_local_gradients_vanish():
    # one worker: ∇O_1(w*) = ∇O(w*) = 0, so RandK's variance ω‖∇O_1(w)‖² vanishes at w* and GD converges exactly
    records, _ = fit(GDConfig(lr=0.05), 600, compress="randk:8", tol=1e-10, workers=1)
    assert records[-1]["suboptimality"] <= 1e-10
    assert records[-1]["uplink_bits"] == records[-1]["round"] * 8 * 64  # RandK's values (the metrics uncounted)


def test_compression_without_error_feedback_stalls_where_shards_differ():
    # m shards: ∇O_i(w*) ≠ 0, so the compressed mean of the local gradients stays off ∇O(w*) (a neighbourhood of
    # w*); EF21 learns each ∇O_i (the test above with error_feedback=true reaches 1e-10)
    for spec in ("topk:8", "randk:8"):
        records, _ = fit(GDConfig(lr=0.2), 150, compress=spec, tol=1e-10)
        assert 1e-2 * records[0]["suboptimality"] >= records[-1]["suboptimality"] > 1e-6


def test_gd_randk_converges_with_ef21_and_its_bits_carry_no_indices():
    k = 8
    records, _ = fit(GDConfig(lr=0.2), 600, compress=f"randk:{k}", error_feedback=True, tol=1e-10)
    assert records[-1]["suboptimality"] <= 1e-10
    assert all(r["uplink_bits"] == r["round"] * k * 64 for r in records)  # values only: no indices, no metrics


def test_cost_model_prices_the_compressed_message():
    """The simulator's α-β time of each allreduce is that of the compressed message's ⌈bits/8⌉ bytes."""
    cost = AlphaBeta(alpha=0.0, beta=1e3)  # a slow link, so the bandwidth term is all there is
    _, dense = fit(GDConfig(lr=0.2), 3, compress="none", cost=cost)
    _, sparse = fit(GDConfig(lr=0.2), 3, compress="topk:8", cost=cost)
    per_round = lambda nbytes: 2 * (M - 1) / M * nbytes / 1e3  # noqa: E731
    # 3 rounds and the last iterate's evaluation (a measurement: its gradient is sent dense), 4 allreduces
    dense_bytes = (D + METRICS) * 8
    assert dense["simulated_comm_s"] == pytest.approx(4 * per_round(dense_bytes), rel=1e-12)
    sparse_bytes = math.ceil(8 * (64 + 6) / 8) + METRICS * 8
    assert sparse["simulated_comm_s"] == pytest.approx(3 * per_round(sparse_bytes) + per_round(dense_bytes), rel=1e-12)


def test_dane_compresses_its_gradient_not_its_iterate():
    k = 10
    records, _ = fit(DANEConfig(mu=0.1, safeguard=False), 150, compress=f"topk:{k}", error_feedback=True, tol=1e-10)
    assert records[-1]["suboptimality"] <= 1e-10
    # per round the gradient goes up as k (index, value) pairs and comes back dense; the iterate and the
    # fused metrics go both ways dense, so the two counters differ by exactly the gradient's saving
    for before, after in zip(records, records[1:]):
        up, down = (after[key] - before[key] for key in ("uplink_bits", "downlink_bits"))
        assert down - up == 64 * D - k * (64 + 6)


def test_message_compression_compresses_only_declared_kinds():
    gradient, iterate, metrics = (torch.arange(1.0, 11.0, dtype=torch.float64) for _ in range(3))
    comp = MessageCompression(TopK(k=2), ("gradient",))
    out, nbytes = comp.encode([gradient, iterate, metrics], ("gradient", "iterate"))
    assert torch.equal(out[0], torch.tensor([0.0] * 8 + [9.0, 10.0], dtype=torch.float64))
    assert torch.equal(out[1], iterate) and torch.equal(out[2], metrics)
    assert comp.uplink_bits == 2 * (64 + 4) + 20 * 64 and comp.downlink_bits == 30 * 64
    assert nbytes == math.ceil(2 * 68 / 8) + 20 * 8


def test_message_compression_is_reproducible_from_its_state():
    x = torch.randn(100, dtype=torch.float64)
    a = MessageCompression(Dither(s=2), ("gradient",), error_feedback=True, seed=3, rank=1)
    a.encode([x], ("gradient",))
    state = a.state_dict()
    b = MessageCompression(Dither(s=2), ("gradient",), error_feedback=True, seed=3, rank=1)
    b.load_state_dict(state)
    assert torch.equal(a.encode([x], ("gradient",))[0][0], b.encode([x], ("gradient",))[0][0])
    other = MessageCompression(Dither(s=2), ("gradient",), seed=3, rank=2)  # another worker draws its own
    first = MessageCompression(Dither(s=2), ("gradient",), seed=3, rank=1)
    assert not torch.equal(first.encode([x], ("gradient",))[0][0], other.encode([x], ("gradient",))[0][0])


@pytest.mark.parametrize("comm, says", [
    (dict(compress="rank:2"), "compresses d×d matrices"),
    (dict(compress="topk:x"), "count or a fraction"),
    (dict(error_feedback=True), "needs a compressor"),
    (dict(compress="topk:3", backend="ps"), "not available with comm=ps"),
    (dict(compress="topk:3", staleness=1), "not available with comm.staleness"),
])
def test_bad_compression_settings_are_one_line(comm, says):
    with pytest.raises(ConfigError) as err:
        Communication(**comm)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_an_algorithm_that_declares_nothing_refuses_compression():
    from dane.baselines.admm import ADMMConfig

    with pytest.raises(ConfigError) as err:
        RunSpec(problem=PROBLEM, algorithm=ADMMConfig(), comm=Communication(compress="topk:3"))
    assert "algorithm=admm declares no message safe to compress" in str(err.value)
    assert "dane" in str(err.value) and "gd" in str(err.value) and "\n" not in str(err.value)
    RunSpec(problem=PROBLEM, algorithm=ADMMConfig(), comm=Communication(compress="none"))  # bits only: accepted
    assert make("none").bits(3) == 192


LAUNCHED = ("problem=ridge_synthetic", "problem.n_samples=400", "problem.dim=20", "algorithm=gd", "algorithm.lr=0.2",
            "rounds=5", "quiet=true", "save_iterate=true", "comm.compress=randk:0.25", "comm.error_feedback=true")


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["torchrun", "horovodrun"])
def test_compressed_launched_run_equals_the_simulator(launcher, tmp_path):
    """Each rank draws from its own seeded generator and the decoded values are averaged densely, so a launched run
    has the simulator's records (bits included) and iterate."""
    import json

    import helpers

    launch = helpers.torchrun if launcher == "torchrun" else helpers.horovodrun
    sim = helpers.simulated_run(tmp_path / "sim", *LAUNCHED, workers=2)
    proc = helpers.train(*LAUNCHED, f"out_dir={tmp_path / 'real'}", launcher=launch(2))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    real, want = ([json.loads(line) for line in (d / "rounds.jsonl").read_text().splitlines()]
                  for d in (tmp_path / "real", sim))
    assert len(real) == len(want) == 6
    for a, b in zip(real, want):
        for key in ("round", "comm_rounds", "bytes_sent", "uplink_bits", "downlink_bits"):
            assert a[key] == b[key], (key, a["round"])
        assert abs(a["suboptimality"] - b["suboptimality"]) <= 1e-12 * max(1.0, b["suboptimality"])
    torch.testing.assert_close(torch.load(tmp_path / "real" / "iterate.pt"), torch.load(sim / "iterate.pt"),
                               rtol=0, atol=1e-12)


def test_the_docs_table_lists_the_methods_that_declare_compressible_messages():
    import importlib.util
    import re
    from pathlib import Path

    from dane.algorithm import known_algorithms

    spec = importlib.util.spec_from_file_location("docs_hooks", Path(__file__).resolve().parents[1] / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    table = hooks.methods_table("compressible")
    shown = dict(re.findall(r"^\| `(\w+)` \| .* \| ([\w, ]+) \|$", table, re.M))
    assert shown == {name: ", ".join(cls.compressible) for name, cls in known_algorithms().items() if cls.compressible}
    assert shown["gd"] == "gradient" and "admm" not in shown


def test_a_resumed_compressed_run_equals_the_uninterrupted_one(tmp_path):
    """The workers' generators and EF21 estimates are in the checkpoint, and the bit counters in its cost."""
    from helpers import composed

    from dane.experiments.config import run_spec
    from dane.records.results import read_rounds

    def execute_with(out_dir, *overrides):
        return execute(run_spec(composed(*LAUNCHED, "workers=3", "save_iterate=false", *overrides)), str(out_dir))

    whole, cut = tmp_path / "whole", tmp_path / "cut"
    execute_with(whole, "rounds=6", "checkpoint_every=3")
    execute_with(cut, "rounds=4", "checkpoint_every=3")  # "crashes" one round past the checkpoint
    execute_with(cut, "rounds=6", "checkpoint_every=3", f"resume={cut}")
    got, expected = read_rounds(cut), read_rounds(whole)
    assert [r["round"] for r in got] == list(range(7)) and got[-1]["uplink_bits"] == 6 * 5 * 64  # metrics uncounted
    assert without_clock(got) == without_clock(expected)  # exact


# ------------------------------------------------------------------ the run's measurements are not the method's bits
#: breast cancer's logistic regression, d = 30, without and with a reference optimum (one logged metric more)
MEASURED = LinearModelConfig(data=DataConfig(dataset="breast_cancer"), loss="logistic", name="logreg", lam=1e-2)
#: every method whose round allreduces the logged metrics, by `fit`'s ``compress=none`` counter: GD's and DiSCO's
#: gradient, local SGD's, one-shot averaging's and ADMM's metrics (and the gradient for grad_norm without an
#: optimum) only logged; DANE's safeguard, GIANT's line search and AIDE's τ rules read the objective (counted) and
#: not the suboptimality (FedNL-LS's search too: with a reference it was charged the suboptimality beside it); the
#: federated line's and FedNL's metrics ride the sampled allreduce
MEASURING = {"gd": {"lr": 0.2}, "disco": {}, "local_sgd": {}, "osa": {}, "admm": {},
             "sync_sgd": {"batch_size": 50, "steps_per_round": 1}, "dane": {},
             "dane_paper": {"safeguard": False, "mu": 0.1}, "giant": {}, "aide": {"local_solver": "cg"},
             "fedprox": {}, "scaffold": {}, "sdane": {}, "fednl": {"compressor": "topk:30"},
             "fednl_ls": {"compressor": "topk:30", "variant": "ls"}}


#: `measured_records`' runs, each made once a session: (name, optimum, keys) -> records
MEASURED_RUNS: dict[tuple, list[dict]] = {}


def measured_records(name: str, optimum: str = "none", **keys) -> list[dict]:
    """3 rounds of algorithm ``name`` at ``keys`` on `MEASURED` (``problem.optimum=optimum``), M simulated workers with
    ``comm.compress=none``'s bit counters: the records (a copy of the run several tests read)."""
    key = (name, optimum, repr(sorted(keys.items())))
    if key not in MEASURED_RUNS:
        MEASURED_RUNS[key] = measured_run(name, optimum, **keys)
    return copy.deepcopy(MEASURED_RUNS[key])


def measured_run(name: str, optimum: str, **keys) -> list[dict]:
    from dane.api import algorithm_config

    spec = RunSpec(problem=replace(MEASURED, optimum=optimum), algorithm=algorithm_config(name, **keys),
                   comm=Communication(backend="local", workers=M, compress="none"),
                   control=RunControl(stop=StopRule(rounds=3), quiet=True, progress="none"))
    collected: dict = {}
    execute(spec, None, collect=collected)
    return collected["records"]


@pytest.mark.parametrize("name", MEASURING)
def test_a_reference_optimum_changes_no_method_bits_and_adds_its_bytes(name):
    """The logged metrics ride the round's allreduce but are the run's measurement (`METRICS`): the records with
    suboptimality carry the same ``uplink_bits`` and ``downlink_bits`` as those without, round by round, while
    ``bytes_sent`` prices the metrics on the wire (more with the optimum's, fewer where no gradient then rides for
    grad_norm).  Before, each logged metric added 64 bits each way a round.  Every record with the optimum holds the
    suboptimality of its objective (FedNL-LS's, whose objective is its own message, too)."""
    method = name.removesuffix("_paper").removesuffix("_ls")
    plain, measured = (measured_records(method, optimum, **MEASURING[name]) for optimum in ("none", "auto"))
    assert not any("suboptimality" in r for r in plain)
    optimum = measured[0]["objective"] - measured[0]["suboptimality"]  # every record's O(w) − O*, the same O*
    gaps = [r["objective"] - r["suboptimality"] for r in measured]
    assert gaps == pytest.approx([optimum] * len(measured), rel=0, abs=1e-14)
    assert len(plain) == len(measured) >= 2
    for key in ("uplink_bits", "downlink_bits"):
        assert [r[key] for r in measured] == [r[key] for r in plain], key
    assert plain[-1]["uplink_bits"] > 0
    assert measured[-1]["bytes_sent"] != plain[-1]["bytes_sent"]  # the metrics are on the wire


def test_dane_charges_its_gradient_iterate_and_what_its_safeguard_reads():
    """DANE's round per worker, ``comm.compress=none``, d = 30: the gradient and the averaged iterate, 64 · 2d each
    way; with the safeguard also the objective and its one statistic it reads, 64 · 2 (and not the suboptimality)."""
    d = 30
    for keys, per_round in (({"safeguard": False, "mu": 0.1}, 64 * 2 * d), ({}, 64 * (2 * d + 2))):
        records = measured_records("dane", "auto", **keys)
        for key in ("uplink_bits", "downlink_bits"):
            assert [r[key] for r in records] == [t * per_round for t in range(4)], (keys, key)


def test_metrics_message_sends_the_read_objective_as_the_method_s_own_and_puts_the_metrics_together_again():
    """`metrics_message`'s split, entry by entry: a round that reads the objective sends [O_i, then ``beside``]
    counted (kind None) and the other metrics as `METRICS`; one without other metrics sends no empty tensor; a round
    that only logs sends the metrics whole as `METRICS`; `metrics_received` gives back the metrics in their order
    and ``beside``, also over stacked workers' rows."""
    from dane.algorithm import metrics_message, metrics_received
    from dane.comm.compression import METRICS as MEASURED_KIND

    metrics, beside = torch.tensor([3.0, 0.5, 0.25]), torch.tensor([7.0, 8.0])
    parts, kinds = metrics_message(metrics, reads_objective=True, beside=beside)
    assert [p.tolist() for p in parts] == [[3.0, 7.0, 8.0], [0.5, 0.25]] and kinds == (None, MEASURED_KIND)
    got, stats = metrics_received(parts, reads_objective=True)
    assert got.tolist() == [3.0, 0.5, 0.25] and stats.tolist() == [7.0, 8.0]
    parts, kinds = metrics_message(torch.tensor([3.0]), reads_objective=True)  # the objective alone: one tensor
    assert [p.tolist() for p in parts] == [[3.0]] and kinds == (None,)
    got, stats = metrics_received(parts, reads_objective=True)
    assert got.tolist() == [3.0] and stats.numel() == 0
    parts, kinds = metrics_message(metrics, reads_objective=False)
    assert [p.tolist() for p in parts] == [[3.0, 0.5, 0.25]] and kinds == (MEASURED_KIND,)
    got, stats = metrics_received(parts, reads_objective=False)
    assert got.tolist() == [3.0, 0.5, 0.25] and stats.numel() == 0
    rows = torch.tensor([[3.0, 0.5], [4.0, 0.75]])  # two stacked workers' metrics: split over the last axis
    parts, _ = metrics_message(rows, reads_objective=True, beside=torch.tensor([[7.0], [9.0]]))
    assert [p.tolist() for p in parts] == [[[3.0, 7.0], [4.0, 9.0]], [[0.5], [0.75]]]


@pytest.mark.parametrize("adapt, reads", [([], False), (["momentum_restart"], True), (["tau_growth"], True)])
def test_aide_charges_the_objective_where_a_tau_rule_reads_it(adapt, reads):
    """AIDE's round per worker, ``comm.compress=none``, d = 30: g and the averaged iterate, 64 · 2d each way, and the
    objective, 64, where τ's growth or the momentum restart (either alone) reads it; τ=auto's round 0 also averages
    the column curvature D (64 d) and τ (64).  A given τ attaches neither rule: 64 · 2d from round 0."""
    d, read = 30, 64 * reads

    def bits(**keys):
        records = measured_records("aide", local_solver="cg", **keys)
        return [[r[key] for r in records] for key in ("uplink_bits", "downlink_bits")]

    first = 64 * (3 * d + 1) + read
    assert bits(adapt=adapt) == [[0, first, first + 64 * 2 * d + read, first + 2 * (64 * 2 * d + read)]] * 2
    if not adapt:
        assert bits(tau=0.1) == [[t * 64 * 2 * d for t in range(4)]] * 2


def test_fednl_ls_charges_the_objective_its_search_starts_from_and_each_trial():
    """FedNL-LS's round per worker, ``comm.compress=none``, d = 30, without a reference optimum: g, the packed S_i
    (d(d+1)/2 entries) and l_i, 64 (d + d(d+1)/2 + 1), as plain FedNL's, and the objective its search starts from,
    64, and each trial's O(x + t d), 64 a trial: t = γ^(trials − 1) at γ = 1/2.  Plain FedNL's metrics ride uncounted,
    as FedNL-PP's do beside its S_i, l_i and g_i changes (the same sizes, every worker's dense message)."""
    d = 30
    message = 64 * (d + d * (d + 1) // 2 + 1)
    # PP: the changes of H_i, l_i and g_i, with a reference optimum (two metrics, no gradient for grad_norm)
    for variant, keys, optimum in (("plain", {}, "none"), ("ls", {}, "none"), ("pp", {"clients_per_round": 2}, "auto")):
        records = measured_records("fednl", optimum, compressor="topk:30", variant=variant, **keys)
        for before, after in zip(records, records[1:]):
            trials = 1 + round(math.log2(1 / before["step_size"])) if variant == "ls" else 0
            read = 64 * (1 + trials) if variant == "ls" else 0
            assert after["uplink_bits"] - before["uplink_bits"] == message + read, (variant, before["round"])
        if variant == "ls":
            assert {r["step_size"] for r in records[:-1]} == {1.0, 0.25}  # one trial, and three


@pytest.mark.parametrize("keys, rounds", [({"control_variate": 2, "averaging": "random"}, [3, 2, 2]),
                                          ({"control_variate": 2}, [2, 1, 1]),
                                          ({"control_variate": 1, "averaging": "random"}, [2, 2, 2])])
def test_fedred_charges_its_messages_and_not_the_riding_metrics(keys, rounds):
    """FedRed's rounds per worker, ``comm.compress=none``, d = 30, from the first record (the set-up's measurements
    before it), in d-vectors of 64 bits: type 1 sends ∇O_i(x̃) and x_i (2d); type 2 sends x_i alone (d), and under
    random averaging the chosen x_j beside it (2d); type 2's round 0 is type 1's h_i, then its averaging allreduce.
    The metrics of x̃ ride uncounted, but the chosen x_j that rides after them (round 0: alone) is counted."""
    up = [r["uplink_bits"] for r in measured_records("fedred", **keys)]
    assert [b - a for a, b in zip(up, up[1:])] == [64 * 30 * k for k in rounds]


@pytest.mark.parametrize("name, keys, per_round", [("admm", {"rho": 0.1}, 64 * (30 + 1)),
                                                   ("local_sgd", {}, 64 * 30),
                                                   ("local_sgd", {"aggregate": "weighted"}, 64 * 30)])
def test_admm_and_local_sgd_charge_their_average_and_not_the_riding_metrics(name, keys, per_round):
    """A round per worker, ``comm.compress=none``, d = 30, each way: ADMM's x_i + u_i and the primal residual's
    ‖x_i − z‖² it reads for ρ (64 (d + 1)); local SGD's w_i, or n_i w_i under the weighted mean (64 d); the metrics
    (and the gradient for grad_norm without an optimum) ride uncounted."""
    records = measured_records(name, **keys)
    for key in ("uplink_bits", "downlink_bits"):
        bits = [r[key] for r in records]
        assert [b - a for a, b in zip(bits, bits[1:])] == [per_round] * 3, key
