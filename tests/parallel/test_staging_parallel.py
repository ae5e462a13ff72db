"""data.stage_dir under a real launcher: one copier per node, the readers on the copy.

Each rank plays a node of its own by exporting HPCDP_STAGE_NODE=fake-<rank> (the
node name staging groups ranks by, in place of Slurm's or the host's), so two
ranks on this machine are two nodes with two stage dirs, as on the local Slurm
cluster.
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.parallel

TRAIN = [sys.executable, "-m", "hpcdp.train"]
AS_OWN_NODE = ["sh", "-c", 'HPCDP_STAGE_NODE=fake-$OMPI_COMM_WORLD_RANK exec "$@"', "sh"]
STEPS_PER_EPOCH = 15  # 480 samples, 16 per rank, 2 ranks


@pytest.fixture
def data(make_data) -> Path:
    return make_data(480, 96)


RUN_SETTINGS = (  # after the args fixture's SMALL_RUN; a later value of a key wins
    "log.progress=false", "checkpoint.every_steps=0", "run.epochs=1",
)


def validated(run_dir: Path) -> bool:
    """Whether the first epoch's validation is recorded (the run is in the pause after it)."""
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return False
    return any('"kind": "val"' in line for line in lines)


def test_each_node_copies_and_a_second_epoch_reads_nothing_shared(args, ranks, data: Path,
                                                                    tmp_path: Path) -> None:
    """Every rank pauses 3 s before the second epoch's first step; in that pause (the
    first epoch's validation recorded) the shared files are cut to 0 bytes in place, so
    a read of them in the second epoch, through a file or mapping the readers hold open
    or a new open, fails the run."""
    original = {n: (data / n).read_bytes() for n in ("train.h5", "val.h5")}
    folders = [tmp_path / "local" / f"stage-fake-{r}" for r in range(2)]
    (tmp_path / "local").mkdir()
    run_dir = tmp_path / "run"
    argv = [*AS_OWN_NODE, *TRAIN,
            *args(data, run_dir,
                  f"data.stage_dir={tmp_path / 'local' / 'stage-${HPCDP_STAGE_NODE}'}",
                  "run.epochs=2")]
    result: dict[str, object] = {}
    job = threading.Thread(target=lambda: result.update(run=ranks(
        argv, np=2, timeout=120.0, expect_ok=False,
        env={"HPCDP_FAULT": f"stall:step={STEPS_PER_EPOCH}:seconds=3"})))
    job.start()
    deadline = time.monotonic() + 100
    while not validated(run_dir) and job.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    cut_while_running = job.is_alive() and validated(run_dir)
    for name in original:
        with (data / name).open("r+b") as f:
            f.truncate(0)
    job.join()
    run = result["run"]
    assert run.ok, run.describe()  # type: ignore[attr-defined]
    assert cut_while_running, run.describe()  # type: ignore[attr-defined]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["epochs"] == 2
    assert summary["data_paths_read"] == {
        f"fake-{r}": {"train": str(folders[r] / "train.h5"), "val": str(folders[r] / "val.h5")}
        for r in range(2)}
    for folder in folders:
        for name, content in original.items():
            assert (folder / name).read_bytes() == content
    out = run.output  # type: ignore[attr-defined]
    assert len(re.findall(r"data staging on fake-\d: train copied", out)) == 2, out


def test_one_node_one_copier_then_the_copy_is_kept(args, ranks, data: Path, tmp_path: Path) -> None:
    stage = tmp_path / "local"
    first = ranks([*TRAIN, *args(data, tmp_path / "r1", f"data.stage_dir={stage}",
                                          "run.max_steps=2")], np=2)
    assert len(re.findall(r"data staging on \S+: train copied", first.output)) == 1, \
        first.output
    (paths,) = json.loads((tmp_path / "r1" / "summary.json").read_text())[
        "data_paths_read"].values()
    assert paths == {"train": str(stage / "train.h5"), "val": str(stage / "val.h5")}
    second = ranks([*TRAIN, *args(data, tmp_path / "r2", f"data.stage_dir={stage}",
                                          "run.max_steps=2")], np=2)
    assert "train kept (identical copy there), val kept" in second.output, second.output
    assert "copied" not in second.output, second.output


_TAGGED = re.compile(r"\[\d+,(\d+)\]<std(?:out|err)>:((?:(?!\[\d+,\d+\]<std).)*)", re.S)


def test_a_node_without_its_stage_dir_stops_every_rank(args, ranks, data: Path,
                                                        tmp_path: Path) -> None:
    """Only fake-0's mount exists: every rank names fake-1 and the path; nothing is copied."""
    (tmp_path / "mnt-fake-0").mkdir()
    argv = [*AS_OWN_NODE, *TRAIN,
            *args(data, tmp_path / "run",
                  f"data.stage_dir={tmp_path / 'mnt-${HPCDP_STAGE_NODE}' / 'stage'}")]
    run = ranks(argv, np=2, timeout=60.0, expect_ok=False)
    assert not run.timed_out and run.returncode != 0, run.describe()
    needle = f"on fake-1: stage dir {tmp_path / 'mnt-fake-1' / 'stage'}: its parent"
    saying = {int(r) for r, text in _TAGGED.findall(run.output) if needle in text}
    assert saying == {0, 1}, run.output
    assert not (tmp_path / "mnt-fake-0" / "stage" / "train.h5").exists()
    assert not (tmp_path / "run" / "summary.json").exists()
