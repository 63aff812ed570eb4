"""FedNL (baselines/fednl.py; its clients' Hessians: dane/problems/stacked_hessians.py) against dense NumPy
Hessians, Newton's method and the optimum of a small logistic regression."""
from __future__ import annotations

import time

import numpy as np
import pytest
import scipy.optimize
import scipy.sparse
import torch

from dane.baselines.fednl import PHASES, FedNLConfig, batched, hessian_step, theoretical_alpha, uplink_bits
from dane.problems.stacked_compress import compress_rows, randk_indices, randk_reference
from dane.problems.stacked_hessians import CompactHessians, frobenius_norms, pack, triangle_weights, unpack
from dane.problems.stacked_rows import StackedRows
from dane.compress import make
from dane.errors import ConfigError
from dane.losses import LOSSES
from dane.problems.glm import LinearModelShard, add_intercept, to_torch
from helpers import straight_and_resumed

LAM = 1e-3


def sparse_logistic(n=240, d=12, density=0.3, seed=0, ones=0.7):
    """Sparse rows (a share ``ones`` of the values 1, as in binary features, the rest normal), ±1 labels from a
    planted model, an intercept column."""
    rng = np.random.default_rng(seed)
    X = scipy.sparse.random(n, d, density=density, random_state=seed, format="csr",
                            data_rvs=lambda k: np.where(rng.random(k) < ones, 1.0, rng.normal(size=k)))
    X = add_intercept(X)
    y = np.where(X @ rng.normal(size=d + 1) + 0.5 * rng.normal(size=n) > 0, 1.0, -1.0)
    return X.tocsr(), y


def shards_of(X, y, m):
    parts = np.array_split(np.arange(X.shape[0]), m)
    return [LinearModelShard(to_torch(X[p]), torch.from_numpy(y[p]), LOSSES["logistic"], l2=LAM,
                             weight=m / X.shape[0]) for p in parts]


def dense_objective(X, y):
    A = X.toarray()
    n = len(y)

    def value(w):
        return np.logaddexp(0, -y * (A @ w)).sum() / n + 0.5 * LAM * w @ w

    def grad(w):
        return A.T @ (-y / (1 + np.exp(y * (A @ w)))) / n + LAM * w

    def hess(w):
        s = 1 / (1 + np.exp(-(A @ w)))
        return (A.T * (s * (1 - s))) @ A / n + LAM * np.eye(A.shape[1])

    return value, grad, hess


@pytest.fixture(scope="module")
def problem():
    X, y = sparse_logistic()
    value, grad, hess = dense_objective(X, y)
    w = np.zeros(X.shape[1])
    for _ in range(30):  # Newton to machine precision, checked against L-BFGS below
        w = w - np.linalg.solve(hess(w), grad(w))
    return X, y, w, (value, grad, hess)


def test_optimum_agrees_with_lbfgs(problem):
    X, y, w_star, (value, grad, _) = problem
    res = scipy.optimize.minimize(value, np.zeros(len(w_star)), jac=grad, method="L-BFGS-B",
                                  options={"gtol": 1e-12, "ftol": 0, "maxiter": 10_000})
    assert np.linalg.norm(grad(w_star)) < 1e-14
    assert abs(res.fun - value(w_star)) < 1e-12


def test_stacked_hessians_equal_dense_per_client(problem):
    X, y, _, _ = problem
    shards = shards_of(X, y, 5)
    clients = CompactHessians(StackedRows(shards))
    x = np.random.default_rng(1).normal(size=clients.d) * 0.3
    grads, compact = clients.gradients_hessians(x)
    hess = clients.expand(compact)
    for c, shard in enumerate(shards):
        A = shard.X.to_dense().numpy()
        s = 1 / (1 + np.exp(-(A @ x)))
        dense = shard.weight * (A.T * (s * (1 - s))) @ A + LAM * np.eye(clients.d)
        np.testing.assert_allclose(unpack(hess[c], clients.d), dense, rtol=0, atol=1e-12)
        np.testing.assert_allclose(grads[c], shard.evaluate(torch.from_numpy(x))[0].numpy(), rtol=0, atol=1e-12)
    subset = np.array([3, 1])
    g_sub, h_sub = clients.gradients_hessians(x, subset)
    np.testing.assert_allclose(h_sub, compact[subset], rtol=0, atol=1e-13)
    np.testing.assert_array_equal(clients.restrict(hess), compact)  # nothing off the supports
    np.testing.assert_allclose(clients.packed_sum(compact), hess.sum(0), rtol=0, atol=1e-13)
    v = np.random.default_rng(2).normal(size=clients.d)
    np.testing.assert_allclose(clients.matvec(compact, v), unpack(hess, clients.d) @ v, rtol=0, atol=1e-13)
    np.testing.assert_allclose(g_sub, grads[subset], rtol=0, atol=1e-13)


def test_packing_and_frobenius():
    M = np.random.default_rng(2).normal(size=(3, 5, 5))
    M = M + M.transpose(0, 2, 1)
    np.testing.assert_array_equal(unpack(pack(M), 5), M)
    np.testing.assert_allclose(frobenius_norms(pack(M), triangle_weights(5)), np.linalg.norm(M, axis=(1, 2)),
                               rtol=1e-14)


def test_identity_first_step_is_newton_and_converges(problem):
    X, y, w_star, (value, grad, hess) = problem
    run = batched(StackedRows(shards_of(X, y, 4)), compressor="none", option=1)
    assert run.alpha == 1.0
    run.step()
    np.testing.assert_allclose(run.w.numpy(), -np.linalg.solve(hess(np.zeros(len(w_star))),
                                                                grad(np.zeros(len(w_star)))), rtol=0, atol=1e-13)
    errors = [np.linalg.norm(run.w.numpy() - w_star)]
    for _ in range(12):
        run.step()
        errors.append(np.linalg.norm(run.w.numpy() - w_star))
    assert errors[-1] < 1e-13
    # superlinear: the lagged Hessian (Newton with H from the previous point) contracts faster every round
    fast = [e for e in errors if e > 1e-11]
    ratios = [b / a for a, b in zip(fast, fast[1:])]
    assert ratios[-1] < 0.1 * ratios[0] and ratios[-1] < 1e-2


@pytest.mark.parametrize("spec, alpha, variant", [("topk:20", None, "plain"), ("topk:20", 0.2, "plain"),
                                                  ("randk:20", None, "ls"), ("rank:2", None, "plain")])
def test_compressed_converges_to_optimum(problem, spec, alpha, variant):
    """From x0 = 0 (far from w*: FedNL's theory is local), RandK's noisy H needs FedNL-LS's line search here."""
    X, y, w_star, (value, grad, _) = problem
    run = batched(StackedRows(shards_of(X, y, 4)), compressor=spec, alpha=alpha, seed=3, variant=variant, option=1)
    for _ in range(300):
        run.step()
        if np.linalg.norm(run.w.numpy() - w_star) < 1e-10:
            break
    assert np.linalg.norm(run.w.numpy() - w_star) < 1e-10, spec
    assert np.linalg.norm(grad(run.w.numpy())) < 1e-10


@pytest.mark.parametrize("option, variant", [(2, "plain"), (1, "ls")])
def test_option2_and_line_search_converge(problem, option, variant):
    X, y, w_star, (value, grad, _) = problem
    run = batched(StackedRows(shards_of(X, y, 4)), compressor="topk:10", alpha=1.0, option=option, variant=variant)
    for _ in range(300):
        run.step()
    assert np.linalg.norm(run.w.numpy() - w_star) < 1e-9


def test_pp_with_every_client_and_identity_is_newton(problem):
    X, y, w_star, (value, grad, hess) = problem
    run = batched(StackedRows(shards_of(X, y, 4)), compressor="none", option=2, variant="pp", clients_per_round=4)
    w = np.zeros(len(w_star))
    for _ in range(6):
        run.step()
        w = w - np.linalg.solve(hess(w), grad(w))
        np.testing.assert_allclose(run.w.numpy(), w, rtol=0, atol=1e-12)


def test_pp_samples_converge(problem):
    X, y, w_star, _ = problem
    run = batched(StackedRows(shards_of(X, y, 6)), compressor="topk:20", option=2, variant="pp", clients_per_round=2,
                  seed=5)
    for _ in range(400):
        run.step()
    assert np.linalg.norm(run.w.numpy() - w_star) < 1e-9


@pytest.mark.parametrize("spec", ["none", "topk:7", "randk:7", "natural", "rank:2"])
def test_bits_are_rounds_times_closed_form(problem, spec):
    X, y, _, _ = problem
    m, d = 4, X.shape[1]
    T = d * (d + 1) // 2
    run = batched(StackedRows(shards_of(X, y, m)), compressor=spec, option=1)
    for _ in range(3):
        spent = run.spent()  # what the round loop writes into the round's record (`dane.algorithm.Rounds.spent`)
        run.step()
    hessian = {"none": 64 * T, "topk:7": 7 * (64 + (T - 1).bit_length()), "randk:7": 7 * 64, "natural": 12 * T,
               "rank:2": 2 * (d + 1) * 64}[spec]
    assert uplink_bits(make(spec), d, variant="plain", option=1) == hessian + 64 * d
    # FedNL-LS also sends f_i(x_k), the value its search starts from (its trials are counted apart); option 2 its l_i
    assert uplink_bits(make(spec), d, variant="ls", option=1) == hessian + 64 * d + 64
    assert uplink_bits(make(spec), d, variant="ls", option=2) == hessian + 64 * d + 128
    assert spent["clients_uplink_bits"] == m * 64 * T + 2 * m * (hessian + 64 * d)  # to reach x_2, round 2's own
    assert run.uplink_bits == m * 64 * T + 3 * m * (hessian + 64 * d)


def test_default_alpha_per_class():
    d, T = 10, 55
    assert hessian_step(make("topk:11"), d, None) == 1.0  # the paper's α = 1 option for a contractive C
    assert theoretical_alpha(make("topk:11"), d) == pytest.approx(1 - np.sqrt(1 - 11 / T))
    assert hessian_step(make("randk:11"), d, None) == pytest.approx(11 / T)
    assert hessian_step(make("none"), d, None) == 1.0
    assert hessian_step(make("topk:11"), d, 0.7) == 0.7


@pytest.mark.parametrize("spec,variant", [("topk:9", "plain"), ("randk:9", "plain"), ("topk:9", "pp")])
def test_threads_change_no_iterate(problem, spec, variant):
    """The Hessians' product and TopK's selection split over threads by clients: the same numbers as one thread."""
    X, y, _, _ = problem
    options = dict(variant="pp", clients_per_round=3) if variant == "pp" else {}
    rows = StackedRows(shards_of(X, y, 5))
    runs = [batched(rows, compressor=spec, seed=2, threads=threads, option=1 if variant == "plain" else 2, **options)
            for threads in (1, 2, 3)]
    for _ in range(4):
        for run in runs:
            run.step()
    for run in runs[1:]:
        np.testing.assert_array_equal(run.w.numpy(), runs[0].w.numpy())
        np.testing.assert_array_equal(run.client.H_i, runs[0].client.H_i)
        np.testing.assert_array_equal(run.H, runs[0].H)


@pytest.mark.parametrize("keys, slowed", [({"variant": "ls"}, 2), ({}, 1), ({"variant": "pp", "clients_per_round": 2}, 1)])
def test_the_server_step_is_clocked_as_newton(problem, monkeypatch, keys, slowed):
    """`FedNL.step` clocks its round by phase (`PHASES`) into ``client.seconds``: the server's step (Newton's direction
    and FedNL-LS's search; FedNL-PP's (H + lI)⁻¹g), each slowed here by ``delay``, in ``newton`` alone."""
    import dane.baselines.fednl as fednl

    delay, rounds = 0.1, 3

    def slow(inner):
        def slowed_down(*args, **kwargs):
            time.sleep(delay)
            return inner(*args, **kwargs)
        return slowed_down

    for name in ("newton_direction", "armijo_backtrack", "shifted_newton"):
        monkeypatch.setattr(fednl, name, slow(getattr(fednl, name)))
    X, y, _, _ = problem
    run = batched(StackedRows(shards_of(X, y, 4)), compressor="topk:10", **keys)
    for _ in range(rounds):
        run.step()
    seconds = run.client.seconds
    assert tuple(seconds) == PHASES == ("oracles", "compress", "update", "newton")
    assert seconds["newton"] >= rounds * slowed * delay
    assert all(0 < seconds[phase] < rounds * delay for phase in PHASES[:3])  # the sleeps in none of the others


def test_the_benchmarks_stacked_run_steps_fednl_on_the_batched_communicator():
    """scripts/bench_fednl.py's stacked timing (`stacked_run`) is `batched`'s rounds: its gradient norm that of the
    iterate the same rounds reach, its bits a client's closed form (`uplink_bits`), every phase timed."""
    from scripts.bench_fednl import OPTION, stacked_run, synthetic_clients

    rows = synthetic_clients(4, 20)
    for spec, pp in (("topk:84", None), ("randk:84", 2)):
        out = stacked_run(rows, spec, 3, pp, 1, None)
        run = batched(rows, compressor=spec, seed=1, option=OPTION,
                      **({"variant": "pp", "clients_per_round": pp} if pp else {}))
        for _ in range(3):
            run.step()
        assert out["grad_norm"] == float(np.linalg.norm(rows.mean_gradient(run.w.numpy())))
        assert out["uplink_bits_per_client_round"] == uplink_bits(make(spec), 21, variant="pp" if pp else "plain",
                                                                  option=OPTION)
        assert out["alpha"] == (1.0 if pp is None else 84 / 231)
        assert set(out["phase_s_per_round"]) == set(PHASES) and all(s > 0 for s in out["phase_s_per_round"].values())


def test_same_seed_same_iterates(problem):
    X, y, _, _ = problem
    runs = [batched(StackedRows(shards_of(X, y, 4)), compressor="randk:9", seed=s, option=1) for s in (7, 7, 8)]
    for run in runs:
        for _ in range(5):
            run.step()
    np.testing.assert_array_equal(runs[0].w.numpy(), runs[1].w.numpy())
    assert not np.array_equal(runs[0].w.numpy(), runs[2].w.numpy())


@pytest.mark.parametrize("spec, expected", [
    ("rank:14", "algorithm.compressor=rank:14 keeps rank R = 14 of a 13×13 matrix; choose R <= 13 (rank:13 sends the "
                "whole matrix)"),
    ("topk:92", "algorithm.compressor=topk:92 keeps K = 92 entries of a message of 91; choose K <= 91 (topk:91 keeps "
                "them all), or a fraction of each message (topk:0.1)"),
])
def test_a_compressor_beyond_the_message_is_refused_as_the_clients_are_built(problem, monkeypatch, spec, expected):
    """d = 13 (12 features and the intercept), a packed triangle of 91: rank:14 ran as rank 13 under its own name;
    it and topk:92 are refused as the clients are built, before their Hessians (`Compressor.check_fits`)."""
    X, y, _, _ = problem
    rows = StackedRows(shards_of(X, y, 4))

    def no_hessians(*args, **kwargs):
        raise AssertionError("the Hessians were built before the refusal")

    monkeypatch.setattr(CompactHessians, "gradients_hessians", no_hessians)
    with pytest.raises(ConfigError) as error:
        batched(rows, compressor=spec, option=1)
    assert str(error.value) == expected


@pytest.mark.parametrize("overrides, words", [
    ({"variant": "ls", "clients_per_round": 2}, "algorithm.variant=pp"),
    ({"variant": "pp", "option": 1}, "algorithm.option=2"),
    ({"option": 3}, "algorithm.option must be 1"),
    ({"compressor": "topk"}, "compressor"),
    ({"ls_gamma": 1.0}, "algorithm.ls_gamma"),
])
def test_bad_config_is_one_line(overrides, words):
    with pytest.raises(ConfigError, match=words.replace(".", r"\.")):
        FedNLConfig(**overrides)


def test_option_follows_the_variant_and_divergence_names_the_line_search():
    """``option`` null is the shifted step (2), FedNL-PP's and the robust one from a far start, except for FedNL-LS,
    whose direction is the projected one (1); a diverging plain run is told FedNL-LS first (plain FedNL converges
    locally), then option 2 where it stepped with option 1."""
    assert FedNLConfig(variant="pp", clients_per_round=2).chosen_option == 2
    assert FedNLConfig().chosen_option == 2 and FedNLConfig(variant="ls").chosen_option == 1
    assert FedNLConfig(variant="ls", option=2).chosen_option == 2
    assert [h.split(" ")[0] for h in FedNLConfig(option=1).recovery()] == ["algorithm.variant=ls", "algorithm.option=2"]
    assert [h.split(" ")[0] for h in FedNLConfig().recovery()] == ["algorithm.variant=ls"]
    assert FedNLConfig(variant="ls").recovery() == []


def test_the_resolved_nulls_land_in_the_summary():
    """α by the compressor's class (1/(ω + 1) = k/T for RandK on the T-entry packed triangle), option 1's μ the ℓ2
    weight, the option by the variant; a run given every number says no package rule applied."""
    import dane

    X, y = sparse_logistic()
    problem = dane.problems.LogReg(X, y, lam=1e-3, fit_intercept=False)
    T = X.shape[1] * (X.shape[1] + 1) // 2
    ls = dane.fit(problem, "fednl", workers=2, rounds=1, compressor="randk:9", variant="ls")
    entries = {e["key"]: (e["value"], e["rule"]) for e in ls.summary["defaults"]}
    assert entries["algorithm.alpha"][0] == pytest.approx(9 / T, rel=1e-15)
    assert entries["algorithm.mu"][0] == 1e-3 and entries["algorithm.option"][0] == 1
    plain = dane.fit(problem, "fednl", workers=2, rounds=1, compressor="topk:9")
    assert {e["key"]: e["value"] for e in plain.summary["defaults"]} == {"algorithm.alpha": 1.0, "algorithm.option": 2}
    given = dane.fit(problem, "fednl", workers=2, rounds=1, compressor="topk:9", alpha=1.0, option=2)
    assert given.summary["defaults"] == [] and given.summary["package_rules_applied"] is False
    assert [r["objective"] for r in given.records] == [r["objective"] for r in plain.records]


# ------------------------------------------------------------------ one worker per client (the simulator's threads)
@pytest.mark.parametrize("overrides", [
    {"compressor": "topk:15", "option": 1},
    {"compressor": "randk:15"},
    {"compressor": "randk:15", "variant": "pp", "option": 2, "clients_per_round": 2},
    {"compressor": "topk:15", "variant": "ls", "alpha": 1.0},
    {"compressor": "topk:15", "variant": "pp", "option": 2, "clients_per_round": 2},
])
def test_worker_level_equals_stacked(overrides):
    """The simulator's FedNL (a thread per client, allreduces) gives the stacked run's iterates and bits.  Real-valued
    rows: binary ones make Hessian entries of equal magnitude, whose order torch.topk breaks differently on a batch
    of rows than on one."""
    from helpers import simulate

    X, y = sparse_logistic(ones=0.0)
    m, rounds = 4, 6
    config = FedNLConfig(**overrides)
    out = simulate(config, shards_of(X, y, m), rounds)
    stacked = batched(StackedRows(shards_of(X, y, m)), **overrides)  # all m clients on one batched communicator
    records = out[0][1]
    for t, w in enumerate(out[0][2]):
        np.testing.assert_allclose(w.numpy(), stacked.w.numpy(), rtol=0, atol=1e-12, err_msg=f"round {t}")
        assert records[t]["clients_uplink_bits"] == stacked.uplink_bits  # cumulative to reach x_t, H_i^0 included
        if t < len(records) - 1:  # the last record is the final iterate's evaluation, after the last round
            stacked.step()
    for _, records, ws in out[1:]:  # every worker holds the same iterate
        assert all(torch.equal(a, b) for a, b in zip(out[0][2], ws))


@pytest.mark.parametrize("overrides", [{"compressor": "randk:9"}, {"compressor": "randk:9", "variant": "pp", "option": 2,
                                                                    "clients_per_round": 2},
                                       {"compressor": "randk:9", "variant": "pp", "option": 2, "clients_per_round": 2,
                                        "sampling": "size"}])  # FedNL-PP keeps sampling=size (`dane.sampling`)
def test_a_resumed_run_continues_exactly(overrides):
    X, y = sparse_logistic(ones=0.0)
    for straight, again, w1, w2 in straight_and_resumed(FedNLConfig(**overrides), shards_of(X, y, 4)):
        drop = ("time_s", "bytes_sent", "comm_rounds")  # the second build's setup allreduce counts on the communicator
        assert [{k: v for k, v in r.items() if k not in drop} for r in straight] == \
            [{k: v for k, v in r.items() if k not in drop} for r in again]
        assert torch.equal(w1, w2)


def test_randk_indices_per_client_streams():
    """Distinct, in range, a client alone draws its row of the batch, and each position is drawn k/n of the time."""
    n, k = 50, 7
    batch = randk_indices(3, np.arange(5), 11, n, k)
    assert batch.shape == (5, k) and batch.min() >= 0 and batch.max() < n
    assert all(len(set(row)) == k for row in batch)
    np.testing.assert_array_equal(randk_indices(3, np.array([2]), 11, n, k)[0], batch[2])
    np.testing.assert_array_equal(batch, randk_reference(3, np.arange(5), 11, n, k))  # numba = NumPy
    np.testing.assert_array_equal(randk_indices(9, np.arange(3), 0, 45451, 2408),
                                  randk_reference(9, np.arange(3), 0, 45451, 2408))
    assert not np.array_equal(randk_indices(3, np.array([2]), 12, n, k), randk_indices(3, np.array([2]), 11, n, k))
    counts = np.bincount(np.concatenate([randk_indices(0, np.arange(4), r, n, k).ravel() for r in range(2000)]),
                         minlength=n)
    # 8000 draws of 7 of 50 positions: 1120 expected per position, binomial sd ~31; 5 sd over 50 positions
    assert np.abs(counts - 8000 * k / n).max() < 5 * np.sqrt(8000 * k / n * (1 - k / n))
    assert sorted(randk_indices(1, np.arange(2), 0, 9, 9)[1]) == list(range(9))  # k = n: every position


@pytest.mark.parametrize("spec", ["topk:9", "topk:400", "randk:9", "natural", "rank:2"])
def test_compact_compression_equals_packed(spec):
    """C on the compact rows decodes to C on the whole packed triangle: TopK keeps the same entries, RandK scales
    the drawn positions that fall on the support by T/k (the others are zero), rank:R sees the same matrix."""
    X, y = sparse_logistic(n=90, d=30, density=0.06, ones=0.0)
    clients = CompactHessians(StackedRows(shards_of(X, y, 3)), whole=spec.startswith("rank"))
    assert clients.S < clients.T / 2 or spec.startswith("rank")  # supports well short of the triangle
    diff = clients.gradients_hessians(np.full(clients.d, 0.1))[1] - clients.gradients_hessians(np.zeros(clients.d))[1]
    packed = clients.expand(diff)
    compressor = make(spec)
    got = clients.expand(compress_rows(compressor, diff, clients, None, seed=4, draw=2,
                                       generator=torch.Generator().manual_seed(0)))
    if spec.startswith("rank"):
        with pytest.raises(ConfigError, match="whole=True"):
            partial = CompactHessians(StackedRows(shards_of(X, y, 3)))
            compress_rows(compressor, np.zeros((3, partial.S)), partial, None, seed=0, draw=0)
    if spec.startswith("topk"):
        want = compressor(torch.from_numpy(np.ascontiguousarray(packed))).numpy()
    elif spec.startswith("randk"):
        idx = randk_indices(4, clients.ids, 2, clients.T, 9)
        want = np.zeros_like(packed)
        np.put_along_axis(want, idx, np.take_along_axis(packed, idx, 1) * clients.T / 9, 1)
    elif spec == "natural":  # random rounding: every entry a neighbouring power of two of the same sign, zeros kept
        assert np.all((got == 0) == (packed == 0))
        nz = packed != 0
        np.testing.assert_array_equal(np.sign(got[nz]), np.sign(packed[nz]))
        ratio = np.abs(got[nz]) / np.abs(packed[nz])
        assert np.all((ratio > 0.5) & (ratio < 2))
        return
    else:
        want = pack(compressor(torch.from_numpy(unpack(packed, clients.d)),
                               torch.Generator().manual_seed(0)).numpy())
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-15)


def test_a_line_search_that_no_trial_passes_takes_no_step():
    """FedNL-LS's Armijo search: the first passing t of 1, γ, γ², …; where no trial passes (an ascent direction
    against an O(x_k) a little below the objective's own value, as a reduced sum can round) the round keeps its
    iterate (t = 0) after the 60 trials it paid for, instead of an untested γ⁶⁰."""
    from dane.baselines.fednl_server import LS_TRIALS, armijo_backtrack

    x, g = np.array([1.0, -2.0]), np.array([2.0, -4.0])  # O(x) = ‖x‖², its gradient 2x
    objective = lambda z: float(z @ z)  # noqa: E731
    assert armijo_backtrack(objective, x, objective(x), g, -g / 2, c=0.5, gamma=0.5) == (1.0, 1)  # Newton: t = 1
    assert armijo_backtrack(objective, x, objective(x), g, -2 * g, c=0.5, gamma=0.5) == (0.25, 3)  # 4x too long
    assert armijo_backtrack(objective, x, objective(x) - 1e-9, g, g, c=0.5, gamma=0.5) == (0.0, LS_TRIALS)
