"""Recipe: Seeded synthetic samples of any shape and dtype -> OUT/train.h5 (and val.h5).

Written slab by slab, so files larger than memory are fine.
Example: mpirun -np 2 python datasets/synthetic.py --out data/syn --samples 50000 --shape 3,32,32

Runs on one process or under mpirun / srun --mpi=pmix (one slab of the file per
rank). Options: `python datasets/synthetic.py --help`.
"""

import sys

from hpcdp.data.prep.cli import main

if __name__ == "__main__":
    sys.exit(main(["synthetic", *sys.argv[1:]]))
