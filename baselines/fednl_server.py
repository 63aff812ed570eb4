r"""FedNL's server step (`baselines.fednl`): the Newton direction with the learned Hessian H, and FedNL-LS's search.

.. math:: d_k = -[H]_\mu^{-1} g \ \text{(option 1)}\quad\text{or}\quad -(H + l I)^{-1} g \ \text{(option 2, FedNL-PP)}

FedNL-CR's (``cubic`` M > 0) minimizes the cubic model of option 2,
:math:`\langle g, s\rangle + \tfrac12 s^\top(H + lI)s + \tfrac M6\|s\|^3`, whose minimizer is
:math:`s = -(H + lI + \tfrac{Mr}2 I)^{-1} g` with r = ‖s‖ (Nesterov & Polyak 2006): `cubic_newton` finds r by
bisection on the decreasing ‖s(r)‖ − r, in the eigenbasis of H + lI, to the last bit of r.

[H]_μ is the projection onto {H ⪰ μI}: a Cholesky factor of H − (μ − ε)I first (ε: 64·d·machine
epsilon·max H_aa), and where that exists H itself, the projection changing only eigenvalues within ε of μ;
else an eigendecomposition.  The d x d solves run on one BLAS thread (`one_blas_thread`).
"""
from __future__ import annotations

import contextlib
import functools
import threading

import numpy as np
import scipy.linalg

from dane.errors import ConfigError

from dane.problems.stacked_hessians import unpack

LS_TRIALS = 60  # FedNL-LS: at most this many halvings (γ^60 ≈ 1e-18 at γ = 1/2)


@functools.cache
def _blas_controller():
    try:
        from threadpoolctl import ThreadpoolController  # scikit-learn's dependency
    except ImportError:  # pragma: no cover - scikit-learn is a dependency of the package
        return None
    return ThreadpoolController()


_BLAS_LOCK = threading.Lock()


@contextlib.contextmanager
def one_blas_thread():
    """A context in which NumPy's and SciPy's BLAS run on one thread: the server's d x d solves, as the simulator's
    torch, on the one core a simulated worker has.  Their default, a thread per core, made the solves many times
    slower on a machine whose cores other work shares (``make bench`` section ``fednl``'s ``user_path``).  The
    setting is the process's: one simulated worker at a time holds it (a lock), so that each restores what it found."""
    controller = _blas_controller()
    if controller is None:
        yield
        return
    with _BLAS_LOCK, controller.limit(limits=1, user_api="blas"):
        yield


def projected_newton(H: np.ndarray, g: np.ndarray, mu: float) -> np.ndarray:
    """[H]_μ⁻¹ g, [H]_μ the projection onto {H ⪰ μI}: by Cholesky when H − (μ − ε)I is positive definite,
    else by eigh (on one BLAS thread, `one_blas_thread`)."""
    with one_blas_thread():
        return _projected_newton(H, g, mu)


def _projected_newton(H: np.ndarray, g: np.ndarray, mu: float) -> np.ndarray:
    d = len(g)
    eps = 64 * d * np.finfo(H.dtype).eps * max(float(np.abs(np.diag(H)).max()), mu)
    try:
        scipy.linalg.cho_factor(plus_identity(H, eps - mu), lower=True, overwrite_a=True, check_finite=False)
        factor = scipy.linalg.cho_factor(H, lower=True, check_finite=False)
        return scipy.linalg.cho_solve(factor, g, check_finite=False)
    except np.linalg.LinAlgError:
        evals, evecs = np.linalg.eigh(H)
        return evecs @ ((evecs.T @ g) / np.maximum(evals, mu))


def shifted_newton(H: np.ndarray, g: np.ndarray, shift: float) -> np.ndarray:
    """(H + shift I)⁻¹ g by Cholesky (H + shift I ≻ 0 in FedNL's option 2 and FedNL-PP), on one BLAS thread."""
    try:
        with one_blas_thread():
            factor = scipy.linalg.cho_factor(plus_identity(H, shift), lower=True, overwrite_a=True,
                                             check_finite=False)
            return scipy.linalg.cho_solve(factor, g, check_finite=False)
    except np.linalg.LinAlgError:
        raise ConfigError(f"FedNL's H + {shift:.3g} I is not positive definite; use algorithm.option=1 "
                          "(the projection onto H >= mu I) or a larger problem.lam") from None


def plus_identity(H: np.ndarray, shift: float) -> np.ndarray:
    """H + shift I, a new array (one d x d array: at large d the server's memory is a few of them)."""
    A = H.copy()
    A.flat[::len(A) + 1] += shift
    return A


def newton_direction(H: np.ndarray, g: np.ndarray, l: float, *, option: int, mu: float,
                     cubic: float = 0.0) -> np.ndarray:
    """The server's step d_k = −[H]_μ⁻¹ g (option 1) or −(H + l I)⁻¹ g (option 2), H the packed H_k; with ``cubic``
    M > 0 (FedNL-CR, option 2) the cubic model's minimizer (`cubic_newton`)."""
    full = unpack(H, len(g))
    if cubic > 0:
        return cubic_newton(full, g, l, cubic)
    return -(projected_newton(full, g, mu) if option == 1 else shifted_newton(full, g, l))


def cubic_newton(H: np.ndarray, g: np.ndarray, shift: float, M: float) -> np.ndarray:
    """argmin_s ⟨g, s⟩ + ½ sᵀ(H + shift I)s + (M/6)‖s‖³, M > 0 (module docstring): s = −Q c/(λ + Mr/2), c = Qᵀg,
    with H + shift I = Q diag(λ) Qᵀ and r the root of ‖s(r)‖ = r above max(0, −2λ_min/M), by bisection."""
    with one_blas_thread():
        evals, Q = np.linalg.eigh(plus_identity(H, shift))
    c = Q.T @ g

    def too_long(r: float) -> bool:  # ‖s(r)‖ > r, ‖s(r)‖ decreasing in r
        with np.errstate(divide="ignore"):
            return float(np.sqrt(np.sum((c / (evals + 0.5 * M * r)) ** 2))) > r

    lo = max(0.0, -2.0 * float(evals[0]) / M)
    hi = max(2.0 * lo, 1.0)
    while too_long(hi):
        hi *= 2.0
    while True:
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        lo, hi = (mid, hi) if too_long(mid) else (lo, mid)
    return -(Q @ (c / (evals + 0.5 * M * hi)))


def armijo_backtrack(objective, x: np.ndarray, f_x: float, g: np.ndarray, direction: np.ndarray, *,
                     c: float, gamma: float) -> tuple[float, int]:
    """(t, trials): the first t = γ^j with objective(x + t·direction) ≤ f_x + c t ⟨g, direction⟩ (FedNL-LS); t = 0
    (no step) where none of the `LS_TRIALS` trials passes."""
    slope = float(g @ direction)
    t = 1.0
    for trial in range(1, LS_TRIALS + 1):
        if objective(x + t * direction) <= f_x + c * t * slope:
            return t, trial
        t *= gamma
    return 0.0, LS_TRIALS
