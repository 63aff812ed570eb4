"""The federated methods on a network in the simulator (issue 33: "on networks with the inner torch optimizer").

FedProx (local solve by the problem's inner torch optimizer) and SCAFFOLD (its corrected local steps on the
full local gradient), 2 rounds of the digits MLP on 2 simulated workers: the objective falls, and the
participants' traffic is the closed form (clients x vectors sent x parameter bytes, float32).
"""
from __future__ import annotations

import math

import pytest

from dane.experiments.config import run_spec
from dane.loop.launch import execute
from dane.records.results import read_rounds
from dane.synthetic.sweep import compose_job

HIDDEN = 16
PARAMS = 64 * HIDDEN + HIDDEN + HIDDEN * 10 + 10  # the 8x8 digits -> hidden -> 10 classes MLP's weights and biases
NET = ("problem=digits_mlp", f"problem.model.hidden=[{HIDDEN}]", "problem.inner_steps=5", "workers=2", "rounds=2",
       "tol=null", "quiet=true")


@pytest.mark.parametrize("algorithm, overrides, clients, vectors_up", [
    ("fedprox", ("algorithm.local_solver=problem", "algorithm.mu=0.01"), 2, 1),   # w_i up
    ("scaffold", ("algorithm.clients_per_round=1", "algorithm.local_steps=3", "algorithm.lr=0.1"), 1, 2),  # Δy, Δc up
])
def test_federated_methods_train_a_network_in_the_simulator(tmp_path, algorithm, overrides, clients, vectors_up):
    execute(run_spec(compose_job((f"algorithm={algorithm}", *overrides, *NET))), str(tmp_path))
    records = read_rounds(tmp_path)
    assert [r["round"] for r in records] == [0, 1, 2]
    assert all(math.isfinite(r["objective"]) for r in records)
    assert records[-1]["objective"] < records[0]["objective"]
    assert all(r["clients"] == clients for r in records)
    per_round = clients * vectors_up * PARAMS * 4  # float32 parameters
    assert [r["uplink_bytes"] for r in records] == [0, per_round, 2 * per_round]  # to reach w_t
