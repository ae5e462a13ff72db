"""`hpcdp predict EXPORT_DIR FILES...`: the top classes of image files under an image model.

Each file is opened by the image recipe's rules (hpcdp.data.format.image_decode: a
regular file, JPEG, PNG, BMP or WebP by name and content, at most --max-pixels
pixels; anything else is refused naming the file, exit status 2), decoded with
Pillow and made what training saw: `resize_center_crop`
(the shorter side resized to S, then the centred S x S square; S is the export's
image size), RGB or greyscale as the model's channels, integers divided by the
scale and normalised by the mean and std config.json records. Images go through
the model in batches; each file gets its k likeliest classes with their names
(config.json's class_names, else the class numbers) and probabilities.

Pillow is needed only here (the `images` extra).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpcdp.data.format.image_decode import (
    EXTENSIONS,
    MAX_PIXELS,
    DecodeError,
    decode,
    decode_grey,
    shown,
)
from hpcdp.export import bundle
from hpcdp.export.load import load


def read_image(path: Path, size: int, channels: int, max_pixels: int = MAX_PIXELS
               ) -> np.ndarray:
    """(channels, size, size) uint8 of an image file, as the training data holds images:
    RGB images by the image-folder recipe's own rules (hpcdp.data.format.image_decode), grey
    ones (the digits) by the same checks and fit after a conversion to grey."""
    if channels not in (1, 3):
        raise bundle.ExportError(f"the model takes {channels} channels: images need 1 or 3")
    read = decode if channels == 3 else decode_grey
    try:
        return read(str(path), size, "crop", max_pixels=max_pixels)
    except DecodeError as e:
        raise bundle.ExportError(str(e)) from None


def normalise(batch: np.ndarray, schema: dict[str, Any]) -> torch.Tensor:
    """uint8 (N, C, S, S) -> the float inputs training fed (hpcdp.tasks.image.to_input)."""
    x = torch.from_numpy(batch).float() / schema["scale"]
    mean, std = (torch.tensor(schema[k], dtype=torch.float32).reshape(-1, 1, 1)
                 for k in ("mean", "std"))  # a scalar, or one value per channel
    return (x - mean) / std


def image_files(paths: Sequence[Path]) -> list[Path]:
    """The files given, and the image files inside given folders (sorted)."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out += sorted(f for f in p.rglob("*") if f.suffix.lower() in EXTENSIONS)
        else:
            out.append(p)
    return out


def batches(files: list[Path], size: int) -> Iterator[list[Path]]:
    for i in range(0, len(files), size):
        yield files[i:i + size]


def predict(net: torch.nn.Module, config: dict[str, Any], files: list[Path], top: int,
            batch: int = 64, max_pixels: int = MAX_PIXELS) -> list[dict[str, Any]]:
    """Per file: {"file", "top": [{"class", "name", "p"}, ...]} (likeliest first)."""
    schema = config["input"]
    size, channels = schema.get("image_size"), schema["channels"]
    if not size:
        raise bundle.ExportError("config.json has no input image_size: export the run "
                                 "while its training data is there, or set it")
    names = schema.get("class_names") or [str(i) for i in range(schema["num_classes"])]
    device = next(net.parameters()).device
    results = []
    for group in batches(files, batch):
        x = normalise(np.stack([read_image(f, size, channels, max_pixels) for f in group]),
                      schema)
        with torch.no_grad():
            probs = torch.softmax(net(x.to(device)).float(), dim=1).cpu()
        p, idx = probs.topk(min(top, probs.shape[1]), dim=1)
        for f, ps, ids in zip(group, p.tolist(), idx.tolist()):
            results.append({"file": shown(str(f)), "top": [
                {"class": c, "name": names[c], "p": q} for c, q in zip(ids, ps)]})
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="hpcdp predict",
        description="Classify image files with an exported image model: decoded, resized "
        "(shorter side, then centre crop), scaled and normalised as config.json says.")
    p.add_argument("export", type=Path, help="an export folder (hpcdp export)")
    p.add_argument("files", type=Path, nargs="+", help="image files or folders of them")
    p.add_argument("--top", type=int, default=5, help="classes shown per file (default 5)")
    p.add_argument("--batch", type=int, default=64, help="images per forward pass")
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--max-pixels", type=int, default=MAX_PIXELS,
                   help="an image declaring more pixels (width x height) is refused "
                        f"undecoded (default {MAX_PIXELS:,}: 8192 x 8192)")
    from hpcdp.cliargs import parse_args

    args = parse_args(p, argv)
    if args.max_pixels < 1:
        p.error(f"--max-pixels {args.max_pixels}: expected a positive count")
    try:
        net, config = load(args.export, args.device)
        if config["task"] != "image" and config["input"].get("kind") != "image":
            raise bundle.ExportError(f"{args.export}: a {config['task']!r} model that does "
                                     "not read images; predict classifies images (a task "
                                     "with an [image] section)")
        files = image_files(args.files)
        if not files:
            raise bundle.ExportError("no image files found")
        results = predict(net, config, files, args.top, args.batch, args.max_pixels)
    except (bundle.ExportError, OSError) as e:
        print(f"hpcdp predict: error: {e}", file=sys.stderr)
        return 2
    for r in results:
        if args.json:
            print(json.dumps(r))
        else:
            shown = ", ".join(f"{t['name']} {t['p']:.3f}" for t in r["top"])
            print(f"{r['file']}: {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
