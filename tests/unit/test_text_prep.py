"""Text preparation on one process: document spans, the split, tokenizers, and bad input."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcdp.data.format import tokens as tk
from hpcdp.data.prep.text import corpus as tc
from hpcdp.data.prep.text import passes
from hpcdp.data.prep.text import recipe as tp
from hpcdp.data.prep.text import tokenizer as tz
from hpcdp.data.read.tokens import TokenReader, TokenReaderError


def test_line_spans() -> None:
    data = b"ab\n\ncd\r\nefg"
    spans = tc.line_spans(data, 0, 0, len(data))
    assert [data[s.start : s.stop] for s in spans] == [b"ab", b"cd", b"efg"]
    # A range starting mid-line leaves that line to the previous range.
    assert [data[s.start : s.stop] for s in tc.line_spans(data, 0, 1, len(data))] == [b"cd",
                                                                                     b"efg"]
    assert [data[s.start : s.stop] for s in tc.line_spans(data, 0, 4, 5)] == [b"cd"]


@given(st.lists(st.sampled_from([b"a", b"bb", b"\n", b"\r\n", b"xyz"]), max_size=30),
       st.lists(st.integers(0, 60), max_size=4))
def test_any_cut_of_the_bytes_gives_each_line_once(parts: list[bytes], cuts: list[int]) -> None:
    data = b"".join(parts)
    bounds = sorted({0, len(data), *(min(c, len(data)) for c in cuts)})
    pieces = [s for a, b in zip(bounds, bounds[1:]) for s in tc.line_spans(data, 0, a, b)]
    assert pieces == tc.line_spans(data, 0, 0, len(data))
    assert [data[s.start : s.stop] for s in pieces] == [
        line.rstrip(b"\r") for line in data.split(b"\n") if line.rstrip(b"\r")]


@given(st.integers(0, 500), st.floats(0.0, 0.99))
def test_validation_documents_are_evenly_spread(docs: int, fraction: float) -> None:
    val = [g for g in range(docs) if tp.is_val(g, fraction)]
    assert len(val) == int(docs * fraction)


@given(st.integers(0, 300), st.integers(1, 300), st.floats(0.0, 0.99))
def test_a_blocks_validation_mask_is_the_rule(first: int, n: int, fraction: float) -> None:
    got = passes.val_mask(first, n, fraction).tolist()
    assert got == [tp.is_val(g, fraction) for g in range(first, first + n)]
    assert tp.split_totals(first + n, fraction)["val"] == sum(
        tp.is_val(g, fraction) for g in range(first + n))


def corpus(root: Path, texts: list[str]) -> str:
    root.mkdir(exist_ok=True)
    for i, text in enumerate(texts):
        (root / f"f{i:02d}.txt").write_text(text)
    return str(root / "*.txt")


TEXTS = ["The quick brown fox.\nJumps over.\n", "Grüße aus Köln\n", "", "λόγος " * 40,
         "hello world " * 30, "one\ntwo\nthree\n"]


def read_docs(path: Path) -> list[np.ndarray]:
    with h5py.File(path) as f:
        toks, offs = f["tokens"][...], f["doc_offsets"][...]
    return [toks[a:b] for a, b in zip(offs[:-1], offs[1:])]


def test_bytes_documents_are_the_files(tmp_path: Path) -> None:
    files = corpus(tmp_path / "c", TEXTS)
    assert tp.main(["--files", files, "--out", str(tmp_path / "o"), "--val-fraction", "0.2"]) == 0
    docs = read_docs(tmp_path / "o" / "train.h5") + read_docs(tmp_path / "o" / "val.h5")
    got = sorted(bytes(d[:-1].astype(np.uint8)).decode() for d in docs)
    assert got == sorted(t for t in TEXTS if t) and all(d[-1] == 256 for d in docs)
    assert len(read_docs(tmp_path / "o" / "val.h5")) == 1  # int(5 * 0.2)
    info = tk.validate_tokens(tmp_path / "o" / "train.h5", scan=True)
    assert info.tokenizer == "bytes" and info.vocab_size == 257


def test_bpe_is_trained_saved_and_checked(tmp_path: Path) -> None:
    files = corpus(tmp_path / "c", TEXTS * 3)
    out = tmp_path / "o"
    assert tp.main(["--files", files, "--lines", "--tokenizer", "bpe", "--vocab-size", "300",
                    "--out", str(out)]) == 0
    saved = out / "tokenizer.json"
    info = tk.validate_tokens(out / "train.h5", scan=True)
    assert info.tokenizer_sha256 == tk.file_sha256(saved) and info.vocab_size <= 300
    from tokenizers import Tokenizer

    hf = Tokenizer.from_file(str(saved))
    first = read_docs(out / "train.h5")[0]
    assert first[-1] == info.eod_id == hf.token_to_id("<|endoftext|>")
    assert hf.decode(first[:-1].tolist()) == "The quick brown fox."
    # The saved tokenizer by path gives the same tokens; the reader checks the hash.
    out2 = tmp_path / "o2"
    assert tp.main(["--files", files, "--lines", "--tokenizer", str(saved),
                    "--out", str(out2)]) == 0
    np.testing.assert_array_equal(h5py.File(out2 / "train.h5")["tokens"][...],
                                  h5py.File(out / "train.h5")["tokens"][...])
    assert (out2 / "tokenizer.json").read_bytes() == saved.read_bytes()
    TokenReader(out2 / "train.h5", seq_len=8, batch_size=2,
                tokenizer_sha256=tk.tokenizer_sha256(saved))
    # Re-preparing in place with the tokenizer already there keeps it as it is.
    assert tp.main(["--files", files, "--lines", "--tokenizer", str(saved), "--out", str(out),
                    "--overwrite"]) == 0
    assert tk.validate_tokens(out / "train.h5").tokenizer_sha256 == tk.file_sha256(saved)
    with pytest.raises(TokenReaderError, match="tokens would be read with the wrong"):
        TokenReader(out2 / "train.h5", seq_len=8, batch_size=2,
                    tokenizer_sha256=tk.tokenizer_sha256("bytes"))


def test_tokenizer_without_the_end_token(tmp_path: Path, capsys) -> None:
    files = corpus(tmp_path / "c", TEXTS * 3)
    assert tp.main(["--files", files, "--tokenizer", "bpe", "--vocab-size", "280",
                    "--out", str(tmp_path / "o"), "--eod-token", "</doc>", "--val-fraction",
                    "0.2"]) == 0
    assert tp.main(["--files", files, "--tokenizer", str(tmp_path / "o" / "tokenizer.json"),
                    "--out", str(tmp_path / "o2"), "--val-fraction", "0"]) == 2
    assert "has no end-of-document token '<|endoftext|>'" in capsys.readouterr().err


def test_invalid_utf8_names_file_and_offset(tmp_path: Path, capsys) -> None:
    files = corpus(tmp_path / "c", TEXTS)
    bad = tmp_path / "c" / "f03.txt"
    bad.write_bytes("λόγος ".encode() * 3 + b"\xc3\x28 tail")
    for lines in ([], ["--lines"]):
        assert tp.main(["--files", files, "--out", str(tmp_path / "o"), "--val-fraction", "0.3",
                        *lines]) == 2
        assert f"{bad}: invalid UTF-8 at byte offset 33" in capsys.readouterr().err
    assert not (tmp_path / "o" / "train.h5").exists()


@pytest.mark.parametrize(("texts", "args", "problem"), [
    (["", ""], [], "no documents"),
    (["a", "b"], ["--val-fraction", "0.3"], "--val-fraction 0.3 of 2 documents is none"),
    (["a"], ["--tokenizer", "nothing.json"], "--tokenizer nothing.json: no such file"),
])
def test_bad_corpus(tmp_path: Path, capsys, texts: list[str], args: list[str],
                    problem: str) -> None:
    files = corpus(tmp_path / "c", texts)
    assert tp.main(["--files", files, "--out", str(tmp_path / "o"), *args]) == 2
    assert problem in capsys.readouterr().err


def test_pattern_matching_nothing(tmp_path: Path, capsys) -> None:
    assert tp.main(["--files", str(tmp_path / "none*.txt"), "--out", str(tmp_path / "o")]) == 2
    assert "matches no file" in capsys.readouterr().err


def test_existing_output_is_kept_unless_overwrite(tmp_path: Path, capsys) -> None:
    files = corpus(tmp_path / "c", TEXTS * 5)
    out = tmp_path / "o"
    assert tp.main(["--files", files, "--out", str(out)]) == 0
    before = (out / "train.h5").read_bytes()
    corpus(tmp_path / "c", ["changed text"] * 30)
    assert tp.main(["--files", files, "--out", str(out)]) == 2
    assert "train.h5, val.h5 already exist; pass --overwrite" in capsys.readouterr().err
    assert (out / "train.h5").read_bytes() == before
    assert tp.main(["--files", files, "--out", str(out), "--overwrite"]) == 0
    assert (out / "train.h5").read_bytes() != before
    params = json.loads(h5py.File(out / "train.h5").attrs["source_params"])
    assert params["tokenizer"] == "bytes" and not params["lines"]


def test_the_bpe_sample_is_bounded_and_only_training_documents(tmp_path: Path) -> None:
    from hpcdp.data.prep.world import SerialComm
    from hpcdp.data.synth import corpus as corpus_synth

    corpus_synth.make_corpus(str(tmp_path / "c"), 200_000, files=2)
    corpus = tc.Corpus(tc.expand_files([str(tmp_path / "c" / "*")]), lines=False)
    blocks = corpus.blocks(20_000)
    every = [t for b in blocks for t in corpus.texts(b)]
    train = {t for g, t in enumerate(every) if not tp.is_val(g, 0.5)}
    sample, error = passes.sample_for_bpe(corpus, blocks, range(len(blocks)), 0.5, 20_000,
                                          SerialComm())
    assert error is None and sample and set(sample) <= train
    assert 5_000 < sum(len(t.encode()) for t in sample) <= 20_000 + max(map(len, every)) * 4
    whole, _ = passes.sample_for_bpe(corpus, blocks, range(len(blocks)), 0.5, 10**9,
                                     SerialComm())
    assert whole == [t for g, t in enumerate(every) if not tp.is_val(g, 0.5)]


@given(st.lists(st.tuples(st.integers(1, 40), st.booleans()), max_size=60),
       st.integers(1, 70), st.integers(0, 70), st.booleans())
def test_a_splits_tokens_are_gathered_slice_by_slice(docs, a, width, last) -> None:
    from hpcdp.data.prep.text import writer as tw

    lengths = np.array([n for n, _ in docs], np.int64)
    keep = np.array([k for _, k in docs], bool)
    tokens = np.arange(int(lengths.sum()), dtype=np.uint16)
    kept = tw._Kept(lengths, keep, np.zeros(len(docs), np.uint16), last)
    want = tokens[np.repeat(keep, lengths)]
    a = min(a, len(want))
    b = min(len(want), a + width)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tw, "GATHER_TOKENS", 7)  # several gathers a slice, cut anywhere
        assert kept.gather(tokens, a, b).tolist() == want[a:b].tolist()
    starts = np.cumsum(lengths[keep]) - lengths[keep]
    assert kept.offsets.tolist() == [*starts.tolist(), *([len(want)] if last else [])]


def test_the_tokenizer_library_gets_the_ranks_share_of_threads() -> None:
    env = {"OMP_NUM_THREADS": "3"}
    assert tz.library_threads(env) == "3"
    assert tz.library_threads({**env, "RAYON_NUM_THREADS": "8"}) is None  # exported: kept
    assert tz.library_threads({}) is None
    assert tz.library_threads({"OMP_NUM_THREADS": "x"}) is None
    assert tz.share_threads(env) and env["RAYON_NUM_THREADS"] == "3"
    assert not tz.share_threads(env)  # now there: as if exported
    # The trainer's child gets every CPU unless the share was exported.
    assert "RAYON_NUM_THREADS" not in tz.trainer_env(env, every_cpu=True)
    assert tz.trainer_env(env, every_cpu=False)["RAYON_NUM_THREADS"] == "3"


#: Encodes a batch after `share_threads` (unless argv[1] is "default") and prints the
#: number of threads the process then has.
THREADS_CHILD = """
import os, sys
from hpcdp.data.prep.text import tokenizer as tz
if sys.argv[1] != "default":
    tz.share_threads(os.environ)
tok = tz.train_bpe(["some words to learn from"] * 50, 300)
tok.encode_flat(["a document of words"] * 4096)
print(len(os.listdir("/proc/self/task")))
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to tell apart")
def test_the_library_starts_only_the_shared_threads() -> None:
    def threads(role: str) -> int:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        env.pop("RAYON_NUM_THREADS", None)
        done = subprocess.run([sys.executable, "-c", THREADS_CHILD, role], env=env,
                              capture_output=True, text=True, timeout=60, check=True)
        return int(done.stdout)

    assert threads("share") < threads("default")


def test_a_bpe_trained_apart_is_the_bpe_trained_here() -> None:
    texts = [f"document {i}: some words,\nwith lines and \u00e9t\u00e9 {i % 7}" for i in range(300)]
    here = tz.train_bpe(texts, 300)
    apart = tz.train_bpe_apart(texts, 300)
    assert apart.json == here.json and apart.sha256 == here.sha256
    with pytest.raises(tz.TokenizerError, match="--vocab-size 5: a byte-level BPE needs"):
        tz.train_bpe_apart(texts, 5)


def test_a_long_document_is_encoded_in_pieces_to_the_same_ids(monkeypatch) -> None:
    source = (Path(tz.__file__).read_text() + Path(tc.__file__).read_text()) * 3
    tok = tz.train_bpe([source[i : i + 2000] for i in range(0, len(source), 2000)], 400)
    assert tok.cuts_at_lines  # the BPE trained here may be cut at lines
    odd = "a \u00a0b\x1c c\t\td\r\n e 's\n\n 12 (x)\u3000y z\n\n"
    docs = [source, "short one", source[: len(source) // 2] + odd * 400, odd * 900]
    monkeypatch.setattr(tz, "ENCODE_CHARS", 3000)
    assert len(tz.pieces(source, 3000)) > 10
    assert "".join(tz.pieces(source, 3000)) == source
    cut_tokens, cut_lengths = tok.encode_flat(docs)
    whole = dataclasses.replace(tok, cuts_at_lines=False)
    tokens, lengths = whole.encode_flat(docs)
    assert lengths.tolist() == cut_lengths.tolist()
    assert tokens.tolist() == cut_tokens.tolist()
    config = json.loads(tok.json)
    assert not tz.cuts_at_lines({**config, "normalizer": {"type": "NFC"}})
    assert not tz.cuts_at_lines({**config, "pre_tokenizer": {"type": "Metaspace"}})
    assert not tz.cuts_at_lines({**config, "added_tokens": [{"content": "a\nb"}]})
    assert not tz.cuts_at_lines({**config, "pre_tokenizer": {
        **config["pre_tokenizer"], "add_prefix_space": True}})


def test_a_part_without_its_documents_largest_ids_is_still_written(tmp_path: Path) -> None:
    from hpcdp.data.prep.parts import Parts
    from hpcdp.data.prep.text import writer as tw
    from hpcdp.data.prep.world import SerialComm

    parts = Parts(str(tmp_path / "o"), "text", {}, SerialComm(), resume=False)
    tokens = np.array([5, 9, 256, 7, 256, 3, 3, 4, 256], np.uint16)
    lengths = np.array([3, 2, 4], np.int64)
    parts.save(passes.DOCS, 0, tokens=tokens, lengths=lengths)  # no "tops": an older part
    meta = tk.TokenMeta(257, 256, "bytes", "0" * 64, "train", "text", {})
    keep_first_last = lambda first, n: np.array([True, False, True])  # noqa: E731
    path = tw.write_split_parts(str(tmp_path / "o"), "train", parts, range(1),
                                np.zeros(1, np.int64), keep_first_last, meta, SerialComm())
    with h5py.File(path) as f:
        assert f["tokens"][:].tolist() == [5, 9, 256, 3, 3, 4, 256]
        assert f[tk.DOC_OFFSETS][:].tolist() == [0, 3, 7]
        assert int(f.attrs["max_token_id"]) == 256
