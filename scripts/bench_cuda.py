"""Time per round on a GPU against the CPU: MNIST LeNet-5 (DANE as in its accuracy table), the convex models and a
plain PyTorch loop (parts ``--only``: ``convex``, ``network``, ``baseline``); JSON under ``cuda``; docs/benchmarks.md,
section `cuda`."""
from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import torch

from scripts.bench_batched import gpu, rel_diff
from scripts.harness import (Bench, Run, count, data_dir, load, matching, mnist_missing, now, option, over, spread,
                             steady, timer, trained)

PARTS = ("convex", "network", "baseline")
TABLE = ("algorithm=dane", "problem=mnist_lenet5", "algorithm.eta=1.0", "algorithm.mu=0.0", "algorithm.safeguard=false",
         "problem.inner_steps=null", "tol=null", "quiet=true")
DEVICES = ("cuda", "cpu")
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
        common, launched = [f"rounds={rounds}", f"problem.device={device}"], key == "np"
        t = (trained(tmp / f"np{m}_{device}_{repeat}", [*TABLE, *common], np=m, launcher="torchrun", timeout=1200)
             if launched else
             trained(tmp / f"workers{m}_{device}_0", ["experiment=table_mnist_lenet5", f"workers={m}", *common,
                                                      "quiet=true"], module="dane.experiments.simulate", timeout=1200))
        row = {"device": device, key: m, **({"repeat": repeat} if launched else {})}
        if "error" in t:
            log(f"{device} {key}={m} failed: {t['error']}")
            runs.append({**row, "status": "launch_failed" if launched else "failed"})
            continue
        s, round_s = t["summary"], statistics.median(steady(t["records"]))
        runs.append({**row, **({"round_s": round_s} if launched else
                               {"wall_round_s": s["wall_time_s"] / s["rounds"], "simulated_round_s": round_s,
                                "clock": s.get("simulated_compute_clock")}),
                     "final_test_accuracy": s.get("final_test_accuracy"), "load_before": t["load_before"],
                     "load_after": t["load_after"]})
        log(f"{device} {key}={m}: {round_s:.3f} s a round")
    launched = [r for r in runs if "np" in r]
    return {"launched": {"runs": launched, **{f"{d}_np{np}_round_s": matching(launched, "round_s", device=d, np=np)
                                              for d in DEVICES for np in (1, 2)}},
            "simulated": {"runs": [r for r in runs if "workers" in r]}}


def ratios(result: dict) -> dict:
    """CPU over CUDA time per round, launched and simulated; the simulator's m = 1 against the launched np = 1."""
    launched, simulated = result["launched"]["runs"], result["simulated"]["runs"]

    def cpu_over_cuda(runs: list[dict], key: str, **match) -> float | None:
        return over(*(matching(runs, key, device=d, **match) for d in ("cpu", "cuda")))

    return {**{f"launched_np{np}_cpu_over_cuda": cpu_over_cuda(launched, "round_s", np=np) for np in (1, 2)},
            **{f"simulated_m{m}_wall_cpu_over_cuda": cpu_over_cuda(simulated, "wall_round_s", workers=m)
               for m in sorted({r["workers"] for r in simulated})},
            **{f"sim_vs_launched_np1_{d}": over(matching(simulated, "simulated_round_s", device=d, workers=1),
                                                matching(launched, "round_s", device=d, np=1)) for d in DEVICES}}


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


def convex(rounds: int, workers: list[int], names: list[str] | None, written) -> dict:
    """`CONVEX_CASES` (those in ``names``, default all) on CUDA and on the CPU, in the simulator; ``written(out)``
    after each case, so a run stopped by a time limit keeps the cases it finished."""
    import dane.problems

    out: dict = {"rounds": rounds, "cases": {}}
    for name in names or CONVEX_CASES:
        maker, N, d, density, solver, lam = CONVEX_CASES[name]
        synthetic = maker == "RidgeSyntheticConfig"  # its rows are made by the workers that hold them
        data = () if synthetic else convex_data(N, d, density, logistic=maker == "LogReg")
        sizes = {"n_samples": N, "dim": d} if synthetic else {}
        for m in workers:
            runs = {device: convex_run(getattr(dane.problems, maker)(*data, **sizes, lam=lam, local_solver=solver,
                                                                     device=device), workers=m, rounds=rounds)
                    for device in DEVICES}
            w_cuda, w_cpu = runs["cuda"].pop("w"), runs["cpu"].pop("w")
            out["cases"][f"{name}_m{m}"] = case = {
                "N": N, "d": d, "density": density, "local_solver": solver, "lam": lam, "workers": m, **runs,
                "iterate_rel_diff": rel_diff(w_cuda, w_cpu),
                **{f"{key}_cpu_over_cuda": runs["cpu"][key] / runs["cuda"][key]
                   for key in ("wall_round_s", "simulated_round_s")}}
            written(out)
            print(f"convex {name} m={m}: wall s/round cuda {runs['cuda']['wall_round_s']:.4f} cpu "
                  f"{runs['cpu']['wall_round_s']:.4f}, iterate rel diff {case['iterate_rel_diff']:.2e}", flush=True)
    return out


def baseline_config(device: str, dataset: str = "mnist"):
    """The table's problem (conf/problem/mnist_lenet5.yaml: LeNet-5, SGD lr 0.05 momentum 0.9, batch 100, one pass
    a round, chunks of 1000, float32) on ``device``; ``dataset="digits"`` (32 x 32) for a test without MNIST."""
    from dane.problems.neural import DataConfig, ModelConfig, NeuralProblemConfig

    data = DataConfig(dataset=dataset, data_dir=str(data_dir()), image_size=32 if dataset == "digits" else None)
    return NeuralProblemConfig(data=data, model=ModelConfig("lenet5"), inner_lr=0.05, inner_steps=None,
                               inner_batch_size=100, inner_momentum=0.9, device=device, dtype="float32")


def timed_rounds(step, device: torch.device, rounds: int) -> list[float]:
    """Wall seconds of each of ``rounds`` calls of ``step`` after a first, untimed one (the first kernels'
    start-up), the device synchronized after each."""
    def synced():
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    synced()
    return [timer(synced) for _ in range(rounds)]


def plain_rounds(problem, rounds: int, seed: int) -> tuple[list[float], torch.Tensor]:
    """One worker's DANE round as a plain PyTorch loop (`timed_rounds`, the final iterate): the full gradient, the
    evaluation and one pass of SGD over the minibatches DANE's sampler draws from ``seed``, one host transfer a round.
    At m = 1, η = 1, μ = 0 DANE's correction term is zero: the iterates are DANE's (tests/test_bench.py)."""
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


def baseline(rounds: int, devices: list[str], config=baseline_config, repeats: int = 2) -> dict:
    """Issue 35 item 5, the GPU's own baseline: one worker's DANE round (η = 1, μ = 0, no safeguard) of the MNIST
    LeNet-5 table against `plain_rounds` on the same device, interleaved (the same load for both);
    ``dane_round_over_plain_loop`` = median DANE round / median plain round (goal <= 1.3 on CUDA)."""
    from dane.comm.local import LocalCommunicator
    from dane.dane import DANE
    from dane.numerics.inner import worker_seed
    from dane.problems.neural import SAMPLER_STREAM

    out: dict = {"rounds": rounds}
    for device in devices:
        cfg = config(device)
        with cfg.numerics():
            before, dane_times, plain_times = load(), [], []
            for _ in range(repeats):
                algorithm = DANE(cfg.build(0, 1), LocalCommunicator(), eta=1.0, mu=0.0, safeguard=False)
                dane_times += timed_rounds(algorithm.step, algorithm.problem.device, rounds)
                times, plain_w = plain_rounds(cfg.build(0, 1), rounds, worker_seed(cfg.seed, 0, SAMPLER_STREAM))
                plain_times += times
        dane_s, plain_s = statistics.median(dane_times), statistics.median(plain_times)
        diff = rel_diff(algorithm.w, plain_w)
        out[device] = {"dane_round_s": spread(dane_times), "plain_loop_round_s": spread(plain_times),
                       "dane_round_over_plain_loop": dane_s / plain_s, "iterate_rel_diff": diff,
                       "goal": 1.3, "goal_met": dane_s / plain_s <= 1.3 if device == "cuda" else None,
                       "load_before": before, "load_after": load()}
        print(f"baseline {device}: DANE round {dane_s:.4f} s, plain loop {plain_s:.4f} s, ratio "
              f"{dane_s / plain_s:.3f}, iterate rel diff {diff:.1e}", flush=True)
    return out


def run(bench: Run) -> dict:
    args, has_gpu = bench.args, torch.cuda.is_available()
    earlier = {k: v for k, v in bench.earlier.items() if k != "skipped"} if args.only else {}  # the other parts
    result: dict = {**earlier, "started_at": now(), "machine": bench.machine, "load_before": load(),
                    "rounds": args.rounds, "overrides": " ".join(TABLE), **(gpu("cuda") if has_gpu else {})}
    parts = args.only or PARTS
    if "convex" in parts:
        result["convex"] = {"skipped": NO_GPU} if not has_gpu else convex(
            args.rounds, args.convex_workers, args.convex_cases,
            written=lambda partial: bench.save({**result, "convex": partial}))
    if "network" in parts:
        if why := (NO_GPU if not has_gpu else mnist_missing()):
            result["skipped"] = why
        else:
            with tempfile.TemporaryDirectory() as tmp:
                result.update(network(Path(tmp), args.rounds, args.repeats, args.workers, bench.log))
            result["ratios"] = ratios(result)
    if "baseline" in parts and (args.only or "skipped" not in result):  # a whole run: where the network part ran
        devices = args.baseline_devices or ["cuda" if has_gpu else "cpu"]
        why = mnist_missing() or ("cuda" in devices and not has_gpu
                                  and f"{NO_GPU}; --baseline-devices cpu times the CPU")
        result["baseline"] = {"skipped": why} if why else baseline(args.rounds, devices)
    result.update(finished_at=now(), load_after=load(), torch=torch.__version__)
    bench.log(f"cuda: {result.get('skipped') or result.get('ratios', 'written')}")
    return bench.finish(result)


BENCH = Bench("cuda", run, "MNIST LeNet-5 and convex rounds on problem.device=cuda against cpu", threads=None,
              only=PARTS, options=(
                  option("--rounds", type=count, default=6), option("--repeats", type=count, default=2),
                  option("--workers", type=count, nargs="+", default=[1, 2, 4, 8]),
                  option("--convex-workers", type=count, nargs="+", default=[1, 8]),
                  option("--baseline-devices", nargs="+", choices=DEVICES, default=None,
                         help="devices of the baseline comparison (default: cuda where there is one, else cpu)"),
                  option("--convex-cases", nargs="+", choices=sorted(CONVEX_CASES), default=None,
                         help="these convex cases only (default: all)")))
