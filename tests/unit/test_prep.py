"""Dataset preparation on one process: layout math, sources, files, failures."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcdp.data.format.samples import chunk_rows
from hpcdp.data.prep import arrays as src
from hpcdp.data.prep import cli as prep
from hpcdp.data.prep.blocks import items_per_block, plan_items, rank_blocks
from hpcdp.data.prep.merge import _slabs
from hpcdp.data.read.samples import ShardedReader


class _Rows:
    """The parts `merge.write_parts` reads, held in memory: block i holds its rows' numbers."""

    def __init__(self, blocks: list[range]) -> None:
        self.blocks = blocks

    def lengths(self, split: str, i: int) -> dict[str, int]:
        return {"x": len(self.blocks[i])}

    def load(self, split: str, i: int) -> dict[str, np.ndarray]:
        return {"x": np.arange(self.blocks[i].start, self.blocks[i].stop)}


def _sample_blocks(n: int, chunk: int, chunks_a_block: int) -> list[range]:
    """How the sample recipes cut their rows (`samples.splits`): blocks of whole chunks."""
    return plan_items(n, items_per_block(1, chunks_a_block * chunk, n, unit=chunk))


@given(n=st.integers(1, 5000), chunk=st.integers(1, 300), size=st.integers(1, 9),
       chunks_a_block=st.integers(1, 5))
def test_rank_rows_cover_every_row_once_in_whole_chunks(n: int, chunk: int, size: int,
                                                        chunks_a_block: int) -> None:
    blocks = _sample_blocks(n, chunk, chunks_a_block)
    mine = [rank_blocks(len(blocks), r, size) for r in range(size)]
    spans = [(blocks[m.start].start, blocks[m.stop - 1].stop) if m else None for m in mine]
    spans = [s for s in spans if s is not None]  # a rank without blocks writes no rows
    assert spans[0][0] == 0 and spans[-1][1] == n
    for (_, hi), (lo, _) in zip(spans, spans[1:]):
        assert hi == lo
    assert all(lo % chunk == 0 and lo <= hi for lo, hi in spans)
    assert all(b.start % chunk == 0 for b in blocks)  # no two ranks write into one chunk
    slab = chunk * 3
    rounds = max(len(list(_slabs(_Rows(blocks), "train", m, slab))) for m in mine)
    assert rounds == max(sum(-(-len(blocks[i]) // slab) for i in m) for m in mine)


@given(n=st.integers(1, 5000), chunk=st.integers(1, 300), size=st.integers(1, 9),
       chunks_a_block=st.integers(1, 5))
def test_rank_slabs_are_the_rank_rows_in_slabs_of_whole_chunks(n: int, chunk: int, size: int,
                                                               chunks_a_block: int) -> None:
    slab = chunk * 2
    blocks = _sample_blocks(n, chunk, chunks_a_block)
    for r in range(size):
        mine = rank_blocks(len(blocks), r, size)
        read = [got() for got in _slabs(_Rows(blocks), "train", mine, slab)]
        rows = [int(i) for _, _, data in read for i in data["x"]]
        assert rows == [i for b in mine for i in blocks[b]]
        assert all(len(data["x"]) <= slab and a % chunk == 0 for _, a, data in read)


def test_chunks_are_about_one_mib_along_the_sample_axis() -> None:
    assert chunk_rows(3 * 32 * 32, 50_000) * 3072 in range(1 << 20, (1 << 20) + 3072)
    assert chunk_rows(3 * 224 * 224, 10_000) == 7  # 1.05 MiB
    assert chunk_rows(64, 1437) == 23  # small data: at least 64 chunks to shuffle


def test_synthetic_rows_do_not_depend_on_slab_boundaries() -> None:
    (s,) = src.synthetic(3000, (3, 8, 8), "uint8", 10, seed=4)
    s.gen_rows = 700  # several generation blocks
    x, y = s.slab(0, 3000)
    parts = [s.slab(a, min(3000, a + 333)) for a in range(0, 3000, 333)]
    np.testing.assert_array_equal(np.concatenate([p[0] for p in parts]), x)
    np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]), y)
    assert y is not None and set(np.unique(y)) == set(range(10))
    # The class pattern is learnable: class means differ clearly.
    means = [x[y == c].astype(float).mean(axis=0) for c in range(2)]
    assert np.abs(means[0] - means[1]).mean() > 20


def test_synthetic_prep_file_schema_and_tools(tmp_path: Path) -> None:
    out = tmp_path / "syn"
    report = tmp_path / "r.json"
    assert prep.main(["synthetic", "--samples", "500", "--shape", "3,8,8", "--out", str(out),
                      "--val-samples", "64", "--seed", "2", "--report", str(report)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["train.h5", "val.h5"]
    with h5py.File(out / "train.h5", "r") as f:
        assert f["x"].shape == (500, 3, 8, 8) and f["x"].dtype == np.uint8
        assert f["y"].dtype == np.int64 and f["x"].chunks[0] == chunk_rows(192, 500)
        schema = json.loads(f.attrs["schema"])
        assert schema["x"] == {"shape": [500, 3, 8, 8], "dtype": "uint8"}
        assert (f.attrs["num_samples"], f.attrs["source"], f.attrs["seed"]) == (500, "synthetic", 2)
        assert f.attrs["hpcdp_version"]
    assert json.loads(report.read_text())["samples"] == 564
    for tool in ("h5ls", "h5dump"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed")
    assert "Dataset {500, 3, 8, 8}" in subprocess.run(
        ["h5ls", "-r", str(out / "train.h5")], capture_output=True, text=True, check=True).stdout
    dump = subprocess.run(["h5dump", "-H", "-A", str(out / "val.h5")], capture_output=True,
                          text=True, check=True).stdout
    assert "num_samples" in dump and "H5T_STD_U8LE" in dump


def test_digits_train_and_val_read_back(tmp_path: Path) -> None:
    assert prep.main(["digits", "--out", str(tmp_path)]) == 0
    with h5py.File(tmp_path / "train.h5") as tr, h5py.File(tmp_path / "val.h5") as va:
        assert tr["x"].shape[1:] == (1, 8, 8) and tr["x"].dtype == np.uint8
        assert tr["x"].shape[0] + va["x"].shape[0] == 1797
        assert va["x"].shape[0] == round(1797 * 0.2)
        assert int(tr["x"][:].max()) == 255 and set(np.unique(tr["y"][:])) == set(range(10))
    with ShardedReader(tmp_path / "train.h5", batch_size=32) as r:
        x, y = next(iter(r))
        assert x.shape == (32, 1, 8, 8)


def test_arrays_npy_and_npz_memory_mapped(tmp_path: Path) -> None:
    x = np.random.default_rng(0).random((300, 5)).astype(np.float32)
    y = np.arange(300) % 7
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    np.savez(tmp_path / "xy.npz", data=x, labels=y)
    (s,) = src.arrays(str(tmp_path / "x.npy"), str(tmp_path / "y.npy"))
    assert isinstance(s._x, np.memmap)
    (z,) = src.arrays(str(tmp_path / "xy.npz"), None, "data", "labels")
    assert isinstance(z._x, np.memmap)
    np.testing.assert_array_equal(z.slab(10, 20)[0], x[10:20])
    np.testing.assert_array_equal(z.slab(10, 20)[1], y[10:20])
    out = tmp_path / "out"
    assert prep.main(["arrays", "--x", str(tmp_path / "xy.npz"), "--x-key", "data",
                      "--y-key", "labels", "--out", str(out), "--split", "mine"]) == 0
    with h5py.File(out / "mine.h5") as f:
        np.testing.assert_array_equal(f["x"][:], x)
        np.testing.assert_array_equal(f["y"][:], y)


def test_compression_writes_filtered_chunks(tmp_path: Path) -> None:
    assert prep.main(["synthetic", "--samples", "300", "--shape", "16", "--out", str(tmp_path),
                      "--compression", "lzf", "--x-name", "data", "--y-name", "label"]) == 0
    with h5py.File(tmp_path / "train.h5") as f:
        assert f["data"].compression == "lzf" and f["label"].compression == "lzf"


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["arrays", "--x", "{d}/x.npy", "--y", "{d}/short.npy"], "has 300 samples but .* 299"),
        (["arrays", "--x", "{d}/nope.npy"], "nope.npy: no such file"),
        (["arrays", "--x", "{d}/c.npz"], "compressed and cannot be memory-mapped"),
        (["arrays", "--x", "{d}/junk.npy"], "junk.npy: not a .npy file"),
        (["arrays", "--x", "{d}/empty.npy"], "empty.npy: the data array is empty"),
        (["synthetic", "--samples", "10", "--shape", "3,0"], "--shape '3,0'"),
        (["synthetic", "--samples", "10", "--dtype", "object"], "--dtype 'object'"),
    ],
)
def test_bad_input_fails_clearly_and_keeps_the_old_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], problem: str
) -> None:
    np.save(tmp_path / "x.npy", np.zeros((300, 2)))
    np.save(tmp_path / "short.npy", np.zeros(299, np.int64))
    np.save(tmp_path / "empty.npy", np.zeros((0, 2)))
    np.savez_compressed(tmp_path / "c.npz", x=np.zeros((10, 2)))
    (tmp_path / "junk.npy").write_bytes(b"not numpy at all")
    out = tmp_path / "out"
    out.mkdir()
    (out / "train.h5").write_bytes(b"previous good file")
    argv = [a.format(d=tmp_path) for a in args] + ["--out", str(out)]
    assert prep.main(argv) == 2
    err = capsys.readouterr().err
    assert "hpcdp prep: error:" in err
    assert re.search(problem, err), err
    assert (out / "train.h5").read_bytes() == b"previous good file"
    assert [p.name for p in out.iterdir()] == ["train.h5"]


def test_failure_while_writing_leaves_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "train.h5").write_bytes(b"previous good file")

    def broken(self: src.Synthetic, start: int, stop: int) -> None:
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(src.Synthetic, "slab", broken)
    argv = ["synthetic", "--samples", "100", "--out", str(out), "--overwrite"]
    assert prep.main(argv) == 1
    assert (out / "train.h5").read_bytes() == b"previous good file"
    # no temporary left behind; the work folder stays for --resume, and says so
    assert sorted(p.name for p in out.iterdir()) == [".hpcdp-prep", "train.h5"]
    monkeypatch.undo()
    assert prep.main(argv) == 2
    assert "partial preparation is there" in capsys.readouterr().err
    assert prep.main([*argv, "--resume"]) == 0
    assert [p.name for p in out.iterdir()] == ["train.h5"]
