"""The npz recipe on one process: every kind of shard read as NumPy reads it, and bad input
(a missing file, lengths that differ, an object array) refused with exit 2, naming the file,
nothing unpickled and nothing written."""

from __future__ import annotations

import pickle
import re
import zipfile
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcdp.data.prep import cli as prep


def test_the_shards_follow_one_another_as_numpy_reads_them(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((500, 7)).astype(np.float32)
    y = rng.integers(0, 4, 500)
    np.savez_compressed(tmp_path / "b.npz", x=x[:200], y=y[:200])
    np.savez(tmp_path / "c.npz", x=x[200:450], y=y[200:450].astype(np.uint8))
    (tmp_path / "a").mkdir()
    np.save(tmp_path / "a" / "x.npy", x[450:])
    np.save(tmp_path / "a" / "y.npy", y[450:])
    argv = ["npz", "--files", str(tmp_path / "*.npz"), str(tmp_path / "a"), "--block-mib",
            "0.001", "--out", str(tmp_path / "out")]
    assert prep.main(argv) == 0
    with h5py.File(tmp_path / "out" / "train.h5") as f:
        np.testing.assert_array_equal(f["x"][()], x)  # b, c (sorted), then the folder
        np.testing.assert_array_equal(f["y"][()], y)
        assert f["y"].dtype == np.int64 and f.attrs["num_samples"] == 500


def _missing(d: Path) -> tuple[list[str], str]:
    np.savez(d / "a.npz", x=np.zeros((4, 2)), y=np.zeros(4, int))
    return [str(d / "a.npz"), str(d / "b.npz")], f"--files {d / 'b.npz'}: no such file"


def _lengths(d: Path) -> tuple[list[str], str]:
    np.savez_compressed(d / "a.npz", x=np.zeros((4, 2)), y=np.zeros(3, int))
    return [str(d / "a.npz")], f"{d / 'a.npz'}: 'x' has 4 samples but {d / 'a.npz'}: 'y' has 3"


class Planted:
    """An object whose unpickling writes the file `ran` beside the inputs."""

    def __init__(self, ran: Path) -> None:
        self.ran = ran

    def __reduce__(self):
        return (Path.touch, (self.ran,))


def _objects(d: Path) -> tuple[list[str], str]:
    np.savez(d / "a.npz", x=np.array([Planted(d / "ran"), 1], dtype=object), y=np.zeros(2, int))
    return [str(d / "a.npz")], f"{d / 'a.npz'}: object arrays cannot be prepared"


def _objects_compressed(d: Path) -> tuple[list[str], str]:
    np.savez(d / "a.npz", x=np.zeros((2, 1)), y=np.zeros(2, int))
    np.savez_compressed(d / "b.npz", x=np.array([Planted(d / "ran"), 1], dtype=object),
                        y=np.zeros(2, int))
    return [str(d / "a.npz"), str(d / "b.npz")], (f"{d / 'b.npz'}: array 'x': object arrays "
                                                  "cannot be prepared")


def _damaged(d: Path) -> tuple[list[str], str]:
    np.savez_compressed(d / "a.npz", x=np.zeros((4000, 2)), y=np.arange(4000) % 3)
    data = bytearray((d / "a.npz").read_bytes())
    with zipfile.ZipFile(d / "a.npz") as zf:
        y = zf.getinfo("y.npy")
    middle = y.header_offset + 30 + len(y.filename) + len(y.extra) + y.compress_size - 24
    data[middle : middle + 16] = bytes(16)  # the labels' last deflated bytes
    (d / "a.npz").write_bytes(bytes(data))
    return [str(d / "a.npz")], f"{d / 'a.npz'}: not a readable .npz archive"


def _other_shape(d: Path) -> tuple[list[str], str]:
    np.savez(d / "a.npz", x=np.zeros((4, 2)), y=np.zeros(4, int))
    (d / "b").mkdir()
    np.save(d / "b" / "x.npy", np.zeros((4, 3)))
    np.save(d / "b" / "y.npy", np.zeros(4, int))
    return [str(d / "a.npz"), str(d / "b")], f"{d / 'b'}: 'x' is \\(4, 3\\) float64"


@pytest.mark.parametrize("bad", [_missing, _lengths, _objects, _objects_compressed,
                                 _damaged, _other_shape])
def test_bad_input_exits_2_naming_the_file(tmp_path: Path, capsys, bad) -> None:
    (tmp_path / "in").mkdir()
    files, problem = bad(tmp_path / "in")
    out = tmp_path / "out"
    assert prep.main(["npz", "--files", *files, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "hpcdp prep: error: " in err and re.search(problem, err), err
    assert not out.exists() and not (tmp_path / "in" / "ran").exists()


def test_a_planted_object_would_run_if_unpickled(tmp_path: Path) -> None:
    pickle.loads(pickle.dumps(Planted(tmp_path / "ran")))  # what the refusal above avoids
    assert (tmp_path / "ran").exists()
