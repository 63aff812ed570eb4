"""The run's generators (`dane.seeds`): every stream registered once, and no two 63-bit seeds of streams one run
can hold the same, for runs of up to 1,024 workers."""
import itertools

import numpy as np
import pytest

from dane.baselines import bc_newton, fedred, local_sgd, marina, scaffnew, sync_sgd
from dane.comm.compression import COMPRESS_STREAM, DOWNLINK_STREAM, compression_seed, downlink_seed
from dane.problems import glm, neural
from dane.sampling import SAMPLER_STREAM, sampler_seed
from dane.seeds import STREAMS, keyed_seed, shared_seed, stream_seed, worker_seed
from dane.split import training

RANKS = range(1024)


def test_each_module_takes_its_stream_from_the_table():
    used = {"network_minibatch": neural.SAMPLER_STREAM, "augmentation": neural.AUGMENT_STREAM,
            "sync_sgd_minibatch": sync_sgd.SAMPLER_STREAM, "local_sgd_minibatch": local_sgd.SAMPLER_STREAM,
            "split_batch_order": training.SAMPLER_STREAM, "svrg": glm.SOLVER_STREAM, "client_sampler": SAMPLER_STREAM,
            "scaffnew_coin": scaffnew.COIN_STREAM, "downlink": DOWNLINK_STREAM, "fedred_coin": fedred.COIN_STREAM,
            "marina_coin": marina.COIN_STREAM, "fednl_bc_coin": bc_newton.COIN_STREAM, "compression": COMPRESS_STREAM}
    assert used == {name: stream.number for name, stream in STREAMS.items()}


def test_seeds_are_the_sequences_first_word_halved():
    state = np.random.SeedSequence([3, 11, 5]).generate_state(1, dtype=np.uint64)[0]
    assert worker_seed(3, 11, 5) == stream_seed(3, 11, 5) == int(state) >> 1 < 2 ** 63
    assert shared_seed(3, 7) == sampler_seed(3) == int(np.random.SeedSequence([3, 7]).generate_state(1, np.uint64)[0]) >> 1
    keyed = np.random.SeedSequence(3, spawn_key=(11, 5)).generate_state(1, dtype=np.uint64)[0]
    assert compression_seed(3, 5) == keyed_seed(3, 11, 5) == int(keyed) >> 1
    assert downlink_seed(3) == shared_seed(3, 12)


@pytest.mark.parametrize("seed", [0, 1])
def test_no_two_streams_of_a_run_meet(seed):
    """Every 63-bit seed of the ``worker``, ``shared`` and ``keyed`` streams, over 1,024 ranks, is distinct, but for
    pairs of streams no run holds together (one number in two places of the table).  Compression's seeds as the
    list ``[seed, 11, rank]`` met worker 11's: rank 5's was worker 11's SVRG seed."""
    as_used = {"compression": [compression_seed(seed, r) for r in RANKS], "downlink": [downlink_seed(seed)],
               "client_sampler": [sampler_seed(seed)]}  # the modules' own functions
    owner: dict[int, set[str]] = {}
    for name, (number, layout) in STREAMS.items():
        seeds = as_used.get(name) or {"worker": lambda: (worker_seed(seed, r, number) for r in RANKS),
                                      "shared": lambda: [shared_seed(seed, number)], "numpy": lambda: []}[layout]()
        for value in seeds:
            owner.setdefault(value, set()).add(name)
    apart = {frozenset({"local_sgd_minibatch", "split_batch_order"})}  # one algorithm a run
    met = {frozenset(names) for names in owner.values() if len(names) > 1}
    assert met == apart
    as_list = {stream_seed(seed, COMPRESS_STREAM, r) for r in RANKS}  # the layout compression had
    assert as_list & {worker_seed(seed, 11, STREAMS["svrg"].number)}


def test_numbers_repeat_only_between_streams_of_different_runs():
    repeats = {frozenset(n for n, s in STREAMS.items() if s.number == number)
               for number in {s.number for s in STREAMS.values()}}
    assert {names for names in repeats if len(names) > 1} == {
        frozenset({"local_sgd_minibatch", "split_batch_order"}), frozenset({"scaffnew_coin", "compression"}),
        frozenset({"fedred_coin", "marina_coin"})}
    assert not any(a.layout == b.layout == "shared" and a.number == b.number
                   for a, b in itertools.combinations(STREAMS.values(), 2))


def test_the_modules_seed_their_generators_as_the_table_says():
    """The generators as the modules build them (not recomputed from the table): a network shard's minibatch and
    augmentation generators and the SVRG solver's, each the seed of its own stream (the shared coins are checked
    against transcriptions of their draws: tests/test_fedred_type2.py, test_federated_reference.py)."""
    from dane.problems import LogReg
    from dane.problems.neural import DataConfig, ModelConfig, NeuralProblemConfig

    network = NeuralProblemConfig(data=DataConfig(dataset="digits", image_size=8), model=ModelConfig(name="mlp"),
                                  augment=True, device="cpu", seed=3).build(1, 2)
    assert network.sampler.generator.initial_seed() == worker_seed(3, 1, STREAMS["network_minibatch"].number)
    assert network.augmenter.initial_seed() == worker_seed(3, 1, STREAMS["augmentation"].number)
    X = np.random.default_rng(0).standard_normal((40, 3))
    shard = LogReg(X, (X[:, 0] > 0).astype(float), lam=1e-2, seed=3).build(1, 2)
    assert shard.generator.initial_seed() == worker_seed(3, 1, STREAMS["svrg"].number)
