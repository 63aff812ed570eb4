"""Seeds: the run's random streams, each seeded from the run's seed by `stream_seed` under one registered layout
(`STREAMS`), so that no two streams one run holds draw the same numbers."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Stream(NamedTuple):
    number: int
    layout: str


#: stream -> (its number, its layout).  ``worker``: ``[seed, rank, number]``, one generator per worker
#: (`worker_seed`); ``shared``: ``[seed, number]``, one generator every rank holds a copy of (a run's coins, its
#: client sampler, its downlink); ``keyed``: ``[seed]`` with spawn key ``(number, rank)``, a per-worker stream kept
#: apart from the worker layout (a list ``[seed, 11, r]`` is worker 11's stream r there); ``numpy``: a NumPy
#: generator on ``SeedSequence([seed, number])`` itself (no 63-bit seed: another generator than a torch one seeded
#: by `shared_seed` of the same number).  A number repeats only between streams no run holds together (``worker``
#: 3: local SGD and split learning; 13: FedRed and MARINA); tests/test_seeds.py checks that the 63-bit seeds of the
#: streams one run can hold never meet.  Seeded outside this table, each a stream of its own family: the data
#: generators' NumPy streams (`dane.problems.ridge`), Newton-3PC's per-client draws, RandK's counter-based keys
#: (`dane.problems.stacked_compress`), FedNL's per-client generators of natural and dithering compression
#: (``seed * 1_000_003 + client``), the spectral estimates' start vector (``manual_seed(seed)``, read by the
#: default rules of GD, DIANA, ADMM, Scaffnew and SCAFFOLD, none of which holds FedNL's generators) and the
#: simulator's drawn tail costs.
STREAMS = {
    "network_minibatch": Stream(1, "worker"), "sync_sgd_minibatch": Stream(2, "worker"),
    "local_sgd_minibatch": Stream(3, "worker"), "split_batch_order": Stream(3, "worker"),
    "augmentation": Stream(4, "worker"), "svrg": Stream(5, "worker"), "client_sampler": Stream(7, "shared"),
    "scaffnew_coin": Stream(11, "shared"), "downlink": Stream(12, "shared"), "fedred_coin": Stream(13, "shared"),
    "marina_coin": Stream(13, "numpy"), "fednl_bc_coin": Stream(14, "numpy"), "compression": Stream(11, "keyed"),
}


def stream_seed(seed: int, *words: int, spawn_key: tuple[int, ...] = ()) -> int:
    """The 63-bit seed of NumPy's ``SeedSequence([seed, *words], spawn_key=spawn_key)``: its first 64-bit word
    shifted right once (torch's ``manual_seed`` and NumPy take it)."""
    sequence = np.random.SeedSequence([seed, *words], spawn_key=spawn_key)
    return int(sequence.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def worker_seed(seed: int, rank: int, stream: int) -> int:
    """Worker ``rank``'s seed of a ``worker`` stream: ``[seed, rank, stream]``."""
    return stream_seed(seed, rank, stream)


def shared_seed(seed: int, stream: int) -> int:
    """The seed of a ``shared`` stream, from the run's seed alone: ``[seed, stream]``."""
    return stream_seed(seed, stream)


def keyed_seed(seed: int, stream: int, rank: int) -> int:
    """Worker ``rank``'s seed of a ``keyed`` stream: ``[seed]`` with spawn key ``(stream, rank)``."""
    return stream_seed(seed, spawn_key=(stream, rank))
