"""The in-process simulator (dane.comm.ThreadGroup) against a real horovodrun run and its cost model.

- a real ``horovodrun -np 2 --gloo`` run and the simulator at m=2 produce the same
  iterates (float64, 1e-10), round by round and at the end;
- the simulated clock is the sum over collective phases of max_i(slowdown_i * compute_i)
  plus the α-β cost of each allreduce (fake compute of known CPU seconds);
- stragglers slow the simulated time by the expected factor, and seeded delays add
  exactly the drawn maxima;
- the calibration fit recovers α and β from exact model times, and fits the mean time per call;
- with ``sim.topology=ps`` the clock adds the parameter-server cost instead, whose serial
  part makes a round grow linearly with m where the ring's stays flat.
"""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from dane.errors import ConfigError
from dane.comm import AlphaBeta, ParameterServerCost, Stragglers, ThreadGroup
from dane.comm.meters import ThreadCPUTime, start_up
from dane.comm.threads import DeviceTurns, meter_for
from dane.loop.launch import execute
from dane.numerics import jit
from dane.records.results import read_rounds, read_summary
from dane.run_config import DEFAULT_CALIBRATION, cost_model
from dane.experiments.config import run_spec
import dane.synthetic.calibrate as calibrate_module
from dane.synthetic.calibrate import fit_alpha_beta, fit_parameter_server, relative_errors
from dane.synthetic.launchers import have_horovod, horovodrun
from dane.synthetic.sweep import compose_job
from test_batched import FixedMeter

SMALL = ["problem.n_samples=600", "problem.dim=20", "rounds=8", "tol=null", "tol_abs=null"]  # 8 rounds whatever the stop rule


def burn(seconds: float) -> None:
    """Spend ``seconds`` of this thread's CPU time."""
    t0 = time.thread_time()
    while time.thread_time() - t0 < seconds:
        pass


def run_phases(group: ThreadGroup, compute: list[list[float]], nbytes: int) -> None:
    """Worker r burns compute[k][r] CPU seconds, then joins allreduce k (a float64 tensor of ``nbytes``)."""
    def worker(comm):
        for phase in compute:
            burn(phase[comm.rank])
            comm.allreduce_mean([torch.zeros(nbytes // 8, dtype=torch.float64)])
    group.run(worker)


def test_clock_is_max_compute_plus_alpha_beta_cost():
    cost = AlphaBeta(alpha=0.01, beta=1e6)
    slowdown = (1.0, 3.0, 1.0)
    compute = [[0.02, 0.01, 0.005], [0.004, 0.002, 0.03], [0.01, 0.01, 0.01]]
    group = ThreadGroup(3, cost, Stragglers(slowdown=slowdown))
    run_phases(group, compute, nbytes=8000)
    comm_per_call = 2 * 2 / 3 * 8000 / 1e6 + 2 * 2 * 0.01  # 2(m-1)/m n/β + 2(m-1)α
    assert cost.allreduce_time(8000, 3) == pytest.approx(comm_per_call, rel=1e-12)
    assert group.comm_time == pytest.approx(3 * comm_per_call, rel=1e-12)
    expected_compute = sum(max(f * c for f, c in zip(slowdown, phase)) for phase in compute)  # 0.03 + 0.03 + 0.03
    assert expected_compute == pytest.approx(0.09)
    assert group.compute_time == pytest.approx(expected_compute, abs=3 * 3e-3)
    assert group.clock == pytest.approx(group.compute_time + group.comm_time, rel=1e-12)


def test_a_broadcast_is_charged_a_binomial_tree_and_a_string_nothing():
    """A broadcast of n bytes over m workers costs ⌈log₂ m⌉(α + n/β) (DiSCO's preconditioned vector each PCG step, local
    SGD's elected model); `broadcast_object`'s run directory is not the method's traffic and costs nothing."""
    cost = AlphaBeta(alpha=0.01, beta=1e6)
    group = ThreadGroup(5, cost)

    def worker(comm):
        comm.broadcast_object("run dir")
        comm.broadcast([torch.zeros(1000, dtype=torch.float64)], root=2)

    group.run(worker)
    assert cost.broadcast_time(8000, 5) == pytest.approx(3 * (0.01 + 8000 / 1e6), rel=1e-15)  # ⌈log₂ 5⌉ = 3
    assert group.comm_time == pytest.approx(3 * (0.01 + 8000 / 1e6), rel=1e-12)
    assert cost.broadcast_time(8000, 1) == 0.0
    assert ParameterServerCost(alpha=0.01, beta=1e6, servers=2).broadcast_time(8000, 5) == \
        pytest.approx(5 * (0.01 + 4000 / 1e6), rel=1e-15)  # the root's push, then 4 pulls, a slice per server


class FakeDevice:
    """A GPU's queue for `DeviceTurns`: counts drains and checks that no two workers compute at once."""

    def __init__(self):
        self.drains, self.inside, self.most_inside = 0, 0, 0

    def synchronize(self) -> None:
        self.drains += 1


def test_workers_on_a_gpu_take_turns_timed_by_the_wall_clock(monkeypatch):
    """`DeviceTurns`: each worker's compute is the wall time of its own turn, however the turns are ordered.

    The GPU's work is a step of the wall clock the meter reads, taken inside the turn (a sleep timed it before, and a
    loaded machine's scheduling then added up to 0.1 s to a 0.11 s sum); on the CPU meter it is a sleep, which, like
    waiting on GPU kernels, costs no CPU time.
    """
    import types

    from dane.comm import meters

    device = FakeDevice()
    naps = [[0.03, 0.06, 0.01], [0.05, 0.02, 0.04]]  # phase k, worker r: seconds of "GPU work"
    wall = [1000.0]
    clock = types.SimpleNamespace(perf_counter=lambda: wall[0], thread_time=time.thread_time)

    def worker(comm, pause):
        for phase in naps:
            device.inside += 1
            device.most_inside = max(device.most_inside, device.inside)
            pause(phase[comm.rank])
            device.inside -= 1
            comm.allreduce_mean([torch.zeros(1, dtype=torch.float64)])

    def gpu_work(seconds: float) -> None:
        wall[0] += seconds

    gpu = ThreadGroup(3, AlphaBeta(alpha=0.0, beta=1e30), meter=DeviceTurns(device.synchronize))
    with monkeypatch.context() as patched:
        patched.setattr(meters, "time", clock)
        gpu.run(lambda comm: worker(comm, gpu_work))
    assert device.most_inside == 1  # the turns never overlap
    assert device.drains == 2 * 3 * (len(naps) + 1)  # at both ends of every turn, the last (after the final collective) too
    assert gpu.compute_time == pytest.approx(0.11, abs=1e-12)  # max(0.03, 0.06, 0.01) + max(0.05, 0.02, 0.04)
    cpu = ThreadGroup(3, AlphaBeta(alpha=0.0, beta=1e30))
    cpu.run(lambda comm: worker(comm, time.sleep))
    assert cpu.compute_time < 0.01  # why a GPU needs its own meter: waiting costs no CPU time
    assert meter_for(["cpu", torch.device("cpu")]).name == "thread_cpu_time"


def test_start_up_is_left_out_of_a_workers_compute():
    """`dane.comm.meters.start_up` (numba compiling or loading a kernel): not the worker's compute, nested blocks
    once (numba's compiler lock is re-entrant), and the meter says how much it left out."""
    group = ThreadGroup(2, AlphaBeta(alpha=0.0, beta=1e30))

    def worker(comm):
        if comm.rank == 1:
            with start_up():
                burn(0.05)
                with start_up():
                    burn(0.02)
        burn(0.01)
        comm.allreduce_mean([torch.zeros(1, dtype=torch.float64)])

    group.run(worker)
    assert group.compute_time == pytest.approx(0.01, abs=3e-3)  # without the block: 0.08
    assert group.meter.start_up_left_out() == pytest.approx(0.07, abs=3e-3)


def test_numba_compiles_are_start_up():
    """Kernels take numba from `dane.numerics.jit`: a compile at a dispatcher's first call is start-up."""
    numba = jit.numba()
    meter = ThreadCPUTime()
    mark = meter.start()
    increment = numba.njit(lambda x: x + 1)  # a fresh dispatcher: compiled at its first call
    assert increment(1) == 2
    compiled = meter.start_up_left_out()
    assert compiled > 0 and meter.read(mark) < 0.2 * compiled


@pytest.mark.parametrize("slots", [1, 2])
def test_cpu_workers_compute_at_most_slots_at_once_and_are_timed_alike(slots):
    """`ThreadGroup`'s slots: at most ``slots`` of 6 workers are between two collectives at once (the others
    sleep, so m threads do not all fight for the GIL), and with one slot the clock still charges each phase its
    slowest worker's CPU time: waiting for a slot is not compute."""
    inside, most = [0], [0]
    burns = [[0.004, 0.012, 0.002, 0.006, 0.008, 0.01], [0.01, 0.002, 0.004, 0.012, 0.006, 0.008]]

    def worker(comm):
        for phase in burns:
            inside[0] += 1  # under the GIL: a plain counter is exact
            deadline = time.monotonic() + 1.0
            while inside[0] < slots and time.monotonic() < deadline:  # let every slot fill before anyone leaves
                time.sleep(1e-3)
            most[0] = max(most[0], inside[0])
            burn(phase[comm.rank])
            inside[0] -= 1
            comm.allreduce_mean([torch.zeros(1, dtype=torch.float64)])

    group = ThreadGroup(6, AlphaBeta(alpha=0.0, beta=1e30), slots=slots)
    group.run(worker)
    assert most[0] == slots  # all 6 would be inside at once without the slots
    if slots == 1:  # one worker at a time: the clock is exactly the slowest worker's burn in each phase
        assert group.compute_time == pytest.approx(0.012 + 0.012, abs=2 * 3e-3)
    # (two workers burning at once share the GIL, and each thread's CPU time then carries its part of the
    # hand-offs: a property of the per-worker simulator with or without slots, not of the slots)
    assert ThreadGroup(2).slots == (os.cpu_count() or 1)  # by default, the machine's cores


def test_no_worker_computes_before_every_worker_thread_has_started():
    """`ThreadGroup.run` holds every slot while it starts the m threads: the first worker to compute finds all m
    started (a start otherwise waits for computing workers to hand over the interpreter's lock), and the
    results come back in rank order."""
    import threading

    seen = []

    def worker(comm):
        seen.append(sum(t.name.startswith("worker-") for t in threading.enumerate()))
        (mean,) = comm.allreduce_mean([torch.tensor([float(comm.rank)], dtype=torch.float64)])
        return comm.rank, float(mean)

    results = ThreadGroup(24, AlphaBeta(alpha=0.0, beta=1e30), slots=2).run(worker)
    assert seen[0] == 24 and len(seen) == 24
    assert results == [(rank, 11.5) for rank in range(24)]  # mean of 0..23


def test_the_process_start_is_read_once():
    """`boot_clock_start` reads /proc/self/stat once a process (a read sums over the process's threads, and each
    of m simulated workers asks at its end): later calls give the same value."""
    from dane.loop.timeline import boot_clock_start

    first = boot_clock_start()
    if first is None:
        pytest.skip("no /proc or boot clock here")
    assert boot_clock_start() == first and abs(first - time.time()) < 7 * 24 * 3600


def test_stragglers_slow_time_by_their_factor():
    compute = [[0.01, 0.01]] * 4
    plain = ThreadGroup(2, AlphaBeta(alpha=0.0, beta=1e30))
    slow = ThreadGroup(2, AlphaBeta(alpha=0.0, beta=1e30), Stragglers(slowdown=(1.0, 4.0)))
    run_phases(plain, compute, nbytes=8)
    run_phases(slow, compute, nbytes=8)
    assert plain.clock == pytest.approx(0.04, abs=4e-3)
    assert slow.clock / plain.clock == pytest.approx(4.0, rel=0.1)


def test_a_workers_elapsed_time_slows_its_open_phase_by_its_factor():
    """`ThreadCommunicator.elapsed` = the group's clock + slowdown(rank) x the compute of the open phase (a meter
    reading 0.5 s): 2 + 0.5 on the plain rank, 2 + 3 x 0.5 on the straggler."""
    group = ThreadGroup(2, AlphaBeta(), Stragglers(slowdown=(1.0, 3.0)), FixedMeter(0.5))
    group.clock = 2.0
    comms = group.communicators()
    for comm in comms:
        comm.begin()
    assert [comm.elapsed() for comm in comms] == [2.5, 3.5]


def test_seeded_delays_add_the_drawn_maxima():
    m, phases, mean = 4, 200, 1e-3
    # the workers' compute read as 0 (a fixed meter): the clock is the delays alone, exactly (a CPU-time meter adds
    # each phase's real compute, which a loaded machine stretched past any bound a test could set)
    group = ThreadGroup(m, AlphaBeta(alpha=0.0, beta=1e30), Stragglers(delay_mean=mean, seed=7), FixedMeter(0.0))
    run_phases(group, [[0.0] * m] * phases, nbytes=8)
    rng = np.random.default_rng(7)
    drawn = sum(rng.exponential(mean, m).max() for _ in range(phases))
    assert group.clock == pytest.approx(drawn, rel=1e-12)
    harmonic = sum(1 / k for k in range(1, m + 1))  # E[max of m exponentials] = mean * H_m
    assert drawn == pytest.approx(phases * mean * harmonic, rel=0.15)


def test_straggler_config_reaches_the_simulator():
    spec = run_spec(compose_job(("workers=2", "sim.slowdown=[1.0,4.0]", "sim.delay_mean=0.001", "sim.alpha=0.002")))
    assert spec.comm.simulated and spec.comm.workers == 2
    assert [spec.comm.stragglers.factor(r) for r in range(3)] == [1.0, 4.0, 1.0]
    assert spec.comm.stragglers.delay_mean == 0.001 and spec.comm.cost.alpha == 0.002


def test_simulated_run_time_is_the_group_clock(tmp_path):
    spec = run_spec(compose_job(("workers=2", *SMALL, "sim.alpha=0.001", "sim.beta=1e8")))
    summary = execute(spec, str(tmp_path))
    records = read_rounds(tmp_path)
    # 8 DANE rounds of 2 allreduces ([grad, metrics], [w]) and the final evaluation: 17 calls
    # DANE's first allreduce carries the gradient, 2 metrics and the safeguard's spread scalar
    nbytes = [8 * (20 + 3), 8 * 20] * 8 + [8 * (20 + 2)]
    assert summary["comm_rounds"] == 16  # what it took to produce the last iterate
    assert summary["simulated_comm_s"] == pytest.approx(sum(spec.comm.cost.allreduce_time(n, 2) for n in nbytes), rel=1e-12)
    assert records[-1]["time_s"] <= summary["simulated_time_s"] <= records[-1]["time_s"] + 0.05
    assert summary["setup_s"] > 0
    assert summary["simulated_compute_clock"] == "thread_cpu_time"  # a convex problem is on the CPU


def test_only_the_default_calibration_files_may_be_missing(tmp_path, monkeypatch):
    """conf/config.yaml's sim.calibration and sim.ps_calibration (`DEFAULT_CALIBRATION`) fall back to the package's
    costs where the file is not there; a file the user named that is not there is refused (tests/test_bad_input.py)."""
    monkeypatch.chdir(tmp_path)  # no results/ here
    cfg = compose_job(("workers=2",))
    assert {key: cfg.sim[key] for key in DEFAULT_CALIBRATION} == {k: v[0] for k, v in DEFAULT_CALIBRATION.items()}
    assert cost_model(cfg.sim) == AlphaBeta() and cost_model(compose_job(("sim.topology=ps",)).sim) == \
        ParameterServerCost()
    cfg.sim.calibration = str(tmp_path / "calibration.json")
    with pytest.raises(ConfigError, match=f"sim.calibration={tmp_path}/calibration.json: no such file; make it with "
                                          f"`dane calibrate --out {tmp_path}/calibration.json`"):
        cost_model(cfg.sim)


def test_parameter_server_cost_is_push_sum_pull_per_server_slice():
    cost = ParameterServerCost(alpha=1e-4, beta=1e9, gamma=4e9, servers=4)
    n, m = 8_000_000, 8
    # each server's slice is 2 MB: 8 pushes and 8 pulls of it at 1 GB/s, 8 sums of it at 4 GB/s, 16 latencies
    assert cost.allreduce_time(n, m) == pytest.approx(16 * (1e-4 + 2e6 / 1e9) + 8 * 2e6 / 4e9, rel=1e-12)
    one_server = ParameterServerCost(alpha=1e-4, beta=1e9, gamma=4e9, servers=1)
    ring_bandwidth = AlphaBeta(alpha=0.0, beta=1e9)
    # the server's serial part: from m=8 to m=64 every PS term grows 8x; the ring's bandwidth
    # term only goes from 2(7/8) to 2(63/64) of n/β (its latency term, 2(m-1)α, grows too)
    assert one_server.allreduce_time(n, 64) / one_server.allreduce_time(n, 8) == pytest.approx(8.0, rel=1e-12)
    assert ring_bandwidth.allreduce_time(n, 64) / ring_bandwidth.allreduce_time(n, 8) == pytest.approx(63 / 56)
    with pytest.raises(ConfigError, match="sim.servers"):
        ParameterServerCost(servers=0)


def test_simulated_parameter_server_run_is_charged_the_ps_cost(tmp_path):
    spec = run_spec(compose_job(("workers=4", *SMALL, "sim.topology=ps", "sim.servers=2", "sim.alpha=0.001",
                                 "sim.beta=1e8", "sim.gamma=1e9")))
    assert spec.comm.cost == ParameterServerCost(alpha=0.001, beta=1e8, gamma=1e9, servers=2)
    summary = execute(spec, str(tmp_path))
    nbytes = [8 * (20 + 3), 8 * 20] * 8 + [8 * (20 + 2)]  # as in the ring test above
    assert summary["simulated_comm_s"] == pytest.approx(sum(spec.comm.cost.allreduce_time(n, 4) for n in nbytes), rel=1e-12)
    assert (summary["topology"], summary["servers"], summary["gamma"]) == ("ps", 2, 1e9)
    ring = execute(run_spec(compose_job(("workers=4", *SMALL, "sim.alpha=0.001", "sim.beta=1e8"))),
                   str(tmp_path / "ring"))
    assert [r["objective"] for r in read_rounds(tmp_path)] == [r["objective"] for r in read_rounds(tmp_path / "ring")]
    assert "topology" not in ring  # the ring's summary is as before: alpha and beta


TOPOLOGIES = {"ring": AlphaBeta(), "ps": ParameterServerCost(servers=2)}


@pytest.mark.parametrize("topology", list(TOPOLOGIES))
def test_a_simulated_worker_counts_what_its_topology_sends(topology):
    """``bytes_sent`` at m = 3, on the per-worker and the batched path: in a ring a worker sends 2(m−1)/m of each
    allreduce's n bytes (floored) and a broadcast's root (m−1) times its payload; through parameter servers
    (``sim.topology=ps``) a worker sends its whole message per allreduce and the root its payload once, as a
    launched ``comm=ps`` worker counts them (`dane.comm.ps.PSCommunicator`)."""
    from dane.comm.batched import BatchedGroup, run_batched

    cost, m = TOPOLOGIES[topology], 3
    message = 600 * 8 + 3 * 4  # a float64 600-vector and a float32 3-vector in one grouped allreduce
    block = m * 2 * 8 + 5 * 8  # a gather of 2 float64 values a worker: the (m, 2) one-hot block and a 5-vector ride
    payload = 50 * 8
    sent = {"ring": lambda n: 2 * (m - 1) * n // m, "ps": lambda n: n}[topology]
    root_sends = {"ring": (m - 1) * payload, "ps": payload}[topology]
    assert (sent(message), sent(block)) == {"ring": (6416, 117), "ps": (4812, 88)}[topology]

    def worker(comm):
        comm.allreduce_mean([torch.zeros(600, dtype=torch.float64), torch.zeros(3, dtype=torch.float32)])
        comm.gather(torch.zeros(2, dtype=torch.float64), [torch.zeros(5, dtype=torch.float64)])
        comm.broadcast([torch.zeros(50, dtype=torch.float64)], root=1)
        return comm.bytes_sent, comm.calls

    expected = [(sent(message) + sent(block) + (rank == 1) * root_sends, 3) for rank in range(m)]
    assert ThreadGroup(m, cost).run(worker) == expected

    def stacked(comm):
        comm.allreduce_mean([torch.zeros(m, 600, dtype=torch.float64), torch.zeros(m, 3, dtype=torch.float32)])
        comm.gather(torch.zeros(m, 2, dtype=torch.float64), [torch.zeros(m, 5, dtype=torch.float64)])
        comm.broadcast([torch.zeros(m, 50, dtype=torch.float64)], root=0)
        return comm.bytes_sent, comm.calls

    assert run_batched(BatchedGroup(m, cost), stacked) == (sent(message) + sent(block) + root_sends, 3)  # rank 0's


def test_calibration_fit_recovers_alpha_beta():
    truth = AlphaBeta(alpha=1.5e-4, beta=2.5e8)
    sizes = [8, 64, 512, 4096, 32768, 262144, 1048576, 4194304]
    times = [truth.allreduce_time(n, 2) for n in sizes]
    fitted = fit_alpha_beta(sizes, times, 2)
    assert fitted.alpha == pytest.approx(truth.alpha, rel=1e-9)
    assert fitted.beta == pytest.approx(truth.beta, rel=1e-9)
    assert max(map(abs, relative_errors(fitted, sizes, times, 2))) < 1e-9
    noisy = [t * (1 + 0.05 * (-1) ** k) for k, t in enumerate(times)]
    rough = fit_alpha_beta(sizes, noisy, 2)  # ±5% noise moves the fit by about as much
    assert rough.alpha == pytest.approx(truth.alpha, rel=0.1) and rough.beta == pytest.approx(truth.beta, rel=0.1)


def test_calibration_fits_the_mean_time_per_call(monkeypatch, tmp_path):
    # gloo's calls are heavy-tailed here and a run pays the mean (synthetic/calibrate.py): the timing
    # worker's means must give alpha-beta, its medians (half the means here) only ride along.
    truth = AlphaBeta(alpha=6e-4, beta=1e9)
    sizes = [8, 4096, 1048576]

    def timing_worker(module, args, np, env):  # what synthetic.allreduce_timing writes, from the exact model
        times = {str(n): truth.allreduce_time(n, np) for n in sizes}
        Path(args[args.index("--out") + 1]).write_text(json.dumps(
            {"sizes": {n: {"mean_s": t, "median_s": t / 2} for n, t in times.items()}}))

    monkeypatch.setattr(calibrate_module, "have_horovod", lambda: True)
    monkeypatch.setattr(calibrate_module, "horovodrun", timing_worker)
    result = calibrate_module.calibrate(2, sizes=sizes)
    assert result["alpha"] == pytest.approx(truth.alpha, rel=1e-9)
    assert result["beta"] == pytest.approx(truth.beta, rel=1e-9)
    assert result["median_s"] == pytest.approx([m / 2 for m in result["mean_s"]], rel=1e-12)


def test_parameter_server_fit_recovers_alpha_beta_given_gamma():
    truth = ParameterServerCost(alpha=2e-4, beta=5e8, gamma=1e9, servers=2)
    sizes = [8, 64, 512, 4096, 32768, 262144, 1048576, 4194304]
    times = [truth.allreduce_time(n, 3) for n in sizes]
    fitted = fit_parameter_server(sizes, times, 3, 2, gamma=truth.gamma)
    assert fitted.alpha == pytest.approx(truth.alpha, rel=1e-9) and fitted.beta == pytest.approx(truth.beta, rel=1e-9)
    assert fitted.servers == 2 and fitted.gamma == truth.gamma
    # a summing rate that explains the whole slope leaves no finite link bandwidth to fit
    assert fit_parameter_server(sizes, times, 3, 2, gamma=truth.gamma / 100).beta == 1e15


@pytest.mark.slow  # 9 s; tests/test_launchers.py's horovodrun case checks the same iterates in the fast suite
@pytest.mark.skipif(not have_horovod(), reason="horovod.torch is not importable (make setup builds it)")
def test_horovodrun_iterates_equal_simulator(tmp_path):
    overrides = [*SMALL, "algorithm=dane", "save_iterate=true"]
    real = tmp_path / "real"
    horovodrun("experiments.train", [*overrides, f"out_dir={real}", f"hydra.run.dir={tmp_path / 'hydra'}"],
               timeout=300)
    sim = tmp_path / "sim"
    execute(run_spec(compose_job(("workers=2", *overrides))), str(sim))
    assert read_summary(real)["backend"] == "horovod" and read_summary(sim)["backend"] == "simulator"
    real_rounds, sim_rounds = read_rounds(real), read_rounds(sim)
    assert len(real_rounds) == len(sim_rounds) == 9
    for a, b in zip(real_rounds, sim_rounds):
        assert a["round"] == b["round"] and a["comm_rounds"] == b["comm_rounds"] and a["bytes_sent"] == b["bytes_sent"]
        assert a.keys() == b.keys()
        for key in ("objective", "suboptimality", "grad_norm"):
            assert math.isclose(a[key], b[key], rel_tol=1e-10, abs_tol=1e-14), (key, a, b)
        # The safeguard's mu comes from s = w_t - w_{t-1}: near convergence ||s|| ~ 1e-5 ||w||, so
        # round-off of 1e-16 in the iterates is ~1e-11..1e-10 relative in mu; hence 1e-8 here.
        assert math.isclose(a.get("mu", 0.0), b.get("mu", 0.0), rel_tol=1e-8, abs_tol=1e-14), (a, b)
    assert sim_rounds[-1]["suboptimality"] < 1e-8 * sim_rounds[0]["suboptimality"]  # it did optimize
    w_real, w_sim = torch.load(real / "iterate.pt"), torch.load(sim / "iterate.pt")
    assert w_real.dtype == w_sim.dtype == torch.float64
    assert torch.allclose(w_real, w_sim, rtol=1e-10, atol=1e-12)


def test_one_worker_runs_in_the_simulator_when_asked_and_computes_the_same(tmp_path):
    """experiments.simulate times m=1 on its thread's CPU clock (sim.single_worker) like every m > 1; the
    iterates are the plain single-process run's."""
    cpu = execute(run_spec(compose_job(("workers=1", *SMALL))), str(tmp_path / "cpu"))
    wall = execute(run_spec(compose_job(("workers=1", *SMALL, "sim.single_worker=false"))), str(tmp_path / "wall"))
    assert cpu["backend"] == "simulator" and wall["backend"] == "local"
    strip = lambda records: [{k: v for k, v in r.items() if k != "time_s"} for r in records]  # noqa: E731
    assert strip(read_rounds(tmp_path / "cpu")) == strip(read_rounds(tmp_path / "wall"))
    assert cpu["simulated_comm_s"] == 0.0 and cpu["total_bytes"] == 0


@pytest.mark.parametrize("argv", [["--np", "0"], ["--reps", "-1"], ["--topology", "ps", "--servers", "0"]])
def test_calibrate_refuses_a_count_below_one_before_it_launches(argv, capsys):
    """argparse's one usage error (exit 2), not a launch that fails later (--servers 0 divided by zero)."""
    from dane.synthetic import calibrate

    with pytest.raises(SystemExit) as done:
        calibrate.main(argv)
    assert done.value.code == 2
    assert f"error: argument {argv[-2]}: must be a positive integer, got '{argv[-1]}'" in capsys.readouterr().err


@pytest.mark.parametrize("argv, line", [
    (["--np", "1", "--reps", "1"], "argument --np: a ring allreduce needs at least 2 processes, got 1"),
    (["--topology", "ps", "--tail"], "argument --tail: the tail is the ring's (horovodrun; sim.topology=ps draws "
                                     "none); drop --tail with --topology ps"),
])
def test_calibrate_refuses_what_it_cannot_measure_before_it_launches(argv, line, capsys, monkeypatch):
    """One ring worker has no allreduce to time (`fit_alpha_beta` needs m >= 2), and the tail is measured on the
    ring's rounds only: argparse's one line (exit 2), nothing launched."""
    def launched(*args, **kwargs):
        raise AssertionError("launched")

    for name in ("horovodrun", "torchrun", "calibrate", "calibrate_ps", "calibrate_tail"):
        monkeypatch.setattr(calibrate_module, name, launched)
    with pytest.raises(SystemExit) as done:
        calibrate_module.main(argv)
    assert done.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(f": error: {line}")
