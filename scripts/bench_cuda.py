"""Time per round on a GPU against the CPU: MNIST LeNet-5 (DANE as in its accuracy table), the convex models and a
plain PyTorch loop (parts ``--only``: ``convex``, ``network``, ``baseline``); JSON under ``cuda``; docs/benchmarks.md,
section `cuda`."""
from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch

from scripts.bench_batched import sync
from scripts.harness import (Bench, Run, count, load, matching, mnist_dir, mnist_missing, now, option, over, spread,
                             steady, trained)

KEY = "cuda"
PARTS = ("convex", "network", "baseline")
TABLE = ("algorithm=dane", "problem=mnist_lenet5", "algorithm.eta=1.0", "algorithm.mu=0.0", "algorithm.safeguard=false",
         "problem.inner_steps=null", "tol=null", "quiet=true")
DEVICES = ("cuda", "cpu")
CPU_CUDA = ("cpu", "cuda")  # a ratio's numerator and denominator
NO_GPU = "torch sees no CUDA device"
#: name -> (problem maker in dane.problems, rows N, features d, non-zero fraction of X (1: dense), local solver, λ)
CONVEX_CASES = {
    "ridge_dense_cholesky": ("Ridge", 40_000, 1000, 1.0, "cholesky", 1e-3),
    "logreg_dense_cg": ("LogReg", 20_000, 1000, 1.0, "cg", 1e-3),
    "logreg_sparse_cg": ("LogReg", 100_000, 20_000, 0.002, "cg", 1e-3),
    "ridge_synthetic_cholesky": ("RidgeSyntheticConfig", 100_000, 500, 1.0, "cholesky", 0.005),  # the paper's ridge
}


def network(tmp: Path, rounds: int, repeats: int, workers: list[int], log) -> dict:
    """The table's DANE on each device: ``torchrun`` at np 1 and 2 (``repeats`` times), then the simulator at each
    of ``workers``; each run's median round after round 1 (`steady`), or its failure."""
    runs = []
    for key, m, repeat, device in [*(("np", np, r, d) for r in range(repeats) for d in DEVICES for np in (1, 2)),
                                   *(("workers", m, 0, d) for d in DEVICES for m in workers)]:
        common = [f"rounds={rounds}", f"problem.device={device}"]
        t = (trained(tmp / f"np{m}_{device}_{repeat}", [*TABLE, *common], np=m, launcher="torchrun", timeout=1200)
             if key == "np" else
             trained(tmp / f"workers{m}_{device}_0", ["experiment=table_mnist_lenet5", f"workers={m}", *common,
                                                      "quiet=true"], module="dane.experiments.simulate", timeout=1200))
        row = {"device": device, key: m, **({"repeat": repeat} if key == "np" else {})}
        if "error" in t:
            log(f"{device} {key}={m} failed: {t['error']}")
            runs.append({**row, "status": "launch_failed" if key == "np" else "failed"})
            continue
        s, round_s = t["summary"], statistics.median(steady(t["records"]))
        row.update({"round_s": round_s} if key == "np" else
                   {"wall_round_s": s["wall_time_s"] / s["rounds"], "simulated_round_s": round_s,
                    "clock": s.get("simulated_compute_clock")})
        runs.append({**row, "final_test_accuracy": s.get("final_test_accuracy"), "load_before": t["load_before"],
                     "load_after": t["load_after"]})
        log(f"{device} {key}={m}: {round_s:.3f} s a round")
    launched = [r for r in runs if "np" in r]
    return {"launched": {"runs": launched, **{f"{d}_np{np}_round_s": matching(launched, "round_s", device=d, np=np)
                                              for d in DEVICES for np in (1, 2)}},
            "simulated": {"runs": [r for r in runs if "workers" in r]}}


def convex_data(N: int, d: int, density: float, logistic: bool, seed: int = 0):
    """Gaussian rows (CSR with ``density`` of them non-zero when below 1) and a linear target, or its sign as 0/1."""
    import numpy as np
    import scipy.sparse

    rng = np.random.default_rng(seed)
    if density < 1:  # k = density·d distinct columns per row, drawn row by row (scipy.sparse.random draws its
        k = max(1, round(density * d))  # positions from all N·d at once: minutes at N·d = 2e9)
        cols = np.sort(rng.integers(0, d, (N, k)), axis=1)
        while (repeated := (np.diff(cols, axis=1) == 0).any(axis=1)).any():
            cols[repeated] = np.sort(rng.integers(0, d, (int(repeated.sum()), k)), axis=1)
        X = scipy.sparse.csr_matrix((rng.standard_normal(N * k), cols.ravel(), np.arange(0, N * k + 1, k)),
                                    shape=(N, d))
    else:
        X = rng.standard_normal((N, d))
    z = X @ rng.standard_normal(d)
    return X, ((z > 0).astype(float) if logistic else z + rng.standard_normal(N))


def convex_run(problem, *, workers: int, rounds: int) -> dict:
    """One simulated DANE run (η = 1, μ = 0, no safeguard) of ``problem``: seconds per round and its final iterate."""
    import dane

    before = load()
    result = dane.fit(problem, "dane", workers=workers, rounds=rounds, eta=1.0, mu=0.0, safeguard=False)
    times = [r["time_s"] for r in result.records]
    return {"wall_round_s": result.summary["wall_time_s"] / max(1, len(times) - 1),
            "simulated_round_s": statistics.median(b - a for a, b in zip(times, times[1:])),
            "clock": result.summary.get("simulated_compute_clock"), "final_objective": result.records[-1]["objective"],
            "w": result.w, "load_before": before, "load_after": load()}


def convex(rounds: int, workers: list[int], names: list[str] | None = None, written=None) -> dict:
    """`CONVEX_CASES` (those in ``names``, default all) on CUDA and on the CPU, in the simulator (docs/benchmarks.md,
    section `cuda`); ``written(out)`` after each case, so a run stopped by a time limit keeps the cases it finished."""
    import dane.problems

    out: dict = {"rounds": rounds, "cases": {}}
    for name in names or CONVEX_CASES:
        maker, N, d, density, solver, lam = CONVEX_CASES[name]
        data = () if maker == "RidgeSyntheticConfig" else convex_data(N, d, density, logistic=maker != "Ridge")

        def problem(device):  # the synthetic ridge's rows are made by the workers that hold them
            return (getattr(dane.problems, maker)(*data, lam=lam, local_solver=solver, device=device) if data else
                    dane.problems.RidgeSyntheticConfig(n_samples=N, dim=d, lam=lam, local_solver=solver, device=device))
        for m in workers:
            runs = {device: convex_run(problem(device), workers=m, rounds=rounds) for device in DEVICES}
            w_cuda, w_cpu = runs["cuda"].pop("w"), runs["cpu"].pop("w")
            case = {"N": N, "d": d, "density": density, "local_solver": solver, "lam": lam, "workers": m, **runs,
                    "iterate_rel_diff": float((w_cuda - w_cpu).norm() / w_cpu.norm()),
                    **{f"{key}_cpu_over_cuda": runs["cpu"][key] / runs["cuda"][key]
                       for key in ("wall_round_s", "simulated_round_s")}}
            out["cases"][f"{name}_m{m}"] = case
            if written is not None:
                written(out)
            print(f"convex {name} m={m}: wall s/round cuda {runs['cuda']['wall_round_s']:.4f} cpu "
                  f"{runs['cpu']['wall_round_s']:.4f}, iterate rel diff {case['iterate_rel_diff']:.2e}", flush=True)
    return out


def baseline_config(device: str, dataset: str = "mnist", data_dir: str | None = None, batch_size: int = 100):
    """The table's problem (conf/problem/mnist_lenet5.yaml: LeNet-5, SGD lr 0.05 momentum 0.9, batch 100, one pass
    a round, chunks of 1000, float32) on ``device``; ``dataset="digits"`` (32 x 32) for a test without MNIST."""
    from dane.problems.neural import DataConfig, ModelConfig, NeuralProblemConfig

    data = DataConfig(dataset=dataset, data_dir=data_dir if data_dir is not None else str(mnist_dir().parent),
                      image_size=32 if dataset == "digits" else None)
    return NeuralProblemConfig(data=data, model=ModelConfig("lenet5"), inner_lr=0.05, inner_steps=None,
                               inner_batch_size=batch_size, inner_momentum=0.9, device=device, dtype="float32")


def dane_rounds(problem, rounds: int) -> tuple[list[float], torch.Tensor]:
    """`timed_rounds` of one worker's DANE (η = 1, μ = 0, no safeguard), and the final iterate."""
    from dane.comm.local import LocalCommunicator
    from dane.dane import DANE

    algorithm = DANE(problem, LocalCommunicator(), eta=1.0, mu=0.0, safeguard=False)
    return timed_rounds(algorithm.step, problem.device, rounds), algorithm.w


def timed_rounds(step, device: torch.device, rounds: int) -> list[float]:
    """Wall seconds of each of ``rounds`` calls of ``step`` after a first, untimed one (the first kernels'
    start-up), the device synchronized around each."""
    step()
    times = []
    for _ in range(rounds):
        sync(device)
        start = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - start)
    return times


def plain_rounds(problem, rounds: int, seed: int) -> tuple[list[float], torch.Tensor]:
    """The same work as `dane_rounds` as a plain PyTorch loop on ``problem``'s model, rows and device: per round the
    full gradient (chunks of ``eval_batch_size``), the test loss and accuracy, and one pass of SGD (a fresh
    optimizer, as each local solve makes) over the minibatches DANE's sampler draws (its seed, drawn the same
    way, the epoch's permutation moved to the device once); one host transfer a round, for the metrics.  At
    m = 1, η = 1, μ = 0 DANE's correction term is zero, so the iterates are DANE's (tests/test_bench.py)."""
    import torch.nn.functional as F

    model, device, inner = problem.model, problem.device, problem.inner
    X, y, test_x, test_y = problem.train_x, problem.train_y, problem.test_x, problem.test_y
    n, b, chunk = len(y), inner.batch_size, problem.eval_batch_size
    generator = torch.Generator().manual_seed(seed)
    perm, pos = torch.randperm(n, generator=generator).to(device), 0

    def one_round() -> list[float]:
        nonlocal perm, pos
        model.zero_grad(set_to_none=True)
        total = torch.zeros((), dtype=X.dtype, device=device)
        for start in range(0, n, chunk):  # the full gradient
            loss = (1.0 / n) * F.cross_entropy(model(X[start:start + chunk]), y[start:start + chunk], reduction="sum")
            loss.backward()
            total += loss.detach()
        with torch.no_grad():  # the evaluation
            test_loss = torch.zeros((), dtype=torch.float64, device=device)
            correct = torch.zeros((), dtype=torch.float64, device=device)
            for start in range(0, len(test_y), chunk):
                logits = model(test_x[start:start + chunk])
                test_loss += F.cross_entropy(logits, test_y[start:start + chunk], reduction="sum").double()
                correct += (logits.argmax(1) == test_y[start:start + chunk]).sum().double()
        optimizer = torch.optim.SGD(model.parameters(), lr=inner.lr, momentum=inner.momentum)
        for _ in range(max(1, n // b)):  # one pass of SGD
            if pos + b > n:
                perm, pos = torch.randperm(n, generator=generator).to(device), 0
            rows = perm[pos:pos + b]
            pos += b
            optimizer.zero_grad(set_to_none=True)
            ((1.0 / b) * F.cross_entropy(model(X[rows]), y[rows], reduction="sum")).backward()
            optimizer.step()
        return torch.stack([total.double(), test_loss, correct]).tolist()

    times = timed_rounds(one_round, device, rounds)
    return times, torch.nn.utils.parameters_to_vector(model.parameters()).detach().cpu()


def baseline(rounds: int, devices: list[str], config=None, repeats: int = 2) -> dict:
    """Issue 35 item 5, the GPU's own baseline: one worker's DANE round of the MNIST LeNet-5 table against
    `plain_rounds` on the same device, interleaved (DANE, plain, DANE, plain ...: the same load for both);
    ``dane_round_over_plain_loop`` = median DANE round / median plain round (goal <= 1.3 on CUDA)."""
    from dane.numerics.inner import worker_seed
    from dane.problems.neural import SAMPLER_STREAM

    out: dict = {"rounds": rounds}
    for device in devices:
        cfg = config(device) if config is not None else baseline_config(device)
        with cfg.numerics():
            before = load()
            dane_times, plain_times, iterates = [], [], {}
            for _ in range(repeats):
                times, iterates["dane"] = dane_rounds(cfg.build(0, 1), rounds)
                dane_times += times
                times, iterates["plain"] = plain_rounds(cfg.build(0, 1), rounds, worker_seed(cfg.seed, 0, SAMPLER_STREAM))
                plain_times += times
        dane_s, plain_s = statistics.median(dane_times), statistics.median(plain_times)
        diff = float((iterates["dane"] - iterates["plain"]).norm() / iterates["plain"].norm())
        out[device] = {"dane_round_s": spread(dane_times), "plain_loop_round_s": spread(plain_times),
                       "dane_round_over_plain_loop": dane_s / plain_s, "iterate_rel_diff": diff,
                       "goal": 1.3, "goal_met": dane_s / plain_s <= 1.3 if device == "cuda" else None,
                       "load_before": before, "load_after": load()}
        print(f"baseline {device}: DANE round {dane_s:.4f} s, plain loop {plain_s:.4f} s, ratio "
              f"{dane_s / plain_s:.3f}, iterate rel diff {diff:.1e}", flush=True)
    return out


def ratios(result: dict) -> dict:
    """CPU over CUDA time per round, launched and simulated; the simulator's m = 1 against the launched np = 1."""
    launched, simulated = result["launched"]["runs"], result["simulated"]["runs"]
    out = {f"launched_np{np}_cpu_over_cuda": over(*(matching(launched, "round_s", device=d, np=np) for d in CPU_CUDA))
           for np in (1, 2)}
    out.update({f"simulated_m{m}_wall_cpu_over_cuda":
                over(*(matching(simulated, "wall_round_s", device=d, workers=m) for d in CPU_CUDA))
                for m in sorted({r["workers"] for r in simulated})})
    out.update({f"sim_vs_launched_np1_{d}": over(matching(simulated, "simulated_round_s", device=d, workers=1),
                                                 matching(launched, "round_s", device=d, np=1)) for d in DEVICES})
    return out


def run(bench: Run) -> dict:
    args, gpu = bench.args, torch.cuda.is_available()
    devices = args.baseline_devices or ["cuda" if gpu else "cpu"]
    earlier = {k: v for k, v in bench.earlier.items() if k != "skipped"} if args.only else {}  # the other parts
    result: dict = {**earlier, "started_at": now(), "machine": bench.machine, "load_before": load(),
                    "rounds": args.rounds, "overrides": " ".join(TABLE),
                    **({"gpu": torch.cuda.get_device_name(0)} if gpu else {})}
    parts = args.only or PARTS
    if "convex" in parts:
        result["convex"] = {"skipped": NO_GPU} if not gpu else convex(
            args.rounds, args.convex_workers, args.convex_cases,
            written=lambda partial: bench.save({**result, "convex": partial}))
    if "network" in parts:
        if not gpu or mnist_missing():
            result["skipped"] = mnist_missing() if gpu else NO_GPU
        else:
            with tempfile.TemporaryDirectory() as tmp:
                result.update(network(Path(tmp), args.rounds, args.repeats, args.workers, bench.log))
            result["ratios"] = ratios(result)
    if "baseline" in parts and (args.only or "skipped" not in result):  # a whole run: where the network part ran
        why = mnist_missing() or ("cuda" in devices and not gpu and f"{NO_GPU}; --baseline-devices cpu times the CPU")
        result["baseline"] = {"skipped": why} if why else baseline(args.rounds, devices)
    result.update(finished_at=now(), load_after=load(), torch=torch.__version__)
    bench.log(f"cuda: {result.get('skipped') or result.get('ratios', 'written')}")
    return bench.finish(result)


BENCH = Bench(KEY, run, "MNIST LeNet-5 and convex rounds on problem.device=cuda against cpu", threads=None, only=PARTS,
              options=(
                  option("--rounds", type=count, default=6), option("--repeats", type=count, default=2),
                  option("--workers", type=count, nargs="+", default=[1, 2, 4, 8]),
                  option("--convex-workers", type=count, nargs="+", default=[1, 8]),
                  option("--baseline-devices", nargs="+", choices=DEVICES, default=None,
                         help="devices of the baseline comparison (default: cuda where there is one, else cpu)"),
                  option("--convex-cases", nargs="+", choices=sorted(CONVEX_CASES), default=None,
                         help="these convex cases only (default: all)")))
