"""What an image file must be before any decoder sees it, and what a folder scan reads."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from PIL import Image

from hpcdp.data.format.image_decode import (
    DecodeError,
    check_content,
    decode,
    decode_grey,
    sniff,
)
from hpcdp.data.prep.bounded import shown
from hpcdp.data.prep.images import folder


def encoded(fmt: str, size: tuple[int, int] = (12, 10)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (10, 200, 30)).save(buf, format=fmt)
    return buf.getvalue()


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "BMP", "WEBP", "TIFF", "GIF", "EPS"])
def test_signatures_name_the_format(fmt: str) -> None:
    assert sniff(encoded(fmt)[:16]) == fmt


@pytest.mark.parametrize(("name", "fmt", "ok"), [
    ("a.JPG", "JPEG", True), ("a.jpeg", "JPEG", True), ("a.png", "PNG", True),
    ("a.webp", "WEBP", True), ("a.bmp", "BMP", True), ("a.jpg", "PNG", False),
    ("a.png", "JPEG", False), ("a.tif", "TIFF", False), ("a.gif", "GIF", False),
])
def test_content_must_be_the_format_its_name_says(name: str, fmt: str, ok: bool) -> None:
    head = encoded(fmt)[:16]
    if ok:
        assert check_content(head, name) == fmt
    else:
        with pytest.raises(DecodeError, match=name.replace(".", r"\.")):
            check_content(head, name)


def test_the_pixel_limit_is_the_images_width_times_height(tmp_path: Path) -> None:
    (tmp_path / "x.png").write_bytes(encoded("PNG", (12, 10)))
    assert decode(str(tmp_path / "x.png"), 4, max_pixels=120).shape == (3, 4, 4)
    assert decode_grey(str(tmp_path / "x.png"), 4, max_pixels=120).shape == (1, 4, 4)
    for read in (decode, decode_grey):
        with pytest.raises(DecodeError, match=r"x\.png: 12 x 10 = 120 pixels, over the limit "
                                              "of 119 \\(--max-pixels"):
            read(str(tmp_path / "x.png"), 4, max_pixels=119)


def test_a_file_object_is_judged_by_the_name_given(tmp_path: Path) -> None:
    data = encoded("PNG")
    assert decode(io.BytesIO(data), 4, name="member.png").shape == (3, 4, 4)
    with pytest.raises(DecodeError, match="member.jpg: cannot decode as JPEG"):
        decode(io.BytesIO(data), 4, name="member.jpg")


def test_non_utf8_names_are_shown_escaped() -> None:
    name = os.fsdecode(b"caf\xe9.png")
    assert shown(name) == "caf\\xe9.png"
    assert shown("café.png") == "café.png"


def make_class(root: Path, name: str, files: int = 1) -> Path:
    (root / name).mkdir(parents=True)
    for i in range(files):
        (root / name / f"{i}.png").write_bytes(encoded("PNG"))
    return root / name


def test_a_file_link_out_of_the_root_is_refused_unless_followed(tmp_path: Path) -> None:
    outside = make_class(tmp_path / "else", "x")
    root = tmp_path / "root"
    make_class(root, "a")
    (root / "a" / "far.png").symlink_to(outside / "0.png")
    with pytest.raises(folder.FolderError, match=r"(?s)a/far\.png -> .*follow-symlinks"):
        folder.scan(str(root))
    layout = folder.scan(str(root), follow_symlinks=True)
    assert len(layout.splits["train"]) == 2


def test_links_inside_the_root_are_read_once_and_broken_ones_counted(tmp_path: Path) -> None:
    root = tmp_path / "root"
    make_class(root, "a", 2)
    make_class(root, "b", 1)
    (root / "a" / "copy").symlink_to(root / "b")  # another class: not read twice
    (root / "a" / "gone.png").symlink_to(root / "missing.png")
    (root / "b" / "twin.png").symlink_to(root / "a" / "0.png")  # a file: read as b's
    layout = folder.scan(str(root))
    labels = sorted(e.label for e in layout.splits["train"])
    assert labels == [0, 0, 1, 1]
    assert layout.skipped_other == 2
    assert any("a/copy (a folder read already" in x for x in layout.skipped_examples)
    assert any("gone.png (a broken link)" in x for x in layout.skipped_examples)
