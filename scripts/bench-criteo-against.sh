#!/usr/bin/env bash
# The Criteo recipe of git revision REV and of this working tree, side by side in one run on
# the same generated logs and the same number of ranks: the recipe's own seconds for both id
# rules, and whether the written files are identical (every dataset's values, dtype, shape and
# chunks, and every attribute; and whether their bytes are).
#
#   bash scripts/bench-criteo-against.sh REV [ROWS] [RANKS] [ROUNDS]
#
# REV is checked out in a temporary worktree; the logs (Terabyte-like cardinalities, about
# 250 bytes a row) are generated once under bench/criteo-against-data/ and reused. Runs the
# two trees alternately, OLD then NEW, ROUNDS times (default 1) for each rule; the files are
# compared after each pair.
set -euo pipefail
REV=${1:?usage: bench-criteo-against.sh REV [ROWS] [RANKS]}
ROWS=${2:-4000000}
NP=${3:-2}
ROUNDS=${4:-1}
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
same() { # the files of the last OLD and NEW run
  PYTHONPATH=$ROOT "$PY" - "$DATA/out-old" "$DATA/out-new" <<'PYEOF'
import filecmp
import sys
import h5py
import numpy as np
a, b = sys.argv[1:]
def attrs(obj):
    return {k: (type(v), np.asarray(v).tolist()) for k, v in obj.attrs.items()}
same = bytes_same = True
for split in ("train.h5", "val.h5"):
    bytes_same &= filecmp.cmp(f"{a}/{split}", f"{b}/{split}", shallow=False)
    with h5py.File(f"{a}/{split}") as fa, h5py.File(f"{b}/{split}") as fb:
        same &= set(fa) == set(fb) and attrs(fa) == attrs(fb) and all(
            (fa[k].dtype, fa[k].shape, fa[k].chunks, attrs(fa[k]))
            == (fb[k].dtype, fb[k].shape, fb[k].chunks, attrs(fb[k]))
            and np.array_equal(fa[k][...], fb[k][...]) for k in fa)
print(("identical" + (", bytes too" if bytes_same else "")) if same else "DIFFERENT")
PYEOF
}
echo "rows $ROWS, $NP ranks, $ROUNDS round(s): $REV against the working tree"
for rule in "--buckets 1000000" "--min-count 3"; do
  olds=() news=() files=()
  for _ in $(seq "$ROUNDS"); do
    olds+=("$(prep "$OLD" old $rule)")
    news+=("$(prep "$ROOT" new $rule)")
    files+=("$(same)")
  done
  "$PY" - "$REV" "$rule" "${olds[*]}" "${news[*]}" "${files[*]}" <<'PYEOF'
import statistics
import sys
rev, rule, olds, news, files = sys.argv[1:]
old, new = [float(x) for x in olds.split()], [float(x) for x in news.split()]
ratio = statistics.median(old) / statistics.median(new)
print(f"{rule}: {rev} {' '.join(f'{x:.2f}' for x in old)} s, working tree "
      f"{' '.join(f'{x:.2f}' for x in new)} s: {ratio:.2f}x (medians); files "
      + ("DIFFERENT" if "DIFFERENT" in files else "identical"
         + (", bytes too" if files.count("bytes too") == len(old) else "") + " in every round"))
PYEOF
done
