"""Read an epoch (or part of it) of a token file on every rank; rank 0 saves what all read.

Every rank checks its own batches (shape, targets = inputs shifted, the same step
count as the others); rank 0 gathers each step's window indices (first token / S,
the test file's token i being i) side by side in rank order, and the reader state.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
from mpi4py import MPI

from hpcdp.data.read.tokens import TokenReader, TokenReaderError


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("path")
    p.add_argument("--seq-len", type=int, default=16)
    p.add_argument("--global-batch", type=int, default=24)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epoch", type=int, default=0)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--state-in")
    p.add_argument("--out", required=True, help="rank 0 writes {windows, state} as .npz")
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    try:
        reader = TokenReader(args.path, seq_len=args.seq_len, rank=comm.rank,
                             batch_size=args.global_batch // comm.size, world_size=comm.size,
                             seed=args.seed)
    except TokenReaderError as exc:
        print(f"[rank {comm.rank}] error: {exc}", file=sys.stderr, flush=True)
        return 1
    if args.state_in:
        with open(args.state_in) as fh:
            reader.load_state_dict(json.load(fh))
    reader.set_epoch(args.epoch)
    planned = len(reader)
    assert comm.allgather(planned) == [planned] * comm.size, "ranks disagree on the step count"
    got = []
    for x, y in reader:
        xs, ys = x.numpy(), y.numpy()
        assert xs.shape == (args.global_batch // comm.size, args.seq_len)
        np.testing.assert_array_equal(ys[:, :-1], xs[:, 1:])
        got.append(xs[:, 0] // args.seq_len)
        if args.steps is not None and len(got) == args.steps:
            break
    mine = np.stack(got)
    state = reader.state_dict()
    reader.close()
    parts = comm.gather(mine, root=0)
    if comm.rank == 0:
        np.savez(args.out, windows=np.concatenate(parts, axis=1))
        with open(args.out + ".state.json", "w") as fh:
            json.dump(state, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
