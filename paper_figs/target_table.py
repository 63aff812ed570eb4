"""Rounds, allreduces, bytes and time to a target test accuracy, for DANE and each baseline.

One table per target (``conf/experiment/target_<problem>.yaml``: the problem, 4 simulated
workers, a fixed round budget).  Every algorithm spends about one pass over its shard
per round on local work (DANE's inner solve and ADMM's x-update with
``inner_steps=null``, ``steps_per_round=null`` for sync SGD, ``local_steps`` = shard /
batch for local SGD); DANE also computes one full local gradient per round.  A cell is
read from the first record whose test accuracy reaches the target: its round, the
allreduces and bytes one worker had sent by then, and the simulated parallel time
(per-worker compute + the α-β allreduce model).  "—" means not reached within the budget.
Reads only results/; writes ``target_table.md``.

    dane simulate experiment=target_mnist_lenet5 algorithm=sync_sgd   # one run
    dane figures target_table [--results results] [--out results/figures]
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from dane.comm import AlphaBeta
from dane.records.results import read_rounds, read_summary
from dane.paper_figs.accuracy_table import Row, data_caption, find_run, has_data
from dane.paper_figs.common import FIG_DIR, cli, retime, save
from dane.paper_figs.provenance import caption_line, figure_provenance
from dane.synthetic.sweep import Job, RunIndex, composed_job


@dataclass(frozen=True, eq=False)  # hashed by identity: the table keys on it
class Target:
    problem: str
    accuracy: float
    #: the algorithms and their settings on this problem (tuned briefly, by hand, on the same runs' budget)
    algorithms: dict[str, Job] = field(default_factory=dict)

    @property
    def experiment(self) -> str:
        return f"experiment=target_{self.problem}"


TARGETS = (
    Target("mnist_lenet5", 0.97, {
        "dane": ("algorithm=dane", "algorithm.safeguard=false"),
        "sync_sgd": ("algorithm=sync_sgd", "algorithm.lr=0.05", "algorithm.momentum=0.9", "algorithm.batch_size=100"),
        "local_sgd": ("algorithm=local_sgd", "algorithm.lr=0.1", "algorithm.batch_size=100", "algorithm.local_steps=20"),
        # adaptive ρ from 3, the best start of paper_figs/dane_vs_admm.py's tuning (every start <= 1 diverged there)
        "admm": ("algorithm=admm", "algorithm.rho=3.0"),
    }),
    Target("digits_mlp", 0.95, {
        "dane": ("algorithm=dane", "algorithm.safeguard=false"),
        "sync_sgd": ("algorithm=sync_sgd", "algorithm.lr=0.05", "algorithm.momentum=0.9", "algorithm.batch_size=32"),
        "local_sgd": ("algorithm=local_sgd", "algorithm.lr=0.1", "algorithm.batch_size=32", "algorithm.local_steps=11"),
        "admm": ("algorithm=admm", "algorithm.rho=0.1"),
    }),
)


def job(target: Target, algorithm: str) -> Job:
    return (target.experiment, *target.algorithms[algorithm])


def jobs(targets=TARGETS) -> list[Job]:
    return [job(t, a) for t in targets if has_data(Row(t.problem, t.problem, None)) for a in t.algorithms]


def reach(run_dir: Path, accuracy: float, cost: AlphaBeta) -> dict:
    """The first record at or above ``accuracy`` (None if none), timed under ``cost``, and the final and best accuracy."""
    summary = read_summary(run_dir)
    records = retime(read_rounds(run_dir), summary, cost)
    hit = next((r for r in records if r.get("test_accuracy", 0.0) >= accuracy), None)
    return {"hit": hit, "final": records[-1].get("test_accuracy"), "best": max(r.get("test_accuracy", 0.0) for r in records),
            "budget": records[-1]["round"], "status": summary["status"], "setup_s": summary.get("setup_s", 0.0),
            "run_dir": str(run_dir), "data": summary.get("data")}


def job_cost(j: Job) -> AlphaBeta:
    from dane.experiments.config import cost_model  # imported here, not for --help: dane.run_config imports torch

    return cost_model(OmegaConf.create(composed_job(tuple(j))["sim"]))


def collect(index: RunIndex, targets=TARGETS) -> dict[Target, dict[str, dict | None]]:
    out = {}
    for target in targets:
        out[target] = {}
        for algorithm in target.algorithms:
            path = find_run(index, job(target, algorithm))
            out[target][algorithm] = reach(path, target.accuracy, job_cost(job(target, algorithm))) if path else None
    return out


def _bytes(n: float) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def markdown(data: dict[Target, dict[str, dict | None]]) -> str:
    parts = []
    for target, rows in data.items():
        parts += [f"### {target.problem}: to {target.accuracy:.0%} test accuracy, 4 simulated workers", "",
                  "| algorithm | rounds | allreduces | bytes sent per worker | simulated time (s) | final / best accuracy |",
                  "|---|---|---|---|---|---|"]
        for algorithm, cell in rows.items():
            if cell is None:
                parts.append(f"| {algorithm} | no run in results/ | | | | |")
                continue
            hit = cell["hit"]
            acc = f"{cell['final']:.4f} / {cell['best']:.4f} after {cell['budget']} rounds"
            if hit is None:
                what = f"diverged at round {cell['budget']}" if cell["status"] == "diverged" else "—"
                parts.append(f"| {algorithm} | {what} | — | — | — | {acc} |")
            else:
                parts.append(f"| {algorithm} | {hit['round']} | {hit['comm_rounds']} | {_bytes(hit['bytes_sent'])} | "
                             f"{cell['setup_s'] + hit['time_s']:.1f} | {acc} |")
        parts.append("")
    cost = job_cost(job(next(iter(data)), next(iter(next(iter(data)).algorithms)))) if data else AlphaBeta()
    parts.append("— : not reached within the round budget.  Time is simulated parallel time: each worker's "
                 "measured compute (one core) plus the α-β ring-allreduce model "
                 f"(α = {cost.alpha:g} s, β = {cost.beta:g} B/s), from the start of round 0.  local_sgd's and "
                 "admm's bytes include the full gradient they add to each round's allreduce only to log grad_norm "
                 "(baselines/metrics.py).")
    return "\n".join(parts) + "\n"


def main(results: str | Path = "results", out: str | Path = FIG_DIR) -> list[Path]:
    data = collect(RunIndex(results))
    cells = [c for rows in data.values() for c in rows.values() if c is not None]
    if not cells:
        return []  # no run of the table's: nothing drawn (`common.cli` says so), not a table of dashes
    sizes = {t.problem: {"data": [c["data"] for c in rows.values() if c is not None and c["data"]][:1]}
             for t, rows in data.items()}
    provenance = figure_provenance([c["run_dir"] for c in cells], root=results, data=sizes)
    caption = caption_line("Rounds, allreduces, bytes and simulated time to a target test accuracy, 4 simulated "
                           f"workers; data: {data_caption(sizes) or 'no runs yet'}", provenance)
    return save(None, out, "target_table", markdown(data), caption=caption, provenance=provenance)


if __name__ == "__main__":
    cli(main, __doc__)
