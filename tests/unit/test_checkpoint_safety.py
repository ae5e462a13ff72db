"""Checkpoints never run code on load, and are refused when others could have written them."""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import random
import shlex
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from test_checkpoint import write_step

from hpcdp.models.vision import build_model
from hpcdp.train import checkpoint_convert as ckconvert
from hpcdp.train import checkpoint_folder as ckfolder
from hpcdp.train import checkpoint_format as ckformat
from hpcdp.train import checkpoint_trust as cktrust
from hpcdp.train import checkpoints as cm


class Planted:
    """Pickles to a call of os.system: what a planted checkpoint would run when unpickled."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple:
        return (os.system, (self.command,))


def planted_bytes(marker: Path, magic: bytes = ckformat.MAGIC) -> bytes:
    """An hpcdp header with a correct sha256 over a torch.save payload that touches `marker`."""
    buf = io.BytesIO()
    torch.save({"step": 500, "model_name": "digits_cnn",
                "model": Planted(f"touch {shlex.quote(str(marker))}")}, buf)
    payload = buf.getvalue()
    return magic + b"sha256 " + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload


def legacy_bytes(state: dict) -> bytes:
    """A format-1 file as hpcdp wrote it before this change (torch.save of the state as is)."""
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    digest = hashlib.sha256(payload).hexdigest().encode()
    return ckformat.LEGACY_MAGIC + b"sha256 " + digest + b"\n" + payload


@pytest.mark.parametrize("magic", [ckformat.MAGIC, ckformat.LEGACY_MAGIC],
                         ids=["format2", "format1"])
def test_planted_pickle_is_refused_and_never_runs(tmp_path: Path, magic: bytes) -> None:
    # Control: the plant is real; an unrestricted load runs it.
    control = tmp_path / "control-marker"
    payload = ckformat.verify(planted_bytes(control, magic), "plant")
    torch.load(io.BytesIO(payload), weights_only=False)
    assert control.exists()

    marker = tmp_path / "marker"
    path = tmp_path / "step-00000500.pt"
    path.write_bytes(planted_bytes(marker, magic))
    data = cktrust.read_verified(path)  # the checksum is right: it vouches for nothing more
    with pytest.raises(ckformat.CheckpointError, match="refused: .*posix.system") as info:
        ckformat.decode(data, str(path))
    assert str(path) in str(info.value)
    assert not marker.exists()


def test_legacy_checkpoint_is_refused_then_converted_once(tmp_path: Path) -> None:
    np.random.seed(5)
    old_rng = {"python": random.getstate(), "numpy": np.random.get_state(),
               "torch": torch.get_rng_state()}
    expected = np.random.rand(3)
    path = tmp_path / "step-00000004.pt"
    path.write_bytes(legacy_bytes({"step": 4, "rng": [old_rng], "reader": {"seed": 1}}))
    with pytest.raises(ckformat.CheckpointError, match=r"older hpcdp .*numpy.*"
                       r"hpcdp checkpoint convert .*step-00000004\.pt"):
        ckformat.decode(path.read_bytes(), str(path))

    assert ckconvert.main(["convert", str(path)]) == 0
    state = ckformat.decode(path.read_bytes(), str(path))
    assert path.read_bytes().startswith(ckformat.MAGIC) and state["step"] == 4
    np.random.seed(0)
    cm.restore_rng(state["rng"][0])
    assert np.array_equal(np.random.rand(3), expected)
    assert ckconvert.main(["convert", str(path)]) == 2  # already converted: said, not redone


def test_legacy_checkpoint_of_plain_values_loads_the_safe_way(tmp_path: Path) -> None:
    data = legacy_bytes({"step": 3, "model": {"w": torch.ones(2)}})
    assert ckformat.decode(data, "old")["step"] == 3


def test_rng_states_restore_exactly_through_a_file() -> None:
    random.seed(1)
    random.gauss(0, 1)  # leaves a cached second value (gauss_next) in Python's state
    np.random.seed(2)
    np.random.standard_normal()  # leaves NumPy's cached Gaussian (has_gauss=1)
    torch.manual_seed(3)
    saved = cm.capture_rng()
    want = (random.gauss(0, 1), random.random(), np.random.standard_normal(),
            np.random.randint(0, 2**31, 4).tolist(), torch.rand(3))
    # Ranks gather their states with Horovod's allgather_object (plain pickling) first.
    state = ckformat.decode(ckformat.encode({"rng": pickle.loads(pickle.dumps([saved]))}), "rng")
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    cm.restore_rng(state["rng"][0])
    got = (random.gauss(0, 1), random.random(), np.random.standard_normal(),
           np.random.randint(0, 2**31, 4).tolist(), torch.rand(3))
    assert got[:4] == want[:4] and torch.equal(got[4], want[4])


def test_to_safe_converts_numpy_and_names_what_it_cannot() -> None:
    model = build_model("digits_cnn", (1, 8, 8), 10).state_dict()
    assert ckformat.to_safe(model) is model  # no copy: keeps the OrderedDict and its _metadata
    state = ckformat.to_safe({"n": np.int64(7), "x": np.float32(0.5),
                              "a": np.arange(3, dtype=np.uint32),
                              "t": (np.int32(1), [np.bool_(True)])})
    assert state["n"] == 7 and type(state["n"]) is int and type(state["x"]) is float
    assert torch.equal(state["a"], torch.tensor([0, 1, 2]))  # int64: uint32 tensors don't pickle
    assert state["t"] == (1, [True]) and type(state["t"][1][0]) is bool
    with pytest.raises(ckformat.CheckpointError, match=r"state\['reader'\]\['path'\] is a pathlib"):
        ckformat.encode({"reader": {"path": Path("x")}})
    with pytest.raises(ckformat.CheckpointError,
                       match=r"state\['names'\] is a NumPy array of dtype"):
        ckformat.encode({"names": np.array(["a", "b"])})


# Modes are given with their file-type bits, as os.stat reports them.
FILE, DIR = stat.S_IFREG, stat.S_IFDIR
ME, OTHER, MINE, THEIRS = 1000, 1001, 100, 200


@pytest.mark.parametrize(("mode", "owner", "group", "private", "allow", "problem"), [
    (FILE | 0o644, ME, MINE, False, False, None),
    (FILE | 0o600, 0, MINE, False, False, None),  # root may own it, as ssh allows
    (DIR | 0o755, ME, MINE, False, False, None),
    (FILE | 0o666, ME, MINE, False, False, "writable by others (mode 0o666)"),
    (DIR | 0o777, ME, MINE, False, False, "writable by others (mode 0o777)"),
    (DIR | 0o1777, ME, MINE, False, True, "writable by others (mode 0o1777)"),
    (FILE | 0o664, ME, MINE, False, False, "writable by its group, gid 100 (mode 0o664)"),
    (FILE | 0o664, ME, MINE, True, False, None),  # a user private group is the owner alone
    (DIR | 0o775, ME, MINE, False, True, None),
    (DIR | 0o775, ME, THEIRS, False, True, "writable by group gid 200, which is not one of yours"),
    (FILE | 0o644, OTHER, MINE, False, False, "owned by uid 1001, not by you (uid 1000) or root"),
    (FILE | 0o644, OTHER, MINE, False, True, None),  # a member of a trusted group wrote it
    (FILE | 0o644, OTHER, THEIRS, False, True, "owned by uid 1001"),
    (FILE | 0o646, OTHER, MINE, False, True, "writable by others"),
])
def test_permission_rule(mode: int, owner: int, group: int, private: bool, allow: bool,
                         problem: str | None) -> None:
    got = cktrust.permission_problem(mode, owner, group, ME, {MINE}, private, allow)
    if problem is None:
        assert got is None
    else:
        assert got is not None and got.startswith(problem), got


def test_world_writable_folder_and_file_are_refused(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    path = write_step(folder, 2, {"step": 2})
    folder.chmod(0o777)
    for call in (lambda t: ckfolder.find_latest(folder, t),
                 lambda t: cktrust.read_verified(path, t)):
        with pytest.raises(cktrust.UntrustedError,
                           match=f"checkpoint folder '{folder}' is writable "
                           r"by others \(mode 0o777\).*checkpoint.strict_permissions=false"):
            call(cktrust.Trust())
        with pytest.warns(UserWarning, match="resuming anyway"):
            call(cktrust.Trust(strict_permissions=False))
    folder.chmod(0o755)
    path.chmod(0o666)
    with pytest.raises(cktrust.UntrustedError, match=f"checkpoint '{path}' is writable by others"):
        ckfolder.find_latest(folder)
    with pytest.raises(cktrust.UntrustedError, match=f"chmod go-w {path}"):
        cktrust.read_verified(path)
    with pytest.warns(UserWarning, match="resuming anyway"):
        found = ckfolder.find_latest(folder, cktrust.Trust(strict_permissions=False))
    assert found is not None and found.step == 2
    path.chmod(0o644)
    assert ckfolder.find_latest(folder) is not None


def test_an_untrusted_newest_file_is_refused_not_skipped(tmp_path: Path) -> None:
    write_step(tmp_path, 1, {"step": 1})
    newest = write_step(tmp_path, 2, {"step": 2})
    newest.chmod(0o646)
    with pytest.raises(cktrust.UntrustedError, match="step-00000002.pt"):
        ckfolder.find_latest(tmp_path)


@contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.parametrize(("mask", "file_mode", "dir_mode"),
                         [(0o077, 0o600, 0o700), (0o022, 0o644, 0o755), (0o002, 0o664, 0o775)])
def test_files_and_folders_follow_the_umask(tmp_path: Path, mask: int, file_mode: int,
                                            dir_mode: int) -> None:
    folder = tmp_path / "run" / "checkpoints"
    stale = folder / f".step-00000001.pt.tmp-{os.getpid()}"
    with umask(mask):
        folder.mkdir(parents=True)
        stale.write_bytes(b"left by a crash")
        stale.chmod(0o666)  # a leftover temp file's mode must not carry over
        path = write_step(folder, 1, {"step": 1})
    assert stat.S_IMODE(path.stat().st_mode) == file_mode
    assert stat.S_IMODE(folder.stat().st_mode) == dir_mode
    assert not stale.exists()
    with umask(mask):
        made = write_step(tmp_path / "new" / "deep", 1, {"step": 1})
    assert stat.S_IMODE(made.parent.stat().st_mode) == dir_mode
    assert stat.S_IMODE(made.parent.parent.stat().st_mode) == dir_mode
