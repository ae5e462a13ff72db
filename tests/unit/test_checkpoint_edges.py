"""Checkpoint files at their edges: durable writes, the full-disk hook, exact messages.

Each test pins down a behaviour that mutation testing (`make mutate`) found
unguarded.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import warnings
from pathlib import Path

import pytest
import torch
from test_checkpoint import write_step

from hpcdp.train import checkpoint_folder as ckfolder
from hpcdp.train import checkpoint_format as ckformat
from hpcdp.train import checkpoint_trust as cktrust
from hpcdp.train import checkpoints as cm


def test_data_is_on_disk_before_the_rename_and_the_folder_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[tuple[str, object]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        info = os.fstat(fd)
        events.append(("fsync dir" if stat.S_ISDIR(info.st_mode) else "fsync file",
                       None if stat.S_ISDIR(info.st_mode) else info.st_size))
        real_fsync(fd)

    def replace(src: object, dst: object) -> None:
        events.append(("rename", Path(str(dst)).name))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    path = tmp_path / "deep" / "er" / "step-00000001.pt"  # folders made as needed
    ckformat.write_atomic(path, b"x" * 10)
    # The whole file is flushed and fsynced before it takes the name, then the folder.
    assert events == [("fsync file", 10), ("rename", path.name), ("fsync dir", None)]
    assert path.read_bytes() == b"x" * 10


def test_full_disk_hook_writes_what_fits_and_counts_the_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "other").write_bytes(b"o" * 40)
    monkeypatch.setenv(ckformat.DISK_BYTES_ENV, "100")
    ckformat.write_atomic(tmp_path / "a.pt", b"a" * 60)  # 40 + 60 fits exactly
    with pytest.raises(OSError) as err:
        ckformat.write_atomic(tmp_path / "b.pt", b"b")
    assert err.value.errno == errno.ENOSPC and err.value.filename.endswith(".b.pt.tmp-"
                                                                           f"{os.getpid()}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.pt", "other"]
    monkeypatch.setenv(ckformat.DISK_BYTES_ENV, " ")  # blank: no limit
    ckformat.write_atomic(tmp_path / "b.pt", b"b" * 1000)
    monkeypatch.setenv(ckformat.DISK_BYTES_ENV, "1e6")
    with pytest.raises(ckformat.CheckpointError, match=r"HPCDP_FAULT_DISK_BYTES='1e6': expected a "
                                                 r"number of bytes"):
        ckformat.write_atomic(tmp_path / "c.pt", b"c")


def test_header_problems_are_named(tmp_path: Path) -> None:
    with pytest.raises(ckformat.CheckpointError) as err:
        ckformat.verify(ckformat.MAGIC + b"sha256 abc", "f.pt")  # no end of line
    assert str(err.value) == "f.pt: truncated header"
    with pytest.raises(ckformat.CheckpointError) as err:
        ckformat.verify(ckformat.MAGIC + b"md5 abc\npayload", "f.pt")
    assert str(err.value) == "f.pt: truncated header"
    # A checksum line that is not ASCII is a mismatch, not a decoding crash.
    with pytest.raises(ckformat.CheckpointError, match="checksum mismatch"):
        ckformat.verify(ckformat.MAGIC + b"sha256 \xff\xfe\npayload", "f.pt")


def test_checksum_mismatch_message_in_full() -> None:
    stored = "ab" * 32
    actual = hashlib.sha256(b"payload").hexdigest()
    with pytest.raises(ckformat.CheckpointError) as err:
        ckformat.verify(ckformat.MAGIC + b"sha256 " + stored.encode() + b"\npayload", "f.pt")
    assert str(err.value) == (f"f.pt: checksum mismatch (stored {stored[:12]}..., got "
                              f"{actual[:12]}...): the file is corrupt or incomplete")


def test_unreadable_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ckformat.CheckpointError) as err:
        cktrust.read_verified(tmp_path / "gone.pt")
    assert str(err.value).startswith(f"checkpoint {str(tmp_path / 'gone.pt')!r} cannot be read: ")


def test_decode_names_the_file() -> None:
    with pytest.raises(ckformat.CheckpointError, match=r"^ck\.pt: not an hpcdp checkpoint"):
        ckformat.decode(b"junk", "ck.pt")
    body = b"not a pickle"
    data = ckformat.MAGIC + b"sha256 " + hashlib.sha256(body).hexdigest().encode() + b"\n" + body
    with pytest.raises(ckformat.CheckpointError, match=r"^ck\.pt: refused: "):
        ckformat.decode(data, "ck.pt")
    with pytest.raises(ckformat.CheckpointError) as err:
        ckformat.decode(ckformat.encode([1, 2]), "ck.pt")  # type: ignore[arg-type]
    assert str(err.value) == "ck.pt: payload is not a state dict"


def test_latest_names_its_path_and_warns_once(tmp_path: Path) -> None:
    for step in (1, 2):
        write_step(tmp_path, step, {"step": step})
    ckfolder.step_path(tmp_path, 2).write_bytes(b"bad")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = ckfolder.find_latest(tmp_path)
    assert found is not None and found.path == ckfolder.step_path(tmp_path, 1) and found.step == 1
    assert [str(w.message) for w in caught] == [
        f"skipping checkpoint: {ckfolder.step_path(tmp_path, 2)}: "
        "not an hpcdp checkpoint (bad header)"]


def test_prune_returns_what_it_removed(tmp_path: Path) -> None:
    for step in (1, 2, 3, 4):
        write_step(tmp_path, step, {"step": step})
    assert ckfolder.prune(tmp_path, 2) == [ckfolder.step_path(tmp_path, 2),
                                           ckfolder.step_path(tmp_path, 1)]
    assert ckfolder.prune(tmp_path, 2) == []


def test_model_mismatch_messages_in_full() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
    own = model.state_dict()
    with pytest.raises(ckformat.CheckpointError) as err:
        cm.check_compatible({"model_name": "m"}, model, "m", "ck")
    assert str(err.value) == "ck holds no model state"
    fewer = {k: v for k, v in own.items() if not k.startswith("1.")}
    with pytest.raises(ckformat.CheckpointError) as err:
        cm.check_compatible({"model_name": "m", "model": fewer}, model, "m", "ck")
    assert str(err.value) == ("ck does not fit model 'm': missing ['1.bias', '1.weight'], "
                              "unexpected [] (different width or options?)")
    more = dict(own) | {f"x{i}": torch.zeros(1) for i in range(5)}
    with pytest.raises(ckformat.CheckpointError) as err:
        cm.check_compatible({"model_name": "m", "model": more}, model, "m", "ck")
    assert str(err.value) == ("ck does not fit model 'm': missing [], unexpected ['x0', 'x1', "
                              "'x2'] (different width or options?)")
    deep = torch.nn.Sequential(*(torch.nn.Linear(1, 1) for _ in range(3)))
    last = {k: v for k, v in deep.state_dict().items() if k.startswith("2.")}
    with pytest.raises(ckformat.CheckpointError) as err:
        cm.check_compatible({"model_name": "m", "model": last}, deep, "m", "ck")
    assert "missing ['0.bias', '0.weight', '1.bias'], unexpected []" in str(err.value)
