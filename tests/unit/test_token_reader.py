"""The token-window reader: the global order on any world size, content, resume, bad input.

Token i of the test files is i itself (uint32), so a window names its index
(its first token / S) and its content can be checked exactly.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcdp.data.format import tokens as tk
from hpcdp.data.read.tokens import (
    TokenReader,
    TokenReaderError,
    eval_share,
    reference_order,
)


def make_file(path: Path, num_tokens: int, doc_len: int = 37, chunk: int | None = None) -> Path:
    """Tokens 0..n-1 (vocabulary 2**20, uint32); every doc_len-th token is a document end."""
    vocab = 1 << 20
    meta = tk.TokenMeta(vocab_size=vocab, eod_id=vocab - 1, tokenizer="ids",
                        tokenizer_sha256="00" * 32)
    tokens = np.arange(num_tokens, dtype=np.uint32)
    ends = np.arange(doc_len, num_tokens + doc_len, doc_len).clip(max=num_tokens)
    offsets = np.concatenate(([0], np.unique(ends))).astype(np.int64)
    with h5py.File(path, "w") as f:
        t, o = tk.create_datasets(f, meta, num_tokens, len(offsets) - 1, num_tokens - 1)
        if chunk is not None:  # a different chunk: recreate the dataset
            del f[tk.TOKENS]
            t = f.create_dataset(tk.TOKENS, shape=(num_tokens,), dtype=np.uint32,
                                 chunks=(chunk,))
        t[:] = tokens
        o[:] = offsets
    return path


def read_all(readers: list[TokenReader], steps: int | None = None) -> np.ndarray:
    """Window indices per global step, ranks' batches side by side; checks content."""
    out = []
    for batches in zip(*readers):
        row = []
        for x, y in batches:
            assert x.dtype == y.dtype == np.int64 or str(x.dtype) == "torch.int64"
            xs, ys = x.numpy(), y.numpy()
            s = readers[0].seq_len
            assert xs.shape == ys.shape == (readers[0].batch_size, s)
            np.testing.assert_array_equal(ys[:, :-1], xs[:, 1:])
            np.testing.assert_array_equal(ys[:, -1], xs[:, -1] + 1)
            np.testing.assert_array_equal(xs - xs[:, :1], np.arange(s)[None].repeat(len(xs), 0))
            assert np.all(xs[:, 0] % s == 0)
            row.append(xs[:, 0] // s)
        out.append(np.concatenate(row))
        if steps is not None and len(out) == steps:
            break
    return np.array(out).reshape(len(out), -1)


def readers_for(path: Path, world: int, global_batch: int, **kw: object) -> list[TokenReader]:
    return [TokenReader(path, batch_size=global_batch // world, rank=r, world_size=world, **kw)
            for r in range(world)]


@pytest.mark.slow
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tokens=st.integers(200, 3000), seq=st.integers(1, 40), world=st.sampled_from([1, 2, 3, 4]),
       per_rank=st.integers(1, 4), window=st.integers(1, 30), seed=st.integers(0, 5),
       epoch=st.integers(0, 3), prefetch=st.sampled_from([0, 2]))
def test_any_world_size_reads_the_global_order(tmp_path: Path, tokens: int, seq: int, world: int,
                                               per_rank: int, window: int, seed: int,
                                               epoch: int, prefetch: int) -> None:
    g = world * per_rank
    if tk.num_windows(tokens, seq) < g:
        return
    path = tmp_path / f"t{tokens}.h5"
    if not path.exists():
        make_file(path, tokens)
    rs = readers_for(path, world, g, seq_len=seq, seed=seed, window_samples=window,
                     virtual_shards=g, prefetch=prefetch)
    for r in rs:
        r.set_epoch(epoch)
    assert len({len(r) for r in rs}) == 1
    got = read_all(rs)
    ref = reference_order(rs[0])
    np.testing.assert_array_equal(got, ref)
    # The same order as one rank reading everything.
    one = TokenReader(path, batch_size=g, seq_len=seq, seed=seed, window_samples=window,
                      virtual_shards=g, prefetch=prefetch)
    one.set_epoch(epoch)
    np.testing.assert_array_equal(read_all([one]), got)
    n = tk.num_windows(tokens, seq)
    assert len(np.unique(got)) == got.size == n // g * g


def test_epochs_differ_and_cover_every_window_once(tmp_path: Path) -> None:
    path = make_file(tmp_path / "t.h5", 5000)
    r = TokenReader(path, seq_len=16, batch_size=8, window_samples=20)
    r.set_epoch(0)
    a = read_all([r])
    r.set_epoch(1)
    b = read_all([r])
    assert len(a) == r.steps_per_epoch == 4999 // 16 // 8
    assert not np.array_equal(a, b)
    assert len(np.unique(a)) == a.size and len(np.unique(b)) == b.size


@pytest.mark.parametrize(("first_world", "second_world"), [(4, 2), (1, 3), (2, 2)])
def test_resume_mid_epoch_in_another_world_size(tmp_path: Path, first_world: int,
                                                second_world: int) -> None:
    path = make_file(tmp_path / "t.h5", 6000)
    kw = {"seq_len": 10, "seed": 3, "window_samples": 25}
    first = readers_for(path, first_world, 12, virtual_shards=12, **kw)
    for r in first:
        r.set_epoch(2)
    a = read_all(first, steps=7)
    state = first[0].state_dict()
    assert state["position"] == 7 and state["seq_len"] == 10
    # Resume with another world size and a larger global batch: no repeat, no skip.
    second = readers_for(path, second_world, 24 if second_world != 3 else 36, **kw)
    for r in second:
        r.load_state_dict(state)
        r.set_epoch(2)
    b = read_all(second)
    np.testing.assert_array_equal(b, reference_order(second[0], position=7))
    seen = np.concatenate([a.ravel(), b.ravel()])
    assert len(np.unique(seen)) == len(seen)
    assert 5999 // 10 // 12 * 12 - len(seen) < second[0].global_batch


def test_state_for_another_sequence_length_is_refused(tmp_path: Path) -> None:
    path = make_file(tmp_path / "t.h5", 3000)
    state = TokenReader(path, seq_len=10, batch_size=4).state_dict()
    other = TokenReader(path, seq_len=12, batch_size=4)
    with pytest.raises(TokenReaderError, match="sequence length 10, this reader has 12"):
        other.load_state_dict(state)
    del state["position"]
    with pytest.raises(TokenReaderError, match="lacks position"):
        TokenReader(path, seq_len=10, batch_size=4).load_state_dict(state)


def test_state_checks_are_the_sample_readers_in_windows(tmp_path: Path) -> None:
    """The resume checks shared with ShardedReader (hpcdp.data.read.epochs) speak of windows."""
    path = make_file(tmp_path / "t.h5", 3000)
    other = make_file(tmp_path / "u.h5", 2000)
    state = TokenReader(path, seq_len=10, batch_size=4).state_dict()
    with pytest.raises(TokenReaderError, match=f"^{other}: the reader state is for 299 windows"):
        TokenReader(other, seq_len=10, batch_size=4).load_state_dict(state)
    old = {**state, "order": 1, "position": 1}
    with pytest.raises(TokenReaderError, match="under window order version 1, but this hpcdp "
                       "orders windows by version"):
        TokenReader(path, seq_len=10, batch_size=4).load_state_dict(old)
    with pytest.raises(TokenReaderError, match="at least 1, got -3"):
        TokenReader(path, seq_len=10, batch_size=4, window_samples=-3)


def test_memory_is_a_window_per_stream_not_the_file(tmp_path: Path, monkeypatch) -> None:
    path = make_file(tmp_path / "t.h5", 1_000_000, chunk=4096)
    r = TokenReader(path, seq_len=64, batch_size=4, virtual_shards=4, window_samples=128)
    assert r.block == 64 and r.window == 128
    assert r.window_bytes == 4 * 128 * 65 * 4 < 1_000_000 * 4 // 10
    sizes = []
    orig = np.empty

    def spy(shape, dtype=float, **kw):  # type: ignore[no-untyped-def]
        if isinstance(shape, tuple) and len(shape) == 2 and shape[1] == 65:
            sizes.append(shape[0])
        return orig(shape, dtype, **kw)

    monkeypatch.setattr(np, "empty", spy)
    r.prefetch = 0
    r.set_epoch(0)
    read_all([r], steps=100)
    monkeypatch.undo()
    assert sizes and max(sizes) <= 128


def test_contiguous_reads(tmp_path: Path) -> None:
    """Each HDF5 read is one slice of consecutive windows, whole blocks where it can be."""
    path = make_file(tmp_path / "t.h5", 50_000, chunk=1000)
    r = TokenReader(path, seq_len=50, batch_size=4, virtual_shards=1, window_samples=60,
                    prefetch=0)
    reads: list[tuple[int, int]] = []
    real = r._tokens

    class Spy:
        def __init__(self, d):  # type: ignore[no-untyped-def]
            self.d = d

        def __getitem__(self, s):  # type: ignore[no-untyped-def]
            reads.append((s.start, s.stop))
            return self.d[s]

    r._tokens = lambda: Spy(real())  # type: ignore[method-assign]
    r.set_epoch(0)
    read_all([r])
    assert all((b - a - 1) % 50 == 0 for a, b in reads)
    # Blocks of 20 windows = 1000 tokens: a 60-window window is 3-4 slices, not 60.
    assert len(reads) <= 2 * (999 // 60 + 1) * 2


def test_bad_inputs(tmp_path: Path, monkeypatch) -> None:
    path = make_file(tmp_path / "t.h5", 1000)
    with pytest.raises(TokenReaderError, match="fewer than one global batch of 200"):
        TokenReader(path, seq_len=10, batch_size=100, world_size=2)
    with pytest.raises(TokenReaderError, match="sequence length 1000 is longer than the data"):
        TokenReader(path, seq_len=1000, batch_size=1)
    with pytest.raises(TokenReaderError, match="tokenizer has sha256"):
        TokenReader(path, seq_len=10, batch_size=1, tokenizer_sha256="11" * 32)
    with h5py.File(path, "r+") as f:
        f["tokens"][500] = (1 << 20) + 5
    with pytest.raises(TokenReaderError, match=f"{path}: token id 1048581 at position 500"):
        TokenReader(path, seq_len=10, batch_size=4)
    # In a large file the validator checks only the ends; the reads check the rest.
    monkeypatch.setattr(tk, "EDGE_TOKENS", 100)
    r = TokenReader(path, seq_len=10, batch_size=4, prefetch=2)
    with pytest.raises(TokenReaderError, match=f"{path}: token id 1048581 at position 500"):
        read_all([r])


def test_pickles_without_its_file(tmp_path: Path) -> None:
    path = make_file(tmp_path / "t.h5", 2000)
    r = TokenReader(path, seq_len=10, batch_size=4)
    r.set_epoch(1)
    a = read_all([r], steps=3)
    r2 = pickle.loads(pickle.dumps(r))
    r2.set_epoch(1)
    np.testing.assert_array_equal(read_all([r2], steps=3), a)
    r.close()
    r2.close()


@given(st.integers(0, 500), st.integers(1, 9))
def test_eval_shares_cover_every_window_once(windows: int, world: int) -> None:
    shares = [eval_share(windows, r, world) for r in range(world)]
    assert shares[0][0] == 0 and shares[-1][1] == windows
    assert all(a[1] == b[0] for a, b in zip(shares, shares[1:]))
    sizes = [hi - lo for lo, hi in shares]
    assert max(sizes) - min(sizes) <= 1


def test_eval_batches_score_every_window_once_on_any_world_size(tmp_path: Path) -> None:
    path = make_file(tmp_path / "t.h5", 1001)  # 100 windows of S=10
    for world in (1, 3, 7):
        seen = []
        for rank in range(world):
            r = TokenReader(path, seq_len=10, batch_size=4, rank=rank, world_size=world)
            for x, y in r.eval_batches():
                assert 1 <= len(x) <= 4 and x.shape[1] == 10
                np.testing.assert_array_equal(y.numpy()[:, :-1], x.numpy()[:, 1:])
                seen += list(x.numpy()[:, 0] // 10)
        assert seen == list(range(100))
