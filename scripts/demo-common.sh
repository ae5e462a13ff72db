# The frame every demo shares, sourced by scripts/demo*.sh after they set DEMO_NAME
# (the prefix of their messages): the venv, the environment, preparing the data with
# DEMO_NP ranks, and training with horovodrun; each demo keeps its data, config and
# the summary it prints from summary.json.
#
# Variables: VENV (default .venv), DEMO_NP (default 2).

VENV=${VENV:-.venv}
PY="$VENV/bin/python"
NP=${DEMO_NP:-2}

say() { echo "$DEMO_NAME: $*"; }

if [[ ! -x $PY || ! -x $VENV/bin/horovodrun ]]; then
  echo "$DEMO_NAME: no set-up venv at $VENV (python and horovodrun): run make setup," \
    "or set VENV to one" >&2
  exit 1
fi

# Threads and MPI yielding are not exported: training and prep choose them from the
# CPUs each rank may use (docs/runtime-settings.md), as for any plain command.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export HDF5_USE_FILE_LOCKING=FALSE PYTHONUNBUFFERED=1

# demo_prepare MESSAGE RECIPE DATA: run datasets/RECIPE on NP ranks into DATA.
# --overwrite: the demo's own data folder is rewritten (the same seeded data) every run.
demo_prepare() {
  local message=$1 recipe=$2 data=$3
  say "$message with $NP ranks -> $data"
  mpirun -np "$NP" --oversubscribe --bind-to none "$PY" "datasets/$recipe" --out "$data" \
    --overwrite
}

# demo_train WHAT CONFIG DATA RUN [OVERRIDE...]: train with horovodrun -np NP from a
# fresh RUN folder (never resume an old demo); TRAIN_SECS is the job's wall time.
demo_train() {
  local what=$1 config=$2 data=$3 run=$4 start
  shift 4
  say "training $what with horovodrun -np $NP -> $run"
  rm -rf "$run"
  start=$(date +%s)
  "$VENV/bin/horovodrun" -np "$NP" -H "localhost:$NP" \
    "$PY" -m hpcdp.train --config "$config" "data.path=$data" "run.dir=$run" "$@"
  TRAIN_SECS=$(( $(date +%s) - start ))
}
