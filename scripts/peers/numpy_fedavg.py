"""The plain NumPy loop of the workload (peer_common): the floor a framework's round is set against.

    python scripts/peers/numpy_fedavg.py --shards F.npz --per-round S --lr LR [--rounds 30 --local-steps 10 ...]

Clients a round: all m, else S drawn uniformly without replacement (numpy's default_rng(seed)); float64.
"""
from __future__ import annotations

import time

import numpy as np

from peer_common import answer, arguments, clients, local_steps


def main() -> None:
    args = arguments(__doc__)
    parts, X, y = clients(args.shards)
    m, rng = len(parts), np.random.default_rng(args.seed)
    keys = dict(weight=m / len(y), lam=args.lam, lr=args.lr, steps=args.local_steps)
    w = np.zeros(X.shape[1])
    stamps = [time.perf_counter()]
    for _ in range(args.rounds):
        chosen = range(m) if args.per_round >= m else rng.choice(m, args.per_round, replace=False)
        w = sum(local_steps(w, *parts[i], **keys) for i in chosen) / len(chosen)
        stamps.append(time.perf_counter())
    answer("numpy", np.__version__, stamps, w, X, y, args.lam)


if __name__ == "__main__":
    main()
