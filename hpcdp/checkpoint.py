"""Checkpoint files: written atomically by one rank, verified by a checksum on load.

A file is a two-line header (format tag, sha256 of the payload) followed by the
payload `torch.save` wrote. It is written to a temporary name in the same
folder, fsynced, renamed, and the folder fsynced, so a reader sees either the
old set of files or the new complete one, never half a file. A file whose
checksum does not match (a crash mid-copy, a bad disk) is skipped with a warning
and the next newest is used. This module does no collectives: the training loop
decides which rank calls what.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

MAGIC = b"HPCDP-CHECKPOINT 1\n"
NAME_RE = re.compile(r"^step-(\d+)\.pt$")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt, or does not fit this run."""


def encode(state: dict[str, Any]) -> bytes:
    """Serialize a state dict into the checksummed file format."""
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    digest = hashlib.sha256(payload).hexdigest().encode()
    return MAGIC + b"sha256 " + digest + b"\n" + payload


def verify(data: bytes, name: str) -> bytes:
    """Return the payload of a checkpoint file's bytes, or raise naming the problem."""
    if not data.startswith(MAGIC):
        raise CheckpointError(f"{name}: not an hpcdp checkpoint (bad header)")
    rest = data[len(MAGIC):]
    line, sep, payload = rest.partition(b"\n")
    if not sep or not line.startswith(b"sha256 "):
        raise CheckpointError(f"{name}: truncated header")
    expected = line[len(b"sha256 "):].decode("ascii", "replace")
    actual = hashlib.sha256(payload).hexdigest()
    if actual != expected:
        raise CheckpointError(
            f"{name}: checksum mismatch (stored {expected[:12]}..., got {actual[:12]}...): "
            "the file is corrupt or incomplete"
        )
    return payload


def decode(data: bytes, name: str) -> dict[str, Any]:
    """Verify and deserialize; the checksum vouches that these are bytes we wrote."""
    payload = verify(data, name)
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means an unusable file
        raise CheckpointError(f"{name}: cannot be deserialized: {e}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{name}: payload is not a state dict")
    return state


#: Test hook: the checkpoint folder has room for only this many bytes (its files
#: count against it), so a write that does not fit fails midway with ENOSPC, as on a
#: full disk: the no-space path is tested where no small file system can be mounted.
DISK_BYTES_ENV = "HPCDP_FAULT_DISK_BYTES"


def _room(folder: Path) -> int | None:
    """Bytes left in `folder` under HPCDP_FAULT_DISK_BYTES; None when it is not set."""
    limit = os.environ.get(DISK_BYTES_ENV, "").strip()
    if not limit:
        return None
    if not limit.isdigit():
        raise CheckpointError(f"{DISK_BYTES_ENV}={limit!r}: expected a number of bytes")
    return int(limit) - sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def _write_all(f: Any, data: bytes, folder: Path) -> None:
    room = _room(folder)
    if room is not None and len(data) > room:
        f.write(data[:max(0, room)])
        f.flush()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), f.name)
    f.write(data)


def write_atomic(path: Path, data: bytes) -> None:
    """Temp file in the same folder, fsync, rename over, fsync the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            _write_all(f, data, path.parent)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def step_path(folder: Path, step: int) -> Path:
    return folder / f"step-{step:08d}.pt"


def list_checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """(step, path) of every checkpoint file in `folder`, newest first; temp files ignored."""
    if not folder.is_dir():
        return []
    found = []
    for p in folder.iterdir():
        m = NAME_RE.match(p.name)
        if m and p.is_file():
            found.append((int(m.group(1)), p))
    return sorted(found, reverse=True)


@dataclass
class Found:
    """A verified checkpoint: where it is and its exact bytes (ready to broadcast)."""

    path: Path
    step: int
    data: bytes


def read_verified(path: Path) -> bytes:
    """Read a named checkpoint file and check it, or raise naming it."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CheckpointError(f"checkpoint {str(path)!r} cannot be read: {e}") from None
    verify(data, str(path))
    return data


def find_latest(folder: Path) -> Found | None:
    """The newest checkpoint in `folder` whose checksum verifies; warn about each bad one."""
    for step, path in list_checkpoints(folder):
        try:
            return Found(path, step, read_verified(path))
        except CheckpointError as e:
            warnings.warn(f"skipping checkpoint: {e}", stacklevel=2)
    return None


def prune(folder: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` checkpoint files; return what was removed."""
    removed = []
    for _, path in list_checkpoints(folder)[keep:]:
        path.unlink(missing_ok=True)
        removed.append(path)
    return removed


def save(folder: Path, step: int, state: dict[str, Any], keep: int) -> Path:
    """Write step-N.pt atomically, then trim to the newest `keep` files."""
    path = step_path(folder, step)
    write_atomic(path, encode(state))
    prune(folder, keep)
    return path


def check_compatible(state: dict[str, Any], model: torch.nn.Module, model_name: str,
                     name: str) -> None:
    """Refuse a checkpoint written for another model (by name, then by tensor shapes)."""
    saved_name = state.get("model_name")
    if saved_name != model_name:
        raise CheckpointError(
            f"{name} was written for model {saved_name!r}, but this run builds {model_name!r}"
        )
    saved = state.get("model")
    if not isinstance(saved, dict):
        raise CheckpointError(f"{name} holds no model state")
    own = model.state_dict()
    missing = sorted(set(own) - set(saved))
    extra = sorted(set(saved) - set(own))
    if missing or extra:
        raise CheckpointError(
            f"{name} does not fit model {model_name!r}: missing {missing[:3]}, unexpected "
            f"{extra[:3]} (different width or options?)"
        )
    for key, tensor in own.items():
        if tuple(saved[key].shape) != tuple(tensor.shape):
            raise CheckpointError(
                f"{name} does not fit model {model_name!r}: {key} has shape "
                f"{tuple(saved[key].shape)} there, {tuple(tensor.shape)} here"
            )
