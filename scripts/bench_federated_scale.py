"""dane's FedAvg beside Flower's, pfl's and a plain NumPy loop on one workload at 100 to 100,000 clients (issue 48):
section ``federated_scale`` of results/bench.json; docs/benchmarks.md, section `federated_scale`."""
from __future__ import annotations

import fnmatch
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

import numpy as np

from scripts.harness import Bench, Run, amount, count, data_dir, launched, option

ROOT = Path(__file__).resolve().parents[1]
PEERS = ROOT / "scripts" / "peers"
LAM, LOCAL_STEPS = 1e-3, 10
#: setting -> (the LIBSVM file under data_dir, or (rows, features) of a seeded Gaussian table; clients; per round)
SETTINGS = {"phishing_100": ("phishing", 100, 100), "phishing_1000": ("phishing", 1_000, 100),
            "synthetic_10k": ((200_000, 50), 10_000, 1_000), "synthetic_100k": ((2_000_000, 50), 100_000, 1_000)}
QUICK = ("phishing_100", "phishing_1000")
#: peer -> (requirement, pinned versions, the distribution that says it is installed, what else it needs)
PINS = {"flower": ("flwr[simulation]", "1.42.*", "flwr", ()), "pfl": ("pfl", "0.6.*", "pfl", ("torch",))}
FRAMEWORKS = ("dane", "flower", "pfl", "numpy")
#: the objectives' agreement with the NumPy loop's: full participation, sampled clients, and pfl's float32 updates
AGREE = {"full": 1e-10, "sampled": 3e-3, "float32": 1e-6}


def write_shards(name: str, folder: Path, seed: int) -> tuple[Path, dict]:
    """Setting ``name``'s table and its clients (LIBSVM: a seeded permutation dealt round robin; Gaussian: X ~ N(0, I),
    y ~ Bernoulli(σ(xᵀw♮)), w♮ ~ N(0, I/d), N/m consecutive rows a client), and the step."""
    table, m, per_round = SETTINGS[name]
    rng = np.random.default_rng(seed)
    if isinstance(table, str):
        from sklearn.datasets import load_svmlight_file

        X, y = load_svmlight_file(str(data_dir() / "libsvm" / table))
        X, y = X.toarray(), (y == y.max()).astype(np.float64)
        client = rng.permutation(len(y)) % m
    else:
        X = rng.standard_normal(table)
        y = (rng.random(table[0]) < 1 / (1 + np.exp(-X @ rng.standard_normal(table[1]) / np.sqrt(table[1])))) * 1.0
        client = np.arange(table[0]) // (table[0] // m)
    shards = folder / f"{name}.npz"
    np.savez(shards, X=X, y=y, client=client)
    frobenius = np.bincount(client, weights=np.einsum("ij,ij->i", X, X), minlength=m)
    lr = float(1 / (m / len(y) * frobenius.max() / 4 + LAM))
    return shards, {"table": str(table), "rows": X.shape[0], "features": X.shape[1], "clients": m,
                    "per_round": per_round, "lr": lr, "lam": LAM, "local_steps": LOCAL_STEPS}


def command(framework: str, python: str, shards: Path, setting: dict, rounds: int, args, out: Path) -> list[str]:
    """The launch of ``framework`` on the shards: dane's ``algorithm=fedavg`` into ``out``, else a peer's script."""
    m, s, lr = setting["clients"], setting["per_round"], repr(setting["lr"])
    if framework != "dane":
        return [python, str(PEERS / f"{framework}_fedavg.py"), "--shards", str(shards), "--rounds", str(rounds),
                "--per-round", str(s), "--lr", lr, "--local-steps", str(LOCAL_STEPS), "--lam", str(LAM),
                "--seed", str(args.seed)]
    return [sys.executable, "-m", "dane.experiments.train", "problem=logreg", f"problem.device={args.device}",
            "data=npz", f"data.path={shards}", "data.sharding=column", "data.client_column=client", f"workers={m}",
            "algorithm=fedavg", f"algorithm.lr={lr}", f"algorithm.local_steps={LOCAL_STEPS}", "algorithm.adapt=[]",
            f"algorithm.clients_per_round={s if s < m else 'null'}", f"problem.lam={LAM}",
            "problem.fit_intercept=false", f"rounds={rounds}", "tol=null", "diverge_after=null", "progress=table",
            f"seed={args.seed}", f"out_dir={out}"]


def dane_rounds(lines: list, out: Path) -> dict:
    """dane's rounds from its progress lines (stamped as they arrive) and its summary: round k's line comes during
    round k + 1 and the last after the final evaluation alone, so the last interval (no whole round) is left out."""
    stamps = [t for t, line in lines if re.match(r"\s*\d+\s+\S+\s+\S+B\s", line)]
    summary = json.loads((out / "summary.json").read_text())
    return {"round_s": [b - a for a, b in zip(stamps, stamps[1:])][:-1], "objective": summary["final_objective"],
            "rounds_s": summary["wall_time_s"], "path": summary.get("simulator_path")}


def one_run(framework: str, python: str, shards: Path, setting: dict, rounds: int, args, folder: Path) -> dict:
    """One launch of ``framework`` on the shards: the launch's record and its rounds (``error`` where it failed)."""
    out = folder / f"dane_{setting['clients']}_{rounds}_{time.time_ns()}"
    env = {"PYTHONPATH": str(ROOT if framework == "dane" else PEERS)}
    run = launched(command(framework, python, shards, setting, rounds, args, out), args.timeout, env)
    lines = run.pop("lines")
    try:
        answer = dane_rounds(lines, out) if framework == "dane" else \
            json.loads(next(line for _, line in reversed(lines) if line.startswith('{"framework"')))
        seconds = answer.pop("round_s")
        steady = seconds[1:] or seconds  # round 1 apart: a framework's lazy start (Ray's workers) falls there
        run.update({k: v for k, v in answer.items() if k != "finished_at"}, round_seconds=seconds,
                   first_round_s=seconds[0], round_s=statistics.median(steady), round_s_min=min(steady),
                   round_s_max=max(steady), rounds=rounds, timed_rounds=len(seconds))
        run.setdefault("rounds_s", sum(seconds))
    except (OSError, ValueError, IndexError, KeyError, StopIteration, statistics.StatisticsError):
        run["error"] = [line for _, line in lines[-5:]]
        print(f"{framework} failed: {run['error'][-1:]}", flush=True)
    return run


def peers(log) -> tuple[str, dict]:
    """The peers' interpreter (a venv of their own, made where absent) and per peer its version (installed where
    absent: pinned, else the newest) or why it is skipped."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    venv = Path(os.environ.get("DANE_PEERS_VENV") or Path.home() / ".cache" / "dane" / f"peers-{version}")
    python = str(venv / "bin" / "python")
    if not Path(python).exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True)

    def installed(names: list[str]) -> list[str] | None:
        ask = subprocess.run([python, "-c", f"import importlib.metadata as m; print(*map(m.version, {names}))"],
                             capture_output=True, text=True)
        return ask.stdout.split() if ask.returncode == 0 else None

    found = {}
    for name, (requirement, pin, distribution, extra) in PINS.items():
        # what else it needs at this environment's version (pfl's torch: its CPU wheel where one is in reach)
        extra_pins = [f"{other}=={metadata.version(other).split('+')[0]}" for other in extra]
        versions, why = installed([distribution, *extra]), "not installed"
        for spec in ([f"{requirement}=={pin}", *extra_pins], [requirement, *extra_pins]):
            if versions:
                break
            log(f"installing {' '.join(spec)} into {venv}")
            pip = subprocess.run([python, "-m", "pip", "install", "-q", *spec], capture_output=True, text=True)
            why = f"pip install {' '.join(spec)}: " + (pip.stderr.strip().splitlines() or ["no output"])[-1]
            versions = installed([distribution, *extra])
        found[name] = ({"version": versions[0], "pinned": fnmatch.fnmatch(versions[0], pin), "with": versions[1:]}
                       if versions else {"skipped": why})
    return python, found


def framework_row(runs: list[dict], version: str) -> dict:
    """The runs' median round (median of their medians), the fastest and slowest round, the largest peak."""
    done = [r for r in runs if "round_s" in r]
    row = {"version": version, "runs": runs, "finished": len(done) == len(runs)}
    if done:
        row.update(round_s=statistics.median(r["round_s"] for r in done), objective=done[0]["objective"],
                   round_s_min=min(r["round_s_min"] for r in done), round_s_max=max(r["round_s_max"] for r in done),
                   rounds_s=statistics.median(r["rounds_s"] for r in done),
                   peak_gib=max(max(r["peak_tree_gib"], r["peak_rss_gib"] or 0.0) for r in done))
    return row


def agreement(frameworks: dict, full: bool) -> dict:
    """Each framework's final objective against the NumPy loop's: |O − O_numpy| / |O_numpy| within its tolerance."""
    reference = frameworks.get("numpy", {}).get("objective")
    out = {}
    for name, row in frameworks.items():
        if "objective" in row and reference is not None and name != "numpy":
            tol = AGREE["float32" if full and name == "pfl" else "full" if full else "sampled"]
            diff = abs(row["objective"] - reference) / abs(reference)
            out[name] = {"rel_diff": diff, "tol": tol, "agree": diff <= tol}
    return out


def goals(settings: dict, rounds: int) -> list[dict]:
    """Per setting dane's s/round over pfl's and the NumPy loop's; at 100,000 clients its seconds and memory too."""
    rows = []
    for name, setting in settings.items():
        frameworks, memory = setting["frameworks"], setting.get("dane_memory_vs_rounds", {})
        dane = frameworks.get("dane", {})
        ratio = {peer: dane["round_s"] / frameworks[peer]["round_s"] for peer in ("pfl", "numpy")
                 if "round_s" in dane and "round_s" in frameworks.get(peer, {})}
        targets = [("dane's s/round over pfl's", ratio.get("pfl"), 0.5),
                   ("dane's s/round over numpy's", ratio.get("numpy"), 5.0)]
        if name == "synthetic_100k":
            targets += [(f"dane's {rounds} rounds (s)", dane.get("rounds_s"), 2.0 * rounds),
                        ("dane's peak memory (GiB)", dane.get("peak_gib"), 4.0),
                        ("dane's peak over its peak at a third of the rounds", memory.get("ratio"), 1.05)]
        rows += [{"setting": name, "goal": goal, "value": value, "target": target,
                  "met": value is not None and value <= target} for goal, value, target in targets]
    return rows


def misses(section: dict) -> list[str]:
    """A line per goal not met (or not measured) and per objective that does not agree."""
    return [f"{g['setting']}: {g['goal']}: {g['value']} (goal {g['target']})" for g in section["goals"]
            if not g["met"]] + [f"{name}: {f} objective off by {a['rel_diff']:.2g} (tolerance {a['tol']})"
                                for name, s in section["settings"].items() for f, a in s["agreement"].items()
                                if not a["agree"]]


def run(bench: Run) -> None:
    """Per setting: its shards written once, each framework launched ``--repeats`` times on them; then the goals."""
    args = bench.args
    names = args.only or (QUICK if args.quick else tuple(SETTINGS))
    rounds = args.rounds or (5 if args.quick else 30)
    python, found = peers(bench.log)
    skipped = {name: f"{name}: skipped: {p['skipped']}" for name, p in found.items() if "skipped" in p}
    for line in skipped.values():
        print(line, flush=True)
    from dane.records.provenance import code_version

    versions = {"dane": code_version()["git_commit"], "numpy": np.__version__,
                **{name: p.get("version") for name, p in found.items()}}
    section = {**bench.header(), "quick": args.quick, "rounds": rounds, "seed": args.seed, "dane_device": args.device,
               "workload": "FedAvg, 10 full-batch local gradient steps, logistic regression + (1e-3/2)|w|^2, float64",
               "peers": found, "skipped": list(skipped.values()), "settings": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            try:
                shards, setting = write_shards(name, Path(tmp), args.seed)
            except FileNotFoundError as exc:  # no LIBSVM file: the setting is a line
                section["skipped"].append(f"{name}: skipped: {exc} (set DANE_DATA_DIR to the folder of libsvm/)")
                bench.log(section["skipped"][-1])
                continue
            repeats = (args.repeats or (1 if args.quick else 3)) if setting["rows"] < 100_000 else 1
            frameworks = {}
            for framework in (f for f in FRAMEWORKS if f not in skipped):
                runs = [one_run(framework, python if framework in PINS else sys.executable, shards, setting, rounds,
                                args, Path(tmp)) for _ in range(repeats)]
                frameworks[framework] = row = framework_row(runs, versions[framework])
                bench.log(f"{name} {framework}: {row.get('round_s')} s/round, objective {row.get('objective')}")
            setting.update(frameworks=frameworks, repeats=repeats,
                           agreement=agreement(frameworks, setting["per_round"] >= setting["clients"]))
            dane = frameworks["dane"]
            if name == "synthetic_100k" and "peak_gib" in dane:  # is dane's peak independent of the rounds?
                third = framework_row([one_run("dane", sys.executable, shards, setting, max(1, rounds // 3), args,
                                                Path(tmp))], "")
                if "peak_gib" in third:
                    setting["dane_memory_vs_rounds"] = {"rounds": [rounds // 3, rounds],
                                                        "peak_gib": [third["peak_gib"], dane["peak_gib"]],
                                                        "ratio": dane["peak_gib"] / third["peak_gib"]}
            shards.unlink()
            section["settings"][name] = setting
            bench.save(section)
    section["goals"] = goals(section["settings"], rounds)
    section["misses"] = misses(section)
    bench.finish(section)
    bench.log(f"done -> {bench.path}")


BENCH = Bench("federated_scale", run,
              "dane's FedAvg beside Flower, pfl and a NumPy loop at 100 to 100,000 clients (issue 48)",
              threads=None, only=tuple(SETTINGS), options=(
                  option("--rounds", type=count, default=None, help="rounds a run (default 30; --quick: 5)"),
                  option("--repeats", type=count, default=None,
                         help="launches per framework on tables under 100,000 rows (default 3; --quick: 1)"),
                  option("--timeout", type=amount, default=900, help="seconds per launch"),
                  option("--seed", type=int, default=0, help="the tables', the clients' and the samplers' seed"),
                  option("--device", default="cpu", choices=("cpu", "cuda"),
                         help="dane's problem.device (the peers run as scripts/peers/ has them)")))
