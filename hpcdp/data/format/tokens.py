"""The token-stream HDF5 format: one flat token dataset plus document offsets.

A file holds one split of a corpus as:

- ``tokens``: 1-D, ``uint16`` when the vocabulary has at most 65,536 ids, else
  ``uint32``, chunked along the stream (about 1 M tokens per chunk). Every
  document is followed by the end-of-document id, so documents are packed one
  after another and a reader's windows cross document boundaries.
- ``doc_offsets``: 1-D ``int64`` of length ``D + 1``: document ``i`` (its end
  token included) is ``tokens[doc_offsets[i]:doc_offsets[i + 1]]``;
  ``doc_offsets[0] == 0`` and ``doc_offsets[D] == num_tokens``.
- Root attributes: ``format`` (``"hpcdp.tokens"``), ``format_version``,
  ``vocab_size``, ``eod_id``, ``tokenizer`` (``"bytes"`` or the name of a
  tokenizer.json), ``tokenizer_sha256``, ``num_tokens``, ``num_documents``,
  ``max_token_id`` and how the file was made (``split``, ``source``,
  ``source_params``, ``hpcdp_version``); recipes may add their own (the Markov
  corpus adds ``entropy_rate_nats``).

A training sample is a window of ``S + 1`` consecutive tokens (inputs and the
targets shifted by one); window ``i`` starts at token ``i * S``, so consecutive
windows share one token and a stream of ``T`` tokens has ``(T - 1) // S`` of them.

This module is the format alone (names, layout arithmetic, a small writer for one
process, the validator); the parallel writer is `hpcdp.data.prep.text.writer`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hpcdp import __version__

FORMAT = "hpcdp.tokens"
FORMAT_VERSION = 1
TOKENS = "tokens"
DOC_OFFSETS = "doc_offsets"
#: Target tokens per chunk of the token dataset (and the unit of contiguous reads).
CHUNK_TOKENS = 1 << 20
#: Small files are cut into at least this many chunks, so block shuffling has blocks.
MIN_CHUNKS = 64
#: Offsets per chunk of the offsets dataset (512 KiB of int64).
OFFSET_CHUNK = 1 << 16
#: Elements read per call when the validator scans a dataset: bounds its memory.
SCAN_ELEMENTS = 1 << 22
#: Tokens the cheap validation checks at each end of the stream (small files: all of them).
EDGE_TOKENS = 1 << 20
#: The byte-level tokenizer: ids 0-255 are the bytes of UTF-8 text, 256 ends a document.
BYTES_TOKENIZER = "bytes"
BYTES_VOCAB = 257
BYTES_EOD = 256
_BYTES_IDENTITY = b"hpcdp byte-level tokenizer v1: ids 0-255 are bytes, 256 ends a document"

REQUIRED_ATTRS = ("format", "format_version", "vocab_size", "eod_id", "tokenizer",
                  "tokenizer_sha256", "num_tokens", "num_documents")


class TokenFormatError(ValueError):
    """A token file or option breaks the format: the message names the file and the problem."""


# -- pure layout ----------------------------------------------------------------------


def token_dtype(vocab_size: int) -> np.dtype:
    """The narrowest unsigned type holding every id below `vocab_size`."""
    if vocab_size < 1:
        raise TokenFormatError(f"vocabulary size must be at least 1, got {vocab_size}")
    if vocab_size <= 1 << 16:
        return np.dtype(np.uint16)
    if vocab_size <= 1 << 32:
        return np.dtype(np.uint32)
    raise TokenFormatError(f"vocabulary size {vocab_size} does not fit 32-bit token ids")


def chunk_tokens(num_tokens: int, target: int = CHUNK_TOKENS) -> int:
    """Tokens per chunk: a power of two up to `target`, at least `MIN_CHUNKS` chunks for
    small files. A power of two, so that a power-of-two sequence length divides it and
    the reader's blocks of windows are whole chunks."""
    small = 1 << max(0, (-(-num_tokens // MIN_CHUNKS)).bit_length() - 1)
    return max(1, min(target, small))


def num_windows(num_tokens: int, seq_len: int) -> int:
    """Windows of ``seq_len + 1`` tokens starting every `seq_len` tokens."""
    if seq_len < 1:
        raise TokenFormatError(f"sequence length must be at least 1, got {seq_len}")
    return max(0, num_tokens - 1) // seq_len


def window_block(chunk: int, seq_len: int) -> int:
    """Windows per block, the reader's unit of contiguous reads: about one chunk of tokens."""
    return max(1, chunk // seq_len)


def offsets_from_lengths(lengths: np.ndarray, start: int = 0) -> np.ndarray:
    """``D + 1`` offsets of documents of the given token counts, the first at `start`."""
    return np.concatenate(([start], start + np.cumsum(lengths, dtype=np.int64))).astype(np.int64)


def bytes_tokenizer_sha256() -> str:
    """The byte-level tokenizer's hash: of the sentence that defines it."""
    return hashlib.sha256(_BYTES_IDENTITY).hexdigest()


def file_sha256(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tokenizer_sha256(tokenizer: str | os.PathLike[str]) -> str:
    """The hash a file records for `tokenizer`: ``"bytes"`` or a tokenizer.json path."""
    if os.fspath(tokenizer) == BYTES_TOKENIZER:
        return bytes_tokenizer_sha256()
    return file_sha256(tokenizer)


@dataclass(frozen=True)
class TokenMeta:
    """What a token file records besides the data: the vocabulary and how it was made."""

    vocab_size: int
    eod_id: int
    tokenizer: str
    tokenizer_sha256: str
    split: str = "train"
    source: str = ""
    source_params: Mapping[str, Any] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        token_dtype(self.vocab_size)
        if not 0 <= self.eod_id < self.vocab_size:
            raise TokenFormatError(
                f"end-of-document id {self.eod_id} is outside the vocabulary of "
                f"{self.vocab_size}")

    @property
    def dtype(self) -> np.dtype:
        return token_dtype(self.vocab_size)

    def attrs(self, num_tokens: int, num_documents: int, max_token_id: int) -> dict[str, Any]:
        return {
            "format": FORMAT, "format_version": FORMAT_VERSION,
            "vocab_size": self.vocab_size, "eod_id": self.eod_id,
            "tokenizer": self.tokenizer, "tokenizer_sha256": self.tokenizer_sha256,
            "num_tokens": num_tokens, "num_documents": num_documents,
            "max_token_id": max_token_id, "split": self.split, "source": self.source,
            "source_params": json.dumps(dict(self.source_params), sort_keys=True),
            "hpcdp_version": __version__, **dict(self.extra),
        }


def create_datasets(f: Any, meta: TokenMeta, num_tokens: int, num_documents: int,
                    max_token_id: int) -> tuple[Any, Any]:
    """Create the two datasets and the attributes in an open h5py file (collective under mpio)."""
    chunk = chunk_tokens(num_tokens)
    tokens = f.create_dataset(TOKENS, shape=(num_tokens,), dtype=meta.dtype,
                              chunks=(chunk,) if num_tokens else None, fill_time="never")
    offsets = f.create_dataset(DOC_OFFSETS, shape=(num_documents + 1,), dtype=np.int64,
                               chunks=(min(OFFSET_CHUNK, num_documents + 1),),
                               fill_time="never")
    for key, value in meta.attrs(num_tokens, num_documents, max_token_id).items():
        f.attrs[key] = value
    return tokens, offsets


def write_tokens(path: str | os.PathLike[str], documents: list[np.ndarray],
                 meta: TokenMeta) -> None:
    """Write `documents` (each ending with the end id) to one file from one process.

    For tests and small corpora; the preparation commands use the parallel writer.
    """
    import h5py

    if not documents:
        raise TokenFormatError(f"{os.fspath(path)}: no documents to write")
    tokens = np.concatenate(documents).astype(meta.dtype)
    offsets = offsets_from_lengths(np.array([len(d) for d in documents], np.int64))
    with h5py.File(path, "w") as f:
        tok, off = create_datasets(f, meta, len(tokens), len(documents),
                                   int(tokens.max()) if len(tokens) else 0)
        if len(tokens):
            tok[:] = tokens
        off[:] = offsets


# -- validation -----------------------------------------------------------------------


@dataclass(frozen=True)
class TokenInfo:
    """A validated token file: what the reader and the trainer need to know."""

    path: str
    num_tokens: int
    num_documents: int
    vocab_size: int
    eod_id: int
    dtype: np.dtype
    chunk: int
    tokenizer: str
    tokenizer_sha256: str
    attrs: Mapping[str, Any]

    def windows(self, seq_len: int) -> int:
        return num_windows(self.num_tokens, seq_len)


def _attr(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _read_attrs(f: Any, path: str) -> dict[str, Any]:
    attrs = {k: _attr(v) for k, v in f.attrs.items()}
    missing = [k for k in REQUIRED_ATTRS if k not in attrs]
    if missing:
        raise TokenFormatError(
            f"{path}: not an hpcdp token file: attributes {', '.join(missing)} missing")
    if attrs["format"] != FORMAT or int(attrs["format_version"]) != FORMAT_VERSION:
        raise TokenFormatError(
            f"{path}: format {attrs['format']!r} version {attrs['format_version']}, expected "
            f"{FORMAT!r} version {FORMAT_VERSION}")
    return attrs


def _check_datasets(f: Any, path: str, attrs: Mapping[str, Any]) -> tuple[Any, Any]:
    import h5py

    for name in (TOKENS, DOC_OFFSETS):
        if not isinstance(f.get(name), h5py.Dataset):
            raise TokenFormatError(f"{path}: no dataset {name!r}")
    tokens, offsets = f[TOKENS], f[DOC_OFFSETS]
    vocab, eod = int(attrs["vocab_size"]), int(attrs["eod_id"])
    if tokens.ndim != 1 or tokens.dtype.kind != "u":
        raise TokenFormatError(
            f"{path}: {TOKENS!r} must be 1-D unsigned integers, got {tokens.dtype} "
            f"shape {tokens.shape}")
    if vocab > 1 << (8 * tokens.dtype.itemsize):
        raise TokenFormatError(f"{path}: vocabulary {vocab} does not fit {tokens.dtype}")
    if not 0 <= eod < vocab:
        raise TokenFormatError(f"{path}: end-of-document id {eod} outside vocabulary {vocab}")
    n, d = int(attrs["num_tokens"]), int(attrs["num_documents"])
    if tokens.shape[0] != n or offsets.shape != (d + 1,):
        raise TokenFormatError(
            f"{path}: attributes say {n} tokens and {d} documents, but {TOKENS!r} has "
            f"{tokens.shape[0]} and {DOC_OFFSETS!r} has shape {offsets.shape}")
    if d == 0 or n == 0:
        raise TokenFormatError(f"{path}: no documents (an empty corpus)")
    return tokens, offsets


def _check_offsets(offsets: Any, path: str, num_tokens: int) -> None:
    """Offsets start at 0, end at the token count, and never decrease (read in slices)."""
    d1 = offsets.shape[0]
    prev = 0
    for a in range(0, d1, SCAN_ELEMENTS):
        part = offsets[a : a + SCAN_ELEMENTS]
        if (a == 0 and part[0] != 0) or part[0] < prev or np.any(np.diff(part) < 0):
            raise TokenFormatError(f"{path}: {DOC_OFFSETS!r} must rise from 0 (slice from {a})")
        prev = int(part[-1])
    if prev != num_tokens:
        raise TokenFormatError(
            f"{path}: {DOC_OFFSETS!r} ends at {prev}, not at the token count {num_tokens}")


def check_token_ids(tokens: Any, path: str, vocab_size: int, start: int = 0,
                    stop: int | None = None) -> None:
    """Raise if any id in ``tokens[start:stop]`` is >= `vocab_size`, naming its position."""
    stop = tokens.shape[0] if stop is None else stop
    for a in range(start, stop, SCAN_ELEMENTS):
        part = np.asarray(tokens[a : min(stop, a + SCAN_ELEMENTS)])
        if len(part) and int(part.max()) >= vocab_size:
            at = a + int(np.argmax(part >= vocab_size))
            raise TokenFormatError(
                f"{path}: token id {int(part[at - a])} at position {at} is not below the "
                f"vocabulary size {vocab_size}")


def _check_fit(path: str, num_tokens: int, seq_len: int | None,
               global_batch: int | None) -> None:
    if seq_len is None:
        return
    windows = num_windows(num_tokens, seq_len)
    if windows == 0:
        raise TokenFormatError(
            f"{path}: sequence length {seq_len} is longer than the data: a window needs "
            f"{seq_len + 1} tokens and the file has {num_tokens}")
    if global_batch is not None and windows < global_batch:
        raise TokenFormatError(
            f"{path}: {windows} windows of {seq_len} + 1 tokens, fewer than one global batch "
            f"of {global_batch}")


def validate_tokens(
    path: str | os.PathLike[str], *, seq_len: int | None = None,
    global_batch: int | None = None, tokenizer_sha256: str | None = None,
    scan: bool = False,
) -> TokenInfo:
    """Check a token file; raise `TokenFormatError` naming the file and the problem.

    Cheap by default (attributes, shapes, offsets, the recorded ``max_token_id``,
    the ids of the first and last `EDGE_TOKENS`); ``scan=True`` reads every token. Call it
    on every rank before any collective, so bad input ends the job with a message
    everywhere instead of a hang.
    """
    import h5py

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise TokenFormatError(f"{path}: no such file")
    if not h5py.is_hdf5(path):
        raise TokenFormatError(f"{path}: not an HDF5 file")
    with h5py.File(path, "r") as f:
        attrs = _read_attrs(f, path)
        tokens, offsets = _check_datasets(f, path, attrs)
        n, vocab = int(attrs["num_tokens"]), int(attrs["vocab_size"])
        if int(attrs.get("max_token_id", 0)) >= vocab:
            raise TokenFormatError(
                f"{path}: its largest token id {attrs['max_token_id']} is not below the "
                f"vocabulary size {vocab}")
        chunk = int(tokens.chunks[0]) if tokens.chunks else CHUNK_TOKENS
        if scan or n <= 2 * EDGE_TOKENS:
            check_token_ids(tokens, path, vocab)
        else:
            check_token_ids(tokens, path, vocab, 0, EDGE_TOKENS)
            check_token_ids(tokens, path, vocab, n - EDGE_TOKENS, n)
        _check_offsets(offsets, path, n)
        info = TokenInfo(path, n, int(attrs["num_documents"]), vocab, int(attrs["eod_id"]),
                         np.dtype(tokens.dtype), chunk, str(attrs["tokenizer"]),
                         str(attrs["tokenizer_sha256"]), attrs)
    if tokenizer_sha256 is not None and tokenizer_sha256 != info.tokenizer_sha256:
        raise TokenFormatError(
            f"{path}: made with tokenizer {info.tokenizer!r} of sha256 "
            f"{info.tokenizer_sha256[:16]}..., but the given tokenizer has sha256 "
            f"{tokenizer_sha256[:16]}...: tokens would be read with the wrong vocabulary")
    _check_fit(path, n, seq_len, global_batch)
    return info
