#!/usr/bin/env bash
# The language-model demo, given a set-up venv: prepare the Markov corpus with 2
# ranks in parallel, train the tiny GPT with `horovodrun -np 2` on the CPUs, and
# print the validation loss against the chain's entropy rate (the loss no model
# beats). Fails unless val_loss <= entropy_rate_nats + DEMO_LM_MARGIN.
#
# Variables: VENV (default .venv), DEMO_LM_DATA (default data/markov),
# DEMO_LM_RUN (default runs/lm_markov; cleared first), DEMO_LM_MARGIN (default
# 0.05 nats/token), DEMO_NP (default 2).
set -euo pipefail

VENV=${VENV:-.venv}
PY="$VENV/bin/python"
DATA=${DEMO_LM_DATA:-data/markov}
RUN=${DEMO_LM_RUN:-runs/lm_markov}
MARGIN=${DEMO_LM_MARGIN:-0.05}
NP=${DEMO_NP:-2}

# Threads and MPI yielding are not exported: training and prep choose them from the
# CPUs each rank may use (hpcdp.hvd_settings), as for any plain command.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export HDF5_USE_FILE_LOCKING=FALSE PYTHONUNBUFFERED=1

say() { echo "demo-lm: $*"; }

say "preparing the Markov corpus with $NP ranks -> $DATA"
# --overwrite: the demo's own data folder is rewritten (the same seeded corpus) every run.
mpirun -np "$NP" --oversubscribe --bind-to none "$PY" datasets/markov.py --out "$DATA" --overwrite

say "training the tiny GPT with horovodrun -np $NP -> $RUN"
rm -rf "$RUN"  # the demo's own output folder: start fresh, never resume an old demo
start=$(date +%s)
"$VENV/bin/horovodrun" -np "$NP" -H "localhost:$NP" \
  "$PY" -m hpcdp.train --config hpcdp/configs/lm_markov.toml \
  "data.path=$DATA" "run.dir=$RUN"
secs=$(( $(date +%s) - start ))

"$PY" - "$RUN/summary.json" "$DATA/val.h5" "$MARGIN" "$secs" <<'PYEOF'
import json
import sys

import h5py

path, val_file, margin, secs = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
s = json.load(open(path))
with h5py.File(val_file, "r") as f:
    floor = float(f.attrs["entropy_rate_nats"])
gap = s["val_loss"] - floor
print()
print("demo-lm summary")
print(f"  validation loss      {s['val_loss']:.4f} nats/token (perplexity "
      f"{s['val_perplexity']:.3f}) on {s['val_samples']} windows")
print(f"  entropy rate         {floor:.4f} nats/token: the floor no model beats")
print(f"  gap                  {gap:+.4f} (target <= {margin})")
print(f"  throughput           {s['tokens_per_s']:.0f} tokens/s on {s['world_size']} ranks")
print(f"  steps, epochs        {s['steps']}, {s['epochs']} (training job took {secs}s)")
print(f"  run folder           {s['run_dir']}")
print(f"  checkpoint           {s['checkpoint']}")
if gap > margin:
    print(f"demo-lm: FAILED: validation loss {s['val_loss']:.4f} is more than {margin} above "
          f"the entropy rate {floor:.4f}", file=sys.stderr)
    sys.exit(1)
PYEOF
