"""Figure: DANE's time per round against the number of workers, ring allreduce against parameter servers.

Safeguarded DANE on the synthetic ridge (N=18,000, d=500), 10 rounds, simulated with
the package's default costs (`dane.comm.AlphaBeta`, `dane.comm.ParameterServerCost`,
stated on the figure) for m = 2 … 64 workers and three topologies:

- a ring allreduce: per allreduce 2(m-1)/m n/β + 2(m-1)α;
- one parameter server: 2m(α + n/β) + m n/γ, every push, sum and pull through one
  server one after another, the serial part the source paper blames for its speedup;
- four servers, each holding a quarter of every message: the same with n/4.

Left: the median simulated time per round (its compute is each simulated worker's
measured CPU time, the slowest per phase).  A ridge message is 4 KB, so every topology
is latency-bound there: the ring's 2(m-1)α and a server's 2mα grow alike.  Right: the
models alone (no runs) for one allreduce of 4 KB and of 4 MB, where the bandwidth terms
separate them: the ring's 2(m-1)/m n/β stays flat while one server's m n (2/β + 1/γ)
grows linearly in m, and four servers divide it by four.  Real runs on this machine at m=2 are drawn as points when
`scripts/ps_scaling_real.py` (``make ps-scaling``) has made them: ``horovodrun -np 2``
(ring) and ``torchrun --nproc_per_node 3 ... comm=ps`` (one server, two workers), at
their wall-clock time per round.

    dane figures ps_scaling [--results results] [--out results/figures]
"""
from __future__ import annotations

import statistics
from pathlib import Path

import matplotlib.pyplot as plt

from dane.comm import AlphaBeta, ParameterServerCost
from dane.records.results import read_rounds, read_summary
from dane.paper_figs.common import FIG_DIR, cli, locate, save
from dane.paper_figs.provenance import caption_line, figure_provenance
from dane.synthetic.sweep import Job, RunIndex

WORKERS = (2, 4, 8, 16, 32, 64)
ROUNDS = 10
BASE = ("algorithm=dane", "problem=ridge_synthetic", f"rounds={ROUNDS}", "tol=null",
        "sim.calibration=null", "sim.ps_calibration=null")  # the package's default costs, stated on the figure
TOPOLOGIES = {  # label -> overrides
    "ring allreduce": ("sim.topology=allreduce",),
    "1 parameter server": ("sim.topology=ps", "sim.servers=1"),
    "4 parameter servers": ("sim.topology=ps", "sim.servers=4"),
}
#: real runs at m=2 (scripts/ps_scaling_real.py): folder under results/ -> the topology they stand for
REAL = {"ps_scaling/real/horovod_np2": "ring allreduce", "ps_scaling/real/ps_1server_np3": "1 parameter server"}


def job(topology: str, m: int) -> Job:
    return (*BASE, *TOPOLOGIES[topology], f"workers={m}")


def jobs() -> list[Job]:
    return [job(t, m) for t in TOPOLOGIES for m in WORKERS]


def round_time(run_dir: Path) -> float:
    """Median time per round over rounds 1..R (simulated in the simulator, wall clock under a launcher)."""
    times = [r["time_s"] for r in read_rounds(run_dir)]
    return statistics.median(b - a for a, b in zip(times, times[1:]))


def comm_per_round(run_dir: Path) -> float:
    summary = read_summary(run_dir)
    return summary["simulated_comm_s"] / summary["rounds"]


def table(results: str | Path) -> tuple[dict, dict, dict, list[Path]]:
    """Per topology: the time per round and its communication part at each m; the real runs; every run read."""
    runs = locate(RunIndex(results), jobs())
    per_round = {t: [round_time(runs[job(t, m)]) for m in WORKERS] for t in TOPOLOGIES}
    comm = {t: [comm_per_round(runs[job(t, m)]) for m in WORKERS] for t in TOPOLOGIES}
    real = {label: Path(results) / folder for folder, label in REAL.items()
            if (Path(results) / folder / "summary.json").exists()}
    return per_round, comm, {label: (path, round_time(path)) for label, path in real.items()}, \
        [*runs.values(), *real.values()]


def cost_line() -> str:
    ring, ps = AlphaBeta(), ParameterServerCost()
    return (f"package defaults: α={ring.alpha * 1e6:.3g} µs, β={ring.beta / 1e9:.3g} GB/s; "
            f"server sum γ={ps.gamma / 1e9:.3g} GB/s")


MESSAGES = {"4 KB (this ridge)": 4096, "4 MB": 4 * 2 ** 20}
MODELS = {"ring allreduce": AlphaBeta(), "1 parameter server": ParameterServerCost(servers=1),
          "4 parameter servers": ParameterServerCost(servers=4)}


def draw(per_round: dict, real: dict):
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4))
    for k, topology in enumerate(TOPOLOGIES):
        left.plot(WORKERS, per_round[topology], "o-", color=f"C{k}", label=f"{topology} (simulated)")
        for (message, nbytes), style in zip(MESSAGES.items(), (":", "-")):
            right.plot(WORKERS, [MODELS[topology].allreduce_time(nbytes, m) for m in WORKERS], style,
                       color=f"C{k}", label=f"{topology}, {message}")
        if topology in real:
            left.plot([2], [real[topology][1]], "*", color=f"C{k}", markersize=13, markeredgecolor="k",
                      label=f"{topology}, real run on this machine")
    for ax, what in ((left, "time per round (s)"), (right, "one allreduce by the cost model (s)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(WORKERS, [str(m) for m in WORKERS])
        ax.set_xlabel("workers m")
        ax.set_ylabel(what)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    left.set_title("DANE round: compute + communication", fontsize=10)
    right.set_title("the models alone: a server's serial part grows with m", fontsize=10)
    fig.suptitle(f"Safeguarded DANE, synthetic ridge N=18000, d=500: {cost_line()}", fontsize=10)
    fig.tight_layout()
    return fig


def markdown(per_round: dict, comm: dict, real: dict) -> str:
    head = "| topology | " + " | ".join(f"m={m}" for m in WORKERS) + " |\n" + "|---" * (len(WORKERS) + 1) + "|\n"
    rows = "".join(f"| {t} | " + " | ".join(f"{r * 1e3:.2f} ({c * 1e3:.2f})" for r, c in zip(per_round[t], comm[t]))
                   + " |\n" for t in TOPOLOGIES)
    lines = [f"Simulated time per round in ms (its communication part in brackets); {cost_line()}\n", head + rows]
    if real:
        lines.append("Real runs on this machine at m=2, wall-clock time per round: " +
                     "; ".join(f"{label} {t * 1e3:.2f} ms ({path.name})" for label, (path, t) in real.items()))
    return "\n".join(lines) + "\n"


def main(results: str | Path = "results", out: str | Path = FIG_DIR) -> list[Path]:
    per_round, comm, real, runs = table(results)
    provenance = figure_provenance(runs, root=results, cost=cost_line())
    caption = caption_line("Safeguarded DANE on the synthetic ridge: time per round against workers, ring "
                           "allreduce against 1 and 4 parameter servers (simulated; real points at m=2 where made)",
                           provenance)
    return save(draw(per_round, real), out, "ps_scaling", markdown(per_round, comm, real), caption=caption,
                provenance=provenance)


if __name__ == "__main__":
    cli(main, __doc__)
