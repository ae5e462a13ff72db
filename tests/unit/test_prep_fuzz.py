"""`hpcdp prep` and the dataset recipes refuse bad input: measured cases, then generated input.

Every refusal must exit 2 with `hpcdp prep: error:` naming the option or file
and the problem, create nothing (the output folder included) and leave any
file already there as it was. Examples are derandomized and bounded, so the
run takes seconds; a failure prints the falsifying example to reproduce it.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from io import BytesIO, StringIO
from pathlib import Path

import h5py
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcdp.data.prep import cli as prep

REPO = Path(__file__).resolve().parents[2]
FUZZ = settings(max_examples=40, deadline=None, derandomize=True, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow])


def run(argv: list[str]) -> tuple[int, str]:
    """prep.main in this process: (exit status, stderr); argparse's SystemExit counts too."""
    err = StringIO()
    with redirect_stderr(err), redirect_stdout(StringIO()):
        try:
            code = prep.main(argv)
        except SystemExit as exc:  # argparse: usage error, status 2
            code = int(exc.code or 0)
    text = err.getvalue()
    assert "Traceback" not in text, text
    return code, text


@contextmanager
def workdir() -> Iterator[Path]:
    """A fresh folder per generated example (pytest's tmp_path is one per test)."""
    with tempfile.TemporaryDirectory(prefix="hpcdp-fuzz-") as d:
        yield Path(d)


def refused(argv: list[str], out: Path, *needles: str) -> str:
    """Run, and check the refusal: status 2, every needle in the message, nothing created."""
    existed = sorted(os.listdir(out)) if out.is_dir() else None
    code, err = run([*argv, "--out", str(out)])
    assert code == 2, (argv, code, err)
    for needle in needles:
        assert needle in err, (argv, needle, err)
    assert (sorted(os.listdir(out)) if out.is_dir() else None) == existed, "output changed"
    return err


# -- the three measured cases -----------------------------------------------------------


def test_a_shape_with_a_word_in_it_is_refused_naming_the_part(tmp_path: Path) -> None:
    err = refused(["synthetic", "--samples", "10", "--shape", "3,x,3"], tmp_path / "o",
                  "--shape", "'x'")
    assert "hpcdp prep: error:" in err


def test_a_text_file_is_not_a_npy_file_not_pickled_data(tmp_path: Path) -> None:
    (tmp_path / "notnpy.npy").write_text("hello")
    err = refused(["arrays", "--x", str(tmp_path / "notnpy.npy")], tmp_path / "o",
                  f"{tmp_path / 'notnpy.npy'}: not a .npy file")
    assert "pickle" not in err


def test_an_existing_output_file_is_kept_unless_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "data"
    out.mkdir()
    old = out / "train.h5"
    old.write_bytes(b"a dataset that took hours")
    old.chmod(0o444)
    argv = ["synthetic", "--samples", "20", "--shape", "4", "--val-samples", "5"]
    refused(argv, out, str(old), "already exists", "--overwrite")
    assert old.read_bytes() == b"a dataset that took hours"
    # A val.h5 alone is protected as well, and named.
    old.unlink()
    (out / "val.h5").write_bytes(b"old val")
    refused(argv, out, str(out / "val.h5"), "--overwrite")
    # With --overwrite both are replaced, and no temporary file is left.
    code, err = run([*argv, "--out", str(out), "--overwrite"])
    assert code == 0, err
    assert sorted(os.listdir(out)) == ["train.h5", "val.h5"]
    with h5py.File(out / "val.h5") as f:
        assert f["x"].shape == (5, 4)


def test_the_recipes_exit_2_without_a_traceback(tmp_path: Path) -> None:
    """The recipes as a user types them: real exit status, real stderr."""
    (tmp_path / "notnpy.npy").write_text("hello")
    cases = [
        ("synthetic.py", ["--samples", "10", "--shape", "3,x,3"], "--shape '3,x,3'"),
        ("arrays.py", ["--x", "notnpy.npy"], "not a .npy file"),
        ("digits.py", ["--val-fraction", "nan"], "--val-fraction"),
    ]
    for recipe, args, needle in cases:
        done = subprocess.run([sys.executable, str(REPO / "datasets" / recipe), *args,
                               "--out", "o"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=120, check=False)
        assert done.returncode == 2, (recipe, done.stderr)
        assert needle in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert not (tmp_path / "o").exists()


# -- generated command lines -------------------------------------------------------------

# Text as a shell hands it over: anything but NUL (which argv cannot carry).
ARG_TEXT = st.text(st.characters(blacklist_characters="\0"), max_size=12)
GOOD_PART = st.integers(1, 4).map(str)
BAD_PART = st.one_of(
    st.sampled_from(["", "0", "x", "-1", "+2", " ", "1.5", "3e2", "٣", "0x3", "2_0", "nan"]),
    # Not a number, and no long digit runs (a valid 1,99999999 would only be slow).
    ARG_TEXT.filter(lambda t: not t.strip().isdigit() and not re.search(r"\d{4}", t)),
)


@FUZZ
@given(parts=st.lists(st.one_of(GOOD_PART, BAD_PART), min_size=1, max_size=4),
       sep=st.sampled_from(",x"))
def test_generated_shapes_either_work_or_name_the_bad_part(parts: list[str], sep: str) -> None:
    text = sep.join(parts)
    with workdir() as d:
        code, err = run(["synthetic", "--samples", "3", "--shape", text, "--classes", "1",
                         "--out", str(d / "o")])
        if code == 0:
            shape = tuple(int(p) for p in text.replace("x", ",").split(","))
            with h5py.File(d / "o" / "train.h5") as f:
                assert f["x"].shape == (3, *shape), text
        else:
            assert code == 2 and "--shape" in err, (text, err)
            assert not (d / "o").exists()


NOT_NUMERIC = ["object", "str", "U5", "S3", "complex64", "bool", "datetime64[s]", "V8",
               "i4,i4", "(2,)i4", "", "int33", "float7", " ", "m8", "O", "?", "c16", "a"]


@FUZZ
@given(dtype=st.one_of(st.sampled_from(NOT_NUMERIC), ARG_TEXT))
def test_generated_dtypes_either_work_or_are_refused(dtype: str) -> None:
    with workdir() as d:
        code, err = run(["synthetic", "--samples", "3", "--shape", "2", "--dtype", dtype,
                         "--out", str(d / "o")])
        if code == 0:
            with h5py.File(d / "o" / "train.h5") as f:
                assert f["x"].dtype == np.dtype(dtype) and f["x"].dtype.kind in "uif"
        else:
            assert code == 2 and "--dtype" in err, (dtype, err)
            assert not (d / "o").exists()


BAD_NUMBERS = st.one_of(
    st.tuples(st.just("--samples"), st.integers(max_value=0)),
    st.tuples(st.just("--samples"), st.integers(10**13, 10**40)),  # no disk holds that
    st.tuples(st.just("--classes"), st.integers(max_value=0)),
    st.tuples(st.just("--classes"), st.integers(10**10, 10**30)),  # templates beyond memory
    st.tuples(st.just("--val-samples"), st.integers(max_value=-1)),
    st.tuples(st.just("--seed"), st.one_of(st.integers(max_value=-1), st.integers(2**63))),
    st.tuples(st.just("--chunk-mib"), st.one_of(
        st.floats(max_value=0.0), st.floats(min_value=4096.0), st.just(math.nan))),
    st.tuples(st.sampled_from(["--samples", "--classes", "--seed", "--val-samples", "--shape",
                               "--dtype", "--chunk-mib"]),
              st.sampled_from(["", "ten", "1e3x", "--"])),
)


@FUZZ
@given(bad=BAD_NUMBERS)
def test_generated_bad_numbers_are_refused_naming_the_option(bad: tuple[str, object]) -> None:
    flag, value = bad
    argv = ["synthetic", "--samples", "3", "--shape", "2", f"{flag}={value}"]
    # Too many samples for the disk: the message gives the sizes and the free space.
    too_big = flag == "--samples" and isinstance(value, int) and value > 0
    with workdir() as d:
        refused(argv, d / "o", *(("samples of", "GiB free") if too_big else (flag,)))


NAME_FLAGS = ["--x-name", "--y-name"]


@FUZZ
@given(flag=st.sampled_from([*NAME_FLAGS, "--split"]),
       name=st.one_of(st.sampled_from(["", ".", "..", "a/b", "/", " x", "x ", "\udcff", "y", "--"]),
                      ARG_TEXT))
def test_generated_names_either_work_or_are_refused(flag: str, name: str) -> None:
    with workdir() as d:
        np.save(d / "x.npy", np.zeros((4, 2), np.float32))
        np.save(d / "y.npy", np.arange(4))
        argv = ["arrays", "--x", str(d / "x.npy"), "--y", str(d / "y.npy"), f"{flag}={name}",
                "--out", str(d / "o")]
        code, err = run(argv)
        if code == 0:
            (file,) = os.listdir(d / "o")
            with h5py.File(d / "o" / file) as f:
                expect = {"--x-name": (name, "y"), "--y-name": ("x", name or None)}.get(flag)
                if expect is not None:
                    assert set(f) == {n for n in expect if n}
                else:
                    assert file == f"{name}.h5"
        else:
            assert code == 2 and flag in err, (flag, name, err)
            assert not (d / "o").exists()


# -- generated input files -----------------------------------------------------------------


def _npy_bytes(arr: np.ndarray) -> bytes:
    buf = BytesIO()
    np.save(buf, arr, allow_pickle=True)
    return buf.getvalue()


GOOD_NPY = _npy_bytes(np.arange(24, dtype=np.float32).reshape(6, 4))
BAD_X = st.one_of(
    st.just(b""),
    st.binary(max_size=64),
    st.text(max_size=40).map(str.encode),
    st.integers(0, len(GOOD_NPY) - 1).map(lambda n: GOOD_NPY[:n]),  # truncated anywhere
    st.binary(max_size=40).map(lambda junk: b"\x93NUMPY\x01\x00" + junk),  # damaged header
    st.sampled_from([
        _npy_bytes(np.array(["a", "bc"])),  # text values
        _npy_bytes(np.array([1 + 2j, 3j])),  # complex
        _npy_bytes(np.array([object(), None], dtype=object)),  # pickled objects
        _npy_bytes(np.array(["2020-01-01"], dtype="datetime64[D]")),
        _npy_bytes(np.zeros((0, 3))),  # no samples
        _npy_bytes(np.float32(1.0)),  # a single value
        _npy_bytes(np.zeros((3, 0))),  # samples without values
        _npy_bytes(np.zeros((3, 2), dtype="i4,f4")),  # a record per row
        b"PK\x03\x04" + b"\0" * 40,  # a zip given a .npy name
        b"\x89HDF\r\n\x1a\n" + b"\0" * 40,
    ]),
)


@FUZZ
@given(content=BAD_X, suffix=st.sampled_from([".npy", ".npz"]))
def test_generated_bad_sample_files_are_refused_naming_the_file(content: bytes,
                                                               suffix: str) -> None:
    with workdir() as d:
        x = d / f"x{suffix}"
        x.write_bytes(content)
        refused(["arrays", "--x", str(x), "--y-key", ""], d / "o", str(x))


BAD_Y = st.sampled_from([
    np.array([0.0, 1.0, math.nan, 2.0, 1.0, 0.0]),  # NaN where integers are expected
    np.array([0.0, math.inf, 1.0, 2.0, 1.0, 0.0]),
    np.array([0, 1, -1, 2, 1, 0]),  # a negative class
    np.array([0, 1, 2, 3, 4], np.int64),  # one label short
    np.zeros((6, 2), np.int64),  # not one-dimensional
    np.array(["a"] * 6),
    np.array([2**64 - 1] * 6, np.uint64),  # beyond int64
])


@FUZZ
@given(y=BAD_Y, packed=st.booleans())
def test_generated_bad_labels_are_refused_naming_the_file(y: np.ndarray, packed: bool) -> None:
    x = np.zeros((6, 4), np.float32)
    with workdir() as d:
        if packed:  # one .npz holding both
            np.savez(d / "xy.npz", x=x, y=y)
            argv, named = ["arrays", "--x", str(d / "xy.npz")], d / "xy.npz"
        else:
            np.save(d / "x.npy", x)
            np.save(d / "y.npy", y)
            argv, named = ["arrays", "--x", str(d / "x.npy"), "--y", str(d / "y.npy")], d / "y.npy"
        refused(argv, d / "o", str(named))


def test_npz_problems_name_the_file_and_the_member(tmp_path: Path) -> None:
    np.savez(tmp_path / "a.npz", data=np.zeros((4, 2)))
    refused(["arrays", "--x", str(tmp_path / "a.npz")], tmp_path / "o",
            "no array 'x' (it holds: data)")
    np.savez_compressed(tmp_path / "c.npz", x=np.zeros((4, 2)))
    refused(["arrays", "--x", str(tmp_path / "c.npz"), "--y-key", ""], tmp_path / "o",
            "compressed")
    full = (tmp_path / "a.npz").read_bytes()
    (tmp_path / "t.npz").write_bytes(full[: len(full) // 2])
    refused(["arrays", "--x", str(tmp_path / "t.npz"), "--x-key", "data", "--y-key", ""],
            tmp_path / "o", str(tmp_path / "t.npz"))
    (tmp_path / "dir.npy").mkdir()
    refused(["arrays", "--x", str(tmp_path / "dir.npy")], tmp_path / "o", "is a folder")


# -- output folders ------------------------------------------------------------------------


def test_bad_output_places_are_refused(tmp_path: Path) -> None:
    argv = ["synthetic", "--samples", "3", "--shape", "2"]
    (tmp_path / "afile").write_text("keep me")
    refused(argv, tmp_path / "afile", "exists and is not a folder")
    refused(argv, tmp_path / "afile" / "sub", "is not a folder")
    assert (tmp_path / "afile").read_text() == "keep me"
    (tmp_path / "d" / "train.h5").mkdir(parents=True)
    refused([*argv, "--overwrite"], tmp_path / "d", "train.h5 is a folder")
    for bad in ("", "--"):
        code, err = run([*argv, f"--out={bad}"])
        assert code == 2 and "--out" in err
    code, err = run([*argv, "--out", str(tmp_path / "r"), "--report", str(tmp_path / "no" / "r")])
    assert code == 2 and "--report" in err and not (tmp_path / "r").exists()


@settings(FUZZ, max_examples=10)  # each example loads the digits
@given(fraction=st.one_of(st.floats(max_value=-1e-9), st.floats(min_value=1.0),
                          st.just(math.nan)))
def test_digits_refuses_a_bad_validation_fraction(fraction: float) -> None:
    with workdir() as d:
        refused(["digits", f"--val-fraction={fraction}"], d / "o", "--val-fraction")
