"""Recipe: a CIFAR-10 or CIFAR-100 archive (binary or python version) -> OUT/train.h5, val.h5.

x is uint8 (3, 32, 32), y int64 (CIFAR-100: the fine label, or --labels coarse);
the class names and the training set's per-channel mean and std are attributes.
Both versions of the same data give the same file. The python version's pickles
are read by a restricted unpickler: a pickle naming anything but what CIFAR
batches hold is refused, naming the member, and never runs.
Example: mpirun -np 2 python datasets/cifar.py --archive cifar-10-python.tar.gz --out data/cifar10

Options: `python datasets/cifar.py --help`; docs/data-images.md.
"""

import sys

from hpcdp.data.prep.cli import main

if __name__ == "__main__":
    sys.exit(main(["cifar", *sys.argv[1:]]))
