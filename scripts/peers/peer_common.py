"""What the peer programs share (NumPy alone, so that any interpreter runs it): the command line, the shards file,
the workload's local steps and objective, and the one JSON line each peer answers with.

The workload (scripts/bench_federated_scale.py): client i of m holds rows X_i, labels y_i ∈ {0, 1} of N in all, and
its objective is dane's O_i(w) = (m/N) Σ_{j∈i} f_j(w) + (λ/2)‖w‖², f_j(w) = log(1 + exp(x_jᵀw)) − y_j x_jᵀw, so
that O(w) = (1/m) Σ_i O_i(w) = (1/N) Σ_j f_j(w) + (λ/2)‖w‖²; a round is K full-batch gradient steps of O_i from w_t
on each chosen client and w_{t+1} their plain mean.
"""
from __future__ import annotations

import argparse
import json
import platform
import time

import numpy as np


def arguments(doc: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--shards", required=True, help="the .npz: X, y (0/1) and client (0 .. m-1)")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--per-round", type=int, required=True, help="clients a round (m: all)")
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--local-steps", type=int, default=10)
    parser.add_argument("--lam", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def clients(path: str) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray, np.ndarray]:
    """Client i's (X_i, y_i), views into the rows sorted by client (as dane deals a client column), and those rows."""
    with np.load(path) as table:
        X, y, client = table["X"], table["y"], table["client"]
    order = np.argsort(client, kind="stable")
    X, y, client = X[order], y[order], client[order]  # one copy: every client's rows are then a view
    bounds = np.flatnonzero(np.diff(client)) + 1
    return list(zip(np.split(X, bounds), np.split(y, bounds))), X, y


_READ: dict = {}  # path -> `clients` of it, in this process


def read_once(path: str) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray, np.ndarray]:
    """`clients`, read once a process: a Flower worker serves many clients.  Kept here, in an imported module, so
    that pickling a peer's functions (Ray ships them by value from ``__main__``) never carries the rows along."""
    if path not in _READ:
        _READ[path] = clients(path)
    return _READ[path]


def local_steps(w: np.ndarray, X: np.ndarray, y: np.ndarray, *, weight: float, lam: float, lr: float,
                steps: int) -> np.ndarray:
    """``steps`` gradient steps of O_i(w) = weight Σ f_j(w) + (λ/2)‖w‖² from w (weight = m/N)."""
    for _ in range(steps):
        z = X @ w
        w = w - lr * (weight * (X.T @ (np.exp(-np.logaddexp(0.0, -z)) - y)) + lam * w)
    return w


def objective(w: np.ndarray, X: np.ndarray, y: np.ndarray, lam: float) -> float:
    z = X @ w
    return float(np.mean(np.logaddexp(0.0, z) - y * z) + 0.5 * lam * (w @ w))


def answer(framework: str, version: str, stamps: list[float], w: np.ndarray, X: np.ndarray, y: np.ndarray,
           lam: float, **extra) -> None:
    """The peer's one JSON line: each round's seconds (``stamps``: perf_counter at the rounds' bounds), the final
    objective O(w) and the framework's version."""
    print(json.dumps({"framework": framework, "version": version, "python": platform.python_version(),
                      "round_s": [b - a for a, b in zip(stamps, stamps[1:])], "objective": objective(w, X, y, lam),
                      "finished_at": time.time(), **extra}), flush=True)
