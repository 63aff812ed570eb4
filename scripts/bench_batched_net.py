"""m LeNet-5 workers as one stacked computation against one thread each (issue 35 item 4): JSON section
``batched_net``, rows ``roofline``, ``speedup`` and ``cuda`` of `scripts.harness.grid` (skipped without MNIST);
docs/benchmarks.md, section `batched_net`."""
from __future__ import annotations

from functools import partial

import torch

from dane.experiments.config import run_spec
from dane.problems.stacked_net import ENGINES, default_engine
from dane.synthetic.sweep import compose_job
from scripts.bench_batched import gpu
from scripts.harness import (SKIP_WITHOUT_DATA, Bench, best_of, counts, grid, interleave, load, mnist_missing, paired,
                             spread, timed_run)

LR = 0.05


def overrides(workers: int, local_steps: int, batch_size: int, rounds: int, batched: str, device: str) -> tuple:
    return ("algorithm=local_sgd", "problem=mnist_lenet5", f"workers={workers}", f"algorithm.local_steps={local_steps}",
            f"algorithm.batch_size={batch_size}", f"algorithm.lr={LR}", f"rounds={rounds}", "tol=null",
            "quiet=true", f"sim.batched={batched}", f"problem.device={device}")


def speedup(workers: int, local_steps: int, batch_size: int, rounds: int, repeats: int, log) -> dict:
    """Per-worker over batched on the CPU, `paired` runs."""
    jobs = tuple(overrides(workers, local_steps, batch_size, rounds, batched, "cpu") for batched in ("false", "true"))
    return {"workers": workers, "local_steps": local_steps, "batch_size": batch_size, "rounds": rounds, "lr": LR,
            "problem": "mnist_lenet5 (float32)", "algorithm": "local_sgd (mean)", "goal": ">= 5",
            **paired(jobs, repeats, log)}


def layer_flops(model: torch.nn.Module, in_shape: tuple) -> dict:
    """Forward and backward FLOPs of one image through ``model``'s Conv2d and Linear layers."""
    macs: list[int] = []

    def count(module, inputs, output):
        if isinstance(module, torch.nn.Conv2d):
            macs.append(output[0].numel() * module.in_channels // module.groups * module.kernel_size[0]
                        * module.kernel_size[1])
        elif isinstance(module, torch.nn.Linear):
            macs.append(module.in_features * module.out_features)

    hooks = [mod.register_forward_hook(count) for mod in model.modules()]
    try:
        with torch.no_grad():
            model(torch.zeros(1, *in_shape, dtype=next(model.parameters()).dtype))
    finally:
        for hook in hooks:
            hook.remove()
    forward = 2 * sum(macs)
    backward = 2 * sum(macs) + 2 * sum(macs[1:])  # weight gradients; input gradients but the first layer's
    return {"layer_macs": macs, "forward": forward, "backward": backward, "total": forward + backward}


def best_time(fn, repeats: int) -> float:
    """The shortest of ``repeats`` timed calls after one warm-up."""
    fn()
    return best_of(fn, repeats)


def gemm_gflops(n_threads: int, size: int = 2048, repeats: int = 3) -> float:
    """float32 ``torch.mm`` of two size x size matrices on ``n_threads`` threads: GFLOP/s."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    saved = torch.get_num_threads()
    torch.set_num_threads(n_threads)
    try:
        return 2 * size ** 3 / best_time(lambda: torch.mm(a, b), repeats) / 1e9
    finally:
        torch.set_num_threads(saved)


def roofline(workers: int, batch_size: int, repeats: int) -> dict:
    """The per-worker and stacked minibatch steps' GFLOP/s against the GEMM rate; the stacked step by each engine of
    `StackedNeuralProblem`, interleaved with ``workers`` per-worker steps, best of ``repeats + 1``."""
    job = (*overrides(workers, 1, batch_size, 1, "true", "cpu"), f"problem.inner_batch_size={batch_size}")
    config = run_spec(compose_job(job)).problem  # the problem's sampler draws the local loop's batches
    one, stacked = config.build(0, workers), config.build_stacked(workers)
    flops = layer_flops(one.model, tuple(one.train_x.shape[1:]))
    step_flops, w, W = flops["total"] * batch_size, one.initial_point(), stacked.initial_point()

    def step_s(variant: str, repeat: int) -> float:
        if variant == "per_worker":  # m steps in a row, as long as the stacked step: the load disturbs both alike
            return best_time(lambda: [one.batch_grad(w, one.sampler.next()) for _ in range(workers)], 1) / workers
        stacked.engine = variant
        return best_time(lambda: stacked.batch_grad(W, stacked.sampler.next()), 1)

    with config.numerics():  # one intra-op thread, as each simulated worker and the batched path run
        best = {variant: min(times) for variant, times in interleave(["per_worker", *ENGINES], repeats + 1,
                                                                     step_s).items()}
    gemm, one_s = {n: gemm_gflops(n) for n in (1, 2)}, best["per_worker"]
    per_worker = step_flops / one_s / 1e9
    return {"flops_per_image": flops, "batch_size": batch_size, "workers": workers, "dtype": str(one.dtype),
            "per_worker_step_s": one_s, "per_worker_gflops": per_worker,
            "stacked": {engine: {"step_s": best[engine], "gflops": workers * step_flops / best[engine] / 1e9,
                                 "over_per_worker": workers * one_s / best[engine]} for engine in ENGINES},
            "stacked_default_engine": default_engine(stacked.device),
            "gemm_gflops_1_thread": gemm[1], "gemm_gflops_2_threads": gemm[2],
            "cpu_ceiling": gemm[1] / per_worker, "load_avg": load()}


def cuda_round(workers: int, local_steps: int, batch_size: int, rounds: int, repeats: int, log,
               device: str = "cuda") -> dict:
    """A round of the batched path's ``workers`` LeNet-5 workers against one worker's, a `spread` over ``repeats``
    runs after a warm-up each; ``device``: another than CUDA, to check this code where there is no GPU."""
    def round_s(m: int, batched: str, repeat: int) -> float:
        if repeat == 0:
            timed_run(*overrides(m, local_steps, batch_size, 1, batched, device))  # warm-up: CUDA context, kernels
        run = timed_run(*overrides(m, local_steps, batch_size, rounds, batched, device))
        log(f"{device} m={m} ({run['path']}): {run['rounds_s'] / rounds:.4f} s a round")
        return run["rounds_s"] / rounds

    runs = interleave([(1, "false"), (workers, "true")], repeats, lambda variant, r: round_s(*variant, r))
    one, many = spread(runs[(1, "false")]), spread(runs[(workers, "true")])
    return {"device": device, **gpu(device), "workers": workers, "local_steps": local_steps, "batch_size": batch_size,
            "rounds": rounds, "lr": LR, "one_worker_round_s": one, "batched_round_s": many,
            "ratio": many["median"] / one["median"], "goal": "<= 2"}


def cells(run) -> dict:
    args, log = run.args, run.log
    if args.quick:
        args.workers, args.local_steps, args.rounds, args.repeats = 8, 2, 1, 1
    shape = (args.workers, args.local_steps, args.batch_size, args.rounds, args.repeats, log)
    return {"roofline": partial(roofline, args.workers, args.batch_size, args.repeats),
            "speedup": partial(speedup, *shape), "cuda": partial(cuda_round, *shape)}


def skipped(args) -> str | None:
    if "cuda" in (args.only or ()) and not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return mnist_missing()


BENCH = Bench("batched_net", grid(cells, skip=skipped, optional=("cuda",)),
              "MNIST LeNet-5 at m = 64: the per-worker path against the stacked one, and its roofline", threads=None,
              only=("roofline", "speedup", "cuda"), resumable=True, options=(
                  *counts(workers=64, local_steps=10, batch_size=32, rounds=2, repeats=2), SKIP_WITHOUT_DATA))
