"""Checkpoint files: atomic write, checksum verification, fallback, pruning, model checks."""

from __future__ import annotations

import errno
import warnings
from pathlib import Path

import pytest
import torch

from hpcdp.models.vision import build_model
from hpcdp.train import checkpoint_folder as ckfolder
from hpcdp.train import checkpoint_format as ckformat
from hpcdp.train import checkpoint_trust as cktrust
from hpcdp.train import checkpoints as cm


def write_step(folder: Path, step: int, state: dict) -> Path:
    """Checkpoint `step` in `folder` as the manager writes one: the format, atomically."""
    path = ckfolder.step_path(folder, step)
    ckformat.write_atomic(path, ckformat.encode(state))
    return path


def state(step: int, model_name: str = "digits_cnn") -> dict:
    model = build_model(model_name, (1, 8, 8), 10)
    return {"step": step, "model_name": model_name, "model": model.state_dict(),
            "rng": [torch.get_rng_state()]}


def test_round_trip_and_names(tmp_path: Path) -> None:
    saved = state(7)
    path = write_step(tmp_path, 7, saved)
    assert path.name == "step-00000007.pt"
    loaded = ckformat.decode(path.read_bytes(), str(path))
    assert loaded["step"] == 7
    ref = saved["model"]
    assert all(torch.equal(loaded["model"][k], ref[k]) for k in ref)


def test_corruption_is_detected(tmp_path: Path) -> None:
    path = write_step(tmp_path, 1, state(1))
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ckformat.CheckpointError, match="checksum mismatch"):
        cktrust.read_verified(path)
    path.write_bytes(b"garbage")
    with pytest.raises(ckformat.CheckpointError, match="bad header"):
        cktrust.read_verified(path)


def test_latest_falls_back_past_a_corrupt_newest(tmp_path: Path) -> None:
    for step in (10, 20, 30):
        write_step(tmp_path, step, state(step))
    newest = ckfolder.step_path(tmp_path, 30)
    newest.write_bytes(newest.read_bytes()[:-100])  # truncated, as by a crash mid-copy
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = ckfolder.find_latest(tmp_path)
    assert found is not None and found.step == 20
    assert any("step-00000030.pt" in str(w.message) for w in caught)


def test_nothing_valid_gives_none(tmp_path: Path) -> None:
    assert ckfolder.find_latest(tmp_path / "missing") is None
    (tmp_path / "step-00000001.pt").write_bytes(b"x")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert ckfolder.find_latest(tmp_path) is None


def test_keep_last_k_and_temp_files_ignored(tmp_path: Path) -> None:
    for step in range(1, 6):
        write_step(tmp_path, step, {"step": step})
        ckfolder.prune(tmp_path, 2)
    (tmp_path / ".step-00000009.pt.tmp-123").write_bytes(b"half")
    assert [s for s, _ in ckfolder.list_checkpoints(tmp_path)] == [5, 4]
    assert not any(p.name.startswith(".step-00000005") for p in tmp_path.iterdir())


def test_failed_write_leaves_old_file_intact(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = ckfolder.step_path(tmp_path, 3)
    ckformat.write_atomic(path, b"old")

    # A disk that fills up midway (ENOSPC after 100 bytes) must not replace the file.
    monkeypatch.setenv(ckformat.DISK_BYTES_ENV, "103")
    with pytest.raises(OSError) as err:
        ckformat.write_atomic(path, b"new" * 1000)
    assert err.value.errno == errno.ENOSPC and "No space left on device" in str(err.value)
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_model_mismatch_is_refused() -> None:
    model = build_model("digits_cnn", (1, 8, 8), 10)
    with pytest.raises(ckformat.CheckpointError, match="written for model 'resnet18'"):
        cm.check_compatible(state(1, "resnet18") | {"model_name": "resnet18"}, model,
                            "digits_cnn", "ckpt")
    wide = build_model("digits_cnn", (1, 8, 8), 10, width=8).state_dict()
    with pytest.raises(ckformat.CheckpointError, match="has shape"):
        cm.check_compatible({"model_name": "digits_cnn", "model": wide}, model, "digits_cnn",
                            "ckpt")
    cm.check_compatible(state(1), model, "digits_cnn", "ckpt")
