"""data.stage_dir on the local two-node cluster: each node copies into its own stage dir.

The cluster's two nodes run on this one machine, so the stage dir names the node
(`$SLURMD_NODENAME`, expanded by hpcdp in each node's environment, not by the shell
that submits): node1 and node2 get separate folders, as two machines' local disks would.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
TRAIN_SBATCH = REPO / "slurm" / "train.sbatch"
CONFIG = REPO / "hpcdp" / "configs" / "digits.toml"


def test_two_nodes_each_stage_their_own_copy(slurm_cluster: Any, digits: tuple[Any, Path],
                                             tmp_path: Path) -> None:
    data, run_dir = digits[1], tmp_path / "run"
    stage_dir = f"{tmp_path}/local-$SLURMD_NODENAME/job-${{SLURM_JOB_ID}}"
    for node in ("node1", "node2"):
        (tmp_path / f"local-{node}").mkdir()
    job = slurm_cluster.sbatch(
        "--nodes=2", "--ntasks-per-node=1", str(TRAIN_SBATCH), "--config", str(CONFIG),
        f"run.dir={run_dir}", f"data.path={data}", f"data.stage_dir={stage_dir}",
        "run.max_steps=4", "log.tensorboard=false", "log.progress=false", cwd=tmp_path)
    job.wait(timeout=240)
    folders = {node: tmp_path / f"local-{node}" / f"job-{job.id}" for node in ("node1", "node2")}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["data_paths_read"] == {
        node: {"train": str(folder / "train.h5"), "val": str(folder / "val.h5")}
        for node, folder in folders.items()}, job.describe()
    for node, folder in folders.items():
        for name in ("train.h5", "val.h5"):
            assert (folder / name).read_bytes() == (data / name).read_bytes(), (node, name)
            record = json.loads((folder / f"{name}.hpcdp-stage.json").read_text())
            assert record["source"] == str(data / name)
        assert f"data staging on {node}: train copied" in job.output(), job.describe()
