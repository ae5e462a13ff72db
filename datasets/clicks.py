"""Recipe: a synthetic click log with a planted signal -> OUT/train.h5, OUT/val.h5.

Dense features, 26 categorical ids with Zipf popularity and a click label drawn
from a known probability; val.h5 stores the best reachable AUC (`oracle_auc`) and
that of item popularity alone (`baseline_auc`). See docs/recsys.md.
Example: mpirun -np 2 python datasets/clicks.py --out data/clicks

Runs on one process or under mpirun / srun --mpi=pmix (one slab of each file per
rank); the files are the same for any number of ranks. Options:
`python datasets/clicks.py --help`.
"""

import sys

from hpcdp.data.prep.cli import main

if __name__ == "__main__":
    sys.exit(main(["clicks", *sys.argv[1:]]))
