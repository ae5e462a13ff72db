"""Read part of an epoch of row-aligned fields on every rank; rank 0 saves rows and state.

Every rank checks that the fields of each batch slot come from the same file
row (each field encodes its row); rank 0 gathers the global batches' rows.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
from mpi4py import MPI

from hpcdp.data.read.multi_field import FieldReader


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("path")
    p.add_argument("--global-batch", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--window", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    reader = FieldReader(args.path, ("dense", "sparse", "label"),
                         batch_size=args.global_batch // comm.size, rank=comm.rank,
                         world_size=comm.size, seed=args.seed, window_samples=args.window)
    reader.set_epoch(1)
    rows = []
    for dense, sparse, label in reader:
        r = sparse[:, 0].numpy().astype(np.int64)
        np.testing.assert_array_equal(dense[:, 0].numpy(), r)
        np.testing.assert_array_equal(sparse[:, 2].numpy(), 3 * r)
        np.testing.assert_array_equal(label.numpy(), r % 2)
        rows.append(r)
        if len(rows) == args.steps:
            break
    state = reader.state_dict()
    reader.close()
    parts, states = comm.gather(np.stack(rows), root=0), comm.gather(state, root=0)
    if comm.rank == 0:
        assert all(s == states[0] for s in states), states
        np.save(args.out + ".npy", np.concatenate(parts, axis=1))
        with open(args.out + ".json", "w") as fh:
            json.dump(states[0], fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
