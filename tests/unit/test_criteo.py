"""Criteo click logs: parsing, the feature rules, byte ranges, and the recipe on one process."""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcdp.data.format.clicks import validate_click_file
from hpcdp.data.prep.blocks import plan_blocks
from hpcdp.data.prep.clicks import criteo as cr
from hpcdp.data.prep.clicks import criteo_blocks as cb
from hpcdp.data.prep.clicks import criteo_recipe as cp


def row(label: str = "1", counts: list[str] | None = None, cats: list[str] | None = None
        ) -> bytes:
    counts = counts if counts is not None else [str(j) for j in range(13)]
    cats = cats if cats is not None else [f"{0x1000 * j + 7:08x}" for j in range(26)]
    return "\t".join([label, *counts, *cats]).encode()


def test_a_line_with_empty_and_negative_fields() -> None:
    counts = ["", "-1", "5", *["0"] * 10]
    cats = ["", "68fd1e64", "ABCDEF01", "7", *["0"] * 22]
    label, c, v = cr.parse_line(row("0", counts, cats))
    assert label == 0 and c[:3] == [0, -1, 5]
    assert v[:4] == [cr.EMPTY, 0x68FD1E64, 0xABCDEF01, 7]


@pytest.mark.parametrize(("line", "problem"), [
    (row()[:-9], "39 tab-separated fields, expected 40"),
    (row() + b"\t", "41 tab-separated fields, expected 40"),
    (b"", "1 tab-separated fields, expected 40"),
    (row(label=""), "label '' is not 0 or 1"),
    (row(label="2"), "label '2' is not 0 or 1"),
    (row(counts=["1.5", *["0"] * 12]), "count I1 = '1.5' is not an integer"),
    (row(counts=["0", "+3", *["0"] * 11]), "count I2 = '+3' is not an integer"),
    (row(counts=["0", "0", " 3", *["0"] * 10]), "count I3 = ' 3' is not an integer"),
    (row(counts=["9" * 19, *["0"] * 12]), "is not an integer of at most 18 digits"),
    (row(cats=["zz", *["0"] * 25]), "categorical C1 = 'zz' is not hexadecimal"),
    (row(cats=["0", "123456789", *["0"] * 24]), "categorical C2 = '123456789' is not hex"),
    (row(cats=[*["0"] * 25, "0x12"]), "categorical C26 = '0x12' is not hexadecimal"),
])
def test_each_bad_field_is_named(line: bytes, problem: str) -> None:
    with pytest.raises(cr.CriteoError, match=re.escape(problem)):
        cr.parse_line(line)


def test_parse_lines_names_file_and_line_or_counts_with_skip_bad() -> None:
    lines = [row(), b"", row(), row(label="x"), row()]
    with pytest.raises(cr.CriteoError, match=r"^day_0: line 13: label 'x' is not 0 or 1$"):
        cr.parse_lines(lines, "day_0", first_line=10)
    rows = cr.parse_lines(lines, "day_0", skip_bad=True)
    assert len(rows.label) == 3 and rows.skipped == 1  # the blank line is no row, nor bad


def test_the_dense_rule() -> None:
    got = cr.dense_features(np.array([[-5, 0, 1, 10, 2**40]]))
    np.testing.assert_allclose(got, [[0, 0, np.log(2), np.log(11), np.log1p(2.0**40)]],
                               rtol=1e-6)
    assert got.dtype == np.float32


def test_hashed_ids_are_stable_and_in_range() -> None:
    values = np.array([[cr.EMPTY, 0x68FD1E64], [0x68FD1E64, 0x68FD1E64], [5, cr.EMPTY]])
    ids = cr.hashed_ids(values, 1000)
    assert ids[0, 0] == 0 and ids[2, 1] == 0 and (ids[:2, 1] == ids[1, 1]).all()
    assert ids[1, 0] != ids[1, 1]  # each field hashes with its own salt
    assert ids.tolist() == [[0, 653], [165, 653], [45, 0]]  # fixed across runs and machines
    many = cr.hashed_ids(np.arange(100_000).reshape(-1, 1), 50)
    assert many.min() == 1 and many.max() == 49


def test_vocabulary_from_counts_over_readers() -> None:
    values = np.array([[3], [3], [9], [cr.EMPTY], [7], [3], [9], [1]])
    whole = cr.value_counts(values)
    parts = cr.merge_counts([cr.value_counts(values[:3]), cr.value_counts(values[3:])])
    assert [a.tolist() for a in parts[0]] == [a.tolist() for a in whole[0]] == [[1, 3, 7, 9],
                                                                                [1, 3, 1, 2]]
    vocab = cr.Vocabulary.from_counts(parts, min_count=2)
    assert vocab.table_sizes() == [4]  # empty, rare, 3, 9
    new = np.array([[3], [9], [cr.EMPTY], [7], [100], [0]])
    assert vocab.ids(new)[:, 0].tolist() == [2, 3, 0, 1, 1, 1]
    assert cr.Vocabulary.from_counts(parts, 5).ids(new)[:, 0].tolist() == [1, 1, 0, 1, 1, 1]


def test_any_blocks_give_each_line_once_with_its_number(tmp_path: Path) -> None:
    path = tmp_path / "log.txt"
    lines = [row(str(i % 2), cats=[f"{i:x}", *["a"] * 25]) for i in range(300)]
    lines[40] = lines[41] = b""  # blank lines are no rows
    path.write_bytes(b"\n".join(lines[:150]) + b"\r\n" + b"\n".join(lines[150:]))
    size = path.stat().st_size
    want = [int(line.split(b"\t")[14], 16) for line in lines if line]
    for block in (97, 500, 3000, size):
        got = []
        for b in plan_blocks([(str(path), size)], block):
            got += [v for rows in cb.block_pieces(b.path, b.start, b.end, "log", False)
                    for v in rows.values[:, 0].tolist()]
        assert got == want, block
    lines[222] = b"1\t2"
    path.write_bytes(b"\n".join(lines[:150]) + b"\r\n" + b"\n".join(lines[150:]))
    errors = []
    for b in plan_blocks([(str(path), path.stat().st_size)], 5000):
        try:
            list(cb.block_pieces(b.path, b.start, b.end, "log", False))
        except cr.CriteoError as exc:
            errors.append(str(exc))
    assert errors == ["log: line 223: 2 tab-separated fields, expected 40 (label, 13 counts, "
                      "26 categorical)"]


# -- the recipe -----------------------------------------------------------------------


def write_log(path: Path, rows: int, seed: int = 0, bad: dict[int, bytes] | None = None) -> None:
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(rows):
        counts = ["" if rng.random() < 0.1 else str(int(rng.integers(-2, 50))) for _ in range(13)]
        cats = ["" if rng.random() < 0.1 else f"{int(rng.integers(0, 6)) * 0x11111111:08x}"
                for _ in range(26)]
        lines.append((bad or {}).get(i + 1, row(str(int(rng.random() < 0.3)), counts, cats)))
    data = b"\n".join(lines) + b"\n"
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)


def logs(root: Path) -> tuple[list[str], list[str]]:
    root.mkdir(exist_ok=True)
    write_log(root / "day_0.txt", 300, 0)
    write_log(root / "day_1.gz", 200, 1)
    write_log(root / "val.txt", 100, 2)
    return [str(root / "day_*")], [str(root / "val.txt")]


def test_the_recipe_writes_what_the_recsys_task_reads(tmp_path: Path, capsys) -> None:
    train, val = logs(tmp_path / "logs")
    out = tmp_path / "out"
    assert cp.main(["--files", *train, "--val-files", *val, "--out", str(out),
                    "--min-count", "20"]) == 0
    schema = validate_click_file(out / "train.h5")
    assert schema.num_samples == 500 and schema.dense_features == 13
    assert validate_click_file(out / "val.h5").table_sizes == schema.table_sizes
    with h5py.File(out / "train.h5") as f:
        # values k * 0x11111111 for k < 6, each seen about 500 * 0.9 / 6 times: all kept
        assert list(f.attrs["table_sizes"]) == [8] * 26
        assert f.attrs["id_rule"] == "vocabulary" and f.attrs["min_count"] == 20
        assert json.loads(f.attrs["field_names"])[0] == "C1"
        label = f["label"][:]
    assert abs(label.mean() - 0.3) < 0.06
    assert "wrote" in capsys.readouterr().out
    assert cp.main(["--files", *train, "--val-files", *val, "--out", str(out), "--buckets", "64",
                    "--overwrite"]) == 0
    with h5py.File(out / "val.h5") as f:
        assert list(f.attrs["table_sizes"]) == [64] * 26 and f["sparse"][:].max() < 64
        assert f.attrs["id_rule"] == "hash"


@pytest.mark.parametrize("name", ["day_0.txt", "day_1.gz"])
def test_a_bad_line_is_named_and_nothing_written(tmp_path: Path, capsys, name: str) -> None:
    train, val = logs(tmp_path / "logs")
    bad = tmp_path / "logs" / name
    write_log(bad, 150, 5, bad={77: row(counts=["1", "2", "three", *["0"] * 10])})
    out = tmp_path / "out"
    assert cp.main(["--files", *train, "--val-files", *val, "--out", str(out),
                    "--buckets", "100"]) == 2
    assert f"{bad}: line 77: count I3 = 'three' is not an integer" in capsys.readouterr().err
    assert not list(out.iterdir())
    assert cp.main(["--files", *train, "--val-files", *val, "--out", str(out),
                    "--buckets", "100", "--skip-bad"]) == 0
    assert "1 bad lines skipped" in capsys.readouterr().out
    others = 300 if name == "day_1.gz" else 200  # the rows of the file left as it was
    with h5py.File(out / "train.h5") as f:
        assert f.attrs["skipped_rows"] == 1 and f.attrs["num_samples"] == others + 149


@pytest.mark.parametrize(("named", "rule", "problem"), [
    ({}, ["--buckets", "1"], "--buckets must be in [2, 2**31)"),
    ({}, ["--min-count", "0"], "--min-count must be at least 1"),
    ({"--val-files": "NONE"}, ["--buckets", "5"], "--val-files NONE: no such file"),
    ({"--files": "NOPE*"}, ["--buckets", "5"], "--files NOPE*: matches no file"),
    ({"--files": "logs"}, ["--buckets", "5"], "--files logs: is a folder, not a click log"),
])
def test_bad_options(tmp_path: Path, capsys, monkeypatch, named: dict[str, str],
                     rule: list[str], problem: str) -> None:
    train, val = logs(tmp_path / "logs")
    monkeypatch.chdir(tmp_path)
    files = {"--files": train[0], "--val-files": val[0], **named}
    assert cp.main([*(x for kv in files.items() for x in kv), "--out", "out", *rule]) == 2
    assert problem in capsys.readouterr().err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["pipe.txt", "pipe.gz"])
def test_a_fifo_is_refused_before_it_is_opened(tmp_path: Path, capsys, name: str) -> None:
    _, val = logs(tmp_path / "logs")
    os.mkfifo(tmp_path / name)  # with no writer, opening it would block
    assert cp.main(["--files", str(tmp_path / name), "--val-files", *val, "--out",
                    str(tmp_path / "out"), "--buckets", "5"]) == 2
    assert f"{tmp_path / name}: not a regular file" in capsys.readouterr().err


def test_a_file_in_both_splits_and_an_existing_output(tmp_path: Path, capsys) -> None:
    train, val = logs(tmp_path / "logs")
    out = tmp_path / "out"
    assert cp.main(["--files", *train, "--val-files", str(tmp_path / "logs" / "day_0.txt"),
                    "--out", str(out), "--buckets", "9"]) == 2
    assert "day_0.txt: named in both --files and --val-files" in capsys.readouterr().err
    out.mkdir(exist_ok=True)
    (out / "val.h5").write_bytes(b"precious")
    assert cp.main(["--files", *train, "--val-files", *val, "--out", str(out),
                    "--buckets", "9"]) == 2
    assert f"{out / 'val.h5'} exists; pass --overwrite" in capsys.readouterr().err
    assert (out / "val.h5").read_bytes() == b"precious" and not (out / "train.h5").exists()


ODD = ["", "-", "1.5", "+3", " 1", "0x1", "é", "9" * 19, "123456789", "g", "2", "-0"]
COUNT = st.sampled_from(["", "0", "1", "-1", "12", "007", "9" * 18])
HEX = st.sampled_from(["", "0", "a", "FF", "deadBEEF", "12345678"])


def _line_fields(label: str, counts: list[str], cats: list[str], change: tuple[int, str] | None,
                 length: int) -> list[str]:
    """A valid line's fields with at most one field changed to an odd value, and maybe one
    field too many or too few."""
    fields = [label, *counts, *cats]
    if change is not None:
        fields[change[0]] = change[1]
    return (fields + ["0"])[:length]


LINE_FIELDS = st.builds(_line_fields, st.sampled_from(["0", "1"]),
                        st.lists(COUNT, min_size=13, max_size=13),
                        st.lists(HEX, min_size=26, max_size=26),
                        st.one_of(st.none(), st.tuples(st.integers(0, 39), st.sampled_from(ODD))),
                        st.sampled_from([40, 40, 40, 39, 41]))


@settings(max_examples=400, deadline=None)
@given(st.lists(LINE_FIELDS, min_size=1, max_size=8))
def test_parse_lines_agrees_with_parse_line(rows: list[list[str]]) -> None:
    """The pattern-and-convert path takes and refuses exactly the lines `parse_line` does, and
    reads them alike."""
    lines = ["\t".join(fields).encode() for fields in rows]
    expected, bad = [], 0
    for line in lines:
        try:
            expected.append(cr.parse_line(line))
        except cr.CriteoError:
            bad += 1
    got = cr.parse_lines(lines, "f", skip_bad=True)
    assert got.skipped == bad and len(got.label) == len(expected)
    for i, (label, counts, values) in enumerate(expected):
        assert (got.label[i], got.counts[i].tolist(), got.values[i].tolist()) == (
            label, counts, values)


def test_parse_lines_reads_what_parse_line_reads() -> None:
    lines = [row("0", ["", "-1", "5", *["123456789012345678"] * 10],
                 ["", "68fd1e64", "ABCDEF01", "7", "0", "ffffffff", *["a"] * 20])]
    got = cr.parse_lines(lines * 3, "f")
    label, counts, values = cr.parse_line(lines[0])
    assert got.label.tolist() == [label] * 3 and got.counts[2].tolist() == counts
    assert got.values[1].tolist() == values


def test_a_damaged_gzip_file_is_named_and_nothing_left(tmp_path: Path, capsys) -> None:
    train, val = logs(tmp_path / "logs")
    damaged = tmp_path / "logs" / "day_1.gz"
    damaged.write_bytes(damaged.read_bytes()[:-40])
    out = tmp_path / "out"
    assert cp.main(["--files", *train, "--val-files", *val, "--out", str(out),
                    "--buckets", "10"]) == 2
    assert f"{damaged}: cannot be decompressed after line" in capsys.readouterr().err
    assert not list(out.iterdir())  # no file, no work folder
