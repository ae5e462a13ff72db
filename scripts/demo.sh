#!/usr/bin/env bash
# The demo, given a set-up venv: prepare the 8x8 digits with 2 ranks in
# parallel, train the small CNN with `horovodrun -np 2` on the CPUs, and print
# a short summary. Fails unless the validation accuracy reaches DEMO_MIN_ACC.
#
# Variables: VENV (default .venv), DEMO_DATA (default data/digits),
# DEMO_RUN (default runs/digits; cleared first), DEMO_MIN_ACC (default 0.95),
# DEMO_NP (default 2).
set -euo pipefail

VENV=${VENV:-.venv}
PY="$VENV/bin/python"
DATA=${DEMO_DATA:-data/digits}
RUN=${DEMO_RUN:-runs/digits}
MIN_ACC=${DEMO_MIN_ACC:-0.95}
NP=${DEMO_NP:-2}

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1 HDF5_USE_FILE_LOCKING=FALSE
export PYTHONUNBUFFERED=1

say() { echo "demo: $*"; }

say "preparing the digits with $NP ranks -> $DATA"
# --overwrite: the demo's own data folder is rewritten (the same digits) on every run.
mpirun -np "$NP" --oversubscribe --bind-to none "$PY" datasets/digits.py --out "$DATA" --overwrite

say "training the small CNN with horovodrun -np $NP -> $RUN"
rm -rf "$RUN"  # the demo's own output folder: start fresh, never resume an old demo
start=$(date +%s)
"$VENV/bin/horovodrun" -np "$NP" -H "localhost:$NP" \
  "$PY" -m hpcdp.train --config hpcdp/configs/digits.toml \
  "data.path=$DATA" "run.dir=$RUN"
secs=$(( $(date +%s) - start ))

"$PY" - "$RUN/summary.json" "$MIN_ACC" "$secs" <<'PYEOF'
import json
import sys

path, min_acc, secs = sys.argv[1], float(sys.argv[2]), sys.argv[3]
s = json.load(open(path))
print()
print("demo summary")
print(f"  validation accuracy  {s['val_acc']:.4f} on {s['val_samples']} samples "
      f"(target >= {min_acc})")
print(f"  throughput           {s['samples_per_s']:.0f} samples/s on {s['world_size']} ranks")
print(f"  steps, epochs        {s['steps']}, {s['epochs']} (training job took {secs}s)")
print(f"  run folder           {s['run_dir']}")
print(f"  checkpoint           {s['checkpoint']}")
print(f"  metrics (JSONL)      {s['metrics']}")
print(f"  TensorBoard events   {s['tensorboard']}  (tensorboard --logdir {s['tensorboard']})")
if s["val_acc"] < min_acc:
    print(f"demo: FAILED: validation accuracy {s['val_acc']:.4f} < {min_acc}", file=sys.stderr)
    sys.exit(1)
PYEOF
