#!/usr/bin/env bash
# One-command setup: .venv with torch 2.13.0 (CPU wheel), the scientific stack, and
# Horovod 0.28.1 built with PyTorch + Gloo.  Horovod's last release predates torch 2.1,
# so its sdist is patched to C++17 (upstream PR #3998).  The built wheel is cached
# outside the repository, keyed by Horovod, torch and Python versions.
set -euo pipefail

HOROVOD_VERSION=0.28.1
TORCH_VERSION=2.13.0
PYTHON=${PYTHON:-python3.11}
VENV=${VENV:-.venv}
CACHE_DIR=${DANE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dane}

die() { echo "setup: $*" >&2; exit 1; }

command -v "$PYTHON" >/dev/null || die "$PYTHON not found; install Python 3.11 or set PYTHON=/path/to/python3.11"
command -v g++ >/dev/null || die "no C++ compiler (g++) found; Horovod is built from source: apt-get install g++"
command -v make >/dev/null || die "make not found: apt-get install make"

if [ ! -x "$VENV/bin/python" ]; then
    echo "setup: creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check -q)
PYTAG=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')

echo "setup: installing torch==$TORCH_VERSION and the scientific stack"
"${PIP[@]}" install "torch==$TORCH_VERSION"
"${PIP[@]}" install numpy scipy matplotlib "hydra-core>=1.3,<1.4" "omegaconf<2.4" hydra-submitit-launcher==1.2.0 scikit-learn "numba>=0.64" pytest \
    cloudpickle psutil pyyaml packaging setuptools wheel tqdm "tensorboard>=2.14" "mlflow-skinny>=2.10"

if "$PY" -c "import horovod.torch" 2>/dev/null; then
    echo "setup: horovod already installed in $VENV"
else
    WHEEL_DIR="$CACHE_DIR/horovod-$HOROVOD_VERSION-torch$TORCH_VERSION-$PYTAG"
    if ! ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
        # A CMake >= 4 rejects the bundled gloo; the system CMake 3.x is what was verified.
        CMAKE_BIN=$(command -v cmake || true)
        [ -n "$CMAKE_BIN" ] || die "cmake not found; Horovod needs CMake 3.13+: apt-get install cmake"
        CMAKE_MAJOR=$(cmake --version | head -1 | sed -E 's/[^0-9]*([0-9]+).*/\1/')
        if [ "$CMAKE_MAJOR" -ge 4 ]; then export CMAKE_POLICY_VERSION_MINIMUM=3.5; fi

        BUILD=$(mktemp -d)
        LOG="$CACHE_DIR/horovod-build.log"
        mkdir -p "$CACHE_DIR"
        echo "setup: building Horovod $HOROVOD_VERSION from source (about 7 minutes on 2 cores; log: $LOG)"
        "${PIP[@]}" download "horovod==$HOROVOD_VERSION" --no-deps --no-binary :all: -d "$BUILD" >"$LOG" 2>&1 \
            || die "could not download the horovod==$HOROVOD_VERSION sdist from PyPI; see $LOG"
        tar -xzf "$BUILD/horovod-$HOROVOD_VERSION.tar.gz" -C "$BUILD"
        SRC="$BUILD/horovod-$HOROVOD_VERSION"
        sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' \
            "$SRC/CMakeLists.txt" "$SRC/horovod/torch/CMakeLists.txt"
        grep -q 'CMAKE_CXX_STANDARD 17' "$SRC/horovod/torch/CMakeLists.txt" \
            || die "the C++17 patch did not apply to $SRC; has the sdist layout changed?"
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

echo "setup: installing dane (editable)"
"${PIP[@]}" install --no-build-isolation --no-deps -e .

"$VENV/bin/horovodrun" --check-build | grep -E '\[X\] (PyTorch|Gloo)' | tr '\n' ' ' | grep -q 'PyTorch.*Gloo' \
    || die "horovodrun --check-build does not list PyTorch and Gloo; rebuild with: rm -rf $CACHE_DIR && make setup"
echo "setup: done; horovodrun --check-build lists PyTorch and Gloo"
