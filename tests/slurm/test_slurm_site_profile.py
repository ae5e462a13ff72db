"""A script rendered from a site profile, with a container prefix, run by the local cluster.

No container runtime exists on this machine: `apptainer` is a stand-in on PATH
that records what it was asked to run (and the variables it saw), then runs the
command on the host. What is checked is what the real cluster does with the
rendered script: the profile's setup lines and exports reach the ranks, every
rank's training command goes through `apptainer exec IMAGE`, and the job trains.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "hpcdp" / "configs" / "digits.toml"
#: The venv the tests run in (make test's VENV), which the jobs on the local cluster use.
VENV = Path(sys.prefix)
Cluster = Any  # tests/slurm/conftest.py's Cluster, reached through the fixture
Job = Any

STAND_IN = """#!/bin/bash
# Stand-in for apptainer: record the call and what the rank sees, then run the command.
echo "argv: $*" >> {log}
seen="HPCDP_FROM_SETUP=${{HPCDP_FROM_SETUP:-}} HPCDP_FROM_PROFILE=${{HPCDP_FROM_PROFILE:-}}"
echo "env: $seen" >> {log}
[ "$1" = exec ] || exit 64
shift
while [ $# -gt 0 ]; do
  case "$1" in --nv|--rocm) shift ;; --bind) shift 2 ;; --*) shift ;; *) break ;; esac
done
shift  # the image
exec "$@"
"""


@pytest.fixture
def data(digits: tuple[Job, Path]) -> Path:
    return digits[1]


def test_a_site_profile_with_a_container_trains_on_the_cluster(
        slurm_cluster: Cluster, data: Path, tmp_path: Path) -> None:
    bin_dir, log, image = tmp_path / "bin", tmp_path / "apptainer.log", tmp_path / "fake.sif"
    bin_dir.mkdir()
    image.write_bytes(b"")
    runtime = bin_dir / "apptainer"
    runtime.write_text(STAND_IN.format(log=log))
    runtime.chmod(0o755)
    profile = tmp_path / "here.toml"
    profile.write_text(f"""description = "the local test cluster"
venv = "{VENV}"
setup = ["export HPCDP_FROM_SETUP=1"]

[env]
HPCDP_FROM_PROFILE = "yes"

[container]
runtime = "apptainer"
image = "{image}"
""")
    script = tmp_path / "train.sbatch"
    rendered = subprocess.run(
        [sys.executable, "-m", "hpcdp", "slurm", "render", "--site", str(profile),
         "--ntasks-per-node", "2", "--out", str(script)],
        capture_output=True, text=True, timeout=60, cwd=REPO)
    assert rendered.returncode == 0, rendered.stderr
    run_dir = tmp_path / "run"
    job = slurm_cluster.sbatch(
        f"--output={tmp_path}/site-%j.out", str(script), "--config", str(CONFIG),
        f"run.dir={run_dir}", f"data.path={data}", "run.epochs=1000", "run.max_steps=6",
        "log.every_steps=2", "log.tensorboard=false", "log.progress=false",
        "checkpoint.every_steps=100000", cwd=tmp_path,
        env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
             "PYTHONPATH": str(REPO)})
    job.wait(timeout=180)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["world_size"] == 2, job.describe()
    calls = log.read_text().splitlines()
    argvs = [c for c in calls if c.startswith("argv: ")]
    assert len(argvs) == 2, calls  # one per rank, each through the runtime
    for argv in argvs:
        # --nv: the profile's container keeps the default GPU flag (nvidia).
        assert argv.startswith(f"argv: exec --nv {image} python3 -m hpcdp.train "), argv
    assert calls.count("env: HPCDP_FROM_SETUP=1 HPCDP_FROM_PROFILE=yes") == 2, calls
