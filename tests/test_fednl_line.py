"""The rest of the FedNL line (baselines/newton_star.py, ...): each round against a NumPy transcription of the
paper's (FedNL-Public's ``methods.py`` conventions where they can be matched) on a tiny problem, and the bits of
each message against a hand count."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse
import torch

from dane.baselines.newton_star import NewtonStarConfig
from dane.errors import ConfigError
from dane.losses import LOSSES
from dane.problems.glm import LinearModelShard, add_intercept, to_torch
from dane.problems.stacked_rows import StackedRows
from helpers import simulate, simulate_stacked, straight_and_resumed

LAM, M, D = 1e-2, 3, 5  # d = D + 1 with the intercept


def data(n=60, seed=0):
    rng = np.random.default_rng(seed)
    X = add_intercept(scipy.sparse.csr_matrix(rng.normal(size=(n, D)))).tocsr()
    y = np.where(X @ rng.normal(size=D + 1) + 0.5 * rng.normal(size=n) > 0, 1.0, -1.0)
    return X, y


def dense(X, y, loss):
    A, n = X.toarray(), len(y)

    def grad(w):
        z = A @ w
        dz = -y / (1 + np.exp(y * z)) if loss == "logistic" else z - y
        return A.T @ dz / n + LAM * w

    def hess(w):
        s = 1 / (1 + np.exp(-(A @ w))) if loss == "logistic" else None
        c = s * (1 - s) if loss == "logistic" else np.ones(n)
        return (A.T * c) @ A / n + LAM * np.eye(A.shape[1])

    return grad, hess


def optimum(grad, hess, d):
    w = np.zeros(d)
    for _ in range(40):
        w = w - np.linalg.solve(hess(w), grad(w))
    return w


def shards(X, y, loss, w_star=None):
    parts = np.array_split(np.arange(X.shape[0]), M)
    out = [LinearModelShard(to_torch(X[p]), torch.from_numpy(y[p]), LOSSES[loss], l2=LAM, weight=M / X.shape[0])
           for p in parts]
    if w_star is not None:
        for shard in out:
            shard.set_reference(torch.from_numpy(w_star), 0.0)
    return out


def stacked(config, shards, rounds):
    """`simulate` on the batched communicator: the shards' rows stacked (`StackedRows`), one computation for the M
    clients (`helpers.simulate_stacked`), for the transcriptions, whose point is not the per-worker path."""
    return simulate_stacked(config, StackedRows(shards), rounds)


@pytest.fixture(scope="module")
def logistic():
    X, y = data()
    grad, hess = dense(X, y, "logistic")
    w_star = optimum(grad, hess, X.shape[1])
    assert np.linalg.norm(grad(w_star)) < 1e-14
    return X, y, grad, hess, w_star


# ------------------------------------------------------------------ Newton-Star
def test_newton_star_one_step_on_a_quadratic():
    X, y = data(seed=1)
    grad, hess = dense(X, y, "squared")
    w_star = np.linalg.solve(hess(np.zeros(D + 1)), -grad(np.zeros(D + 1)))
    _, records, ws = simulate(NewtonStarConfig(), shards(X, y, "squared", w_star), 2)[0]
    np.testing.assert_allclose(ws[1].numpy(), w_star, rtol=0, atol=1e-13)


def test_newton_star_iterates_and_bits(logistic):
    """x_{k+1} = x_k − ∇²O(x*)⁻¹∇O(x_k) (FedNL-Public's ``Newton_Star.step``), 3 rounds, and the bits: 64·d(d+1)/2
    once, 64·d a round, per client."""
    X, y, grad, hess, w_star = logistic
    algo, records, ws = stacked(NewtonStarConfig(), shards(X, y, "logistic", w_star), 3)[0]
    d, H_star, x = D + 1, hess(w_star), np.zeros(D + 1)
    for k in range(1, 4):
        x = x - np.linalg.inv(H_star) @ grad(x)
        np.testing.assert_allclose(ws[k].numpy(), x, rtol=0, atol=1e-12)
    assert [r["clients_uplink_bits"] for r in records] == [M * 64 * (21 + k * 6) for k in range(4)]  # to reach x_k
    assert d * (d + 1) // 2 == 21


def test_newton_star_needs_the_optimum(logistic):
    X, y, *_ = logistic
    with pytest.raises(ConfigError, match="algorithm=newton_star steps with the Hessian at the optimum"):
        simulate(NewtonStarConfig(), shards(X, y, "logistic"), 1)
    with pytest.raises(ConfigError, match="algorithm=newton_star does not take algorithm.clients_per_round=2"):
        NewtonStarConfig(clients_per_round=2)


def test_newton_star_resumes(logistic):
    X, y, _, _, w_star = logistic
    for straight, resumed, w1, w2 in straight_and_resumed(NewtonStarConfig(), shards(X, y, "logistic", w_star)):
        assert straight == resumed and torch.equal(w1, w2)


# ------------------------------------------------------------------ TopLEK and RandSeqK (dane/compress/sparsifiers.py)
def test_toplek_by_hand():
    """x = (1, −4, 2, 3), k = 2, δ = 1/2: ‖x‖² = 30, target (1 − δ)·30 = 15.  Top 2 = {−4, 3} (error 5); dropping 3
    gives 14 ≤ 15 (dropped); dropping −4 gives 30 > 15: dropped with p = (15 − 14)/(30 − 14) = 1/16."""
    from dane.compress import TopLEK, make

    c = make("toplek:2")
    assert isinstance(c, TopLEK) and not c.unbiased and c.delta(4) == 0.5
    x = torch.tensor([1.0, -4.0, 2.0, 3.0], dtype=torch.float64)
    assert TopLEK.kept(x, 2, 1 / 16 - 1e-9).tolist() == []
    assert TopLEK.kept(x, 2, 1 / 16 + 1e-9).tolist() == [1]
    coin = float(torch.rand(1, generator=torch.Generator().manual_seed(5), dtype=torch.float64))
    expected = torch.zeros(4, dtype=torch.float64) if coin < 1 / 16 else torch.tensor([0, -4.0, 0, 0], dtype=torch.float64)
    assert torch.equal(c(x, torch.Generator().manual_seed(5)), expected)
    # E‖C(x) − x‖² = (15/16)·14 + (1/16)·30 = 15 = (1 − δ)‖x‖²; with k = 3: top 3 error 1, drop 2 → 5 ≤ 7.5, drop 3
    # → 14 > 7.5, p = 2.5/9
    assert TopLEK.kept(x, 3, 2.5 / 9 + 1e-9).tolist() == [1, 3]
    assert TopLEK.kept(x, 3, 2.5 / 9 - 1e-9).tolist() == [1]
    assert TopLEK.kept(torch.zeros(4, dtype=torch.float64), 2, 0.5).tolist() == []
    # bits: the count ⌈log₂ 3⌉ = 2, and j (value, ⌈log₂ 4⌉ = 2-bit index) pairs; bits() the most, j = k
    assert c.message_bits(1, 4) == 2 + 66 and c.bits(4) == 2 + 2 * 66 and c.bits(4, 32) == 2 + 2 * 34


def test_toplek_contracts_in_expectation():
    """E‖C(x) − x‖² = (1 − k/n)‖x‖², exactly: the larger set (error e_j <= target) is kept unless the row's coin falls
    below p = (target − e_j)/(e_{j−1} − e_j), which drops x_(j) (error e_{j−1} > target), so the mean error is
    p e_{j−1} + (1 − p) e_j = target.  The switch is at p from both sides, and the compressor's outputs (the coin
    drawn as the by-hand test draws it) have the error of the branch their coin picks."""
    from dane.compress import TopLEK, make

    x = torch.from_numpy(np.random.default_rng(0).normal(size=40))
    for k in (1, 5, 17):
        target = (1 - k / 40) * float(x @ x)
        order = torch.sort(x.abs(), descending=True, stable=True).indices
        errors = [float(x @ x) - float((x[order[:j]] ** 2).sum()) for j in range(k + 1)]
        low = TopLEK.kept(x, k, 1 - 1e-12)  # the larger set
        j = len(low)
        assert errors[j] <= target < errors[j - 1]
        p = (target - errors[j]) / (errors[j - 1] - errors[j])
        assert len(TopLEK.kept(x, k, p - 1e-12)) == j - 1 and len(TopLEK.kept(x, k, p + 1e-12)) == j
        branches = set()
        for seed in range(40):
            coin = float(torch.rand(1, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
            out = make(f"toplek:{k}")(x, torch.Generator().manual_seed(seed))
            branches.add(coin < p)
            assert float(((out - x) ** 2).sum()) == pytest.approx(errors[j - 1] if coin < p else errors[j], rel=1e-12)
        assert branches == {True, False}  # both outcomes drawn: p is neither 0 nor 1 here


def test_randseqk_by_hand():
    """A uniform start s = randint(n) from the generator, k consecutive entries mod n, scaled n/k; bits 64·k."""
    from dane.compress import RandSeqK, make

    c = make("randseqk:3")
    assert isinstance(c, RandSeqK) and c.unbiased and c.omega(5) == 5 / 3 - 1
    assert c.bits(5) == 3 * 64 and c.bits(5, 32) == 3 * 32
    x = torch.arange(1.0, 6.0, dtype=torch.float64)
    start = int(torch.randint(5, (1,), generator=torch.Generator().manual_seed(7)))
    kept = [(start + j) % 5 for j in range(3)]
    expected = torch.zeros(5, dtype=torch.float64)
    expected[kept] = x[kept] * 5 / 3
    assert torch.equal(c(x, torch.Generator().manual_seed(7)), expected)
    # unbiased: the mean over the n starts is x, and E‖C(x)‖² = (n/k)‖x‖² (ω = n/k − 1)
    outs = []
    for s in range(5):
        out = torch.zeros(5, dtype=torch.float64)
        idx = [(s + j) % 5 for j in range(3)]
        out[idx] = x[idx] * 5 / 3
        outs.append(out)
    assert torch.allclose(torch.stack(outs).mean(0), x, rtol=0, atol=1e-14)
    assert abs(float(torch.stack(outs).pow(2).sum(1).mean()) - 5 / 3 * float(x @ x)) < 1e-12


@pytest.mark.parametrize("spec, variant", [("toplek:8", "plain"), ("randseqk:8", "ls")])
def test_fednl_with_toplek_and_randseqk(logistic, spec, variant):
    """FedNL takes both on the packed triangle (T = 21 at d = 6): α = 1 for TopLEK, k/T for RandSeqK; it converges,
    and the stacked clients (`dane.baselines.fednl.batched`: all on one batched communicator) and one client per
    worker give the same iterates."""
    from dane.baselines.fednl import FedNLConfig, batched
    from dane.problems.stacked_rows import StackedRows

    X, y, grad, _, w_star = logistic
    option = 1 if variant == "ls" else 2
    stacked_run = batched(StackedRows(shards(X, y, "logistic")), compressor=spec, variant=variant, seed=2,
                          option=option)
    assert stacked_run.alpha == (1.0 if spec.startswith("toplek") else 8 / 21)
    _, _, ws = simulate(FedNLConfig(compressor=spec, variant=variant, seed=2, option=option), shards(X, y, "logistic"), 4)[0]
    for w in ws[1:]:
        stacked_run.step()
        np.testing.assert_allclose(w.numpy(), stacked_run.w.numpy(), rtol=0, atol=1e-12)
    for _ in range(200):
        stacked_run.step()
    assert np.linalg.norm(stacked_run.w.numpy() - w_star) < 1e-10


# ------------------------------------------------------------------ FedNL-CR (baselines/fednl.py, variant=cr)
def cubic_reference(A, g, M):
    """argmin ⟨g, s⟩ + ½ sᵀAs + (M/6)‖s‖³ by Brent's method on ‖(A + (Mr/2)I)⁻¹g‖ = r (A ≻ 0)."""
    import scipy.optimize

    eye = np.eye(len(g))

    def gap(r):
        return np.linalg.norm(np.linalg.solve(A + 0.5 * M * r * eye, g)) - r

    r = scipy.optimize.brentq(gap, 0.0, np.linalg.norm(np.linalg.solve(A, g)) + 1.0, xtol=1e-300, rtol=8.9e-16)
    return -np.linalg.solve(A + 0.5 * M * r * eye, g)


def test_cubic_newton_solves_the_cubic_model():
    from dane.baselines.fednl_server import cubic_newton

    rng = np.random.default_rng(3)
    B = rng.normal(size=(6, 6))
    H, g = B @ B.T + 0.1 * np.eye(6), rng.normal(size=6)
    for M, shift in ((0.7, 0.0), (30.0, 0.05), (1e-6, 0.2)):
        s = cubic_newton(H, g, shift, M)
        A = H + shift * np.eye(6)
        np.testing.assert_allclose(A @ s + 0.5 * M * np.linalg.norm(s) * s, -g, rtol=0, atol=1e-13)  # stationary
        np.testing.assert_allclose(s, cubic_reference(A, g, M), rtol=0, atol=1e-13)
    H_indefinite = np.diag([-1.0, 2.0, 3.0])  # r above 2|λ_min|/M: the global minimizer
    s = cubic_newton(H_indefinite, np.array([1.0, 1.0, 1.0]), 0.0, 1.0)
    assert np.linalg.norm(s) > 2.0
    np.testing.assert_allclose(H_indefinite @ s + 0.5 * np.linalg.norm(s) * s, -np.ones(3), rtol=0, atol=1e-13)


def client_hessians(X, y, x):
    parts = np.array_split(np.arange(X.shape[0]), M)
    out = []
    for p in parts:
        A = X[p].toarray()
        s = 1 / (1 + np.exp(-(A @ x)))
        out.append(M / X.shape[0] * (A.T * (s * (1 - s))) @ A + LAM * np.eye(A.shape[1]))
    return out


def packed_topk(D, k):
    """TopK on the packed upper triangle (what FedNL sends), decoded to the symmetric matrix."""
    rows, cols = np.triu_indices(len(D))
    values = D[rows, cols]
    keep = np.argsort(-np.abs(values), kind="stable")[:k]
    out = np.zeros_like(D)
    out[rows[keep], cols[keep]] = values[keep]
    out[cols[keep], rows[keep]] = values[keep]
    return out


@pytest.mark.parametrize("spec", ["none", "topk:8"])
def test_fednl_cr_against_numpy(logistic, spec):
    """FedNL-CR's round (FedNL's Algorithm with the cubic model of option 2), 3 rounds on 3 shards in NumPy, M the
    rule's L_* = (1/(6√3))·(1/N)Σ‖a_j‖³, H_i⁰ = ∇²O_i(x⁰), α = 1; and the bits of option 2 (FedNL-Public's
    ``FedNL_CR`` counts the same messages, 32·d + the Hessian's + 32, at 32-bit values)."""
    from dane.baselines.fednl import FedNLConfig

    X, y, grad, _, _ = logistic
    N, d = X.shape
    M_star = 1 / (6 * np.sqrt(3)) * np.mean(np.linalg.norm(X.toarray(), axis=1) ** 3)
    run = simulate if spec == "none" else stacked  # FedNL-CR's one run on one thread per worker, the other stacked
    algo, records, ws = run(FedNLConfig(compressor=spec, variant="cr", seed=0), shards(X, y, "logistic"), 3)[0]
    assert algo.cubic == pytest.approx(M_star, rel=1e-14)
    assert algo.defaults[0]["key"] == "algorithm.cubic" and algo.defaults[0]["rule"] == "cubic_constant"
    x = np.zeros(d)
    H_i = client_hessians(X, y, x)
    for k in range(1, 4):
        hess = client_hessians(X, y, x)
        l = np.mean([np.linalg.norm(a - b) for a, b in zip(H_i, hess)])
        x_new = x + cubic_reference(np.mean(H_i, 0) + l * np.eye(d), grad(x), M_star)
        H_i = [h + (D if spec == "none" else packed_topk(D, 8)) for h, D in ((h, a - h) for h, a in zip(H_i, hess))]
        x = x_new
        np.testing.assert_allclose(ws[k].numpy(), x, rtol=0, atol=1e-12)
    T = d * (d + 1) // 2
    hessian_bits = 64 * T if spec == "none" else 8 * (64 + 5)  # ⌈log₂ 21⌉ = 5 index bits
    per_round = 64 * d + hessian_bits + 64
    assert records[3]["clients_uplink_bits"] == M * (64 * T + 3 * per_round)  # to reach x_3


def test_fednl_cr_keys():
    from dane.baselines.fednl import FedNLConfig

    with pytest.raises(ConfigError, match="algorithm.variant=cr steps with H \\+ l I .*set algorithm.option=2"):
        FedNLConfig(variant="cr", option=1)
    with pytest.raises(ConfigError, match="algorithm.cubic is FedNL-CR's cubic weight"):
        FedNLConfig(cubic=1.0)
    with pytest.raises(ConfigError, match="algorithm.cubic must be >= 0, got -1"):
        FedNLConfig(variant="cr", cubic=-1)


# ------------------------------------------------------------------ NL1 (baselines/nl1.py)
@pytest.mark.parametrize("k, eta", [(4, None), (7, 0.1)])
def test_nl1_against_numpy(logistic, k, eta):
    """FedNL-Public's ``NL1.method`` round (no line search) in NumPy on the same shards, the RandK indices those of
    the clients' streams: 3 rounds to 1e-12; bits 64·d(d+1)/2 once, 64·(d + K·d + K) a round, per client."""
    from dane.baselines.nl1 import NL1Config
    from dane.problems.stacked_compress import randk_indices

    X, y, grad, _, _ = logistic
    N, d = X.shape
    algo, records, ws = stacked(NL1Config(k=k, eta=eta, seed=4), shards(X, y, "logistic"), 3)[0]
    A = X.toarray()
    parts = np.array_split(np.arange(N), M)

    def alphas(x, p):
        s = 1 / (1 + np.exp(-(A[p] @ x)))
        return s * (1 - s)

    x = np.zeros(d)
    h = [alphas(x, p) for p in parts]
    B = sum(A[p].T @ (h_i[:, None] * A[p]) for p, h_i in zip(parts, h)) / N
    for r in range(3):
        g = grad(x)
        changes = []
        for i, p in enumerate(parts):
            n = len(p)
            step = k / n if eta is None else eta
            picked = randk_indices(4, np.array([i]), r, n, k)[0]
            compressed = np.zeros(n)
            compressed[picked] = (alphas(x, p) - h[i])[picked] * n / k
            new = np.maximum(h[i] + step * compressed, 0)
            changes.append(A[p].T @ ((new - h[i])[:, None] * A[p]) / N)
            h[i] = new
        x = x - np.linalg.solve(B + LAM * np.eye(d), g)
        B = B + sum(changes)
        np.testing.assert_allclose(ws[r + 1].numpy(), x, rtol=0, atol=1e-12)
    T = d * (d + 1) // 2
    assert records[3]["clients_uplink_bits"] == M * 64 * (T + 3 * (d + k * d + k))  # to reach x_3
    assert list(algo.defaults) == ([] if eta is not None else [
        {"key": "algorithm.eta", "value": k / 20, "rule": "nl1_step",
         "stats": {"k": k, "worker": 0, "clients": M, "rows": [20], "etas": [k / 20]}}])


def test_nl1_notes_the_step_of_every_client_its_worker_holds():
    """η null is min(K, n_i)/n_i per client; on unequal shards (40, 17 and 3 rows, K = 4) the summary's entry named
    only the first client's n_i and η.  It now gives, for the clients the worker holds, each distinct n_i and the η
    the run used for it: all three on the batched simulator, each worker its own on threads (a worker knows its own
    rows), with the same ``value`` (worker 0's first client's) on both paths."""
    from dane.baselines.nl1 import NL1Config

    X, y = data()
    parts = np.split(np.arange(60), [40, 57])
    problems = [LinearModelShard(to_torch(X[p]), torch.from_numpy(y[p]), LOSSES["logistic"], l2=LAM,
                                 weight=M / 60) for p in parts]
    config = NL1Config(k=4, seed=1)
    algo = stacked(config, problems, 1)[0][0]
    (entry,) = algo.defaults
    assert entry["stats"] == {"k": 4, "worker": 0, "clients": 3, "rows": [3, 17, 40], "etas": [1.0, 4 / 17, 4 / 40]}
    used = dict(zip(entry["stats"]["rows"], entry["stats"]["etas"]))
    assert list(algo.eta) == [used[len(p)] for p in parts] and entry["value"] == algo.eta[0]  # the steps taken
    for rank, (worker, _, _) in enumerate(simulate(config, problems, 1)):
        (own,) = worker.defaults
        assert own["stats"] == {"k": 4, "worker": rank, "clients": 1, "rows": [len(parts[rank])],
                                "etas": [list(algo.eta)[rank]]} and own["value"] == worker.eta[0]
        assert rank > 0 or own["value"] == entry["value"]


def test_nl1_on_a_quadratic_is_newton():
    """Squared loss: α ≡ 1, so B is the Hessian and the first step lands on the optimum."""
    from dane.baselines.nl1 import NL1Config

    X, y = data(seed=1)
    grad, hess = dense(X, y, "squared")
    w_star = np.linalg.solve(hess(np.zeros(D + 1)), -grad(np.zeros(D + 1)))
    _, _, ws = simulate(NL1Config(k=2), shards(X, y, "squared"), 2)[0]
    np.testing.assert_allclose(ws[1].numpy(), w_star, rtol=0, atol=1e-13)


def test_nl1_resumes(logistic):
    from dane.baselines.nl1 import NL1Config

    X, y, *_ = logistic
    for straight, resumed, w1, w2 in straight_and_resumed(NL1Config(k=3), shards(X, y, "logistic")):
        assert straight == resumed and torch.equal(w1, w2)


# ------------------------------------------------------------------ DINGO (baselines/dingo.py)
def dingo_reference(hessians, grad, x, theta, phi, rho):
    """One DINGO round (Crane & Roosta 2019, FedNL-Public's ``DINGO`` without its step caps), dense NumPy."""
    d = len(x)
    g = grad(x)
    eye = np.eye(d)
    Hs = hessians(x)
    Hg = [H @ g for H in Hs]
    inv = [np.linalg.pinv(H) @ g for H in Hs]
    hat = [np.linalg.pinv(np.vstack([H, phi * eye])) @ np.concatenate([g, np.zeros(d)]) for H in Hs]
    h, h_inv, h_hat = np.mean(Hg, 0), np.mean(inv, 0), np.mean(hat, 0)
    floor = theta * g @ g
    if h @ h_inv >= floor:
        case, p = 1, -h_inv
    elif h @ h_hat >= floor:
        case, p = 2, -h_hat
    else:
        case, parts = 3, []
        for H, v in zip(Hs, hat):
            if v @ h >= floor:
                parts.append(-v)
            else:
                G = np.linalg.inv(H.T @ H + phi ** 2 * eye)
                parts.append(-v - (floor - v @ h) / (h @ G @ h) * (G @ h))
        p = np.mean(parts, 0)
    a = 1.0
    while np.linalg.norm(grad(x + a * p)) ** 2 > g @ g + 2 * a * rho * p @ h:
        a /= 2
    return x + a * p, case, a


@pytest.mark.parametrize("theta", [1e-4, 1.5, 30.0])
def test_dingo_against_numpy(logistic, theta):
    """3 rounds to 1e-12, the case and step each round as the transcription's.  At x⁰ ⟨h, mean H_i⁻¹g⟩ = 1.196‖g‖² and
    the clients' ⟨H̃_i†g̃, h⟩ = (1.78, 0.99, 0.82)‖g‖²: θ = 1e-4 takes case 1, θ = 1.5 case 3 with one client's
    vector kept, θ = 30 case 3 with none (case 2 needs ⟨h, mean H̃_i†g̃⟩ above ⟨h, mean H_i⁻¹g⟩, which a positive
    definite H_i does not give).  Bits: 64·(4d (+ d in case 3) + d per trial) a round per client."""
    from dane.baselines.dingo import DINGOConfig

    X, y, grad, _, _ = logistic
    d = X.shape[1]
    algo, records, ws = stacked(DINGOConfig(theta=theta), shards(X, y, "logistic"), 3)[0]
    x, bits, cases = np.zeros(d), 0, []
    for k in range(1, 4):
        x, case, a = dingo_reference(lambda z: client_hessians(X, y, z), grad, x, theta, 1e-6, 1e-4)
        np.testing.assert_allclose(ws[k].numpy(), x, rtol=0, atol=1e-12)
        assert (records[k - 1]["case"], records[k - 1]["step_size"]) == (case, a)
        bits += 64 * (4 * d + (d if case == 3 else 0) + (1 - round(np.log2(a))) * d)
        cases.append(case)
    assert records[3]["clients_uplink_bits"] == M * bits  # to reach x_3
    assert cases[0] == {1e-4: 1, 1.5: 3, 30.0: 3}[theta]


@pytest.mark.parametrize("rho", [1, 1.5, 1e300])
def test_dingo_refuses_an_armijo_constant_of_1_or_more(rho):
    """ρ ≥ 1 ran, every round spending its line search to keep x_k (step 0, 62 allreduces a round, exit 0)."""
    from dane.baselines.dingo import DINGOConfig

    with pytest.raises(ConfigError) as error:
        DINGOConfig(rho=rho)
    assert str(error.value) == (f"algorithm.rho must be in (0, 1), got {rho}: DINGO's Armijo constant (Crane & Roosta "
                                f"2019 take ρ ∈ (0, 1); from 1 on no step passes on a quadratic, and each round keeps "
                                f"x_k); the default is 1e-4")
    assert DINGOConfig(rho=0.9999).rho == 0.9999


# ------------------------------------------------------------------ Newton-3PC (baselines/newton_3pc.py)
@pytest.mark.parametrize("mechanism, zeta, p", [("lag", 0.5, 0.5), ("lag", 20.0, 0.5), ("clag", 0.5, 0.5),
                                                ("bag", 1.0, 0.5), ("cbag", 1.0, 0.7)])
def test_newton_3pc_against_numpy(logistic, mechanism, zeta, p):
    """4 rounds to 1e-12 against the paper's round in NumPy (dense Hessians; TopK on the packed triangle for clag and
    cbag, k = 8; the coins from the clients' streams), the senders, bits and Hessians formed by hand."""
    from dane.baselines.newton_3pc import COIN_STREAM, Newton3PCConfig

    X, y, grad, _, _ = logistic
    d, T = X.shape[1], X.shape[1] * (X.shape[1] + 1) // 2
    config = Newton3PCConfig(mechanism=mechanism, zeta=zeta, p=p, compressor="topk:8", seed=1)
    algo, records, ws = stacked(config, shards(X, y, "logistic"), 4)[0]
    assert [(e["key"], e["value"], e["rule"]) for e in algo.defaults] == [("algorithm.mu", LAM, "the problem's")]
    x = np.zeros(d)
    H_i = client_hessians(X, y, x)
    Y = [H.copy() for H in H_i]
    bits, formed = M * 64 * T, 0
    for k in range(4):
        now = client_hessians(X, y, x)
        senders = 0
        for i in range(M):
            if mechanism in ("bag", "cbag"):
                fire = np.random.default_rng([1, COIN_STREAM, i, k]).random() < p
            else:
                fire = np.linalg.norm(now[i] - H_i[i]) ** 2 > zeta * np.linalg.norm(now[i] - Y[i]) ** 2
            if fire:
                senders += 1
                H_i[i] = now[i] if mechanism in ("lag", "bag") else H_i[i] + packed_topk(now[i] - H_i[i], 8)
            Y[i] = now[i]
        H = np.mean(H_i, 0)
        assert np.linalg.eigvalsh(H).min() > LAM  # the projection [H]_mu leaves it as it is
        x = x - np.linalg.solve(H, grad(x))
        np.testing.assert_allclose(ws[k + 1].numpy(), x, rtol=0, atol=1e-12)
        assert records[k]["hessians_sent"] == senders
        formed += senders if mechanism in ("bag", "cbag") else M  # a coin's loser forms no Hessian
        assert records[k + 1]["local_hessians"] == formed  # record k + 1: the work that made x_{k+1}
        bits += M * 64 * d + senders * (64 * T if mechanism in ("lag", "bag") else 8 * (64 + 5))
        assert records[k + 1]["clients_uplink_bits"] == bits  # record k + 1: what reaching x_{k+1} cost
    sent = [r["hessians_sent"] for r in records[:4]]
    if mechanism in ("lag", "clag"):
        assert sent[0] == 0  # round 0: X = H_i⁰, nothing to send
    assert 0 < sum(sent) < 4 * M  # some clients stay silent, some send


@pytest.mark.parametrize("mechanism", ["clag", "cbag"])
def test_newton_3pc_uses_an_unbiased_compressor_as_the_contractive_one(logistic, monkeypatch, mechanism):
    """clag/cbag with RandK (unbiased, ω = T/K − 1 on the packed triangle of T entries): every client's H_i moves by
    C(X − H_i)/(ω + 1), the contractive compressor the 3PC paper's rule takes (unscaled, RandK's variance let H_i
    wander off: clag with randk:0.2 diverged on a 160 x 20 logistic table where it now converges)."""
    from dane.baselines.fednl import FedNLClients
    from dane.baselines.newton_3pc import Newton3PCConfig

    X, y, *_ = logistic
    d = X.shape[1]
    T, K = d * (d + 1) // 2, 5
    calls = []  # per call: the client object, its H_i before the round's update, C's output
    compress = FedNLClients.compress

    def recorded(self, diff, members, draw):
        out = compress(self, diff, members, draw)
        calls.append((self, self.H_i.copy(), out.copy()))
        return out

    monkeypatch.setattr(FedNLClients, "compress", recorded)
    config = Newton3PCConfig(mechanism=mechanism, zeta=0.5, p=0.7, compressor=f"randk:{K}", seed=4)
    simulate(config, shards(X, y, "logistic"), 5)
    moved = 0
    for client in {id(c): c for c, _, _ in calls}.values():  # each worker's rounds in order (the threads interleave)
        own = [(before, out) for c, before, out in calls if c is client]
        for (before, out), (after, _) in zip(own, own[1:]):  # H_i changed by the scaled C where it was sent
            step = after - before
            sent = np.abs(step).sum(axis=tuple(range(1, step.ndim))) > 0
            np.testing.assert_allclose(step[sent], out[sent] / (1 + (T / K - 1)), rtol=1e-15, atol=0)
            moved += int(sent.sum())
    assert moved > 0


@pytest.mark.parametrize("method, keys", [("fednl", {}), ("fednl", {"variant": "ls"}),
                                         ("fednl", {"variant": "pp", "clients_per_round": 2}), ("fednl_bc", {})])
def test_the_fednl_line_keeps_a_float32_run_in_float32(method, keys):
    """The server's Newton step is float64 NumPy; the iterate it hands back (and FedNL-LS's trial points) are cast to
    the problem's dtype, so a float32 run stays one (a float64 iterate met float32 rows in the next round's product
    and the run ended in a dtype error), and it lands where the float64 run does to float32's round-off."""
    import dane

    X, y = data()
    problem = dane.problems.LogReg(X, y, lam=LAM)
    runs = {dtype: dane.fit(problem, method, workers=M, rounds=6, dtype=dtype, quiet=True, **keys)
            for dtype in (torch.float32, torch.float64)}
    assert runs[torch.float32].w.dtype == torch.float32 and runs[torch.float32].status == "max_rounds"
    np.testing.assert_allclose(runs[torch.float32].w.numpy(), runs[torch.float64].w.numpy(), rtol=0, atol=1e-5)


def test_newton_3pc_resumes(logistic):
    from dane.baselines.newton_3pc import Newton3PCConfig

    X, y, *_ = logistic
    config = Newton3PCConfig(mechanism="cbag", compressor="randk:5", seed=2)
    for straight, resumed, w1, w2 in straight_and_resumed(config, shards(X, y, "logistic")):
        assert straight == resumed and torch.equal(w1, w2)
