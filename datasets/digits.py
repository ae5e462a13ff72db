"""Recipe: scikit-learn's bundled 8x8 handwritten digits (no download) -> OUT/train.h5, OUT/val.h5.

x is uint8 (1, 8, 8), the 0..16 intensities scaled to 0..255; y is int64.
Example: mpirun -np 2 python datasets/digits.py --out data/digits

Runs on one process or under mpirun / srun --mpi=pmix (one slab of the file per
rank). Options: `python datasets/digits.py --help`.
"""

import sys

from hpcdp.data.prep.cli import main

if __name__ == "__main__":
    sys.exit(main(["digits", *sys.argv[1:]]))
