#!/usr/bin/env bash
# Build a Horovod 0.28.1 wheel from its unpacked source release, offline.
#
#   SRC=horovod-0.28.1 PY=.venv/bin/python WHEELDIR=out GPU_OPS=auto bash scripts/build-horovod.sh
#   PY=.venv/bin/python bash scripts/build-horovod.sh --gpu-ops   # print what auto picks
#   SRC=... PY=... WHEELDIR=... bash scripts/build-horovod.sh --patch-only   # patch, no build
#   PATCHES=none ...   # stock 0.28.1: only the build fixes below, none of hpcdp's patches
#
# Called by setup-python.sh (which downloads the source release) and usable on
# its own on a node that cannot reach a package index. What it does:
# - PyTorch >= 2.1 headers need C++17 and newer ones C++20; the release pins
#   C++14: every `CMAKE_CXX_STANDARD 14` becomes 17, and that of the PyTorch
#   library (horovod/torch, which compiles Horovod's common sources beside
#   PyTorch's headers) the standard PyTorch builds its own extensions with
#   (torch.utils.cpp_extension: C++17 in torch 2.6, C++20 in later releases,
#   whose headers need it from 2.15 on; at least 17; TORCH_CXX_STANDARD
#   overrides it).
# - CMake >= 4 refuses the bundled Gloo's cmake_minimum_required(2.8.12):
#   CMAKE_POLICY_VERSION_MINIMUM=3.5 (CMake 3.x ignores it).
# - Wake on enqueue, Gloo yielding when busy, and two-rank Gloo all-reduce in
#   one exchange (scripts/*.patch): see below. PATCHES=hpcdp (the default) or
#   none (stock Horovod with only the build fixes).
# - Controllers: MPI when mpicc is found (HPCDP_HVD_MPI=0 to leave it out), and
#   Gloo always.
# - GPU_OPS: NCCL | none | auto (NCCL when nvcc is found and torch is a CUDA
#   build of the same CUDA major version: a CUDA 12 torch beside a CUDA 13 nvcc
#   gets none, and NCCL asked for there is refused). With NCCL: CUDA code only for the GPU architectures torch itself was
#   built for (CUDA 13 dropped the old ones in Horovod's default list; override
#   with HOROVOD_BUILD_CUDA_CC_LIST), and NCCL from the system (HOROVOD_NCCL_HOME,
#   or the CUDA root) or else from torch's own nvidia-nccl package.
set -euo pipefail
: "${PY:?PY: the python that has torch}"
GPU_OPS=${GPU_OPS:-auto}
PATCHES=${PATCHES:-hpcdp}
log() { echo "build-horovod: $*"; }
die() { echo "build-horovod: error: $*" >&2; exit 1; }

# The GPU operations: NCCL when torch is a CUDA build and nvcc can be found (torch is
# imported, seconds, only when that is to be found out).
torch_cuda_version() { "$PY" -c 'import torch; print(torch.version.cuda or "")'; }
nvcc_cuda_version() { "$nvcc" --version | sed -n 's/.*release \([0-9][0-9.]*\),.*/\1/p' | head -n1; }
nvcc=""
if [ -n "${CUDA_HOME:-}" ] && [ -x "$CUDA_HOME/bin/nvcc" ]; then nvcc=$CUDA_HOME/bin/nvcc
elif command -v nvcc >/dev/null 2>&1; then nvcc=$(command -v nvcc)
elif [ -x /usr/local/cuda/bin/nvcc ]; then nvcc=/usr/local/cuda/bin/nvcc; fi
if [ "$GPU_OPS" = auto ]; then
  GPU_OPS=none
  if [ -n "$nvcc" ]; then
    torch_cuda=$(torch_cuda_version)
    if [ -n "$torch_cuda" ] && [ "${torch_cuda%%.*}" = "$(nvcc_cuda_version | cut -d. -f1)" ]; then
      GPU_OPS=NCCL
    elif [ -n "$torch_cuda" ]; then
      log "torch is built with CUDA $torch_cuda, $nvcc is CUDA $(nvcc_cuda_version): GPU ops none" >&2
    fi
  fi
fi
if [ "${1:-}" = --gpu-ops ]; then echo "$GPU_OPS"; exit 0; fi

: "${SRC:?SRC: the unpacked horovod-0.28.1 source release}"
: "${WHEELDIR:?WHEELDIR: where the wheel goes}"

SRC=$(cd "$SRC" && pwd)
mkdir -p "$WHEELDIR"
WHEELDIR=$(cd "$WHEELDIR" && pwd)
grep -q '^Version: 0.28.1$' "$SRC/PKG-INFO" || die "$SRC is not the horovod 0.28.1 source release"

# Horovod's setup.py asks for these at build time (setup_requires) and would try to
# download any that is missing: name them instead, for offline nodes.
missing=$("$PY" - <<'PYEOF'
import importlib.util
need = {"cffi": "cffi", "cloudpickle": "cloudpickle", "psutil": "psutil", "yaml": "pyyaml",
        "packaging": "packaging", "setuptools": "setuptools", "wheel": "wheel", "torch": "torch"}
print(" ".join(pkg for mod, pkg in need.items() if importlib.util.find_spec(mod) is None))
PYEOF
)
[ -z "$missing" ] || die "$PY lacks what Horovod's build needs: $missing (pip install $missing)"

# The C++ standard torch's own extension builder passes (-std=c++NN in
# torch/utils/cpp_extension.py, read without importing torch), at least 17.
torch_cxx_standard() {
  "$PY" - <<'PYEOF'
import importlib.util, pathlib, re
origin = importlib.util.find_spec("torch").origin
text = (pathlib.Path(origin).parent / "utils" / "cpp_extension.py").read_text()
print(max([17, *map(int, re.findall(r"-std=c\+\+(\d\d)\b", text))]))
PYEOF
}
torch_std=${TORCH_CXX_STANDARD:-$(torch_cxx_standard)}
case "$torch_std" in 17|20|23) ;; *) die "TORCH_CXX_STANDARD=$torch_std: 17, 20 or 23" ;; esac
# (grep finds nothing in a source tree patched by an earlier run: not an error. The
# PyTorch library's file goes first, so that a retried run sets it again.)
torch_cmake="$SRC/horovod/torch/CMakeLists.txt"
if [ -f "$torch_cmake" ]; then
  sed -i -E "s/CMAKE_CXX_STANDARD (14|17|20|23)\)/CMAKE_CXX_STANDARD $torch_std)/" "$torch_cmake"
fi
{ grep -rl --include=CMakeLists.txt 'CMAKE_CXX_STANDARD 14' "$SRC" || true; } \
  | xargs -r sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/'
if grep -rq --include=CMakeLists.txt 'CMAKE_CXX_STANDARD 14' "$SRC"; then
  die "failed to switch Horovod's C++ standard to 17"
fi
# hpcdp's three behavioural patches, each applied once per tree (a marker it adds
# tells whether a tree has it; the markers stay in the library, where `hpcdp
# doctor` and hpcdp.runtime.hvd_build read them). Each is off unless its variable
# is set to 1, so the patched library behaves, and talks on the wire, as stock
# Horovod does for any program that does not ask; hpcdp.runtime.hvd_settings sets
# them where the build has them:
# - scripts/horovod-wake-on-enqueue.patch (HOROVOD_WAKE_ON_ENQUEUE, set for CPU
#   training): the background thread starts a cycle as soon as a tensor is
#   enqueued instead of sleeping out the cycle time, so a step's last all-reduce
#   does not wait up to a cycle.
# - scripts/gloo-yield-when-busy.patch (HOROVOD_GLOO_YIELD_WHEN_BUSY): Gloo's TCP
#   event loop, finding a connection locked by the thread sending on it, yields
#   its core before trying again instead of spinning; with a rank pinned to one
#   core the spin kept the sender off the core for milliseconds
#   (docs/benchmarks.md, 2026-12-02).
# - scripts/horovod-gloo-pair-allreduce.patch (HOROVOD_GLOO_PAIR_ALLREDUCE): between
#   exactly two ranks, Gloo all-reduces of up to 256 KiB (a small model's
#   gradients, and the controller's per-cycle negotiation) go as one exchange of
#   the whole buffer each way instead of Gloo's ring of four segments in two
#   phases. It changes the messages on the wire: every rank of a job must agree
#   (hpcdp checks the build identities at start, hpcdp.runtime.build_guard).
apply_patch() {  # apply_patch NAME FILE-THAT-HAS-THE-MARKER MARKER
  local patch_file
  patch_file="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$1"
  grep -q "$3" "$SRC/$2" && return 0
  if command -v patch >/dev/null 2>&1; then
    patch -d "$SRC" -p1 --forward --quiet < "$patch_file" || die "failed to apply $patch_file"
  elif command -v git >/dev/null 2>&1; then
    (cd "$SRC" && git apply -p1 "$patch_file") || die "failed to apply $patch_file"
  else
    die "neither patch nor git is installed to apply $patch_file (apt-get install patch)"
  fi
  grep -q "$3" "$SRC/$2" || die "$patch_file applied, but $2 lacks $3"
}
case "$PATCHES" in
  hpcdp)
    apply_patch horovod-wake-on-enqueue.patch horovod/common/operations.cc HOROVOD_WAKE_ON_ENQUEUE
    apply_patch gloo-yield-when-busy.patch third_party/gloo/gloo/transport/tcp/pair.cc \
      hpcdp-gloo-yield-when-busy-2
    apply_patch horovod-gloo-pair-allreduce.patch horovod/common/ops/gloo_operations.cc \
      hpcdp-gloo-pair-allreduce-2
    patched="C++17 (C++$torch_std with torch), wake on enqueue, Gloo yields when busy, pair all-reduce" ;;
  none)
    if grep -rqs -e hpcdp-gloo -e HOROVOD_WAKE_ON_ENQUEUE "$SRC/horovod/common" \
         "$SRC/third_party/gloo/gloo/transport/tcp"; then
      die "$SRC already has hpcdp's patches: unpack the release afresh for a stock build"
    fi
    patched="C++17 (C++$torch_std with torch) only (stock Horovod)" ;;
  *) die "PATCHES=$PATCHES: hpcdp or none" ;;
esac
if [ "${1:-}" = --patch-only ]; then
  log "patched $SRC ($patched); not building"
  exit 0
fi

# Horovod compiles its PyTorch library with CUDA whenever torch is a CUDA build and torch
# finds a CUDA root, whatever GPU_OPS says. Without NCCL, and with no nvcc of torch's CUDA
# major version (a CUDA 12 torch beside CUDA 13), that build cannot work: the library is
# then built for CPU tensors only.
if [ "$GPU_OPS" = none ] && [ -n "$(torch_cuda_version)" ]; then
  torch_cuda=$(torch_cuda_version)
  if [ -z "$nvcc" ] || [ "${torch_cuda%%.*}" != "$(nvcc_cuda_version | cut -d. -f1)" ]; then
    find_torch="$SRC/cmake/Modules/FindPytorch.cmake"
    sed -i 's/print(True if ((torch.version.cuda is not None) and (CUDA_HOME is not None)) else False)/print(False)/' \
      "$find_torch"
    grep -q 'CUDA_HOME is not None' "$find_torch" && die "failed to build $find_torch without CUDA"
    log "torch is built with CUDA $torch_cuda and no nvcc of CUDA ${torch_cuda%%.*} is found: Horovod's PyTorch library is built for CPU tensors only"
  fi
fi

# GCC >= 13 no longer includes <string>, <stdexcept> or <cstdint> through other
# standard headers, and some of the release's files rely on that (group_table.h,
# common.h): include them in every C++ file rather than patch file by file.
env_args=(HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
          HOROVOD_WITH_GLOO=1 CMAKE_POLICY_VERSION_MINIMUM=3.5
          CXXFLAGS="${CXXFLAGS:-} -include cstdint -include string -include stdexcept"
          MAKEFLAGS="-j${JOBS:-$(nproc)}")
if [ "${HPCDP_HVD_MPI:-1}" = 1 ] && command -v mpicc >/dev/null 2>&1; then
  env_args+=(HOROVOD_WITH_MPI=1); log "controllers: MPI ($(command -v mpicc)) and Gloo"
else
  env_args+=(HOROVOD_WITHOUT_MPI=1); log "controllers: Gloo only (no mpicc)"
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ "$GPU_OPS" = NCCL ]; then
  [ -n "$nvcc" ] || die "GPU_OPS=NCCL but no nvcc (set CUDA_HOME or put nvcc on PATH)"
  torch_cuda=$(torch_cuda_version)
  [ -n "$torch_cuda" ] || die "GPU_OPS=NCCL but torch is not a CUDA build"
  nvcc_cuda=$(nvcc_cuda_version)
  [ "${torch_cuda%%.*}" = "${nvcc_cuda%%.*}" ] \
    || die "GPU_OPS=NCCL but torch is built with CUDA $torch_cuda and $nvcc is CUDA $nvcc_cuda: use an nvcc of CUDA ${torch_cuda%%.*} (CUDA_HOME) or a torch built for CUDA ${nvcc_cuda%%.*}"
  # The CUDA root as nvcc itself reports it (the nvcc on PATH may be a wrapper).
  : > "$tmp/probe.cu"
  cuda_home=$("$nvcc" -dryrun -c "$tmp/probe.cu" -o "$tmp/probe.o" 2>&1 \
              | sed -n 's/^#\$ TOP=//p' | head -n1)
  [ -n "$cuda_home" ] && [ -d "$cuda_home" ] || cuda_home=$(dirname "$(dirname "$nvcc")")
  cuda_home=$(cd "$cuda_home" && pwd)
  cc_list=${HOROVOD_BUILD_CUDA_CC_LIST:-$("$PY" -c '
import torch
# The architectures torch was compiled for (get_arch_list() is empty without a driver).
flags = getattr(torch._C, "_cuda_getArchFlags", lambda: "")() or ""
archs = {a[3:] for a in flags.split() if a.startswith("sm_") and a[3:].isdigit()}
print(",".join(sorted(archs, key=int)))')}
  [ -n "$cc_list" ] || die "torch names no sm_ architectures; set HOROVOD_BUILD_CUDA_CC_LIST (e.g. 90)"
  env_args+=(HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_BUILD_CUDA_CC_LIST="$cc_list"
             HOROVOD_CUDA_HOME="$cuda_home" CUDA_HOME="$cuda_home" CUDACXX="$cuda_home/bin/nvcc"
             HOROVOD_NCCL_LINK=SHARED)
  if [ -n "${HOROVOD_NCCL_HOME:-}" ]; then
    env_args+=(HOROVOD_NCCL_HOME="$HOROVOD_NCCL_HOME"); nccl_from=$HOROVOD_NCCL_HOME
  elif compgen -G "$cuda_home/lib*/libnccl.so*" >/dev/null \
       || compgen -G "/usr/lib/*-linux-gnu/libnccl.so" >/dev/null; then
    nccl_from="the system"
  else
    # torch's nvidia-nccl package holds nccl.h and libnccl.so.2; CMake's
    # find_library wants a plain libnccl.so beside it.
    nccl_dir=$("$PY" -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null) \
      || die "no NCCL found: install it, set HOROVOD_NCCL_HOME, or use a torch with nvidia-nccl"
    [ -f "$nccl_dir/include/nccl.h" ] || die "$nccl_dir has no include/nccl.h"
    mkdir "$tmp/nccl"
    ln -s "$nccl_dir/lib/libnccl.so.2" "$tmp/nccl/libnccl.so"
    env_args+=(HOROVOD_NCCL_INCLUDE="$nccl_dir/include" HOROVOD_NCCL_LIB="$tmp/nccl")
    nccl_from=$nccl_dir
  fi
  log "GPU ops: NCCL ($nccl_from); CUDA $torch_cuda at $cuda_home, architectures $cc_list"
else
  log "GPU ops: none"
fi

rm -rf "$SRC/build"  # a CMake cache from an earlier try would keep its old settings
start=$(date +%s)
env "${env_args[@]}" PATH="${cuda_home:+$cuda_home/bin:}$PATH" \
  "$PY" -m pip wheel --no-index --no-build-isolation --no-deps -w "$WHEELDIR" "$SRC"
log "built in $(( $(date +%s) - start )) s: $(ls "$WHEELDIR"/horovod-0.28.1-*.whl)"
