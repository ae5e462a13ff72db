"""Checkpoint policy end to end, through the real command: keep-k with a corrupt file,
one run per folder, a failure after the write, a changed global batch, and validation
that scores every sample once on any number of ranks.

Each test drives `python -m hpcdp.train` only, so it runs against any version of the
training code (each one failed before the checkpoint manager took over these rules).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from hpcdp.train import checkpoint_folder as ckfolder

pytestmark = pytest.mark.parallel

TRAIN = [sys.executable, "-m", "hpcdp.train"]
WORKER = [sys.executable, str(Path(__file__).parent / "workers" / "train_signal.py")]
N_TRAIN, N_VAL = 320, 99  # 10 steps per epoch at 2 x 16; an odd validation set
BOUND = 120.0
# mpirun --tag-output: a rank's text follows its tag, possibly on a line shared with another's.
_TAGGED = re.compile(r"\[\d+,(\d+)\]<std(?:out|err)>:((?:(?!\[\d+,\d+\]<std).)*)", re.S)


RUN_SETTINGS = (  # after the args fixture's SMALL_RUN; a later value of a key wins
    "log.every_steps=5", "log.progress=false", "run.epochs=2",
)


def steps_in(run: Path) -> list[int]:
    return [s for s, _ in ckfolder.list_checkpoints(run / "checkpoints")]


def snapshot(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()}


def test_corrupt_checkpoint_never_holds_a_keep_slot(args, ranks, data: Path,
                                                    tmp_path: Path) -> None:
    run = tmp_path / "run"
    ranks(TRAIN, *args(data, run, "checkpoint.every_steps=10", "checkpoint.keep=2"), np=2,
          timeout=BOUND)
    assert steps_in(run) == [20, 10]
    newest = ckfolder.step_path(run / "checkpoints", 20)
    newest.write_bytes(newest.read_bytes()[:-64])  # as a crash mid-copy leaves it
    # Resumed from step 10, stopped at 15 with keep=1: step 15 is the one to keep.
    out = ranks(TRAIN, *args(data, run, "checkpoint.every_steps=10", "checkpoint.keep=1",
                             "run.stop_at_step=15"), np=2, timeout=BOUND).output
    assert steps_in(run) == [15]  # the corrupt step 20 did not outrank it
    assert "checksum mismatch" in out and "moved aside to step-00000020.pt.corrupt" in out
    assert (run / "checkpoints" / "step-00000020.pt.corrupt").exists()
    out = ranks(TRAIN, *args(data, run, "checkpoint.every_steps=10"), np=2,
                timeout=BOUND).output
    assert f"resumed from {ckfolder.step_path(run / 'checkpoints', 15)}" in out


def test_fresh_run_into_a_folder_with_checkpoints_is_refused(args, ranks, data: Path,
                                                             tmp_path: Path) -> None:
    run = tmp_path / "run"
    ranks(TRAIN, *args(data, run, "checkpoint.every_steps=10"), np=2, timeout=BOUND)
    before = snapshot(run)
    done = ranks(TRAIN, *args(data, run, "checkpoint.resume=none", "checkpoint.every_steps=5",
                              "run.epochs=1"), np=2, timeout=BOUND, expect_ok=False)
    assert not done.timed_out and done.returncode != 0, done.describe()
    assert "checkpoint.resume=none, but" in done.output
    assert "already holds checkpoints (newest: step-00000020.pt)" in done.output
    assert "checkpoint.resume=auto" in done.output and "run.dir=" in done.output
    assert snapshot(run) == before  # nothing written, nothing pruned


def test_failure_after_the_write_is_not_reported_as_not_written(args, ranks, data: Path,
                                                                tmp_path: Path) -> None:
    run = tmp_path / "run"
    out = ranks(WORKER, *args(data, run, "checkpoint.every_steps=5", "checkpoint.keep=1",
                              "run.epochs=1"), np=2, timeout=BOUND,
                env={"HPCDP_TEST_PRUNE_FAILS": "1"}).output
    path = ckfolder.step_path(run / "checkpoints", 10)
    assert "was not written" not in out
    assert f"checkpoint {path} was written, but syncing or pruning" in out
    assert "arranged: cannot delete old checkpoints" in out
    assert steps_in(run) == [10, 5]  # nothing pruned, both complete
    assert json.loads((run / "summary.json").read_text())["steps"] == 10


def test_resume_with_another_global_batch_is_refused(args, ranks, data: Path,
                                                     tmp_path: Path) -> None:
    run = tmp_path / "run"
    ranks(TRAIN, *args(data, run, "run.stop_at_step=4"), np=2, timeout=BOUND)
    before = snapshot(run)
    done = ranks(TRAIN, *args(data, run, "data.batch_size=8"), np=2, timeout=BOUND,
                 expect_ok=False)
    assert not done.timed_out and done.returncode != 0, done.describe()
    said = {int(r) for r, text in _TAGGED.findall(done.output) if "hpcdp train: error: " in text}
    assert said == {0, 1}, done.output
    assert "global batch of 32 samples per step, but this run takes 16" in done.output
    assert snapshot(run) == before


def test_validation_scores_every_sample_once(args, ranks, data: Path, tmp_path: Path) -> None:
    """99 samples on 2 ranks in batches of 7: 49 and 50 samples, 7 and 8 batches."""
    summaries = {}
    for np_ in (1, 2):
        run = tmp_path / f"run{np_}"
        ranks(TRAIN, *args(data, run, "data.global_batch_size=32", "data.val_batch_size=7",
                           "run.epochs=1"), np=np_, timeout=BOUND)
        summaries[np_] = json.loads((run / "summary.json").read_text())
    assert summaries[1]["val_samples"] == summaries[2]["val_samples"] == N_VAL
    records = [json.loads(line) for line in (tmp_path / "run2" / "metrics.jsonl").open()]
    assert [r["samples"] for r in records if r["kind"] == "val"] == [N_VAL]
