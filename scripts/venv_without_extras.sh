#!/usr/bin/env bash
# A virtual environment that is VENV without the optional extras Horovod, MLflow and TensorBoard: what a user has
# after `pip install dane` alone.  Seconds and no download: DEST's site-packages holds a link to each entry of
# VENV's except horovod*, mlflow* and tensorboard* (the .pth files among them, dane's editable install
# included, are read as in VENV), and DEST/bin a copy of VENV's console scripts, dane and torchrun among them,
# except horovodrun, mlflow and tensorboard, each started by DEST's python.  .ci/run runs the tests that skip
# without these parts in it, where they must skip, not fail.
#
#   bash scripts/venv_without_extras.sh .venv /tmp/dane-no-extras && /tmp/dane-no-extras/bin/python -m pytest ...
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 VENV DEST (e.g. .venv /tmp/dane-no-extras)" >&2; exit 2; }
SRC=$(cd "$1" && pwd)
DEST=$2
[ -x "$SRC/bin/python" ] || { echo "error: $SRC/bin/python does not exist; run make setup first" >&2; exit 2; }
[ ! -e "$DEST" ] || { echo "error: $DEST exists; name a new folder" >&2; exit 2; }

"$SRC/bin/python" -m venv --without-pip "$DEST"
DEST=$(cd "$DEST" && pwd)
site_of() { "$1" -c 'import sysconfig; print(sysconfig.get_path("purelib"))'; }
FROM=$(site_of "$SRC/bin/python")
TO=$(site_of "$DEST/bin/python")
for entry in "$FROM"/* "$FROM"/.[!.]*; do
    [ -e "$entry" ] || continue
    name=$(basename "$entry")
    case "$name" in horovod*|mlflow*|tensorboard*) continue;; esac  # packages and their dist-info folders
    ln -s "$entry" "$TO/$name"
done
for script in "$SRC"/bin/*; do
    name=$(basename "$script")
    [ -f "$script" ] && [ ! -e "$DEST/bin/$name" ] || continue
    case "$name" in horovod*|mlflow*|tensorboard*) continue;; esac
    # pip's console scripts start VENV's python on their first line (or, for a long path, on the second through
    # /bin/sh); activate* and the python links do not
    head -n 2 "$script" | grep -q -F "$SRC/bin/python" || continue
    sed "1,2s|$SRC/bin/python|$DEST/bin/python|" "$script" > "$DEST/bin/$name"
    chmod +x "$DEST/bin/$name"
done
FOUND=$("$DEST/bin/python" -c 'import importlib.util as u
print(*(m for m in ("horovod", "mlflow", "tensorboard") if u.find_spec(m)))')
if [ -n "$FOUND" ]; then
    echo "error: $DEST still finds $FOUND; is it installed outside $SRC (PYTHONPATH, the user site)?" >&2
    exit 1
fi
echo "venv_without_extras: $DEST is $SRC without horovod, mlflow and tensorboard"
