# Layout. With GPUs per task (--gpus-per-task, --ntasks-per-gpu): the job's tasks,
# Slurm gives each its GPU(s). Other GPU jobs: one rank per GPU of each node, which
# needs the same GPU count on every node. Without GPUs: the job's tasks.
nodes="${SLURM_JOB_NUM_NODES:-1}"
# SLURM_GPUS_ON_NODE (Slurm >= 20.11), else --gpus-per-node's value ("4" or "a100:4").
gpus="${SLURM_GPUS_ON_NODE:-${SLURM_GPUS_PER_NODE##*:}}"
gpus="${gpus:-0}"
# Slurm's per-node lists, one value per node: "2(x3),1" -> "2 2 2 1".
per_node() {
  local item i items out=()
  IFS=, read -ra items <<< "$1"
  for item in "${items[@]}"; do
    if [[ "$item" =~ ^([0-9]+)\(x([0-9]+)\)$ ]]; then
      for (( i = 0; i < BASH_REMATCH[2]; i++ )); do out+=("${BASH_REMATCH[1]}"); done
    else
      out+=("$item")
    fi
  done
  echo "${out[*]}"
}
if [[ -n "${SLURM_GPUS_PER_TASK:-}${SLURM_NTASKS_PER_GPU:-}" ]]; then
  ntasks="${SLURM_NTASKS:-$nodes}"
  read -ra tasks_on <<< "$(per_node "${SLURM_TASKS_PER_NODE:-$ntasks}")"
  layout=(--ntasks="$ntasks")
elif (( gpus > 0 )); then
  if [[ -n "${SLURM_NTASKS_PER_NODE:-}" && "$SLURM_NTASKS_PER_NODE" != "$gpus" ]]; then
    log "error: one rank per GPU, but --ntasks-per-node=$SLURM_NTASKS_PER_NODE" \
        "differs from the $gpus GPUs per node"
    exit 2
  fi
  if (( nodes > 1 )) && [[ -n "${SLURM_GPUS:-}" && -z "${SLURM_GPUS_PER_NODE:-}" ]]; then
    log "error: --gpus=$SLURM_GPUS over $nodes nodes may give the nodes different GPU" \
        "counts, and one rank per GPU needs the same count on each: ask for" \
        "--gpus-per-node, or --gpus-per-task with --ntasks"
    exit 2
  fi
  ntasks=$(( nodes * gpus ))
  tasks_on=()
  for (( i = 0; i < nodes; i++ )); do tasks_on+=("$gpus"); done
  layout=(--ntasks="$ntasks" --ntasks-per-node="$gpus")
else
  ntasks="${SLURM_NTASKS:-$(( nodes * ${SLURM_NTASKS_PER_NODE:-1} ))}"
  read -ra tasks_on <<< "$(per_node "${SLURM_TASKS_PER_NODE:-$ntasks}")"
  layout=(--ntasks="$ntasks")
fi

# CPUs per rank: --cpus-per-task if given, else the fewest that any node can give each
# of its ranks (Slurm's per-node counts). srun needs the number: Slurm >= 22.05 reads
# SRUN_CPUS_PER_TASK and no longer passes sbatch's --cpus-per-task on.
read -ra cpus_on <<< "$(per_node "${SLURM_JOB_CPUS_PER_NODE:-${SLURM_CPUS_ON_NODE:-1}}")"
cpus_per_task="${SLURM_CPUS_PER_TASK:-}"
if [[ -z "$cpus_per_task" ]]; then
  for (( i = 0; i < ${#tasks_on[@]}; i++ )); do
    share=$(( ${cpus_on[i]:-${cpus_on[0]}} / (tasks_on[i] > 0 ? tasks_on[i] : 1) ))
    if [[ -z "$cpus_per_task" ]] || (( share < cpus_per_task )); then cpus_per_task=$share; fi
  done
  (( cpus_per_task >= 1 )) || cpus_per_task=1
fi
overcommit=()
for (( i = 0; i < ${#tasks_on[@]}; i++ )); do
  if (( ${cpus_on[i]:-${cpus_on[0]}} < tasks_on[i] * cpus_per_task )); then
    log "warning: ${cpus_on[i]:-${cpus_on[0]}} CPUs on node $i for ${tasks_on[i]} ranks," \
        "so ranks share CPUs; ask for --cpus-per-gpu, --cpus-per-task or --exclusive"
    overcommit=(--overcommit)
    export OMPI_MCA_mpi_yield_when_idle="${OMPI_MCA_mpi_yield_when_idle:-1}"
    break
  fi
done
export SRUN_CPUS_PER_TASK=$cpus_per_task
# Threads per rank, each rank's GPU and Horovod's fusion threshold and cycle time are
# chosen by hpcdp itself, from what the rank was given (its CPU affinity; the GPUs it
# sees; the Horovod it runs). An exported value (OMP_NUM_THREADS, HOROVOD_*) wins.

# Defaults the user can override by exporting them before sbatch.
export NCCL_ASYNC_ERROR_HANDLING="${NCCL_ASYNC_ERROR_HANDLING:-1}"
export TORCH_NCCL_ASYNC_ERROR_HANDLING="${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}"

read -ra srun_extra <<< "${HPCDP_SRUN_ARGS:-}"
srun_args=("${mpi[@]}" "${layout[@]}" --cpus-per-task="$cpus_per_task" "${overcommit[@]}"
           --kill-on-bad-exit=1 "${srun_options[@]}" "${srun_extra[@]}")
# `--script FILE [--]` first: the ranks run that script instead of hpcdp.train.
if [[ "${1:-}" == --script ]]; then
  [[ -n "${2:-}" && "$2" != -* ]] || { log "error: --script needs a file name"; exit 2; }
  entry=("$2")
  shift 2
  [[ "${1:-}" != -- ]] || shift
fi
# A container wraps the command alone: this shell, which requeues, stays outside.
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
pass() { [[ -z "$srun_pid" ]] || kill -"$1" "$srun_pid" 2>/dev/null || true; }
srun "${srun_args[@]}" "${command[@]}" &
srun_pid=$!
# Poll, not `wait`: a signal that cuts `wait` short just as srun ends loses srun's
# status in bash (wait then says 143, or -1). Traps run between the short sleeps.
while kill -0 "$srun_pid" 2>/dev/null; do sleep 0.5 || true; done
wait "$srun_pid" && status=0 || status=$?
log "ranks finished with exit status $status"

# @EXIT_REQUEUE@: the ranks stopped at a checkpoint and want a requeue they could not
# make (no scontrol inside a container, say). Requeue this job (this array task alone)
# unless its user is cancelling it; else fail: the training is unfinished.
if (( status == @EXIT_REQUEUE@ )); then
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
