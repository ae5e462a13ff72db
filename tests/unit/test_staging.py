"""Node-local staging without MPI: the pure decisions, and one node's copier on real files."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from hpcdp import config as cfgmod
from hpcdp.config import stage_name_error
from hpcdp.data.staging import copy as stage_copy
from hpcdp.data.staging.plan import (
    HEADROOM_BYTES,
    FileState,
    StageError,
    copier_ranks,
    copy_errors,
    expand,
    identical,
    node_errors,
    plan_node,
)

# ------------------------------------------------------------------ pure


def test_expand_both_forms_from_the_nodes_environment() -> None:
    env = {"TMPDIR": "/local/tmp", "SLURM_JOB_ID": "42"}
    assert expand("$TMPDIR/hpcdp-${SLURM_JOB_ID}", env) == "/local/tmp/hpcdp-42"
    assert expand("/nvme/plain", {}) == "/nvme/plain"


def test_expand_names_an_unset_variable_and_refuses_relative_paths() -> None:
    with pytest.raises(StageError, match="environment variable TMPDIR is not set"):
        expand("$TMPDIR/x", {})
    with pytest.raises(StageError, match="not an absolute path"):
        expand("${D}/x", {"D": "relative"})
    with pytest.raises(StageError, match="not a variable name"):
        expand("/x/${1a}", {"1a": "y"})


def test_name_error_keeps_copies_inside_the_stage_dir() -> None:
    assert stage_name_error("data.train_file", "sub/train.h5") is None
    assert "relative" in (stage_name_error("data.train_file", "/abs/train.h5") or "")
    assert "data.val_file" in (stage_name_error("data.val_file", "../val.h5") or "")


def state(size: int = 100, mtime: int = 7, dest_size: int | None = 100,
          dest_mtime: int | None = 9, **record: object) -> FileState:
    rec = {"source": "/shared/train.h5", "source_size": 100, "source_mtime_ns": 7, "size": 100,
           "mtime_ns": 9}
    rec.update(record)
    return FileState("train", "/shared/train.h5", size, mtime, "/local/train.h5", dest_size,
                     dest_mtime, rec)


def test_identical_needs_every_recorded_fact_to_match() -> None:
    assert identical(state())
    assert not identical(state(mtime=8))  # the source was rewritten
    assert not identical(state(size=101))
    assert not identical(state(dest_size=None, dest_mtime=None))  # no copy
    assert not identical(state(dest_mtime=10))  # the copy was touched since
    assert not identical(state(source="/elsewhere/train.h5"))
    assert not identical(FileState("val", "/s", 1, 1, "/d", 1, 1, None))  # no sidecar


def test_plan_copies_what_differs_when_it_fits_with_headroom() -> None:
    fresh = FileState("val", "/shared/val.h5", 50, 1, "/local/val.h5")
    plan = plan_node([state(), fresh], free_bytes=50 + HEADROOM_BYTES)
    assert [s.role for s in plan.copy] == ["val"] and [s.role for s in plan.keep] == ["train"]
    assert not plan.in_place
    short = plan_node([state(), fresh], free_bytes=49 + HEADROOM_BYTES)
    assert short.in_place and "free" in short.reason


def test_plan_counts_the_room_of_stale_copies_it_replaces() -> None:
    stale = state(mtime=8)  # its old copy (100 bytes) is removed before the new one is written
    assert not plan_node([stale], free_bytes=HEADROOM_BYTES).in_place
    assert plan_node([stale], free_bytes=HEADROOM_BYTES - 1).in_place


def test_plan_with_nothing_to_copy_needs_no_room() -> None:
    plan = plan_node([state()], free_bytes=0)
    assert not plan.in_place and not plan.copy


def test_one_copier_per_node_the_lowest_rank() -> None:
    assert copier_ranks(["b", "a", "b", "a"]) == {"b": 0, "a": 1}


def test_node_errors_name_rank_node_and_disagreeing_folders() -> None:
    assert node_errors(["n1", "n2"], ["/l", "/l"], [None, None]) is None
    text = node_errors(["n1", "n2"], ["/l", None], [None, "stage dir /l: not writable"])
    assert text is not None and "rank 1 on n2" in text and "/l" in text
    split = node_errors(["n1", "n1"], ["/l/0", "/l/1"], [None, None])
    assert split is not None and "ranks 0 and 1 on n1" in split
    assert copy_errors([None, "n2: disk full"]) == "data staging failed: n2: disk full"


def test_config_refuses_a_file_name_outside_data_path_when_staging(tmp_path: Path) -> None:
    common = [f"data.path={tmp_path}", "data.stage_dir=$TMPDIR/s"]
    with pytest.raises(cfgmod.ConfigError, match="data.train_file"):
        cfgmod.build(None, [*common, "data.train_file=/abs/train.h5"])
    cfg = cfgmod.build(None, common)  # expanded per node at staging, not here
    assert cfg.data.stage_dir == "$TMPDIR/s"


# ------------------------------------------------------------------ one node's copier (I/O)


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    d = tmp_path / "shared"
    (d / "sub").mkdir(parents=True)
    (d / "train.h5").write_bytes(os.urandom(300_000))
    (d / "sub" / "val.h5").write_bytes(os.urandom(1000))
    return d


NAMES = {"train": "train.h5", "val": "sub/val.h5"}


def test_copies_then_keeps_an_identical_copy(shared: Path, tmp_path: Path) -> None:
    local = tmp_path / "local"
    stage_copy.check_dir(str(local))
    first = stage_copy.stage_node("n1", str(local), str(shared), NAMES)
    assert [f.action for f in first.files] == ["copied", "copied"]
    assert first.read_root == str(local) and not first.warning
    for name in NAMES.values():
        assert (local / name).read_bytes() == (shared / name).read_bytes()
        record = json.loads(stage_copy.sidecar(local / name).read_text())
        assert record["blake2b"] == hashlib.blake2b((shared / name).read_bytes()).hexdigest()
    assert not [p for p in local.rglob("*") if ".hpcdp-tmp-" in p.name]
    before = (local / "train.h5").stat().st_mtime_ns
    again = stage_copy.stage_node("n1", str(local), str(shared), NAMES)
    assert [f.action for f in again.files] == ["kept", "kept"]
    assert (local / "train.h5").stat().st_mtime_ns == before  # not rewritten


def test_a_changed_source_is_copied_again(shared: Path, tmp_path: Path) -> None:
    local = tmp_path / "local"
    local.mkdir()
    stage_copy.stage_node("n1", str(local), str(shared), NAMES)
    (shared / "train.h5").write_bytes(b"new content")
    result = stage_copy.stage_node("n1", str(local), str(shared), NAMES)
    assert [f.action for f in result.files] == ["copied", "kept"]
    assert (local / "train.h5").read_bytes() == b"new content"


def test_too_little_room_reads_in_place_with_a_warning(shared: Path, tmp_path: Path) -> None:
    local = tmp_path / "local"
    local.mkdir()
    result = stage_copy.stage_node("n7", str(local), str(shared), NAMES,
                                   free_bytes=lambda folder: HEADROOM_BYTES)
    assert result.read_root == str(shared)
    assert [f.path for f in result.files] == [str(shared / n) for n in NAMES.values()]
    assert "n7" in result.warning and "too small" in result.warning
    assert not (local / "train.h5").exists()


def test_a_missing_mount_is_named_not_created(tmp_path: Path) -> None:
    folder = tmp_path / "no-such-mount" / "stage"
    with pytest.raises(StageError, match=f"{folder}.*does not exist"):
        stage_copy.check_dir(str(folder))
    assert not folder.parent.exists()
    (tmp_path / "afile").write_text("")
    with pytest.raises(StageError, match="afile"):
        stage_copy.check_dir(str(tmp_path / "afile" / "stage"))


def test_a_dead_copiers_temporary_is_removed(shared: Path, tmp_path: Path) -> None:
    local = tmp_path / "local"
    local.mkdir()
    leftover = local / ".train.h5.hpcdp-tmp-999999999"
    leftover.write_bytes(b"half")
    stage_copy.stage_node("n1", str(local), str(shared), NAMES)
    assert not leftover.exists()


def test_a_copy_that_does_not_read_back_is_refused(shared: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The re-read digest differs (a bad write): nothing is renamed into place or vouched for."""
    local = tmp_path / "local"
    local.mkdir()
    monkeypatch.setattr(stage_copy, "digest_of", lambda path, drop_cache=False: "0" * 128)
    with pytest.raises(StageError, match="does not read back"):
        stage_copy.stage_node("n1", str(local), str(shared), NAMES)
    assert list(local.iterdir()) == []


def test_a_stage_dir_that_is_the_source_folder_is_refused(shared: Path) -> None:
    with pytest.raises(StageError, match="is data.path itself"):
        stage_copy.check_not_source(str(shared / "sub" / ".."), str(shared))
    stage_copy.check_not_source(str(shared / "sub"), str(shared))
