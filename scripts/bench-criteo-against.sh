#!/usr/bin/env bash
# The Criteo recipe of git revision REV and of this working tree, side by side in one run on
# the same generated logs and the same number of ranks: the recipe's own seconds for both id
# rules, and whether the written datasets are identical.
#
#   bash scripts/bench-criteo-against.sh REV [ROWS] [RANKS]
#
# REV is checked out in a temporary worktree; the logs (Terabyte-like cardinalities, about
# 250 bytes a row) are generated once under bench/criteo-against-data/ and reused. Runs the
# two trees alternately, OLD then NEW for each rule.
set -euo pipefail
REV=${1:?usage: bench-criteo-against.sh REV [ROWS] [RANKS]}
ROWS=${2:-4000000}
NP=${3:-2}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
DATA=$ROOT/bench/criteo-against-data/rows-$ROWS
OLD=$(mktemp -d)
trap 'git -C "$ROOT" worktree remove --force "$OLD" >/dev/null 2>&1 || rm -rf "$OLD"; rm -rf "$DATA/out-"*' EXIT
git -C "$ROOT" worktree add -q --detach "$OLD" "$REV"
if [ ! -f "$DATA/day_0.txt" ]; then
  mkdir -p "$DATA"
  PYTHONPATH=$ROOT "$PY" -m hpcdp.data.prep.clicks.criteo_synth --out "$DATA" --rows "$ROWS" \
    --val-rows 20000 --terabyte-like 1
fi
prep() { # tree name rule...
  local tree=$1 name=$2; shift 2
  rm -rf "$DATA/out-$name"
  (cd "$tree" && PYTHONPATH=$tree timeout 3600 mpirun -np "$NP" --bind-to none "$PY" \
     datasets/criteo.py --files "$DATA/day_0.txt" --val-files "$DATA/val.txt" "$@" \
     --out "$DATA/out-$name") > "$DATA/$name.log" 2>&1 || { tail -20 "$DATA/$name.log"; exit 1; }
  grep -Eo '[0-9.]+ s on [0-9]+ rank' "$DATA/$name.log" | cut -d' ' -f1
}
echo "rows $ROWS, $NP ranks: $REV against the working tree"
for rule in "--buckets 1000000" "--min-count 3"; do
  old=$(prep "$OLD" old $rule)
  new=$(prep "$ROOT" new $rule)
  same=$(PYTHONPATH=$ROOT "$PY" - "$DATA/out-old" "$DATA/out-new" <<'PYEOF'
import sys
import h5py
import numpy as np
a, b = sys.argv[1:]
same = True
for split in ("train.h5", "val.h5"):
    with h5py.File(f"{a}/{split}") as fa, h5py.File(f"{b}/{split}") as fb:
        same &= set(fa) == set(fb) and all(np.array_equal(fa[k][...], fb[k][...]) for k in fa)
print("identical" if same else "DIFFERENT")
PYEOF
)
  echo "$rule: $REV ${old} s, working tree ${new} s: $("$PY" -c "print(f\"{$old / $new:.2f}\")")x; datasets $same"
done
