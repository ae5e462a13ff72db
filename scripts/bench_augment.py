"""Time the image augmentation per training batch on this machine's CPU (or a GPU).

Prints milliseconds per batch for each kind at a few batch shapes, the median of
repeated runs; with --device cuda the times are synchronized GPU times.
Example: python scripts/bench_augment.py --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from hpcdp.data.read.augment import augment

SHAPES = ((32, 3, 32, 32), (128, 3, 32, 32), (64, 3, 224, 224))


def per_batch_ms(kind: str, shape: tuple[int, ...], device: torch.device, repeats: int) -> float:
    x = torch.rand(shape, device=device)
    keys = torch.stack([torch.zeros(shape[0], dtype=torch.int64),
                        torch.arange(shape[0], dtype=torch.int64)], 1)
    times = []
    for r in range(repeats + 2):
        keys[:, 0] = r  # a new epoch each time: new crops and flips
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        augment(x, keys, kind, seed=0)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if r >= 2:  # warm-up runs dropped
            times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"device {device}, {torch.get_num_threads()} thread(s); ms per batch (median of "
          f"{args.repeats})")
    for shape in SHAPES:
        row = [f"{kind} {per_batch_ms(kind, shape, device, args.repeats):.3f}"
               for kind in ("crop_flip", "resized_crop_flip")]
        print(f"batch {'x'.join(map(str, shape))}: " + ", ".join(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
