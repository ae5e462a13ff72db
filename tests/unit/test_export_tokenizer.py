"""An LM export ships the tokenizer.json its data was made with, and only that one."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from hpcdp.data.prep.text.tokenizer import train_bpe
from hpcdp.export import text
from hpcdp.export.command import lm_tokenizer
from hpcdp.train.checkpoint_format import CheckpointError

TEXTS = ["def add(a, b):\n    return a + b\n", "the quick brown fox jumps over the lazy dog"] * 20


def made_with(tmp_path: Path) -> tuple[dict, str]:
    tok = train_bpe(TEXTS, vocab_size=300)
    (tmp_path / "tokenizer.json").write_text(tok.json or "", encoding="utf-8")
    attrs = {"tokenizer": "tokenizer.json", "tokenizer_sha256": tok.sha256,
             "eod_id": tok.eod_id, "_path": str(tmp_path / "train.h5")}
    return attrs, tok.json or ""


def test_the_tokenizer_travels_and_decodes(tmp_path: Path) -> None:
    attrs, raw = made_with(tmp_path)
    entry, shipped = lm_tokenizer({}, attrs)
    assert shipped == raw and entry["name"] == "tokenizer.json"
    codec = text.codec(entry, shipped)
    ids = codec.encode("return a + b")
    assert len(ids) < len("return a + b")  # merges, not bytes
    assert codec.decode(ids) == "return a + b"


def test_a_tokenizer_json_that_is_not_the_datas_is_refused(tmp_path: Path) -> None:
    attrs, raw = made_with(tmp_path)
    attrs["tokenizer_sha256"] = hashlib.sha256(b"another").hexdigest()
    with pytest.raises(CheckpointError, match=r"tokenizer\.json: its sha256 is not"):
        lm_tokenizer({}, attrs)


def test_bytes_and_symbols_ship_no_file() -> None:
    for name in ("bytes", "markov-64"):
        entry, shipped = lm_tokenizer({}, {"tokenizer": name, "tokenizer_sha256": "x",
                                           "eod_id": 1, "_path": "/nonexistent/train.h5"})
        assert shipped is None and entry["name"] == name


def test_a_linked_tokenizer_is_followed_and_an_oversized_one_refused_unread(
        tmp_path: Path, monkeypatch) -> None:
    from hpcdp.export import bundle

    data = tmp_path / "data"
    data.mkdir()
    attrs, raw = made_with(data)
    linked = tmp_path / "run"
    linked.mkdir()
    (linked / "tokenizer.json").symlink_to(data / "tokenizer.json")
    entry, shipped = lm_tokenizer({}, {**attrs, "_path": str(linked / "train.h5")})
    assert shipped == raw  # data linked in file by file: its tokenizer comes along
    monkeypatch.setattr(bundle, "MAX_TOKENIZER_BYTES", len(raw.encode()) - 1)
    with pytest.raises(CheckpointError, match=r"bytes, over the \d+-byte limit for this "
                                              r"file; not exported"):
        lm_tokenizer({}, attrs)


def test_a_tokenizer_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    attrs, _ = made_with(tmp_path)
    bad = b"\xff\xfe not json"
    (tmp_path / "tokenizer.json").write_bytes(bad)
    attrs["tokenizer_sha256"] = hashlib.sha256(bad).hexdigest()
    with pytest.raises(CheckpointError, match="not UTF-8 text"):
        lm_tokenizer({}, attrs)
