"""Split learning (dane.split): the invariants of docs/split_learning.md, in float64 on digits.

Sequential split training is plain minibatch SGD on the uncut network over the agents'
minibatches in turn order (the hand-over carries the optimizer state, so momentum and
Adam continue across agents); U-shaped equals labels at the server; SplitFed with one
agent equals sequential; the logged bytes per link equal the protocol's formula.
"""
from __future__ import annotations

import copy
import functools
import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector

from dane.comm import AlphaBeta
from dane.data import shard_indices
from dane.errors import ConfigError
from dane.numerics.inner import worker_seed
from dane.loop.launch import execute
from dane.models import build_model
from dane.problems.neural import DataConfig, ModelConfig, NeuralProblemConfig
from dane.loop.stopping import StopRule
from dane.loop.spec import Communication, RunControl, RunSpec
from dane.split.config import SplitConfig
from dane.split.training import SAMPLER_STREAM

HIDDEN = (32, 16)


def problem(model: str = "mlp", device: str = "cpu", **data) -> NeuralProblemConfig:
    return NeuralProblemConfig(data=DataConfig(dataset="digits", **data), model=ModelConfig(name=model, hidden=HIDDEN),
                               dtype="float64", device=device, seed=0)


def split_run(m: int, epochs: int = 2, out_dir=None, model: str = "mlp", data: dict | None = None,
              device: str = "cpu", **algorithm):
    """(records, w, summary) of ``m`` agents' split run for ``epochs`` epochs.  Without ``out_dir`` on the default
    problem and device, each config's run is made once a session (a copy): tests that spell one config two ways
    share it."""
    config = SplitConfig(**{"cut": "net.2", "batch_size": 64, **algorithm})
    if out_dir is None and model == "mlp" and not data and device == "cpu":
        return copy.deepcopy(_split_run(m, epochs, config))
    return _run_split(m, epochs, config, out_dir, model, data, device)


@functools.cache
def _split_run(m: int, epochs: int, config: SplitConfig) -> tuple:
    return _run_split(m, epochs, config, None, "mlp", None, "cpu")


def _run_split(m: int, epochs: int, config: SplitConfig, out_dir, model: str, data: dict | None,
               device: str) -> tuple:
    spec = RunSpec(problem=problem(model, device, **(data or {})), algorithm=config,
                   comm=Communication(workers=m, cost=AlphaBeta(alpha=1e-4, beta=1e8)),
                   control=RunControl(stop=StopRule(rounds=epochs, diverge_after=None), quiet=True))
    collect: dict = {}
    summary = execute(spec, out_dir, collect=collect)
    return collect["records"], collect["w"], summary


def plain_sgd(m: int, epochs: int, *, optimizer: str = "sgd", lr: float = 0.05, momentum: float = 0.0,
              batch_size: int = 64, model_name: str = "mlp", data: dict | None = None):
    """The uncut model, one torch optimizer, agent 0's minibatches then agent 1's ... each epoch; the full
    training loss at the start of every epoch and at the end, and the final weights."""
    pc = problem(model_name, **(data or {}))
    dataset = pc.dataset()
    torch.manual_seed(0)
    model = build_model(model_name, in_shape=dataset.in_shape, num_classes=dataset.num_classes, hidden=HIDDEN).double()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum) if optimizer == "sgd" else \
        torch.optim.Adam(model.parameters(), lr=lr)
    shards = shard_indices(dataset.train_y, m, seed=0)
    generators = [torch.Generator().manual_seed(worker_seed(0, a, SAMPLER_STREAM)) for a in range(m)]
    x, y = dataset.train_x.double(), dataset.train_y

    def train_loss() -> float:
        with torch.no_grad():
            return float(F.cross_entropy(model(x), y, reduction="sum")) / len(y)

    losses = []
    for _ in range(epochs):
        losses.append(train_loss())
        for a in range(m):
            for batch in torch.randperm(len(shards[a]), generator=generators[a]).split(batch_size):
                rows = shards[a][batch]
                opt.zero_grad()
                F.cross_entropy(model(x[rows]), y[rows]).backward()
                opt.step()
    losses.append(train_loss())
    return losses, parameters_to_vector(model.parameters()).detach()


def assert_same(records, w, losses, w_ref, tol=1e-12):
    assert len(records) == len(losses)
    for record, loss in zip(records, losses):
        assert abs(record["objective"] - loss) <= tol, (record["round"], record["objective"], loss)
    assert float((w - w_ref).abs().max()) <= tol


def test_one_agent_sequential_is_plain_sgd():
    records, w, summary = split_run(1, epochs=3, agent_momentum=0.9, server_momentum=0.9)
    losses, w_ref = plain_sgd(1, 3, momentum=0.9)
    assert_same(records, w, losses, w_ref)
    assert (summary["backend"], summary["time_s_clock"]) == ("simulator", "simulated")  # one agent: simulated too
    assert records[-1]["objective"] < records[0]["objective"] / 2  # and it trains


@pytest.mark.parametrize("optimizer,lr,momentum", [("sgd", 0.05, 0.9), ("adam", 0.01, 0.0)])
def test_m_agents_sequential_is_plain_sgd_in_turn_order(optimizer, lr, momentum):
    """The hand-over carries the optimizer state: momentum buffers and Adam's moments and step continue."""
    records, w, _ = split_run(3, epochs=2, agent_optimizer=optimizer, server_optimizer=optimizer, agent_lr=lr,
                              server_lr=lr, agent_momentum=momentum, server_momentum=momentum)
    losses, w_ref = plain_sgd(3, 2, optimizer=optimizer, lr=lr, momentum=momentum)
    assert_same(records, w, losses, w_ref)


def test_u_shaped_equals_labels_at_the_server():
    server_records, w_server, _ = split_run(2, agent_momentum=0.5, server_momentum=0.5)
    u_records, w_u, summary = split_run(2, labels="agent", agent_momentum=0.5, server_momentum=0.5)
    assert summary["head_params"] == 16 * 10 + 10
    assert float((w_u - w_server).abs().max()) <= 1e-12
    for a, b in zip(server_records, u_records):
        assert abs(a["objective"] - b["objective"]) <= 1e-12 and a["test_accuracy"] == b["test_accuracy"]
        if "epoch_loss" in a:
            assert abs(a["epoch_loss"] - b["epoch_loss"]) <= 1e-12


def test_splitfed_with_one_agent_equals_sequential():
    seq, w_seq, _ = split_run(1, agent_momentum=0.9, server_momentum=0.9)
    fed, w_fed, _ = split_run(1, schedule="splitfed", agent_momentum=0.9, server_momentum=0.9)
    assert [r["objective"] for r in seq] == [r["objective"] for r in fed]
    assert torch.equal(w_seq, w_fed)


def formula(m: int, n: int, width: int, part: int, state: int, schedule: str, z: int = 0, u_shaped: bool = False,
            batches: int = 0) -> dict:
    """docs/split_learning.md's bytes per epoch (float64: 8 bytes an element; labels int64), with ``part`` the
    agent's part, |bottom| (+ |head| U-shaped), and ``state`` its optimizer state's elements."""
    out = {"activations": 8 * (width + z) * n, "cut_gradients": 8 * (width + z) * n,
           "labels": 0 if u_shaped else 8 * n, "handover": 0, "averaging": 0}
    if schedule == "sequential" and m > 1:
        out["handover"] = m * 8 * (part + state)
    if schedule == "splitfed":
        out["averaging"] = 2 * m * 8 * part
    return out


@pytest.mark.parametrize("schedule,labels", [("sequential", "server"), ("splitfed", "server"), ("sequential", "agent"),
                                             ("splitfed", "agent")])
def test_logged_bytes_per_link_are_the_formula(schedule, labels):
    records, _, summary = split_run(3, epochs=2, schedule=schedule, labels=labels, agent_momentum=0.9,
                                    server_momentum=0.9)
    n, width, bottom = 1437, 32, 64 * 32 + 32
    u = labels == "agent"
    head = 16 * 10 + 10 if u else 0  # U-shaped, the agent's part is the bottom and the head: both hand over, average
    expected = formula(3, n, width, bottom + head, bottom + head, schedule, z=16 if u else 0, u_shaped=u)
    if (schedule, labels) == ("splitfed", "agent"):  # 2m(|bottom| + |head|) float64 values: 108,000 bytes
        assert expected["averaging"] == 2 * 3 * 8 * (2080 + 170) == 108000
    for record in records[1:]:
        assert {k: record[f"{k}_bytes"] for k in expected} == expected
        steps = sum(math.ceil(len(s) / 64) for s in shard_indices(problem().dataset().train_y, 3, seed=0))
        assert record["activations_messages"] == steps * (2 if u else 1)
    assert records[-1]["bytes_sent"] == 2 * sum(expected.values())
    assert summary["cut_width"] == width and summary["bottom_params"] == bottom
    assert summary["defaults"] == [] and summary["package_rules_applied"] is False  # cut=net.2 given


def test_a_cuda_device_is_refused_in_one_line_not_run_on_the_cpu():
    """The parties are host tensors (models, rows, messages, hand-overs): problem.device=cuda is refused before any
    party is built, instead of a run on the CPU that the config said would be on the GPU."""
    with pytest.raises(ConfigError) as err:
        split_run(1, epochs=1, device="cuda")
    assert str(err.value) == ("algorithm=split runs its agents and server on the CPU; set problem.device=cpu (or "
                              "auto, which means the CPU for split learning)")
    assert split_run(1, epochs=1, device="auto")[0][-1]["round"] == 1


def test_cut_null_is_the_smallest_valid_bottom_noted_as_a_default():
    _, _, summary = split_run(2, epochs=1, cut=None)
    assert summary["cut"] == "net.1" and summary["package_rules_applied"] is True  # after the first Linear (net.0: Flatten)
    assert summary["defaults"] == [{"key": "algorithm.cut", "value": "net.1", "rule": "cut_model",
                                    "stats": {"cut_share": summary["cut_share"]}}]
    assert summary["bottom_params"] == 64 * 32 + 32


def test_a_bad_cut_lists_the_valid_cuts_with_their_shares():
    with pytest.raises(ConfigError) as err:
        split_run(2, epochs=1, cut="net.9")
    message = str(err.value)
    assert "algorithm.cut=net.9" in message and "\n" not in message
    assert "net.1 (" in message and "net.4 (" in message and "net.5" not in message  # net.5 leaves the server nothing
    with pytest.raises(ConfigError, match="net.2"):  # U-shaped: the middle needs parameters too
        split_run(2, epochs=1, cut="net.4", labels="agent")
    from dane.split.cut import describe_choices  # a one-hidden-layer MLP (the digits_mlp default) has no U-shaped cut

    one_hidden = build_model("mlp", in_shape=(64,), num_classes=10, hidden=(100,))
    assert describe_choices(one_hidden) == "net.1 (86.6%), net.2 (86.6%)"
    assert describe_choices(one_hidden, u_shaped=True).startswith("none: the model has 2 learned layer(s) and a U-shaped "
                                                                  "cut needs three")


def test_simulated_time_is_the_sum_of_the_parts_when_sequential():
    records, _, _ = split_run(2, epochs=1)
    r = records[1]
    parts = r["agent_compute_s"] + r["server_compute_s"] + r["activations_s"] + r["gradients_s"] + r["handover_s"]
    assert r["time_s"] == pytest.approx(parts, rel=1e-9)
    messages = r["activations_messages"] + r["labels_messages"] + r["cut_gradients_messages"] + r["handover_messages"]
    comm = 1e-4 * messages + (r["activations_bytes"] + r["labels_bytes"] + r["cut_gradients_bytes"]
                              + r["handover_bytes"]) / 1e8
    assert r["activations_s"] + r["gradients_s"] + r["handover_s"] == pytest.approx(comm, rel=1e-9)


# -- real processes: m agents + 1 server on gloo point-to-point messages ---------------------------------------------

def launched_spec(m: int, epochs: int, backend: str, **algorithm) -> RunSpec:
    algorithm = {"cut": "net.2", "batch_size": 64, "agent_momentum": 0.9, "server_momentum": 0.9, **algorithm}
    return RunSpec(problem=problem(), algorithm=SplitConfig(**algorithm),
                   comm=Communication(backend=backend, workers=m, cost=AlphaBeta(alpha=1e-4, beta=1e8)),
                   control=RunControl(stop=StopRule(rounds=epochs, diverge_after=None), quiet=True))


def launched_rank(rank: int, size: int, port: int, algorithm: dict, results) -> None:
    """One process of a launched run (what torchrun starts), its records sent back by rank 0."""
    import os

    from dane.problems.neural import reproducible_numerics
    from dane.split.run import run_split

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    collect: dict = {}
    with reproducible_numerics():
        run_split(launched_spec(size - 1, 2, "ps", **algorithm), None, collect)
    if rank == 0:
        results.put((collect["records"], collect["w"].tolist()))  # plain data: no shared memory


@pytest.mark.slow  # 17 s: three processes import torch on a loaded 2-core machine
@pytest.mark.parametrize("schedule", ["sequential", "splitfed"])
def test_two_agents_and_a_server_as_processes_equal_the_simulator(schedule):
    """Real gloo messages between 3 processes (2 agents + the server, the last rank) make the simulator's run:
    every record's losses and accuracies to 1e-10, its bytes and messages per link exactly, the final weights."""
    import multiprocessing
    import socket

    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [context.Process(target=launched_rank, args=(r, 3, port, {"schedule": schedule}, results))
             for r in range(3)]
    for p in procs:
        p.start()
    records, w = results.get(timeout=120)
    w = torch.tensor(w, dtype=torch.float64)
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    sim_records, sim_w, _ = split_run(2, schedule=schedule, agent_momentum=0.9, server_momentum=0.9)
    assert len(records) == len(sim_records) == 3
    for real, sim in zip(records, sim_records):
        for key in ("objective", "train_accuracy", "test_loss", "test_accuracy", "epoch_loss"):
            if key in sim:
                assert abs(real[key] - sim[key]) <= 1e-10, (real["round"], key)
        counts = [k for k in sim if k.endswith("_bytes") or k.endswith("_messages")] + ["bytes_sent", "comm_rounds"]
        assert {k: real[k] for k in counts} == {k: sim[k] for k in counts}
    assert float((w - sim_w).abs().max()) <= 1e-10


class ThreadDist:
    """torch.distributed's blocking send/recv between threads of this process (one queue per sender, receiver, tag)."""

    def __init__(self):
        import collections
        import queue
        import threading

        self._lock = threading.Lock()
        self._queues = collections.defaultdict(queue.Queue)
        self.rank_of = {}

    def _queue(self, src, dst, tag):
        with self._lock:
            return self._queues[(src, dst, tag)]

    def send(self, tensor, dst, tag):
        import threading

        self._queue(self.rank_of[threading.get_ident()], dst, tag).put(tensor.clone())

    def recv(self, buf, src, tag):
        import threading

        buf.copy_(self._queue(src, self.rank_of[threading.get_ident()], tag).get(timeout=60))


@pytest.mark.parametrize("schedule,labels", [("sequential", "server"), ("splitfed", "agent")])
def test_the_launched_protocol_in_threads_equals_the_simulator(schedule, labels, tmp_path):
    """Rank 0's commands, the followers' loop, the epoch-end sync and the checkpoint parts, each rank a thread
    with its own `DistLink` over blocking queues: the simulator's records and weights, bit for bit."""
    import threading

    from dane.split.links import DistLink
    from dane.split.run import drive, meta
    from dane.split.training import SplitClock, SplitRun, build_parties, follow
    from dane.loop.checkpoint import save_checkpoint

    fake, m, out, building = ThreadDist(), 2, {}, threading.Lock()
    spec = launched_spec(m, 2, "ps", schedule=schedule, labels=labels)
    spec = RunSpec(problem=spec.problem, algorithm=spec.algorithm, comm=spec.comm,
                   control=RunControl(stop=spec.control.stop, quiet=True, checkpoint_every=1))

    def rank_main(rank):
        fake.rank_of[threading.get_ident()] = rank
        torch.set_num_threads(1)  # OpenMP's thread count is each thread's own: a new thread starts at the default
        link = DistLink(rank, fake)
        with building:  # the model is drawn from torch's global generator: one thread at a time (processes have their own)
            proto, info = build_parties(spec, {rank}, link)
        if rank == 0:
            collect = {}
            drive(spec, SplitRun(proto, info, SplitClock(m, simulated=False), link, launched=True), str(tmp_path),
                  collect)
            out.update(collect)
            return

        def save_part(round_, agents):
            save_checkpoint(str(tmp_path), rank, {"round": round_, "algorithm": {"agents": agents}}, meta(spec, rank))
            link.send_control(torch.tensor([1]), 0)

        follow(proto, link, save_part)

    from dane.problems.neural import reproducible_numerics

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(m + 1)]
    with reproducible_numerics():  # one intra-op thread, as the simulator and every launched rank have
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    sim_records, sim_w, _ = split_run(m, schedule=schedule, labels=labels, agent_momentum=0.9, server_momentum=0.9)
    # Counts exactly; values to 1e-12, not bit for bit: epoch_loss is summed per process, then across processes
    # (another order of the sum), and threads of one process may reduce in another order than the simulator's.
    for real, sim in zip(out["records"], sim_records):
        assert real.keys() == sim.keys()
        counts = [k for k in sim if k.endswith("_bytes") or k.endswith("_messages")] + ["bytes_sent", "comm_rounds"]
        assert {k: real[k] for k in counts} == {k: sim[k] for k in counts}
        for key in ("objective", "train_accuracy", "test_loss", "test_accuracy", "epoch_loss"):
            assert abs(real.get(key, 0) - sim.get(key, 0)) <= 1e-12, (real["round"], key)
    assert float((out["w"] - sim_w).abs().max()) <= 1e-12
    assert sorted(p.name for p in (tmp_path / "checkpoint" / "round2").glob("*.pt")) == ["rank0.pt", "rank1.pt"]


def test_a_lost_agent_and_resume_auto_finish_as_the_uninterrupted_run(tmp_path):
    """sim.fail_at loses agent 1 at epoch 2 of 3; the checkpoint (one part per agent, rank 0's with the server's
    state) lets the same run continue: its records and weights are the uninterrupted run's."""
    import dataclasses

    from dane.loop.faults import SimulatedFault
    from dane.records.results import read_rounds

    algorithm = SplitConfig(cut="net.2", batch_size=64, agent_optimizer="adam", server_optimizer="adam", agent_lr=0.01,
                            server_lr=0.01)
    control = RunControl(stop=StopRule(rounds=3, diverge_after=None), quiet=True, checkpoint_every=1,
                         faults=((2, 1),))
    spec = RunSpec(problem=problem(), algorithm=algorithm, comm=Communication(workers=2), control=control)
    with pytest.raises(SimulatedFault):
        execute(spec, str(tmp_path))
    assert sorted(p.name for p in (tmp_path / "checkpoint" / "round2").glob("*.pt")) == ["rank0.pt", "rank1.pt"]
    resumed = dataclasses.replace(spec, control=dataclasses.replace(control, resume=str(tmp_path)))
    collect: dict = {}
    execute(resumed, None, collect=collect)
    whole: dict = {}
    execute(dataclasses.replace(spec, control=dataclasses.replace(control, faults=(), save_iterate=True)),
            str(tmp_path / "whole"), collect=whole)
    assert torch.equal(torch.load(tmp_path / "whole" / "iterate.pt"), whole["w"])  # save_iterate: the uncut weights
    assert [r["round"] for r in read_rounds(tmp_path)] == [0, 1, 2, 3]
    assert read_rounds(tmp_path)[-1]["objective"] == whole["records"][-1]["objective"]
    assert torch.equal(collect["w"], whole["w"])
    assert collect["summary"]["bytes_by_link"] == whole["summary"]["bytes_by_link"]  # the epochs before the loss too


@pytest.mark.slow  # about 35 s: two torchrun launches of 3 processes
@pytest.mark.parametrize("killed,survivors", [(1, {"agent 0", "the split server"}), (2, {"agent 0", "agent 1"})])
def test_torchrun_a_killed_agent_or_server_is_one_line_and_resume_auto_finishes_the_run(tmp_path, killed, survivors):
    """SIGKILL of agent 1 at the start of epoch 2, while agent 0 has its turn (or of the server, rank 2), under
    torchrun's default --monitor-interval (it SIGTERMs the survivors within 0.1 s): each survivor says on stderr,
    in one line naming the lost process, that it lost a peer and how to continue, and no traceback of ours
    follows; the same command with resume=auto finishes with the simulator's records."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from dane.records.results import read_rounds

    repo = Path(__file__).resolve().parents[1]
    environment = {**os.environ, "PYTHONPATH": str(repo), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    command = ["torchrun", "--standalone", "--nproc_per_node", "3", "-m", "experiments.train",
               "comm=ps", "algorithm=split", "problem=digits_mlp", "problem.dtype=float64", "algorithm.cut=net.2",
               "algorithm.batch_size=64", "problem.model.hidden=[32,16]", "rounds=3", "checkpoint_every=1", f"out_dir={tmp_path / 'run'}"]
    proc = subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=300,
                          env={**environment, "DANE_TEST_KILL_AT_ROUND": "2", "DANE_TEST_KILL_RANK": str(killed)})
    lines = [line for line in proc.stderr.splitlines() if "lost a peer mid-run" in line]
    lost = "the split server" if killed == 2 else f"agent {killed}"
    assert proc.returncode != 0
    assert len(lines) == 2 and {line.split("error: ")[1].split(" lost")[0] for line in lines} == survivors, \
        proc.stderr[-3000:]
    assert all(f"after {lost} exited" in line or f"({lost} exited)" in line for line in lines), lines
    assert all("resume=auto" in line for line in lines)
    assert f'File "{repo / "dane"}' not in proc.stderr and "experiments/train.py" not in proc.stderr, proc.stderr[-3000:]
    proc = subprocess.run([*command, "resume=auto"], cwd=repo, capture_output=True, text=True, timeout=300,
                          env=environment)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read_rounds(tmp_path / "run")
    sim, _, _ = split_run(2, epochs=3)
    assert [r["round"] for r in records] == [0, 1, 2, 3]
    for real, simulated in zip(records, sim):
        assert abs(real["objective"] - simulated["objective"]) <= 1e-10
        assert real["bytes_sent"] == simulated["bytes_sent"]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["resumed_from_round"] == 2


@pytest.mark.parametrize("epochs,said", [(1, "after 1 epoch,"), (3, "after 3 epochs,")])
def test_the_closing_line_counts_epochs_in_words(epochs, said, capsys):
    """`torchrun ... algorithm=split ... rounds=1` closed with 'max_rounds after 1 epochs'."""
    from types import SimpleNamespace

    from dane.split.run import SplitClosingLine

    spec = SimpleNamespace(algorithm=SimpleNamespace(schedule="sequential"), problem=SimpleNamespace(name="digits_mlp"))
    loop = SimpleNamespace(spec=spec, algo=SimpleNamespace(info={"cut": "net.2"}), comm=SimpleNamespace(size=3),
                           status="max_rounds", records=[{"round": epochs, "test_accuracy": 0.5}], out_dir=None)
    SplitClosingLine().on_end(loop, {"backend": "simulator", "total_bytes": 8, "time_s": 0.25})
    assert capsys.readouterr().out == (f"split (sequential, cut net.2) on digits_mlp, 3 agent(s), simulator: max_rounds "
                                       f"{said} test accuracy 0.5000, 8 bytes sent, 0.250 s\n")
