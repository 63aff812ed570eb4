"""``problem.device`` and ``problem.dtype`` of the convex linear models (ridge, logreg, softmax; dense and sparse X).

The device is a parameter: every test runs on the CPU, and those parametrised over `DEVICES` run once more on
CUDA where torch sees a GPU, comparing the GPU's iterates with the CPU's to 1e-10 relative.
"""
from __future__ import annotations

import copy
import functools
import math

import numpy as np
import pytest
import scipy.sparse
import torch

import dane
from dane.errors import ConfigError
from dane.numerics.local_solvers import LocalSolver
from dane.problems import LogReg, Ridge, Softmax
from dane.problems.glm import select_rows, to_torch, transposed_product
from dane.dane import DANEConfig
from tests.helpers import simulate, train

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
MAKERS = {"ridge": Ridge, "logreg": LogReg, "softmax": Softmax}
SOLVERS = ("cholesky", "cg", "svrg", "lbfgs")
RTOL = 1e-10  # issue 35: a GPU's iterates equal the CPU's to 1e-10 relative (both float64)


def data(loss: str, layout: str, n: int = 240, d: int = 12, seed: int = 0):
    """Rows with a third of the entries zero (so the sparse X holds the same numbers as the dense one) and labels
    for ``loss``."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)) * (rng.random((n, d)) > 1 / 3)
    w = rng.standard_normal(d)
    z = X @ w
    y = {"ridge": z + 0.1 * rng.standard_normal(n), "logreg": (z > 0).astype(float),
         "softmax": np.digitize(z, np.quantile(z, [1 / 3, 2 / 3])).astype(float)}[loss]
    return (scipy.sparse.csr_matrix(X) if layout == "sparse" else X), y


def fit(loss: str, layout: str, *, workers: int = 3, rounds: int = 3, **keys):
    X, y = data(loss, layout)
    return dane.fit(MAKERS[loss](X, y, lam=1e-2, **keys), "dane", workers=workers, rounds=rounds)


@functools.cache
def _on_the_cpu(loss: str, layout: str):
    return fit(loss, layout, device="cpu")


def on_the_cpu(loss: str, layout: str):
    """``fit(loss, layout, device="cpu")``, run once a session for the tests that compare with it (a copy)."""
    return copy.deepcopy(_on_the_cpu(loss, layout))


def untimed(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "time_s"} for r in records]


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖, on the host; 0 where both are zero (the starting point)."""
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / max(float(b.norm()), torch.finfo(torch.float64).tiny))


@pytest.mark.parametrize("loss", sorted(MAKERS))
@pytest.mark.parametrize("layout", ["dense", "sparse"])
def test_explicit_cpu_gives_bit_identical_records_to_the_default(loss, layout):
    default = fit(loss, layout)
    explicit = on_the_cpu(loss, layout)
    assert untimed(explicit.records) == untimed(default.records)
    assert torch.equal(explicit.w, default.w)
    if not torch.cuda.is_available():  # auto is the CPU here: the same bits, and the note says what it chose
        auto = fit(loss, layout, device="auto")
        assert untimed(auto.records) == untimed(default.records) and torch.equal(auto.w, default.w)
        assert "problem.device=auto -> cpu" in auto.summary["notes"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("loss", sorted(MAKERS))
@pytest.mark.parametrize("layout", ["dense", "sparse"])
def test_a_run_on_each_device_has_the_cpus_iterates(device, loss, layout):
    """The simulator's workers share the one device (the GPU's turns clock their compute) and reach the CPU's
    iterate."""
    cpu = on_the_cpu(loss, layout)
    run = cpu if device == "cpu" else fit(loss, layout, device=device)  # cpu: the bit-identical test's case
    assert run.w.device.type == "cpu"  # the algorithm's vectors stay in host memory
    assert relative(run.w, cpu.w) <= RTOL
    for ours, theirs in zip(run.records, cpu.records):
        assert ours["objective"] == pytest.approx(theirs["objective"], rel=RTOL)
    assert run.summary["simulated_compute_clock"] == ("gpu_turns" if device == "cuda" else "thread_cpu_time")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("loss", sorted(MAKERS))
@pytest.mark.parametrize("layout", ["dense", "sparse"])
def test_every_method_and_local_solver_on_the_device_equals_the_cpus(device, loss, layout):
    """One shard built on ``device`` and one on the CPU: the gradient, the metrics, O_i, Hessian products and
    solves, and the proximal solve by every local solver agree to 1e-10; each result comes back on the device
    its input came from."""
    X, y = data(loss, layout)
    config = MAKERS[loss](X, y, lam=1e-2)
    here = MAKERS[loss](X, y, lam=1e-2, device=device).build(1, 3)
    cpu = config.build(1, 3)
    assert here.device.type == device and here.X.device.type == device
    g = torch.Generator().manual_seed(1)
    w, v, linear = (0.3 * torch.randn(cpu.dim, generator=g, dtype=torch.float64) for _ in range(3))
    for moved in {w.device, here.device}:  # a host caller, and the shard's own device (the local solvers)
        at, vec = w.to(moved), v.to(moved)
        pairs = [(here.evaluate(at)[0], cpu.evaluate(w)[0]), (here.evaluate(at)[1], cpu.evaluate(w)[1]),
                 (here.objective(at), cpu.objective(w)),
                 (here.hessian_vector(vec, at=at), cpu.hessian_vector(v, at=w)),
                 (here.hessian_vector(vec), cpu.hessian_vector(v)),
                 (here.solve_hessian(vec, at=at, shift=0.1, with_reg=True),
                  cpu.solve_hessian(v, at=w, shift=0.1, with_reg=True)),
                 (here.batch_grad(at, torch.arange(5)), cpu.batch_grad(w, torch.arange(5)))]
        for ours, theirs in pairs:
            assert ours.device == at.device
            assert relative(ours, theirs) <= RTOL
    for method in SOLVERS:
        solver = LocalSolver(method)
        ours = here.prox_solve(w, linear, MU, solver=solver)
        theirs = cpu.prox_solve(w, linear, MU, solver=solver)
        assert ours.device == w.device
        assert_same_answer(method, cpu, w, linear, ours, theirs)


MU = 0.5  # the prox weight of the local solves compared here


def stationarity(shard, anchor: torch.Tensor, linear: torch.Tensor, w: torch.Tensor) -> float:
    """‖∇φ(w)‖ of the local subproblem φ = O_i − ⟨linear, ·⟩ + (μ/2)‖· − anchor‖² (`dane.numerics.local_solvers`)."""
    return float((shard.evaluate(w)[0] - linear + MU * (w - anchor)).norm())


#: L-BFGS's answers are certified to this relative accuracy (‖∇φ‖ / σ over ‖w‖), no better: see `assert_same_answer`
LBFGS_CERTIFIED = 1e-7


def assert_same_answer(method: str, shard, anchor: torch.Tensor, linear: torch.Tensor, ours: torch.Tensor,
                       theirs: torch.Tensor) -> None:
    r"""Two local solves of one subproblem whose shards differ at round-off (another device's summation order, or
    X perturbed by a few ulps) give the same answer as far as the solver promises one.

    Cholesky and Newton-CG converge quadratically to ‖∇φ‖ ≤ tol‖∇φ(a)‖, so they stop at round-off whatever the
    path; SVRG takes a fixed number of contracting steps on rows drawn from a host generator: all three agree to
    1e-10 (`RTOL`; measured ~1e-16).  scipy's L-BFGS-B does not: it stops where φ's *value* stops decreasing in
    floating point (its factr test fires on φ's round-off even with ftol=0) before the gradient reaches
    tol‖∇φ(a)‖, so its answer is accurate only to about √u and which iterate it stops at depends on round-off
    (ulp perturbations of X move it past 1e-10 relative, as the GPU did).  What it does promise is a
    point with a small gradient; φ is σ-strongly convex (σ = λ + μ), so ‖w − w*‖ ≤ ‖∇φ(w)‖/σ for each answer and
    ‖ours − theirs‖ ≤ (‖∇φ(ours)‖ + ‖∇φ(theirs)‖)/σ: that certificate, and that it certifies `LBFGS_CERTIFIED`.
    """
    ours, theirs = ours.cpu(), theirs.cpu()
    if method != "lbfgs":
        assert relative(ours, theirs) <= RTOL, method
        return
    sigma = shard.l2 + MU
    certified = (stationarity(shard, anchor, linear, ours) + stationarity(shard, anchor, linear, theirs)) / sigma
    assert float((ours - theirs).norm()) <= certified * (1 + 1e-6), method  # 1e-6: the norms' own round-off
    assert certified <= LBFGS_CERTIFIED * float(theirs.norm()), method


def ulps_apart(X, ulps: int, seed: int):
    """X with each stored entry multiplied by 1 + k·ulps·u, k ∈ {−1, 0, 1} at random: the same matrix up to the
    round-off another device's products would add."""
    rng = np.random.default_rng(seed)
    values = X.data if scipy.sparse.issparse(X) else X
    bumped = values * (1 + rng.choice([-1, 0, 1], size=values.shape) * ulps * np.finfo(np.float64).eps)
    if not scipy.sparse.issparse(X):
        return bumped
    out = X.copy()
    out.data = bumped
    return out


@pytest.fixture
def one_thread():
    """torch on one intra-op thread for the test (restored after): tiny CSR products on a loaded 2-core machine
    took ~15 ms each with 2 OpenMP threads against ~0.01 ms with one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("loss, layout", [("logreg", "dense"), ("logreg", "sparse"), ("ridge", "dense")])
def test_every_local_solver_keeps_round_off_from_growing(loss, layout, one_thread):
    """What a GPU run showed, on the CPU: shards a few ulps apart (as a GPU's summation order leaves them) give
    every local solver's answer to what the solver promises (`assert_same_answer`).  Before L-BFGS was compared
    by its certificate this failed for lbfgs, as the GPU's dense logreg case did (softmax is left to the device test:
    its L-BFGS solves take seconds here)."""
    X, y = data(loss, layout)
    g = torch.Generator().manual_seed(1)
    w, linear = (0.3 * torch.randn(MAKERS[loss](X, y).build(1, 3).dim, generator=g, dtype=torch.float64)
                 for _ in range(2))
    exact = {}
    for method in SOLVERS:  # a fresh shard per solve: SVRG's generators start alike
        exact[method] = MAKERS[loss](X, y, lam=1e-2).build(1, 3)
        exact[method] = (exact[method], exact[method].prox_solve(w, linear, MU, solver=LocalSolver(method)))
    for seed in range(6):  # 6 draws: with the old comparison L-BFGS missed 1e-10 in 1 (dense logreg) to 4 of them
        bumped = ulps_apart(X, 4, seed)
        for method, (shard, theirs) in exact.items():
            ours = MAKERS[loss](bumped, y, lam=1e-2).build(1, 3).prox_solve(w, linear, MU, solver=LocalSolver(method))
            assert_same_answer(method, shard, w, linear, ours, theirs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("loss", sorted(MAKERS))
def test_sparse_and_dense_rows_give_the_same_iterates(device, loss):
    dense = fit(loss, "dense", device=device, local_solver="cg")
    sparse = fit(loss, "sparse", device=device, local_solver="cg")
    # the same numbers summed in another order (CSR products against dense ones): round-off, carried over 3 rounds
    assert relative(sparse.w, dense.w) <= RTOL


NO_GPU = "problem.device=cuda but torch sees no CUDA device; use problem.device=auto or cpu"
needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: problem.device=cuda works")


@needs_no_gpu
def test_cuda_without_a_gpu_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=NO_GPU):
        fit("logreg", "dense", device="cuda")
    X, y = data("ridge", "sparse")
    with pytest.raises(ConfigError, match=NO_GPU):  # a caller that builds without check_workers
        Ridge(X, y, device="cuda").build(0, 1)


@pytest.mark.slow  # a process start (~10 s on a loaded machine); the fast test above checks the same refusal
@needs_no_gpu
def test_cuda_without_a_gpu_is_one_line_and_exit_2_on_the_command_line(tmp_path):
    message = NO_GPU
    proc = train("problem=logreg", "problem.device=cuda", "quiet=true", f"out_dir={tmp_path / 'run'}")
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and message in lines[0], proc.stderr
    assert not (tmp_path / "run").exists()


def test_device_and_dtype_are_checked_in_one_line():
    X, y = data("ridge", "dense")
    with pytest.raises(ConfigError, match="problem.device must be one of auto|cpu|cuda"):
        Ridge(X, y, device="tpu")
    with pytest.raises(ConfigError, match="problem.dtype must be one of"):
        Ridge(X, y, dtype="float16")


def global_condition_number(loss: str, layout: str, lam: float, at: torch.Tensor) -> tuple[float, int]:
    """κ of the global Hessian ∇²O(at) (from its products with the unit vectors, numpy's eigenvalues) and N."""
    X, y = data(loss, layout)
    whole = MAKERS[loss](X, y, lam=lam).build(0, 1)
    H = torch.stack([whole.hessian_vector(e, at=at) for e in torch.eye(whole.dim, dtype=torch.float64)]).numpy()
    eig = np.linalg.eigvalsh((H + H.T) / 2)
    return float(eig[-1] / eig[0]), X.shape[0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("loss, solver", [("ridge", "cholesky"), ("ridge", "cg"), ("logreg", "cholesky"),
                                          ("softmax", "cg")])
def test_float32_iterates_are_within_the_documented_bound_of_float64(device, loss, solver):
    r"""problem.dtype=float32: ‖w₃₂ − w₆₄‖ / ‖w₆₄‖ ≤ √N κ u after the same DANE rounds.

    The bound (docs/newton_family.md): each gradient is a sum over N rows, whose float32 error is about √N u of
    the sum of magnitudes (u = 2⁻²⁴, round-off accumulating as a random walk: Higham, *Accuracy and Stability
    of Numerical Algorithms*, 2nd ed., §4.2), and a local solve passes that error on amplified by at most the
    Hessian's condition number κ; DANE's contraction does not let the rounds add up.  The lower bound 1e-9
    shows the run was float32 indeed (float64 agrees to ~1e-15).  ``-s`` prints the measured ratio.
    """
    lam = 1e-2
    X, y = data(loss, "dense")
    runs = {dtype: dane.fit(MAKERS[loss](X, y, lam=lam, local_solver=solver, device=device, dtype=dtype), "dane",
                            workers=3, rounds=4) for dtype in ("float64", "float32")}
    assert runs["float32"].w.dtype == torch.float32 and runs["float64"].w.dtype == torch.float64
    kappa, n = global_condition_number(loss, "dense", lam, runs["float64"].w)
    bound = math.sqrt(n) * kappa * 2.0 ** -24
    rel = relative(runs["float32"].w, runs["float64"].w)
    print(f"{loss}/{solver} on {device}: relative error {rel:.3g}, bound {bound:.3g} (kappa {kappa:.3g}, N {n})")
    assert 1e-9 < rel <= bound


@pytest.mark.parametrize("classes", [1, 3])
def test_the_scatter_product_of_csr_rows_equals_the_transposed_product(classes):
    """`transposed_product`'s path for CSR rows on a GPU (forced here with scatter=True) against Xᵀu."""
    X, _ = data("ridge", "sparse", n=30, d=7)
    rows = select_rows(to_torch(X), torch.tensor([3, 0, 17, 29, 3]))
    u = torch.randn(5, classes, generator=torch.Generator().manual_seed(2), dtype=torch.float64).squeeze(1)
    expected = torch.from_numpy(X[[3, 0, 17, 29, 3]].T @ u.numpy())
    assert torch.allclose(transposed_product(rows, u, scatter=True), expected, rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("factorization, solver", [("cholesky", "cholesky"), ("eigh", "cholesky"),
                                                   ("woodbury", "cholesky"), ("auto", "cg"), ("auto", "svrg")])
def test_ridge_synthetic_on_each_device_has_the_cpus_iterates(device, factorization, solver):
    """problem=ridge_synthetic shares the path: every exact factorization and the rows' solvers on the device."""
    from dane.problems import RidgeSyntheticConfig

    def run(on: str):
        config = RidgeSyntheticConfig(n_samples=600, dim=40, local_solver=solver, factorization=factorization,
                                      device=on)
        problems = [config.build(rank, 3) for rank in range(3)]
        assert all(p.device.type == on for p in problems)
        results = simulate(DANEConfig(mu=0.1), problems, rounds=3)
        return results[0][2], results[0][1]

    cpu_iterates, cpu_records = run("cpu")
    iterates, records = (cpu_iterates, cpu_records) if device == "cpu" else run(device)
    for ours, theirs in zip(iterates, cpu_iterates):
        assert ours.device.type == "cpu" and relative(ours, theirs) <= RTOL
    for ours, theirs in zip(records, cpu_records):
        assert ours["suboptimality"] == pytest.approx(theirs["suboptimality"], rel=RTOL)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batch_size", [3, None])
def test_minibatch_rows_sliced_on_the_device_are_the_samplers_rows(device, batch_size):
    """`MinibatchSampler.next_on` (a network's inner steps) gives `next`'s rows over epochs and a checkpoint's
    restore, from its copy of the epoch's permutation on ``device``."""
    from dane.numerics.inner import MinibatchSampler

    on, twin = MinibatchSampler(10, batch_size, seed=4), MinibatchSampler(10, batch_size, seed=4)
    for step in range(12):
        if step == 4:
            saved = twin.state_dict()  # inside the second epoch
        if step == 7:  # back to it from the third: the copy on the device must follow the restored permutation
            on.load_state_dict(saved)
            twin.load_state_dict(saved)
        rows = on.next_on(torch.device(device))
        assert rows.device.type == device and torch.equal(rows.cpu(), twin.next())
