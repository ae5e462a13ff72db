"""Recipe: Your own .npy / uncompressed .npz arrays (memory-mapped) -> OUT/SPLIT.h5.

Example: mpirun -np 2 python datasets/arrays.py --out data/mine --x images.npy --y labels.npy

Runs on one process or under mpirun / srun --mpi=pmix (one slab of the file per
rank). Options: `python datasets/arrays.py --help`.
"""

import sys

from hpcdp.data.prep.cli import main

if __name__ == "__main__":
    sys.exit(main(["arrays", *sys.argv[1:]]))
