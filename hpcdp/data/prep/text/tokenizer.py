"""The tokenizers a token file can be made with: byte-level, or a HuggingFace tokenizer.json.

- ``bytes`` (the default): ids 0-255 are the bytes of the UTF-8 text, 256 ends a
  document. Nothing to train or ship.
- A byte-level BPE trained on the corpus with HuggingFace ``tokenizers``
  (`train_bpe`), saved beside the data as tokenizer.json.
- An existing tokenizer.json given by path (`load_json`).

Nothing is downloaded. A file records its tokenizer's name and the SHA-256 of
the tokenizer.json bytes, so a run can check it reads tokens with the vocabulary
they were made with.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpcdp.data.format import tokens as tk

DEFAULT_EOD = "<|endoftext|>"
#: Documents encoded per call: the Rust side parallelises within a batch.
ENCODE_BATCH = 1024
#: Characters of documents encoded per call at most (a longer document alone): a batch's
#: text and tokens are what a rank holds, so they are bounded by size, not only by count.
ENCODE_CHARS = 1 << 20
#: Where `pieces` may cut a text: before the last character of a run of ASCII white space
#: between two characters that are not white space.
CUT = re.compile(r"[^\s][ \t\r\n]*(?=[ \t\r\n][^\s])")
#: The size of the library's thread pool (rayon's), read once, when the pool first runs.
THREADS_VAR = "RAYON_NUM_THREADS"


def library_threads(environ: Mapping[str, str]) -> str | None:
    """The tokenizer library's threads for this rank (pure), or None to leave its default
    (every CPU the rank may use). Ranks of a node that its launcher left unbound each see
    every core, and the library would start that many threads in each: a rank gets its
    share instead, the threads hpcdp's plan gave it (OMP_NUM_THREADS, set per local rank
    by `thread_plan.apply`). An exported RAYON_NUM_THREADS wins."""
    if THREADS_VAR in environ:
        return None
    share = environ.get("OMP_NUM_THREADS", "").strip()
    return share if share.isdigit() and int(share) > 0 else None


def share_threads(environ: MutableMapping[str, str]) -> bool:
    """`library_threads` set in `environ` (os.environ) before the library first runs;
    whether it was set here (not exported)."""
    threads = library_threads(environ)
    if threads is not None:
        environ[THREADS_VAR] = threads
    return threads is not None


class TokenizerError(ValueError):
    """A tokenizer cannot be used: the message names the file or option."""


@dataclass(frozen=True)
class Tokenizer:
    """What preparation needs: a name, the vocabulary, the end id, a hash, and `encode`."""

    name: str
    vocab_size: int
    eod_id: int
    sha256: str
    json: str | None = None  # the tokenizer.json text (None for bytes)
    _hf: Any = None
    cuts_at_lines: bool = False  # whether `pieces` of a text encode to its ids

    def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Every text's ids, each followed by the end id, as one array of the file's
        dtype; and each document's token count. Converted batch by batch, so a block's
        tokens are never held as Python lists."""
        dtype = tk.token_dtype(self.vocab_size)
        lengths = np.zeros(len(texts), np.int64)
        if self._hf is None:
            raw = [t.encode() for t in texts]
            lengths[:] = [len(r) + 1 for r in raw]
            flat = np.frombuffer(b"".join(raw), np.uint8).astype(dtype)
            ends = np.cumsum(lengths - 1)  # where each document's bytes end in `flat`
            return np.insert(flat, ends, self.eod_id), lengths
        pieces: list[np.ndarray] = []
        for a in range(0, len(texts), ENCODE_BATCH):
            for i, ids in enumerate(self._ids(texts[a : a + ENCODE_BATCH], dtype), a):
                lengths[i] = len(ids) + 1
                pieces += [ids, np.array([self.eod_id], dtype)]
        return (np.concatenate(pieces) if pieces else np.zeros(0, dtype)), lengths

    def _ids(self, texts: Sequence[str], dtype: np.dtype) -> list[np.ndarray]:
        """Each text's ids; one longer than `ENCODE_CHARS` is encoded a piece at a time where
        the tokenizer allows it (`pieces`: the same ids), so the library's memory follows
        the piece, not the document (about 200 bytes a character)."""
        if not (self.cuts_at_lines and any(len(t) > ENCODE_CHARS for t in texts)):
            return [np.array(e.ids, dtype)
                    for e in self._hf.encode_batch(list(texts), add_special_tokens=False)]
        return [np.concatenate([np.array(self._hf.encode(p, add_special_tokens=False).ids,
                                         dtype) for p in pieces(t, ENCODE_CHARS)]) for t in texts]

    def encode_batches(self, texts: Iterable[str]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """`encode_flat` of `texts` a `batches` batch at a time, so that a block's
        documents, and their tokens, are never all held: one batch's at a time."""
        for batch in batches(texts):
            yield self.encode_flat(batch)


def cuts_at_lines(config: dict[str, Any]) -> bool:
    """Whether a tokenizer.json encodes a text cut by `pieces` to the text's ids: a
    byte-level BPE that normalizes nothing and splits words by the GPT-2 rule without a
    prefix space (what `train_bpe` makes), whose added tokens hold no white space. By that
    rule a run of white space before a word is one word but its last character, which
    starts the next word (or is one alone), whatever lies before or after the run."""
    pre = config.get("pre_tokenizer") or {}
    return (config.get("normalizer") is None and (config.get("model") or {}).get("type") == "BPE"
            and pre.get("type") == "ByteLevel" and pre.get("use_regex", True) is True
            and pre.get("add_prefix_space") is False
            and not any(re.search(r"\s", t.get("content", ""))
                        for t in config.get("added_tokens") or []))


def pieces(text: str, size: int = ENCODE_CHARS) -> list[str]:
    """`text` in pieces of about `size` characters, each cut where `CUT` allows (a text
    without such a place stays whole)."""
    out, pos = [], 0
    while len(text) - pos > size:
        cut = CUT.search(text, pos + size)
        if cut is None:
            break
        out.append(text[pos : cut.end()])
        pos = cut.end()
    return [*out, text[pos:]]


def batches(texts: Iterable[str], docs: int = ENCODE_BATCH, chars: int = ENCODE_CHARS
            ) -> Iterator[list[str]]:
    """`texts` in order, in lists of at most `docs` documents and, unless a document alone
    is longer, `chars` characters: each document is encoded alone, so the cuts change
    no token."""
    batch: list[str] = []
    held = 0
    for text in texts:
        if batch and (len(batch) == docs or held + len(text) > chars):
            yield batch
            batch, held = [], 0
        batch.append(text)
        held += len(text)
    if batch:
        yield batch


def byte_level() -> Tokenizer:
    return Tokenizer(tk.BYTES_TOKENIZER, tk.BYTES_VOCAB, tk.BYTES_EOD,
                     tk.bytes_tokenizer_sha256())


def from_json(text: str, name: str, eod_token: str = DEFAULT_EOD) -> Tokenizer:
    """A tokenizer from tokenizer.json text; its end token must be in the vocabulary."""
    try:
        from tokenizers import Tokenizer as HF
    except ImportError as exc:
        raise TokenizerError("HuggingFace tokenizers is not installed (pip install "
                             "tokenizers)") from exc
    try:
        hf = HF.from_str(text)
    except Exception as exc:  # noqa: BLE001 - the library raises bare Exceptions
        raise TokenizerError(f"{name}: not a usable tokenizer.json: {exc}") from exc
    eod = hf.token_to_id(eod_token)
    if eod is None:
        raise TokenizerError(f"{name}: has no end-of-document token {eod_token!r} (see "
                             "--eod-token)")
    vocab = hf.get_vocab_size(with_added_tokens=True)
    return Tokenizer(name, vocab, int(eod), hashlib.sha256(text.encode()).hexdigest(), text, hf,
                     cuts_at_lines(json.loads(text)))


def load_json(path: str, eod_token: str = DEFAULT_EOD) -> Tokenizer:
    """An existing tokenizer.json; its hash is that of the file's bytes."""
    try:
        with open(path, encoding="utf-8", newline="") as fh:  # the bytes hashed as they are
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenizerError(f"--tokenizer {path}: cannot be read: {exc}") from exc
    return from_json(text, "tokenizer.json", eod_token)


def train_bpe(texts: Iterable[str], vocab_size: int, eod_token: str = DEFAULT_EOD
              ) -> Tokenizer:
    """A byte-level BPE trained on `texts`: every byte is in its alphabet, so any text encodes."""
    try:
        from tokenizers import Tokenizer as HF
        from tokenizers import decoders, models, pre_tokenizers, trainers
    except ImportError as exc:
        raise TokenizerError("HuggingFace tokenizers is not installed (pip install "
                             "tokenizers)") from exc
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + 1:
        raise TokenizerError(
            f"--vocab-size {vocab_size}: a byte-level BPE needs at least {len(alphabet) + 1}")
    hf = HF(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[eod_token],
                                  initial_alphabet=alphabet, show_progress=False)
    hf.train_from_iterator(texts, trainer=trainer)
    return from_json(hf.to_str(), "tokenizer.json", eod_token)


def trainer_env(environ: Mapping[str, str], every_cpu: bool) -> dict[str, str]:
    """The environment of the training child (pure): this one, without the thread share
    when it gets every CPU."""
    return {k: v for k, v in environ.items() if not (every_cpu and k == THREADS_VAR)}


def train_bpe_apart(texts: Iterable[str], vocab_size: int, eod_token: str = DEFAULT_EOD,
                    every_cpu: bool = True) -> Tokenizer:
    """`train_bpe` in a child process (`bpe_child`), so that its thread pool can differ from
    this process's: with `every_cpu`, the library's default (every CPU this rank may
    use: the other ranks sleep while one trains) where this process keeps its share for
    encoding; a pool's size is fixed once it first runs. The texts go through a pipe as
    JSON strings, a line each; tokenizer.json comes back on the child's stdout."""
    env = trainer_env(os.environ, every_cpu)
    with tempfile.TemporaryFile() as err:
        child = subprocess.Popen([sys.executable, "-m", "hpcdp.data.prep.text.bpe_child",
                                  str(vocab_size), eod_token], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=err, env=env)
        assert child.stdin is not None and child.stdout is not None
        try:
            for text in texts:
                child.stdin.write(json.dumps(text, ensure_ascii=False).encode() + b"\n")
            child.stdin.close()
        except BrokenPipeError:  # the child ended early: its message says why
            pass
        out = child.stdout.read().decode()
        code = child.wait()
        err.seek(0)
        message = err.read().decode(errors="replace").strip()
    if code == 2:
        raise TokenizerError(message)
    if code != 0:
        raise TokenizerError(f"training the BPE failed (exit {code}): {message[-2000:]}")
    return from_json(out, "tokenizer.json", eod_token)
