"""The Horovod path and the simulator: each of ``SECTIONS`` (``--only``) a JSON key of its own, with
``synthetic_bench`` (the list of those done) beside them; docs/benchmarks.md, section `horovod`."""
from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

from dane.comm import AlphaBeta, ParameterServerCost
from dane.comm.horovod import HorovodOptions
from dane.experiments.config import run_spec
from dane.loop.launch import execute
from dane.records.results import read_rounds
from dane.synthetic.calibrate import calibrate, calibrate_ps, calibrate_tail
from dane.synthetic.launchers import horovodrun, torchrun
from dane.synthetic.sweep import compose_job
from scripts.harness import Bench, Run, count, counts, interleave, load, need_horovod, now, option, steady

SECTIONS = ("dane_round_overhead", "allreduce_latency_ratio", "simulator_error", "ps_simulator_error")
TAIL_HOW = ("error_with_tail: calibration k is `dane calibrate --tail`'s (its alpha-beta launch, then a launch of "
            "DANE's rounds whose allreduce phases' excess it fits); the simulator also draws each allreduce's excess "
            "from that tail (dane.comm.tail); error is the median pair; goal 0.25")


def gap(simulated: float, measured: float) -> float:
    """The simulator's relative error: |simulated - measured| / measured."""
    return abs(simulated - measured) / measured


def round_timing(tmp: Path, k: int, blocks: int, rounds: int) -> dict:
    """One horovodrun launch of `synthetic.round_timing`: its medians, and the load average before it."""
    out, before = tmp / f"round_timing_{k}.json", load()
    horovodrun("dane.synthetic.round_timing", ["--out", str(out), "--blocks", str(blocks), "--rounds", str(rounds)])
    timing = json.loads(out.read_text())
    med = timing["medians"]
    return {**med, "ratio": med["round_s"] / med["bare_s"], "means": timing["means"], "load_before": before}


def round_overhead(per_launch: list[dict], blocks: int, rounds: int) -> dict:
    """DANE round over bare round, the median of separate launches' medians (one launch can keep a slow placement
    of its threads for its whole life)."""
    median = {key: statistics.median(launch[key] for launch in per_launch)
              for key in per_launch[0] if key not in ("load_before", "means")}
    return {"ratio": median.pop("ratio"), "goal": 1.25, **median,
            "per_launch": per_launch, "rounds_timed_per_launch": blocks * (rounds - 1),
            "problem": "ridge_synthetic N=18000 d=500 iso, m=2",
            "algorithm": "dane (defaults: safeguard=true, mu=0, eta=1)",
            "horovod_cycle_time_ms": HorovodOptions().cycle_time_ms}


def latency_ratio(tmp: Path, pairs: int, reps: int) -> dict:
    """Median 4 KB allreduce latency, horovodrun over torchrun (and over torchrun with each rank bound to its own
    core, as the package binds Horovod's), over ``pairs`` interleaved launches of each."""
    variants = {"horovod": (horovodrun, ["--synchronize"]), "torch_gloo": (torchrun, []),
                "torch_gloo_pinned": (torchrun, ["--pin"])}

    def measure(name: str, k: int) -> dict:
        launcher, extra = variants[name]
        out = tmp / f"latency_{name}_{k}.json"
        launcher("dane.synthetic.allreduce_timing", ["--sizes", "4096", "--reps", str(reps), "--out", str(out), *extra])
        return json.loads(out.read_text())

    timings = interleave(variants, pairs, measure)
    times = {name: [t["sizes"]["4096"]["median_s"] for t in ts] for name, ts in timings.items()}
    # the same launches' hvd.synchronize, taking turns with the package's call
    synchronize = [t["synchronize_sizes"]["4096"]["median_s"] for t in timings["horovod"]]
    wait_over_synchronize = [p / s for p, s in zip(times["horovod"], synchronize)]
    h, t, tp = (statistics.median(times[name]) for name in variants)
    options = HorovodOptions()
    return {"ratio": h / t, "goal": 1.2, "ratio_vs_pinned_gloo": h / tp,
            # the package's wait against Horovod's own, launch by launch (goal <= 1.2 as well)
            "horovod_wait_over_synchronize": statistics.median(wait_over_synchronize),
            "horovod_wait_over_synchronize_per_launch": wait_over_synchronize,
            "horovod_4KB_s": h, "horovod_synchronize_4KB_s": statistics.median(synchronize),
            "torch_gloo_4KB_s": t, "torch_gloo_pinned_4KB_s": tp,
            **{f"{name}_per_launch_s": v for name, v in times.items()},
            "horovod_synchronize_per_launch_s": synchronize,
            "horovod_settings": f"package defaults (HOROVOD_CYCLE_TIME={options.cycle_time_ms}, "
                                f"pin_cores={options.pin_cores}, response cache on, names stable per shape)",
            "torch_launch": "torchrun --standalone --nproc_per_node 2 (gloo)", "reps_per_launch": reps}


def simulated_round(cost: AlphaBeta | ParameterServerCost, n_rounds: int, tmp: Path,
                    calibration: Path | None = None) -> dict:
    """The simulated DANE round at m=2 on the default problem under ``cost`` (a ring or parameter servers), as the
    launches time it: every round run (no stopping test), the mean round after round 1 (`harness.steady`); and the
    compute and communication per round over the whole run.  ``calibration``: a ring's calibration file whose tail
    the simulator draws (`dane.comm.tail`); without one, α-β alone."""
    cfg = compose_job(("workers=2", f"rounds={n_rounds}", "tol=null", "tol_abs=null"))
    cfg.sim.alpha, cfg.sim.beta, cfg.quiet = cost.alpha, cost.beta, True
    cfg.sim.calibration = None if calibration is None else str(calibration)
    if isinstance(cost, ParameterServerCost):
        cfg.sim.topology, cfg.sim.gamma, cfg.sim.servers = "ps", cost.gamma, cost.servers
    out = Path(tempfile.mkdtemp(prefix="sim_", dir=tmp))
    summary = execute(run_spec(cfg), str(out))
    return {"round_s": statistics.fmean(steady(read_rounds(out))),
            "compute_s": summary["simulated_compute_s"] / summary["rounds"],
            "comm_s": summary["simulated_comm_s"] / summary["rounds"], "calibration": summary["calibration"]}


def ring(calibration: dict) -> AlphaBeta:
    return AlphaBeta(alpha=calibration["alpha"], beta=calibration["beta"])


def calibrate_pair(blocks: int, rounds: int) -> dict:
    """Calibration k as ``dane calibrate --tail`` makes it: α-β (`calibrate`), then the tail of DANE's rounds."""
    calibration = calibrate(2)
    return {**calibration, "tail": calibrate_tail(ring(calibration), 2, blocks, rounds)}


def simulator_error(timings: list[dict], calibrations: list[dict], n_rounds: int, tmp: Path,
                    saved: Path = Path("results/calibration.json")) -> dict:
    """The simulator's error per interleaved (round timing k, calibration k) pair, the median pair the headline,
    every pair split into compute and communication; α and β the calibrations' medians, the rest of the record
    the middle launch's; ``error_with_tail`` (`with_tail`) beside it."""
    pairs = []
    for timing, calibration in zip(timings, calibrations):
        sim, means = simulated_round(ring(calibration), n_rounds, tmp), timing["means"]
        pairs.append({"error": gap(sim["round_s"], means["round_s"]),
                      "measured_round_s": means["round_s"], "simulated_round_s": sim["round_s"],
                      "measured_median_round_s": timing["round_s"],
                      "measured_compute_s": means["compute_s"], "simulated_compute_s": sim["compute_s"],
                      "measured_comm_s": means["allreduce1_s"] + means["allreduce2_s"],
                      "simulated_comm_s": sim["comm_s"],
                      "alpha": calibration["alpha"], "beta": calibration["beta"], "load_before": timing["load_before"]})
    for pair, tail in zip(pairs, with_tail(timings, calibrations, n_rounds, tmp)):
        pair.update(tail)
    errors, with_tails = [p["error"] for p in pairs], [p["error_with_tail"] for p in pairs]
    calibration = {**calibrations[len(calibrations) // 2],
                   **{k: statistics.median(c[k] for c in calibrations) for k in ("alpha", "beta")},
                   "per_launch": [{"alpha": c["alpha"], "beta": c["beta"]} for c in calibrations]}
    out = {"error": statistics.median(errors), "goal": 0.25, "headline": "error_with_tail", "max_error": max(errors),
           "error_with_tail": statistics.median(with_tails), "max_error_with_tail": max(with_tails),
           "tail_how": TAIL_HOW, "pairs": pairs,
           "how": "interleaved launches: round timing k, then calibration k (fit to mean call times); the simulator "
                  "predicts launch k's mean round from calibration k; error is the median pair",
           "calibration": {k: calibration[k] for k in ("alpha", "beta", "fit", "sizes_bytes", "mean_s", "median_s",
                                                        "relative_error", "measured_at", "per_launch")
                           if k in calibration}}
    if saved.exists():
        saved_cost = AlphaBeta.load(saved)
        simulated = simulated_round(saved_cost, n_rounds, tmp)["round_s"]
        measured = statistics.median(t["means"]["round_s"] for t in timings)
        out["with_saved_calibration"] = {"path": str(saved), "alpha": saved_cost.alpha, "beta": saved_cost.beta,
                                         "simulated_round_s": simulated, "measured_round_s": measured,
                                         "error": gap(simulated, measured)}
    return out


def with_tail(timings: list[dict], calibrations: list[dict], n_rounds: int, tmp: Path) -> list[dict]:
    """Per pair k, the simulated round drawing calibration k's tail (`TAIL_HOW`) from a calibration file as
    ``dane calibrate --tail`` writes it, and its error against launch k's mean round."""
    out = []
    for k, (timing, calibration) in enumerate(zip(timings, calibrations)):
        path, tail, measured = tmp / f"calibration_tail_{k}.json", calibration["tail"], timing["means"]["round_s"]
        cost = ring(calibration)
        cost.save(path, tail=tail)
        sim = simulated_round(cost, n_rounds, tmp, calibration=path)
        out.append({"error_with_tail": gap(sim["round_s"], measured),
                    "simulated_round_s_with_tail": sim["round_s"], "simulated_comm_s_with_tail": sim["comm_s"],
                    "tail_samples": tail["samples"], "tail_excess_mean_s": tail["excess_mean_s"],
                    "tail_load_avg": tail["machine"].get("load_avg"),
                    # the floor under error_with_tail: the tail launch's own mean round against launch k's
                    "tail_launch_round_s": tail.get("round_mean_s"),
                    "launch_to_launch": gap(tail["round_mean_s"], measured) if "round_mean_s" in tail else None})
    return out


def ps_simulator_error(tmp: Path, launches: int, n_rounds: int) -> dict:
    """The same for one parameter server and two workers: launch k runs DANE for real (``torchrun
    --nproc_per_node 3 ... comm=ps``), then `calibrate_ps` gives the cost the simulator predicts it from."""
    pairs = []
    for k in range(launches):
        out = tmp / f"ps_real_{k}"
        torchrun("dane.experiments.train", ["algorithm=dane", "problem=ridge_synthetic", f"rounds={n_rounds}",
                                            "tol=null", "tol_abs=null", "comm=ps", "comm.servers=1", "quiet=true",
                                            f"out_dir={out}"], np=3)
        rounds = steady(read_rounds(out))
        measured, calibration = statistics.fmean(rounds), calibrate_ps(2, 1)
        cost = ParameterServerCost(alpha=calibration["alpha"], beta=calibration["beta"], gamma=calibration["gamma"])
        sim = simulated_round(cost, n_rounds, tmp)
        pairs.append({"error": gap(sim["round_s"], measured), "measured_round_s": measured,
                      "measured_median_round_s": statistics.median(rounds), "simulated_round_s": sim["round_s"],
                      "simulated_compute_s": sim["compute_s"], "simulated_comm_s": sim["comm_s"],
                      "alpha": cost.alpha, "beta": cost.beta, "gamma": cost.gamma, "load": load()})
    errors = [pair["error"] for pair in pairs]
    return {"error": statistics.median(errors), "goal": 0.25, "max_error": max(errors), "pairs": pairs,
            "problem": "dane on ridge_synthetic N=18000 d=500, 2 workers + 1 parameter server (torchrun, comm=ps)"}


def run(bench: Run) -> None:
    args = bench.args
    if args.quick:  # one launch of each, short rounds: a smoke run on a shared machine
        args.launches, args.blocks, args.rounds, args.pairs, args.reps, args.ps_rounds = 1, 2, 3, 1, 30, 5
    only, done = args.only or SECTIONS, []
    if set(only) - {"ps_simulator_error"}:
        need_horovod()

    def record(section: str, value: dict) -> None:
        """Merge one finished section into --out at once (with its own machine: the load at its end), and the
        list of those done under ``synthetic_bench``."""
        machine = {**bench.machine, "load_avg_now": load()}
        bench.save({**value, "machine": machine}, section)
        done.append(section)
        bench.finish({"started_at": bench.started_at, "updated_at": now(), "machine": machine,
                      "sections": [s for s in SECTIONS if s in done]}, "synthetic_bench")
        bench.log(f"{section}: {value.get('ratio', value.get('error', ''))} -> {bench.path}")

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if "dane_round_overhead" in only or "simulator_error" in only:  # timed together, interleaved: one load a pair
            timings, calibrations = [], []
            for k in range(args.launches):
                timings.append(round_timing(tmp, k, args.blocks, args.rounds))
                if "simulator_error" in only:
                    calibrations.append(calibrate_pair(args.blocks, args.rounds))
            record("dane_round_overhead", round_overhead(timings, args.blocks, args.rounds))
            if calibrations:
                record("simulator_error", simulator_error(timings, calibrations, args.blocks * args.rounds, tmp))
        if "ps_simulator_error" in only:
            record("ps_simulator_error", ps_simulator_error(tmp, args.launches, args.ps_rounds))
        if "allreduce_latency_ratio" in only:
            record("allreduce_latency_ratio", latency_ratio(tmp, args.pairs, args.reps))


BENCH = Bench("synthetic_bench", run, "the Horovod path and the simulator: round overhead, latency, simulator error",
              only=SECTIONS, options=(
                  *counts(blocks=12, rounds=10),
                  option("--launches", type=count, default=5, help="horovodrun launches for the round overhead, and "
                         "calibration launches for simulator_error"),
                  option("--ps-rounds", type=count, default=60, help="rounds of each ps_simulator_error launch"),
                  option("--pairs", type=count, default=3, help="interleaved horovodrun/torchrun launches each"),
                  option("--reps", type=count, default=300, help="4 KB allreduces in each latency launch")))
