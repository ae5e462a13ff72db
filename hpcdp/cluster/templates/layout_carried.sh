# else with this shell's python3: a container runs the ranks (a launch prefix, or pyxis's
# --container-image) with the image's python, and the host's may have no hpcdp. So the
# program below carries the source of hpcdp.cluster.layout and of the one module it
# imports, and needs the standard library alone (Python 3.7 or later); with -I, no
# PYTHONPATH, user site or current folder can change what it runs.
layout_python="${HPCDP_BATCH_PYTHON:-python3}"
carried_layout() {
  "$layout_python" -I - <<'HPCDP_LAYOUT'
import sys
import types


def carry(name, source):
    """Module `name` from its source, registered before it runs so that it can be imported."""
    module = sys.modules[name] = types.ModuleType(name)
    exec(compile(source, name, "exec"), module.__dict__)
    return module


carry("hpcdp.runtime.env_counts", r'''@hpcdp.runtime.env_counts@''')
sys.exit(carry("hpcdp.cluster.layout", r'''@hpcdp.cluster.layout@''').main())
HPCDP_LAYOUT
}
layout_out="$(carried_layout)" || {
  status=$?
  (( status == 2 )) || log "error: $layout_python, running hpcdp.cluster.layout as this" \
    "script carries it, failed (exit status $status): the batch shell needs a python3" \
    "of 3.7 or later (or HPCDP_BATCH_PYTHON naming one)"
  exit "$status"
}
