#!/usr/bin/env bash
# The language-model demo, given a set-up venv: prepare the Markov corpus with 2
# ranks in parallel, train the tiny GPT with `horovodrun -np 2` on the CPUs, and
# print the validation loss against the chain's entropy rate (the loss no model
# beats). Fails unless val_loss <= entropy_rate_nats + DEMO_LM_MARGIN.
#
# Variables: VENV (default .venv), DEMO_LM_DATA (default data/markov),
# DEMO_LM_RUN (default runs/lm_markov; cleared first), DEMO_LM_MARGIN (default
# 0.05 nats/token), DEMO_NP (default 2), DEMO_LM_CONFIG (default
# hpcdp/configs/lm_markov.toml; hpcdp/configs/lm_markov_llama.toml trains a
# transformers Llama of the same shape instead).
set -euo pipefail

DEMO_NAME=demo-lm
source "$(dirname "$0")/demo-common.sh"
DATA=${DEMO_LM_DATA:-data/markov}
RUN=${DEMO_LM_RUN:-runs/lm_markov}
MARGIN=${DEMO_LM_MARGIN:-0.05}
CONFIG=${DEMO_LM_CONFIG:-hpcdp/configs/lm_markov.toml}

demo_prepare "preparing the Markov corpus" markov.py "$DATA"
demo_train "the model of $CONFIG" "$CONFIG" "$DATA" "$RUN"

"$PY" - "$RUN/summary.json" "$DATA/val.h5" "$MARGIN" "$TRAIN_SECS" <<'PYEOF'
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
print(f"  model                {s['model']}")
print(f"  validation loss      {s['val_loss']:.4f} nats/token (perplexity "
      f"{s['val_perplexity']:.3f}) on {s['val_samples']} windows")
print(f"  entropy rate         {floor:.4f} nats/token: the floor no model beats")
print(f"  gap                  {gap:+.4f} (target <= {margin})")
print(f"  throughput           {s['tokens_per_s']:.0f} tokens/s on {s['world_size']} ranks")
print(f"  steps, epochs        {s['steps']}, {s['epochs']} (training job took {secs}s)")
print(f"  run folder           {s['run_dir']}")
print(f"  checkpoint           {s['checkpoint']}")
run = s["run_dir"]
print("next (docs/using-a-model.md):")
print(f"  hpcdp generate {run} --tokens 200 --seed 1 --ids --out sample.npy   # sample the chain")
print(f"  python scripts/check-markov-sampling.py {run} {val_file}   # samples vs the chain")
print(f"  hpcdp export {run} --out {run}/model        # model.safetensors + config.json")
if gap > margin:
    print(f"demo-lm: FAILED: validation loss {s['val_loss']:.4f} is more than {margin} above "
          f"the entropy rate {floor:.4f}", file=sys.stderr)
    sys.exit(1)
PYEOF
