"""Recipe: documents from a seeded sparse Markov chain -> OUT/train.h5, OUT/val.h5 (tokens).

The files carry the chain's entropy rate (`entropy_rate_nats`), the loss no model beats.
Example: mpirun -np 2 python datasets/markov.py --out data/markov

Runs on one process or under mpirun / srun --mpi=pmix. Options: `python datasets/markov.py --help`.
"""

import sys

from hpcdp.data.prep.cli import main

if __name__ == "__main__":
    sys.exit(main(["markov", *sys.argv[1:]]))
