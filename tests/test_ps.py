"""The parameter-server communicator (comm=ps), under real torchrun launches and between threads.

- the collectives through the servers are exact (the same arithmetic as the simulator's
  mean, so bit for bit), and every link's bytes and messages equal the model: each
  worker pushes and pulls exactly its slice of the message to and from each server
  (`slice_bounds`), headers, acks and broadcasts counted as the protocol sends them;
- ``torchrun --nproc_per_node 3 comm=ps`` (2 workers, 1 server) and 4 processes with
  ``comm.servers=2`` give the same rounds as the in-process simulator with workers=2 and
  ``sim.topology=ps`` (float64, 1e-10; ``bytes_sent`` exactly) for DANE, GD and ADMM, and 4 processes
  with one server for DiSCO (which broadcasts) with 3 workers, where a parameter server's
  ``bytes_sent`` is no longer a ring's;
- the reference optimum the workers solve before round 0 (problem.optimum=auto) is on no counter of the run, the
  servers' and the links' included: in this process (`Wires`, the point-to-point calls between threads) and
  under torchrun;
- bad input (servers, staleness, the launcher) is in tests/test_bad_input.py.

Run as a script under torchrun (``python tests/test_ps.py <out.jsonl> <servers>``), this file is the probe.
"""
from __future__ import annotations

import collections
import json
import queue
import sys
import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dane.comm.ps import PSCommunicator
from dane.comm.ps_protocol import HEADER, slice_bounds
from dane.comm.ps_server import ParameterServer
from dane.loop.reference import attach_one
from dane.numerics.similarity import hessian_dissimilarity
from dane.losses import SQUARED
from dane.problems.glm import LinearModelShard, to_torch
from dane.problems.optimum import attach

ROOT_OF_BROADCAST = -1  # the last worker: a root other than rank 0


def probe_inputs(m: int) -> list[list[torch.Tensor]]:
    """Every worker's tensors of the probe's allreduce: three dtypes, an odd length, a one-element group."""
    gen = torch.Generator().manual_seed(7)
    return [[torch.randn(500, generator=gen, dtype=torch.float64), torch.randn(3, 4, generator=gen, dtype=torch.float64),
             torch.randn(1, generator=gen, dtype=torch.float64), torch.randn(7, generator=gen).float(),
             torch.randn(1, generator=gen).half()] for _ in range(m)]


def probe(out: str, servers: int) -> None:
    from dane.comm import make_communicator

    comm = make_communicator("ps", servers=servers)
    if comm.is_server:
        comm.serve()
        comm.shutdown()
        return
    m, r = comm.size, comm.rank
    inputs = probe_inputs(m)
    exact = [torch.stack([x[i] for x in inputs]).sum(0) / m for i in range(len(inputs[0]))]  # the simulator's mean
    reduced = comm.allreduce_mean(inputs[r])
    comm.push([2 * t for t in inputs[r]])  # the primitives themselves: one more round
    pulled = comm.pull(inputs[r])
    root = m - 1
    (bcast,) = comm.broadcast([inputs[r][0]], root=root)
    text = comm.broadcast_object("run-dir-of-rank-0" if r == 0 else "", root=0)
    comm.barrier()
    record = {
        "rank": r, "size": m, "bytes_sent": comm.bytes_sent, "calls": comm.calls, "text": text,
        "allreduce_exact": all(torch.equal(a, b) and a.dtype == b.dtype and a.shape == b.shape
                               for a, b in zip(reduced, exact)),
        "pull_exact": all(torch.equal(a, 2 * b) for a, b in zip(pulled, exact)),
        "broadcast_exact": torch.equal(bcast, inputs[root][0]),
        **comm.summary_entries(),
    }
    comm.shutdown()
    with open(out, "a") as f:
        f.write(json.dumps(record) + "\n")


def slice_sizes(numels: list[tuple[int, int]], servers: int, j: int) -> tuple[int, int]:
    """(bytes, non-empty pieces) of server j's slices of flat buffers given as (numel, element size)."""
    pieces = [(b - a) * size for numel, size in numels for a, b in [slice_bounds(numel, servers)[j]]]
    return sum(pieces), sum(p > 0 for p in pieces)


def expected_link(worker: int, m: int, servers: int, j: int) -> dict:
    """The probe's traffic on the link between ``worker`` and server j: the protocol, message by message."""
    message, message_pieces = slice_sizes([(513, 8), (7, 4), (1, 2)], servers, j)  # f64, f32, f16 buffers
    bcast, bcast_pieces = slice_sizes([(500, 8)], servers, j)
    root = worker == m - 1
    headers = 2 * 2 + 1 + 1  # two push-pull rounds (a push and a pull header each), a broadcast, a barrier
    return {
        "to_server_bytes": 2 * message + root * bcast,
        "to_server_messages": headers + 2 * message_pieces + root * bcast_pieces,
        "to_worker_bytes": 2 * message + (not root) * bcast,
        "to_worker_messages": 2 * message_pieces + (not root) * bcast_pieces + 1,  # + the barrier's ack
        "control_bytes": headers * HEADER * 8 + 1,
    }


class Wires:
    """torch.distributed's point-to-point calls between the threads of this process, each (sender, receiver, tag) a
    first-in first-out line, as gloo matches a receive to the sends of its peer and tag in order."""

    def __init__(self, size: int):
        self.size, self.lock = size, threading.Lock()
        self.lines: dict[tuple, queue.Queue] = collections.defaultdict(queue.Queue)

    def line(self, src: int, dst: int, tag: int) -> queue.Queue:
        with self.lock:
            return self.lines[src, dst, tag]

    def end(self, rank: int) -> SimpleNamespace:
        """What `PSCommunicator` and `ParameterServer` ask of ``torch.distributed`` on rank ``rank``."""
        def isend(tensor, dst, tag):
            self.line(rank, dst, tag).put(tensor.clone())
            return SimpleNamespace(wait=lambda: None)

        def irecv(buf, src, tag):
            return SimpleNamespace(wait=lambda: buf.copy_(self.line(src, rank, tag).get(timeout=30)))

        return SimpleNamespace(get_rank=lambda: rank, get_world_size=lambda: self.size, isend=isend, irecv=irecv,
                               is_initialized=lambda: True, destroy_process_group=lambda: None)


def on_servers(workers: int, servers: int, work) -> list:
    """``work(comm)`` on ``workers`` `PSCommunicator` threads through ``servers`` `ParameterServer` threads: each
    worker's result, then each server's counters."""
    wires = Wires(workers + servers)
    out: list = [None] * (workers + servers)

    def rank(r: int) -> None:
        if r >= workers:
            out[r] = ParameterServer(wires.end(r), workers).serve()
            return
        comm = PSCommunicator(wires.end(r), workers)
        out[r] = work(comm)
        comm.shutdown()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(workers + servers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert all(result is not None for result in out)
    return out


def test_the_reference_optimums_collectives_are_on_no_count_of_the_parameter_servers(tmp_path, monkeypatch):
    """problem.optimum=auto under comm=ps: the workers' reference solve (a fingerprint, a cache look-up, Newton-CG:
    dozens of pushes and broadcasts) is on none of the run's counters, the servers' and the links' included.  After
    it, one allreduce of 3 float64 numbers: every counter says that one round, as a run without a reference would."""
    monkeypatch.setenv("DANE_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((40, 3)), rng.standard_normal(40)
    config = SimpleNamespace(optimum="auto", attach_reference=lambda problem, comm: attach(
        problem, comm, "auto", "squared|test"))

    def work(comm):
        rows = slice(comm.rank, None, comm.size)
        problem = LinearModelShard(to_torch(X[rows]), torch.from_numpy(y[rows]), SQUARED, l2=0.1, weight=2 / 40)
        attach_one(config, problem, comm)
        assert problem.f_star is not None
        comm.allreduce_mean([torch.ones(3, dtype=torch.float64)])
        return comm.calls, comm.bytes_sent, comm.summary_entries()["parameter_server"]

    (calls, sent, ps), *_, server = on_servers(2, 1, work)
    assert (calls, sent) == (1, 24)
    assert {key: server[key] for key in ("pushes", "pulls", "broadcasts", "barriers")} == \
        {"pushes": 1, "pulls": 1, "broadcasts": 0, "barriers": 0}
    one_round = {"to_server_bytes": 24, "to_server_messages": 3, "to_worker_bytes": 24, "to_worker_messages": 1,
                 "control_bytes": 2 * HEADER * 8}  # a push and a pull header, a slice each way
    assert [{k: v for k, v in link.items() if k not in ("worker", "server")} for link in server["links"]] == \
        [one_round, one_round]
    assert ps["worker_links"] == [{"worker": 0, "server": 2, **one_round}]


@pytest.mark.parametrize("counted", [False, True], ids=["similarity_summary", "default_rule"])
def test_a_dissimilarity_measurement_is_on_the_servers_counts_exactly_when_it_is_the_methods(counted):
    """similarity=true's measurement (`dane.numerics.similarity.hessian_dissimilarity`) is on no counter, the servers'
    and the links' included; a default rule's (``counted=True``, `baselines.measure`) is on every one, the worker's
    and the servers' alike: its cost, then one allreduce of 3 float64 numbers."""
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((40, 3)), rng.standard_normal(40)

    def work(comm):
        rows = slice(comm.rank, None, comm.size)
        problem = LinearModelShard(to_torch(X[rows]), torch.from_numpy(y[rows]), SQUARED, l2=0.1, weight=2 / 40)
        found = hessian_dissimilarity(problem, comm, torch.zeros(3, dtype=torch.float64), counted=counted)
        comm.allreduce_mean([torch.ones(3, dtype=torch.float64)])
        return found, comm.calls, comm.bytes_sent, comm.summary_entries()["parameter_server"]

    (found, calls, sent, _), *_, server = on_servers(2, 1, work)
    cost = (found["allreduces"], found["bytes_sent"]) if counted else (0, 0)
    assert found["allreduces"] == 2 and (calls, sent) == (1 + cost[0], 24 + cost[1])  # exact method: two allreduces
    assert (server["pushes"], server["pulls"]) == (1 + cost[0], 1 + cost[0])
    assert sum(link["to_server_bytes"] for link in server["links"]) == 2 * (24 + cost[1])


def test_the_final_evaluation_is_on_the_servers_counts_and_in_no_record():
    """docs/parameter_server.md: GD (a given lr: no measurement before round 0) for 2 rounds on 2 workers through one
    server, each allreduce 3 gradient entries and 2 metrics (objective, suboptimality), 40 bytes.  The records count
    the 2 rounds (``total_bytes`` 80, 2 allreduces, 2 passes on each of the 2 clients); the final evaluation of w_2
    after them, one more push and pull of 40 bytes and a pass on each client, is on the server's and the links'
    counts alone."""
    from dane.baselines import GDConfig
    from dane.loop.callbacks import worker_callbacks
    from dane.loop.driver import Loop, drive
    from dane.loop.spec import Communication, RunControl, RunSpec
    from dane.loop.stopping import StopRule
    from dane.problems import RidgeSyntheticConfig

    spec = RunSpec(problem=RidgeSyntheticConfig(n_samples=40, dim=3), algorithm=GDConfig(lr=0.1),
                   comm=Communication(backend="ps", workers=2), control=RunControl(stop=StopRule(rounds=2), quiet=True))
    spec.problem.prepare()

    def work(comm):
        problem = spec.problem.build(comm.rank, comm.size, torch.float64)
        loop = Loop(spec, spec.algorithm.build(problem, comm), comm, None, problem)
        return drive(loop, worker_callbacks(spec, loop))

    summary, _, server = on_servers(2, 1, work)
    message = 8 * (3 + 2)
    assert (summary["rounds"], summary["total_bytes"], summary["comm_rounds"]) == (2, 2 * message, 2)
    assert (summary["local_work"]["local_passes"], summary["local_work"]["local_passes_max"]) == (4, 2)
    assert (server["pushes"], server["pulls"]) == (3, 3)  # the 2 rounds' allreduces and the final evaluation
    assert [link["to_server_bytes"] for link in server["links"]] == [summary["total_bytes"] + message] * 2
    assert summary["parameter_server"]["server"][0]["pushes"] == 3  # what the summary says of the servers


def test_slices_cover_the_buffer_in_order():
    for numel in (0, 1, 7, 513):
        for servers in (1, 2, 3, 5):
            bounds = slice_bounds(numel, servers)
            assert bounds[0][0] == 0 and bounds[-1][1] == numel
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
            assert [b - a for a, b in bounds] == [t.numel() for t in torch.arange(numel).tensor_split(servers)]


@pytest.mark.parametrize("servers,processes", [(1, 3), (2, 4)], ids=["1server_2workers", "2servers_2workers"])
@pytest.mark.slow
def test_collectives_are_exact_and_every_link_is_counted(servers, processes, tmp_path):
    from helpers import REPO, env, torchrun
    import subprocess

    out = tmp_path / "probe.jsonl"
    proc = subprocess.run([*torchrun(processes), sys.executable, str(REPO / "tests" / "test_ps.py"), str(out),
                           str(servers)], cwd=REPO, env=env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = sorted((json.loads(line) for line in out.read_text().splitlines()), key=lambda r: r["rank"])
    m = processes - servers
    assert [r["rank"] for r in records] == list(range(m))  # only the workers run the program; the servers serve
    nbytes = 513 * 8 + 7 * 4 + 2
    for r in records:
        assert r["size"] == m and r["allreduce_exact"] and r["pull_exact"] and r["broadcast_exact"]
        assert r["text"] == "run-dir-of-rank-0"
        assert r["calls"] == 3  # two push-pull rounds and a broadcast; the barrier and the object are not rounds
        assert r["bytes_sent"] == 2 * nbytes + (r["rank"] == m - 1) * 500 * 8
        ps = r["parameter_server"]
        assert ps["server_ranks"] == list(range(m, processes)) and ps["workers"] == m and ps["servers"] == servers
        for link in ps["links"]:  # as the servers counted them
            expected = expected_link(link["worker"], m, servers, link["server"] - m)
            assert {k: link[k] for k in expected} == expected, link
        mine = [link for link in ps["links"] if link["worker"] == r["rank"]]
        assert ps["worker_links"] == mine  # the worker's end counted the same
        assert sum(link["to_server_bytes"] for link in mine) == r["bytes_sent"]
        for server in ps["server"]:
            assert (server["pushes"], server["pulls"], server["broadcasts"], server["barriers"]) == (2, 2, 1, 1)
            assert 0 <= server["reduce_s"] <= server["busy_s"] <= server["uptime_s"]
            assert server["busy_s"] + server["wait_s"] <= server["uptime_s"]


SMALL = ["problem=ridge_synthetic", "problem.n_samples=4000", "problem.dim=100", "problem.covariance=decay", "rounds=6",
         "quiet=true", "save_iterate=true"]
RUNS = {  # id: (algorithm overrides, servers, processes)
    "dane": (["algorithm=dane"], 1, 3),
    "dane_2servers": (["algorithm=dane"], 2, 4),
    "gd": (["algorithm=gd"], 1, 3),
    "admm": (["algorithm=admm"], 1, 3),
    "disco": (["algorithm=disco"], 1, 4),  # 3 workers, a broadcast from worker 0 every PCG step
}
SLOW = ("gd", "admm", "disco")  # the same path as DANE's; about 30 s each here


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    """The in-process simulator's run with ``workers`` and ``sim.topology=ps``, once per algorithm and m."""
    from helpers import simulated_run

    runs = {}

    def get(algorithm: list[str], workers: int):
        key = (tuple(algorithm), workers)
        if key not in runs:
            runs[key] = simulated_run(tmp_path_factory.mktemp("sim"), *algorithm, *SMALL, "sim.topology=ps",
                                      workers=workers)
        return runs[key]

    return get


@pytest.mark.parametrize("run", [pytest.param(k, marks=[pytest.mark.slow] if k in SLOW else []) for k in RUNS])
@pytest.mark.slow
def test_torchrun_ps_iterates_equal_the_simulator(run, simulated, tmp_path):
    """2 workers (DiSCO: 3) through 1 or 2 servers: round for round the objective, suboptimality and cost of the
    simulator's ``sim.topology=ps``, whose workers count what a parameter server's worker sends."""
    from dane.records.results import read_rounds, read_summary
    from dane.work import KEYS
    from helpers import REPO, torchrun, train

    algorithm, servers, processes = RUNS[run]
    m = processes - servers
    proc = train(*algorithm, *SMALL, "comm=ps", f"comm.servers={servers}", f"out_dir={tmp_path}",
                 launcher=torchrun(processes))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sim_dir = simulated(algorithm, m)
    real, sim = read_rounds(tmp_path), read_rounds(sim_dir)
    assert len(real) == len(sim) == 7
    for a, b in zip(real, sim):
        assert a["round"] == b["round"] and a["comm_rounds"] == b["comm_rounds"]
        assert a["bytes_sent"] == b["bytes_sent"]  # what a worker sends: the message, = the ring's 2(m-1)/m at m=2 only
        assert {key: a[key] for key in KEYS} == {key: b[key] for key in KEYS}  # local work, by the servers' MEAN
        assert abs(a["objective"] - b["objective"]) <= 1e-10 * abs(b["objective"])
        assert abs(a["suboptimality"] - b["suboptimality"]) <= 1e-10 * max(1e-300, abs(b["suboptimality"])) + 1e-16
    torch.testing.assert_close(torch.load(tmp_path / "iterate.pt"), torch.load(sim_dir / "iterate.pt"), rtol=0, atol=1e-10)
    summary = read_summary(tmp_path)
    assert summary["backend"] == "ps" and summary["workers"] == m
    ps = summary["parameter_server"]
    assert ps["server_ranks"] == list(range(m, processes)) and ps["since_round"] == 0
    assert ps["worker_links"] == [link for link in ps["links"] if link["worker"] == 0]  # both ends counted alike
    for server in ps["server"]:
        assert server["pulls"] == server["pushes"] >= summary["comm_rounds"] - server["broadcasts"]
        assert 0 < server["busy_s"] <= server["uptime_s"]
    per_worker = [sum(link["to_server_bytes"] for link in ps["links"] if link["worker"] == w) for w in range(m)]
    assert per_worker[0] >= summary["total_bytes"]  # and what follows the last record: the final evaluation
    if ps["server"][0]["broadcasts"] == 0:
        assert per_worker == [per_worker[0]] * m
        for link in ps["links"]:
            assert link["to_worker_bytes"] == link["to_server_bytes"]  # each worker pulls what it pushed
    if servers == 2:  # each server holds half of every buffer: at most one element (8 bytes) more per push
        halves = [link["to_server_bytes"] for link in ps["links"] if link["worker"] == 0]
        assert 0 <= halves[0] - halves[1] <= 8 * ps["server"][0]["pushes"] and halves[1] > 0
    assert not (REPO / "outputs").exists()


@pytest.mark.slow
def test_a_launched_runs_reference_optimum_is_on_no_count_of_the_parameter_servers(tmp_path):
    """torchrun, 2 workers and a server, DANE on logreg with problem.optimum=auto solved by the workers (a cache of
    its own): the servers count the run's rounds alone, as without a reference (Newton-CG's hundreds of pushes and
    broadcasts were theirs)."""
    from dane.records.results import read_summary
    from helpers import torchrun, train

    proc = train("algorithm=dane", "problem=logreg", "problem.optimum=auto", "comm=ps", "comm.servers=1", "rounds=2",
                 "quiet=true", f"out_dir={tmp_path / 'run'}", launcher=torchrun(3),
                 extra_env={"DANE_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = read_summary(tmp_path / "run")
    assert any(note.startswith("reference optimum from distributed Newton-CG") for note in summary["notes"])
    (server,) = summary["parameter_server"]["server"]
    # 2 rounds of 2 allreduces and the final evaluation; the barrier before round 0
    assert (server["pushes"], server["pulls"], server["broadcasts"], server["barriers"]) == (5, 5, 0, 1)
    message = 8 * (31 + 2)  # the final evaluation's: the gradient (30 features and the intercept), O and O - O*
    assert [link["to_server_bytes"] for link in summary["parameter_server"]["links"]] == \
        [summary["total_bytes"] + message] * 2


if __name__ == "__main__":
    probe(sys.argv[1], int(sys.argv[2]))
