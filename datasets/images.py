"""Recipe: an image folder (one subfolder per class) -> OUT/train.h5, OUT/val.h5.

x is uint8 (3, S, S) (RGB; shorter side resized to S, centre crop), y int64; the
class names and the training set's per-channel mean and std are attributes.
Example: mpirun -np 2 python datasets/images.py --root photos --out data/photos --size 64

Layouts, rules and options: docs/data-images.md, `python datasets/images.py --help`.
"""

import sys

from hpcdp.data.prep.cli import main

if __name__ == "__main__":
    sys.exit(main(["images", *sys.argv[1:]]))
