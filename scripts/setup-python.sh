#!/usr/bin/env bash
# Build the Python side of the stack into .venv: PyTorch, mpi4py, h5py built
# against parallel HDF5, and Horovod 0.28.1 built from its source release with
# the C++17 fix that current PyTorch needs. Built wheels are cached outside the
# repo, keyed by what they were built against, so a second run takes seconds.
#
# Variables:
#   VENV                 the virtual environment (default .venv)
#   PYTHON               the interpreter that creates it (default python3)
#   HPCDP_TORCH          the torch requirement (default torch==2.13.0)
#   HPCDP_TORCH_INDEX_URL  an extra index for another torch build (e.g. a CPU
#                        or a specific CUDA build); unset by default
#   HPCDP_GPU_OPS        NCCL or none (default: NCCL when nvcc and a CUDA torch
#                        are found, else none)
#   HPCDP_WHEEL_CACHE    where built wheels are kept (default ~/.cache/hpcdp/wheels)
#   HPCDP_HOROVOD        which Horovod (docs/install.md):
#                        patched  0.28.1 with the C++17 fix and hpcdp's patches (default)
#                        stock    0.28.1 with only the C++17 fix
#                        site     the Horovod the venv can already import (a module, a
#                                 container's, one installed into the venv): checked,
#                                 never rebuilt; a venv created here then sees the
#                                 system's site-packages
set -euo pipefail

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
HOROVOD_VERSION=0.28.1
H5PY_VERSION=3.16.0
# The default stays 2.13 while make test on 2.15 (a CUDA build, 2.5 s and 660 MB per
# rank start against 1.8 s and 238 MB) runs past its 20-minute budget (docs/install.md).
TORCH_REQ=${HPCDP_TORCH:-torch==2.13.0}
CACHE=${HPCDP_WHEEL_CACHE:-$HOME/.cache/hpcdp/wheels}
# Bump when the way Horovod is patched or built changes, so old wheels are not reused.
HOROVOD_RECIPE=6
HOROVOD_STOCK_RECIPE=1
HOROVOD_KIND=${HPCDP_HOROVOD:-patched}
case "$HOROVOD_KIND" in
  patched|stock|site) ;;
  *) echo "setup-python: error: HPCDP_HOROVOD=$HOROVOD_KIND: patched, stock or site" >&2; exit 2 ;;
esac

log() { echo "setup-python: $*"; }

# A venv already set up from these very inputs needs nothing more: the stamp
# holds a hash of the files and choices that decide what gets installed.
stamp="$VENV/.hpcdp-setup"
inputs_hash=$(cat pyproject.toml "$0" "$(dirname "$0")/build-horovod.sh" | sha256sum | cut -c1-16)-${TORCH_REQ}-${HPCDP_GPU_OPS:-auto}-${HOROVOD_KIND}
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$inputs_hash" ] \
   && "$VENV/bin/python" -c 'import horovod.torch, h5py, hpcdp' >/dev/null 2>&1; then
  log "$VENV is up to date (delete $stamp to force a reinstall)"
  exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  venv_flags=()
  # A site Horovod lives in the system's (or a module's) site-packages.
  if [ "$HOROVOD_KIND" = site ]; then venv_flags=(--system-site-packages); fi
  "$PYTHON" -m venv "${venv_flags[@]}" "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check -q)

torch_extra=()
if [ -n "${HPCDP_TORCH_INDEX_URL:-}" ]; then torch_extra=(--extra-index-url "$HPCDP_TORCH_INDEX_URL"); fi
if ! "$PY" -c 'import torch' >/dev/null 2>&1; then
  log "installing $TORCH_REQ"
  "${PIP[@]}" install "${torch_extra[@]}" "$TORCH_REQ"
fi
log "installing build requirements"
"${PIP[@]}" install "setuptools>=77" wheel "Cython>=3" pkgconfig "numpy>=1.26" \
  cmake cloudpickle psutil pyyaml packaging cffi "mpi4py>=4.0"

pyver=$("$PY" -c 'import sys; print(f"py{sys.version_info[0]}{sys.version_info[1]}")')
torchver=$("$PY" -c 'import torch; print(torch.__version__.replace("+", "_"))')
mpiver=$(mpirun --version 2>/dev/null | head -n1 | tr -cs 'A-Za-z0-9.' '_' | sed 's/_$//')
hdf5ver=$(pkg-config --modversion hdf5-openmpi 2>/dev/null || pkg-config --modversion hdf5 2>/dev/null || echo unknown)
mpi4pyver=$("$PY" -c 'import mpi4py; print(mpi4py.__version__)')

# NCCL or none, by the build script's own rule (HPCDP_GPU_OPS=NCCL|none overrides it).
gpu_ops=${HPCDP_GPU_OPS:-$(PY="$PY" bash "$(dirname "$0")/build-horovod.sh" --gpu-ops)}

# --- h5py against parallel HDF5 -------------------------------------------
h5key="h5py-$H5PY_VERSION-$pyver-hdf5_$hdf5ver-$mpiver-mpi4py_$mpi4pyver"
h5dir="$CACHE/$h5key"
if ! ls "$h5dir"/h5py-*.whl >/dev/null 2>&1; then
  log "building h5py $H5PY_VERSION against parallel HDF5 $hdf5ver (about 2 minutes)"
  mkdir -p "$h5dir.tmp"
  CC=mpicc HDF5_MPI=ON HDF5_PKGCONFIG_NAME=hdf5-openmpi \
    "${PIP[@]}" wheel --no-binary=h5py --no-build-isolation --no-deps \
    -w "$h5dir.tmp" "h5py==$H5PY_VERSION"
  rm -rf "$h5dir"; mv "$h5dir.tmp" "$h5dir"
fi
if ! "$PY" -c 'import h5py, sys; sys.exit(0 if h5py.get_config().mpi else 1)' >/dev/null 2>&1; then
  "${PIP[@]}" install --force-reinstall --no-deps "$h5dir"/h5py-*.whl
fi

# --- Horovod 0.28.1 with the C++17 fix (and hpcdp's patches) -----------------
if [ "$HOROVOD_KIND" = site ]; then
  # Use what is there: say what it lacks, stop only where hpcdp cannot run on it.
  log "checking the site's Horovod (HPCDP_HOROVOD=site): nothing is built or installed"
  PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m hpcdp.runtime.hvd_build --check-site \
    || { echo "setup-python: error: the site's Horovod cannot run hpcdp (above)" >&2; exit 1; }
  hvdkey=site
  find_horovod=()
else
  variant=r$HOROVOD_RECIPE; patches=hpcdp
  if [ "$HOROVOD_KIND" = stock ]; then variant=stock-r$HOROVOD_STOCK_RECIPE; patches=none; fi
  hvdkey="horovod-$HOROVOD_VERSION-$variant-$pyver-torch_$torchver-gpu_$gpu_ops-$mpiver"
  hvddir="$CACHE/$hvdkey"
  if ! ls "$hvddir"/horovod-*.whl >/dev/null 2>&1; then
    log "building $HOROVOD_KIND Horovod $HOROVOD_VERSION for torch $torchver, GPU ops: $gpu_ops (6-7 minutes on 2 cores)"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    "${PIP[@]}" download --no-deps --no-binary :all: -d "$work" "horovod==$HOROVOD_VERSION"
    tar -xzf "$work"/horovod-$HOROVOD_VERSION.tar.gz -C "$work"
    # What Horovod's setup.py needs at build time (it would fetch them itself otherwise).
    "${PIP[@]}" install cffi cloudpickle psutil pyyaml packaging wheel
    mkdir -p "$hvddir.tmp"
    SRC="$work/horovod-$HOROVOD_VERSION" PY="$PY" WHEELDIR="$hvddir.tmp" GPU_OPS="$gpu_ops" \
      PATCHES="$patches" bash "$(dirname "$0")/build-horovod.sh"
    rm -rf "$hvddir"; mv "$hvddir.tmp" "$hvddir"
  fi
  # The venv records which build it holds, so a new recipe (a changed patch) reaches
  # venvs that already have this Horovod version.
  installed_key=$(cat "$VENV/.hpcdp-horovod" 2>/dev/null || true)
  if ! "$PY" -c 'import horovod.torch' >/dev/null 2>&1 || [ "$installed_key" != "$hvdkey" ] \
     || [ "$("$PY" -c 'import horovod; print(horovod.__version__)')" != "$HOROVOD_VERSION" ]; then
    "${PIP[@]}" install --force-reinstall --no-deps "$hvddir"/horovod-*.whl
  fi
  find_horovod=(--find-links "$hvddir")
fi
echo "$hvdkey" > "$VENV/.hpcdp-horovod"

# --- the project -----------------------------------------------------------
# With the experiment trackers (the `mlflow` and `wandb` extras: the tests run both) and
# the model libraries (the `models` extra), each matched to the torch in use: torch is
# pinned to the installed build in the same command, so pip never replaces it, and takes
# the newest torchvision whose own torch requirement admits it (up to torch 2.13 a
# torchvision release pins one torch exactly, 0.(minor + 15); from 0.29 on it asks for a
# lowest torch only, so torch 2.15 gets 0.29).
torch_pin=$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')
log "installing hpcdp (editable) with its test tools, the trackers and the model libraries (for torch $torch_pin)"
"${PIP[@]}" install --no-build-isolation "${find_horovod[@]}" --find-links "$h5dir" \
  -e ".[dev,models,mlflow,wandb]" "torch==$torch_pin"
HOROVOD_KIND=$HOROVOD_KIND "$PY" - <<'PYEOF'
import os, h5py, horovod.torch as hvd, torch
assert h5py.get_config().mpi, "h5py was not built against parallel HDF5"
from hpcdp.runtime import hvd_build
build = hvd_build.installed_build()
if os.environ["HOROVOD_KIND"] != "site":  # a site's Horovod was checked above
    assert hvd.mpi_built() and hvd.gloo_built(), "Horovod lacks the MPI or Gloo controller"
from hpcdp.models import libraries
for lib in libraries.report():  # a mismatch is named here and by hpcdp doctor, never fatal
    said = lib["problem"] or lib["note"]
    print(f"setup-python: {lib['name']} {lib['version']}" + (f": {said}" if said else ""))
print(f"setup-python: ready: torch {torch.__version__}, {build.describe(switches=False)} "
      f"(HPCDP_HOROVOD={os.environ['HOROVOD_KIND']}), "
      f"h5py {h5py.__version__} (parallel)")
PYEOF
echo "$inputs_hash" > "$stamp"
