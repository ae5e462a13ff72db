"""The checkpoint manager's rules that need no ranks: keep-k past corrupt files, one run
per folder, failures after the write, a changed global batch (hpcdp.train.checkpoints)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdp.config import Config
from hpcdp.train import checkpoint_folder as ckfolder
from hpcdp.train import checkpoint_format as ckformat
from hpcdp.train import checkpoint_trust as cktrust
from hpcdp.train import checkpoints as cm


def manager(folder: Path, keep: int) -> cm.CheckpointManager:
    cfg = Config()
    cfg.checkpoint.dir, cfg.checkpoint.keep = str(folder), keep
    return cm.CheckpointManager(cfg, root=True)


def state(step: int) -> dict:
    return {"step": step, "model": {}}


def test_a_corrupt_file_never_holds_a_keep_slot(tmp_path: Path) -> None:
    m = manager(tmp_path, keep=1)
    m.write(m.path(20), state(20))
    ckformat.write_atomic(m.path(30), ckformat.encode(state(30))[:-10])  # newest, truncated
    found, notes = m.newest_verified()
    assert found is not None and found.step == 20
    assert any("checksum mismatch" in n and "step-00000030.pt.corrupt" in n for n in notes)
    m.write(m.path(25), state(25))
    assert [s for s, _ in ckfolder.list_checkpoints(tmp_path)] == [25]
    assert (tmp_path / "step-00000030.pt.corrupt").exists()


def test_an_unreadable_file_is_skipped_but_not_moved(tmp_path: Path, monkeypatch) -> None:
    m = manager(tmp_path, keep=3)
    m.write(m.path(1), state(1))
    m.write(m.path(2), state(2))

    real = cktrust.read_verified

    def refuse(path: Path, trust: cktrust.Trust) -> bytes:
        if path == m.path(2):
            raise ckformat.CheckpointError(f"checkpoint {str(path)!r} cannot be read: denied")
        return real(path, trust)

    monkeypatch.setattr(cktrust, "read_verified", refuse)
    found, notes = m.newest_verified()
    assert found is not None and found.step == 1 and "denied" in notes[0]
    assert m.path(2).exists()  # not corrupt: left where it is


def test_failure_after_the_rename_leaves_a_complete_file(tmp_path: Path, monkeypatch) -> None:
    m = manager(tmp_path, keep=1)
    m.write(m.path(1), state(1))

    def fail(folder: Path, keep: int) -> list[Path]:
        raise OSError("read-only file system")

    monkeypatch.setattr(ckfolder, "prune", fail)
    note = m.write(m.path(2), state(2))
    assert note is not None and "was written, but" in note and "read-only" in note
    assert ckformat.decode(cktrust.read_verified(m.path(2)), "2")["step"] == 2


def test_non_finite_weights_are_not_written(tmp_path: Path) -> None:
    import torch

    m = manager(tmp_path, keep=1)
    with pytest.raises(ckformat.CheckpointError, match="NaN"):
        m.write(m.path(1), {"model": {"w": torch.tensor([float("nan")])}})
    assert not m.path(1).exists()


def test_runs_do_not_mix_in_one_folder(tmp_path: Path) -> None:
    ours = [(30, tmp_path / "step-00000030.pt"), (20, tmp_path / "step-00000020.pt")]
    assert cm.mixing_error("none", tmp_path, []) is None
    assert cm.mixing_error("auto", tmp_path, ours) is None
    why = cm.mixing_error("none", tmp_path, ours)
    assert why and "already holds checkpoints (newest: step-00000030.pt)" in why
    assert "checkpoint.resume=auto" in why and "run.dir=" in why
    assert cm.mixing_error(str(ours[0][1]), tmp_path, ours) is None  # its own newest
    older = cm.mixing_error(str(ours[1][1]), tmp_path, ours)
    assert older and "newer checkpoints (step-00000030.pt)" in older
    other = cm.mixing_error(str(tmp_path / "elsewhere" / "step-00000005.pt"), tmp_path, ours)
    assert other and "another run's checkpoint" in other
    assert cm.mixing_error(str(tmp_path / "x" / "step-00000005.pt"), tmp_path, []) is None


def test_global_batch_change_is_refused_naming_both() -> None:
    cfg = Config()
    cfg.data.batch_size, cfg.horovod.backward_passes_per_step = 16, 2
    old_format = {"config": cfg.to_dict(), "world_size": 4}  # written before the key existed
    assert cm.stored_global_batch(old_format) == 128
    cfg.data.global_batch_size = 96
    assert cm.stored_global_batch({"config": cfg.to_dict(), "world_size": 4}) == 192
    assert cm.stored_global_batch({"global_batch": 64}) == 64
    assert cm.stored_global_batch({}) is None
    assert cm.batch_change_error(64, 64, "ckpt") is None
    why = cm.batch_change_error(64, 32, "checkpoint 'x'")
    assert why and "global batch of 64" in why and "takes 32" in why


def test_due_and_train_state() -> None:
    m = manager(Path("unused"), keep=1)
    m.every = 5
    assert [s for s in range(1, 13) if m.due(s, 12, False)] == [5, 10, 12]
    assert m.due(3, 12, True)
    st = cm.TrainState()
    st.advance(32)
    st.advance(32)
    assert (st.step, st.samples_seen) == (2, 64)
