"""Hostile and broken image files and export bundles: each refused with exit status 2 (or
skipped and listed with --skip-bad) naming the file, nothing written, no outside program
started, within a memory cap and a time limit.

One child process (hostile_inputs_child.py) runs every case's command in turn, its address
space (RLIMIT_AS) capped at what its imports took plus `CAP_OVER_IMPORTS_MIB`, with `gs` on
PATH a script that records being run; each case gets at most `CASE_SECONDS` before it
counts as hung. Measured here: the cases add ~10 MB of address space and ~10 MB resident
to the imports (0.65 GB and 0.24 GB with a CPU torch, 3.1 GB and 0.54 GB with a CUDA
one), each case well under 0.1 s; decoding the 9600 x 9600 16-bit PNG alone would take
1.85 GB.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch
from PIL import Image

from hpcdp.export import bundle
from hpcdp.models import spec as specs

pytestmark = pytest.mark.slow  # one child process of seconds (its imports)

REPO = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("hostile_inputs_child.py")
#: The address space the cases may add to the child's imports: far more than they need,
#: far less than decoding the crafted PNG would.
CAP_OVER_IMPORTS_MIB = 768
#: Seconds a case may take before it counts as hung.
CASE_SECONDS = 30
#: What a case may cost: seconds (a busy machine's margin over ~0.01 s) and the child's
#: peak resident MiB over what its imports took.
BOUND_SECONDS, BOUND_OVER_IMPORTS_MIB = 5.0, 256

EPS = (b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n"
       b"0 0 moveto 10 10 lineto stroke\nshowpage\n%%EOF\n")
DIGITS = {"name": "digits_cnn", "in_channels": 1, "num_classes": 3, "width": 4,
          "cifar_stem": False, "image_size": 8}
INPUT = {"layout": "NCHW", "channels": 1, "image_size": 8, "scale": 255.0, "mean": 0.0,
         "std": 1.0, "num_classes": 3, "class_names": None}


def psd(w: int = 4, h: int = 4) -> bytes:
    """A minimal RGB Photoshop file (header, three empty sections, raw planes)."""
    head = b"8BPS" + struct.pack(">H6sHIIHH", 1, bytes(6), 3, h, w, 8, 3)
    return head + struct.pack(">IIIH", 0, 0, 0, 0) + bytes(3 * w * h)


def big_png(path: Path, side: int = 9600) -> None:
    """A side x side 16-bit grey PNG of zeros: 384 KB that decode to 184 MB of pixels."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))

    # Zero rows as one deflate block repeated: after a full flush a block depends on no
    # earlier data, so one row is compressed, not 184 MB.
    row = bytes(1 + 2 * side)  # filter byte, then the row's 16-bit samples
    packer = zlib.compressobj(9)
    first = packer.compress(row) + packer.flush(zlib.Z_FULL_FLUSH)
    again = packer.compress(row) + packer.flush(zlib.Z_FULL_FLUSH)
    end = packer.flush()[:-4]  # the final empty block, less the checksum of two rows
    adler = struct.pack(">I", (len(row) * side % 65521) << 16 | 1)  # of all-zero data
    idat = first + again * (side - 1) + end + adler
    ihdr = struct.pack(">IIBBBBB", side, side, 16, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat)
                     + chunk(b"IEND", b""))


def image_root(root: Path, classes: tuple[str, ...] = ("a", "b")) -> Path:
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (12, 10), (40 * i, 90, 200)).save(root / c / f"{i}.png")
    return root


def export_dir(folder: Path) -> Path:
    torch.manual_seed(0)
    return bundle.write(folder, specs.own_tensors(specs.build(DIGITS)),
                        {"task": "image", "model": DIGITS, "input": INPUT})


def edit_config(folder: Path, change) -> Path:
    config = json.loads((folder / bundle.CONFIG).read_text())
    change(config)
    (folder / bundle.CONFIG).write_text(json.dumps(config))
    return folder


def copy_export(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for name in (bundle.WEIGHTS, bundle.CONFIG):
        (dst / name).write_bytes((src / name).read_bytes())
    return dst


def build_cases(tmp: Path) -> list[dict]:
    """Every case's input under `tmp`, and its command line."""
    cases = []

    def prep(name: str, root: Path, *extra: str) -> None:
        cases.append({"name": name, "command": "prep", "argv": [
            "--root", str(root), "--out", str(tmp / "out" / name), "--size", "8", *extra]})

    def predict(name: str, export: Path, *files: Path) -> None:
        cases.append({"name": name, "command": "predict",
                      "argv": [str(export), *map(str, files)]})

    root = image_root(tmp / "eps")
    (root / "a" / "photo.jpg").write_bytes(EPS)
    prep("eps_as_jpg", root)
    root = image_root(tmp / "tiff")
    Image.new("RGB", (8, 8)).save(root / "a" / "scan.jpeg", format="TIFF")
    prep("tiff_as_jpeg", root)
    root = image_root(tmp / "psd")
    (root / "b" / "layers.jpg").write_bytes(psd())
    prep("psd_as_jpg", root)
    root = image_root(tmp / "big")
    big_png(root / "a" / "huge.png")
    prep("big_png", root)
    prep("big_png_skipped", root, "--skip-bad")
    root = image_root(tmp / "fifo")
    os.mkfifo(root / "a" / "fifo.jpg")
    prep("fifo", root)
    prep("fifo_skipped", root, "--skip-bad")
    outside = image_root(tmp / "elsewhere", ("c",))
    root = image_root(tmp / "classlink")
    (root / "c").symlink_to(outside / "c")
    prep("class_link_outside", root)
    prep("class_link_followed", root, "--follow-symlinks")
    root = image_root(tmp / "sublink")
    (root / "a" / "sub").symlink_to(outside / "c")
    prep("subfolder_link_outside", root)
    root = image_root(tmp / "sublink_in")
    image_root(root / ".pool", ("more",))
    (root / "a" / "sub").symlink_to(root / ".pool" / "more")
    (root / "b" / "loop").symlink_to(root / "b")
    prep("subfolder_link_inside", root)
    root = image_root(tmp / "names")
    (root / "a" / os.fsdecode(b"notes\xff.txt")).write_text("x")
    (root / "b" / os.fsdecode(b"bad\xfe.png")).write_bytes(b"not a png")
    prep("non_utf8_names", root, "--skip-bad")

    good = export_dir(tmp / "export")
    predict("predict_eps", good, tmp / "eps" / "a" / "photo.jpg")
    predict("predict_bomb_grey", good, tmp / "big" / "a" / "huge.png")
    predict("predict_fifo", good, tmp / "fifo" / "a" / "fifo.jpg")
    ok = tmp / "eps" / "a" / "0.png"
    odd = tmp / os.fsdecode(b"ok\xff.png")
    odd.write_bytes(ok.read_bytes())
    predict("predict_non_utf8_name", good, odd)
    zero = edit_config(copy_export(good, tmp / "x_zero"), lambda c: c["weights"].update(
        file="/dev/zero", bytes=0))
    predict("bundle_dev_zero", zero, ok)
    (tmp / "stolen.safetensors").write_bytes((good / bundle.WEIGHTS).read_bytes())
    up = edit_config(copy_export(good, tmp / "x_up"), lambda c: c["weights"].update(
        file="../stolen.safetensors"))
    (up / bundle.WEIGHTS).unlink()
    predict("bundle_dotdot", up, ok)
    huge = edit_config(copy_export(good, tmp / "x_huge"), lambda c: c["model"].update(
        num_classes=10**9))
    predict("bundle_huge_shape", huge, ok)
    fifo = copy_export(good, tmp / "x_fifo")
    (fifo / bundle.CONFIG).unlink()
    os.mkfifo(fifo / bundle.CONFIG)
    predict("bundle_config_fifo", fifo, ok)
    cases.append({"name": "generate_nan", "command": "generate",
                  "argv": [str(good), "--temperature", "nan"]})
    return cases


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> tuple[dict, Path]:
    tmp = tmp_path_factory.mktemp("hostile")
    (tmp / "cases.json").write_text(json.dumps(build_cases(tmp)))
    (tmp / "bin").mkdir()
    gs = tmp / "bin" / "gs"
    gs.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp / 'gs-ran'}\nexit 1\n")
    gs.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp / 'bin'}:{os.environ['PATH']}",
           "PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO)),
           "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, str(CHILD), str(tmp / "cases.json"),
                    str(tmp / "results.json"), str(CASE_SECONDS), str(CAP_OVER_IMPORTS_MIB)],
                   env=env, cwd=tmp, timeout=CASE_SECONDS * 25, capture_output=True)
    return json.loads((tmp / "results.json").read_text()), tmp


#: case -> (exit status, what stderr (2) or stdout (0) must hold).
EXPECTED = {
    "eps_as_jpg": (2, ["photo.jpg: cannot decode as JPEG", "EPS data"]),
    "tiff_as_jpeg": (2, ["scan.jpeg: cannot decode as JPEG", "TIFF data"]),
    "psd_as_jpg": (2, ["layers.jpg: cannot decode as JPEG", "PSD data"]),
    "big_png": (2, ["huge.png: 9600 x 9600 = 92,160,000 pixels", "--max-pixels"]),
    "big_png_skipped": (0, ["--skip-bad left out 1 file(s)", "huge.png"]),
    "fifo": (2, ["fifo.jpg: a FIFO, not a regular file"]),
    "fifo_skipped": (0, ["--skip-bad left out 1 file(s)", "fifo.jpg: a FIFO"]),
    "class_link_outside": (2, ["1 link(s) lead outside --root", "classlink/c ->",
                               "--follow-symlinks"]),
    "class_link_followed": (0, ["3 classes"]),
    "subfolder_link_outside": (2, ["a/sub ->", "--follow-symlinks"]),
    "subfolder_link_inside": (0, ["train.h5: 6 images", "b/loop (a folder read already"]),
    "non_utf8_names": (0, ["bad\\xfe.png", "notes\\xff.txt"]),
    "predict_eps": (2, ["photo.jpg: cannot decode as JPEG", "EPS data"]),
    "predict_bomb_grey": (2, ["huge.png: 9600 x 9600", "--max-pixels"]),
    "predict_fifo": (2, ["fifo.jpg: a FIFO, not a regular file"]),
    "predict_non_utf8_name": (0, ["ok\\xff.png: "]),
    "bundle_dev_zero": (2, ["config.json: weights.file '/dev/zero' is not a plain file name"]),
    "bundle_dotdot": (2, ["weights.file '../stolen.safetensors' is not a plain file name"]),
    "bundle_huge_shape": (2, ["model.safetensors: head.", "needs F32 [1000000000"]),
    "bundle_config_fifo": (2, ["config.json: not a regular file"]),
    "generate_nan": (2, ["--temperature nan: expected a finite number"]),
}


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_hostile_input_is_refused_naming_it_within_bounds(table, case: str) -> None:
    results, tmp = table
    assert case in results, f"the child did not reach {case} (killed?)"
    got = results[case]
    status, words = EXPECTED[case]
    assert got["error"] is None, got
    assert got["rc"] == status, got
    text = got["err"] if status else got["out"]
    for word in words:
        assert word in text, (word, text)
    assert got["seconds"] < BOUND_SECONDS
    assert got["peak_mib"] - results["imported_peak_mib"] < BOUND_OVER_IMPORTS_MIB
    out = tmp / "out" / case
    if status:
        assert not out.exists() or not any(out.iterdir())
    assert not (tmp / "gs-ran").exists(), "Ghostscript was started"
