"""Read one epoch (or part of it) of a file on every rank and check what each rank got.

Every rank checks its own batches (exact size, content matching the label
that names the sample, the same step count as the others); rank 0 gathers the
global batches and writes them, with the reader state, for the test to check.
Any failed check raises, so this rank exits non-zero.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
from mpi4py import MPI

from hpcdp.data.read import order as pt
from hpcdp.data.read.samples import ReaderError, ShardedReader


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("path")
    p.add_argument("--global-batch", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epoch", type=int, default=0)
    p.add_argument("--window", type=int, default=None)
    p.add_argument("--steps", type=int, default=None, help="stop after this many steps")
    p.add_argument("--state-in")
    p.add_argument("--state-out")
    p.add_argument("--labels-out")
    p.add_argument("--check-global-order", action="store_true")
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    try:
        reader = ShardedReader(args.path, batch_size=args.global_batch // size, rank=rank,
                               world_size=size, seed=args.seed, window_samples=args.window)
    except ReaderError as exc:
        print(f"[rank {rank}] error: {exc}", file=sys.stderr, flush=True)
        return 1
    if args.state_in:
        with open(args.state_in) as fh:
            reader.load_state_dict(json.load(fh))
    reader.set_epoch(args.epoch)
    planned = len(reader)
    assert comm.allgather(planned) == [planned] * size, "ranks disagree on the step count"
    got = []
    for x, y in reader:
        assert x.shape[0] == args.global_batch // size and y is not None
        np.testing.assert_array_equal(x[:, 0].numpy(), y.numpy())
        got.append(y.numpy())
        if args.steps is not None and len(got) == args.steps:
            break
    labels = np.stack(got) if got else np.zeros((0, args.global_batch // size), np.int64)
    state = reader.state_dict()
    reader.close()
    parts = comm.gather(labels, root=0)
    states = comm.gather(state, root=0)
    if rank == 0:
        assert all(s == states[0] for s in states), f"rank states differ: {states}"
        glob = np.concatenate(parts, axis=1)
        if args.check_global_order:
            want = pt.global_order(reader.num_samples, reader.info.block, args.seed, args.epoch,
                                   args.global_batch, reader.virtual_shards, reader.window)
            np.testing.assert_array_equal(glob, want)
        if args.labels_out:
            np.save(args.labels_out, glob)
        if args.state_out:
            with open(args.state_out, "w") as fh:
                json.dump(states[0], fh)
        print(f"rank 0: {glob.shape[0]} global batches of {glob.shape[1]} on {size} ranks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
