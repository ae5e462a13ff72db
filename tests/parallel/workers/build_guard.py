"""dist.init on ranks whose Horovod builds may differ: each rank says what happened.

HPCDP_TEST_RANK1_EXPORT=VAR=VALUE: rank 1 alone exports it before init (a patch
switched off on one rank makes its build identity, and its wire protocol, differ).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from hpcdp.config import HorovodConfig
from hpcdp.runtime import dist


def launcher_rank() -> int:
    for var in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    raise SystemExit("no launcher rank")


def main() -> None:
    export = os.environ.get("HPCDP_TEST_RANK1_EXPORT", "")
    if export and launcher_rank() == 1:
        name, _, value = export.partition("=")
        os.environ[name] = value
    start = time.monotonic()
    try:
        dist.init(HorovodConfig(), Path(tempfile.mkdtemp()))
    except dist.AgreedError as exc:
        print(f"rank {launcher_rank()}: stopped after {time.monotonic() - start:.1f}s: {exc}",
              flush=True)
        sys.exit(3)
    total = dist.allreduce_sum([1.0], "guard.sum")[0]
    print(f"rank {dist.rank()}: same build, {total:g} ranks", flush=True)


if __name__ == "__main__":
    main()
