"""Recipe: Criteo click logs (plain or .gz) -> OUT/train.h5, OUT/val.h5 for the recsys task.

Tab-separated lines: a 0/1 label, 13 integer counts, 26 categorical 8-hex-digit
values, any but the label possibly empty. Dense features are log(1 + max(x, 0));
categorical ids are hashed (--buckets N) or from a vocabulary (--min-count T).
See docs/data-criteo.md.
Example: mpirun -np 2 python datasets/criteo.py --files 'day_*.gz' --val-files val.txt \
             --out data/criteo --min-count 10

Runs on one process or under mpirun / srun --mpi=pmix; the files are the same for any
number of ranks. Options: `python datasets/criteo.py --help`.
"""

import sys

from hpcdp.data.prep.cli import main

if __name__ == "__main__":
    sys.exit(main(["criteo", *sys.argv[1:]]))
