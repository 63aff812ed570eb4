"""Every default rule of the federated line and the compressed methods (`baselines.defaults`), called directly, against hand-computed values.

Each row is (rule, arguments, expected): the expectation is worked by hand from the rule's formula in its docstring,
so a change of a constant or a branch shows here, one rule at a time, without a run.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from dane.baselines import defaults as d
from dane.numerics.local_solvers import LocalSolver

Q_2_OF_10 = (10 - 2) / (2 * 9)  # q = (m − s)/(s(m − 1)) at s = 2, m = 10: 4/9

ROWS = [
    # δ_A: the measured root mean square, floored at 1e-6 ‖H‖
    (d.dissimilarity, (0.3, 2.0), {}, 0.3),
    (d.dissimilarity, (0.0, 2.0), {}, 2e-6),
    # λ/δ_A = max(1/512, (δ_A/‖H‖)²/divisor)
    (d.prox_per_dissimilarity, (0.01, 1.0), {}, 1 / 512),               # (0.01)²/16 = 6.25e-6 < 1/512
    (d.prox_per_dissimilarity, (0.5, 1.0), {}, 0.25 / 16),              # 0.015625 > 1/512
    (d.prox_per_dissimilarity, (0.5, 1.0), {"divisor": 4}, 0.25 / 4),   # Acc-S-DANE's divisor
    # q
    (d.sampling_variance_factor, (10, 10), {}, 0.0),
    (d.sampling_variance_factor, (1, 10), {}, 1.0),
    (d.sampling_variance_factor, (2, 10), {}, 4 / 9),
    (d.sampling_variance_factor, (1, 1), {}, 0.0),
    # max(λ, c q (‖H‖ + 2δ_A)); λ at s = m
    (d.sampled_prox_weight, (0.01, 0.5, 1.0, 10, 10), {}, 0.01),
    (d.sampled_prox_weight, (0.01, 0.5, 1.0, 2, 10), {}, 0.5 * Q_2_OF_10 * 2.0),
    (d.sampled_prox_weight, (5.0, 0.5, 1.0, 2, 10), {}, 5.0),
    (d.sampled_prox_weight, (0.01, 0.5, 1.0, 2, 10), {"per_curvature": 1.0}, Q_2_OF_10 * 2.0),
    # the combination: δ_A rule, the smaller balanced weight, the sampled floor
    (d.prox_weight, (0.5, 1.0), {}, 0.5 * 0.25 / 16),
    (d.prox_weight, (0.5, 1.0), {"balanced": 1e-3}, 1e-3),
    (d.prox_weight, (0.5, 1.0), {"balanced": 1.0}, 0.5 * 0.25 / 16),
    (d.prox_weight, (0.5, 1.0), {"balanced": 1e-3, "s": 2, "m": 10}, 0.5 * Q_2_OF_10 * 2.0),
    (d.prox_weight, (0.5, 1.0), {"divisor": 4}, 0.5 * 0.25 / 4),
    # local gradient steps
    (d.local_step, (4.0,), {}, 0.25),
    (d.local_step, (4.0, 1.0), {}, 0.2),
    (d.strong_convexity_bound, (0.01, 0.3), {"exact": True}, 0.3),
    (d.strong_convexity_bound, (0.01, -0.2), {"exact": True}, 0.01),
    # a short Lanczos's or a majorant's λ_min(H_i) lies above the true one: the ℓ2 weight alone
    (d.strong_convexity_bound, (0.01, 0.3), {"exact": False}, 0.01),
    (d.strong_convexity_bound, (0.01, None), {"exact": False}, 0.01),
    # SCAFFOLD's η_l = min(2/(L + μ̲), f/L, 1/(K μ̲)): each branch binding once
    (d.scaffold_local_step, (10.0, 0.0, 10, 1.9), {}, 0.19),            # μ̲ = 0: f/L
    (d.scaffold_local_step, (10.0, 0.01, 10, 1.9), {}, 0.19),           # 2/10.01 > 0.19, 1/(10·0.01) = 10
    (d.scaffold_local_step, (10.0, 0.5, 10, 1.9), {}, 0.19),            # 2/10.5 = 0.1905 > 0.19
    (d.scaffold_local_step, (10.0, 1.0, 10, 1.9), {}, 0.1),             # 1/(K μ̲) = 0.1 < 2/11 < 0.19
    (d.scaffold_local_step, (10.0, 0.9, 3, 1.95), {}, 2 / 10.9),        # 2/10.9 = 0.1835 < 0.195, 1/2.7
    # SCAFFOLD's η_g
    (d.scaffold_server_step, (10, True), {}, 1.5),
    (d.scaffold_server_step, (3, True), {}, 1.0),
    (d.scaffold_server_step, (10, False), {}, 1.0),
    # FedRed's K: 10 at full participation, ⌈1/(γ λ_S)⌉ within [10, 100] under sampling
    (d.fedred_local_steps, (0.5, 0.01, False), {}, 10),
    (d.fedred_local_steps, (0.5, 0.04, True), {}, 50),
    (d.fedred_local_steps, (0.5, 1.0, True), {}, 10),
    (d.fedred_local_steps, (0.5, 1e-4, True), {}, 100),
    (d.fedred_local_steps, (0.3, 0.07, True), {}, math.ceil(1 / 0.021)),  # 47.6 → 48
    # FedRed's type-2 weight: p/γ (p = 1/K), λ with a prox solver
    (d.fedred_cv_weight, (0.5, 10, None, 0.2), {}, 0.2),
    (d.fedred_cv_weight, (0.5, 8, 0.25, 0.2), {}, 0.5),
    (d.fedred_cv_weight, (None, 10, None, 0.2), {}, 0.2),
    # Scaffnew's p = min(1, sqrt(μ/L))
    (d.scaffnew_probability, (0.01, 4.0), {}, 0.05),
    (d.scaffnew_probability, (8.0, 4.0), {}, 1.0),
    # S-DANE's re-solve after a failed accuracy test: twice the SVRG passes the failed solve ran (passes=auto: the
    # count it resolved to, given), twice a fixed count's products or iterations (tol = 0), else a 100 times smaller
    # tolerance; every other setting kept
    (d.tighter, (LocalSolver("svrg", passes=2),), {}, LocalSolver("svrg", passes=4)),
    (d.tighter, (LocalSolver("svrg", passes="auto"), 7), {}, LocalSolver("svrg", passes=14)),
    (d.tighter, (LocalSolver("svrg", passes=14), 14), {}, LocalSolver("svrg", passes=28)),
    (d.tighter, (LocalSolver("cg", tol=1e-6, max_iter=7),), {}, LocalSolver("cg", tol=1e-8, max_iter=7)),
    (d.tighter, (LocalSolver("cg", tol=0, max_iter=7),), {}, LocalSolver("cg", tol=0, max_iter=14)),
    (d.tighter, (LocalSolver("lbfgs"),), {}, LocalSolver("lbfgs", tol=1e-12)),
    (d.tighter, (LocalSolver("lbfgs", tol=0),), {}, LocalSolver("lbfgs", tol=0, max_iter=2000)),
    # DIANA's α = 1/(ω + 1) and γ = min(α/(2μ), 2/((L + μ)(1 + 6ω/m))) (Horváth et al. 2019)
    (d.diana_shift_step, (9.0,), {}, 0.1),
    (d.diana_shift_step, (0.0,), {}, 1.0),
    (d.diana_step, (4.0, 0.0, 9.0, 3, 0.1), {}, 2 / 76),                 # 2/(4 (1 + 6·9/3)), no μ bound at μ = 0
    (d.diana_step, (4.0, 0.5, 9.0, 3, 0.1), {}, 2 / (4.5 * 19)),         # 0.0234 below α/(2μ) = 0.1
    (d.diana_step, (4.0, 0.5, 9.0, 3, 0.001), {}, 0.001),                # α/(2μ) binds
    (d.diana_step, (4.0, 1.0, 0.0, 4, 1.0), {}, 0.4),                    # ω = 0: 2/(L + μ), GD's best fixed step
    (d.diana_step, (4.0, 0.0, 0.0, 4, 1.0), {}, 1.9 / 4),                # ... held at 1.9/L (2/L at μ = 0)
    # MARINA's p = ζ_Q/d and γ = 1/(L₋ + L₊ sqrt((1 − p)ω/(pm))) (Gorbunov et al. 2021, Theorem 2.1)
    (d.marina_probability, (3, 30), {}, 0.1),
    (d.marina_step, (2.0, 3.0, 9.0, 0.1, 4), {}, 1 / 15.5),              # sqrt(0.9·9/0.4) = 4.5: 1/(2 + 13.5)
    (d.marina_step, (2.0, 3.0, 9.0, 1.0, 4), {}, 0.5),                   # p = 1: 1/L₋
    # PP-MARINA's p = ζ_Q r/(d m) and γ = 1/(L₋ + L₊ sqrt((1 − p)(1 + ω)/(p r))) (Gorbunov et al. 2021, Theorem 4.1)
    (d.pp_marina_probability, (3, 30, 2, 4), {}, 0.05),                  # 3·2/(30·4)
    (d.pp_marina_step, (2.0, 3.0, 9.0, 0.1, 10), {}, 1 / 11),            # sqrt(0.9·10/(0.1·10)) = 3: 1/(2 + 9)
    (d.pp_marina_step, (2.0, 3.0, 9.0, 1.0, 2), {}, 0.5),                # p = 1: 1/L₋
    # ... as a coauthor's code has them (burlachenkok/flpytorch, MarinaAlgorithmPP: "Theorem 4.1, p.37"), at
    # L₋ = L₊ = L: γ = 1/(L(1 + sqrt((1 − p)(1 + ω)/(pr)))), and p = r/(m(1 + ω)) for RandK (the row (3, 30, 2, 4) above)
    (d.pp_marina_step, (2.0, 2.0, 9.0, 0.1, 10), {}, 1 / 8),             # 1/(2(1 + 3))
    (d.pp_marina_probability, (3, 30, 2, 4), {}, 2 / (4 * (1 + (30 / 3 - 1)))),
    # EF21's γ = 1/(L + L̃ sqrt(β/θ)), θ = 1 − sqrt(1 − δ), β = (1 − δ)/θ (Richtárik et al. 2021, Theorem 1)
    (d.ef21_step, (2.0, 3.0, 0.75), {}, 0.2),                            # θ = 1/2, β = 1/2: 1/(2 + 3)
    (d.ef21_step, (2.0, 3.0, 0.19), {}, 1 / 29),                         # θ = 0.1, β = 8.1, sqrt(β/θ) = 9
    (d.ef21_step, (2.0, 3.0, 1.0), {}, 0.5),                             # δ = 1 (no compression): 1/L
    # EF21-P: α/(16L) (Gruntkowska, Tyurin & Richtárik 2023, Theorem D.1); with an EF21 uplink the smaller of it and
    # EF21's γ at δ, EF21's alone at δ_P = 1
    (d.ef21p_primal_step, (2.0, 0.5), {}, 1 / 64),                       # 0.5/(16·2)
    (d.ef21p_primal_step, (4.0, 1.0), {}, 1 / 64),
    (d.ef21p_step, (2.0, 3.0, 1.0, 0.5), {}, 1 / 64),                    # exact uplink: Theorem D.1's 0.5/32 < 1/2
    (d.ef21p_step, (2.0, 3.0, 0.19, 0.75), {}, 3 / 128),                 # 0.75/32 = 0.0234 below EF21's 1/29
    (d.ef21p_step, (2.0, 30.0, 0.19, 0.75), {}, 1 / 272),                # sqrt(β/θ) = 9: 1/(2 + 270) below 0.0234
    (d.ef21p_step, (2.0, 3.0, 0.19, 1.0), {}, 1 / 29),                   # exact downlink: EF21's
    (d.ef21p_step, (2.0, 3.0, 1.0, 1.0), {}, 0.5),                       # exact both ways: 1/L
    # FedNL-BC's η: 1 for a contractive C_M, 1/(ω + 1) for an unbiased one
    (d.model_learning_rate, (None,), {}, 1.0),
    (d.model_learning_rate, (3.0,), {}, 0.25),
    # ADIANA (Li et al. 2020): p = min(1, max(1, sqrt(n/(32ω)) − 1)/(2(1 + ω))), η = min(1/(2L), n/(64ωL(2p(ω+1)+1)²)),
    # θ₁ = min(1/4, sqrt(ημ/p)), γ = η/(2(θ₁ + ημ)), β = 1 − γμ
    (d.adiana_probability, (0.0, 4), {}, 1.0),                           # ω = 0: every round refreshes w
    (d.adiana_probability, (9.0, 4), {}, 0.05),                          # sqrt(4/288) − 1 < 1: 1/(2·10)
    (d.adiana_probability, (1.0, 512), {}, 0.75),                        # sqrt(16) − 1 = 3: 3/(2·2)
    (d.adiana_probability, (0.5, 1600), {}, 1.0),                        # sqrt(100) − 1 = 9: 9/3 = 3, capped at 1
    (d.adiana_step, (4.0, 0.0, 4, 1.0), {}, 0.125),                      # ω = 0: 1/(2L)
    (d.adiana_step, (4.0, 9.0, 4, 0.05), {}, 1 / 2304),                  # 2p(ω+1)+1 = 2: 4/(64·9·4·4)
    (d.adiana_step, (4.0, 1.0, 1024, 0.75), {}, 0.125),                  # 1024/(64·4·16) = 0.25 > 1/(2L)
    (d.adiana_theta1, (0.01, 0.04, 0.25), {}, 0.04),                     # sqrt(0.0004/0.25)
    (d.adiana_theta1, (1.0, 1.0, 1.0), {}, 0.25),                        # capped at 1/4
    (d.adiana_gamma, (0.01, 0.04, 0.04), {}, 0.01 / 0.0808),             # 0.01/(2(0.04 + 0.0004))
    (d.adiana_beta, (0.5, 0.04), {}, 0.98),
    # DASHA (Tyurin & Richtárik 2023, Theorem 6.1): a = 1/(2ω + 1), γ = 1/(L + sqrt(16ω(2ω + 1)/n) L̂)
    (d.dasha_momentum, (0.0,), {}, 1.0),
    (d.dasha_momentum, (9.0,), {}, 1 / 19),
    (d.dasha_step, (2.0, 3.0, 0.0, 4), {}, 0.5),                         # ω = 0: 1/L
    (d.dasha_step, (2.0, 3.0, 1.0, 3), {}, 1 / 14),                      # sqrt(16·1·3/3) = 4: 1/(2 + 12)
    (d.dasha_step, (2.0, 3.0, 9.0, 4), {}, 1 / (2 + 18 * 19 ** 0.5)),    # sqrt(16·9·19/4) = 6 sqrt(19), times 3
    # CG's products per solve where max_iter is null: the shard's own count (a linear model's, by dtype), else d
    (d.cg_products, (SimpleNamespace(dim=7),), {}, 70),  # 10 d: CG past d products where round-off needs it
    # GD: min(2/(L̄ + μ̲), lr_factor/L̄)
    (d.gd_step, (10.0, 1.0, 1.9), {}, 2 / 11),                           # 0.1818 < 0.19
    (d.gd_step, (10.0, 0.0, 1.9), {}, 0.19),                             # μ̲ = 0: 2/L̄ capped at 1.9/L̄
    # ADMM: ρ = sqrt(max(μ̲, 1e-6 L̄) L̄)
    (d.admm_penalty, (1.0, 4.0), {}, 2.0),
    (d.admm_penalty, (0.0, 4.0), {}, 4e-3),                              # sqrt(4e-6 · 4)
    (d.residual_balancing, (True,), {}, True),
    (d.residual_balancing, (False,), {}, False),
    # DiSCO's M, FedNL's option, synchronous SGD's steps
    (d.self_concordance, (True,), {}, 0.0),
    (d.self_concordance, (False,), {}, 1.0),
    (d.fednl_option, ("ls",), {}, 1),
    (d.fednl_option, ("plain",), {}, 2),
    (d.sgd_steps_per_round, (250.5, 50), {}, 5),                         # 250.5 // 50
    (d.sgd_steps_per_round, (20.0, 50), {}, 1),                          # less than a batch: one step
    (d.nl1_step, (4, 40), {}, 0.1),                                      # K/n_i
    (d.nl1_step, (4, 3), {}, 1.0),                                       # K above n_i keeps all n_i
]


@pytest.mark.parametrize("rule, args, kwargs, expected", ROWS,
                         ids=[f"{r[0].__name__}{r[1]}{r[2] or ''}" for r in ROWS])
def test_each_rule_gives_its_hand_value(rule, args, kwargs, expected):
    exact = isinstance(expected, LocalSolver)  # a solver's settings: equal, field for field
    assert rule(*args, **kwargs) == (expected if exact else pytest.approx(expected, rel=1e-14, abs=0))


# the balanced weight: the crossing of balance · gap(λ) and the flat rate λ/(μ + λ) over octaves of λ
WEIGHTS = [8.0, 4.0, 2.0, 1.0]


@pytest.mark.parametrize("gaps, mu, balance, expected", [
    ([0.1, 0.1, 0.1, 0.1], 1.0, 1.0, 1.0),       # excess ≤ 1 at every weight: the smallest
    ([1.0, 1.0, 1.0, 1.0], 1.0, 1.0, None),      # above the flat rate already at the largest
    # excess = g(1 + 1/λ): 0.5625, 0.9375 at λ = 8, 4, then 1.6875 at 2: log-interpolate between 4 and 2
    ([0.5, 0.75, 1.125, 1.0], 1.0, 1.0,
     math.exp(math.log(4) + math.log(0.9375) / (math.log(0.9375) - math.log(1.6875)) * (math.log(2) - math.log(4)))),
    ([0.25, 0.375, 0.5625, 0.5], 1.0, 2.0,       # balance 2 doubles every excess: the same crossing
     math.exp(math.log(4) + math.log(0.9375) / (math.log(0.9375) - math.log(1.6875)) * (math.log(2) - math.log(4)))),
    ([0.0, 0.0, 0.0, 0.0], 0.0, 1.0, 1.0),       # μ = 0: flat rate 1, no gap
])
def test_the_balanced_weight_is_the_crossing_by_hand(gaps, mu, balance, expected):
    found = d.balanced_prox_weight(WEIGHTS, gaps, mu, balance)
    assert found == expected if expected is None else found == pytest.approx(expected, rel=1e-14)


def test_a_small_quadratics_lanczos_runs_to_d_products():
    """`lanczos_iters`: d products on a quadratic of d ≤ 2000 (exact, so μ̲ reads its λ_min), power_iters otherwise."""
    from types import SimpleNamespace as P

    small, large, logistic = P(quadratic=True, dim=21), P(quadratic=True, dim=2001), P(quadratic=False, dim=21)
    assert d.lanczos_iters(small, 20) == 21 and d.lanczos_is_exact(small, 21) and not d.lanczos_is_exact(small, 20)
    assert d.lanczos_iters(P(quadratic=True, dim=12), 20) == 20
    assert d.lanczos_iters(large, 20) == 20 and not d.lanczos_is_exact(large, 20)
    assert d.lanczos_iters(logistic, 20) == 20 and not d.lanczos_is_exact(logistic, 30)


def test_the_constants_are_the_documented_ones():
    """The tuning constants the docs and the yaml comments quote."""
    assert (d.GAP_BALANCE, d.ACC_GAP_BALANCE, d.PROX_PER_DISSIMILARITY) == (1.0, 2.0, 1 / 512)
    assert (d.HETEROGENEITY_DIVISOR, d.ACC_HETEROGENEITY_DIVISOR) == (16, 4)
    assert (d.SAMPLED_PROX_PER_CURVATURE, d.ACC_SAMPLED_PROX_PER_CURVATURE) == (0.5, 1.0)
    assert d.ADIANA_THETA2 == 0.5
    assert (d.SERVER_STEP, d.FEDRED_LOCAL_STEPS, d.FEDRED_MAX_SAMPLED_STEPS, d.DISSIMILARITY_FLOOR) == (1.5, 10, 100,
                                                                                                       1e-6)


def test_every_noted_rule_names_a_rule_of_the_defaults_module():
    """A summary's ``defaults`` entry names its rule as a function or constant of `baselines.defaults` (or "the
    problem's"), so a reader finds its formula and source there: every ``resolution.add`` of the algorithms, read
    from their source."""
    import ast
    from pathlib import Path

    found = {}
    for path in sorted(Path(d.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add" \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "resolution":
                rule = node.args[2]
                found[f"{path.name}:{node.lineno}"] = rule.value if isinstance(rule, ast.Constant) else None
    found["dane/split/run.py"] = "cut_model"  # split learning's cut=null, noted by its own driver (tests/test_split.py)
    assert len(found) >= 40  # every method with a null
    bad = {where: rule for where, rule in found.items() if rule != "the problem's" and not hasattr(d, str(rule))}
    assert bad == {}


def test_a_resolution_notes_key_value_rule_and_the_statistics_it_read():
    resolution = d.Resolution()
    assert resolution.add("lam", 0.25, "prox_weight", delta_a=0.5, balanced=None) == 0.25
    assert resolution.entries == [{"key": "algorithm.lam", "value": 0.25, "rule": "prox_weight",
                                   "stats": {"delta_a": 0.5}}]
