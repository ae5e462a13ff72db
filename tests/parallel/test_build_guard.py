"""A job whose ranks run different Horovod builds stops at start, naming them.

Without the check a Gloo job mixing the pair all-reduce with Gloo's ring waits
in Horovod's first negotiation until Gloo's timeout, and an MPI job runs on
with ranks that behave differently.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdp.runtime import hvd_settings
from hpcdp.runtime.launcher import kill_group, rank_environment

pytestmark = pytest.mark.parallel

WORKER = Path(__file__).resolve().parent / "workers" / "build_guard.py"
PAIR = "gloo-pair-allreduce"
needs_pair = pytest.mark.skipif(PAIR not in hvd_settings.horovod_patches(),
                                reason="needs a Horovod with hpcdp's pair all-reduce patch")


def assert_stopped(output: str, ranks: int = 2) -> None:
    assert output.count("different Horovod builds") == ranks, output
    assert output.count("stopped after") == ranks, output
    assert "rank 0 on " in output and "rank 1 on " in output, output  # ranks and hosts named


@needs_pair
@pytest.mark.parametrize("launcher", ["horovodrun-gloo", "mpirun"])
def test_a_rank_without_the_pair_allreduce_stops_the_job(ranks, launcher: str) -> None:
    run = ranks("build_guard", np=2, launcher=launcher, timeout=120, expect_ok=False,
                env={"HPCDP_TEST_RANK1_EXPORT": f"{hvd_settings.GLOO_PAIR_VAR}=0"})
    assert not run.timed_out and run.returncode != 0, run.describe()
    assert_stopped(run.output)
    assert "gloo-pair-allreduce (on)" in run.output, run.output  # both builds named
    assert "gloo-pair-allreduce (off)" in run.output, run.output
    # (The same build going on is what every training test's launch checks.)


two_venvs = pytest.mark.skipif(
    not os.environ.get("HPCDP_OTHER_PYTHON"),
    reason="HPCDP_OTHER_PYTHON: a Python with another Horovod build (make test-stock sets it)")


def mpmd(tmp_path: Path, args: list[str]) -> tuple[int, str]:
    """mpirun's MPMD form: rank 0 on this Python's Horovod, rank 1 on HPCDP_OTHER_PYTHON's."""
    other = os.environ["HPCDP_OTHER_PYTHON"]
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "--tag-output",
           "-np", "1", sys.executable, *args, ":", "-np", "1", other, *args]
    env = rank_environment(np=2)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parents[2]),
                                                      env.get("PYTHONPATH")]))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=tmp_path, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        out, _ = proc.communicate()
        pytest.fail(f"the mixed job did not stop within 120 s:\n{out}")
    return proc.returncode, out


@two_venvs
def test_two_venvs_under_one_mpirun_stop(tmp_path: Path) -> None:
    code, out = mpmd(tmp_path, [str(WORKER)])
    assert code != 0, out
    assert_stopped(out)


@two_venvs
def test_doctor_names_two_venvs_builds(tmp_path: Path) -> None:
    code, out = mpmd(tmp_path, ["-m", "hpcdp", "doctor"])
    assert code != 0, out
    assert re.search(r"FAIL +hvd build +the ranks of this job run different Horovod builds",
                     out), out
