"""Recipe: NumPy .npz archives (plain or compressed) or folders of .npy files, one shard
each -> OUT/SPLIT.h5 (x, and y where the shards hold labels).

Example: mpirun -np 2 python datasets/npz.py --out data/mine --files 'shards/part-*.npz'

Runs on one process or under mpirun / srun --mpi=pmix. Options:
`python datasets/npz.py --help`; docs/prep.md ("Adding an input format").
"""

import sys

from hpcdp.data.prep.cli import main

if __name__ == "__main__":
    sys.exit(main(["npz", *sys.argv[1:]]))
