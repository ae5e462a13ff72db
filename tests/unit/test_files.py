"""hpcdp.files: a file is replaced whole or not at all."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpcdp import files


def test_write_atomic_replaces_the_whole_file(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    files.write_atomic(path, "old\n")
    assert files.write_atomic(path, "névé\r\n") == path
    assert path.read_bytes() == "névé\r\n".encode()  # UTF-8, newlines as given
    files.write_atomic(path, b"\x00\x01", durable=True)
    assert path.read_bytes() == b"\x00\x01"
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]  # no temporary left


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "script.sbatch"
    path.write_text("old")
    with pytest.raises(RuntimeError, match="midway"), files.replacing(path) as f:
        f.write(b"half a scr")
        raise RuntimeError("midway")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["script.sbatch"]


def test_a_stale_temporary_is_replaced_not_reused(tmp_path: Path) -> None:
    path = tmp_path / "x.pt"
    stale = files.temporary_name(path)
    assert stale.name == f".x.pt.tmp-{os.getpid()}"
    stale.write_bytes(b"stale bytes, longer than the new ones")
    os.chmod(stale, 0o666)
    files.write_atomic(path, b"new")
    assert path.read_bytes() == b"new"
    assert not stale.exists()
    assert files.temporary_name(path, ".hpcdp-tmp-").name == f".x.pt.hpcdp-tmp-{os.getpid()}"
