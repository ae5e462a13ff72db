# Layout: how many ranks, spread how over the nodes, with how many CPUs each, from what
# Slurm granted (hpcdp.cluster.layout: one rank per GPU, or per task with GPUs per task
# or without GPUs; CPUs per rank from --cpus-per-task or the nodes' counts). It prints
# "ranks nodes GPUs/node CPUs/rank overcommit" and srun's layout options, or says what
# is wrong and exits 2. It runs here, in the batch shell, with HPCDP_BATCH_PYTHON if set,
__LAYOUT__
{ read -r ntasks nodes gpus cpus_per_task overcommit; read -ra layout; } <<< "$layout_out"
# Ranks that share CPUs yield them while they wait in MPI (an exported value wins).
if (( overcommit )); then
  export OMPI_MCA_mpi_yield_when_idle="${OMPI_MCA_mpi_yield_when_idle:-1}"
fi
export SRUN_CPUS_PER_TASK=$cpus_per_task
# Threads per rank, each rank's GPU and Horovod's fusion threshold and cycle time are
# chosen by hpcdp itself, from what the rank was given (its CPU affinity; the GPUs it
# sees; the Horovod it runs). An exported value (OMP_NUM_THREADS, HOROVOD_*) wins.

# Defaults the user can override by exporting them before sbatch.
export NCCL_ASYNC_ERROR_HANDLING="${NCCL_ASYNC_ERROR_HANDLING:-1}"
export TORCH_NCCL_ASYNC_ERROR_HANDLING="${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}"

read -ra srun_extra <<< "${HPCDP_SRUN_ARGS:-}"
srun_args=("${mpi[@]}" "${layout[@]}" --kill-on-bad-exit=1 "${srun_options[@]}"
           "${srun_extra[@]}")
# `--script FILE [--]` first: the ranks run that script instead of hpcdp.train.
if [[ "${1:-}" == --script ]]; then
  [[ -n "${2:-}" && "$2" != -* ]] || { log "error: --script needs a file name"; exit 2; }
  entry=("$2")
  shift 2
  [[ "${1:-}" != -- ]] || shift
fi
# A container wraps the command alone: this shell, which requeues, stays outside.
# shellcheck disable=SC2154  # signal_args: rendered only for a signal not caught by default
command=("${launch_prefix[@]}" "$python" "${entry[@]}" "${train_args[@]}" "$@"
         "${signal_args[@]}")
if (( ${#launch_prefix[@]} )) && ! command -v "${launch_prefix[0]}" > /dev/null; then
  log "error: container runtime ${launch_prefix[0]} not found on" \
      "${SLURMD_NODENAME:-$HOSTNAME} (load its module in the site profile)"
  exit 2
fi
log "job ${SLURM_JOB_ID:-?} (restart ${SLURM_RESTART_COUNT:-0}) on ${SLURM_JOB_NODELIST:-?}:" \
    "$ntasks ranks, $nodes node(s), $gpus GPU(s)/node, $cpus_per_task CPU(s)/rank," \
    "MPI plugin ${HPCDP_SRUN_MPI:-of the site}"
log "srun ${srun_args[*]} ${command[*]}"

# srun runs in the background so this shell can pass signals on and outlive the
# ranks: a batch shell that died early would end the job while rank 0 is still
# writing its checkpoint. Slurm sends TERM (time limit, scancel, requeue) to the
# ranks itself, and srun turns a TERM of its own into a kill, so TERM is only logged.
# The traps come first: a signal that came before them would end this shell.
srun_pid=
trap 'log "batch shell got TERM; the ranks get it from Slurm"' TERM
trap 'log "batch shell got USR1; passing it to the ranks"; pass USR1' USR1
trap 'log "batch shell got USR2; passing it to the ranks"; pass USR2' USR2
# shellcheck disable=SC2329  # called by the USR1 and USR2 traps
pass() { [[ -z "$srun_pid" ]] || kill -"$1" "$srun_pid" 2>/dev/null || true; }
srun "${srun_args[@]}" "${command[@]}" &
srun_pid=$!
# Poll, not `wait`: a signal that cuts `wait` short just as srun ends loses srun's
# status in bash (wait then says 143, or -1). Traps run between the short sleeps.
while kill -0 "$srun_pid" 2>/dev/null; do sleep 0.5 || true; done
wait "$srun_pid" && status=0 || status=$?
log "ranks finished with exit status $status"

# __EXIT_REQUEUE__: the ranks stopped at a checkpoint and want a requeue they could not
# make (no scontrol inside a container, say). Requeue this job (this array task alone)
# unless its user is cancelling it; else fail: the training is unfinished.
if (( status == __EXIT_REQUEUE__ )); then
  job="${SLURM_JOB_ID:-?}"
  [[ -z "${SLURM_ARRAY_TASK_ID:-}" ]] || job="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"
  shown="$(scontrol show job -o "$job" 2>&1)" || shown=""
  if [[ "$shown" =~ JobState=(COMPLETING|CANCELLED) && ! "$shown" =~ Reason=(TimeLimit|Preempted) ]]
  then
    log "job $job is being cancelled: not requeued, the training is unfinished"
  elif scontrol requeue "$job"; then
    log "requeued job $job from the batch shell"
    status=0
  else
    log "error: scontrol requeue $job failed: the training is unfinished"
  fi
fi
exit "$status"
