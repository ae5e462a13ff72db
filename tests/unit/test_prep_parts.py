"""Per-block parts, the resume record and the frame's writer and progress, on one process."""

from __future__ import annotations

import dataclasses
import io
import json
import os
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcdp.data.prep import frame
from hpcdp.data.prep.merge import part_layout, write_parts
from hpcdp.data.prep.parts import SAME_BYTES, Parts, differences, fingerprint
from hpcdp.data.prep.progress import Progress
from hpcdp.data.prep.world import PrepError, SerialComm

COMM = SerialComm()


def _datasets(f: h5py.File, n: int) -> dict[str, h5py.Dataset]:
    f.attrs["num_samples"] = n
    return {"x": f.create_dataset("x", (n, 2), np.float32),
            "y": f.create_dataset("y", (n,), np.int64)}


def _block(i: int, n: int) -> dict[str, np.ndarray]:
    rows = np.arange(10 * i, 10 * i + n)
    return {"x": np.stack([rows, -rows], 1).astype(np.float32), "y": rows,
            "extra": np.ones(3)}


def test_parts_to_one_file_in_block_order_in_slabs(tmp_path: Path) -> None:
    sizes = [4, 0, 7, 1]
    with Parts(str(tmp_path), "test", {"a": 1}, COMM, resume=False) as parts:
        for i in reversed(range(len(sizes))):  # saved out of order: the file is in block order
            parts.save("train", i, **_block(i, sizes[i]))
        assert parts.rows("train", 2) == 7 and parts.length("train", 2, "extra") == 3
        assert isinstance(parts.load("train", 0)["x"], np.memmap)
        bar = Progress(COMM, "train", sum(sizes), "rows", stream=io.StringIO())
        total = write_parts(str(tmp_path / "train.h5"), parts, "train", range(4),
                            _datasets, COMM, slab_rows=3, progress=bar)
        bar.close()
        assert total == 12 and bar.done == 12
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.h5"]  # work folder removed
    with h5py.File(tmp_path / "train.h5") as f:
        want = np.concatenate([_block(i, n)["y"] for i, n in enumerate(sizes)])
        np.testing.assert_array_equal(f["y"][:], want)
        np.testing.assert_array_equal(f["x"][:, 1], -want)
        assert f.attrs["num_samples"] == 12 and "extra" not in f


def test_a_part_is_there_whole_or_not_at_all(tmp_path: Path) -> None:
    parts = Parts(str(tmp_path), "test", {}, COMM, resume=False)
    assert not parts.done("train", 3)
    parts.save("train", 3, y=np.arange(5))
    assert parts.done("train", 3) and parts.rows("train", 3) == 5
    # a temporary left by a killed save is neither done nor in the way of a new save
    (tmp_path / ".hpcdp-prep" / "train" / ".0000004.tmp-deadbeef").mkdir()
    assert not parts.done("train", 4)
    parts.save("train", 4, y=np.arange(2))
    np.testing.assert_array_equal(parts.load("train", 4)["y"], [0, 1])
    parts.save("train", 4, y=np.arange(2))  # saved twice (a resumed rank): kept, no error
    assert parts.rows("train", 4) == 2


def test_existing_work_folder_needs_resume_and_the_same_options(tmp_path: Path) -> None:
    out = str(tmp_path)
    first = Parts(out, "clicks", {"rows": 100, "seed": 1}, COMM, resume=False)
    first.save("train", 0, y=np.arange(3))
    first.save_state("vocabulary", {"done": True})
    with pytest.raises(PrepError, match=r"partial preparation.*pass --resume"):
        Parts(out, "clicks", {"rows": 100, "seed": 1}, COMM, resume=False)
    with pytest.raises(PrepError, match=r"seed: 1 -> 2"):
        Parts(out, "clicks", {"rows": 100, "seed": 2}, COMM, resume=True)
    (tmp_path / ".train.h5.tmp-0123456789ab").write_bytes(b"half a file")
    again = Parts(out, "clicks", {"seed": 1, "rows": 100}, COMM, resume=True)
    assert again.resumed and again.done("train", 0) and not again.done("train", 1)
    assert again.load_state("vocabulary") == {"done": True}
    assert again.load_state("other") is None
    assert not (tmp_path / ".train.h5.tmp-0123456789ab").exists()  # the killed run's temporary
    fresh = Parts(str(tmp_path / "new"), "clicks", {}, COMM, resume=True)
    assert not fresh.resumed  # --resume with nothing to resume starts afresh


def test_a_resume_removes_what_mpi_io_left_beside_a_killed_temporary(tmp_path: Path) -> None:
    Parts(str(tmp_path), "t", {}, COMM, resume=False)
    left = [".train.h5.tmp-0123456789ab", ".train.h5.tmp-0123456789ab.locktest.1"]
    for name in [*left, "mine.h5.locktest.1", "train.h5"]:
        (tmp_path / name).write_bytes(b"")
    assert Parts(str(tmp_path), "t", {}, COMM, resume=True).resumed
    assert sorted(os.listdir(tmp_path)) == [".hpcdp-prep", "mine.h5.locktest.1", "train.h5"]


def test_bad_input_found_while_working_leaves_nothing_but_a_crash_keeps_the_parts(
        tmp_path: Path) -> None:
    with pytest.raises(PrepError), Parts(str(tmp_path), "t", {}, COMM, False) as parts:
        parts.save("train", 0, y=np.arange(3))
        raise PrepError("a.tsv: line 3: bad")
    assert not (tmp_path / ".hpcdp-prep").exists()
    with pytest.raises(KeyboardInterrupt), Parts(str(tmp_path), "t", {}, COMM, False) as parts:
        parts.save("train", 0, y=np.arange(3))
        raise KeyboardInterrupt
    assert (tmp_path / ".hpcdp-prep" / "train").is_dir()


def test_fingerprint_differences_name_the_options() -> None:
    assert differences({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 4}) == [
        "b: 2 -> 3", "c: None -> 4"]


def test_a_fingerprint_is_the_checked_inputs_and_the_input_files(tmp_path: Path) -> None:
    @dataclasses.dataclass(frozen=True)
    class Checked:
        seed: int
        transfer: str = dataclasses.field(default="independent", metadata=SAME_BYTES)

    data = tmp_path / "x.npy"
    data.write_bytes(b"12345")
    got = fingerprint(Checked(3), {"rows": 10}, files=[str(data)])
    stat = data.stat()
    assert got == {"seed": 3, "rows": 10,
                   f"file {data.resolve()}": [5, stat.st_mtime_ns]}  # no transfer mode
    assert fingerprint(Checked(3, "collective"), {"rows": 10}, files=[str(data)]) == got
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert differences(got, fingerprint(Checked(3), {"rows": 10}, files=[str(data)])) == [
        f"file {data.resolve()}: [5, {stat.st_mtime_ns}] -> [5, {stat.st_mtime_ns + 1}]"]


def test_resuming_accepts_outputs_the_unfinished_run_renamed(tmp_path: Path) -> None:
    (tmp_path / "train.h5").write_bytes(b"x")
    with pytest.raises(PrepError, match="already exist"):
        frame.check_outputs(str(tmp_path), ["train.h5"], overwrite=False, resume=True)
    (tmp_path / ".hpcdp-prep").mkdir()
    frame.check_outputs(str(tmp_path), ["train.h5"], overwrite=False, resume=True)
    with pytest.raises(PrepError, match="already exist"):
        frame.check_outputs(str(tmp_path), ["train.h5"], overwrite=False, resume=False)


def test_progress_line_says_done_rate_and_time_left() -> None:
    out = io.StringIO()
    bar = Progress(COMM, "train", 2_000_000, "rows", every=0.0, stream=out)
    bar.start -= 10.0
    bar.advance(500_000)
    line = out.getvalue().strip()
    assert line.startswith("hpcdp prep: train: 500.0k/2.0M rows (25%), ")
    assert "k rows/s" in line and "s left" in line
    bar.close()
    assert "2.0M" not in out.getvalue().splitlines()[-1].split("/")[0]


def test_add_common_options_and_block_size() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    frame.add_common_options(parser)
    args = parser.parse_args(["--resume", "--block-mib", "0.5"])
    assert args.resume and frame.block_bytes(args.block_mib) == 1 << 19
    assert frame.block_bytes(parser.parse_args([]).block_mib) == 64 << 20
    with pytest.raises(PrepError, match="--block-mib 0"):
        frame.block_bytes(0)
    assert json.dumps(frame.EXIT_BAD_INPUT) == "2" and frame.EXIT_WRITE_FAILED == 1


def test_arrays_of_other_lengths_and_offsets_shifted_into_the_file(tmp_path: Path) -> None:
    docs = [[np.array([1, 2, 3]), np.array([4])], [], [np.array([5, 6])]]  # blocks of documents
    with Parts(str(tmp_path), "test", {}, COMM, resume=False) as parts:
        for i, block in enumerate(docs):
            lengths = np.array([len(d) for d in block], np.int64)
            tokens = np.concatenate(block) if block else np.zeros(0, np.int64)
            parts.save("train", i, tokens=tokens, ends=np.cumsum(lengths))
        layout = part_layout(parts, "train", range(3), COMM)
        assert layout.totals == {"tokens": 6, "ends": 3}

        def datasets(f: h5py.File, n: int) -> dict[str, h5py.Dataset]:
            ends = f.create_dataset("ends", (layout.totals["ends"] + 1,), np.int64)
            ends[0] = 0
            return {"tokens": f.create_dataset("tokens", (n,), np.int64), "ends": ends}

        write_parts(str(tmp_path / "t.h5"), parts, "train", range(3), datasets, COMM,
                    slab_rows=1, layout=layout, shift={"ends": ("tokens", 1)})
    with h5py.File(tmp_path / "t.h5") as f:
        np.testing.assert_array_equal(f["tokens"][:], [1, 2, 3, 4, 5, 6])
        np.testing.assert_array_equal(f["ends"][:], [0, 3, 4, 6])


def test_progress_on_a_terminal_is_a_bar() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    bar = Progress(COMM, "val", 300, "rows", stream=out)
    bar.advance(100)
    bar.advance(200)
    bar.close()
    text = out.getvalue()
    assert "val:" in text and "300/300" in text and "rows/s" in text
    assert "hpcdp prep: val" not in text  # the bar, not the log lines


def test_progress_rate_leaves_out_what_an_earlier_run_did() -> None:
    out = io.StringIO()
    bar = Progress(COMM, "train", 1000, "rows", every=0.0, stream=out)
    bar.start -= 10.0
    bar.advance(900, resumed=True)  # blocks found done: counted, but not this run's speed
    bar.advance(50)
    assert "950/1000 rows (95%), 5 rows/s, 10 s left" in out.getvalue().splitlines()[-1]


def test_a_part_saved_a_slice_at_a_time_is_the_part_saved_at_once(tmp_path: Path) -> None:
    parts = Parts(str(tmp_path), "test", {}, COMM, resume=False)
    rows = np.arange(12, dtype=np.int32).reshape(6, 2)
    with parts.saving("docs", 1, x=np.int32, n=np.int64) as part:
        assert not parts.done("docs", 1)  # not there until the body ends
        part.append(x=rows[:4], n=np.array([4]))
        part.append(x=rows[4:4])  # empty slices add nothing
        part.append(x=rows[4:], n=np.array([2]))
    parts.save("docs", 2, x=rows, n=np.array([4, 2]))
    for b in (1, 2):
        got = parts.load("docs", b)
        assert got["x"].dtype == np.int32 and got["x"].shape == (6, 2)
        np.testing.assert_array_equal(got["x"], rows)
        np.testing.assert_array_equal(got["n"], [4, 2])
        assert parts.lengths("docs", b) == {"x": 6, "n": 2}
    with parts.saving("docs", 3, x=np.int32):  # nothing appended: an empty part
        pass
    assert parts.rows("docs", 3) == 0 and parts.load("docs", 3)["x"].dtype == np.int32


def test_a_part_whose_making_fails_leaves_nothing(tmp_path: Path) -> None:
    parts = Parts(str(tmp_path), "test", {}, COMM, resume=False)
    with (pytest.raises(ValueError, match="x: int64 appended to an array of int32"),
          parts.saving("docs", 0, x=np.int32) as part):
        part.append(x=np.arange(3, dtype=np.int32))
        part.append(x=np.arange(3))
    with (pytest.raises(ValueError, match=r"rows of shape \(3,\) appended to rows of shape"),
          parts.saving("docs", 0, x=np.int32) as part):
        part.append(x=np.zeros((1, 2), np.int32))
        part.append(x=np.zeros((1, 3), np.int32))
    assert not parts.done("docs", 0)
    assert os.listdir(tmp_path / ".hpcdp-prep" / "docs") == []  # no temporary left
