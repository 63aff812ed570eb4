r"""Figure: what staleness costs.  Test accuracy of sync SGD, SSP (s = 1, 4) and asynchronous SGD (s = ∞)
against simulated time and against gradients computed, three workers through one parameter server, one
of them 3x slower.

MNIST LeNet-5 where the MNIST files are in ``data_dir`` (as `paper_figs.accuracy_table.has_data`
decides), else the scikit-learn digits MLP, which is always there.  Every run has the same seed,
the same optimizer (sync_sgd's SGD with momentum 0.9) and the same m × ``steps_per_round``
minibatch gradients per logged round.  Asynchronously each gradient is one server step, so a
round takes m times as many steps as a synchronous one: the SSP and asynchronous runs use
lr/m (`ASYNC_LR`), so that without staleness a pass over the data would move the iterate as far.

**One time base.**  The asynchronous and SSP runs are timed by the event simulator's model
(`dane.loop.asynchronous.simulator`): a push costs ``sim.step_time`` × slowdown_i of compute, and the server
handles one message at a time (α + n/β to receive or send, n/γ to apply).  A synchronous run
(``comm.staleness=0``) logs measured CPU compute instead, so the figure re-times it on the same
model (`sync_time`): each synchronous step costs

.. math:: \max_i(\mathrm{step\_time} \cdot \mathrm{slowdown}_i) + T_{ps}(n, m),
   \qquad T_{ps}(n, m) = 2m(\alpha + n/(k\beta)) + m n/(k\gamma),

`ParameterServerCost.allreduce_time`, which is what m pushes and pulls arriving together take
in the event simulator.  A record's ``comm_rounds`` counts its steps and its ``bytes_sent`` (a
parameter server's worker sends each allreduce's whole message, `ParameterServerCost.allreduce_sent`) the
bytes of all its allreduces; T_ps is linear in n, so charging every step the mean message is exact.  The model's constants (step_time,
the slowdowns, α, β, γ) are stated in the caption and the sidecar.

Left: test accuracy against simulated time.  Right: against minibatch gradients computed (the same
work, though not the same number of server steps: asynchronous SGD steps once per gradient).  The
table adds each variant's final accuracy, simulated time to the last round, and the staleness
and clock lead (max and mean) of its updates from summary.json.

The four runs (`jobs`) are 10 rounds of 3 x 20 gradients each: seconds on the digits MLP,
minutes on MNIST LeNet-5.

    dane figures staleness [--results results] [--out results/figures]
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import matplotlib.pyplot as plt

from dane.comm import ParameterServerCost
from dane.records.results import read_rounds, read_summary
from dane.paper_figs.common import FIG_DIR, cli, curve_style, data_text, locate, save
from dane.paper_figs.provenance import caption_line, figure_provenance, run_config
from dane.synthetic.sweep import Job, RunIndex, compose_job

WORKERS = 3
SLOWDOWN = (1, 1, 3)
STALENESS = {"sync SGD (s=0)": "0", "SSP s=1": "1", "SSP s=4": "4", "async SGD (s=∞)": "inf"}
#: sync_sgd's learning rate (its default, momentum 0.9).  An asynchronous server steps once per gradient,
#: m times per synchronous step, so SSP and asynchronous runs use LR / m: a pass over the data then moves
#: the iterate as far as synchronous SGD's does, and what is left between the curves is staleness
LR = 0.05
ASYNC_LR = round(LR / WORKERS, 6)  # short enough for a run directory's name
#: modelled seconds of one worker's minibatch step (sim.step_time): long enough next to the server's cost of a
#: push and a pull (its message cost, docs/parameter_server.md) that the workers' compute, not the server, sets the pace
STEP_TIME = 0.01


@dataclass(frozen=True)
class Setting:
    label: str
    problem: str
    rounds: int
    steps_per_round: int  # per worker and logged round


SETTINGS = {
    "MNIST-LeNet5": Setting("MNIST LeNet-5", "mnist_lenet5", rounds=10, steps_per_round=20),
    "digits-MLP": Setting("digits MLP", "digits_mlp", rounds=15, steps_per_round=4),
}


@lru_cache(maxsize=1)
def setting() -> Setting:
    """MNIST LeNet-5 where its files are present, else the digits MLP (always present); read once (it loads MNIST)."""
    from dane.paper_figs.accuracy_table import ROWS, has_data

    mnist = next(row for row in ROWS if row.problem == "mnist_lenet5")
    return SETTINGS["MNIST-LeNet5" if has_data(mnist) else "digits-MLP"]


def job(variant: str, where: Setting) -> Job:
    return ("algorithm=sync_sgd", f"problem={where.problem}", f"workers={WORKERS}",
            f"sim.slowdown=[{','.join(map(str, SLOWDOWN))}]", f"sim.step_time={STEP_TIME}",
            "sim.topology=ps",  # one server (sim.servers=1, the default)
            "sim.calibration=null", "sim.ps_calibration=null",  # the package's costs, stated on the figure
            f"rounds={where.rounds}", "tol=null", f"algorithm.steps_per_round={where.steps_per_round}",
            f"algorithm.lr={LR if STALENESS[variant] == '0' else ASYNC_LR}", f"comm.staleness={STALENESS[variant]}")


def jobs(where: Setting | None = None) -> list[Job]:
    where = where or setting()
    return [job(v, where) for v in STALENESS]


def run_cost(summary: dict) -> ParameterServerCost:
    """The parameter-server cost a run was simulated with (its summary's α, β, γ and server count)."""
    if summary.get("topology") != "ps":
        raise ValueError(f"the staleness figure needs runs with sim.topology=ps, got {summary.get('topology')}")
    return ParameterServerCost(alpha=summary["alpha"], beta=summary["beta"], gamma=summary["gamma"],
                               servers=summary["servers"])


def sync_time(record: dict, *, cost: ParameterServerCost, workers: int, step_time: float,
              slowdown: list[float]) -> float:
    """A synchronous record's time on the asynchronous simulator's model: per step, the slowest worker's
    modelled compute plus one parameter-server allreduce of the step's mean message."""
    steps = record["comm_rounds"]
    if steps == 0:
        return 0.0
    factors = [slowdown[i % len(slowdown)] for i in range(workers)]  # recycled over workers, as Stragglers does
    return steps * (step_time * max(factors) + cost.allreduce_time(record["bytes_sent"] / steps, workers))


@dataclass(frozen=True)
class Curve:
    variant: str
    rounds: list[int]
    gradients: list[int]    # minibatch gradients computed by all workers before the record's iterate
    time_s: list[float]     # on the asynchronous simulator's model
    accuracy: list[float]
    staleness: dict         # summary.json's "asynchronous" entry ({} for the synchronous run)
    run: str


def curve(variant: str, run_dir: Path, sim: dict) -> Curve:
    """``sim``: the job's sim config.  A stored synchronous run answers a job whatever its step_time (it
    does not change its iterates), so the re-timing takes step_time and slowdown from the job."""
    summary, records, cfg = read_summary(run_dir), read_rounds(run_dir), run_config(run_dir)
    m, steps = summary["workers"], cfg["algorithm"]["steps_per_round"]
    if STALENESS[variant] == "0":
        times = [sync_time(r, cost=run_cost(summary), workers=m, step_time=sim["step_time"],
                           slowdown=[float(s) for s in sim["slowdown"]]) for r in records]
    else:
        times = [r["time_s"] for r in records]
    return Curve(variant, [r["round"] for r in records], [r["round"] * m * steps for r in records], times,
                 [r.get("test_accuracy", math.nan) for r in records], summary.get("asynchronous", {}), str(run_dir))


def table(results: str | Path, where: Setting | None = None) -> dict[str, Curve]:
    where = where or setting()
    runs = locate(RunIndex(results), jobs(where))
    curves = {v: curve(v, runs[job(v, where)], compose_job(job(v, where))["sim"]) for v in STALENESS}
    costs = {run_cost(read_summary(Path(c.run))) for c in curves.values()}
    if len(costs) > 1:
        raise ValueError(f"the staleness runs were simulated with different costs: {sorted(map(str, costs))}")
    return curves


def model_line(curves: dict[str, Curve]) -> str:
    first = next(iter(curves.values()))
    cost = run_cost(read_summary(Path(first.run)))
    return (f"time model: step_time={STEP_TIME * 1e3:.3g} ms x slowdown {list(SLOWDOWN)}; one server "
            f"α={cost.alpha * 1e6:.3g} µs, β={cost.beta / 1e9:.3g} GB/s, γ={cost.gamma / 1e9:.3g} GB/s; "
            "sync SGD re-timed per step as max_i(step_time·slowdown_i) + 2m(α+n/β) + mn/γ; "
            f"lr {LR:g} (sync), {ASYNC_LR:g} = lr/m (SSP, async), momentum 0.9")


def draw(curves: dict[str, Curve], title: str):
    fig, (by_time, by_work) = plt.subplots(1, 2, figsize=(11, 4.4))
    for k, c in enumerate(curves.values()):
        style = dict(curve_style(k), markersize=3, label=c.variant)
        by_time.plot(c.time_s, c.accuracy, **style)
        by_work.plot(c.gradients, c.accuracy, **style)
    by_time.set_xlabel("simulated time (s), one time model")
    by_work.set_xlabel("minibatch gradients computed (all workers)")
    by_time.set_title("accuracy against time: the slow worker holds sync SGD back", fontsize=10)
    by_work.set_title("accuracy against work: the same gradients, staler", fontsize=10)
    for ax in (by_time, by_work):
        ax.set_ylabel("test accuracy")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def markdown(curves: dict[str, Curve], model: str) -> str:
    head = ("| variant | final test accuracy | simulated time to last round (s) | staleness max / mean "
            "| clock lead max / mean |\n|---|---|---|---|---|\n")

    def lead_mean(stats: dict) -> float:
        hist = stats["clock_lead_histogram"]
        return sum(int(k) * v for k, v in hist.items()) / sum(hist.values())

    rows = "".join(
        f"| {c.variant} | {c.accuracy[-1]:.4f} | {c.time_s[-1]:.4f} | "
        + (f"{c.staleness['staleness_max']} / {c.staleness['staleness_mean']:.2f} | "
           f"{c.staleness['clock_lead_max']} / {lead_mean(c.staleness):.2f} |" if c.staleness else "0 / 0 | 0 / 0 |")
        + "\n" for c in curves.values())
    return f"{model}\n\n{head}{rows}"


def data_line(runs) -> str:
    """The train/test sizes (and split, when not the files' own) the runs recorded, each distinct one once."""
    seen = []
    for run in runs:
        info = read_summary(run).get("data") or {}
        if "train_size" not in info:
            continue
        what = data_text(info)
        if what not in seen:
            seen.append(what)
    return "; ".join(seen) or "not recorded"


def main(results: str | Path = "results", out: str | Path = FIG_DIR, where: Setting | None = None) -> list[Path]:
    where = where or setting()
    curves = table(results, where)
    model = model_line(curves)
    provenance = figure_provenance([c.run for c in curves.values()], root=results, cost=model, problem=where.problem,
                                   workers=WORKERS, slowdown=list(SLOWDOWN), step_time_s=STEP_TIME,
                                   lr={"synchronous": LR, "SSP and asynchronous": ASYNC_LR})
    what = (f"{where.label}, {WORKERS} workers (one 3x slower), one parameter server: test accuracy of sync SGD, "
            "SSP s=1, s=4 and asynchronous SGD against simulated time and against gradients computed; "
            f"data: {data_line(c.run for c in curves.values())}")
    caption = caption_line(what, provenance)
    title = f"{where.label}: sync SGD, SSP and asynchronous SGD, {WORKERS} workers, slowdown {list(SLOWDOWN)}"
    return save(draw(curves, title), out, "staleness", markdown(curves, model), caption=caption,
                provenance=provenance)


if __name__ == "__main__":
    cli(main, __doc__)
