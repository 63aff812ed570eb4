r"""Measure the simulator's α-β allreduce cost model on real Horovod allreduces of this machine.

    python -m synthetic.calibrate [--np 2] [--out results/calibration.json]
    python -m synthetic.calibrate --topology ps [--np 2] [--servers 1]   # -> results/calibration_ps.json
    python -m synthetic.calibrate --tail [--np 2] [--out ...]          # α, β and the round's tail

Launches ``horovodrun -np NP --gloo`` on `synthetic.allreduce_timing` with
``HOROVOD_CYCLE_TIME=0.1`` (the package's default, `dane.comm.horovod.HorovodOptions`), which
times grouped allreduces of 8 B to 4 MB, and fits the ring-allreduce model

.. math:: T(n) = \frac{2(m-1)}{m}\frac{n}{\beta} + 2(m-1)\,\alpha

to the mean times by least squares on relative errors (each size weighs the same,
so the 8 B latency counts as much as the 4 MB bandwidth).

Mean, not median: on these machines gloo's allreduce (under Horovod and under torchrun
alike) has a heavy tail.  Most calls of two elements or more take well under a
millisecond, but a minority wait about one scheduler tick (4 ms at the kernel's 250 Hz;
a raw TCP ping-pong between two processes shows no such tail), so the mean per call is
well above the median.  A run pays the mean: its time is a sum over calls, and
expectations add where medians do not.  A median fit predicted real DANE rounds too
low, by an amount that moved with how often a launch hit the tail; the mean fit is what
``make bench``'s ``simulator_error`` compares against real mean round times.  The
medians are saved beside the means.  The result is saved with
`dane.comm.AlphaBeta.save`, with the measurements beside it; conf/config.yaml's
``sim.calibration`` points the simulator at it.

``--tail`` then launches DANE's rounds (`synthetic.round_timing`, ``horovodrun -np NP --gloo``,
the default problem) and saves beside α and β the distribution of each allreduce phase's
excess over what the simulator charges it (`dane.comm.tail`): where a real round's mean is
well above its median, a price per byte cannot match it; drawing that excess can.

``--topology ps`` measures `dane.comm.ParameterServerCost` instead, on real ``comm=ps``
allreduces (``torchrun``, NP workers plus ``--servers`` servers): γ, the servers' summing
rate, from their own averaging time; α and β from the push-and-pull times (conf's
``sim.ps_calibration``).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from dane import checks
from dane.comm import AlphaBeta, ParameterServerCost
from dane.comm.cost import CALIBRATION_SIZES
from dane.comm.tail import tail_entry
from dane.errors import UserError, say
from dane.records.results import output_file
from dane.synthetic.bench_file import machine
from dane.synthetic.launchers import have_horovod, horovodrun, torchrun
from dane.records.provenance import command_name

CYCLE_TIME_MS = "0.1"


def fit_line(sizes, times) -> tuple[float, float]:
    r"""Least squares of T(n) = a n + b on relative residuals: minimizes
    :math:`\sum_k ((a n_k + b) / T_k - 1)^2` over a > 0, b >= 0."""
    n = np.asarray(sizes, dtype=float)
    t = np.asarray(times, dtype=float)
    rows = np.stack([n / t, 1 / t], axis=1)
    (a, b), *_ = np.linalg.lstsq(rows, np.ones_like(t), rcond=None)
    if b < 0:  # no latency left to explain: refit the slope alone
        b, a = 0.0, float(np.sum(n / t) / np.sum((n / t) ** 2))
    if a <= 0:  # no bandwidth term visible (all sizes latency-bound): refit the intercept alone
        a, b = 1e-15, float(np.sum(1 / t) / np.sum((1 / t) ** 2))
    return float(a), float(b)


def fit_alpha_beta(sizes, times, m: int) -> AlphaBeta:
    """The ring's α-β from `fit_line`: a = 2(m-1)/(m β), b = 2(m-1) α."""
    if m < 2:
        raise ValueError(f"an allreduce cost needs m >= 2 workers, got {m}")
    a, b = fit_line(sizes, times)
    return AlphaBeta(alpha=b / (2 * (m - 1)), beta=2 * (m - 1) / (m * a))


def fit_parameter_server(sizes, times, m: int, servers: int, gamma: float) -> ParameterServerCost:
    """α and β of `ParameterServerCost` from `fit_line`, with the servers' summing rate γ measured apart:
    a = 2m/(kβ) + m/(kγ), b = 2mα.  Where the summing explains the whole slope, β is left unbounded (1e15)."""
    a, b = fit_line(sizes, times)
    per_byte_links = a - m / (servers * gamma)
    beta = 2 * m / (servers * per_byte_links) if per_byte_links > 0 else 1e15
    return ParameterServerCost(alpha=b / (2 * m), beta=beta, gamma=gamma, servers=servers)


def relative_errors(cost: AlphaBeta | ParameterServerCost, sizes, times, m: int) -> list[float]:
    return [cost.allreduce_time(int(n), m) / t - 1 for n, t in zip(sizes, times)]


def per_size(timing: dict) -> tuple[list[int], list[float], list[float]]:
    """The message sizes of an `synthetic.allreduce_timing` result, and the mean and median seconds per call at each."""
    sizes = [int(s) for s in timing["sizes"]]
    return (sizes, [timing["sizes"][str(s)]["mean_s"] for s in sizes],
            [timing["sizes"][str(s)]["median_s"] for s in sizes])


def calibrate(np_: int = 2, sizes=CALIBRATION_SIZES, reps: int = 200, warmup: int = 20) -> dict:
    """Launch the timing worker under horovodrun and fit; returns {alpha, beta, measurements...}."""
    if not have_horovod():
        raise RuntimeError("horovod.torch is not importable here; run `make setup` (it builds Horovod) first")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "timing.json"
        horovodrun("dane.synthetic.allreduce_timing",
                   ["--out", str(out), "--reps", str(reps), "--warmup", str(warmup), "--sizes", *map(str, sizes)],
                   np=np_, env={"HOROVOD_CYCLE_TIME": CYCLE_TIME_MS})
        timing = json.loads(out.read_text())
    sizes, means, medians = per_size(timing)
    cost = fit_alpha_beta(sizes, means, np_)
    return {"alpha": cost.alpha, "beta": cost.beta, "workers": np_, "horovod_cycle_time_ms": float(CYCLE_TIME_MS),
            "fit": "T(n) = 2(m-1)/m n/beta + 2(m-1) alpha, least squares on relative error of mean times",
            "sizes_bytes": sizes, "mean_s": means, "median_s": medians,
            "relative_error": relative_errors(cost, sizes, means, np_),
            "raw": timing["sizes"], "machine": machine(),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def calibrate_tail(cost: AlphaBeta, np_: int = 2, blocks: int = 12, rounds: int = 10) -> dict:
    """Launch DANE's rounds under horovodrun and fit the excess of their allreduce phases over ``cost``
    (`dane.comm.tail.tail_entry`): the ``tail`` entry of a calibration file."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rounds.json"
        horovodrun("dane.synthetic.round_timing", ["--out", str(out), "--blocks", str(blocks), "--rounds", str(rounds)],
                   np=np_)
        timing = json.loads(out.read_text())
    return tail_entry(timing["phases"], cost, np_, machine=machine(), launcher=f"horovodrun -np {np_} --gloo", np=np_,
                      workload=f"synthetic.round_timing --blocks {blocks} --rounds {rounds} (DANE, default problem)",
                      round_mean_s=timing["means"]["round_s"], round_median_s=timing["medians"]["round_s"],
                      measured_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))


def calibrate_ps(workers: int = 2, servers: int = 1, sizes=CALIBRATION_SIZES, reps: int = 200, warmup: int = 20) -> dict:
    """``torchrun`` the timing worker with ``comm=ps`` (``workers`` + ``servers`` processes) and fit
    `ParameterServerCost`: γ from the servers' own averaging time over the bytes they averaged, then α and β
    from the workers' allreduce (push + pull) times; returns {alpha, beta, gamma, measurements...}."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "timing.json"
        torchrun("dane.synthetic.allreduce_timing", ["--out", str(out), "--reps", str(reps), "--warmup", str(warmup),
                                                "--ps-servers", str(servers), "--sizes", *map(str, sizes)],
                 np=workers + servers)
        timing = json.loads(out.read_text())
    sizes, means, medians = per_size(timing)
    averaged = workers * timing["calls_per_size"] * sum(sizes) / servers  # bytes each server summed
    reduce_s = max(server["reduce_s"] for server in timing["parameter_server"]["server"])
    cost = fit_parameter_server(sizes, means, workers, servers, gamma=averaged / reduce_s)
    return {"alpha": cost.alpha, "beta": cost.beta, "gamma": cost.gamma, "workers": workers, "servers": servers,
            "fit": "T(n) = 2m(alpha + n/(k beta)) + m n/(k gamma); gamma = bytes averaged / the servers' averaging "
                   "time; alpha, beta by least squares on relative error of mean times",
            "sizes_bytes": sizes, "mean_s": means, "median_s": medians,
            "relative_error": relative_errors(cost, sizes, means, workers),
            "raw": timing["sizes"], "server": timing["parameter_server"]["server"], "machine": machine(),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=command_name(), description=__doc__.splitlines()[0])
    count = checks.positive_int_argument  # argparse's own line for a count below 1
    parser.add_argument("--np", type=count, default=2, dest="np_", help="Horovod processes, at least 2 (default 2); --topology ps: workers")
    parser.add_argument("--out", default=None,
                        help="default results/calibration.json (allreduce) or results/calibration_ps.json (ps)")
    parser.add_argument("--reps", type=count, default=200)
    parser.add_argument("--topology", choices=("allreduce", "ps"), default="allreduce",
                        help="ps: torchrun --np workers plus --servers parameter servers (comm=ps)")
    parser.add_argument("--servers", type=count, default=1, help="ps: parameter servers")
    parser.add_argument("--tail", action="store_true", help="also fit the excess of real DANE rounds' allreduce "
                        "phases over the model (a second horovodrun launch), which the simulator then draws")
    parser.add_argument("--blocks", type=count, default=12, help="--tail: blocks of --rounds DANE rounds")
    parser.add_argument("--rounds", type=count, default=10, help="--tail: DANE rounds per block")
    args = parser.parse_args(argv)
    if args.topology == "allreduce" and args.np_ < 2:  # before the launch: `fit_alpha_beta` needs two
        parser.error(f"argument --np: a ring allreduce needs at least 2 processes, got {args.np_}")
    if args.topology == "ps" and args.tail:
        parser.error("argument --tail: the tail is the ring's (horovodrun; sim.topology=ps draws none); drop --tail "
                     "with --topology ps")
    default = "calibration_ps.json" if args.topology == "ps" else "calibration.json"
    args.out = args.out or f"results/{default}"
    try:  # before the launches: a path the result cannot be written to is refused, not found after measuring
        output_file(args.out, "--out", default)
    except UserError as exc:
        say(f"error: {exc}")
        sys.exit(2)
    if args.topology == "ps":
        result = calibrate_ps(args.np_, args.servers, reps=args.reps)
        cost = ParameterServerCost(alpha=result.pop("alpha"), beta=result.pop("beta"), gamma=result.pop("gamma"))
        cost.save(args.out, **result)
        print(f"alpha = {cost.alpha * 1e6:.1f} us, beta = {cost.beta / 1e6:.1f} MB/s, gamma = {cost.gamma / 1e6:.1f} "
              f"MB/s (m={args.np_} workers, {args.servers} server(s)) -> {args.out}")
        return
    result = calibrate(args.np_, reps=args.reps)
    cost = AlphaBeta(alpha=result.pop("alpha"), beta=result.pop("beta"))
    if args.tail:
        result["tail"] = calibrate_tail(cost, args.np_, args.blocks, args.rounds)
    cost.save(args.out, **result)
    print(f"alpha = {cost.alpha * 1e6:.1f} us, beta = {cost.beta / 1e6:.1f} MB/s "
          f"(m={args.np_}, HOROVOD_CYCLE_TIME={CYCLE_TIME_MS}) -> {args.out}")
    for n, t, med, e in zip(result["sizes_bytes"], result["mean_s"], result["median_s"], result["relative_error"]):
        print(f"  {n:>8d} B  mean {t * 1e3:8.3f} ms (median {med * 1e3:.3f})  "
              f"model {t * (1 + e) * 1e3:8.3f} ms  ({e:+.0%})")
    if args.tail:
        tail = result["tail"]
        print(f"tail: {tail['samples']} allreduce phases, excess mean {tail['excess_mean_s'] * 1e3:.3f} ms, "
              f"median {tail['excess_median_s'] * 1e3:.3f} ms; "
              f"phase wall mean/median {tail['phase_wall_mean_over_median']:.2f}")


if __name__ == "__main__":
    main()
