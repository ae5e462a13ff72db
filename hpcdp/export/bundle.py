"""The export folder: weights in safetensors, a config.json that describes them, a tokenizer.

    model.safetensors   every tensor of the model's state dict (tied copies once)
    config.json         format, task, model spec (hpcdp.models.spec), input schema,
                        the weights file's sha256 and size, where it came from
    tokenizer.json      the LM's tokenizer, when it has one (its sha256 in config.json)

safetensors is a header of JSON plus raw tensor bytes: reading it runs no code,
and other tools read it. Reading a folder checks, before any tensor is used,
that config.json is this format, that the files it names are plain names in the
folder (no ``/``, no ``..``) and regular files (not links, FIFOs or devices),
that the weights file is the one config.json was written with (size, then
sha256 over exactly that many bytes: a truncated or replaced file is refused
naming it), and that the file parses. `read_header` gives the tensors' names,
dtypes and shapes from the header alone, so that they can be compared with the
model config.json describes before any model is built (hpcdp.export.load).
Every refusal is an `ExportError` naming the file. No Horovod, MPI or HDF5 here.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

FORMAT = "hpcdp.export"
FORMAT_VERSION = 1
WEIGHTS = "model.safetensors"
CONFIG = "config.json"
TOKENIZER = "tokenizer.json"


#: config.json above this size is refused unread (a real one is a few KB, class names
#: of a large label set included).
MAX_CONFIG_BYTES = 16 << 20
#: A tokenizer.json above this size is refused unread (large BPE vocabularies: ~20 MB).
MAX_TOKENIZER_BYTES = 256 << 20
#: safetensors' own limit on its JSON header.
MAX_HEADER_BYTES = 100 << 20
#: torch dtype -> its safetensors name (the dtypes hpcdp's models hold).
DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
          torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16",
          torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}
_ITEMSIZE = {name: torch.empty(0, dtype=dt).element_size() for dt, name in DTYPES.items()}


class ExportError(ValueError):
    """An export folder or file that cannot be used: the message names the file and why."""


def open_regular(path: Path, limit: int | None = None, follow: bool = False
                 ) -> tuple[int, int]:
    """(descriptor, size) of `path` opened for reading, after checking it is a regular
    file (not a link, unless `follow`: O_NOFOLLOW; not a FIFO: opened non-blocking, then
    fstat) of at most `limit` bytes; `ExportError` naming it otherwise."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        why = "a symbolic link (the export's files must be in its folder)" if (
            os.path.islink(path)) else f"cannot be read: {e.strerror or e}"
        raise ExportError(f"{path}: {why}") from None
    info = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(info.st_mode):
        problem = "not a regular file (a FIFO, device, socket or folder)"
    elif limit is not None and info.st_size > limit:
        problem = f"{info.st_size} bytes, over the {limit}-byte limit for this file"
    if problem:
        os.close(fd)
        raise ExportError(f"{path}: {problem}")
    os.set_blocking(fd, True)
    return fd, info.st_size


def read_small(path: Path, limit: int, follow: bool = False) -> bytes:
    """The whole of a regular file of at most `limit` bytes (`open_regular`)."""
    fd, _ = open_regular(path, limit, follow)
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ExportError(f"{path}: grew past the {limit}-byte limit while read")
    return data


def sha256_file(path: Path, nbytes: int | None = None) -> str:
    """The sha256 of `path` (a regular file); with `nbytes`, of at most its first
    ``nbytes + 1`` bytes: enough to tell a file of that size, bounded whatever the file."""
    fd, _ = open_regular(path)
    digest = hashlib.sha256()
    left = float("inf") if nbytes is None else nbytes + 1
    with os.fdopen(fd, "rb") as f:
        while left > 0:
            block = f.read(int(min(1 << 20, left)))
            if not block:
                break
            digest.update(block)
            left -= len(block)
    return digest.hexdigest()


def _write_replace(path: Path, data: bytes) -> None:
    """Temp name in the same folder, fsync, rename: `path` is whole or absent."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write(out: Path, tensors: Mapping[str, torch.Tensor], config: dict[str, Any],
          tokenizer_json: str | None = None) -> Path:
    """Write an export folder: weights first, then the tokenizer, config.json last.

    config.json records the weights' hash, so a folder whose write stopped midway
    has no config.json matching its weights and is refused when read.
    """
    from safetensors.torch import save

    out.mkdir(parents=True, exist_ok=True)
    data = save(dict(tensors), metadata={"format": FORMAT})
    _write_replace(out / WEIGHTS, data)
    config = {"format": FORMAT, "format_version": FORMAT_VERSION, **config,
              "weights": {"file": WEIGHTS, "bytes": len(data),
                          "sha256": hashlib.sha256(data).hexdigest()}}
    if tokenizer_json is not None:
        raw = tokenizer_json.encode()
        _write_replace(out / TOKENIZER, raw)
        config["tokenizer"] = {**config.get("tokenizer", {}), "file": TOKENIZER,
                               "sha256": hashlib.sha256(raw).hexdigest()}
    _write_replace(out / CONFIG, (json.dumps(config, indent=2) + "\n").encode())
    return out


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / CONFIG
    try:
        config = json.loads(read_small(path, MAX_CONFIG_BYTES))
    except (ValueError, RecursionError) as e:
        raise ExportError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise ExportError(f"{path}: not an hpcdp export (format {FORMAT!r} expected)")
    if config.get("format_version") != FORMAT_VERSION:
        raise ExportError(f"{path}: format_version {config.get('format_version')!r}; this "
                          f"hpcdp reads {FORMAT_VERSION}")
    for key in ("task", "model", "weights"):
        if not isinstance(config.get(key), dict if key != "task" else str):
            raise ExportError(f"{path}: has no valid {key!r} entry")
    for key in ("weights", "tokenizer"):
        entry = config.get(key)
        if key == "weights" or (isinstance(entry, dict) and "file" in entry):
            check_entry(path, key, entry)
    return config


def check_entry(config_path: Path, key: str, entry: Any) -> None:
    """config.json's `key` entry names a plain file in the folder, its size and sha256."""
    if not isinstance(entry, dict):
        raise ExportError(f"{config_path}: {key!r} is not an object")
    name = entry.get("file", WEIGHTS if key == "weights" else None)
    if (not isinstance(name, str) or name in ("", ".", "..") or os.path.basename(name) != name
            or any(c in name for c in "/\\\0")):
        raise ExportError(f"{config_path}: {key}.file {name!r} is not a plain file name in the "
                          "export folder")
    size, digest = entry.get("bytes"), entry.get("sha256")
    if key == "weights" and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
        raise ExportError(f"{config_path}: {key}.bytes {size!r} is not a byte count")
    if not (isinstance(digest, str) and len(digest) == 64):
        raise ExportError(f"{config_path}: {key}.sha256 {digest!r} is not a sha256 digest")


def member(folder: Path, entry: Mapping[str, Any], default: str) -> Path:
    """The path of a file config.json names (a plain name: `check_entry`)."""
    return folder / str(entry.get("file", default))


def check_file(path: Path, expected: Mapping[str, Any], what: str,
               limit: int | None = None) -> None:
    """`path` is a regular file (of at most `limit` bytes) with the size and sha256
    config.json recorded for it; the hash reads no more than that size and one byte."""
    fd, size = open_regular(path, limit)
    os.close(fd)
    want = expected.get("bytes")
    if want is not None and size != want:
        raise ExportError(f"{path}: {size} bytes, but config.json says {want}: the {what} file "
                          "is truncated or was replaced after the export")
    digest = sha256_file(path, size if want is None else want)
    if digest != expected.get("sha256"):
        recorded = str(expected.get("sha256"))[:16]
        raise ExportError(f"{path}: sha256 {digest[:16]}... differs from the {recorded}... "
                          f"config.json records: the {what} file was replaced or altered after "
                          "the export")


def weights_path(folder: Path, config: Mapping[str, Any]) -> Path:
    return member(folder, config["weights"], WEIGHTS)


def read_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{tensor name: (safetensors dtype, shape)} from the header of a checked weights file,
    each entry's byte range checked against its dtype, shape and the file's size."""
    fd, size = open_regular(path)
    with os.fdopen(fd, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < n <= min(MAX_HEADER_BYTES, size - 8):
            raise ExportError(f"{path}: not a readable safetensors file: header length {n} "
                              f"does not fit a {size}-byte file")
        raw = f.read(n)
    try:
        header = json.loads(raw)
        header.pop("__metadata__", None)
        return {name: _header_entry(entry, size - 8 - n) for name, entry in header.items()}
    except (ValueError, TypeError, AttributeError, KeyError, RecursionError) as e:
        raise ExportError(f"{path}: not a readable safetensors file: bad header: {e}") from None


def _header_entry(entry: Mapping[str, Any], data_bytes: int) -> tuple[str, tuple[int, ...]]:
    dtype, shape, (lo, hi) = str(entry["dtype"]), tuple(entry["shape"]), entry["data_offsets"]
    if not all(isinstance(d, int) and d >= 0 for d in (*shape, lo, hi)):
        raise ValueError(f"shape {list(shape)} or offsets {[lo, hi]} are not counts")
    numel = 1
    for d in shape:
        numel *= d
    if not lo <= hi <= data_bytes or (dtype in _ITEMSIZE and hi - lo != numel * _ITEMSIZE[dtype]):
        raise ValueError(f"{dtype} {list(shape)} at bytes {lo}..{hi} of {data_bytes}")
    return dtype, shape


def read_tensors(folder: Path, config: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The weights, after checking they are the file config.json was written with."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = weights_path(folder, config)
    check_file(path, config["weights"], "weights")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise ExportError(f"{path}: not a readable safetensors file: {e}") from None


def read_tokenizer(folder: Path, config: Mapping[str, Any]) -> str | None:
    """The tokenizer.json text, checked against its hash; None when the export has none."""
    entry = config.get("tokenizer") or {}
    if "file" not in entry:
        return None
    path = member(folder, entry, TOKENIZER)
    check_file(path, entry, "tokenizer", MAX_TOKENIZER_BYTES)
    try:
        return read_small(path, MAX_TOKENIZER_BYTES).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ExportError(f"{path}: not UTF-8 text: {e}") from None
