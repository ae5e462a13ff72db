"""`hpcdp doctor` on this machine, alone and under launchers."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.parallel

DOCTOR = [sys.executable, "-m", "hpcdp", "doctor"]


def test_doctor_single_process_passes():
    out = subprocess.run(DOCTOR, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "controllers MPI, Gloo" in out.stdout
    assert "parallel (mpio): True" in out.stdout


@pytest.mark.parametrize("launcher", ["horovodrun", "horovodrun-gloo", "mpirun"])
def test_doctor_under_launcher_checks_placement(ranks, launcher):
    run = ranks(DOCTOR, np=2, launcher=launcher, timeout=120)
    assert "2 ranks on 1 host(s)" in run.output, run.describe()
    assert "everything needed is in place" in run.output, run.describe()
    # What training sets on the node, for both ranks (hpcdp's launcher exports the rule's
    # values for 2 ranks, so no oversubscription).
    assert re.search(r"ok +runtime +\S+, ranks 0-1: training sets threads \d+", run.output), \
        run.describe()


def test_doctor_reports_two_ranks_on_one_gpu(ranks):
    # Both ranks are told they see only GPU 5: binding must collide and fail.
    run = ranks(DOCTOR, np=2, timeout=120, env={"CUDA_VISIBLE_DEVICES": "5"}, expect_ok=False)
    assert run.returncode != 0, run.describe()
    assert "are all bound to GPU 5" in run.output, run.describe()
