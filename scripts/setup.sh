#!/usr/bin/env bash
# One-command setup: a virtual environment with torch 2.13.0, dane (editable, with its dev and
# horovod extras) and Horovod 0.28.1 built with PyTorch + Gloo.  Horovod's last release predates
# torch 2.1, so its sdist is patched to C++17 (upstream PR #3998), and it is built for the CPU
# (Pytorch_CUDA forced off) unless HOROVOD_GPU_OPERATIONS asks for GPU operations: pip takes the
# CUDA torch wheel where no CPU wheel is in reach (Python 3.12 here), and with an nvcc on PATH
# Horovod's CMake then looks for a CUDA toolkit it does not need.  The built wheel is cached
# outside the repository, keyed by Horovod, torch and Python versions (and -gpu).  Last, one tiny run of
# each numba path (SVRG, stacked ridge, FedNL) fills the kernels' cache, so a first run is as fast as a second.
#
#   PYTHON=python3.12 VENV=.venv-3.12 bash scripts/setup.sh     # make setup PYTHON=python3.12 VENV=.venv-3.12
#
# PYTHON: 3.11 or 3.12, a command or a path (default: python3.11, else python3.12); a bare
# python3.X that is not on PATH is also looked for among pyenv's versions.
set -euo pipefail

HOROVOD_VERSION=0.28.1
TORCH_VERSION=2.13.0
VENV=${VENV:-.venv}
CACHE_DIR=${DANE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dane}
SUPPORTED="3.11 3.12"

die() { echo "setup: $*" >&2; exit 1; }

# The interpreter named (a command or a path), or the first of python3.11, python3.12 that runs.
find_python() {
    local name=$1 candidate
    for candidate in "$name" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/*/bin/"$name"; do
        if "$candidate" -c 'import sys' >/dev/null 2>&1; then echo "$candidate"; return 0; fi
    done
    return 1
}

if [ -n "${PYTHON:-}" ]; then
    PYTHON_BIN=$(find_python "$PYTHON") || die "$PYTHON not found; name Python 3.11 or 3.12: make setup PYTHON=python3.12 (or a path)"
else
    PYTHON_BIN=$(find_python python3.11 || find_python python3.12) \
        || die "neither python3.11 nor python3.12 found; install one, or name it: make setup PYTHON=/path/to/python3.12"
fi
PYVER=$("$PYTHON_BIN" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
case " $SUPPORTED " in *" $PYVER "*) ;; *) die "$PYTHON_BIN is Python $PYVER; dane supports $SUPPORTED: make setup PYTHON=python3.12";; esac
command -v g++ >/dev/null || die "no C++ compiler (g++) found; Horovod is built from source: apt-get install g++"
command -v make >/dev/null || die "make not found: apt-get install make"

if [ ! -x "$VENV/bin/python" ]; then
    echo "setup: creating $VENV with Python $PYVER ($PYTHON_BIN)"
    "$PYTHON_BIN" -m venv "$VENV"
fi
PY="$VENV/bin/python"
HAVE=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
[ "$HAVE" = "$PYVER" ] || die "$VENV is Python $HAVE, not $PYVER; choose another folder: make setup PYTHON=$PYTHON_BIN VENV=.venv-$PYVER"
PIP=("$PY" -m pip --disable-pip-version-check -q)
PYTAG="cp${PYVER/./}"

echo "setup: installing torch==$TORCH_VERSION and Horovod's build requirements"
"${PIP[@]}" install "torch==$TORCH_VERSION"
"${PIP[@]}" install cloudpickle psutil pyyaml packaging setuptools wheel

if "$PY" -c "import horovod.torch" 2>/dev/null; then
    echo "setup: horovod already installed in $VENV"
else
    GPU=${HOROVOD_GPU_OPERATIONS:+-gpu}
    WHEEL_DIR="$CACHE_DIR/horovod-$HOROVOD_VERSION-torch$TORCH_VERSION-$PYTAG$GPU"
    if ! ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
        # A CMake >= 4 rejects the bundled gloo; the system CMake 3.x is what was verified.
        command -v cmake >/dev/null || die "cmake not found; Horovod needs CMake 3.13+: apt-get install cmake"
        CMAKE_MAJOR=$(cmake --version | head -1 | sed -E 's/[^0-9]*([0-9]+).*/\1/')
        if [ "$CMAKE_MAJOR" -ge 4 ]; then export CMAKE_POLICY_VERSION_MINIMUM=3.5; fi

        BUILD=$(mktemp -d)
        LOG="$CACHE_DIR/horovod-build-$PYTAG.log"
        mkdir -p "$CACHE_DIR"
        echo "setup: building Horovod $HOROVOD_VERSION from source for Python $PYVER (2-7 minutes; log: $LOG)"
        "${PIP[@]}" download "horovod==$HOROVOD_VERSION" --no-deps --no-binary :all: -d "$BUILD" >"$LOG" 2>&1 \
            || die "could not download the horovod==$HOROVOD_VERSION sdist from PyPI; see $LOG"
        tar -xzf "$BUILD/horovod-$HOROVOD_VERSION.tar.gz" -C "$BUILD"
        SRC="$BUILD/horovod-$HOROVOD_VERSION"
        sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' \
            "$SRC/CMakeLists.txt" "$SRC/horovod/torch/CMakeLists.txt"
        grep -q 'CMAKE_CXX_STANDARD 17' "$SRC/horovod/torch/CMakeLists.txt" \
            || die "the C++17 patch did not apply to $SRC; has the sdist layout changed?"
        if [ -z "$GPU" ]; then  # a CPU build whatever torch wheel pip took (FindPytorch sets Pytorch_CUDA from torch)
            FIND="$SRC/cmake/Modules/FindPytorch.cmake"
            sed -i 's/^string(TOUPPER "${Pytorch_CUDA}" Pytorch_CUDA)$/&\nset(Pytorch_CUDA FALSE)  # dane: CPU operations/' "$FIND"
            grep -q '^set(Pytorch_CUDA FALSE)' "$FIND" || die "the CPU patch did not apply to $FIND; has the sdist layout changed?"
        fi
        mkdir -p "$WHEEL_DIR"
        if ! HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
             HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
             MAKEFLAGS="-j$(nproc)" \
             "${PIP[@]}" wheel --no-build-isolation --no-deps -w "$WHEEL_DIR" "$SRC" >>"$LOG" 2>&1; then
            rm -rf "$WHEEL_DIR"
            die "the Horovod build failed; the compiler output is in $LOG (last line: $(tail -1 "$LOG"))"
        fi
        rm -rf "$BUILD"
    else
        echo "setup: using cached Horovod wheel from $WHEEL_DIR"
    fi
    "${PIP[@]}" install --no-deps "$WHEEL_DIR"/horovod-*.whl
fi

# Everything else from pyproject.toml (torch and Horovod are already there, so pip keeps them).
echo "setup: installing dane (editable) with its dev, horovod and mongo extras"
"${PIP[@]}" install --no-build-isolation -e ".[dev,horovod,mongo]"

# numba compiles the SVRG, stacked-ridge and FedNL kernels on their first call, seconds that a user's first run
# would pay (make bench section svrg, cell first_round, measures it); cache=True keeps the machine code beside
# each module (__pycache__/*.nbi, *.nbc), so one tiny run of each path here fills the cache for every later process.
echo "setup: compiling the numba kernels into their cache (SVRG, stacked ridge, FedNL)"
"$PY" - <<'WARM' || die "warming the numba kernels failed; run the python block at the end of scripts/setup.sh to see why"
import numpy as np, scipy.sparse, torch
import dane
from dane.loop.launch import execute
from dane.run_config import run_spec
from dane.synthetic.sweep import compose_job

rng = np.random.default_rng(0)
X = rng.standard_normal((40, 6))
binary, classes = (X[:, 0] > 0).astype(float), np.argmax(X[:, :3], 1).astype(float)
for rows in (X, scipy.sparse.csr_matrix(np.where(np.abs(X) > 1, X, 0.0))):  # dense and CSR rows
    for dtype in (torch.float64, torch.float32):  # SVRG: the squared/logistic and the softmax kernels
        for problem in (dane.problems.LogReg(rows, binary, lam=1e-2), dane.problems.Softmax(rows, classes, lam=1e-2)):
            dane.fit(problem, "inexact_dane", workers=1, rounds=1, dtype=dtype)
    for compressor in ("randk:5", "topk:5"):  # FedNL: TopK copies its kept entries with a kernel of its own
        dane.fit(dane.problems.LogReg(rows, binary, lam=1e-2), "fednl", workers=2, rounds=1, compressor=compressor)
    dane.fit(dane.problems.LogReg(rows, binary, lam=1e-2), "fednl", workers=2, rounds=1, compressor="topk:5",
             variant="pp", clients_per_round=1)  # FedNL-PP: its clients' H_i x, by a kernel of its own
for dtype in ("float64", "float32"):  # the low-rank stacked ridge (n_i < d): its Gram and Woodbury products
    execute(run_spec(compose_job(("problem=ridge_synthetic", "problem.n_samples=64", "problem.dim=8", "workers=32",
                                  "sim.batched=true", "rounds=2", "quiet=true", f"dtype={dtype}"))), None)
import tempfile
from sklearn.datasets import dump_svmlight_file
with tempfile.TemporaryDirectory() as folder:  # a linear model's stacked rows on the batched path (FedNL at one
    table = f"{folder}/rows.svm"                # point, FedAvg's local steps at each client's): their margins, sums
    dump_svmlight_file(scipy.sparse.csr_matrix(np.where(np.abs(X) > 1, X, 0.0)), 2 * binary - 1, table)
    for algorithm in ("fednl", "fedavg"):       # and Hessian blocks, and the logistic loss's loop
        for dtype in ("float64", "float32"):
            execute(run_spec(compose_job(("problem=logreg", "data=libsvm", f"data.path={table}", "data.n_features=6",
                                          f"algorithm={algorithm}", "workers=4", "sim.batched=true", "rounds=2",
                                          "quiet=true", f"dtype={dtype}"))), None)
WARM

"$VENV/bin/horovodrun" --check-build | grep -E '\[X\] (PyTorch|Gloo)' | tr '\n' ' ' | grep -q 'PyTorch.*Gloo' \
    || die "horovodrun --check-build does not list PyTorch and Gloo; rebuild with: rm -rf $CACHE_DIR/horovod-* $VENV && make setup"
echo "setup: done (Python $PYVER, $VENV); horovodrun --check-build lists PyTorch and Gloo"
