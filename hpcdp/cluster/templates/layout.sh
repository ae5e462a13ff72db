# else with the ranks' python, which imports hpcdp (no container runs them).
layout_python="${HPCDP_BATCH_PYTHON:-$python}"
layout_out="$("$layout_python" -m hpcdp.cluster.layout)" || {
  status=$?
  (( status == 2 )) || log "error: $layout_python -m hpcdp.cluster.layout failed" \
    "(exit status $status): the batch shell needs a python that imports hpcdp" \
    "(HPCDP_VENV, HPCDP_PYTHON or HPCDP_BATCH_PYTHON)"
  exit "$status"
}
