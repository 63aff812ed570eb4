"""The workload (peer_common) as a Flower simulation: a ServerApp running Flower's FedAvg strategy over a ClientApp
whose train step is K full-batch gradient steps, on Flower's simulation engine (Ray), one supernode per client.

    python scripts/peers/flower_fedavg.py --shards F.npz --per-round S --lr LR [--rounds 30 --local-steps 10 ...]

Float64 throughout (Flower's arrays keep NumPy's dtype).  Each client replies ``num-examples`` 1, so that the strategy's
weighted mean is the plain mean dane's FedAvg takes.  Sampling is Flower's (``fraction_train`` = S/m, Python's
``random``, seeded); the round's seconds are the times between the strategy's ``configure_train`` calls (the last
to the strategy's return).  Each Ray worker reads the shards file once (`read_once`) and keeps every client's rows.
"""
from __future__ import annotations

import os
import random
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.simulation import run_simulation

from peer_common import answer, arguments, local_steps, read_once

ARGS = arguments(__doc__)
os.environ["PYTHONPATH"] = str(Path(__file__).resolve().parent)  # Ray's workers import peer_common too

client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    parts, _, labels = read_once(ARGS.shards)
    X, y = parts[int(context.node_config["partition-id"])]
    w = msg.content["arrays"].to_numpy_ndarrays()[0]
    w = local_steps(w, X, y, weight=len(parts) / len(labels), lam=ARGS.lam, lr=ARGS.lr, steps=ARGS.local_steps)
    return Message(content=RecordDict({"arrays": ArrayRecord([w]), "metrics": MetricRecord({"num-examples": 1})}),
                   reply_to=msg)


class TimedFedAvg(FedAvg):
    """Flower's FedAvg, stamping perf_counter as each round is configured."""

    stamps: list[float] = []

    def configure_train(self, server_round, arrays, config, grid):
        self.stamps.append(time.perf_counter())
        return super().configure_train(server_round, arrays, config, grid)


server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    random.seed(ARGS.seed)  # Flower draws a round's nodes with Python's random
    parts, rows, labels = read_once(ARGS.shards)
    m = len(parts)
    strategy = TimedFedAvg(fraction_train=min(1.0, ARGS.per_round / m), fraction_evaluate=0.0,
                           min_train_nodes=min(ARGS.per_round, m), min_available_nodes=m)
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord([np.zeros(rows.shape[1])]), num_rounds=ARGS.rounds,
                            train_config=ConfigRecord())
    strategy.stamps.append(time.perf_counter())
    answer("flower", version("flwr"), strategy.stamps, result.arrays.to_numpy_ndarrays()[0], rows, labels, ARGS.lam,
           clients=m)


if __name__ == "__main__":
    with np.load(ARGS.shards) as shards:
        supernodes = int(shards["client"].max()) + 1
    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=supernodes,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
