"""Read a file on every rank through the keyed training reader, augment each batch as the
image task does, and save every sample's augmented tensor by (epoch, global index).

Usage: augment_batches.py FILE OUT_DIR GLOBAL_BATCH KIND[,KIND...]
Writes OUT_DIR/KIND/rank-R.pt: {(epoch, index): tensor} for epochs 0 and 1, for each
kind (one launch for several kinds: starting the ranks costs more than reading).
"""

from __future__ import annotations

import os
import sys

import torch
from mpi4py import MPI

from hpcdp.config import build
from hpcdp.data.read.sample_keys import SampleKeys
from hpcdp.data.read.samples import ShardedReader
from hpcdp.tasks.image import prepare


def augmented(path: str, global_batch: int, kind: str, comm: MPI.Comm) -> dict:
    cfg = build(None, [f"data.path={os.path.dirname(path)}", f"image.augment={kind}",
                       "image.crop_padding=3", "image.crop_scale=[0.3, 1.0]", "run.seed=5"])
    reader = SampleKeys(ShardedReader(path, batch_size=global_batch // comm.size,
                                      rank=comm.rank, world_size=comm.size, seed=5,
                                      virtual_shards=4))
    seen = {}
    for epoch in (0, 1):
        reader.set_epoch(epoch)
        for batch in reader:
            x, _ = prepare(batch, cfg, torch.device("cpu"))
            for key, sample in zip(batch[2].tolist(), x):
                seen[tuple(key)] = sample.clone()
    return seen


def main() -> None:
    path, out, global_batch, kinds = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    comm = MPI.COMM_WORLD
    for kind in kinds.split(","):
        seen = augmented(path, global_batch, kind, comm)
        os.makedirs(os.path.join(out, kind), exist_ok=True)
        torch.save(seen, os.path.join(out, kind, f"rank-{comm.rank}.pt"))
        print(f"rank {comm.rank}: {kind}: {len(seen)} samples", flush=True)


if __name__ == "__main__":
    main()
