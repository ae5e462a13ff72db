"""Token data on 2 real MPI ranks: preparation writes the same files as 1 rank, the reader's
union over ranks is the 1-rank order, and bad input fails on every rank."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from h5_files import assert_same_h5

from hpcdp.data.format import tokens as tk
from hpcdp.data.prep.text import markov_recipe as markov_prep
from hpcdp.data.prep.text import recipe as text_prep
from hpcdp.data.read.tokens import TokenReader

pytestmark = pytest.mark.parallel

REPO = Path(__file__).resolve().parents[2]
TEXT = [sys.executable, str(REPO / "datasets" / "text.py")]
MARKOV = [sys.executable, str(REPO / "datasets" / "markov.py")]


def same_files(a: Path, b: Path) -> None:
    with h5py.File(a, "r") as fa:
        assert set(fa) == {"tokens", "doc_offsets"}
    assert_same_h5(a, b)


def write_corpus(root: Path) -> Path:
    """Files of unequal sizes, UTF-8 beyond ASCII, blank lines, CRLF line ends."""
    root.mkdir()
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "Grüße", "naïve", "日本", "x"]
    for i in range(7):
        count = rng.integers(1, 40)
        lines = [" ".join(rng.choice(words, rng.integers(1, 12))) for _ in range(count)]
        if i == 3:
            lines.insert(2, "")
        (root / f"doc{i}.txt").write_text(("\r\n" if i == 5 else "\n").join(lines) + "\n")
    return root


@pytest.mark.parametrize(("lines", "tokenizer"), [(False, "bytes"), (True, "bytes"),
                                                  (True, "bpe")])
def test_text_on_two_ranks_writes_what_one_rank_writes(ranks, tmp_path: Path, lines: bool,
                                                       tokenizer: str) -> None:
    corpus = write_corpus(tmp_path / "corpus")
    args = ["--files", str(corpus / "*.txt"), "--val-fraction", "0.2", "--tokenizer", tokenizer,
            "--vocab-size", "300"]
    args += ["--lines"] if lines else []
    assert text_prep.main([*args, "--out", str(tmp_path / "one")]) == 0
    run = ranks(TEXT, *args, "--out", str(tmp_path / "two"), np=2, timeout=120)
    assert "on 2 rank(s)" in run.output
    for split in ("train.h5", "val.h5"):
        same_files(tmp_path / "one" / split, tmp_path / "two" / split)
    if tokenizer == "bpe":  # rank 0 trains it on the same documents either way
        one, two = (tmp_path / d / "tokenizer.json" for d in ("one", "two"))
        assert one.read_bytes() == two.read_bytes()
        return
    # Byte-level: the documents are the files' bytes (lines: without their line end).
    with h5py.File(tmp_path / "two" / "train.h5") as f:
        toks, offs = f["tokens"][...], f["doc_offsets"][...]
        first = bytes(toks[offs[0] : offs[1] - 1].astype(np.uint8)).decode()
        assert toks[offs[1] - 1] == 256
    text = (corpus / "doc0.txt").read_text()
    assert first == (text.split("\n")[0] if lines else text)


def test_markov_on_two_ranks_writes_what_one_rank_writes(ranks, tmp_path: Path) -> None:
    args = ["--docs", "3000", "--val-docs", "500", "--symbols", "16", "--seed", "2"]
    assert markov_prep.main([*args, "--out", str(tmp_path / "one")]) == 0
    ranks(MARKOV, *args, "--out", str(tmp_path / "two"), np=2, timeout=120)
    for split in ("train.h5", "val.h5"):
        same_files(tmp_path / "one" / split, tmp_path / "two" / split)
    info = tk.validate_tokens(tmp_path / "two" / "train.h5", scan=True)
    assert info.num_documents == 3000 and info.vocab_size == 17
    assert 0 < info.attrs["entropy_rate_nats"] < np.log(17)


def ids_file(path: Path, n: int) -> Path:
    meta = tk.TokenMeta(vocab_size=1 << 20, eod_id=(1 << 20) - 1, tokenizer="ids",
                        tokenizer_sha256="00" * 32)
    tk.write_tokens(path, [np.arange(n, dtype=np.uint32)], meta)
    return path


def test_two_ranks_read_the_one_rank_order_and_resume_on_one(ranks, tmp_path: Path) -> None:
    path = ids_file(tmp_path / "ids.h5", 20_000)
    one = TokenReader(path, seq_len=16, batch_size=24, seed=5)
    one.set_epoch(1)
    ref = np.stack([x[:, 0].numpy() // 16 for x, _ in one])
    out = str(tmp_path / "two")
    ranks("token_reader", str(path), "--seed", "5", "--epoch", "1", "--out", out,
          np=2, timeout=120)
    got = np.load(out + ".npz")["windows"]
    np.testing.assert_array_equal(got, ref)
    # Stop 2 ranks mid-epoch, resume the rest on 1 rank: together, the 1-rank order.
    ranks("token_reader", str(path), "--seed", "5", "--epoch", "1", "--steps", "9",
          "--out", out, np=2, timeout=120)
    state = json.loads(Path(out + ".state.json").read_text())
    assert state["position"] == 9 * 24 // one.virtual_shards
    rest = TokenReader(path, seq_len=16, batch_size=24)
    rest.load_state_dict(state)
    rest.set_epoch(1)
    tail = np.stack([x[:, 0].numpy() // 16 for x, _ in rest])
    np.testing.assert_array_equal(np.concatenate([np.load(out + ".npz")["windows"], tail]), ref)


@pytest.mark.parametrize("kind", ["utf8", "exists", "few"])
def test_bad_input_every_rank_reports_and_exits(ranks, tmp_path: Path, kind: str) -> None:
    corpus = write_corpus(tmp_path / "corpus")
    out = tmp_path / "out"
    if kind == "utf8":
        (corpus / "doc4.txt").write_bytes(b"fine text\n" * 30 + b"bad \xff byte\n")
        cmd, args, problem = TEXT, ["--files", str(corpus / "*.txt"), "--val-fraction", "0.3"], (
            f"{corpus / 'doc4.txt'}: invalid UTF-8 at byte offset 304")
    elif kind == "exists":
        out.mkdir()
        (out / "val.h5").write_bytes(b"precious")
        cmd, args, problem = MARKOV, [], "val.h5 already exist; pass --overwrite"
    else:
        path = ids_file(tmp_path / "ids.h5", 100)
        run = ranks("token_reader", str(path), "--out", str(tmp_path / "x"), np=2,
                    timeout=90, expect_ok=False)
        assert not run.timed_out and run.returncode != 0, run.describe()
        assert run.output.count("fewer than one global batch of 24") == 2, run.describe()
        return
    run = ranks(cmd, *args, "--out", str(out), np=2, timeout=90, expect_ok=False)
    assert not run.timed_out and run.returncode != 0, run.describe()
    for rank in (0, 1):
        assert f"[rank {rank}] " in run.output, run.describe()
    assert run.output.count(problem) == 2, run.describe()
    if kind == "exists":
        assert (out / "val.h5").read_bytes() == b"precious" and not (out / "train.h5").exists()
    else:
        assert not out.exists() or not any(out.iterdir())
