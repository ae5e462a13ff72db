"""The export folder: weights in safetensors, a config.json that describes them, a tokenizer.

    model.safetensors   every tensor of the model's state dict (tied copies once)
    config.json         format, task, model spec (hpcdp.models.spec), input schema,
                        the weights file's sha256 and size, where it came from
    tokenizer.json      the LM's tokenizer, when it has one (its sha256 in config.json)

safetensors is a header of JSON plus raw tensor bytes: reading it runs no code,
and other tools read it. Reading a folder checks, before any tensor is used,
that config.json is this format, that the weights file is the one config.json
was written with (size, then sha256: a truncated or replaced file is refused
naming it), and that the file parses. Whether the tensors fit the model is
hpcdp.models.spec.load_weights's check. No Horovod, MPI or HDF5 here.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

FORMAT = "hpcdp.export"
FORMAT_VERSION = 1
WEIGHTS = "model.safetensors"
CONFIG = "config.json"
TOKENIZER = "tokenizer.json"


class ExportError(ValueError):
    """An export folder or file that cannot be used: the message names the file and why."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
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
        config = json.loads(path.read_text())
    except OSError as e:
        raise ExportError(f"{path}: cannot be read: {e}") from None
    except ValueError as e:
        raise ExportError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise ExportError(f"{path}: not an hpcdp export (format {FORMAT!r} expected)")
    if config.get("format_version") != FORMAT_VERSION:
        raise ExportError(f"{path}: format_version {config.get('format_version')!r}; this "
                          f"hpcdp reads {FORMAT_VERSION}")
    for key in ("task", "model", "weights"):
        if not isinstance(config.get(key), dict if key != "task" else str):
            raise ExportError(f"{path}: has no valid {key!r} entry")
    return config


def check_file(path: Path, expected: Mapping[str, Any], what: str) -> None:
    """`path` has the size and sha256 config.json recorded for it."""
    try:
        size = path.stat().st_size
    except OSError as e:
        raise ExportError(f"{path}: cannot be read: {e}") from None
    want = expected.get("bytes")
    if want is not None and size != want:
        raise ExportError(f"{path}: {size} bytes, but config.json says {want}: the {what} file "
                          "is truncated or was replaced after the export")
    digest = sha256_file(path)
    if digest != expected.get("sha256"):
        recorded = str(expected.get("sha256"))[:16]
        raise ExportError(f"{path}: sha256 {digest[:16]}... differs from the {recorded}... "
                          f"config.json records: the {what} file was replaced or altered after "
                          "the export")


def read_tensors(folder: Path, config: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The weights, after checking they are the file config.json was written with."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = folder / str(config["weights"].get("file", WEIGHTS))
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
    path = folder / str(entry["file"])
    check_file(path, entry, "tokenizer")
    return path.read_text(encoding="utf-8")
