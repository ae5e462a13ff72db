"""Hostile and broken archives and corpora: each run as the recipe command in a child under a
memory cap and a timeout, refused naming the file and the member or line, nothing written.

The cap is on address space (RLIMIT_AS). Thread pools and allocator arenas reserve address
space by the core count, so the children run with one OpenMP/BLAS thread, one malloc arena
(each thread that mallocs may reserve an arena of 64 MiB, and every recipe runs a stall
guard thread beside its main one) and Arrow on the system allocator (`QUIET`): then a normal
run of these recipes on small
input needs about 145 MiB (282 MiB once pyarrow is loaded), measured by bisecting the limit,
and `CAP` (`PARQUET_CAP`) leaves over 200 MiB of margin, while each crafted file below would
have cost far more than that unchecked (hundreds of MB to GBs) or run for minutes.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle
import resource
import subprocess
import sys
import tarfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from hpcdp.data.prep import frame

REPO = Path(__file__).resolve().parents[2]
CAP = 400 << 20
PARQUET_CAP = 512 << 20
QUIET = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "1",
         "ARROW_DEFAULT_MEMORY_POOL": "system"}
TIMEOUT = 60
#: `hpcdp prep` (CIFAR) refuses bad input with 2; the recipes on `frame.main` with its status.
CIFAR_BAD = 2
FRAME_BAD = getattr(frame, "EXIT_BAD_INPUT", 1)
CRITEO_ROW = "1\t" + "\t".join(["5"] * 13) + "\t" + "\t".join(["abcdef01"] * 26)


@dataclass(frozen=True)
class Case:
    """A crafted input: `make(tmp)` writes it and returns the command's arguments."""

    make: Callable[[Path], list[str]]
    says: tuple[str, ...]  # in the message, in order
    status: int
    cap: int = CAP


def run_capped(argv: list[str], cap: int, cwd: Path) -> subprocess.CompletedProcess:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    environ = {**os.environ, **QUIET, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, *argv], preexec_fn=limit, capture_output=True,
                          timeout=TIMEOUT, cwd=cwd, env=environ)


# -- CIFAR ----------------------------------------------------------------------------


def cifar_cmd(archive: Path, tmp: Path) -> list[str]:
    return [str(REPO / "datasets" / "cifar.py"), "--archive", str(archive),
            "--out", str(tmp / "out")]


def tar_of(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def sparse_member(tmp: Path) -> list[str]:
    """A plain tar whose first member declares 400 MB, stored as a hole in the file."""
    path = tmp / "sparse.tar"
    info = tarfile.TarInfo("cifar-10-batches-bin/data_batch_1.bin")
    info.size = 400_000_000
    with open(path, "wb") as fh:
        fh.write(info.tobuf(format=tarfile.GNU_FORMAT))
        fh.seek(info.size, 1)
        fh.write(bytes(2 * 512 + (-info.size % 512)))
    return cifar_cmd(path, tmp)


def long_name_header(tmp: Path) -> list[str]:
    """A GNU long-name header declaring 400 MB (a hole on disk), which tarfile reads whole."""
    path = tmp / "longname.tar"
    info = tarfile.TarInfo("././@LongLink")
    info.type, info.size = tarfile.GNUTYPE_LONGNAME, 400_000_000
    with open(path, "wb") as fh:
        fh.write(info.tobuf(format=tarfile.GNU_FORMAT))
        fh.seek(info.size + (-info.size % 512), 1)
        fh.write(tarfile.TarInfo("x").tobuf(format=tarfile.GNU_FORMAT) + bytes(1024))
    return cifar_cmd(path, tmp)


class Reduced:
    """Pickles as ``func(*args)``: what a hostile pickle may ask the unpickler to call."""

    def __init__(self, func: object, *args: object) -> None:
        self.func, self.args = func, args

    def __reduce__(self):
        return (self.func, self.args)


def python_archive(tmp: Path, batch: dict) -> Path:
    meta = {b"label_names": [f"c{i}".encode() for i in range(10)]}
    return tar_of(tmp / "cifar-10-python.tar.gz", {
        "cifar-10-batches-py/batches.meta": pickle.dumps(meta, protocol=2),
        "cifar-10-batches-py/data_batch_1": pickle.dumps(batch, protocol=2)})


def zero_stride(tmp: Path) -> list[str]:
    """A pickle of a few hundred bytes whose arrays are views with stride 0 of one element:
    200,000 images declared, 614 MB once copied."""
    n = 200_000
    batch = {b"data": Reduced(np.ndarray, (n, 3072), np.dtype("u1"), b"\0", 0, (0, 0)),
             b"labels": Reduced(np.ndarray, (n,), np.dtype("i8"), bytes(8), 0, (0,))}
    return cifar_cmd(python_archive(tmp, batch), tmp)


def declared_shape(tmp: Path) -> list[str]:
    """NumPy's reconstructor asked for an 800 MB array up front."""
    from numpy._core import multiarray

    batch = {b"data": Reduced(multiarray._reconstruct, np.ndarray, (1 << 18, 3072), b"B"),
             b"labels": []}
    return cifar_cmd(python_archive(tmp, batch), tmp)


def huge_label(tmp: Path) -> list[str]:
    x = np.zeros((4, 3072), np.uint8)
    return cifar_cmd(python_archive(tmp, {b"data": x, b"labels": [0, 10**30, 1, 2]}), tmp)


def binary_members(records: int = 2) -> dict[str, bytes]:
    batch = bytes(records * 3073)
    members = {"cifar-10-batches-bin/batches.meta.txt": b"\n".join(b"c%d" % i
                                                                   for i in range(10))}
    for i in range(1, 6):
        members[f"cifar-10-batches-bin/data_batch_{i}.bin"] = batch
    members["cifar-10-batches-bin/test_batch.bin"] = batch
    return members


def member_twice(tmp: Path) -> list[str]:
    path = tmp / "twice.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, data in [*binary_members().items(),
                           ("cifar-10-batches-bin/test_batch.bin", bytes([3]) + bytes(3072))]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return cifar_cmd(path, tmp)


# -- text corpora ---------------------------------------------------------------------


def text_cmd(files: list[Path], tmp: Path, *extra: str) -> list[str]:
    return [str(REPO / "datasets" / "text.py"), "--files", *map(str, files),
            "--out", str(tmp / "out"), *extra]


def gz_long_line(tmp: Path) -> list[str]:
    """300 KB of gzip holding one 300 MB record."""
    path = tmp / "big.jsonl.gz"
    z = zlib.compressobj(1, zlib.DEFLATED, 31)
    with open(path, "wb") as fh:
        fh.write(z.compress(b'{"text": "ok"}\n{"text": "'))
        for _ in range(300):
            fh.write(z.compress(b"a" * (1 << 20)))
        fh.write(z.compress(b'"}\n') + z.flush())
    return text_cmd([path], tmp)


def bad_record(line: bytes) -> Callable[[Path], list[str]]:
    def make(tmp: Path) -> list[str]:
        path = tmp / "c.jsonl"
        path.write_bytes(b'{"text": "fine"}\n' + line + b"\n")
        return text_cmd([path], tmp)
    return make


def long_plain_record(tmp: Path) -> list[str]:
    path = tmp / "d.jsonl"
    path.write_bytes(b'{"text": "a"}\n\n' + json.dumps({"text": "b" * 2000}).encode() + b"\n")
    return text_cmd([path], tmp, "--max-record-bytes", "1000")


def parquet_twice(tmp: Path) -> list[str]:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp / "twice.parquet"
    table = pa.Table.from_arrays([pa.array(["a", "b"]), pa.array(["c", "d"])],
                                 names=["text", "text"])
    pq.write_table(table, path)
    return text_cmd([path], tmp)


def parquet_dictionary(tmp: Path) -> list[str]:
    """A few hundred KB of Parquet: one 1,000-character value, referenced by 3M rows (3 GB)."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp / "dict.parquet"
    column = pa.DictionaryArray.from_arrays(pa.array(np.zeros(3_000_000, np.int32)),
                                            pa.array(["x" * 1000]))
    pq.write_table(pa.table({"text": column}), path, compression="zstd")
    assert path.stat().st_size < 1_000_000
    return text_cmd([path], tmp)


# -- Criteo ---------------------------------------------------------------------------


def criteo_cmd(train: Path, tmp: Path, *extra: str) -> list[str]:
    val = tmp / "val.txt"
    val.write_text(CRITEO_ROW + "\n")
    return [str(REPO / "datasets" / "criteo.py"), "--files", str(train), "--val-files",
            str(val), "--buckets", "100", "--out", str(tmp / "out"), *extra]


def criteo_long_line(tmp: Path) -> list[str]:
    """A 30 MB line of tabs: split on tabs, it was 30M pieces."""
    path = tmp / "train.txt"
    path.write_bytes(f"{CRITEO_ROW}\n".encode() + b"1" + b"\t" * 30_000_000 + b"\n")
    return criteo_cmd(path, tmp)


def criteo_gz_line(tmp: Path, mib: int = 100) -> list[str]:
    path = tmp / "train.gz"
    z = zlib.compressobj(1, zlib.DEFLATED, 31)
    with open(path, "wb") as fh:
        fh.write(z.compress(f"{CRITEO_ROW}\n{CRITEO_ROW}\n".encode()))
        for _ in range(mib):
            fh.write(z.compress(b"\t" * (1 << 20)))
        fh.write(z.compress(f"\n{CRITEO_ROW}\n".encode()) + z.flush())
    return criteo_cmd(path, tmp)


def criteo_blank_lines(tmp: Path) -> list[str]:
    """50 KB of gzip holding 50M blank lines: seconds of reading per KB, unchecked."""
    path = tmp / "blank.gz"
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    with open(path, "wb") as fh:
        fh.write(z.compress(f"{CRITEO_ROW}\n".encode()))
        for _ in range(50):
            fh.write(z.compress(b"\n" * (1 << 20)))
        fh.write(z.flush())
    return criteo_cmd(path, tmp, "--skip-bad")


def criteo_not_utf8_name(tmp: Path) -> list[str]:
    path = Path(os.fsdecode(bytes(tmp / "train") + b"\xff.txt"))
    path.write_text(f"{CRITEO_ROW}\n2\tx\n")
    return criteo_cmd(path, tmp)


def shrunk_file(tmp: Path) -> list[str]:
    """The reader asked for more bytes than the file now holds (it shrank once measured)."""
    path = tmp / "shrunk.txt"
    path.write_text(f"{CRITEO_ROW}\n")
    code = ("import sys; from hpcdp.data.prep.clicks import criteo as cr\n"
            "from hpcdp.data.prep.clicks import criteo_blocks as cb\n"
            "try:\n    list(cb.block_pieces(sys.argv[1], 0, int(sys.argv[2]), sys.argv[1],\n"
            "                         False))\n"
            "except cr.CriteoError as exc:\n    sys.exit(f'error: {exc}')\n")
    return ["-c", code, str(path), str(path.stat().st_size + 4096)]


CASES = {
    "cifar-sparse-member-declaring-400MB": Case(
        sparse_member, ("sparse.tar:cifar-10-batches-bin/data_batch_1.bin: declares 400000000 "
                        "bytes", "refused before reading"), CIFAR_BAD),
    "cifar-long-name-header-declaring-400MB": Case(
        long_name_header, ("longname.tar: a tar header extension declares 400000000 bytes",),
        CIFAR_BAD),
    "cifar-zero-stride-pickle": Case(
        zero_stride, ("cifar-10-batches-py/data_batch_1: refused", "numpy.ndarray"), CIFAR_BAD),
    "cifar-pickle-declaring-800MB": Case(
        declared_shape, ("cifar-10-batches-py/data_batch_1: refused", "shape (262144, 3072)"),
        CIFAR_BAD),
    "cifar-label-10**30": Case(
        huge_label, ("data_batch_1: record 1 has label (a 100-bit number), outside 0..9",),
        CIFAR_BAD),
    "cifar-member-twice": Case(
        member_twice, ("twice.tar.gz:cifar-10-batches-bin/test_batch.bin: the archive holds "
                       "this member twice",), CIFAR_BAD),
    "text-gz-300MB-line": Case(
        gz_long_line, ("big.jsonl.gz: line 2: a record of more than 67108864 bytes",
                       "--max-record-bytes"), FRAME_BAD),
    "text-5000-digit-number": Case(
        bad_record(b'{"text": "x", "n": ' + b"7" * 5000 + b"}"),
        ("c.jsonl: line 2: cannot be read as data: a number of more than",), FRAME_BAD),
    "text-100k-nested-brackets": Case(
        bad_record(b'{"text": "x", "n": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
        ("c.jsonl: line 2: cannot be read as data: arrays or objects nested too deeply",),
        FRAME_BAD),
    "text-lone-surrogate": Case(
        bad_record(b'{"text": "ab\\ud800c"}'),
        ("c.jsonl: line 2: field 'text' holds a lone surrogate (U+D800)",), FRAME_BAD),
    "text-record-over-the-option": Case(
        long_plain_record, ("d.jsonl: line 3: a record of more than 1000 bytes "
                            "(--max-record-bytes 1000",), FRAME_BAD),
    "parquet-column-twice": Case(
        parquet_twice, ("twice.parquet: 2 columns are named 'text'",), FRAME_BAD, PARQUET_CAP),
    "parquet-dictionary-3GB": Case(
        parquet_dictionary, ("dict.parquet: row group 0: more than ", " bytes of documents",
                             "--max-expansion 100"), FRAME_BAD, PARQUET_CAP),
    "criteo-30MB-line": Case(
        criteo_long_line,
        ("train.txt: line 2: the line is over 4096 bytes; a row has at most 495",), FRAME_BAD),
    "criteo-gz-100MB-line": Case(
        criteo_gz_line, ("train.gz: line 3: the line is over 4096 bytes; a row has at most 495",),
        FRAME_BAD),
    "criteo-gz-50M-blank-lines": Case(
        criteo_blank_lines, ("blank.gz: line ", ": more than ", " bytes from ",
                             "more than 100 times is refused"), FRAME_BAD),
    "criteo-not-utf8-name": Case(
        criteo_not_utf8_name, ("train\\xff.txt: line 2: 2 tab-separated fields",), FRAME_BAD),
    "criteo-file-shrank": Case(
        shrunk_file, ("shrunk.txt: ", " bytes now, but at least ", "changed while being read"),
        1),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_input_is_refused_within_bounds(tmp_path: Path, name: str) -> None:
    case = CASES[name]
    argv = case.make(tmp_path)
    got = run_capped(argv, case.cap, tmp_path)
    err = got.stderr.decode("utf-8", "replace")
    assert got.returncode == case.status, err[-2000:]
    assert "Traceback" not in err and "error while writing" not in err, err[-2000:]
    at = 0
    for part in case.says:
        found = err.find(part, at)
        assert found >= 0, f"{part!r} not in {err[-2000:]!r}"
        at = found + len(part)
    out = tmp_path / "out"
    assert not out.exists() or not any(out.iterdir())


def test_a_long_line_is_skipped_and_counted_with_skip_bad(tmp_path: Path) -> None:
    """Read whole, the 200 MB line would exceed the cap; skipped, it is never held."""
    got = run_capped([*criteo_gz_line(tmp_path, 200), "--skip-bad"], CAP, tmp_path)
    assert got.returncode == 0, got.stderr.decode()[-2000:]
    assert "wrote " in got.stdout.decode() and "1 bad lines skipped" in got.stdout.decode()


def test_gzip_lines_within_the_limit_read_whole(tmp_path: Path) -> None:
    """The bounded reader gives every line whole up to its limit, whatever the line end."""
    from hpcdp.data.prep import bounded

    path = tmp_path / "x.gz"
    path.write_bytes(gzip.compress(b"a" * 10 + b"\r\n" + b"b" * 11 + b"\n" + b"c" * 30 + b"\nd"))
    with gzip.open(path, "rb") as fh:
        assert [len(x) for x in bounded.lines(fh, 10)] == [11, 11, 12, 1]
