"""The token-stream format: layout arithmetic, a written file read back, every validator error."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcdp.data.format import tokens as tk

META = tk.TokenMeta(vocab_size=100, eod_id=99, tokenizer="test", tokenizer_sha256="ab" * 32)


def docs_of(lengths: list[int], eod: int = 99, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.append(rng.integers(0, eod, n), eod) for n in lengths]


def test_dtype_by_vocabulary() -> None:
    assert tk.token_dtype(257) == np.uint16
    assert tk.token_dtype(65536) == np.uint16
    assert tk.token_dtype(65537) == np.uint32
    with pytest.raises(tk.TokenFormatError, match="does not fit"):
        tk.token_dtype(2**32 + 1)


def test_windows_and_blocks() -> None:
    # 11 tokens, S=5: windows [0,6) and [5,11); a third would need token 15.
    assert tk.num_windows(11, 5) == 2
    assert tk.num_windows(10, 5) == 1
    assert tk.num_windows(1, 1) == 0
    assert tk.window_block(1 << 20, 1024) == 1024
    assert tk.window_block(10, 1024) == 1
    assert tk.chunk_tokens(10**9) == tk.CHUNK_TOKENS
    assert tk.chunk_tokens(6400) == 64  # small files: at least 64 chunks, a power of two
    assert tk.chunk_tokens(50_000_000) == 1 << 19
    assert tk.chunk_tokens(1) == 1


def test_written_file_reads_back_with_plain_h5py(tmp_path: Path) -> None:
    docs = docs_of([5, 0, 17, 3])
    path = tmp_path / "t.h5"
    tk.write_tokens(path, docs, META)
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(f["tokens"][...], np.concatenate(docs))
        assert f["tokens"].dtype == np.uint16
        offsets = f["doc_offsets"][...]
        assert offsets.dtype == np.int64 and list(offsets) == [0, 6, 7, 25, 29]
        for i, doc in enumerate(docs):
            np.testing.assert_array_equal(f["tokens"][offsets[i] : offsets[i + 1]], doc)
        assert f.attrs["num_documents"] == 4 and f.attrs["num_tokens"] == 29
        assert f.attrs["eod_id"] == 99 and f.attrs["vocab_size"] == 100
    info = tk.validate_tokens(path, seq_len=4, global_batch=7)
    assert (info.num_tokens, info.num_documents, info.windows(4)) == (29, 4, 7)
    assert info.tokenizer == "test" and info.tokenizer_sha256 == "ab" * 32


def _rewrite(path: Path, **changes: object) -> None:
    with h5py.File(path, "r+") as f:
        for key, value in changes.items():
            if key == "tokens_at":
                pos, val = value  # type: ignore[misc]
                f["tokens"][pos] = val
            elif key == "offsets_at":
                pos, val = value  # type: ignore[misc]
                f["doc_offsets"][pos] = val
            else:
                f.attrs[key] = value


@pytest.mark.parametrize(("change", "problem"), [
    ({"tokens_at": (3, 150)}, "token id 150 at position 3 is not below the vocabulary size 100"),
    ({"max_token_id": 100}, "largest token id 100 is not below the vocabulary size 100"),
    ({"offsets_at": (2, 3)}, "'doc_offsets' must rise from 0"),
    ({"num_tokens": 30}, "attributes say 30 tokens"),
    ({"format": "other"}, "format 'other'"),
])
def test_validator_names_the_problem(tmp_path: Path, change: dict, problem: str) -> None:
    path = tmp_path / "t.h5"
    tk.write_tokens(path, docs_of([5, 0, 17, 3]), META)
    _rewrite(path, **change)
    with pytest.raises(tk.TokenFormatError) as err:
        tk.validate_tokens(path)
    assert str(path) in str(err.value) and problem in str(err.value)


def test_full_scan_finds_a_bad_id_in_the_middle(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(tk, "EDGE_TOKENS", 1000)
    monkeypatch.setattr(tk, "SCAN_ELEMENTS", 3000)
    path = tmp_path / "t.h5"
    tk.write_tokens(path, docs_of([4000] * 5), META)
    _rewrite(path, tokens_at=(10_000, 120))
    tk.validate_tokens(path)  # the cheap check reads 1000 tokens at each end only
    with pytest.raises(tk.TokenFormatError, match="token id 120 at position 10000"):
        tk.validate_tokens(path, scan=True)


def test_fit_errors(tmp_path: Path) -> None:
    path = tmp_path / "t.h5"
    tk.write_tokens(path, docs_of([9]), META)  # 10 tokens
    with pytest.raises(tk.TokenFormatError, match="sequence length 10 is longer than the data"):
        tk.validate_tokens(path, seq_len=10)
    with pytest.raises(tk.TokenFormatError, match="3 windows of 3 \\+ 1 tokens, fewer than one "
                                                  "global batch of 4"):
        tk.validate_tokens(path, seq_len=3, global_batch=4)
    tk.validate_tokens(path, seq_len=3, global_batch=3)


def test_hash_mismatch_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "t.h5"
    tk.write_tokens(path, docs_of([9]), META)
    with pytest.raises(tk.TokenFormatError, match="the given tokenizer has sha256 cdcdcd"):
        tk.validate_tokens(path, tokenizer_sha256="cd" * 32)
    tk.validate_tokens(path, tokenizer_sha256="ab" * 32)
    with pytest.raises(tk.TokenFormatError, match="no such file"):
        tk.validate_tokens(tmp_path / "none.h5")


def test_no_documents(tmp_path: Path) -> None:
    with pytest.raises(tk.TokenFormatError, match="no documents"):
        tk.write_tokens(tmp_path / "t.h5", [], META)
    with h5py.File(tmp_path / "e.h5", "w") as f:
        tk.create_datasets(f, META, 0, 0, 0)
    with pytest.raises(tk.TokenFormatError, match="no documents"):
        tk.validate_tokens(tmp_path / "e.h5")


def test_meta_rejects_an_end_id_outside_the_vocabulary() -> None:
    with pytest.raises(tk.TokenFormatError, match="end-of-document id 100"):
        tk.TokenMeta(vocab_size=100, eod_id=100, tokenizer="t", tokenizer_sha256="")


def test_tokenizer_hashes(tmp_path: Path) -> None:
    assert tk.tokenizer_sha256("bytes") == tk.bytes_tokenizer_sha256()
    p = tmp_path / "tokenizer.json"
    p.write_text("{}")
    assert tk.tokenizer_sha256(p) == tk.file_sha256(p) != tk.bytes_tokenizer_sha256()
