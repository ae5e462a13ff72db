#!/usr/bin/env bash
# One GPU's throughput for the three workloads, eager and compiled (docs/gpu.md):
# the prepared run for a session with a device. Prints the versions, runs
# `hpcdp bench gpu` under a bound that leaves time in a 15-minute device budget,
# and copies the JSON and the log to $OUT when that is set.
#
#   scripts/gpu-bench.sh                      # python3 from PATH (or PY=...)
#   PY=.venv/bin/python OUT=/some/dir scripts/gpu-bench.sh [extra bench gpu options]
set -uo pipefail

PY=${PY:-python3}
BOUND=${GPU_BENCH_SECONDS:-540}
RESULTS=${RESULTS:-bench/results}
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$(pwd) PYTHONUNBUFFERED=1 HDF5_USE_FILE_LOCKING=FALSE
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$RESULTS"
log="$RESULTS/gpu-bench.log"

{
  date -u +"gpu-bench: %Y-%m-%d %H:%M UTC"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  "$PY" - <<'PYEOF'
import importlib
import torch
print(f"gpu-bench: torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"cuDNN {torch.backends.cudnn.version()}, GPUs {torch.cuda.device_count()}")
for name in ("h5py", "horovod", "numpy"):
    try:
        mod = importlib.import_module(name)
        print(f"gpu-bench: {name} {getattr(mod, '__version__', '?')}")
    except ImportError as e:
        print(f"gpu-bench: MISSING {name}: {e} (hpcdp imports it; install it first)")
PYEOF
} 2>&1 | tee "$log"

t0=$SECONDS
timeout --kill-after=15 "$BOUND" "$PY" -m hpcdp bench gpu --out "$RESULTS" "$@" 2>&1 | tee -a "$log"
rc=${PIPESTATUS[0]}
echo "gpu-bench: exit $rc after $((SECONDS - t0)) s (bound $BOUND s)" | tee -a "$log"
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT" && cp "$log" "$OUT/" && { cp "$RESULTS/gpu.json" "$OUT/" 2>/dev/null || true; }
fi
exit "$rc"
