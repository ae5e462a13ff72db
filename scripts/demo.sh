#!/usr/bin/env bash
# The demo, given a set-up venv: prepare the 8x8 digits with 2 ranks in
# parallel, train the small CNN with `horovodrun -np 2` on the CPUs, and print
# a short summary. Fails unless the validation accuracy reaches DEMO_MIN_ACC.
#
# Variables: VENV (default .venv), DEMO_DATA (default data/digits),
# DEMO_RUN (default runs/digits; cleared first), DEMO_MIN_ACC (default 0.95),
# DEMO_NP (default 2).
set -euo pipefail

DEMO_NAME=demo
source "$(dirname "$0")/demo-common.sh"
DATA=${DEMO_DATA:-data/digits}
RUN=${DEMO_RUN:-runs/digits}
MIN_ACC=${DEMO_MIN_ACC:-0.95}

demo_prepare "preparing the digits" digits.py "$DATA"
demo_train "the small CNN" hpcdp/configs/digits.toml "$DATA" "$RUN"

"$PY" - "$RUN/summary.json" "$MIN_ACC" "$TRAIN_SECS" <<'PYEOF'
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
run = s["run_dir"]
print("next (docs/using-a-model.md):")
print(f"  hpcdp eval --run {run}                      # score the checkpoint again (any file: --file)")
print(f"  hpcdp export {run} --out {run}/model        # model.safetensors + config.json")
print(f"  hpcdp predict {run}/model IMAGE...          # top classes of image files")
if s["val_acc"] < min_acc:
    print(f"demo: FAILED: validation accuracy {s['val_acc']:.4f} < {min_acc}", file=sys.stderr)
    sys.exit(1)
PYEOF
