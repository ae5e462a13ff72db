"""Photo-sized JPEG folders and tar shards for the image recipe's tests and benchmarks.

Real photo folders cannot be committed or downloaded here, so scale data is generated:
images of 400-500 x 300-375 pixels (about ImageNet's typical size) of a smooth colour
gradient, a few discs and noise, saved at JPEG quality 92: about 80 KB a file, which
is what a photo costs to read and decode. The same seed gives the same files.

``python -m hpcdp.data.synth.photos --out DIR --files N [--classes C]``
writes ``DIR/<class>/<NNNNNNN>.jpg``; ``--shards K`` writes the same images as
WebDataset-style tar shards instead (``NNNNNNN.jpg`` + ``NNNNNNN.cls``, in K shards).
"""

from __future__ import annotations

import argparse
import io
import itertools
import os
import sys
import tarfile

import numpy as np
from PIL import Image, ImageDraw

QUALITY = 92
NOISE = 22.0


def photo(rng: np.random.Generator) -> bytes:
    """One photo-sized JPEG's bytes."""
    w, h = int(rng.integers(400, 501)), int(rng.integers(300, 376))
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    mix = rng.uniform(0, 1, (3, 3)).astype(np.float32)
    base = np.stack([a * xx / w * 150 + b * yy / h * 100 + c * 80 for a, b, c in mix], -1)
    noise = rng.normal(0, NOISE, (h, w, 3)).astype(np.float32)
    img = Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(2, 7))):
        x, y, r = int(rng.integers(0, w)), int(rng.integers(0, h)), int(rng.integers(10, 90))
        draw.ellipse((x - r, y - r, x + r, y + r),
                     fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
    out = io.BytesIO()
    img.save(out, "JPEG", quality=QUALITY)
    return out.getvalue()


def samples(files: int, classes: int, seed: int):
    """(name, class index, JPEG bytes) of each image, class by class in turn."""
    rng = np.random.Generator(np.random.PCG64(seed))
    for i in range(files):
        yield f"{i:07d}", i % classes, photo(rng)


def make_folder(out: str, files: int, classes: int = 10, seed: int = 0) -> int:
    """``out/<class>/<name>.jpg``; the bytes written."""
    total = 0
    for name, label, data in samples(files, classes, seed):
        folder = os.path.join(out, f"c{label:03d}")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{name}.jpg"), "wb") as fh:
            fh.write(data)
        total += len(data)
    return total


def make_shards(out: str, files: int, shards: int, classes: int = 10, seed: int = 0) -> int:
    """``out/shard-NNNNN.tar``, the images in order, ``shards`` about equal; bytes of images."""
    os.makedirs(out, exist_ok=True)
    per = -(-files // max(1, shards))
    made = samples(files, classes, seed)
    total = 0
    for s in range(-(-files // per)):
        with tarfile.open(os.path.join(out, f"shard-{s:05d}.tar"), "w") as tar:
            for name, label, data in itertools.islice(made, per):
                add_member(tar, f"{name}.jpg", data)
                add_member(tar, f"{name}.cls", str(label).encode())
                total += len(data)
    return total


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--files", type=int, required=True)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--shards", type=int, default=0, help="write K tar shards, not a folder")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.shards:
        n = make_shards(args.out, args.files, args.shards, args.classes, args.seed)
    else:
        n = make_folder(args.out, args.files, args.classes, args.seed)
    print(f"wrote {args.files} images ({n / 2**20:.1f} MiB) under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
