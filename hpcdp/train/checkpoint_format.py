"""Checkpoint files: the format, written atomically, verified and loaded without running code.

A file is a two-line header (format tag, sha256 of the payload) followed by the
payload `torch.save` wrote. It is written to a temporary name in the same
folder, fsynced, renamed, and the folder fsynced, so a reader sees either the
old set of files or the new complete one, never half a file. A file whose
checksum does not match (a crash mid-copy, a bad disk) is refused naming the
problem. This module does no collectives: the training loop decides which rank
calls what.

The checksum has no key: anyone who can write a file can compute it, so it
vouches for completeness, not for who wrote it. Loading therefore never runs
code: payloads hold only tensors, numbers, strings, lists, tuples and dicts
(`to_safe` converts what is not, when saving) and are read with
`torch.load(weights_only=True)`. Who may have written a file that is resumed is
checked by hpcdp.train.checkpoint_trust; the folder of numbered files, keep-k,
by hpcdp.train.checkpoint_folder. Files and folders are created with the user's
umask. See docs/checkpoints.md.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import pickle
import re
import shlex
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpcdp import files

MAGIC = b"HPCDP-CHECKPOINT 2\n"  # 2: the payload loads with torch.load(weights_only=True)
LEGACY_MAGIC = b"HPCDP-CHECKPOINT 1\n"  # 1: held NumPy arrays, loadable only by full unpickling


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt, or does not fit this run."""


# --------------------------------------------------------------------------- safe contents

# Values torch.load(weights_only=True) reads back without running code.
_ATOMS = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device,
          torch.Size, torch.Tensor)


def to_safe(obj: Any, where: str = "state") -> Any:
    """`obj` with NumPy scalars as Python numbers and NumPy arrays as tensors.

    Anything else that a weights-only load would refuse raises here, at save time,
    naming where it sits. Containers that need no change are returned as they are,
    so a model's state dict keeps its OrderedDict and `_metadata`.
    """
    if isinstance(obj, _ATOMS):
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return _array_to_tensor(obj, where)
    if isinstance(obj, dict):
        items = [(to_safe(k, f"a key of {where}"), to_safe(v, f"{where}[{k!r}]"))
                 for k, v in obj.items()]
        if type(obj) in (dict, OrderedDict) and all(
                nk is k and nv is v for (nk, nv), (k, v) in zip(items, obj.items())):
            return obj
        out = OrderedDict(items) if isinstance(obj, OrderedDict) else dict(items)
        if isinstance(getattr(obj, "_metadata", None), dict):
            out._metadata = to_safe(obj._metadata, f"{where}._metadata")  # type: ignore[union-attr]
        return out
    if isinstance(obj, (list, tuple, set)):
        kind = tuple if isinstance(obj, tuple) else type(obj) if type(obj) in (list, set) else list
        items = [to_safe(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        if type(obj) is kind and all(n is v for n, v in zip(items, obj)):
            return obj
        return kind(items)
    raise CheckpointError(
        f"{where} is a {type(obj).__module__}.{type(obj).__qualname__}; a checkpoint holds only "
        "tensors, numbers, strings, lists, tuples and dicts (convert it before saving)")


def _array_to_tensor(arr: np.ndarray, where: str) -> torch.Tensor:
    """A copy as a tensor; uint16/uint32 widen to int64 (lossless), since tensors of those
    dtypes do not survive plain pickling (as Horovod's allgather_object does)."""
    if arr.dtype in (np.uint16, np.uint32):
        arr = arr.astype(np.int64)
    try:
        return torch.from_numpy(np.array(arr, copy=True))
    except TypeError:
        raise CheckpointError(f"{where} is a NumPy array of dtype {arr.dtype}, which a "
                              "checkpoint cannot hold as a tensor") from None


# --------------------------------------------------------------------------- file format


def encode(state: dict[str, Any]) -> bytes:
    """Serialize a state dict (made safe by `to_safe`) into the checksummed file format."""
    buf = io.BytesIO()
    torch.save(to_safe(state), buf)
    payload = buf.getvalue()
    digest = hashlib.sha256(payload).hexdigest().encode()
    return MAGIC + b"sha256 " + digest + b"\n" + payload


def split(data: bytes, name: str) -> tuple[int, bytes]:
    """(format version, payload) of a checkpoint file's bytes, or raise naming the problem."""
    if data.startswith(MAGIC):
        version, magic = 2, MAGIC
    elif data.startswith(LEGACY_MAGIC):
        version, magic = 1, LEGACY_MAGIC
    else:
        raise CheckpointError(f"{name}: not an hpcdp checkpoint (bad header)")
    rest = data[len(magic):]
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
    return version, payload


def verify(data: bytes, name: str) -> bytes:
    """Return the payload of a checkpoint file's bytes, or raise naming the problem."""
    return split(data, name)[1]


def decode(data: bytes, name: str) -> dict[str, Any]:
    """Verify and deserialize without running any code the bytes might name.

    The checksum only says the bytes are complete; anyone could have written them.
    """
    version, payload = split(data, name)
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:  # the weights-only unpickler refused something
        raise CheckpointError(refusal(name, version, str(e))) from None
    except Exception as e:  # noqa: BLE001 - any other failure also means an unusable file
        raise CheckpointError(f"{name}: cannot be deserialized: {e}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{name}: payload is not a state dict")
    return state


def refusal(name: str, version: int, message: str) -> str:
    """Why a payload was not loaded, from the weights-only unpickler's message (pure)."""
    m = re.search(r"GLOBAL ([\w.]+)", message)
    what = f"a reference to {m[1]}" if m else \
        "objects other than tensors, numbers, strings, lists and dicts"
    if version == 1:
        return (f"{name}: refused: this checkpoint was written by an older hpcdp and holds "
                f"{what}; loading it could run code. If you wrote it yourself and no one else "
                "could have written it since, convert it once, knowingly: "
                f"hpcdp checkpoint convert {shlex.quote(name)}")
    return (f"{name}: refused: it holds {what}, which hpcdp never writes and whose loading "
            "could run code: the file was not written by hpcdp, or was altered after. "
            "It was not loaded")


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


def _write_all(f: Any, data: bytes, folder: Path, name: str) -> None:
    room = _room(folder)
    if room is not None and len(data) > room:
        f.write(data[:max(0, room)])
        f.flush()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), name)
    f.write(data)


def write_atomic(path: Path, data: bytes) -> None:
    """Temp file in the same folder, fsync, rename over, fsync the folder."""
    replace_atomic(path, data)
    files.sync_folder(path.parent)


def replace_atomic(path: Path, data: bytes) -> None:
    """Temp file in the same folder, fsync, rename over: `path` is whole or not there
    (hpcdp.files.replacing, through the full-disk test hook).

    A failure here means `path` was not written (an older file of that name is
    intact); anything that fails after it (the folder's fsync, pruning) does not.
    Folders and the file are created with the user's umask (mode 0o777 / 0o666 less
    the umask) and never chmod-ed wider.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with files.replacing(path, fsync=True) as f:
        _write_all(f, data, path.parent, f.name)
