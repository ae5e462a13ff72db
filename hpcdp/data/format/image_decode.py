"""One image file -> a (3, S, S) uint8 array, by stated rules (training prep and prediction).

The rules, in order:

1. Decode with Pillow, then apply the EXIF orientation (photos stored sideways
   come out upright).
2. Convert to RGB: grey (L, I, I;16, F: 16-bit and float values clipped to
   0..255), CMYK and YCbCr through Pillow's conversion; palette images through
   their palette; an alpha channel (RGBA, LA, PA, a palette's transparency) is
   composited over white, so transparent pixels are white whatever colour
   they happen to store.
3. Fit to S x S (`FITS`):
   - ``crop`` (default): resize so the shorter side is S (bilinear, with
     Pillow's antialiasing when shrinking; the longer side rounded to the
     nearest pixel), then cut the centre S x S (odd margins leave the extra
     pixel on the right / bottom);
   - ``stretch``: resize to S x S, ignoring the aspect ratio;
   - ``pad``: resize so the longer side is S, then centre on a black S x S.

JPEGs are decoded at a reduced scale when that still leaves the shorter side
at least S (Pillow's draft mode: 2-8x faster on photos), which is part of the
rule: the same file always gives the same array.

What is opened at all (before rule 1), so that a crafted file can neither start an
outside program (Pillow runs Ghostscript for EPS) nor reach a decoder the recipe
never meant to use, nor take memory out of proportion to the image:

- only a regular file: FIFOs, devices, sockets and folders are refused by their
  `stat` before any `open` (a FIFO's open would wait forever), and checked again
  on the open descriptor;
- only the formats in `FORMATS`, by name *and* content: the suffix says the one
  format Pillow may try, and the first bytes must be that format's signature
  (an EPS, TIFF or PSD file named ``.jpg`` is refused, naming what it holds);
- at most `MAX_PIXELS` pixels (width x height, read from the header before any
  pixel is decoded): more is an error naming the file and the option that raises
  the limit, not Pillow's warning.
"""

from __future__ import annotations

import os
import stat
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

import numpy as np
from PIL import Image, ImageOps

from hpcdp.data.prep.bounded import shown

FITS = ("crop", "stretch", "pad")

#: An image file's suffix (any case) -> the one Pillow format its content must be.
#: JPEG, PNG, BMP and WebP: what photo and dataset folders hold; TIFF, GIF, EPS, PSD and
#: the rest of Pillow's formats are refused (their decoders are the larger attack surface).
FORMATS = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".bmp": "BMP", ".webp": "WEBP"}
#: The suffixes of `FORMATS`, for listing folders.
EXTENSIONS = tuple(FORMATS)
#: Default limit on an image's pixels (width x height): 8192 x 8192.
MAX_PIXELS = 8192 * 8192

_WHITE = (255, 255, 255)
#: Leading bytes -> the format they begin (the accepted ones, and the dangerous ones a
#: refusal should name).
_SIGNATURES = ((b"\xff\xd8\xff", "JPEG"), (b"\x89PNG\r\n\x1a\n", "PNG"), (b"BM", "BMP"),
               (b"%!PS", "EPS"), (b"\xc5\xd0\xd3\xc6", "EPS"), (b"II*\x00", "TIFF"),
               (b"MM\x00*", "TIFF"), (b"8BPS", "PSD"), (b"GIF8", "GIF"))


class DecodeError(ValueError):
    """A file Pillow cannot read as an image; the message names it."""


def format_of_name(name: str) -> str | None:
    """The format a file's suffix says (`FORMATS`), or None for any other name."""
    return FORMATS.get(os.path.splitext(name)[1].lower())


def sniff(head: bytes) -> str | None:
    """The format whose signature `head` (a file's first bytes) begins with, or None."""
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    return next((fmt for sig, fmt in _SIGNATURES if head.startswith(sig)), None)


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def not_regular(mode: int) -> str | None:
    """What a non-regular file is ("a FIFO", ...), or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), "not a regular file")


def open_regular(path: str) -> IO[bytes]:
    """`path` opened for reading if it is a regular file, else `DecodeError` naming it.

    `stat` first, so that nothing else is ever opened; the open is non-blocking and
    the descriptor checked again, so a file swapped for a FIFO meanwhile cannot hang."""
    try:
        kind = not_regular(os.stat(path).st_mode)
        if kind is None:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            kind = not_regular(os.fstat(fd).st_mode)
            if kind is None:
                os.set_blocking(fd, True)
                return os.fdopen(fd, "rb")
            os.close(fd)
    except OSError as exc:
        raise DecodeError(f"{shown(path)}: cannot be read: {exc.strerror or exc}") from None
    raise DecodeError(f"{shown(path)}: {kind}, not a regular file: refused unread")


def check_content(head: bytes, name: str) -> str:
    """The format `name`'s suffix says, after checking the content's signature agrees."""
    want = format_of_name(name)
    if want is None:
        raise DecodeError(f"{shown(name)}: not an accepted image name (suffixes: "
                          f"{', '.join(EXTENSIONS)})")
    got = sniff(head)
    if got != want:
        held = f"{got} data" if got else "no JPEG, PNG, BMP or WebP data"
        raise DecodeError(f"{shown(name)}: cannot decode as {want}, the format its name "
                          f"says: it holds {held}, so no decoder is tried")
    return want


@contextmanager
def _pillow_limit_off() -> Iterator[None]:
    """Pillow's own pixel check off (a warning up to 2x its limit, then another error):
    the caller applies `max_pixels` itself, with one message."""
    saved = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            yield
    finally:
        Image.MAX_IMAGE_PIXELS = saved


@contextmanager
def opened(source: str | IO[bytes], name: str | None = None,
           max_pixels: int = MAX_PIXELS) -> Iterator[Image.Image]:
    """The image in `source` (a path or a binary file), header read, pixels not yet
    decoded, after every check above; `DecodeError` naming `name` (default: the path)."""
    label = name or str(source if isinstance(source, str) else getattr(source, "name", "<data>"))
    f = open_regular(source) if isinstance(source, str) else source
    try:
        start = f.tell()
        fmt = check_content(f.read(16), label)
        f.seek(start)
        with _pillow_limit_off():
            img = Image.open(f, formats=[fmt])
        with img:
            w, h = img.size
            if w * h > max_pixels:
                raise DecodeError(f"{shown(label)}: {w} x {h} = {w * h:,} pixels, over the "
                                  f"limit of {max_pixels:,} (--max-pixels raises it)")
            yield img
    except DecodeError:
        raise
    # Pillow reports bad data with many exception types (OSError, ValueError, SyntaxError,
    # struct.error, ...): any of them means "not a usable image".
    except Exception as exc:  # noqa: BLE001
        raise DecodeError(f"{shown(label)}: cannot decode as an image: "
                          f"{type(exc).__name__}: {exc}") from None
    finally:
        if f is not source:
            f.close()


def to_rgb(img: Image.Image) -> Image.Image:
    """`img` as mode RGB, alpha composited over white (rule 2)."""
    if img.mode == "RGB":
        return img
    if img.mode == "P":
        img = img.convert("RGBA" if "transparency" in img.info else "RGB")
    elif img.mode in ("I", "I;16", "I;16B", "I;16L", "F"):
        values = np.asarray(img)  # clipped in its own dtype: no float64 copy of a large image
        img = Image.fromarray(np.clip(values, 0, 255).astype(np.uint8), "L")
    elif img.mode in ("LA", "PA", "La", "RGBa"):
        img = img.convert("RGBA")
    if img.mode == "RGBA":
        canvas = Image.new("RGB", img.size, _WHITE)
        canvas.paste(img, mask=img.getchannel("A"))
        return canvas
    return img.convert("RGB")


def _resized(img: Image.Image, w: int, h: int) -> Image.Image:
    if (w, h) == img.size:
        return img
    return img.resize((w, h), Image.Resampling.BILINEAR)


def fit(img: Image.Image, size: int, how: str = "crop") -> Image.Image:
    """`img` (RGB) fitted to `size` x `size` by rule `how` (rule 3)."""
    w, h = img.size
    if how == "stretch":
        return _resized(img, size, size)
    if how == "pad":
        scale = size / max(w, h)
        nw, nh = max(1, round(w * scale)), max(1, round(h * scale))
        canvas = Image.new("RGB", (size, size), (0, 0, 0))
        canvas.paste(_resized(img, nw, nh), ((size - nw) // 2, (size - nh) // 2))
        return canvas
    if how != "crop":
        raise ValueError(f"fit {how!r}: choose one of {', '.join(FITS)}")
    scale = size / min(w, h)
    nw, nh = max(size, round(w * scale)), max(size, round(h * scale))
    img = _resized(img, nw, nh)
    left, top = (nw - size) // 2, (nh - size) // 2
    return img.crop((left, top, left + size, top + size))


def decode(source: str | IO[bytes], size: int, how: str = "crop",
           name: str | None = None, max_pixels: int = MAX_PIXELS) -> np.ndarray:
    """The image in `source` (a path or a binary file) as uint8 (3, size, size), channels
    R, G, B; `DecodeError` naming `name` (default: the path) when it is refused or not a
    readable image."""
    label = name or str(source if isinstance(source, str) else getattr(source, "name", "<data>"))
    with opened(source, name, max_pixels) as img:
        if img.format == "JPEG":
            img.draft("RGB", (size, size))  # rule: decode at a scale still >= size
        img.load()
        arr = np.asarray(fit(to_rgb(ImageOps.exif_transpose(img)), size, how), dtype=np.uint8)
    if arr.shape != (size, size, 3):
        raise DecodeError(f"{shown(label)}: decoded to shape {arr.shape}, expected "
                          f"({size}, {size}, 3)")
    return np.ascontiguousarray(arr.transpose(2, 0, 1))


def decode_grey(source: str | IO[bytes], size: int, how: str = "crop",
                name: str | None = None, max_pixels: int = MAX_PIXELS) -> np.ndarray:
    """As `decode`, but one grey channel: uint8 (1, size, size) (Pillow's conversion to L,
    then rule 3; the digits models' input)."""
    with opened(source, name, max_pixels) as img:
        img.load()
        return np.asarray(fit(ImageOps.exif_transpose(img).convert("L"), size, how),
                          dtype=np.uint8)[None]
