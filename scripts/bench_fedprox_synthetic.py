"""The FedProx paper's Synthetic comparison: JSON section ``fedprox_synthetic``, per setting and
method the objective every round (``dane figures fedprox_synthetic`` draws it); docs/benchmarks.md, section
`fedprox_synthetic`."""
from __future__ import annotations

import time

from dane.api import fit
from dane.data.synthetic_source import PAPER_SETS, SyntheticSource
from dane.problems.linear_models import LinearModelConfig
from scripts.harness import Bench, Run, counts, kept, local_work_to, option

KEY = "fedprox_synthetic"
SETTINGS = ("synthetic_iid", "synthetic_0_0", "synthetic_0.5_0.5", "synthetic_1_1")
LOCAL = {"local_steps": 20, "lr": 0.01}  # --local-steps replaces the 20
#: row -> (algorithm, its keys beside LOCAL and the sampling)
METHODS = {"fedavg": ("fedavg", {}), "fedprox": ("fedprox", {"mu": 1.0}),
           "feddane": ("feddane", {"local_solver": "steps"}), "sdane": ("sdane", {"local_solver": "steps"}),
           "scaffold": ("scaffold", {})}
LAM = 1e-3  # the paper's model declares l2_regularizer(0.001) (its TF code never adds it to the loss it minimizes)
INTERCEPT = True  # the paper's model: a dense layer, weights and a bias per class


def one(setting: str, method: str, rounds: int, clients: int, seed: int, local: dict) -> dict:
    """One `dane.api.fit` of ``method`` on the paper's softmax model of ``setting``: its keys, status and objectives,
    and what its rounds cost to the last record: the sampled clients' ``uplink_bytes`` and ``downlink_bytes`` and
    each count of `scripts.harness.LOCAL_WORK` (summed over the clients; a count the records lack left out)."""
    (algorithm, keys), (alpha, beta, iid) = METHODS[method], PAPER_SETS[setting]
    keys = {**local, **keys, "clients_per_round": clients, "paper": True}
    problem = LinearModelConfig(name="softmax", loss="softmax", classes=10, lam=LAM, fit_intercept=INTERCEPT,
                                seed=seed, data=SyntheticSource(alpha=alpha, beta=beta, iid=iid, seed=seed))
    start = time.perf_counter()
    result = fit(problem, algorithm, workers=30, rounds=rounds, seed=seed, **keys)
    objective, last = [float(f"{r['objective']:.8g}") for r in result.records], result.records[-1]
    return {"setting": setting, "method": method, "algorithm": algorithm, "keys": keys, "status": result.status,
            "rounds": last["round"], "objective": objective, "local_passes": last.get("local_passes"),
            **local_work_to(result.records, len(result.records) - 1),
            **{key: last[key] for key in ("uplink_bytes", "downlink_bytes") if last.get(key) is not None},
            "wall_s": round(time.perf_counter() - start, 1)}


def run(bench: Run) -> dict:
    """Each (setting, method) run saved as it ends; the runs of ``--out``'s section that this one does not redo kept."""
    args = bench.args
    rounds, local = 10 if args.quick else args.rounds, {**LOCAL, "local_steps": args.local_steps}
    runs = {f"{r['setting']}/{r['method']}": r for r in kept(bench).get("runs", [])}  # those at the same --quick
    section = {**bench.header(), "quick": args.quick, "workers": 30, "clients_per_round": args.clients,
               "rounds": rounds, "seed": args.seed, "lam": LAM, "fit_intercept": INTERCEPT, "local": local, "runs": []}
    for setting in SETTINGS[-1:] if args.quick else args.settings:
        for method in args.only or list(METHODS):
            bench.log(f"{setting} {method}")
            runs[f"{setting}/{method}"] = {**one(setting, method, rounds, args.clients, args.seed, local),
                                           "code": section["code"]}  # kept runs keep their own
            section["runs"] = list(runs.values())
            bench.save(section)
    return bench.finish(section)


BENCH = Bench(KEY, run, "the FedProx paper's Synthetic(a,b) comparison: FedAvg, FedProx mu=1, FedDANE, S-DANE, "
              "SCAFFOLD, training loss per round", only=tuple(METHODS),
              options=(*counts(rounds=200, clients=10, local_steps=LOCAL["local_steps"]),
                       option("--seed", type=int, default=0),
                       option("--settings", nargs="+", choices=SETTINGS, default=list(SETTINGS))))
