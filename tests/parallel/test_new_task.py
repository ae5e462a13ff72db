"""A new workload is one new module: a copy of the image task under another name trains.

The copy (tests/unit/test_task_discovery.py checks its config) lies in a temporary
folder that the training process adds to the hpcdp.tasks package's search path before
`hpcdp train` starts; `task.name=<copy>` then finds it by name like any task.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import hpcdp.tasks
from hpcdp.runtime.launcher import rank_environment

pytestmark = pytest.mark.parallel

# `hpcdp train`, with one more folder searched for the modules of hpcdp.tasks.
BOOT = ("import sys, hpcdp.tasks; hpcdp.tasks.__path__.append(sys.argv.pop(1)); "
        "from hpcdp.train.command import main; sys.exit(main(sys.argv[1:]))")


def copy_image_task(folder: Path, name: str) -> None:
    """hpcdp/tasks/image.py saved as `name`.py with only the task's name changed."""
    source = (Path(hpcdp.tasks.__file__).parent / "image.py").read_text()
    assert source.count('name="image",') == 1
    (folder / f"{name}.py").write_text(source.replace('name="image",', f'name="{name}",'))


def train(folder: Path, *overrides: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BOOT, str(folder), *overrides],
                          capture_output=True, text=True, timeout=120, env=rank_environment(),
                          cwd=cwd)


def test_a_copy_of_the_image_task_trains_by_its_new_name(make_data, tmp_path: Path) -> None:
    data, plug = make_data(96, 32), tmp_path / "plug"
    plug.mkdir()
    copy_image_task(plug, "imagecopy")
    run = tmp_path / "run"
    common = [f"data.path={data}", "data.batch_size=16", "log.tensorboard=false",
              "image.num_classes=4", "run.epochs=1"]
    done = train(plug, "task.name=imagecopy", f"run.dir={run}", *common, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 96 // 16 and 0.0 <= summary["val_acc"] <= 1.0
    assert 'name = "imagecopy"' in (run / "config.toml").read_text()
    # The same config check as the image task's, on the training command's path.
    bad = train(plug, "task.name=imagecopy", f"run.dir={run}2", *common, "image.num_classes=0",
                cwd=tmp_path)
    assert bad.returncode == 2 and "image.num_classes=0: must be at least 1" in bad.stderr
