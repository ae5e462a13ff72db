if (( $# == 0 )); then
  log "error: say what to prepare, e.g. 'digits --out data/digits'" \
      "or 'datasets/digits.py --out DIR'"
  exit 2
fi
if [[ "$1" == *.py ]]; then
  [[ -f "$1" ]] || { log "error: recipe $1 not found (relative to $PWD)"; exit 2; }
  command=("$python" "$@")
else
  command=("$python" -m hpcdp prep "$@")
fi
# A requeued run (see the trap below) continues from the blocks the stopped one
# completed: every recipe keeps them in OUT/.hpcdp-prep/ and takes --resume.
if (( ${SLURM_RESTART_COUNT:-0} > 0 )); then command+=(--resume); fi
# One thread per rank: the work is I/O and copying.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
ntasks="${SLURM_NTASKS:-1}"
log "job ${SLURM_JOB_ID:-?} (restart ${SLURM_RESTART_COUNT:-0}) on" \
    "${SLURM_JOB_NODELIST:-?}: $ntasks ranks: ${command[*]}"

# Before the time limit Slurm sends USR1 to this shell (--signal=B:USR1@...): it
# requeues the job, which stops the ranks (their completed blocks are on disk) and
# runs this script again with --resume. Nothing to save first: a block is written
# whole or not at all, so a plain kill loses at most the blocks in progress.
srun_pid=
# shellcheck disable=SC2329  # called by the USR1 trap
requeue() {
  local job="${SLURM_JOB_ID:-?}"
  [[ -z "${SLURM_ARRAY_TASK_ID:-}" ]] || job="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"
  if [[ -n "$srun_pid" ]] && ! kill -0 "$srun_pid" 2>/dev/null; then
    log "batch shell got USR1, but the ranks have finished: not requeued"
    return
  fi
  log "batch shell got USR1 (time limit near): requeueing job $job to resume"
  scontrol requeue "$job" ||
    log "error: scontrol requeue $job failed: the preparation is unfinished"
}
trap requeue USR1
srun "${mpi[@]}" --ntasks="$ntasks" --kill-on-bad-exit=1 "${command[@]}" &
srun_pid=$!
# Poll, not `wait`: the trap runs between the short sleeps, and srun's status survives.
while kill -0 "$srun_pid" 2>/dev/null; do sleep 0.5 || true; done
wait "$srun_pid" && status=0 || status=$?
log "ranks finished with exit status $status"
exit "$status"
