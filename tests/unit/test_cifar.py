"""CIFAR archives: binary and python versions give the same file; planted pickles never run."""

from __future__ import annotations

import io
import json
import os
import pickle
import tarfile
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcdp.data.prep import cli as prep
from hpcdp.data.prep.arrays import SourceError
from hpcdp.data.prep.images import cifar

PER_BATCH = 12


def _tar(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def fake_data(classes: int, seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per batch name: (images (n, 3072) uint8, fine labels, coarse labels)."""
    rng = np.random.default_rng(seed)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    return {n: (rng.integers(0, 256, (PER_BATCH, 3072), dtype=np.uint8),
                rng.integers(0, classes, PER_BATCH), rng.integers(0, 4, PER_BATCH))
            for n in names}


def cifar10_archives(tmp: Path, batches=None) -> tuple[Path, Path]:
    batches = batches or fake_data(10)
    label_names = [f"class{i}" for i in range(10)]
    binary = {"cifar-10-batches-bin/batches.meta.txt": ("\n".join(label_names) + "\n\n").encode()}
    python = {"cifar-10-batches-py/batches.meta": pickle.dumps(
        {b"label_names": [n.encode() for n in label_names], b"num_vis": 3072}, protocol=2)}
    for name, (x, y, _) in batches.items():
        rec = np.concatenate([y.astype(np.uint8)[:, None], x], axis=1)
        binary[f"cifar-10-batches-bin/{name}.bin"] = rec.tobytes()
        python[f"cifar-10-batches-py/{name}"] = pickle.dumps(
            {b"batch_label": name.encode(), b"labels": [int(v) for v in y], b"data": x,
             b"filenames": [f"{i}.png".encode() for i in range(len(x))]}, protocol=2)
    return (_tar(tmp / "cifar-10-binary.tar.gz", binary),
            _tar(tmp / "cifar-10-python.tar.gz", python))


def cifar100_archives(tmp: Path) -> tuple[Path, Path]:
    b = fake_data(7, seed=1)
    parts = {"train": [b[f"data_batch_{i}"] for i in range(1, 6)], "test": [b["test_batch"]]}
    fine, coarse = [f"fine{i}" for i in range(7)], [f"coarse{i}" for i in range(4)]
    binary = {"cifar-100-binary/fine_label_names.txt": "\n".join(fine).encode(),
              "cifar-100-binary/coarse_label_names.txt": "\n".join(coarse).encode()}
    python = {"cifar-100-python/meta": pickle.dumps(
        {b"fine_label_names": fine, b"coarse_label_names": coarse}, protocol=4)}
    for name, batches in parts.items():
        x = np.concatenate([p[0] for p in batches])
        f = np.concatenate([p[1] for p in batches])
        c = np.concatenate([p[2] for p in batches])
        rec = np.concatenate([c.astype(np.uint8)[:, None], f.astype(np.uint8)[:, None], x], 1)
        binary[f"cifar-100-binary/{name}.bin"] = rec.tobytes()
        python[f"cifar-100-python/{name}"] = pickle.dumps(
            {b"fine_labels": f.tolist(), b"coarse_labels": c.tolist(), b"data": x}, protocol=5)
    return (_tar(tmp / "cifar-100-binary.tar.gz", binary),
            _tar(tmp / "cifar-100-python.tar.gz", python))


def read(path: Path) -> tuple[dict, dict]:
    with h5py.File(path) as f:
        return ({k: f[k][...] for k in f}, dict(f.attrs))


def assert_same(a: Path, b: Path) -> None:
    (da, aa), (db, ab) = read(a), read(b)
    assert da.keys() == db.keys() and aa.keys() == ab.keys()
    for k in da:
        np.testing.assert_array_equal(da[k], db[k])
    for k in aa:
        np.testing.assert_array_equal(aa[k], ab[k])


def test_cifar10_binary_and_python_give_identical_files(tmp_path: Path) -> None:
    batches = fake_data(10)
    binary, python = cifar10_archives(tmp_path, batches)
    for name, archive in (("bin", binary), ("py", python)):
        assert prep.main(["cifar", "--archive", str(archive), "--out", str(tmp_path / name)]) == 0
    for split in ("train.h5", "val.h5"):
        assert_same(tmp_path / "bin" / split, tmp_path / "py" / split)
    data, attrs = read(tmp_path / "py" / "train.h5")
    first = batches["data_batch_1"]
    np.testing.assert_array_equal(data["x"][:PER_BATCH], first[0].reshape(-1, 3, 32, 32))
    np.testing.assert_array_equal(data["y"][:PER_BATCH], first[1])
    assert data["x"].shape == (5 * PER_BATCH, 3, 32, 32)
    assert json.loads(attrs["classes"]) == [f"class{i}" for i in range(10)]
    x = data["x"].astype(np.float64) / 255
    np.testing.assert_allclose(attrs["mean"], x.mean(axis=(0, 2, 3)), rtol=1e-12)
    np.testing.assert_allclose(attrs["std"], x.std(axis=(0, 2, 3)), rtol=1e-9)
    val, _ = read(tmp_path / "bin" / "val.h5")
    np.testing.assert_array_equal(val["y"], batches["test_batch"][1])


@pytest.mark.parametrize("labels", ["fine", "coarse"])
def test_cifar100_binary_and_python_give_identical_files(tmp_path: Path, labels: str) -> None:
    binary, python = cifar100_archives(tmp_path)
    for name, archive in (("bin", binary), ("py", python)):
        assert prep.main(["cifar", "--archive", str(archive), "--labels", labels,
                          "--out", str(tmp_path / name)]) == 0
    for split in ("train.h5", "val.h5"):
        assert_same(tmp_path / "bin" / split, tmp_path / "py" / split)
    data, attrs = read(tmp_path / "bin" / "val.h5")
    assert json.loads(attrs["classes"])[0] == f"{labels}0"
    expected = fake_data(7, seed=1)["test_batch"][1 if labels == "fine" else 2]
    np.testing.assert_array_equal(data["y"], expected)


class PlantedPayload:
    """Unpickling this would create a file (io.open(path, 'w'))."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.parametrize("protocol", [2, 4])
def test_a_pickle_that_would_run_code_is_refused_and_nothing_runs(tmp_path: Path, capsys,
                                                                  protocol: int) -> None:
    marker = tmp_path / "pwned"
    good = {b"label_names": [b"a"] * 10}
    planted = {"cifar-10-batches-py/batches.meta": pickle.dumps(good, protocol=2),
               "cifar-10-batches-py/data_batch_1": pickle.dumps(
                   {b"data": PlantedPayload(marker), b"labels": []}, protocol=protocol)}
    archive = _tar(tmp_path / "evil.tar.gz", planted)
    with pytest.raises(SourceError, match=r"evil.tar.gz:cifar-10-batches-py/data_batch_1: refused: "
                                          r"the pickle "
                                          r"names (io|builtins|_io)\.open"):
        cifar.read_archive(str(archive))
    assert not marker.exists()
    out = tmp_path / "out"
    assert prep.main(["cifar", "--archive", str(archive), "--out", str(out)]) == 2
    assert "cifar-10-batches-py/data_batch_1: refused" in capsys.readouterr().err
    assert not marker.exists() and not out.exists()


def test_the_restricted_unpickler_still_reads_what_cifar_holds() -> None:
    value = {b"a": [1, 2.5, "s", b"b", None, True, (1, 2)],
             b"x": np.arange(12, dtype=np.uint8).reshape(3, 4)}
    for protocol in (2, 4, 5):
        got = cifar.safe_load(pickle.dumps(value, protocol=protocol), "t")
        np.testing.assert_array_equal(got[b"x"], value[b"x"])
        assert got[b"a"] == value[b"a"]
    with pytest.raises(SourceError, match=r"t: refused: the pickle names collections"):
        cifar.safe_load(pickle.dumps({b"x": __import__("collections").OrderedDict()}), "t")


@pytest.mark.parametrize(("edit", "problem"), [
    (lambda m: m.pop("cifar-10-batches-bin/data_batch_3.bin"),
     "cifar-10-batches-bin/data_batch_3.bin: no such member"),
    (lambda m: m.update({"cifar-10-batches-bin/test_batch.bin": b"x" * 3074}),
     "batches-bin/test_batch.bin: 3074 bytes is not a whole number of 3073-byte records"),
    (lambda m: m.update({"cifar-10-batches-bin/test_batch.bin": bytes([12]) + bytes(3072)}),
     "batches-bin/test_batch.bin: record 0 has label 12, outside 0..9"),
])
def test_bad_binary_archives_are_named(tmp_path: Path, edit, problem: str) -> None:
    binary, _ = cifar10_archives(tmp_path)
    with tarfile.open(binary) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    edit(members)
    with pytest.raises(SourceError, match=problem):
        cifar.read_archive(str(_tar(tmp_path / "bad.tar.gz", members)))


def test_not_an_archive_is_named(tmp_path: Path) -> None:
    (tmp_path / "x.tar.gz").write_text("nope")
    with pytest.raises(SourceError, match="x.tar.gz: not a readable tar archive"):
        cifar.read_archive(str(tmp_path / "x.tar.gz"))


def test_a_same_named_member_elsewhere_does_not_replace_the_real_one(tmp_path: Path) -> None:
    batches = fake_data(10)
    binary, _ = cifar10_archives(tmp_path, batches)
    with tarfile.open(binary) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    members["zzz/test_batch.bin"] = bytes([9]) * 3073  # after the real one: once, last won
    got = cifar.read_archive(str(_tar(tmp_path / "planted.tar.gz", members)))
    np.testing.assert_array_equal(got.val_y, batches["test_batch"][1])
    assert len(got.val_y) == PER_BATCH


def test_a_link_two_layouts_or_no_layout_are_refused(tmp_path: Path) -> None:
    binary, python = cifar10_archives(tmp_path)
    with tarfile.open(binary) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    path = tmp_path / "link.tar"
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            if name.endswith("test_batch.bin"):
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                data = b""
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(SourceError, match=r"link.tar:cifar-10-batches-bin/test_batch.bin: not "
                                          r"a regular file"):
        cifar.read_archive(str(path))
    with tarfile.open(python) as tar:
        members.update({m.name: tar.extractfile(m).read() for m in tar.getmembers()})
    with pytest.raises(SourceError, match="holds cifar-10-batches-bin and cifar-10-batches-py: "
                                          "which to read is ambiguous"):
        cifar.read_archive(str(_tar(tmp_path / "both.tar.gz", members)))
    moved = {f"x/{name}": data for name, data in members.items()}
    with pytest.raises(SourceError, match="holds none of the published layouts"):
        cifar.read_archive(str(_tar(tmp_path / "moved.tar.gz", moved)))


def test_arrays_are_built_only_from_their_own_bytes() -> None:
    from numpy._core import multiarray

    class Call:
        def __init__(self, *call):
            self.call = call

        def __reduce__(self):
            return self.call[0], self.call[1:]

    for planted, problem in [
        (Call(np.ndarray, (4,), np.dtype("u1"), b"\0", 0, (0,)), "direct numpy.ndarray"),
        (Call(multiarray._reconstruct, np.ndarray, (1 << 40,), b"B"), r"shape \(1099511627776,\)"),
        (Call(np.dtype, "O8", False, True), "dtype 'O8'"),
    ]:
        with pytest.raises(SourceError, match=f"t: refused: the pickle holds .*{problem}"):
            cifar.safe_load(pickle.dumps({b"data": planted}, protocol=2), "t")


@pytest.mark.timeout(30)
def test_an_archive_that_is_not_a_regular_file_is_refused_unread(tmp_path: Path) -> None:
    fifo = tmp_path / "cifar.tar.gz"
    os.mkfifo(fifo)  # opening it to read would wait for a writer forever
    with pytest.raises(SourceError, match="cifar.tar.gz: not a regular file"):
        cifar.read_archive(str(fifo))


@pytest.mark.parametrize("pack", ["gz", "xz"])
def test_a_damaged_compressed_archive_is_named(tmp_path: Path, pack: str) -> None:
    import gzip
    import lzma

    binary, _ = cifar10_archives(tmp_path)
    tar = gzip.decompress(binary.read_bytes())
    # damaged deflate blocks raise zlib.error, damaged xz lzma.LZMAError: neither an OSError
    data = bytearray((gzip.compress if pack == "gz" else lzma.compress)(tar))
    data[len(data) // 2 : len(data) // 2 + 64] = bytes(64)
    path = tmp_path / f"damaged.tar.{pack}"
    path.write_bytes(bytes(data))
    with pytest.raises(SourceError, match=f"damaged.tar.{pack}: not a readable tar archive"):
        cifar.read_archive(str(path))
