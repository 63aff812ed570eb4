"""dane/data/synthetic_source.py: FedProx's Synthetic(α, β) generator, its source and its data set, by number."""
from __future__ import annotations

import math

import numpy as np
import pytest

from dane.data import load_dataset
from dane.data.synthetic_source import (CLASSES, CLIENTS, DIM, PAPER_SETS, SyntheticSource, covariance_diagonal,
                                        generate_synthetic, train_rows)
from dane.errors import ConfigError


def test_shapes_client_count_and_power_law_sizes():
    data = generate_synthetic(0.5, 0.5, seed=3)
    assert len(data.X) == len(data.y) == CLIENTS == 30
    assert data.W.shape == (30, CLASSES, DIM) == (30, 10, 60) and data.b.shape == (30, 10) and data.v.shape == (30, 60)
    assert [x.shape for x in data.X] == [(n, 60) for n in data.sizes]
    # the first draws of the seed's generator: floor(LogNormal(4, 2)) + 50, so never fewer than 50 rows
    expected = np.random.default_rng(3).lognormal(4.0, 2.0, 30).astype(np.int64) + 50
    assert data.sizes.tolist() == expected.tolist() and data.sizes.min() >= 50


def test_the_same_seed_draws_the_same_data_and_another_seed_other_data():
    a, b = generate_synthetic(1.0, 1.0, seed=7), generate_synthetic.__wrapped__(1.0, 1.0, seed=7)  # uncached twice
    assert all(np.array_equal(x, y) for x, y in zip(a.X, b.X)) and np.array_equal(a.W, b.W)
    assert all(np.array_equal(x, y) for x, y in zip(a.y, b.y))
    c = generate_synthetic(1.0, 1.0, seed=8)
    assert not np.array_equal(a.sizes, c.sizes)


def test_labels_are_the_argmax_of_each_clients_own_model():
    data = generate_synthetic(1.0, 1.0, seed=0)
    for k in range(CLIENTS):
        assert np.array_equal(data.y[k], np.argmax(data.X[k] @ data.W[k].T + data.b[k], axis=1).astype(float))
    assert {float(c) for y in data.y for c in y} <= set(map(float, range(10)))


def test_the_covariance_is_diagonal_j_to_the_minus_1_2():
    """x − v_k ~ N(0, Σ) on every client: pooled over the 30 clients (5385 rows at seed 0), each sample variance
    is within 10% of j^-1.2 (its relative standard error is sqrt(2/n) = 1.9%, so 10% is above 5 of them) and each
    correlation of two coordinates is below 0.07 (standard error 1/sqrt(n) = 0.014)."""
    data = generate_synthetic(0.0, 0.0, seed=0)
    z = np.concatenate([x - data.v[k] for k, x in enumerate(data.X)])
    assert len(z) == 5385
    assert covariance_diagonal()[[0, 1, 59]].tolist() == [1.0, 2.0 ** -1.2, 60.0 ** -1.2]
    np.testing.assert_allclose(z.var(axis=0), covariance_diagonal(), rtol=0.1)
    corr = np.corrcoef(z, rowvar=False)
    assert np.abs(corr - np.eye(DIM)).max() < 0.07


def test_alpha_spreads_the_clients_models_and_beta_their_inputs():
    """Client k's W_k and b_k entries have mean u_k ~ N(0, α²), its v_k entries mean B_k ~ N(0, β²) (α, β standard
    deviations, as the public generator's np.random.normal): the spread over clients of the per-client means is
    about α (β) plus the 1/sqrt(610) (1/sqrt(60)) of averaging unit-variance entries."""
    same, apart = generate_synthetic(0.0, 0.0, seed=1), generate_synthetic(1.0, 1.0, seed=1)
    means = lambda d: np.concatenate([d.W.reshape(30, -1), d.b], axis=1).mean(axis=1)  # noqa: E731
    assert means(same).std() < 0.1 and 0.5 < means(apart).std() < 1.6
    assert same.v.mean(axis=1).std() < 0.3 and 0.5 < apart.v.mean(axis=1).std() < 1.6


def test_the_iid_variant_shares_one_model_and_zero_means():
    data = generate_synthetic(0.0, 0.0, iid=True, seed=2)
    assert all(np.array_equal(data.W[k], data.W[0]) and np.array_equal(data.b[k], data.b[0]) for k in range(30))
    assert not data.v.any()
    with pytest.raises(ConfigError, match=r"data.iid=true .* set data.alpha=0 data.beta=0 \(got 1, 0\)"):
        generate_synthetic(1.0, 0.0, iid=True)
    with pytest.raises(ConfigError, match="data.alpha"):
        SyntheticSource(alpha=-1.0)


def test_the_source_gives_each_worker_its_clients_training_rows():
    source = SyntheticSource(alpha=0.5, beta=0.5, seed=4)
    data = generate_synthetic(0.5, 0.5, seed=4)
    cut = [int(0.9 * n) for n in data.sizes]
    assert [train_rows(n, 0.1) for n in data.sizes] == cut and source.presharded and source.name == "synthetic(0.5,0.5)"
    part, total = source.load_part(7, 30)
    assert total == sum(cut) and np.array_equal(part.X, data.X[7][:cut[7]])
    assert np.array_equal(part.y, data.y[7][:cut[7]])
    whole = source.load()
    assert whole.n == sum(cut) and np.array_equal(whole.X[:cut[0]], data.X[0][:cut[0]])
    with pytest.raises(ConfigError, match="has 30 clients, one per worker, but the run has 8 workers; set workers=30"):
        source.load_part(0, 8)


def test_the_networks_data_set_holds_every_clients_rows():
    data = load_dataset("synthetic_1_1", data_dir=None, seed=0)
    sizes = generate_synthetic(*PAPER_SETS["synthetic_1_1"][:2], seed=0).sizes
    assert len(data.train_y) == sum(int(0.9 * n) for n in sizes) and len(data.train_y) + len(data.test_y) == sizes.sum()
    assert data.num_classes == 10 and data.in_shape == (60,)


def test_softmax_on_the_natural_partition_starts_at_log_10():
    """At w = 0 every row's cross-entropy is log 10 and the l2 term 0: the weighted mean over the unequal clients
    (weight m/N per row) is log 10 exactly, whatever the clients' sizes."""
    from dane.api import fit
    from dane.problems.linear_models import LinearModelConfig

    problem = LinearModelConfig(name="softmax", loss="softmax", classes=10, lam=1e-3,
                                data=SyntheticSource(alpha=1.0, beta=1.0))
    result = fit(problem, "fedavg", workers=30, rounds=1, clients_per_round=10, local_steps=2, lr=0.01)
    assert result.records[0]["objective"] == pytest.approx(math.log(10), rel=1e-12)
    assert result.records[1]["objective"] < math.log(10) and result.records[0]["clients"] == 10


POOLED = {"sharding": "column", "client_column": "client"}


def test_pooled_rows_dealt_by_their_client_column_are_the_natural_partition():
    """sharding=column, client_column=client (the rows pooled): worker k's rows are client k's, in the table's order
    (client 0's first), and the built shard (rows, labels, weight n_k / N) is the natural partition's."""
    from dane.problems.linear_models import LinearModelConfig

    natural, pooled = (LinearModelConfig(name="softmax", loss="softmax", classes=10, lam=1e-3, seed=1,
                                         data=SyntheticSource(alpha=0.5, beta=0.5, seed=4, **keys))
                       for keys in ({}, POOLED))
    assert not pooled.source.presharded and pooled.source.load().clients.tolist() == \
        [k for k, n in enumerate(train_rows(n, 0.1) for n in generate_synthetic(0.5, 0.5, seed=4).sizes)
         for _ in range(n)]
    cut = np.cumsum([0] + [train_rows(n, 0.1) for n in generate_synthetic(0.5, 0.5, seed=4).sizes])
    assert [pooled.worker_rows(k, 30)[0].tolist() for k in range(30)] == \
        [list(range(cut[k], cut[k + 1])) for k in range(30)]
    notes = pooled.worker_rows(0, 30)[1]
    assert notes[1].startswith(f"worker 0 (client=0): {cut[1]} rows; ") and len(notes) == 31
    for k in (0, 7, 29):
        a, b = natural.build(k, 30), pooled.build(k, 30)
        assert a.X.equal(b.X) and a.y.equal(b.y) and a.weight == b.weight


def test_fedavg_on_the_pooled_clients_gives_the_natural_partitions_records():
    """FedAvg, 10 of the 30 clients sampled a round: the same records, time aside, from both forms."""
    from dane.api import fit
    from dane.problems.linear_models import LinearModelConfig

    runs = []
    for keys in ({}, POOLED):
        problem = LinearModelConfig(name="softmax", loss="softmax", classes=10, lam=1e-3,
                                    data=SyntheticSource(alpha=1.0, beta=1.0, **keys))
        result = fit(problem, "fedavg", workers=30, rounds=3, clients_per_round=10, local_steps=2, lr=0.01)
        runs.append([{k: v for k, v in r.items() if "time" not in k} for r in result.records])
    assert len(runs[0]) == 4 and runs[0] == runs[1]


def test_pooled_sharding_lines():
    """A client column without sharding=column, a skewed scheme (alpha is the paper's), another client column: one
    line each; iid deals the pooled rows to any worker count; column with another count names the 30 clients."""
    from dane.problems.linear_models import LinearModelConfig

    with pytest.raises(ConfigError, match="data.client_column=client names the clients of data.sharding=column"):
        SyntheticSource(client_column="client")
    with pytest.raises(ConfigError, match="data.sharding=dirichlet on data=synthetic: data.alpha is the paper's alpha"):
        SyntheticSource(sharding="dirichlet")
    with pytest.raises(ConfigError, match="data.client_column=site: .* set data.client_column=client"):
        SyntheticSource(sharding="column", client_column="site")
    # a misspelt scheme, a skew that is no Dirichlet one, and column with no client column were all refused with the
    # Dirichlet line (or 'data.client_column=None: ...'): each has its own now
    for keys, line in (({"sharding": "colum"}, "data.sharding must be one of iid|column on data=synthetic (or null: "
                                               "client k is worker k), got 'colum'"),
                       ({"sharding": "quantity"}, "data.sharding=quantity on data=synthetic: the clients are the skew; "
                                                  "use data.sharding=column data.client_column=client, or iid"),
                       ({"sharding": "column"}, "data.sharding=column on data=synthetic needs "
                                                "data.client_column=client (each row's client index)")):
        with pytest.raises(ConfigError) as refused:
            SyntheticSource(**keys)
        assert str(refused.value) == line
    assert SyntheticSource().presharded and not SyntheticSource(sharding="iid").presharded
    iid = LinearModelConfig(name="softmax", loss="softmax", classes=10, data=SyntheticSource(sharding="iid"))
    sizes = {len(iid.worker_rows(k, 4)[0]) for k in range(4)}
    assert max(sizes) - min(sizes) <= 1
    column = LinearModelConfig(name="softmax", loss="softmax", classes=10, data=SyntheticSource(**POOLED))
    with pytest.raises(ConfigError, match="data.client_column=client has 30 distinct values .* but workers=8"):
        column.check_workers(8)


def test_logreg_on_the_ten_classes_names_softmax():
    """problem=logreg data=synthetic workers=30 said "... on per-worker parts needs labels 0/1 or -1/+1, found {1, 6};
    ... map them in the parts, or read the whole file" (client 0's part holds two of the ten classes): neither is the
    fix for a generated 10-class set.  The source says how many classes its labels take, and logreg on it is refused
    before any row is drawn, naming problem=softmax problem.classes=10, on the natural partition and pooled."""
    from dane.problems.linear_models import LinearModelConfig

    for keys in ({}, POOLED, {"sharding": "iid"}):
        with pytest.raises(ConfigError) as refused:
            LinearModelConfig(name="logreg", loss="logistic", data=SyntheticSource(**keys))
        assert str(refused.value) == ("problem=logreg fits two classes, but synthetic(0,0) has 10 (labels 0..9); use "
                                      "problem=softmax problem.classes=10")
    assert LinearModelConfig(name="ridge", loss="squared", data=SyntheticSource()).loss == "squared"


def test_softmax_with_too_few_classes_names_the_ten():
    """problem=softmax data=synthetic problem.classes=3 workers=30 said "synthetic(1,1)[client 0]: labels {6} are not
    among the classes {0, 1, 2}; pass every class value in classes" (no config key), and without problem.classes
    "problem=softmax on presharded data needs problem.classes": both are refused before any row is drawn, naming
    problem.classes=10; pooled rows need no problem.classes (read from the labels), but a short one is refused too."""
    from dane.problems.linear_models import LinearModelConfig

    for keys, classes, given in (({}, 3, "problem.classes=3"), ({}, None, "problem.classes is not set"),
                                 (POOLED, 3, "problem.classes=3"), ({"sharding": "iid"}, 9, "problem.classes=9")):
        with pytest.raises(ConfigError) as refused:
            LinearModelConfig(name="softmax", loss="softmax", classes=classes, data=SyntheticSource(**keys))
        assert str(refused.value) == (f"{given}, but synthetic(0,0)'s labels take 10 classes (0..9); "
                                      "set problem.classes=10")
    for keys in (POOLED, {"sharding": "iid"}):
        assert LinearModelConfig(name="softmax", loss="softmax", data=SyntheticSource(**keys)).classes is None
    assert LinearModelConfig(name="softmax", loss="softmax", classes=12, data=SyntheticSource()).classes == 12
