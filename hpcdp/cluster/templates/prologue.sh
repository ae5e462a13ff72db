# ---- launch: the same for every allocation -------------------------------------------
log() { echo "[hpcdp.sbatch $(date -u +%H:%M:%S)] $*"; }
if [[ -n "${HPCDP_SETUP:-}" ]]; then
  [[ -f "$HPCDP_SETUP" ]] || { log "error: HPCDP_SETUP=$HPCDP_SETUP is not a file"; exit 2; }
  # shellcheck source=/dev/null  # the site's file, not this script's to lint
  source "$HPCDP_SETUP"
fi
if [[ -n "${HPCDP_VENV:-}" ]]; then
  [[ -f "$HPCDP_VENV/bin/activate" ]] || {
    log "error: HPCDP_VENV=$HPCDP_VENV has no bin/activate"; exit 2; }
  # shellcheck source=/dev/null
  source "$HPCDP_VENV/bin/activate"
fi
python="${HPCDP_PYTHON:-python3}"
# Job steps inherit sbatch's --export (NONE, or names without ALL) unless told
# otherwise; they get this shell's environment instead: the venv, the exports here.
export SLURM_EXPORT_ENV=ALL
# srun's MPI plugin: the site's MpiDefault unless HPCDP_SRUN_MPI names one
# (`srun --mpi=list` lists them; `hpcdp doctor` says which fits the MPI library).
mpi=()
[[ -z "${HPCDP_SRUN_MPI:-}" ]] || mpi=(--mpi="$HPCDP_SRUN_MPI")
# No file locking: parallel HDF5 on Lustre/GPFS/NFS often has none, and the ranks
# coordinate through MPI.
export HDF5_USE_FILE_LOCKING="${HDF5_USE_FILE_LOCKING:-FALSE}"
export PYTHONUNBUFFERED=1
