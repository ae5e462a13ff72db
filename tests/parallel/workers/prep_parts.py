"""Each rank saves its blocks as parts, then all write one file from them (`write_parts`).

argv: OUT BLOCK_SIZES (comma-separated rows per block) [serial]. Block i holds rows
``10*i ..`` so the file says where every row came from; a Progress counts the rows
written, and rank 0 prints its last line.
"""

from __future__ import annotations

import io
import sys

import numpy as np

from hpcdp.data.prep.blocks import rank_blocks
from hpcdp.data.prep.merge import write_parts
from hpcdp.data.prep.parts import Parts
from hpcdp.data.prep.progress import Progress
from hpcdp.data.prep.world import world


def datasets(f, n):  # noqa: ANN001, ANN201 - the frame's callback
    f.attrs["num_samples"] = n
    return {"x": f.create_dataset("x", (n, 2), np.float32),
            "y": f.create_dataset("y", (n,), np.int64)}


def main() -> int:
    out, sizes = sys.argv[1], [int(s) for s in sys.argv[2].split(",")]
    serial = sys.argv[3:] == ["serial"]
    comm = world()
    mine = rank_blocks(len(sizes), comm.rank, comm.size)
    with Parts(out, "test", {"sizes": sizes}, comm, resume=False) as parts:
        for i in mine:
            rows = np.arange(10 * i, 10 * i + sizes[i])
            parts.save("train", i, x=np.stack([rows, -rows], 1).astype(np.float32), y=rows)
        log = io.StringIO()
        bar = Progress(comm, "train", sum(sizes), "rows", stream=log)
        total = write_parts(f"{out}/train.h5", parts, "train", mine, datasets, comm,
                            slab_rows=3, serial=serial, progress=bar)
        bar.close()
    assert total == sum(sizes)
    if comm.rank == 0:
        print(log.getvalue().strip().splitlines()[-1], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
