#!/usr/bin/env bash
# `make mutate`: mutation testing of the pure core (the modules listed under
# [tool.mutmut] in pyproject.toml) with the unit tests as the oracle, then a
# report per module (scripts/mutation_report.py). Takes about 35 minutes on 2 busy
# cores (figures: docs/testing.md); the reader's and partition's mutants dominate.
set -euo pipefail
VENV=${VENV:-.venv}
rm -rf mutants
# mutmut imports the mutated copy under mutants/; a PYTHONPATH would shadow it.
env -u PYTHONPATH "$VENV/bin/mutmut" run > mutants.log 2>&1 || {
  echo "mutate: mutmut run failed; see mutants.log" >&2; tail -n 20 mutants.log >&2; exit 2; }
env -u PYTHONPATH "$VENV/bin/mutmut" results > mutants/survivors.txt 2>/dev/null || true
"$VENV/bin/python" scripts/mutation_report.py
