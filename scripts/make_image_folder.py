"""Write a small image folder with a learnable signal, for the image-folder recipe's demo
and tests: one subfolder per class, each class a shape (disc, square, triangle, cross,
ring) in a random colour, position and size on a noisy background; image sides 20-64
pixels, not square; modes L, RGB and RGBA; JPEG and PNG files.

Example: python scripts/make_image_folder.py --out shapes --per-class 300
(then: python datasets/images.py --root shapes --out data/shapes --size 32 --val-fraction 0.2)
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
from PIL import Image, ImageDraw

SHAPES = ("disc", "square", "triangle", "cross", "ring")


def draw_shape(draw: ImageDraw.ImageDraw, shape: str, box: tuple[int, int, int, int],
               colour: tuple[int, ...]) -> None:
    x0, y0, x1, y1 = box
    w = max(2, (x1 - x0) // 4)
    if shape == "disc":
        draw.ellipse(box, fill=colour)
    elif shape == "square":
        draw.rectangle(box, fill=colour)
    elif shape == "triangle":
        draw.polygon([((x0 + x1) // 2, y0), (x1, y1), (x0, y1)], fill=colour)
    elif shape == "cross":
        cx, cy = (x0 + x1) // 2, (y0 + y1) // 2
        draw.rectangle((cx - w // 2, y0, cx + w // 2, y1), fill=colour)
        draw.rectangle((x0, cy - w // 2, x1, cy + w // 2), fill=colour)
    else:
        draw.ellipse(box, outline=colour, width=w)


def make_image(rng: np.random.Generator, shape: str) -> tuple[Image.Image, str, str]:
    """One image of `shape`: (image, mode, file suffix)."""
    w, h = (int(v) for v in rng.integers(20, 65, size=2))
    noise = rng.integers(0, 90, size=(h, w, 3), dtype=np.uint8)
    img = Image.fromarray(noise, "RGB")
    side = int(rng.integers(min(w, h) // 2, min(w, h) - 2))
    x0, y0 = int(rng.integers(0, w - side)), int(rng.integers(0, h - side))
    colour = tuple(int(c) for c in rng.integers(120, 256, size=3))
    draw_shape(ImageDraw.Draw(img), shape, (x0, y0, x0 + side, y0 + side), colour)
    mode = ("L", "RGB", "RGBA")[int(rng.integers(0, 3))]
    if mode == "L":
        img = img.convert("L")
    elif mode == "RGBA":
        alpha = np.full((h, w), 255, np.uint8)
        alpha[: h // 6] = 0  # a transparent band at the top
        img = img.copy()
        img.putalpha(Image.fromarray(alpha, "L"))
    suffix = ".png" if mode == "RGBA" or rng.random() < 0.5 else ".jpg"
    return img, mode, suffix


def make_folder(out: str, per_class: int, seed: int = 0, classes: int = len(SHAPES),
                extras: bool = True) -> int:
    """Write `per_class` images of each of the first `classes` shapes under out/<shape>/;
    with `extras`, also a hidden file and a text file (which the recipe skips). Returns
    the number of images."""
    rng = np.random.Generator(np.random.PCG64(seed))
    for shape in SHAPES[:classes]:
        folder = os.path.join(out, shape)
        os.makedirs(folder, exist_ok=True)
        for i in range(per_class):
            img, _, suffix = make_image(rng, shape)
            img.save(os.path.join(folder, f"{i:05d}{suffix}"), quality=90)
    if extras:
        with open(os.path.join(out, SHAPES[0], "notes.txt"), "w") as fh:
            fh.write("not an image\n")
        with open(os.path.join(out, SHAPES[0], ".hidden.jpg"), "w") as fh:
            fh.write("hidden\n")
    return per_class * classes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--per-class", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    n = make_folder(args.out, args.per_class, args.seed)
    print(f"wrote {n} images in {len(SHAPES)} classes under {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
