"""Checkpoint files: written atomically by one rank, verified and loaded without running code.

A file is a two-line header (format tag, sha256 of the payload) followed by the
payload `torch.save` wrote. It is written to a temporary name in the same
folder, fsynced, renamed, and the folder fsynced, so a reader sees either the
old set of files or the new complete one, never half a file. A file whose
checksum does not match (a crash mid-copy, a bad disk) is skipped with a warning
and the next newest is used. This module does no collectives: the training loop
decides which rank calls what.

The checksum has no key: anyone who can write a file can compute it, so it
vouches for completeness, not for who wrote it. Loading therefore never runs
code: payloads hold only tensors, numbers, strings, lists, tuples and dicts
(`to_safe` converts what is not, when saving) and are read with
`torch.load(weights_only=True)`. And, as ssh does with its keys, a checkpoint
is resumed only from a file and folder that no one but their owner (and the
group, when `checkpoint.allow_group_write` says so) can write
(`permission_problem`). Files and folders are created with the user's umask.
See docs/checkpoints.md.
"""

from __future__ import annotations

import argparse
import errno
import grp
import hashlib
import io
import os
import pickle
import pwd
import random
import re
import shlex
import stat
import sys
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpcdp import files
from hpcdp.cliargs import parse_args

MAGIC = b"HPCDP-CHECKPOINT 2\n"  # 2: the payload loads with torch.load(weights_only=True)
LEGACY_MAGIC = b"HPCDP-CHECKPOINT 1\n"  # 1: held NumPy arrays, loadable only by full unpickling
NAME_RE = re.compile(r"^step-(\d+)\.pt$")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt, or does not fit this run."""


class UntrustedError(CheckpointError):
    """A checkpoint, or its folder, that someone other than its owner could have written."""


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


def capture_rng() -> dict[str, Any]:
    """This process's random generators as tensors and plain values (see restore_rng)."""
    state: dict[str, Any] = {
        "python": random.getstate(),  # (version, 625 ints, gauss or None)
        "numpy": to_safe(np.random.get_state()),  # (name, keys as an int64 tensor, ...)
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Set the generators to what capture_rng saw (also from a converted legacy checkpoint)."""
    version, internal, gauss = state["python"]
    random.setstate((int(version), tuple(int(v) for v in internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((str(name), np.asarray(keys, dtype=np.uint32), int(pos),
                         int(has_gauss), float(cached)))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


# --------------------------------------------------------------------------- file format


def encode(state: dict[str, Any]) -> bytes:
    """Serialize a state dict (made safe by `to_safe`) into the checksummed file format."""
    buf = io.BytesIO()
    torch.save(to_safe(state), buf)
    payload = buf.getvalue()
    digest = hashlib.sha256(payload).hexdigest().encode()
    return MAGIC + b"sha256 " + digest + b"\n" + payload


def _split(data: bytes, name: str) -> tuple[int, bytes]:
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
    return _split(data, name)[1]


def decode(data: bytes, name: str) -> dict[str, Any]:
    """Verify and deserialize without running any code the bytes might name.

    The checksum only says the bytes are complete; anyone could have written them.
    """
    version, payload = _split(data, name)
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


# --------------------------------------------------------------------------- who could write it


@dataclass(frozen=True)
class Trust:
    """Whose writes a resumed checkpoint may carry (the checkpoint.* keys of these names)."""

    allow_group_write: bool = False  # members of the file's group (one of yours) may write it
    strict_permissions: bool = True  # False: warn about a problem instead of refusing


def permission_problem(mode: int, owner: int, group: int, me: int, my_groups: set[int],
                       private_group: bool, allow_group_write: bool) -> str | None:
    """Why someone other than you (and a trusted group) could write a path, or None (pure).

    The rule ssh applies to its keys: the owner is you or root (an owner can always
    chmod and rewrite), no write bit for others, and none for the group unless the
    group is yours alone (a user private group, `private_group`) or is one of your
    groups and `allow_group_write` trusts it; the members of a trusted group may also
    own the file.
    """
    perms = f"mode {stat.S_IMODE(mode):#o}"
    trusted_group = allow_group_write and group in my_groups
    if owner not in (me, 0) and not trusted_group:
        return f"owned by uid {owner}, not by you (uid {me}) or root"
    if mode & stat.S_IWOTH:
        return f"writable by others ({perms})"
    if mode & stat.S_IWGRP and not (private_group or trusted_group):
        if allow_group_write:
            return f"writable by group gid {group}, which is not one of yours ({perms})"
        return f"writable by its group, gid {group} ({perms})"
    return None


def _private_group(gid: int, owner: int) -> bool:
    """Whether `gid` is the owner's user private group: named after the owner, no one else in it."""
    try:
        user, group = pwd.getpwuid(owner), grp.getgrgid(gid)
    except KeyError:
        return False
    return (group.gr_name == user.pw_name and user.pw_gid == gid
            and set(group.gr_mem) <= {user.pw_name})


def check_trusted(path: Path, trust: Trust, st: os.stat_result | None = None) -> None:
    """Refuse a checkpoint file or folder that others could have written (warn if overridden)."""
    st = os.stat(path) if st is None else st
    problem = permission_problem(
        st.st_mode, st.st_uid, st.st_gid, os.geteuid(), {os.getegid(), *os.getgroups()},
        _private_group(st.st_gid, st.st_uid), trust.allow_group_write)
    if problem is None:
        return
    kind = "checkpoint folder" if stat.S_ISDIR(st.st_mode) else "checkpoint"
    message = (f"{kind} {str(path)!r} is {problem}: whoever can write it can plant a "
               "checkpoint that this run would resume")
    if not trust.strict_permissions:
        warnings.warn(f"{message} (resuming anyway: checkpoint.strict_permissions=false)",
                      stacklevel=2)
        return
    fix = "copy it into a folder of yours" if problem.startswith("owned") else \
        f"chmod go-w {shlex.quote(str(path))}"
    raise UntrustedError(
        f"{message}. Refused; {fix}, or set checkpoint.allow_group_write=true if the group "
        "is trusted, or checkpoint.strict_permissions=false to resume anyway")


# --------------------------------------------------------------------------- finding one


@dataclass
class Found:
    """A verified checkpoint: where it is and its exact bytes (ready to broadcast)."""

    path: Path
    step: int
    data: bytes


def _read_checked(path: Path, name: str, trust: Trust) -> bytes:
    """Open, check who could write the opened file, read, verify the checksum."""
    try:
        with open(path, "rb") as f:
            check_trusted(path, trust, os.fstat(f.fileno()))  # the file read, not a later one
            data = f.read()
    except OSError as e:
        raise CheckpointError(f"checkpoint {name!r} cannot be read: {e}") from None
    verify(data, name)
    return data


def read_verified(path: Path, trust: Trust = Trust()) -> bytes:
    """Read a named checkpoint file, after checking who could write it and its folder."""
    try:
        real = path.resolve(strict=True)
        check_trusted(real.parent, trust)
    except OSError as e:
        raise CheckpointError(f"checkpoint {str(path)!r} cannot be read: {e}") from None
    return _read_checked(real, str(path), trust)


def find_latest(folder: Path, trust: Trust = Trust()) -> Found | None:
    """The newest checkpoint in `folder` whose checksum verifies; warn about each bad one.

    A folder or file that others could have written is refused (UntrustedError),
    not skipped: someone should look at it before anything resumes.
    """
    if folder.is_dir():
        check_trusted(folder.resolve(), trust)
    for step, path in list_checkpoints(folder):
        try:
            return Found(path, step, _read_checked(path, str(path), trust))
        except UntrustedError:
            raise
        except CheckpointError as e:
            warnings.warn(f"skipping checkpoint: {e}", stacklevel=2)
    return None


def is_corrupt(path: Path) -> bool:
    """Whether the file's bytes fail the format's checks (not: whether it can be read)."""
    try:
        data = path.read_bytes()
    except OSError:
        return False
    try:
        verify(data, str(path))
    except CheckpointError:
        return True
    return False


def set_aside(path: Path) -> Path:
    """Rename a bad checkpoint to `<name>.corrupt`: kept for inspection, no longer listed."""
    target = path.with_name(path.name + ".corrupt")
    os.replace(path, target)
    return target


def prune(folder: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` checkpoint files; return what was removed."""
    removed = []
    for _, path in list_checkpoints(folder)[keep:]:
        path.unlink(missing_ok=True)
        removed.append(path)
    return removed


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
    saved = without_compile_prefix(saved)
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


#: What a torch.compile wrapper puts before every key of its model's state dict.
COMPILE_PREFIX = "_orig_mod."


def without_compile_prefix(model_state: dict[str, Any]) -> dict[str, Any]:
    """A model state dict with torch.compile's `_orig_mod.` prefixes taken off (at any
    depth: a compiled submodule puts it mid-key), so that weights saved from a compiled
    wrapper load into the plain model hpcdp trains (hpcdp.train.accel); other keys and
    the order unchanged."""
    return {key.replace(COMPILE_PREFIX, ""): value for key, value in model_state.items()}


# --------------------------------------------------------------------------- legacy files


def convert_legacy(path: Path, out: Path, trust: Trust = Trust()) -> Path:
    """Rewrite a format-1 checkpoint in the current format, atomically, at `out`.

    This is the one place that unpickles without restrictions, so it runs only when a
    person asks for it (`hpcdp checkpoint convert`), and only on a file and folder
    that pass the same permission check as a resume.
    """
    data = read_verified(path, trust)
    version, payload = _split(data, str(path))
    if version != 1:
        raise CheckpointError(f"{path}: already in the current format; nothing to convert")
    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means an unusable file
        raise CheckpointError(f"{path}: cannot be deserialized: {e}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: payload is not a state dict")
    write_atomic(out, encode(state))
    decode(out.read_bytes(), str(out))  # the result must load the safe way
    return out


def main(argv: list[str] | None = None) -> int:
    """`hpcdp checkpoint convert FILE`: the knowing, one-time upgrade of an old checkpoint."""
    p = argparse.ArgumentParser(
        prog="hpcdp checkpoint",
        description="Convert a checkpoint written before hpcdp loaded checkpoints without "
        "running code. Converting unpickles the old file fully, which runs any code it names: "
        "convert only files you wrote yourself and no one else could have changed.")
    sub = p.add_subparsers(dest="command", required=True)
    conv = sub.add_parser("convert", help="rewrite an old (format 1) checkpoint, once")
    conv.add_argument("path", type=Path, help="the checkpoint file (step-N.pt)")
    conv.add_argument("--out", type=Path, help="write here instead of replacing the file")
    conv.add_argument("--allow-group-write", action="store_true",
                      help="accept a file or folder that your group can write")
    args = parse_args(p, argv)
    out = args.out or args.path
    try:
        convert_legacy(args.path, out, Trust(allow_group_write=args.allow_group_write))
    except CheckpointError as e:
        print(f"hpcdp checkpoint: error: {e}", file=sys.stderr)
        return 2
    print(f"converted {args.path} -> {out}: it now loads without running code")
    return 0


if __name__ == "__main__":
    sys.exit(main())
