"""FedRed's type-2 control variates under random averaging and a server step η_g ≠ 1 (issue 33): the correction
h_i ← h_i + c(x̄ − x_i), x̄ the mean of the participants' local iterates, sums to zero over them, so Σ_i h_i stays 0 and
the run reaches the optimum; the paper's c(x_{r+1} − x_i) does not sum to zero there and stalls away from it.  Mean
averaging with η_g = 1 (x_{r+1} = x̄) is the paper's round, iterate for iterate (baselines/fedred.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from dane.baselines import FedRedConfig
from dane.baselines.fedred import COIN_STREAM, FedRed
from dane.comm import ThreadGroup
from dane.problems import RidgeSyntheticConfig
from helpers import ridge_shards

SMALL = RidgeSyntheticConfig(n_samples=240, dim=12, lam=0.01, noise_std=0.5)
M, LAM, STEPS, SEED = 4, 0.5, 10, 3


def hessian(shard) -> torch.Tensor:
    """∇²O_i of a ridge shard: A_i + 2·lam·I (∇O_i(w) = ∇²O_i w − b_i)."""
    return shard.A + 2 * shard.lam * torch.eye(shard.b.numel(), dtype=torch.float64)


def optimum(shards) -> torch.Tensor:
    """w* from the global normal equations."""
    return torch.linalg.solve(sum(hessian(s) for s in shards) / len(shards), sum(s.b for s in shards) / len(shards))


def run_rounds(config, shards, rounds: int, build=None):
    """Per round t = 0..rounds: (x_t, [h_i after round t − 1]) from every worker of a simulated run (h: None at t = 0);
    ``build(config, shard, comm)``: the algorithm (``config.build`` if None)."""

    def worker(comm):
        algo = config.build(shards[comm.rank], comm) if build is None else build(config, shards[comm.rank], comm)
        out = [(algo.iterate.clone(), None)]
        for _ in range(rounds):
            algo.step()
            out.append((algo.iterate.clone(), algo.h.clone()))
        return out, algo.gamma

    per_worker = ThreadGroup(len(shards)).run(worker)
    gamma = per_worker[0][1]
    return [(per_worker[0][0][t][0], [w[0][t][1] for w in per_worker]) for t in range(rounds + 1)], gamma


def hand_rounds(shards, gamma: float, rounds: int, *, averaging: str, server_lr: float, paper: bool):
    """FedRed with type-2 control variates and all clients, by hand: h_i of type 1 at round 0, K doubly regularized
    steps from x, x_{r+1} the mean (moved by η_g) or client j's iterate (j from the run's shared coin), then
    h_i += c(x_{r+1} − x_i) (``paper``) or c(x̄ − x_i), c = 1/(Kγ).  The iterates x_0..x_rounds and Σ_i h_i per
    round."""
    m = len(shards)
    seq = np.random.SeedSequence([SEED, COIN_STREAM]).generate_state(1, dtype=np.uint64)[0] >> np.uint64(1)
    coin = torch.Generator().manual_seed(int(seq))
    x, c = torch.zeros(SMALL.dim, dtype=torch.float64), 1.0 / (STEPS * gamma)
    grads = [hessian(s) @ x - s.b for s in shards]
    h = [g - sum(grads) / m for g in grads]
    iterates, sums = [x], []
    for _ in range(rounds):
        local = []
        for shard, h_i in zip(shards, h):
            z = x
            for _ in range(STEPS):
                z = (z / gamma + LAM * x - (hessian(shard) @ z - shard.b) + h_i) / (1 / gamma + LAM)
            local.append(z)
        x_bar = sum(local) / m
        if averaging == "mean":
            x_next = x + server_lr * (x_bar - x)
        else:
            x_next = local[int(torch.randint(m, (1,), generator=coin))]
        h = [h_i + c * ((x_next if paper else x_bar) - z) for h_i, z in zip(h, local)]
        x = x_next
        iterates.append(x)
        sums.append(sum(h))
    return iterates, sums


@pytest.mark.parametrize("averaging, server_lr", [("random", 1.0),
                                                   pytest.param("mean", 0.5, marks=pytest.mark.slow)])  # 6 s each
def test_type2_reaches_the_optimum_under_random_averaging_and_a_server_step(averaging, server_lr):
    shards = ridge_shards(M, SMALL)
    w_star = optimum(shards)
    config = FedRedConfig(lam=LAM, local_steps=STEPS, control_variate=2, averaging=averaging, server_lr=server_lr,
                          seed=SEED)
    history, gamma = run_rounds(config, shards, 210)  # about 200 rounds to ‖x − w*‖ = 1e-10
    hand, _ = hand_rounds(shards, gamma, 40, averaging=averaging, server_lr=server_lr, paper=False)
    for t, ((x, _), y) in enumerate(zip(history, hand)):  # the run is the hand recursion (x̄ in the correction)
        torch.testing.assert_close(x, y, rtol=0, atol=1e-12, msg=f"round {t}")
    zero = torch.zeros(SMALL.dim, dtype=torch.float64)
    for t, (_, h) in enumerate(history[1:], start=1):  # Σ_i h_i = 0 to round-off (‖h_i‖ about 1 here) every round
        torch.testing.assert_close(sum(h), zero, rtol=0, atol=1e-13, msg=f"round {t}")
    assert float((history[-1][0] - w_star).norm()) < 1e-10
    for rank, h in enumerate(history[-1][1]):  # h_i → ∇O_i(x*)
        torch.testing.assert_close(h, hessian(shards[rank]) @ w_star - shards[rank].b, rtol=0, atol=1e-8)
    # the paper's correction c(x_{r+1} − x_i): Σ_i h_i leaves 0 in the first round and the iterates stall far from w*
    paper, sums = hand_rounds(shards, gamma, 210, averaging=averaging, server_lr=server_lr, paper=True)
    assert float(sums[0].norm()) > 1e-2 and min(float(s.norm()) for s in sums[100:]) > 1e-1
    assert min(float((x - w_star).norm()) for x in paper[100:]) > 1e-2


def test_a_server_step_moves_x_by_eta_g_towards_the_mean_round_by_round():
    """x_{r+1} = x_r + η_g(x̄ − x_r) at η_g = 1/2: three rounds of the run equal the hand recursion (the slow test
    above follows it for 40 rounds to the optimum)."""
    shards = ridge_shards(M, SMALL)
    config = FedRedConfig(lam=LAM, local_steps=STEPS, control_variate=2, server_lr=0.5, seed=SEED)
    history, gamma = run_rounds(config, shards, 3)
    hand, _ = hand_rounds(shards, gamma, 3, averaging="mean", server_lr=0.5, paper=False)
    for t, ((x, _), y) in enumerate(zip(history, hand, strict=True)):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-12, msg=f"round {t}")


class PaperFedRed(FedRed):
    """The paper's type-2 correction c(x_{r+1} − x_i), as FedRed's round read before the x̄ form (type 2 only)."""

    def round(self) -> dict[str, float]:
        x = self.w
        members, inside = self.members()
        if self.first:
            grad, payload = self.grad_and_payload(x)
            (g_bar,), reduced = self.average(members, [grad], payload, down=[x])
            rides = []
            self.h = grad - g_bar if inside else torch.zeros_like(grad)
        else:
            rides, reduced = self.payload(x), None
        steps = self.local_step_count()
        x_i = self.local_solve(x, self.h, steps) if inside else x
        if self.averaging == "mean":
            (x_mean,), late = self.average(members, [x_i], rides, down=[x])
            x_next = x + self.server_lr * (x_mean - x) if self.server_lr != 1.0 else x_mean
        else:
            chosen = members[torch.randint(len(members), (1,), generator=self.coin)]
            (x_next,), late = self.average(chosen, [x_i], rides, down=[x])
        if inside:
            self.h = self.h + self.cv_weight * (x_next - x_i)
        self.w, self.first = x_next, False
        return self.record(reduced if reduced is not None else late, members)


def build_paper(config, shard, comm):
    """`PaperFedRed` with the numbers ``config`` resolves (`FedRedConfig.build`)."""
    ours = config.build(shard, comm)
    return PaperFedRed(shard, comm, lam=ours.lam, local_steps=ours.local_steps, cv_weight=ours.cv_weight,
                       gamma=ours.gamma, control_variate=2, averaging=config.averaging, server_lr=config.server_lr,
                       sampling=config, local=config, seed=config.seed)


@pytest.mark.parametrize("clients", [None, 2])
def test_type2_with_mean_averaging_and_unit_server_step_is_the_papers_round_bit_for_bit(clients):
    """x_{r+1} = x̄ there, so the correction is the paper's: the iterates and control variates equal those of the
    x_{r+1} form bit for bit, with all clients and with 2 of 4 a round."""
    shards = ridge_shards(M, SMALL)
    config = FedRedConfig(lam=LAM, local_steps=STEPS, control_variate=2, seed=SEED, clients_per_round=clients)
    ours, _ = run_rounds(config, shards, 30)
    paper, _ = run_rounds(config, shards, 30, build=build_paper)
    assert all(torch.equal(x, y) for (x, _), (y, _) in zip(ours, paper))
    assert all(torch.equal(a, b) for (_, h), (_, k) in zip(ours[1:], paper[1:]) for a, b in zip(h, k))
