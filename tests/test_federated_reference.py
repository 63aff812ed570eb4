"""S-DANE, Acc-S-DANE, SCAFFOLD, Scaffnew, FedRed, FedDANE, FedProx and FedAvg against NumPy transcriptions of the
papers' rounds, each run given every number: its summary says no package rule applied (`baselines.defaults`,
`baselines.adaptive`) and no record carries an adaptation.

Each reference below is written from the paper's algorithm box (S-DANE and Acc-S-DANE: Jiang, Rodomanov & Stich,
NeurIPS 2024, Algorithms 1 and 2, as mlolab/S-DANE runs them; SCAFFOLD: Karimireddy et al. 2020, Algorithm 1 with
option II; Scaffnew: Mishchenko et al. 2022, Algorithm 2; FedRed: Jiang, Rodomanov & Stich, ICML 2024, with its
doubly regularized gradient steps) with NumPy only: dense local Hessians, Newton's method to round-off for the
exact local solves, every client in one loop, no communicator.  On the same shards (`dane.shards`) and with the
same explicit step sizes the package's iterates must agree to round-off: float64 full-gradient rounds differ only in
the order of summation.  Scaffnew's communication coin and FedRed's Geometric(p) local steps come from the package's
shared generator; the reference takes them from the run's records (the local steps each round took), which is the
mapping "identical seeds" asks for, and the records equal a transcription of that generator's stream
(`geometric_draws`).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.special import expit

import dane
from dane.baselines import fedred, scaffnew

LAM, M = 1e-2, 4
ROUNDS = 6


def problem_data(n=400, d=8, seed=3):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)) * np.linspace(1.5, 0.3, d)
    y = np.where(X @ rng.standard_normal(d) + 0.8 * rng.standard_normal(n) > 0, 1.0, -1.0)
    # label skew between the shards: the drift corrections have something to correct
    order = np.argsort(y, kind="stable")
    return X[order], y[order]


class Client:
    """O_i(w) = (m/N) Σ_rows log(1 + exp(−y x'w)) + (λ/2)‖w‖², its gradient and Hessian."""

    def __init__(self, X, y, N):
        self.X, self.y, self.scale = X, y, M / N

    def value(self, w):
        return self.scale * np.sum(np.logaddexp(0, -self.y * (self.X @ w))) + 0.5 * LAM * w @ w

    def grad(self, w):
        return self.scale * self.X.T @ (-self.y * expit(-self.y * (self.X @ w))) + LAM * w

    def hess(self, w):
        s = expit(self.X @ w)
        return self.scale * (self.X.T * (s * (1 - s))) @ self.X + LAM * np.eye(len(w))

    def prox(self, centre, h, lam):
        """argmin O_i(x) − ⟨h, x⟩ + (λ/2)‖x − centre‖², Newton's method to round-off."""
        x = centre.copy()
        for _ in range(60):
            g = self.grad(x) - h + lam * (x - centre)
            if np.linalg.norm(g) < 1e-15:
                break
            x = x - np.linalg.solve(self.hess(x) + lam * np.eye(len(x)), g)
        return x


@pytest.fixture(scope="module")
def setting():
    X, y = problem_data()
    rows = dane.shards(len(y), M, seed=0)
    clients = [Client(X[r], y[r], len(y)) for r in rows]
    return X, y, clients


def objective(clients, w):
    return np.mean([c.value(w) for c in clients])


def check(result, reference, clients):
    """The package's records (x_0 .. x_R) and final iterate against the reference's iterates; no package rule ran."""
    assert result.summary["defaults"] == [] and result.summary["adaptations"] == []
    assert result.summary["package_rules_applied"] is False
    assert not any("adapted" in r for r in result.records)
    objectives = [r["objective"] for r in result.records]
    assert objectives[-1] < 0.8 * objectives[0]  # it moved: the comparison is not of two starting points
    np.testing.assert_allclose(objectives, [objective(clients, w) for w in reference], rtol=1e-12, atol=0)
    np.testing.assert_allclose(result.w.numpy(), reference[-1], rtol=0, atol=1e-12)


def geometric_draws(stream, p, rounds, seed=0):
    """Per round, the draws of a shared coin up to and including its first one below p (Geometric(p) on 1, 2, ...):
    a torch generator seeded with the top 63 bits of SeedSequence([seed, stream]), one float64 uniform a draw."""
    state = np.random.SeedSequence([seed, stream]).generate_state(1, dtype=np.uint64)[0] >> np.uint64(1)
    coin, counts = torch.Generator().manual_seed(int(state)), []
    for _ in range(rounds):
        k = 1
        while not float(torch.rand(1, generator=coin, dtype=torch.float64)) < p:
            k += 1
        counts.append(k)
    return counts


def reference_sdane(clients, lam, mu, rounds, accelerated):
    d = clients[0].X.shape[1]
    x, v, A, B, iterates = np.zeros(d), np.zeros(d), 0.0, 1.0, []
    for _ in range(rounds):
        iterates.append(x)
        if accelerated:  # a > 0 with λa² = (A + a)B; the round is centred at y = (A x + a v)/(A + a)
            a = (B + math.sqrt(B * B + 4 * lam * A * B)) / (2 * lam)
            centre = (A * x + a * v) / (A + a)
        else:
            a, centre, B = 1 / lam, v, 1.0
        g_bar = np.mean([c.grad(centre) for c in clients], axis=0)
        local = [c.prox(centre, c.grad(centre) - g_bar, lam) for c in clients]
        x = np.mean(local, axis=0)
        G = np.mean([c.grad(z) for c, z in zip(clients, local)], axis=0)
        v = (B * v + a * mu * x - a * G) / (B + a * mu)
        if accelerated:
            A, B = A + a, B + mu * a
    iterates.append(x)
    return iterates


@pytest.mark.parametrize("method", ["sdane", "acc_sdane"])
def test_sdane_and_acc_sdane_iterates_equal_the_papers_rounds(setting, method):
    X, y, clients = setting
    lam = 0.05
    reference = reference_sdane(clients, lam, LAM, ROUNDS, accelerated=method == "acc_sdane")
    result = dane.fit(dane.problems.LogReg(X, y, lam=LAM, local_tol=1e-14, local_solver="cholesky"), method, workers=M,
                      rounds=ROUNDS, lam=lam, mu=LAM)
    check(result, reference, clients)
    assert not any(r.get("local_failed") for r in result.records[:-1])  # exact solves pass the accuracy test


def reference_scaffold(clients, lr, K, server_lr, rounds):
    d = clients[0].X.shape[1]
    w, c, c_i, iterates = np.zeros(d), np.zeros(d), [np.zeros(d) for _ in clients], []
    for _ in range(rounds):
        iterates.append(w)
        dy, dc = [], []
        for i, client in enumerate(clients):
            y_i = w.copy()
            for _ in range(K):
                y_i = y_i - lr * (client.grad(y_i) - c_i[i] + c)
            c_plus = c_i[i] - c + (w - y_i) / (K * lr)                   # option II
            dy.append(y_i - w)
            dc.append(c_plus - c_i[i])
            c_i[i] = c_plus
        w = w + server_lr * np.mean(dy, axis=0)
        c = c + np.mean(dc, axis=0)                                       # |S| = m
    iterates.append(w)
    return iterates


@pytest.mark.parametrize("server_lr", [1.0, 0.5])
def test_scaffold_iterates_equal_the_papers_option_ii(setting, server_lr):
    X, y, clients = setting
    lr, K = 0.5, 5
    reference = reference_scaffold(clients, lr, K, server_lr, ROUNDS)
    result = dane.fit(dane.problems.LogReg(X, y, lam=LAM), "scaffold", workers=M, rounds=ROUNDS, lr=lr,
                      local_steps=K, server_lr=server_lr, option=2)
    check(result, reference, clients)


def reference_scaffnew(clients, gamma, p, steps_per_round):
    d = clients[0].X.shape[1]
    x_bar, h, iterates = np.zeros(d), [np.zeros(d) for _ in clients], []
    for steps in steps_per_round:
        iterates.append(x_bar)
        x = [x_bar.copy() for _ in clients]
        for _ in range(steps):
            x_hat = [x_i - gamma * (c.grad(x_i) - h_i) for c, x_i, h_i in zip(clients, x, h)]
            x = x_hat
        x_bar = np.mean([x_i - (gamma / p) * h_i for x_i, h_i in zip(x, h)], axis=0)   # the coin said communicate
        h = [h_i + (p / gamma) * (x_bar - x_i) for h_i, x_i in zip(h, x)]
    iterates.append(x_bar)
    return iterates


def test_scaffnew_iterates_equal_proxskip_with_the_runs_coins(setting):
    X, y, clients = setting
    gamma, p = 0.5, 0.3
    result = dane.fit(dane.problems.LogReg(X, y, lam=LAM), "scaffnew", workers=M, rounds=ROUNDS, lr=gamma, p=p)
    steps = [r["local_steps"] for r in result.records[:-1]]
    # the coin communicates after a local step with probability p, from its own stream of the run's seed
    assert steps == geometric_draws(scaffnew.COIN_STREAM, p, ROUNDS) == [2, 1, 3, 2, 5, 3]
    check(result, reference_scaffnew(clients, gamma, p, steps), clients)


def reference_fedred(clients, lam, gamma, K, control_variate, rounds):
    """K local steps a round, or round r's K[r] (a list: type 1 only)."""
    d = clients[0].X.shape[1]
    x, h, iterates = np.zeros(d), None, []
    steps = K if isinstance(K, list) else [K] * rounds
    cv_weight = None if isinstance(K, list) else 1 / (K * gamma)         # the paper's p/γ with p = 1/K
    for k in steps:
        iterates.append(x)
        if control_variate == 1 or h is None:
            g_bar = np.mean([c.grad(x) for c in clients], axis=0)
            h = [c.grad(x) - g_bar for c in clients]
        local = []
        for c, h_i in zip(clients, h):
            z = x.copy()
            for _ in range(k):                                            # doubly regularized gradient steps
                z = (z / gamma + lam * x - c.grad(z) + h_i) / (1 / gamma + lam)
            local.append(z)
        x_next = np.mean(local, axis=0)
        if control_variate == 2:
            h = [h_i + cv_weight * (x_next - z) for h_i, z in zip(h, local)]
        x = x_next
    iterates.append(x)
    return iterates


@pytest.mark.parametrize("control_variate", [1, 2])
def test_fedred_iterates_equal_the_papers_rounds(setting, control_variate):
    X, y, clients = setting
    lam, gamma, K = 0.05, 0.5, 8
    reference = reference_fedred(clients, lam, gamma, K, control_variate, ROUNDS)
    result = dane.fit(dane.problems.LogReg(X, y, lam=LAM), "fedred", workers=M, rounds=ROUNDS, lam=lam, lr=gamma,
                      local_steps=K, control_variate=control_variate, cv_weight=1 / (K * gamma))
    check(result, reference, clients)


def test_fedred_with_p_takes_geometric_local_steps_from_its_shared_coin(setting):
    """K ~ Geometric(p) a round (the paper's randomized local steps), from the coin's own stream of the run's seed;
    the iterates are the paper's rounds with those K."""
    X, y, clients = setting
    lam, gamma, p = 0.05, 0.5, 0.5
    result = dane.fit(dane.problems.LogReg(X, y, lam=LAM), "fedred", workers=M, rounds=ROUNDS, lam=lam, lr=gamma, p=p)
    steps = [r["local_steps"] for r in result.records[:-1]]
    assert steps == geometric_draws(fedred.COIN_STREAM, p, ROUNDS) == [1, 3, 1, 3, 2, 3]
    check(result, reference_fedred(clients, lam, gamma, steps, 1, ROUNDS), clients)


def reference_feddane(clients, mu, rounds):
    """FedDANE (η = 1, every client): w_i = argmin O_i(w) − ⟨∇O_i(w_t) − g_t, w⟩ + (μ/2)‖w − w_t‖², w_{t+1} = mean."""
    w, iterates = np.zeros(clients[0].X.shape[1]), []
    for _ in range(rounds):
        iterates.append(w)
        g = np.mean([c.grad(w) for c in clients], axis=0)
        w = np.mean([c.prox(w, c.grad(w) - g, mu) for c in clients], axis=0)
    iterates.append(w)
    return iterates


def test_feddane_iterates_equal_the_papers_rounds(setting):
    X, y, clients = setting
    mu = 0.05
    result = dane.fit(dane.problems.LogReg(X, y, lam=LAM, local_tol=1e-14, local_solver="cholesky"), "feddane",
                      workers=M, rounds=ROUNDS, mu=mu)
    check(result, reference_feddane(clients, mu, ROUNDS), clients)


def reference_fedprox(clients, mu, lr, K, rounds):
    """FedProx with K gradient steps of ``lr`` on O_i + (μ/2)‖· − w_t‖² from w_t, then the mean (μ = 0: FedAvg)."""
    w, iterates = np.zeros(clients[0].X.shape[1]), []
    for _ in range(rounds):
        iterates.append(w)
        local = []
        for c in clients:
            z = w.copy()
            for _ in range(K):
                z = z - lr * (c.grad(z) + mu * (z - w))
            local.append(z)
        w = np.mean(local, axis=0)
    iterates.append(w)
    return iterates


@pytest.mark.parametrize("method, mu", [("fedprox", 0.1), ("fedavg", 0.0)])
def test_fedprox_and_fedavg_iterates_equal_the_papers_rounds(setting, method, mu):
    X, y, clients = setting
    lr, K = 0.5, 5
    result = dane.fit(dane.problems.LogReg(X, y, lam=LAM), method, workers=M, rounds=ROUNDS, mu=mu, lr=lr,
                      local_steps=K)
    check(result, reference_fedprox(clients, mu, lr, K, ROUNDS), clients)


def test_fedprox_default_step_is_one_over_l_plus_mu(setting):
    """lr null: the local step 1/(L + μ) (`baselines.defaults.local_step`, L = max_i L_i measured before round 0) on
    O_i + (μ/2)‖· − w_t‖², the step the summary notes, in the rounds as in the note."""
    X, y, clients = setting
    mu, K = 0.1, 5
    result = dane.fit(dane.problems.LogReg(X, y, lam=LAM), "fedprox", workers=M, rounds=ROUNDS, mu=mu, local_steps=K)
    (note,) = result.summary["defaults"]
    L = note["stats"]["smoothness"]
    assert note == {"key": "algorithm.lr", "value": 1 / (L + mu), "rule": "local_step",
                    "stats": {"smoothness": L, "shift": mu}}
    reference = reference_fedprox(clients, mu, 1 / (L + mu), K, ROUNDS)
    np.testing.assert_allclose([r["objective"] for r in result.records], [objective(clients, w) for w in reference],
                               rtol=1e-12, atol=0)
    np.testing.assert_allclose(result.w.numpy(), reference[-1], rtol=0, atol=1e-12)
