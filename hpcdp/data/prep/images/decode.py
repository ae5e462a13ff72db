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
"""

from __future__ import annotations

from typing import IO

import numpy as np
from PIL import Image, ImageOps

FITS = ("crop", "stretch", "pad")

_WHITE = (255, 255, 255)


class DecodeError(ValueError):
    """A file Pillow cannot read as an image; the message names it."""


def to_rgb(img: Image.Image) -> Image.Image:
    """`img` as mode RGB, alpha composited over white (rule 2)."""
    if img.mode == "RGB":
        return img
    if img.mode == "P":
        img = img.convert("RGBA" if "transparency" in img.info else "RGB")
    elif img.mode in ("I", "I;16", "I;16B", "I;16L", "F"):
        values = np.asarray(img, dtype=np.float64)
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
           name: str | None = None) -> np.ndarray:
    """The image in `source` (a path or a binary file) as uint8 (3, size, size), channels
    R, G, B; `DecodeError` naming `name` (default: the path) when it is not a readable
    image."""
    label = name or (source if isinstance(source, str) else getattr(source, "name", "<data>"))
    try:
        with Image.open(source) as img:
            if img.format == "JPEG":
                img.draft("RGB", (size, size))  # rule: decode at a scale still >= size
            img.load()
            upright = ImageOps.exif_transpose(img)
            rgb = to_rgb(upright)
            out = fit(rgb, size, how)
            arr = np.asarray(out, dtype=np.uint8)
    # Pillow reports bad data with many exception types (OSError, ValueError, SyntaxError,
    # struct.error, DecompressionBombError, ...): any of them means "not a usable image".
    except Exception as exc:  # noqa: BLE001
        raise DecodeError(f"{label}: cannot decode as an image: "
                          f"{type(exc).__name__}: {exc}") from None
    if arr.shape != (size, size, 3):
        raise DecodeError(f"{label}: decoded to shape {arr.shape}, expected ({size}, {size}, 3)")
    return np.ascontiguousarray(arr.transpose(2, 0, 1))
