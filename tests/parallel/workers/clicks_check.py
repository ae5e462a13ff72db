"""Check a click file on every rank before any collective, as training must.

A bad file makes every rank print the problem and exit 1 (no rank waits in a
collective); a good one ends with an all-gather of the schemas, which must agree.
"""

from __future__ import annotations

import sys

from mpi4py import MPI

from hpcdp.data.format.clicks import validate_click_file
from hpcdp.data.read.samples import ReaderError


def main() -> int:
    comm = MPI.COMM_WORLD
    try:
        schema = validate_click_file(sys.argv[1])
    except ReaderError as exc:
        print(f"[rank {comm.rank}] error: {exc}", file=sys.stderr, flush=True)
        return 1
    schemas = comm.allgather(schema)
    assert all(s == schemas[0] for s in schemas)
    return 0


if __name__ == "__main__":
    sys.exit(main())
