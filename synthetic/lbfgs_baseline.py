"""The one-process baselines that ``python -m scripts.bench wallclock`` times against the package's launches: the
package's regularized logistic or softmax objective in numpy, solved by scipy's L-BFGS-B or scikit-learn's lbfgs.

    python -m dane.synthetic.lbfgs_baseline SPEC.json

runs one timed baseline (`baseline_child`: imports, data, fit, a result JSON with its marks).  No torch is imported:
the baseline is timed as a user of scipy alone would run it.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

def read_rows(read: dict, fit_intercept: bool):
    """(X, y) as the package reads them: labels ±1 (logistic) or 0..K-1 (softmax), ones appended for an intercept."""
    import numpy as np
    import scipy.sparse as sp

    if read["kind"] == "svmlight":
        from sklearn.datasets import load_svmlight_file
        X, y = load_svmlight_file(read["path"], n_features=read["n_features"], dtype=np.float64)
    elif read["kind"] == "npz":
        with np.load(read["path"]) as f:
            X, y = f["X"], f["y"]
    else:  # MNIST: the package's training rows of its t10k split, from the IDX files
        import gzip
        with gzip.open(Path(read["folder"]) / "t10k-images-idx3-ubyte.gz") as f:
            images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)
        with gzip.open(Path(read["folder"]) / "t10k-labels-idx1-ubyte.gz") as f:
            labels = np.frombuffer(f.read(), np.uint8, offset=8)
        rows = np.load(read["rows"])
        X, y = images[rows].astype(np.float64) / 255.0, labels[rows].astype(np.float64)
    if read["loss"] == "logistic":
        y = np.where(y > 0, 1.0, -1.0)
    if fit_intercept:
        X = sp.hstack([X, np.ones((X.shape[0], 1))], format="csr") if sp.issparse(X) else \
            np.hstack([X, np.ones((X.shape[0], 1))])
    return X, y


def value_grad(w, X, y, lam: float, loss: str):
    """The package's O(w) = (1/N) Σ f(x_jᵀW, y_j) + (λ/2)‖w‖² and its gradient; softmax w is d x K, feature-major."""
    import numpy as np
    from scipy.special import expit, logsumexp

    n = X.shape[0]
    if loss == "logistic":
        yz = y * (X @ w)
        g = X.T @ (-y * expit(-yz)) / n + lam * w
        return float(np.mean(np.logaddexp(0.0, -yz)) + 0.5 * lam * w @ w), g
    W = w.reshape(X.shape[1], -1)
    Z = np.asarray(X @ W)
    lse = logsumexp(Z, axis=1)
    rows, cls = np.arange(n), y.astype(int)
    P = np.exp(Z - lse[:, None])
    P[rows, cls] -= 1.0
    value = float(np.mean(lse - Z[rows, cls]) + 0.5 * lam * np.sum(W * W))
    return value, (X.T @ P / n + lam * W).ravel()


def fit(solver: str, X, y, lam: float, loss: str, tol: float, classes: int, callback=None):
    """(w, iterations): L-BFGS-B on `value_grad` (``tol`` its gtol, ftol 0) or scikit-learn's lbfgs (``tol``)."""
    import numpy as np

    width = X.shape[1] * (classes if loss == "softmax" else 1)
    if solver == "scipy_lbfgsb":
        from scipy.optimize import minimize
        res = minimize(value_grad, np.zeros(width), args=(X, y, lam, loss), jac=True, method="L-BFGS-B",
                       callback=callback, options={"gtol": tol, "ftol": 0.0, "maxiter": 20000, "maxfun": 40000})
        return res.x, int(res.nit)
    from sklearn.linear_model import LogisticRegression
    model = LogisticRegression(solver="lbfgs", C=1.0 / (X.shape[0] * lam), tol=tol, fit_intercept=False,
                               max_iter=20000).fit(X, y)
    return (model.coef_.ravel() if loss == "logistic" else model.coef_.T.ravel()), int(np.max(model.n_iter_))


def baseline_child(spec_file: str) -> None:
    """One timed baseline process: imports, data, fit, result JSON (its marks as time.time() values)."""
    spec = json.loads(Path(spec_file).read_text())
    marks = {}
    import numpy  # noqa: F401
    import scipy.optimize  # noqa: F401
    if spec["solver"] == "sklearn_lbfgs" or spec["read"]["kind"] == "svmlight":
        import sklearn.linear_model  # noqa: F401
    marks["imports"] = time.time()
    X, y = read_rows(spec["read"], spec["fit_intercept"])
    marks["data"] = time.time()
    start = time.perf_counter()
    w, iterations = fit(spec["solver"], X, y, spec["lam"], spec["read"]["loss"], spec["tol"], spec["classes"])
    fit_s = time.perf_counter() - start
    marks["fit"] = time.time()
    objective, _ = value_grad(w, X, y, spec["lam"], spec["read"]["loss"])
    from dane.loop.timeline import boot_clock_start  # os and time only
    result = {"marks": marks, "process_start": boot_clock_start(), "fit_s": fit_s, "objective": objective,
              "iterations": iterations}
    tmp = Path(spec["out"]).with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, spec["out"])


if __name__ == "__main__":
    baseline_child(sys.argv[1])
