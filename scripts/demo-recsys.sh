#!/usr/bin/env bash
# The recommendation demo, given a set-up venv: write the click log with 2 ranks,
# train the DLRM-style model with `horovodrun -np 2` on the CPUs, and set the
# validation AUC beside the file's oracle_auc (the best any model can reach) and
# baseline_auc (item popularity alone). Fails unless val_auc >= oracle_auc - 0.02
# and val_auc >= baseline_auc + 0.05 (the targets of docs/recsys.md).
#
# Variables: VENV (default .venv), DEMO_DATA (default data/clicks), DEMO_RUN
# (default runs/clicks; cleared first), DEMO_NP (default 2); extra arguments are
# config overrides (e.g. horovod.sparse_grads=dense).
set -euo pipefail

DEMO_NAME=demo-recsys
source "$(dirname "$0")/demo-common.sh"
DATA=${DEMO_DATA:-data/clicks}
RUN=${DEMO_RUN:-runs/clicks}
# Threads, yielding and pinning are not exported: training chooses them, as for any
# plain command (docs/runtime-settings.md).

demo_prepare "writing the click log" clicks.py "$DATA"
demo_train "the click model" hpcdp/configs/clicks.toml "$DATA" "$RUN" "$@"

"$PY" - "$RUN/summary.json" "$DATA/val.h5" "$TRAIN_SECS" <<'PYEOF'
import json
import sys

import h5py

summary, val, secs = sys.argv[1], sys.argv[2], sys.argv[3]
s = json.load(open(summary))
with h5py.File(val, "r") as f:
    oracle, baseline = float(f.attrs["oracle_auc"]), float(f.attrs["baseline_auc"])
auc = s["val_auc"]
print()
print("demo-recsys summary")
print(f"  val_auc       {auc:.4f} on {s['val_samples']} rows (log loss {s['val_logloss']:.4f})")
print(f"  oracle_auc    {oracle:.4f}  (gap {oracle - auc:.4f}; target <= 0.02)")
print(f"  baseline_auc  {baseline:.4f}  (lift {auc - baseline:.4f}; target >= 0.05)")
print(f"  throughput    {s['samples_per_s']:.0f} samples/s on {s['world_size']} ranks, "
      f"{s['steps']} steps (training job took {secs}s)")
print(f"  run folder    {s['run_dir']}")
run = s["run_dir"]
print("next (docs/using-a-model.md):")
print(f"  hpcdp eval --run {run}                      # score the checkpoint again (any file: --file)")
print(f"  hpcdp export {run} --out {run}/model        # model.safetensors + config.json")
if auc < oracle - 0.02 or auc < baseline + 0.05:
    print("demo-recsys: FAILED: val_auc misses a target", file=sys.stderr)
    sys.exit(1)
PYEOF
